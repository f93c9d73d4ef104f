"""Hop-by-hop acknowledgement and retransmission of QoS 1 and 2 publications.

Theory of operation
-------------------
UDP loses datagrams; MQTT promises a QoS 1 or 2 publication at least (or
exactly) once. The federation keeps that promise hop by hop, as a link
layer with ARQ would, rather than end to end: a publication may fan out to
many brokers over a mesh, and an end-to-end scheme would have to know every
receiver. Each copy of a QoS >= 1 `tm` sent to a neighbour is remembered
here until that neighbour answers with `ta` (the publication id and filter)
or sends us the same (publication, filter) itself, which proves it has it.
When the neighbour acknowledges is custody's business
(federation.protocol.custody): only once everything beyond it is done, so
an acknowledgement may take as long as the slowest receiver behind it.

Unanswered copies are sent again to the same neighbour after a timeout that
starts at max(`retransmit_timeout`, 2 x the neighbour's smoothed RTT) and
doubles after each try up to `retransmit_timeout_max`, with up to 25%
jitter drawn from the node's RNG (so a simulation replays exactly, and
neighbours that lost the same burst do not retry in lockstep), for as long
as the neighbour is up: nothing acknowledged upstream is ever given up. A
copy whose neighbour went down is handed back to the node once the routes
have been recomputed (`route_again`): the node keeps it for a mesh
neighbour that is still one (a child that may come back; tried again with
the backoff, and at once when it comes back up: `neighbour_up`), or routes
the publication again (another parent, the new mesh neighbours, or held
while there is no way), and the new copies are tracked in turn. A
neighbour that restarts gets its copies again at once, but each copy at
most once per `retransmit_timeout_max`: restarts are told by a packet's
`sender`, which anyone holding the key can forge in every datagram.

A mesh that changes while a publication crosses it can leave a part of it
behind: the node that now leads to that part may have handled the
publication already (the duplicate cache stops it there). So every node
keeps the QoS >= 1 publications it handled in the last
`neighbour_dead_after + announce_interval` seconds (at most `max_unacked`)
and sends them to every *new* mesh neighbour of their filter (a new child's
`ts`, a new parent); the receiver's duplicate cache drops what it had. Such
a copy joins the custody of its (publication, filter) if that is still open
here, else nobody waits for it (an *orphan*: retransmitted while its
neighbour is up, forgotten when it goes down or when the table is full).

Receivers acknowledge duplicates at once (the first acknowledgement may be
the one that was lost); the duplicate cache (`federation.protocol.dedup`)
drops the repeated (publication, filter) and the injection cache delivers
each publication to the local broker once. QoS 0 stays best effort: it is
neither tracked nor acknowledged.

Memory is bounded: a node whose table holds 7/8 of `max_unacked` copies
does not take new QoS >= 1 copies from its neighbours (drop
`reliable_table_full`, no acknowledgement): they stay in the sender's
table and come again, so a lagging hop slows the ones before it, up to the
origin, whose embedder stops reading from its broker (`Node.unacked_copies`).
Beyond `max_unacked` the oldest orphan is forgotten (`replay_evicted`);
copies in custody never are. Deadlines live in a heap with lazy deletion,
so the node's timer costs O(log n) per copy instead of a scan.

Whoever sends a QoS >= 1 copy tracks it (`track`), as an explicit step of
its sending: the mesh when it routes a publication (the node hands it a
`track` that also tells custody), this part when it replays one to a new
mesh neighbour (through the same function); a retransmission is the same
copy and stays tracked. It answers the node with outcomes: `on_ack` and
`copy_arrived` give the copy they settled, `pressure` why new copies are
refused now.
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from federation.protocol import events, wire
from federation.protocol.context import NO_REACH, NeighboursView, Outbox
from federation.protocol.events import publication_text
from federation.protocol.settings import Settings
from federation.protocol.types import Address, PublicationId
from federation.protocol.wire import MODE_IN_MESH
from federation.protocol.wire_types import TopicAck, TopicAcks, TopicMessage

JITTER = 0.25
"""a timeout is stretched by up to this fraction, drawn from the node's RNG"""


