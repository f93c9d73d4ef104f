"""The origin's end-to-end custody: which brokers subscribe to each filter, what awaits them, and its repair.

Theory of operation
-------------------
Custody hop by hop (rule 7a, federation.protocol.custody) means "everything
beyond me has it", where *beyond* is the mesh as it is while the copy
crosses it. A mesh that loses a part loses its publications too: a
partition with subscribers on both sides leaves each side with a mesh (and
a core) of its own, and the origin's side acknowledges what its side has;
a core that stops cleanly ends the filter for a few milliseconds before
the next one claims it; a member cut off long enough is forgotten by its
parent. MQTT promises more: a publication the publisher's broker
acknowledged reaches every broker that subscribed when it was made.

So every acknowledgement names the subscribing brokers that have the
publication (its *reach*, docs/protocol.md rule 7f), and the origin keeps
what it learns:

- **Receivers.** For each filter, the brokers whose reach named them lately
  (`known`): the origin's best knowledge of who subscribes. A receiver stays
  known while it is out of the table's reach (a partition, a wrapper
  stopped), up to `receiver_hold`; one that answers a repair without
  having subscribers to the filter any more is forgotten at once. The list
  is small (filters x subscribing brokers) and the embedder keeps it
  across a restart (`snapshot`, `restore`), so a restarted origin still
  knows who is behind a partition.
- **Awaiting.** An own (publication, filter) whose hop-by-hop custody is
  done is released only when its reach holds every receiver known when it
  was made (its entry's `targets`); otherwise it *awaits* the others and
  stays in custody (the spool keeps it, `prev` keeps naming it, so their
  streams wait for it, rule 7d).
- **Repair.** A broker that awaits publications and is in the table's reach
  gets them from the origin directly, oldest first, as mode 3 copies
  (`$repair/<host>/<port>/<filter>`, `target` the broker) routed hop by hop
  along the unicast routes with the custody of rule 7a, `repair_window` at
  a time: the relays forward them, the broker injects them in its stream's
  order (it does not flood them: every receiver gets its own) and its
  acknowledgement comes back with its reach. A repair waits `hello_interval`
  after the broker comes back into reach (the routes on the way settle and
  the mesh may bring the newest first), `retransmit_timeout` after an entry
  closed without a broker in reach (its stream waits for it: rule 7d).
- **Giving up.** A broker that cannot get a publication within
  `receiver_hold` of when the publication began to await it is given up
  for it: drop `receiver_hold_expired` and a `publication_dropped` event
  (reason `receiver_hold`, `to` the broker) per broker and publication.
  Beyond `max_awaiting` publications (or `max_awaiting_bytes` of payload)
  the oldest is given up the same way (`receiver_hold_full`).
  `custody_released` counts only publications every target has;
  `custody_given_up` those given up for some.

What it does not know: a broker whose reach never named it (it subscribed
and the origin's publications on that filter never reached it before a
partition cut it off) is not awaited; docs/guarantees.md says so.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from federation.protocol import events
from federation.protocol.context import NO_REACH, IdentityView, NeighboursView, Outbox, TableView
from federation.protocol.custody import Custody, Entry, EntryKey
from federation.protocol.events import publication_text
from federation.protocol.forwarding import NOT_SENT, SENT, Routed
from federation.protocol.modes import end_to_end
from federation.protocol.topic_filter import repair_filter, split_repair
from federation.protocol.types import Address
from federation.protocol.wire import MODE_REPAIR, TOPIC_MESSAGE
from federation.protocol.wire_types import TopicMessage

Track = Callable[[list[TopicMessage], list[Address]], None]
"""the node's `track`: a QoS 1/2 copy sent (retransmitted until acknowledged, an obligation of its entry)"""
Cancel = Callable[[Address, TopicMessage], None]
"""reliable forwarding's: stop retransmitting our copy of this (publication, filter) to that transport"""


