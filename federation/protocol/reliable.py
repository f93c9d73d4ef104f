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

Unanswered copies are sent again to the same neighbour after a timeout that
starts at max(`retransmit_timeout`, 2 x the neighbour's smoothed RTT) and
doubles after each try up to `retransmit_timeout_max`, with up to 25%
jitter drawn from the node's RNG (so a simulation replays exactly, and
neighbours that lost the same burst do not retry in lockstep). After
`retransmit_limit` retransmissions the copy is given up: dropped, counted and
reported as `publication_dropped` (reason `unacknowledged`). If the
neighbour goes down meanwhile, the copy is not retried there: once the
routes have been recomputed the publication is routed again through the
mesh (another parent, the new mesh neighbours), and the new copies are
tracked in turn; while the mesh has no other way yet, the reroute is retried
with the same backoff and limit.

A mesh that changes while a publication crosses it can leave a part of it
behind: the node that now leads to that part may have handled the
publication already (the duplicate cache stops it there). So every node
keeps the QoS >= 1 publications it handled in the last
`neighbour_dead_after + announce_interval` seconds (at most `max_unacked`)
and sends them to every *new* mesh neighbour of their filter (a new child's
`ts`, a new parent); the receiver's duplicate cache drops what it had.

Receivers acknowledge every QoS >= 1 `tm`, duplicates included (the first
acknowledgement may be the one that was lost). Retransmissions are
therefore harmless: the duplicate cache (`federation.protocol.dedup`) drops the
repeated (publication, filter) and the injection cache delivers each
publication to the local broker once. QoS 0 stays best effort: it is
neither tracked nor acknowledged.

Memory is bounded: at most `max_unacked` copies are remembered, all
neighbours together; beyond it the oldest stops being tracked (drop
`unacked_evicted`; the copy was sent once, only its retries are lost). A
node whose table is nearly full (7/8) does not acknowledge new QoS >= 1
copies from its neighbours (drop `reliable_table_full`): they stay in the
sender's table and come again, so a lagging hop slows the ones before it
instead of losing what it had to forget.
Deadlines live in a heap with lazy deletion, so the node's timer costs
O(log n) per copy instead of a scan.

Whoever sends a QoS >= 1 copy tracks it (`track`), as an explicit step of
its sending: the mesh when it routes a publication (the node hands it
`track`), this part when it replays one to a new mesh neighbour; a
retransmission is the same copy and stays tracked. To route a publication
again this part has one function from the node (`route_again`, the mesh's
routing), and it answers the node with outcomes: `on_ack` says whether the
ack matched a copy, `pressure` why new copies are refused now.
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

from federation.protocol import events, wire
from federation.protocol.context import NeighboursView, Outbox
from federation.protocol.events import publication_text
from federation.protocol.settings import Settings
from federation.protocol.types import Address, PublicationId
from federation.protocol.wire import MODE_IN_MESH
from federation.protocol.wire_types import TopicAck, TopicMessage

JITTER = 0.25
"""a timeout is stretched by up to this fraction, drawn from the node's RNG"""

Key = tuple[Address, PublicationId, str]
"""(transport of the next hop, publication, filter): one tracked copy"""

RouteAgain = Callable[[TopicMessage, float], bool | None]
"""routes a publication again through the current mesh: True when it was sent on or held, False when it found
no way yet, None when its filter has no topic any more (the mesh's `route_again`)"""


@dataclass
class Unacked:
    transport: Address
    message: TopicMessage
    """the copy as it was sent (hops included)"""
    retransmissions: int = 0
    timeout: float = 0.0
    due: float | None = None
    """when it is sent again (None: sent in this step, armed by `arm`)"""
    reroute: bool = False
    """the neighbour went down: route the publication again through the mesh when due"""