def _by_seq(message: TopicMessage) -> int:
    return message.seq


def _plain(message: TopicMessage) -> bool:
    """Can this copy travel in a `tq` (not retained, no properties, not to a shared group's member)?"""
    return not message.retain and message.properties is None and message.target is None

Key = tuple[Address, PublicationId, str]
"""(transport of the next hop, publication, filter): one tracked copy"""

RouteAgain = Callable[[TopicMessage, Address, float], bool]
"""the node's answer for a copy in custody whose next hop (the transport) is down, called with the copy out of
the table: True to keep it for that neighbour (still a mesh neighbour of the filter, or routed to it again),
False when the publication was routed again elsewhere (or held) and that copy is settled"""
Track = Callable[[list[TopicMessage], list[Address]], None]
"""the node's `track`: remembers copies sent now, here and in custody"""


@dataclass(slots=True)
class Unacked:
    transport: Address
    message: TopicMessage
    """the copy as it was sent (hops included)"""
    owned: bool = True
    """an obligation of an open custody entry; False: an orphan (a replay nobody waits for)"""
    retransmissions: int = 0
    timeout: float = 0.0
    due: float | None = None
    """when it is sent again (None: sent in this step, armed by `arm`)"""
    reroute: bool = False
    """the neighbour went down: hand the copy back to the node (`route_again`) when due"""
    hurried_at: float = float("-inf")
    """when `neighbour_up` last sent it again at once (at most once per `retransmit_timeout_max`)"""
    size: int = 0
    """its payload's and topic's bytes (`ReliableForwarding.unacked_bytes`)"""


class RecentPublications:
    """QoS >= 1 publications handled lately, a run at a time: (when handled, the neighbour they came from or None,
    the publications), oldest first. `len` counts publications (a publication handled twice, as received and as
    sent on, counts twice: the bound is on what is kept)."""

    __slots__ = ("runs", "count", "sizes", "bytes")

    def __init__(self) -> None:
        self.runs: deque[tuple[float, Address | None, list[TopicMessage]]] = deque()
        self.count = 0
        self.sizes: deque[int] = deque()
        """each run's payload bytes, beside `runs`"""
        self.bytes = 0

    def __len__(self) -> int:
        return self.count


class Flight:
    """Copies given one deadline together (those sent to one neighbour in one step, or sent again together): one
    entry in the heap for all of them. `start` skips the keys found settled or rescheduled, so looking for a live
    one costs each key once."""

    __slots__ = ("keys", "start")

    def __init__(self, keys: list[Key]) -> None:
        self.keys = keys
        self.start = 0


