"""The node's composition of its parts for QoS 1/2 publications: custody across reliable forwarding, the mesh's
routing and holds, and the publication path.

Theory of operation
-------------------
Custody (federation.protocol.custody) is a rule about what several parts do
together: a copy taken from a neighbour opens an entry (custody), its
routing adds copies and holds to it (the mesh, through `track`, `held`,
`unheld`), its injection one more obligation (the publication path), and
every acknowledgement or copy that comes back settles one (reliable
forwarding's outcomes). No part sees another; this module is where the node
tells each what another's work means for QoS 1/2, so that node.py keeps the
rest (neighbours, dispatch, timers) and both stay readable. It is built
before the parts that call it and bound to them once they exist (`bind`):
they are given its methods, as they are given the node's.
"""

from __future__ import annotations

from dataclasses import replace

from federation.protocol.context import NO_REACH, NeighboursView, Outbox
from federation.protocol.custody import Custody, Entry
from federation.protocol.forwarding import NOT_SENT, Routed
from federation.protocol.mesh import MeshEngine
from federation.protocol.modes import end_to_end
from federation.protocol.publications import Publications
from federation.protocol.receivers import Receivers, repair_of
from federation.protocol.reliable import ReliableForwarding
from federation.protocol.settings import Settings
from federation.protocol.types import Address, PublicationId
from federation.protocol.wire import MODE_IN_MESH, MODE_REPAIR, MODE_TO_MEMBER, MODE_TOWARD_CORE
from federation.protocol.wire_types import TopicAck, TopicAcks, TopicMessage, TopicReliableBatch

REACH_SETS_KEPT = 256
"""distinct reaches of acknowledgements kept as frozensets: every acknowledgement of a run names the same"""


def _up(neighbours: NeighboursView, transport: Address) -> bool:
    neighbour = neighbours.get(transport)
    return neighbour is not None and neighbour.up