@dataclass(slots=True)
class Awaiting:
    """An own (publication, filter) whose hop-by-hop custody is done, kept for the brokers it did not reach."""

    message: TopicMessage
    """as the origin sent it on the filter (its `prev` included)"""
    missing: set[Address]
    """the receivers that do not have it yet"""
    since: float
    """when it began to await them (`receiver_hold` counts from here)"""
    size: int
    given_up: bool = False


def repair_of(message: TopicMessage) -> tuple[Address, str] | None:
    """(target, filter) of a repair copy's filter, or None."""
    parts = split_repair(message.filter)
    return None if parts is None else (Address(parts[0], parts[1]), parts[2])


class Receivers:
    """The receivers of our filters, our publications awaiting some of them, and the repair copies on their way."""

    def __init__(self, identity: IdentityView, table: TableView, neighbours: NeighboursView, outbox: Outbox,
                 custody: Custody, track: Track, cancel: Cancel) -> None:
        self._identity = identity
        self._settings = identity.settings
        self._table = table
        self._neighbours = neighbours
        self._outbox = outbox
        self._custody = custody
        self._track = track
        self._cancel = cancel
        self.now = 0.0
        """the time of the node's current input (the node sets it: custody's callbacks carry no time)"""
        self.changes = 0
        """counts every receiver learned or forgotten: the embedder saves `snapshot` when it moved"""
        self.known: dict[str, dict[Address, float]] = {}
        """filter -> receiver -> when its reach last named it (or it was restored)"""
        self._targets: dict[str, frozenset[Address]] = {}
        """filter -> the known receivers as one frozenset, shared by every entry made while it does not change"""
        self.awaiting: dict[EntryKey, Awaiting] = {}
        """own (publication, filter) -> what awaits whom, in the order they began to await"""
        self.awaiting_bytes = 0
        self._by_age: list[tuple[int, int, str, EntryKey]] = []
        """the awaiting keys as a heap of (epoch, seq, filter, key): the oldest publication is given up first when
        the bounds are reached (lazily deleted: a key no longer awaiting is skipped)"""
        self._queues: dict[Address, dict[EntryKey, None]] = {}
        """receiver -> the awaiting (publication, filter) it lacks, in the order they began to await"""
        self._in_flight: dict[Address, dict[EntryKey, TopicMessage]] = {}
        """receiver -> our repair copies on their way to it (by the awaiting key), as sent"""
        self._due: dict[Address, float] = {}
        """receiver in reach with publications to repair -> when its next repairs go"""
        self._heap: list[tuple[float, Address]] = []
        self._unreachable: set[Address] = set()
        """receivers with repairs to make that the table does not reach (they go when it does)"""

    # ------------------------------------------------------------ who subscribes

    def targets(self, filter_: str) -> frozenset[Address]:
        """The brokers an own publication on `filter_` must reach now (custody's `targets`)."""
        found = self._targets.get(filter_)
        if found is None:
            receivers = self.known.get(filter_)
            found = frozenset(receivers) if receivers else NO_REACH
            self._targets[filter_] = found
        return found

    def _learn(self, filter_: str, reach: Iterable[Address]) -> None:
        me = self._identity.address
        receivers = self.known.get(filter_)
        now = self.now
        for broker in reach:
            if broker == me:
                continue
            if receivers is None:
                receivers = self.known[filter_] = {}
            if broker not in receivers:
                self._targets.pop(filter_, None)
                self.changes += 1
                self._outbox.counters["receivers_learned"] += 1
            receivers[broker] = now

    def _forget(self, filter_: str, broker: Address) -> None:
        receivers = self.known.get(filter_)
        if receivers is not None and receivers.pop(broker, None) is not None:
            self._targets.pop(filter_, None)
            self.changes += 1
            if not receivers:
                del self.known[filter_]

    @staticmethod
    def followed(filter_: str) -> bool:
        """Does end-to-end custody apply to the filter? (`modes.end_to_end`)"""
        return end_to_end(filter_)

    # ------------------------------------------------------------ custody's callbacks

    def own_closed(self, entry: Entry) -> bool:
        """An own (publication, filter) whose hop-by-hop custody is done: True when it awaits receivers it did not
        reach (then it stays in custody until `_resolve`)."""
        message = entry.message
        filter_ = message.filter
        if not self.followed(filter_):
            return False
        reach = entry.reach
        if reach:
            self._learn(filter_, reach)
        missing = entry.targets - reach
        if not missing:
            return False
        key = (message.publication, filter_)
        size = len(message.payload) + len(message.topic)
        self.awaiting[key] = Awaiting(message, set(missing), self.now, size)
        self.awaiting_bytes += size
        heapq.heappush(self._by_age, (message.epoch, message.seq, filter_, key))
        self._outbox.counters["publications_awaiting"] += 1
        reachable = self._table.routes.members
        for broker in sorted(missing):
            self._queues.setdefault(broker, {})[key] = None
            if broker in reachable:  # in reach but not in the mesh's reach: a mesh that changes, a core that left
                self._schedule(broker, self.now + self._settings.retransmit_timeout)
            else:
                self._unreachable.add(broker)
        self._make_room()  # beyond the bounds the oldest publication is given up, perhaps this one
        return True  # awaiting, or given up now: custody was told either way (`_resolve`)

    def repair_closed(self, entry: Entry) -> None:
        """Our repair copy's custody is done: its target has it (its reach names it), or has no subscriber to the
        filter any more (then it is no receiver of the filter)."""
        parts = repair_of(entry.message)
        if parts is None:
            return
        target, filter_ = parts
        key = (entry.message.publication, filter_)
        flight = self._in_flight.get(target)
        if flight is not None:
            flight.pop(key, None)
        waiting = self.awaiting.get(key)
        if target in entry.reach:
            self._learn(filter_, (target,))
            self._outbox.counters["repairs_delivered"] += 1
            if waiting is not None:
                self._delivered(key, waiting, target)
        else:
            self._outbox.counters["receivers_left"] += 1
            self._forget(filter_, target)
            for other in [k for k in self._queues.get(target, {}) if k[1] == filter_]:
                item = self.awaiting.get(other)
                if item is not None:
                    self._delivered(other, item, target)  # nothing owed to a broker that does not subscribe
        if target in self._queues:
            self._schedule(target, self.now)  # the window has room

    def _delivered(self, key: EntryKey, waiting: Awaiting, target: Address) -> None:
        waiting.missing.discard(target)
        queue = self._queues.get(target)
        if queue is not None:
            queue.pop(key, None)
            if not queue:
                self._drop_target(target)
        if not waiting.missing:
            self._resolve(key, waiting)

    def _resolve(self, key: EntryKey, waiting: Awaiting) -> None:
        del self.awaiting[key]
        self.awaiting_bytes -= waiting.size
        self._custody.own_resolved(key[0], waiting.given_up)

    def _drop_target(self, target: Address) -> None:
        self._queues.pop(target, None)
        self._due.pop(target, None)
        self._unreachable.discard(target)
        for key, message in self._in_flight.pop(target, {}).items():
            self._cancel_repair(message, key)

    def _cancel_repair(self, message: TopicMessage, key: EntryKey) -> None:
        entry = self._custody.abandon(message.publication, message.filter)
        if entry is not None:
            for transport in sorted(entry.copies):
                self._cancel(transport, message)

    # ------------------------------------------------------------ giving up

    def _give_up(self, key: EntryKey, waiting: Awaiting, reason: str) -> None:
        """Stop waiting for the brokers that lack it: each counted and reported, the publication released."""
        message = waiting.message
        for broker in sorted(waiting.missing):
            self._outbox.drop(reason, event=events.PUBLICATION_DROPPED, now=self.now,
                              pub=publication_text(message.publication), filter=message.filter,
                              reason=reason, to=[str(broker)])
            queue = self._queues.get(broker)
            if queue is not None:
                queue.pop(key, None)
                flight = self._in_flight.get(broker)
                if flight is not None and key in flight:
                    self._cancel_repair(flight.pop(key), key)
                if not queue:
                    self._drop_target(broker)
        waiting.missing.clear()
        waiting.given_up = True
        self._resolve(key, waiting)

    def _make_room(self) -> None:
        settings = self._settings
        by_age = self._by_age
        while self.awaiting and (len(self.awaiting) > settings.max_awaiting
                                 or self.awaiting_bytes > settings.max_awaiting_bytes):
            key = heapq.heappop(by_age)[3]
            waiting = self.awaiting.get(key)
            if waiting is not None:
                self._give_up(key, waiting, "receiver_hold_full")
        if len(by_age) > 2 * len(self.awaiting) + 64:  # mostly resolved ones: rebuilt, so it stays bounded
            self._by_age = [item for item in by_age if item[3] in self.awaiting]
            heapq.heapify(self._by_age)

    # ------------------------------------------------------------ repairs

    def _schedule(self, target: Address, when: float) -> None:
        due = self._due.get(target)
        if due is None or when < due:
            self._due[target] = when
            heapq.heappush(self._heap, (when, target))

    def routes_changed(self) -> None:
        """The table's reach changed: receivers back in it get their repairs (a hello interval later: the mesh may
        bring the newest first); the repairs on their way to ones out of it are called back."""
        reachable = self._table.routes.members
        later = self.now + self._settings.hello_interval
        for target in sorted(self._queues):
            if target in reachable:
                if target in self._unreachable:
                    self._unreachable.discard(target)
                    self._schedule(target, later)
            elif target not in self._unreachable:
                self._unreachable.add(target)
                self._due.pop(target, None)
                for key, message in self._in_flight.pop(target, {}).items():
                    self._cancel_repair(message, key)

    def next_deadline(self) -> float | None:
        heap = self._heap
        while heap and self._due.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # rescheduled or done since
        deadlines = [heap[0][0]] if heap else []
        if self.awaiting:
            deadlines.append(next(iter(self.awaiting.values())).since + self._settings.receiver_hold)
        return min(deadlines) if deadlines else None

    def on_timer(self, now: float) -> None:
        self.now = now
        hold = self._settings.receiver_hold
        while self.awaiting:
            key, waiting = next(iter(self.awaiting.items()))
            if waiting.since + hold > now:
                break
            self._give_up(key, waiting, "receiver_hold_expired")
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, target = heapq.heappop(heap)
            if self._due.get(target) != when:
                continue
            del self._due[target]
            self._send_repairs(target, now)

    def _send_repairs(self, target: Address, now: float) -> None:
        """Up to `repair_window` repair copies on their way to `target`, the oldest publications first."""
        queue = self._queues.get(target)
        if not queue:
            return
        if target not in self._table.routes.members:
            self._unreachable.add(target)
            return
        transport = self._next_hop(target, None)
        if transport is None:
            self._schedule(target, now + self._settings.hello_interval)
            return
        flight = self._in_flight.setdefault(target, {})
        room = self._settings.repair_window - len(flight)
        if room <= 0:
            return
        chosen = sorted((key for key in queue if key not in flight), key=_oldest)[:room]
        sent: list[TopicMessage] = []
        for key in chosen:
            waiting = self.awaiting[key]
            message = waiting.message
            copy = TopicMessage(repair_filter(target.host, target.port, message.filter), message.origin,
                                message.epoch, message.seq, MODE_REPAIR, 0, message.topic, message.payload,
                                message.qos, message.retain, message.properties, message.prev, target)
            if self._custody.get(copy.publication, copy.filter) is not None:
                continue  # an earlier repair of it still open (called back but not yet settled)
            self._custody.open(copy, None)
            flight[key] = copy
            sent.append(copy)
        if not sent:
            return
        self._track(sent, [transport])
        for copy in sent:
            self._outbox.send(TOPIC_MESSAGE, copy, [transport])
        self._outbox.counters["repairs_sent"] += len(sent)

    def repair_called_back(self, message: TopicMessage) -> None:
        """Our repair copy found no way toward its target (given up, not acknowledged): sent again once the target
        is in reach."""
        parts = repair_of(message)
        if parts is None:
            return
        target, filter_ = parts
        flight = self._in_flight.get(target)
        if flight is not None:
            flight.pop((message.publication, filter_), None)
        if target in self._queues:
            self._schedule(target, self.now + self._settings.hello_interval)

    # ------------------------------------------------------------ repair copies that cross us

    def relay(self, message: TopicMessage, from_announced: Address | None, now: float) -> Routed | None:
        """A repair copy taken here (its entry open): on toward its target; None when we are the target."""
        target = message.target
        if target is None or target == self._identity.address:
            return None
        hops = message.hops + 1
        if hops >= self._settings.max_hops or target not in self._table.routes.members:
            return NOT_SENT
        transport = self._next_hop(target, from_announced)
        if transport is None:
            return NOT_SENT
        outgoing = TopicMessage(message.filter, message.origin, message.epoch, message.seq, MODE_REPAIR, hops,
                                message.topic, message.payload, message.qos, message.retain, message.properties,
                                message.prev, target)
        self._track([outgoing], [transport])
        self._outbox.send(TOPIC_MESSAGE, outgoing, [transport])
        self._outbox.counters["repairs_relayed"] += 1
        return SENT

    def _next_hop(self, target: Address, from_announced: Address | None) -> Address | None:
        """The transport of the first up next hop toward `target` (back where the copy came from only when that is
        the only way)."""
        hops = sorted(self._table.routes.next_hops.get(target, ()))
        transport_for = self._neighbours.transport_for
        for hop in sorted(hops, key=lambda hop: hop == from_announced):
            transport = transport_for(hop)
            if transport is not None:
                return transport
        return None

    # ------------------------------------------------------------ kept across a restart, shown

    def snapshot(self) -> dict[str, list[str]]:
        """The known receivers of every filter, for the embedder to keep (and give back to `restore`)."""
        return {filter_: sorted(f"{broker.host}:{broker.port}" for broker in receivers)
                for filter_, receivers in sorted(self.known.items())}

    def restore(self, known: Mapping[str, Iterable[str]], now: float) -> None:
        """Receivers an earlier life knew: awaited as if their reach had named them now."""
        self.now = now
        for filter_, brokers in known.items():
            addresses = []
            for text in brokers:
                host, _, port = str(text).rpartition(":")
                if host and port.isdigit():
                    addresses.append(Address(host, int(port)))
            self._learn(filter_, addresses)

    def expire(self, now: float) -> None:
        """Every announce interval: forget the receivers the table has not reached for `receiver_hold`."""
        self.now = now
        reachable = self._table.routes.members
        hold = self._settings.receiver_hold
        for filter_ in sorted(self.known):
            receivers = self.known[filter_]
            for broker in sorted(receivers):
                if broker in reachable:
                    receivers[broker] = now  # the hold counts from when the table last reached it
                elif receivers[broker] + hold <= now and broker not in self._queues:
                    self._forget(filter_, broker)

    def status(self) -> dict[str, Any]:
        return {"receivers": sum(len(receivers) for receivers in self.known.values()),
                "filters": len(self.known), "awaiting": len(self.awaiting), "awaiting_bytes": self.awaiting_bytes,
                "repairs_in_flight": sum(len(flight) for flight in self._in_flight.values()),
                "awaited": {f"{target.host}:{target.port}": len(queue)
                            for target, queue in sorted(self._queues.items())},
                "unreachable": sorted(f"{target.host}:{target.port}" for target in self._unreachable)}


def _oldest(key: EntryKey) -> tuple[int, int, str]:
    (_origin, epoch, seq), filter_ = key
    return (epoch, seq, filter_)