class ReliableForwarding:
    """The node's table of unacknowledged QoS >= 1 copies, with their timers."""

    def __init__(self, settings: Settings, neighbours: NeighboursView, outbox: Outbox, rng: random.Random,
                 route_again: RouteAgain) -> None:
        self.settings = settings
        self._neighbours = neighbours
        self._outbox = outbox
        self._rng = rng
        self._route_again = route_again
        self.delivery_backlogged = False
        """the embedder says the publications waiting for the local broker are nearly too many to keep
        (`Node.report_delivery_backlog`): new copies are refused (`pressure`)"""
        self.unacked: OrderedDict[Key, Unacked] = OrderedDict()
        """oldest first: the first entry is evicted when the table is full"""
        self._heap: list[tuple[float, int, Key]] = []
        self._fresh: list[Key] = []
        self._pushes = 0
        self._armed_at = float("-inf")
        self.recent: OrderedDict[tuple[PublicationId, str], tuple[TopicMessage, float, Address | None]] = OrderedDict()
        """(publication, filter) -> (message, when handled, neighbour it came from): replayed to new mesh neighbours"""
        self.recent_evicted = 0
        """recent publications forgotten before their replay window ended because `recent` was full"""

    # ------------------------------------------------------------ sending side

    def track(self, message: TopicMessage, transports: list[Address]) -> None:
        """Remember copies of a QoS >= 1 `tm` sent now (by whoever sends them), until acknowledged."""
        publication = message.publication
        limit = self.settings.max_unacked
        for transport in transports:
            key = (transport, publication, message.filter)
            entry = self.unacked.pop(key, None)
            if entry is None:
                entry = Unacked(transport, message)
            else:  # sent again by routing (a reroute): start over
                entry.message, entry.retransmissions, entry.due, entry.reroute = message, 0, None, False
            self.unacked[key] = entry
            self._fresh.append(key)
            while len(self.unacked) > limit:
                self.unacked.popitem(last=False)
                self._outbox.drop("unacked_evicted")

    def arm(self, now: float) -> None:
        """Give the copies sent in this step their first deadline (the node calls it after every input)."""
        self._armed_at = now
        if not self._fresh:
            return
        fresh, self._fresh = self._fresh, []
        for key in fresh:
            entry = self.unacked.get(key)
            if entry is None or entry.due is not None:
                continue
            self.remember(entry.message, None, now)
            neighbour = self._neighbours.get(entry.transport)
            rtt = neighbour.rtt if neighbour is not None and neighbour.rtt is not None else 0.0
            entry.timeout = min(max(self.settings.retransmit_timeout, 2 * rtt), self.settings.retransmit_timeout_max)
            self._schedule(key, entry, now + entry.timeout * (1 + JITTER * self._rng.random()))

    def _schedule(self, key: Key, entry: Unacked, due: float) -> None:
        entry.due = due
        self._pushes += 1
        heap = self._heap
        heapq.heappush(heap, (due, self._pushes, key))
        if len(heap) > 4 * len(self.unacked) + 64:  # mostly stale deadlines: rebuild, so the heap stays bounded
            unacked = self.unacked
            self._heap = [item for item in heap if (e := unacked.get(item[2])) is not None and e.due == item[0]]
            heapq.heapify(self._heap)

    def next_deadline(self) -> float | None:
        if self._fresh:
            return self._armed_at
        heap = self._heap
        while heap:
            due, _, key = heap[0]
            entry = self.unacked.get(key)
            if entry is not None and entry.due == due:
                return due
            heapq.heappop(heap)  # acknowledged, evicted or rescheduled since
        return None

    def on_timer(self, now: float) -> None:
        """Retransmit, reroute or give up every copy whose deadline has come."""
        heap = self._heap
        due_now: list[Unacked] = []
        while heap and heap[0][0] <= now:
            due, _, key = heapq.heappop(heap)
            entry = self.unacked.get(key)
            if entry is not None and entry.due == due:
                due_now.append(entry)
        for entry in due_now:
            key = (entry.transport, entry.message.publication, entry.message.filter)
            if self.unacked.get(key) is not entry:
                continue  # handled by an earlier reroute in this loop
            neighbour = self._neighbours.get(entry.transport)
            if entry.reroute or neighbour is None or not neighbour.up:
                del self.unacked[key]
                self._reroute(entry, now)
            elif entry.retransmissions >= self.settings.retransmit_limit:
                del self.unacked[key]
                self._give_up(entry, now)
            else:
                self._retransmit(key, entry, now)

    def _retransmit(self, key: Key, entry: Unacked, now: float) -> None:
        outbox = self._outbox
        entry.retransmissions += 1
        outbox.send(wire.TOPIC_MESSAGE, entry.message, [entry.transport])  # the same copy: tracked already
        outbox.counters["retransmissions"] += 1
        outbox.emit(events.PUBLICATION_RETRANSMITTED, now, pub=publication_text(entry.message.publication),
                    filter=entry.message.filter, to=str(entry.transport), attempt=entry.retransmissions)
        entry.timeout = min(entry.timeout * 2, self.settings.retransmit_timeout_max)
        self._schedule(key, entry, now + entry.timeout * (1 + JITTER * self._rng.random()))

    def _give_up(self, entry: Unacked, now: float) -> None:
        self._outbox.drop("publication_unacknowledged", event=events.PUBLICATION_DROPPED, now=now,
                          pub=publication_text(entry.message.publication), filter=entry.message.filter,
                          reason="unacknowledged", to=str(entry.transport))

    def _reroute(self, entry: Unacked, now: float) -> None:
        """The next hop went down: route the publication again with the current mesh (new copies are tracked).
        While the mesh offers no next hop yet, try again later, with the backoff and limit of retransmissions."""
        if entry.retransmissions >= self.settings.retransmit_limit:
            self._give_up(entry, now)
            return
        routed = self._route_again(entry.message, now)
        if routed is None:  # the filter has no topic any more
            self._give_up(entry, now)
            return
        if routed:
            self._outbox.counters["reroutes"] += 1
            return
        entry.retransmissions += 1
        entry.reroute = True
        key = (entry.transport, entry.message.publication, entry.message.filter)
        self.unacked[key] = entry
        entry.timeout = min(entry.timeout * 2, self.settings.retransmit_timeout_max)
        self._schedule(key, entry, now + entry.timeout * (1 + JITTER * self._rng.random()))

    def neighbour_down(self, transport: Address, now: float) -> None:
        """Copies waiting for this neighbour are routed elsewhere once routes have been recomputed."""
        when = now + self.settings.spf_delay + self.settings.spf_hold
        for key, entry in self.unacked.items():
            if entry.transport == transport:
                entry.reroute = True
                self._schedule(key, entry, when)

    # ------------------------------------------------------------ receiving side

    def pressure(self) -> str | None:
        """Why to leave new QoS >= 1 copies from neighbours unacknowledged (and unhandled) now, as a drop
        reason, or None to take them. The node refuses only a copy it has not handled yet.

        New copies are refused only while taking one could lose it: when the table of copies we forward
        is nearly full (`reliable_table_full`; accepting it would push the oldest copy out, lost if the
        next hop had missed it), or when the embedder says the local broker is backed up
        (`delivery_backlogged`; a copy is acknowledged on arrival, so it could only be dropped on its way
        into the broker). Its sender keeps it and sends it again with its backoff, so the pressure
        travels back hop by hop to the wrapper where publications enter, whose reading from the broker
        pauses (the runtime's backpressure window)."""
        unacked = self.settings.max_unacked
        full = len(self.unacked) >= unacked - max(1, unacked // 8)  # room kept for a copy to each mesh neighbour
        if full:
            return "reliable_table_full"
        return "delivery_backlogged" if self.delivery_backlogged else None

    def on_message(self, message: TopicMessage, transport: Address, now: float) -> None:
        """A QoS >= 1 `tm` from a neighbour: acknowledge it (duplicates too) and stop sending it that copy."""
        self.unacked.pop((transport, message.publication, message.filter), None)
        self.remember(message, transport, now)
        self._outbox.send(wire.TOPIC_ACK, TopicAck(message.filter, message.origin, message.epoch, message.seq),
                          [transport])

    def on_ack(self, ack: TopicAck, transport: Address) -> bool:
        """A `ta` from a neighbour; True when it acknowledged a copy we still waited for."""
        if self.unacked.pop((transport, ack.publication, ack.filter), None) is None:
            self._outbox.counters["acks_unmatched"] += 1  # late (after a retransmission was also acked) or stray
            return False
        self._outbox.counters["acks"] += 1
        return True

    # ------------------------------------------------------------ repair of changing meshes

    @property
    def replay_window(self) -> float:
        return self.settings.neighbour_dead_after + self.settings.announce_interval

    def remember(self, message: TopicMessage, source: Address | None, now: float) -> None:
        """Keep a QoS >= 1 publication handled now, for new mesh neighbours (bounded, oldest forgotten first)."""
        key = (message.publication, message.filter)
        recent = self.recent
        if key in recent:
            return
        recent[key] = (message, now, source)
        horizon = now - self.replay_window
        while recent and (len(recent) > self.settings.max_unacked or next(iter(recent.values()))[1] < horizon):
            if len(recent) > self.settings.max_unacked:
                self.recent_evicted += 1  # forgotten before its replay window ended: the table was full
            recent.popitem(last=False)

    def mesh_neighbour_added(self, filter_: str, announced: Address, now: float) -> None:
        """A new child or parent in `filter_`'s mesh: send it the recent QoS >= 1 publications of that filter."""
        transport = self._neighbours.transport_for(announced)
        if transport is None:
            return
        horizon = now - self.replay_window
        replayed = 0
        for (_, message_filter), (message, handled_at, source) in list(self.recent.items()):
            if message_filter != filter_ or handled_at < horizon or source == transport:
                continue
            copy = replace(message, mode=MODE_IN_MESH, hops=message.hops + 1)
            self.track(copy, [transport])
            self._outbox.send(wire.TOPIC_MESSAGE, copy, [transport])
            replayed += 1
        if replayed:
            self._outbox.counters["replayed_to_new_mesh_neighbours"] += replayed

    def status(self) -> dict[str, int]:
        return {"unacked": len(self.unacked), "limit": self.settings.max_unacked, "recent": len(self.recent),
                "recent_evicted": self.recent_evicted}