class ReliableDelivery:
    """What a QoS 1/2 `tm`, `ta`, copy, hold and injection mean across the node's parts."""

    def __init__(self, settings: Settings, outbox: Outbox, neighbours: NeighboursView, custody: Custody) -> None:
        self._max_hops = settings.max_hops
        self._outbox = outbox
        self._neighbours = neighbours
        self.custody = custody
        self._reliable: ReliableForwarding | None = None
        self._mesh: MeshEngine | None = None
        self._publications: Publications | None = None
        self._receivers: Receivers | None = None
        self._reach_sets: dict[tuple[Address, ...], frozenset[Address]] = {}

    def bind(self, reliable: ReliableForwarding, mesh: MeshEngine, publications: Publications,
             receivers: Receivers) -> None:
        self._reliable, self._mesh, self._publications = reliable, mesh, publications
        self._receivers = receivers
        reliable.keep_orphan = self._keeps_orphan

    def _reach(self, listed: tuple[Address, ...]) -> frozenset[Address]:
        """An acknowledgement's reach as a frozenset, one object per distinct reach (runs repeat theirs)."""
        if not listed:
            return NO_REACH
        found = self._reach_sets.get(listed)
        if found is None:
            if len(self._reach_sets) >= REACH_SETS_KEPT:
                self._reach_sets.clear()
            found = self._reach_sets[listed] = frozenset(listed)
        return found

    @property
    def _parts(self) -> tuple[ReliableForwarding, MeshEngine, Publications]:
        reliable, mesh, publications = self._reliable, self._mesh, self._publications
        assert reliable is not None and mesh is not None and publications is not None, "bind() first"
        return reliable, mesh, publications

    # ------------------------------------------------------------ packets from neighbours

    def receive(self, message: TopicMessage, sender: Address, announced: Address, now: float) -> Routed:
        """A QoS 1/2 `tm` from neighbour `sender` (transport; `announced` its address): custody's rules."""
        if message.mode == MODE_REPAIR:
            return self._receive_repair(message, sender, announced, now)
        reliable, mesh, publications = self._parts
        custody = self.custody
        entry = custody.get(message.publication, message.filter)
        key = publications.seen_key(message)
        if entry is None and key not in publications.seen:
            refusal = reliable.pressure()
            if refusal is not None:
                self._outbox.drop(refusal)  # a new copy, unacknowledged: its sender sends it again
                return NOT_SENT
            taken = custody.open(message, sender)
            reliable.remember(message, sender, now)
            routed = publications.take(message, key, announced, now)  # obligations: copies, injection, hold
            custody.settle(taken)  # acknowledged now if it owes nothing
            return routed
        if message.mode == MODE_TO_MEMBER and message.target == publications.address \
                and (entry is None or entry.upstream != sender):
            return self._failed_over_to_us(message, entry, sender, announced, now)
        publications.duplicate(message, announced, now)
        if entry is not None and entry.upstream == sender:
            self._outbox.counters["retransmissions_absorbed"] += 1  # acknowledged once our obligations are done
            # If we sent it a copy too (only forged copies make an upstream a next hop as well: each would wait
            # for the other's acknowledgement, and absorb the other's copy, for ever), it has it: that copy is done.
            self._copy_arrived(sender, message)
            return NOT_SENT
        routed = NOT_SENT
        if message.mode == MODE_TOWARD_CORE and not mesh.is_member(message.filter) \
                and message.hops + 1 < self._max_hops:
            # Rerouted toward the core through us: "we have it" says nothing of where it must go from here.
            self._outbox.counters["rerouted_through"] += 1
            if entry is None:  # we delivered it before: a relay again, acknowledging when done
                refusal = reliable.pressure()
                if refusal is not None:
                    self._outbox.drop(refusal)
                    return NOT_SENT
                relay = custody.open(message, sender)
                routed = mesh.route_again(message, now, exclude=announced)
                self._copy_arrived(sender, message)
                custody.settle(relay)
                return routed
            routed = mesh.route_again(message, now, exclude=announced)  # joins the entry we hold
        self._copy_arrived(sender, message)
        reliable.acknowledge(message, sender, custody.reach_of(message.filter))
        return routed

    def _receive_repair(self, message: TopicMessage, sender: Address, announced: Address, now: float) -> Routed:
        """A repair copy (mode 3, rule 7f): on toward its target, with custody; at the target, taken as a copy of its
        filter's and injected in its stream's order (not flooded: each receiver gets its own), its acknowledgement
        naming the target when it subscribes to the filter (else none: the origin forgets it as a receiver)."""
        reliable, _mesh, publications = self._parts
        receivers = self._receivers
        assert receivers is not None
        custody = self.custody
        parts = repair_of(message)
        if parts is None:
            return NOT_SENT
        target, filter_ = parts
        entry = custody.get(message.publication, message.filter)
        if entry is not None:  # ours to relay already: its acknowledgement comes with the target's answer
            if entry.upstream == sender:
                self._outbox.counters["retransmissions_absorbed"] += 1
                self._copy_arrived(sender, message)
            return NOT_SENT
        if target == publications.address:
            plain = replace(message, filter=filter_, mode=MODE_IN_MESH, target=None)
            if custody.get(message.publication, filter_) is not None or publications.handled(plain) \
                    or not custody.reach_of(filter_):
                reliable.acknowledge(message, sender, custody.reach_of(filter_))  # has it, or subscribes no more
                return NOT_SENT
            refusal = reliable.pressure()
            if refusal is not None:
                self._outbox.drop(refusal)  # its sender sends it again
                return NOT_SENT
            taken = custody.open_repair(plain, sender, message.filter)
            publications.take_repair(plain, now)
            custody.settle(taken)
            return NOT_SENT
        refusal = reliable.pressure()
        if refusal is not None:
            self._outbox.drop(refusal)
            return NOT_SENT
        relay = custody.open(message, sender)
        routed = receivers.relay(message, announced, now)
        if routed is None or routed == NOT_SENT:
            custody.abandon(message.publication, message.filter)  # no way on: given back, its sender tries again
            self._outbox.drop("repair_no_route")
            return NOT_SENT
        custody.settle(relay)
        return routed

    def receive_run(self, batch: TopicReliableBatch, sender: Address, announced: Address, now: float) -> Routed:
        """A `tq` from neighbour `sender`: each publication as `receive` would take its `tm`, and the new ones
        routed on together (one decision, `tq` runs) once each has its entry open (rule 7e)."""
        reliable, _mesh, publications = self._parts
        custody = self.custody
        entries, seen = custody.entries, publications.seen
        origin = batch.origin
        seen_base = publications.streams.base(origin.host, origin.port, batch.epoch, batch.filter)  # once a run
        messages = batch.messages()
        fresh = seen.all_new([seen_base | message.seq for message in messages])
        if messages and fresh is not None and reliable.pressure() is None:
            # The common case, a run of publications all new here: taken together, as the loop below would take
            # them one by one (unless custody holds one of them already).
            opened = custody.open_run(messages, sender)
            if opened is not None:
                seen.take_new(fresh)
                return self._take_run(opened, sender, announced, now, NOT_SENT)
        taken: list[Entry] = []
        furthest = NOT_SENT
        refusal: str | None = None
        asked = False  # the pressure, asked again only after a copy handled before (it may send copies on)
        for message in messages:
            key = seen_base | message.seq
            if key not in seen and (message.publication, message.filter) not in entries:
                if not asked:
                    refusal, asked = reliable.pressure(), True
                if refusal is not None:
                    self._outbox.drop(refusal)  # a new copy, unacknowledged: its sender sends it again
                    continue
                seen.add(key)
                taken.append(custody.open(message, sender))
            else:  # a copy handled before: custody's rules for it, alone
                furthest = max(furthest, self.receive(message, sender, announced, now))
                asked = False
        return self._take_run(taken, sender, announced, now, furthest) if taken else furthest

    def _take_run(self, taken: list[Entry], sender: Address, announced: Address, now: float,
                  furthest: Routed) -> Routed:
        """Route the new publications of a run on together, their entries open, and settle those that owe nothing."""
        reliable, _mesh, publications = self._parts
        messages = [entry.message for entry in taken]
        reliable.remember_run(messages, sender, now)
        furthest = max(furthest, publications.take_run(messages, announced, now))
        self.custody.settle_all(taken)  # acknowledged now if it owes nothing
        return furthest

    def _failed_over_to_us(self, message: TopicMessage, entry: Entry | None, sender: Address, announced: Address,
                           now: float) -> Routed:
        """A mode 2 copy we handled before (we relayed it toward another member broker) comes back with us as
        its target: that broker failed over to us (rule 9). Not a duplicate: we serve the group now (or send
        it on), the injection joining the entry we still hold, and the sender has it acknowledged at once."""
        reliable, _, publications = self._parts
        relay = entry
        if relay is None:
            refusal = reliable.pressure()
            if refusal is not None:
                self._outbox.drop(refusal)
                return NOT_SENT
            relay = self.custody.open(message, sender)
        routed = publications.to_member(message, announced, now)
        self._copy_arrived(sender, message)
        if entry is None:
            self.custody.settle(relay)
        else:
            reliable.acknowledge(message, sender, self.custody.reach_of(message.filter))
        return routed

    def _copy_arrived(self, sender: Address, message: TopicMessage) -> None:
        """A neighbour sent us a (publication, filter) we had a copy out to it for: it has it."""
        reliable, _, _ = self._parts
        copy = reliable.copy_arrived(sender, message)
        if copy is not None and copy.owned:
            self.custody.copy_done(sender, message.publication, message.filter)

    def on_ack(self, ack: TopicAck, sender: Address) -> bool:
        """A `ta`: True when it acknowledged a copy we waited for (an echo: both directions work, rule 1)."""
        reliable, _, _ = self._parts
        copy = reliable.on_ack(ack, sender)
        if copy is None:
            return False
        if copy.owned:
            self.custody.copy_done(sender, ack.publication, ack.filter, self._reach(ack.reach))
        return True

    def on_acks(self, acks: TopicAcks, sender: Address) -> bool:
        """A `tk`: True when it acknowledged a copy we waited for."""
        reliable, _, _ = self._parts
        settled = reliable.on_acks(acks, sender)
        if not settled:
            return False
        copy_done = self.custody.copy_done
        origin, epoch, filter_ = acks.origin, acks.epoch, acks.filter
        reach = self._reach(acks.reach)
        for seq, copy in settled:
            if copy.owned:
                copy_done(sender, (origin, epoch, seq), filter_, reach)
        return True

    # ------------------------------------------------------------ what the parts hand back

    def track(self, messages: list[TopicMessage], transports: list[Address]) -> None:
        """QoS 1/2 copies sent now to `transports` (by the mesh, or replayed; a run at once, of one filter):
        retransmitted until acknowledged, and obligations of their custody entries when open.

        A copy for a mesh neighbour that is down (the mesh keeps it for it: it may come back) is no obligation on
        a filter the origin's end-to-end custody covers (rule 7f): the origin keeps the publication for the brokers
        beyond that neighbour and repairs it to them when they are back in reach, so this hop's custody ends with
        what it reached and the rest of the mesh is not held up by a part it cannot reach (a partition with
        subscribers on both sides). The copy is kept as an orphan all the same, sent when the neighbour comes back
        while it is still a mesh neighbour: a broker beyond it the origin does not know of yet gets it too."""
        reliable, _, _ = self._parts
        if messages and end_to_end(messages[0].filter):
            neighbours = self._neighbours
            down = [transport for transport in transports if not _up(neighbours, transport)]
            if down:
                reliable.track_all(messages, down, [False] * len(messages))
                self._outbox.counters["copies_left_to_origin"] += len(down) * len(messages)
                transports = [transport for transport in transports if transport not in down]
                if not transports:
                    return
        reliable.track_all(messages, transports, self.custody.copies_sent_all(messages, transports))

    def _keeps_orphan(self, message: TopicMessage, transport: Address) -> bool:
        """Is an orphan copy for a neighbour that is down kept for it? On a filter the origin follows end to end,
        while the neighbour is still a mesh neighbour of it (its membership has not expired): see `track`."""
        if message.mode != MODE_IN_MESH or not end_to_end(message.filter):
            return False
        _, mesh, _ = self._parts
        neighbour = self._neighbours.get(transport)
        announced = neighbour.announced.address if neighbour is not None and neighbour.announced is not None else None
        return announced is not None and mesh.is_mesh_neighbour(message.filter, announced)

    def route_again(self, message: TopicMessage, transport: Address, now: float) -> bool:
        """Reliable forwarding hands back a copy in custody whose next hop is down (out of its table): keep it for
        a mesh neighbour that still is one (True), else route the publication again from here (new copies,
        or held) and settle that copy (False)."""
        reliable, mesh, publications = self._parts
        if message.mode == MODE_REPAIR:
            return self._repair_again(message, transport, now)
        if message.mode == MODE_TO_MEMBER:  # toward a shared group's member broker: the next one, or here
            publications.to_member(message, None, now)
            if (transport, message.publication, message.filter) in reliable.unacked:
                return True
            self.custody.copy_done(transport, message.publication, message.filter)
            return False
        neighbour = self._neighbours.get(transport)
        announced = neighbour.announced.address if neighbour is not None and neighbour.announced is not None else None
        if message.mode == MODE_IN_MESH and announced is not None and mesh.is_mesh_neighbour(message.filter, announced):
            if end_to_end(message.filter):  # kept for it as an orphan, the origin keeping it for beyond: `track`
                self._outbox.counters["copies_left_to_origin"] += 1
                self.custody.copy_done(transport, message.publication, message.filter)
                reliable.track_all([message], [transport], [False])
            return True  # kept for it: it may come back
        mesh.route_again(message, now)
        if (transport, message.publication, message.filter) in reliable.unacked:
            return True  # routed to the same neighbour again: still its copy
        self.custody.copy_done(transport, message.publication, message.filter)
        return False

    def _repair_again(self, message: TopicMessage, transport: Address, now: float) -> bool:
        """A repair copy whose next hop is down: on by another way, or (none) given up here: at a relay given back
        unacknowledged, at the origin called back (the receivers part sends it again once the target is in reach)."""
        reliable, _, _ = self._parts
        receivers = self._receivers
        assert receivers is not None
        routed = receivers.relay(replace(message, hops=max(0, message.hops - 1)), None, now)
        if (transport, message.publication, message.filter) in reliable.unacked:
            return True  # routed to the same neighbour again: still its copy
        if routed is None or routed == NOT_SENT:
            entry = self.custody.abandon(message.publication, message.filter)
            if entry is not None:
                reliable.disown(entry.copies, message.publication, message.filter)
                if entry.upstream is None:
                    receivers.repair_called_back(message)
            return False
        self.custody.copy_done(transport, message.publication, message.filter)
        return False

    def give_back(self, message: TopicMessage) -> None:
        """A neighbour's QoS 1/2 publication we cannot keep (the hold is full, or its injection failed): given
        back unacknowledged and forgotten, so its sender's next retransmission is taken anew."""
        reliable, _, publications = self._parts
        entry = self.custody.abandon(message.publication, message.filter)
        publications.forget(message)
        if entry is not None:
            reliable.disown(entry.copies, message.publication, message.filter)

    # ------------------------------------------------------------ the embedder's broker

    def injection_done(self, publication: PublicationId) -> None:
        self.custody.injection_done(publication)

    def injection_failed(self, publication: PublicationId) -> None:
        _, _, publications = self._parts
        publications.forget_injection(publication)
        entry = self.custody.injecting.get(publication)
        if entry is not None:
            self.give_back(entry.message)
            self._outbox.counters["injections_failed"] += 1
