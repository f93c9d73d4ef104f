"""Keeping the federation table current: records in and out, routes, management core, ids.

Theory of operation
-------------------
Every node holds a copy of the federation table (`federation.protocol.linkstate`):
one link-state record per broker, listing its up neighbours. This module
keeps that copy current and derives from it what the rest of the node reads
(`node.routes`, `node.management_core`); the exchange that brings a new or
forgetful neighbour up to date is `federation.protocol.database_sync`.

*Origination*: our own record is originated when our set of up neighbours
changes, at most once per `min_announce_gap`, so neighbours that come up
together share one record.

*Flooding*: a newer record from a neighbour is stored and forwarded to our
other up neighbours, after `flood_delay`: what arrives in that time leaves
together, one `fd` or `tu` bundle per group of neighbours needing the same
records, and a neighbour that sent us a copy meanwhile gets none back. Only
newer records travel, so a flood ends.

*Route computation* is debounced, as OSPF's SPF delay: a table change that
can move a route schedules one breadth-first search `spf_delay` later (and
at least `spf_hold` after the previous one), so a burst of records costs one
computation, not one per record.

*Management core and ids* follow from the routes: the lowest BrokerId among
the reachable members is the management core (it announces itself with
`ca`, advisory only, and floods the records that changed membership). When
reachable members share a virtual id, the lowest address keeps it and tells
the others (`rc`, forwarded along the routes) to draw a new one from the
node's RNG.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from federation.protocol import events, wire
from federation.protocol.dedup import SeenCache
from federation.protocol.events import addresses_text, id_text
from federation.protocol.linkstate import Routes, StoredRecord
from federation.protocol.neighbours import Neighbour
from federation.protocol.types import Address, BrokerId
from federation.protocol.wire import CoreAnnouncement, Federate, LinkStateRecord, Reconsider

if TYPE_CHECKING:
    from federation.protocol.node import Node

VID_RANGE = 2**31


class FederationTable:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.own_seq = 0
        self.core_seq = 0
        self.changes = 0
        """counts table changes, for caches of what is derived from the table"""
        self.last_origination = float("-inf")
        self.origination_due: float | None = None
        self.flood_queue: dict[Address, tuple[StoredRecord, set[Address]]] = {}
        """origin -> (record to forward, transports of the neighbours that have it already)"""
        self.flood_due: float | None = None
        self.routes_dirty = False
        self.spf_due: float | None = None
        """when the pending route computation runs (None: routes are current)"""
        self.last_spf = float("-inf")
        self.core_announcements: dict[Address, tuple[int, int, int, float]] = {}
        """management core -> (epoch, seq, distance, when heard) of its latest `ca`"""
        self.reconsiders_seen = SeenCache(1024)
        """(target, holder) of the `rc` handled already"""

    def next_deadlines(self) -> list[float]:
        return [due for due in (self.origination_due, self.spf_due, self.flood_due) if due is not None]

    def settle(self, now: float, about_to_claim: Callable[[float], bool]) -> None:
        """Run what is due after an input: origination, flooding, route computation."""
        pending = self.origination_due is not None or self.routes_dirty
        if pending and about_to_claim(now):
            # Never claim a topic core on a stale table: the live core we have just been told about
            # may become reachable once our own record lists our new neighbours and routes are computed.
            if self.origination_due is not None:
                self.originate(now)
            if self.routes_dirty:
                self.recompute_routes(now)
        if self.origination_due is not None and now >= self.origination_due:
            self.originate(now)
        if self.flood_due is not None and now >= self.flood_due:
            self.flush_floods()
        if self.routes_dirty and self.spf_due is not None and now >= self.spf_due:
            self.recompute_routes(now)

    # ------------------------------------------------------------ our own record

    def trigger_origination(self, now: float) -> None:
        due = max(now, self.last_origination + self.node.settings.min_announce_gap)
        if self.origination_due is None or due < self.origination_due:
            self.origination_due = due

    def originate(self, now: float) -> None:
        node = self.node
        self.own_seq += 1
        neighbours = tuple(sorted(n.announced.address for n in node.neighbours.up() if n.announced is not None))
        record = LinkStateRecord(node.broker_id, node.epoch, self.own_seq, 0, 0, neighbours)
        node.lsdb.store_own(record, now)
        node.send_up(wire.FEDERATE, Federate(record), exclude=None)
        self.last_origination = now
        self.origination_due = None
        self.changed(now)

    def on_own_record(self, record: LinkStateRecord, now: float) -> None:
        """A record of ours from an earlier life that is newer than our counters: jump past it."""
        node = self.node
        if record.freshness <= (node.epoch, self.own_seq):
            return
        if record.epoch > node.epoch:
            previous = node.epoch
            node.epoch = record.epoch + 1
            self.own_seq = 0
            node.publication_seq = 0
            node.emit(events.EPOCH_CHANGED, now, epoch=node.epoch, previous=previous,
                      reason="older life announced a newer epoch")
        else:
            self.own_seq = record.seq
        self.trigger_origination(now)

    # ------------------------------------------------------------ flooding (`fd`, `tu`)

    def changed(self, now: float) -> None:
        """The table changed: if that moves any route, schedule the route computation."""
        node = self.node
        self.changes += 1
        if not self.routes_dirty and node.lsdb.routes_affected(node.routes):
            self.routes_dirty = True
            self.spf_due = max(now + node.settings.spf_delay, self.last_spf + node.settings.spf_hold)

    def on_records(self, records: list[LinkStateRecord], neighbour: Neighbour, bundle: bool, now: float) -> None:
        node = self.node
        forward: list[StoredRecord] = []
        for record in records:
            if record.origin.address == node.address:
                self.on_own_record(record, now)
                continue
            outcome = node.lsdb.accept(record, 1, now)
            if outcome in ("old", "shorter"):
                # Only newer records are forwarded; a shorter path changes nothing we compute. A copy of
                # a record waiting to be forwarded tells us this neighbour needs no copy from us.
                queued = self.flood_queue.get(record.origin.address)
                if queued is not None and queued[0].record.freshness == record.freshness:
                    queued[1].add(neighbour.transport)
                continue
            self.changed(now)
            stored = node.lsdb.records[record.origin.address]
            if node.settings.flood_delay > 0:
                self.flood_queue[record.origin.address] = (stored, {neighbour.transport})
                if self.flood_due is None:
                    self.flood_due = now + node.settings.flood_delay
            else:
                forward.append(stored)
        if not forward:
            return
        others = [n.transport for n in node.neighbours.up() if n.transport != neighbour.transport]
        if bundle:
            node.send_records(forward, others)
        else:
            node.send(wire.FEDERATE, Federate(forward[0].record), others)

    def flush_floods(self) -> None:
        """Forward the records that waited `flood_delay`: one `fd` or `tu` bundle per group of neighbours
        that need the same records (not to those that sent us a copy)."""
        node = self.node
        queue, self.flood_queue = self.flood_queue, {}
        self.flood_due = None
        groups: dict[tuple[Address, ...], list[Address]] = {}
        for neighbour in node.neighbours.up():
            wanted = tuple(origin for origin, (_, have) in sorted(queue.items()) if neighbour.transport not in have)
            if wanted:
                groups.setdefault(wanted, []).append(neighbour.transport)
        for origins, transports in groups.items():
            records = [queue[origin][0] for origin in origins]
            if len(records) == 1:
                node.send(wire.FEDERATE, Federate(records[0].record), transports)
            else:
                node.send_records(records, transports)

    # ------------------------------------------------------------ routes

    def compute_pending_routes(self, now: float) -> None:
        """Compute the routes now if a computation is pending (for decisions that need current routes)."""
        if self.routes_dirty:
            self.recompute_routes(now)

    def recompute_routes(self, now: float) -> None:
        node = self.node
        self.routes_dirty = False
        self.spf_due = None
        self.last_spf = now
        previous = node.routes
        node.routes = node.lsdb.compute_routes(previous)
        added = node.routes.members - previous.members
        removed = previous.members - node.routes.members
        if added or removed:
            node.bump_version()
            node.emit(events.TABLE_CHANGED, now, added=addresses_text(added), removed=addresses_text(removed),
                      size=len(node.routes.members))
        if previous.next_hops != node.routes.next_hops or added or removed or previous.ids != node.routes.ids:
            node.mesh.mark_all_dirty()
        node.sync.members_added(added)
        self.check_collisions(now)
        # Every member has a record (links exist only between stored records), hence an id.
        core = min(node.broker_id, min(map(node.routes.ids.__getitem__, node.routes.members - {node.address}),
                                       default=node.broker_id))
        if core != node.management_core:
            previous_core = node.management_core
            node.management_core = core
            node.bump_version()
            node.emit(events.MANAGEMENT_CORE_CHANGED, now, core=id_text(core), previous=id_text(previous_core))
            if core == node.broker_id:
                self.announce_management_core()
        if node.management_core == node.broker_id and (added or removed):
            self.flood_membership_change(added, removed, previous)

    def flood_membership_change(self, added: frozenset[Address], removed: frozenset[Address],
                                previous: Routes) -> None:
        """As management core, tell everyone at once which records changed membership."""
        node = self.node
        touched = set(added)
        for gone in removed:
            stored = node.lsdb.records.get(gone)
            if stored is not None:
                touched.update(a for a in stored.record.neighbours if a in node.routes.members)
        touched.add(node.address)
        records = [node.lsdb.records[a] for a in sorted(touched) if a in node.lsdb.records]
        node.send_records(records, [n.transport for n in node.neighbours.up()])

    # ------------------------------------------------------------ id collisions (`rc`)

    def check_collisions(self, now: float) -> None:
        node = self.node
        same = sorted(a for a in node.lsdb.by_vid.get(node.vid, ())
                      if a != node.address and a in node.routes.members and node.routes.ids.get(a, node.broker_id).vid
                      == node.vid)
        if not same:
            return
        if same[0] < node.address:
            self.change_vid(now, reason=f"collision with {same[0]}")
            return
        for other in same:
            self.send_reconsider(Reconsider(BrokerId(node.vid, other), node.broker_id))

    def send_reconsider(self, message: Reconsider) -> None:
        node = self.node
        hops = node.routes.next_hops.get(message.target.address)
        if not hops:
            return
        transport = node.neighbours.transport_for(min(hops))
        if transport is not None:
            node.send(wire.RECONSIDER, message, [transport])

    def on_reconsider(self, message: Reconsider, now: float) -> None:
        node = self.node
        if not self.reconsiders_seen.add((message.target, message.holder)):
            return
        if message.target.address != node.address:
            self.send_reconsider(message)
            return
        if message.target.vid == node.vid and message.holder.vid == node.vid and message.holder.address < node.address:
            self.change_vid(now, reason=f"reconsider from {message.holder.address}")

    def change_vid(self, now: float, reason: str) -> None:
        node = self.node
        taken = {broker_id.vid for broker_id in node.routes.ids.values()}
        previous = node.vid
        while node.vid in taken:
            node.vid = node.rng.randrange(VID_RANGE)
        node.emit(events.ID_CHANGED, now, vid=node.vid, previous=previous, reason=reason)
        node.bump_version()
        self.originate(now)
        for state in node.mesh.topics.values():
            if state.core is not None and state.core.address == node.address:
                state.core = node.broker_id
                node.mesh.announce(state, now)
                state.core_seq = state.own_seq
        node.management_core = min(node.management_core, node.broker_id)

    # ------------------------------------------------------------ management core (`ca`)

    def announce_management_core(self) -> None:
        node = self.node
        self.core_seq += 1
        node.send_up(wire.CORE_ANNOUNCEMENT, CoreAnnouncement(node.broker_id, node.epoch, self.core_seq, 0),
                     exclude=None)

    def on_core_announcement(self, message: CoreAnnouncement, sender: Address, now: float) -> None:
        """`ca` is advisory: everyone computes the core from the table; this confirms it is alive."""
        node = self.node
        held = self.core_announcements.get(message.core.address)
        distance = message.distance + 1
        fresh = (message.epoch, message.seq)
        if held is not None and (fresh < held[:2] or (fresh == held[:2] and distance >= held[2])):
            return
        if held is None and len(self.core_announcements) >= node.settings.max_nodes:
            node.drops["core_announcements_full"] += 1
            return
        self.core_announcements[message.core.address] = (message.epoch, message.seq, distance, now)
        node.send_up(wire.CORE_ANNOUNCEMENT, CoreAnnouncement(message.core, message.epoch, message.seq, distance),
                     exclude=sender)

    def periodic(self, now: float) -> None:
        """Every announce interval: management-core refresh and expiry of records and announcements.
        Our own record is not re-flooded: it is originated only when our neighbours change."""
        node = self.node
        if node.management_core == node.broker_id:
            self.announce_management_core()
        lifetime = node.settings.announcement_lifetime
        if node.lsdb.expire(lifetime, node.routes.members, now):
            self.changed(now)
        for address, held in list(self.core_announcements.items()):
            if now - held[3] > lifetime:
                del self.core_announcements[address]