class ReliableForwarding:
    """The node's table of unacknowledged QoS >= 1 copies, with their timers."""

    def __init__(self, settings: Settings, neighbours: NeighboursView, outbox: Outbox, rng: random.Random,
                 route_again: RouteAgain, track: Track) -> None:
        self.settings = settings
        self._neighbours = neighbours
        self._outbox = outbox
        self._rng = rng
        self._route_again = route_again
        self._track = track
        self.delivery_backlogged = False
        """the embedder says the publications waiting for the local broker are nearly too many to keep
        (`Node.report_delivery_backlog`): new copies are refused (`pressure`)"""
        self.storage_unavailable = False
        """the embedder cannot write its injection journal (`Node.report_storage`): new copies are refused"""
        self.unacked: OrderedDict[Key, Unacked] = OrderedDict()
        """oldest first"""
        self.unacked_bytes = 0
        """the payload and topic bytes of the copies in `unacked` (bounded by `max_unacked_bytes`)"""
        self.orphans: OrderedDict[Key, None] = OrderedDict()
        """the copies nobody waits for, oldest first: the ones forgotten when the table is full"""
        self.orphan_bytes = 0
        """the payload and topic bytes of the orphans (part of `unacked_bytes`)"""
        self.keep_orphan: Callable[[TopicMessage, Address], bool] = lambda message, transport: False
        """whether an orphan copy whose neighbour is down is kept for it (the node's answer, `ReliableDelivery`:
        a mesh neighbour of a filter the origin's end-to-end custody covers, rule 7f); else it is forgotten"""
        self._heap: list[tuple[float, int, Flight]] = []
        """(deadline, push number, the copies given it): lazily deleted (a copy's `due` says whether it is live)"""
        self._fresh: list[Key] = []
        self._pushes = 0
        self._armed_at = float("-inf")
        self.recent = RecentPublications()
        """the QoS >= 1 publications handled lately: replayed to new mesh neighbours (`mesh_neighbour_added`)"""
        self.recent_evicted = 0
        """recent publications forgotten before their replay window ended because `recent` was full"""

    # ------------------------------------------------------------ sending side

    def track_all(self, messages: list[TopicMessage], transports: list[Address], owned: list[bool]) -> None:
        """Remember copies of QoS >= 1 `tm`s sent now to `transports` (by whoever sends them), until acknowledged;
        `owned[i]`: those of `messages[i]` are obligations of its (publication, filter)'s custody entry."""
        unacked, fresh, orphans = self.unacked, self._fresh, self.orphans
        for message, mine in zip(messages, owned, strict=True):
            publication = (message.origin, message.epoch, message.seq)
            filter_ = message.filter
            for transport in transports:
                key = (transport, publication, filter_)
                entry = unacked.pop(key, None)
                if entry is None:
                    entry = Unacked(transport, message, mine)
                    entry.size = size = len(message.payload) + len(message.topic)
                    self.unacked_bytes += size
                    if not mine:
                        orphans[key] = None
                        self.orphan_bytes += size
                else:  # sent again by routing (a reroute, a replay): start over
                    entry.message, entry.retransmissions, entry.due, entry.reroute = message, 0, None, False
                    if mine and not entry.owned:
                        entry.owned = True
                        orphans.pop(key, None)
                        self.orphan_bytes -= entry.size
                unacked[key] = entry
                fresh.append(key)
        if orphans and (len(unacked) > self.settings.max_unacked or self.unacked_bytes > self._orphan_byte_limit):
            self._evict_orphans()

    @property
    def _orphan_byte_limit(self) -> float:
        limit = self.settings.max_unacked_bytes
        return limit - limit // 8

    def _evict_orphans(self) -> None:
        """Beyond `max_unacked` copies (or 7/8 of `max_unacked_bytes`) in all, the oldest orphans are forgotten: they
        never hold the table's room from the copies custody waits for."""
        unacked, orphans = self.unacked, self.orphans
        byte_limit = self._orphan_byte_limit
        while (len(unacked) > self.settings.max_unacked or self.unacked_bytes > byte_limit) and orphans:
            key, _ = orphans.popitem(last=False)
            entry = unacked.pop(key, None)
            if entry is not None:
                self.unacked_bytes -= entry.size
                self.orphan_bytes -= entry.size
                self._outbox.drop("replay_evicted")

    @property
    def owned_copies(self) -> int:
        """Copies an open custody entry waits for (the orphans left out): what bounds the node's intake."""
        return len(self.unacked) - len(self.orphans)

    @property
    def owned_bytes(self) -> int:
        return self.unacked_bytes - self.orphan_bytes

    def disown(self, transports: set[Address], publication: PublicationId, filter_: str) -> None:
        """These copies' custody entry was given up: nobody waits for them any more."""
        for transport in transports:
            key = (transport, publication, filter_)
            entry = self.unacked.get(key)
            if entry is not None and entry.owned:
                entry.owned = False
                self.orphans[key] = None
                self.orphan_bytes += entry.size

    def cancel(self, transport: Address, message: TopicMessage) -> None:
        """Stop sending our copy of this (publication, filter) to `transport`: its custody entry was given up (a
        repair called back, rule 7f)."""
        self._forget((transport, message.publication, message.filter))

    def _forget(self, key: Key) -> Unacked | None:
        entry = self.unacked.pop(key, None)
        if entry is not None:
            self.unacked_bytes -= entry.size
            if not entry.owned:
                self.orphans.pop(key, None)
                self.orphan_bytes -= entry.size
        return entry

    def arm(self, now: float) -> None:
        """Give the copies sent in this step their first deadline (the node calls it after every input): one per
        neighbour, so a run of copies costs one timer."""
        self._armed_at = now
        if not self._fresh:
            return
        fresh, self._fresh = self._fresh, []
        unacked = self.unacked
        flights: dict[Address, list[Key]] = {}
        sent: list[TopicMessage] = []
        for key in fresh:
            entry = unacked.get(key)
            if entry is None or entry.due is not None:
                continue  # settled already, or tracked twice in this step (armed once)
            entry.due = now  # until `_schedule` below gives the deadline
            message = entry.message
            if not sent or sent[-1] is not message:  # a copy to several neighbours is one publication
                sent.append(message)
            keys = flights.get(entry.transport)
            if keys is None:
                flights[entry.transport] = [key]
            else:
                keys.append(key)
        if sent:
            self.remember_run(sent, None, now)
        settings = self.settings
        for transport, keys in flights.items():
            neighbour = self._neighbours.get(transport)
            rtt = neighbour.rtt if neighbour is not None and neighbour.rtt is not None else 0.0
            timeout = min(max(settings.retransmit_timeout, 2 * rtt), settings.retransmit_timeout_max)
            for key in keys:
                unacked[key].timeout = timeout
            self._schedule(keys, now + timeout * (1 + JITTER * self._rng.random()))

    def _schedule(self, keys: list[Key], due: float) -> None:
        """Give these copies (in the table) the deadline `due`, as one heap entry."""
        unacked = self.unacked
        for key in keys:
            unacked[key].due = due
        self._pushes += 1
        heap = self._heap
        heapq.heappush(heap, (due, self._pushes, Flight(keys)))
        if len(heap) > 4 * len(unacked) + 64:  # mostly stale deadlines: rebuild, so the heap stays bounded
            self._heap = [item for item in heap if self._live(item[2], item[0])]
            heapq.heapify(self._heap)

    def _live(self, flight: Flight, due: float) -> bool:
        """Does a copy of `flight` still wait for `due`? (Advances `flight.start` past those that do not.)"""
        keys, unacked = flight.keys, self.unacked
        index = flight.start
        while index < len(keys):
            entry = unacked.get(keys[index])
            if entry is not None and entry.due == due:
                flight.start = index
                return True
            index += 1
        flight.start = index
        return False

    def next_deadline(self) -> float | None:
        if self._fresh:
            return self._armed_at
        heap = self._heap
        while heap:
            due, _, flight = heap[0]
            if self._live(flight, due):
                return due
            heapq.heappop(heap)  # acknowledged, evicted or rescheduled since
        return None

    def on_timer(self, now: float) -> None:
        """Retransmit every copy whose deadline has come, or hand it back to the node if its neighbour is down."""
        heap, unacked = self._heap, self.unacked
        due_now: dict[Key, Unacked] = {}
        while heap and heap[0][0] <= now:
            due, _, flight = heapq.heappop(heap)
            keys = flight.keys
            for index in range(flight.start, len(keys)):
                key = keys[index]
                entry = unacked.get(key)
                if entry is not None and entry.due == due:
                    due_now[key] = entry
        resend: list[tuple[Key, Unacked]] = []
        for key, entry in due_now.items():
            if unacked.get(key) is not entry:
                continue  # settled by an earlier reroute in this loop
            neighbour = self._neighbours.get(entry.transport)
            if not entry.reroute and neighbour is not None and neighbour.up:
                resend.append((key, entry))
            elif not entry.owned:
                if self.keep_orphan(entry.message, entry.transport):  # sent when it comes back, while it is one
                    entry.reroute = False
                    self._backoff([(key, entry)], now)
                    continue
                self._forget(key)  # a replay to a neighbour gone: nobody waits for it
                self._outbox.drop("replay_abandoned")
            else:
                del unacked[key]
                self.unacked_bytes -= entry.size
                if self._route_again(entry.message, entry.transport, now):
                    if key not in unacked:  # kept for a mesh neighbour that may come back: later again
                        entry.reroute = False
                        unacked[key] = entry
                        self.unacked_bytes += entry.size
                        self._backoff([(key, entry)], now)
                else:
                    self._outbox.counters["reroutes"] += 1  # routed again elsewhere (or held): this copy is settled
        if resend:
            # A reroute in this loop may have evicted orphans (its new copies filled the table): those are gone.
            self._retransmit([(key, entry) for key, entry in resend if unacked.get(key) is entry], now)

    def _retransmit(self, copies: list[tuple[Key, Unacked]], now: float) -> None:
        """Send these copies again, unchanged (tracked already): the copies of one run together, as the run."""
        outbox = self._outbox
        runs: dict[tuple[Address, str, Address, int, int, int, int], list[TopicMessage]] = {}
        for _key, entry in copies:
            entry.retransmissions += 1
            message = entry.message
            outbox.emit(events.PUBLICATION_RETRANSMITTED, now, pub=publication_text(message.publication),
                        filter=message.filter, to=[str(entry.transport)], attempt=entry.retransmissions)
            if not _plain(message):
                outbox.send(wire.TOPIC_MESSAGE, message, [entry.transport])
                continue
            run_key = (entry.transport, message.filter, message.origin, message.epoch, message.mode, message.hops,
                       message.qos)
            run = runs.get(run_key)
            if run is None:
                runs[run_key] = [message]
            else:
                run.append(message)
        for (transport, *_), messages in runs.items():
            messages.sort(key=_by_seq)
            outbox.send_run(messages, [transport])
        outbox.counters["retransmissions"] += len(copies)
        self._backoff(copies, now)

    def _backoff(self, copies: list[tuple[Key, Unacked]], now: float) -> None:
        """Double each copy's timeout (up to the maximum) and give the copies that share a neighbour and a timeout
        one deadline, with its own jitter."""
        settings = self.settings
        groups: dict[tuple[Address, float], list[Key]] = {}
        for key, entry in copies:
            entry.timeout = min(entry.timeout * 2, settings.retransmit_timeout_max)
            group = groups.get((entry.transport, entry.timeout))
            if group is None:
                groups[(entry.transport, entry.timeout)] = [key]
            else:
                group.append(key)
        for (_transport, timeout), keys in groups.items():
            self._schedule(keys, now + timeout * (1 + JITTER * self._rng.random()))

    def neighbour_down(self, transport: Address, now: float) -> None:
        """Copies waiting for this neighbour go back to the node once routes have been recomputed."""
        when = now + self.settings.spf_delay + self.settings.spf_hold
        keys = []
        for key, entry in self.unacked.items():
            if entry.transport == transport:
                entry.reroute = True
                keys.append(key)
        if keys:
            self._schedule(keys, when)

    def neighbour_up(self, transport: Address, now: float) -> None:
        """The neighbour is back (or restarted, having lost what it had): what waits for it goes again now.

        A copy goes at once at most once per `retransmit_timeout_max`: a restart is told by the `sender` of any
        packet from the neighbour's address, which a key holder (anyone, in open mode) can forge in every
        datagram, and a copy hurried at every one would be sent as fast as the forgeries come. So the backoff
        bounds each copy's sending whatever arrives: its timer's, plus one hurried copy per
        `retransmit_timeout_max`."""
        settings = self.settings
        waiting = [(key, entry) for key, entry in self.unacked.items() if entry.transport == transport
                   and not entry.reroute and now - entry.hurried_at >= settings.retransmit_timeout_max]
        waiting.sort(key=lambda item: (item[0][1][1], item[0][1][2]))  # in the order their origins made them
        for _key, entry in waiting:
            entry.hurried_at = now
            entry.timeout = min(max(settings.retransmit_timeout, entry.timeout / 2), settings.retransmit_timeout_max)
        if waiting:
            self._schedule([key for key, _entry in waiting], now)

    # ------------------------------------------------------------ receiving side

    def pressure(self) -> str | None:
        """Why to leave new QoS >= 1 copies from neighbours unacknowledged (and unhandled) now, as a drop
        reason, or None to take them. The node refuses only a copy it has not handled yet.

        New copies are refused while taking one would grow what this node must keep beyond its bounds:
        when the table of copies we forward is nearly full (`reliable_table_full`), or when the embedder
        says the local broker is backed up (`delivery_backlogged`). Its sender keeps it and sends it again
        with its backoff, so the pressure travels back hop by hop to the wrapper where publications enter,
        whose reading from the broker pauses (the runtime's backpressure window)."""
        unacked, limit = self.settings.max_unacked, self.settings.max_unacked_bytes
        # The orphans are left out: they are forgotten, oldest first, to make room (`_evict_orphans`).
        full = self.owned_copies >= unacked - max(1, unacked // 8) or \
            self.owned_bytes >= limit - limit // 8  # room kept for a copy to each mesh neighbour
        if full:
            return "reliable_table_full"
        if self.storage_unavailable:
            return "storage_unavailable"
        return "delivery_backlogged" if self.delivery_backlogged else None

    def copy_arrived(self, transport: Address, message: TopicMessage) -> Unacked | None:
        """The neighbour sent us a (publication, filter) we have a copy out to it for: it has it. Returns that
        copy (no longer tracked), if any."""
        return self._forget((transport, message.publication, message.filter))

    def acknowledge(self, message: TopicMessage, transport: Address, reach: frozenset[Address] = NO_REACH) -> None:
        self._outbox.acknowledge(transport, message.filter, message.origin, message.epoch, message.seq, reach)

    def on_ack(self, ack: TopicAck, transport: Address) -> Unacked | None:
        """A `ta` from a neighbour: the copy it acknowledged (no longer tracked), or None if we waited for none."""
        entry = self._forget((transport, ack.publication, ack.filter))
        if entry is None:
            self._outbox.counters["acks_unmatched"] += 1  # late (after a retransmission was also acked) or stray
            return None
        self._outbox.counters["acks"] += 1
        return entry

    def on_acks(self, acks: TopicAcks, transport: Address) -> list[tuple[int, Unacked]]:
        """A `tk` from a neighbour: each copy it acknowledged (no longer tracked), with its seq."""
        filter_, origin, epoch = acks.filter, acks.origin, acks.epoch
        settled = []
        forget = self._forget
        for seq in acks.seqs:
            entry = forget((transport, (origin, epoch, seq), filter_))
            if entry is not None:
                settled.append((seq, entry))
        counters = self._outbox.counters
        counters["acks"] += len(settled)
        if len(settled) < len(acks.seqs):
            counters["acks_unmatched"] += len(acks.seqs) - len(settled)
        return settled

    # ------------------------------------------------------------ repair of changing meshes

    @property
    def replay_window(self) -> float:
        return self.settings.neighbour_dead_after + self.settings.announce_interval

    def remember(self, message: TopicMessage, source: Address | None, now: float) -> None:
        """Keep a QoS >= 1 publication handled now, for new mesh neighbours (bounded, oldest forgotten first)."""
        self.remember_run([message], source, now)

    def remember_run(self, messages: list[TopicMessage], source: Address | None, now: float) -> None:
        """Keep QoS >= 1 publications handled now together (from `source`, None for ours or sent on), as one entry:
        a run costs one append here. The list is kept as given: the caller does not change it afterwards."""
        recent = self.recent
        size = sum(len(message.payload) for message in messages)
        recent.runs.append((now, source, messages))
        recent.sizes.append(size)
        recent.count += len(messages)
        recent.bytes += size
        horizon = now - self.replay_window
        limit = self.settings.max_unacked
        byte_limit = self.settings.max_recent_bytes  # large publications: a few seconds of them at most
        runs, sizes = recent.runs, recent.sizes
        while runs:
            handled_at, first_source, first = runs[0]
            excess = recent.count - limit
            if excess > 0:  # forgotten before their replay window ended: the table was full
                self.recent_evicted += min(excess, len(first))
                if excess < len(first):
                    kept = first[excess:]
                    runs[0] = (handled_at, first_source, kept)
                    recent.count -= excess
                    trimmed = sum(len(message.payload) for message in kept)
                    recent.bytes -= sizes[0] - trimmed
                    sizes[0] = trimmed
                    continue
            elif recent.bytes > byte_limit and len(runs) > 1:
                self.recent_evicted += len(first)  # forgotten early: too many bytes
            elif handled_at >= horizon:
                break
            runs.popleft()
            recent.count -= len(first)
            recent.bytes -= sizes.popleft()

    def mesh_neighbour_added(self, filter_: str, announced: Address, now: float) -> None:
        """A new child or parent in `filter_`'s mesh: send it the recent QoS >= 1 publications of that filter (each
        once, and none that came from it)."""
        transport = self._neighbours.transport_for(announced)
        if transport is None:
            return
        horizon = now - self.replay_window
        runs = [run for run in self.recent.runs if run[0] >= horizon]
        from_it = {(message.publication, message.filter) for _, source, messages in runs if source == transport
                   for message in messages}
        chosen: dict[tuple[PublicationId, str], TopicMessage] = {}
        for _, _source, messages in runs:
            for message in messages:
                key = (message.publication, message.filter)
                if message.filter == filter_ and key not in from_it and key not in chosen:
                    chosen[key] = message  # the first handled: as received, before it was sent on
        replay = sorted(chosen.values(), key=lambda message: (message.origin, message.epoch, message.seq))
        before: TopicMessage | None = None
        copies: list[TopicMessage] = []
        for message in replay:  # each origin's in order
            prev = message.prev
            if before is not None and before.origin == message.origin:
                # Chained to the one replayed before it: the new neighbour may not have been meant to get
                # that one (it joined later), but it gets both, and must inject them in order (rule 7d).
                position = (before.epoch, before.seq)
                prev = position if prev is None or prev < position else prev
            copy = replace(message, mode=MODE_IN_MESH, hops=message.hops + 1, prev=prev)
            before = message
            self._track([copy], [transport])
            copies.append(copy)
        outbox = self._outbox
        run: list[TopicMessage] = []
        for copy in copies:  # one origin's plain publications of one epoch, hops and QoS go as `tq` (rule 7e)
            if run and not (_plain(copy) and _plain(run[-1]) and (copy.origin, copy.epoch, copy.hops, copy.qos)
                            == (run[-1].origin, run[-1].epoch, run[-1].hops, run[-1].qos)):
                outbox.send_run(run, [transport])
                run = []
            run.append(copy)
        if run:
            outbox.send_run(run, [transport])
        if replay:
            self._outbox.counters["replayed_to_new_mesh_neighbours"] += len(replay)

    def status(self) -> dict[str, int]:
        return {"unacked": len(self.unacked), "orphans": len(self.orphans), "limit": self.settings.max_unacked,
                "recent": len(self.recent), "recent_evicted": self.recent_evicted}
