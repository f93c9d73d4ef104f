"""Keeping the federation table current: records in and out, routes, management core, ids.

Theory of operation
-------------------
Every node holds a copy of the federation table (`federation.protocol.linkstate`):
one link-state record per broker, listing its up neighbours. This part
keeps that copy (`lsdb`) current and derives from it what the rest of the
node reads (`routes`, `management_core`; the others read them through
`context.TableView`); the exchange that brings a new or forgetful neighbour
up to date is `federation.protocol.database_sync`.

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

*What the node does with it*: a route computation returns a `RouteChange`
(members added and removed, whether next hops moved); the node tells the
mesh and the database exchange, then has the table settle what follows
from it here (`resolve_collisions`, `elect_management_core`). A new vid
(`resolve_collisions`, `on_reconsider` return True) means our topic cores
must be announced again under it, which the node asks of the mesh.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from federation.protocol import events, wire
from federation.protocol.context import Identity, NeighboursView, Outbox
from federation.protocol.dedup import SeenCache
from federation.protocol.events import addresses_text, id_text
from federation.protocol.linkstate import LinkStateDatabase, Routes
from federation.protocol.neighbours import Neighbour
from federation.protocol.stored_records import MakeStored, StoredRecord, stored_record
from federation.protocol.types import Address, BrokerId
from federation.protocol.wire_types import CoreAnnouncement, Federate, LinkStateRecord, Reconsider

VID_RANGE = 2**31


@dataclass(frozen=True, slots=True)
class RouteChange:
    """What a route computation changed, for the node to tell the other parts."""

    added: frozenset[Address]
    """members now reachable that were not"""
    removed: frozenset[Address]
    """members no longer reachable"""
    moved: bool
    """next hops, members or ids changed: any topic's parents may have moved"""
    member_ids: bool = True
    """the id of a member that stays a member may have changed (the management core must be found again among
    all members; otherwise only the members added can be lower than it)"""
    changed: frozenset[Address] = frozenset()
    """the addresses whose next hops, reachability or id changed: the topics whose cores they are may change"""


class FederationTable:
    """Our copy of the federation table, the routes and the management core derived from it."""

    def __init__(self, identity: Identity, neighbours: NeighboursView, outbox: Outbox, rng: random.Random,
                 make_stored: MakeStored = stored_record) -> None:
        self._identity = identity
        self._settings = identity.settings
        self._neighbours = neighbours
        self._outbox = outbox
        self._rng = rng
        address = identity.address
        self.lsdb = LinkStateDatabase(address, self._settings.max_nodes, make_stored)
        self.routes = Routes(frozenset([address]), {address: 0}, {}, {})
        self.management_core = identity.broker_id
        self._elected_as = identity.broker_id
        """our id when the management core was last elected (a new one of ours means electing from scratch)"""
        self.own_seq = 0
        self.core_seq = 0
        self.changes = 0
        """counts table changes, for caches of what is derived from the table"""
        self.stored_origins: set[Address] = set()
        """the origins of the newer records stored since the node last took them (`take_stored_origins`)"""
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

    @property
    def stale(self) -> bool:
        """An origination or a route computation is pending."""
        return self.origination_due is not None or self.routes_dirty

    def originate_pending(self, now: float) -> None:
        """Originate now if an origination is pending, due or not."""
        if self.origination_due is not None:
            self.originate(now)

    def originate_if_due(self, now: float) -> None:
        if self.origination_due is not None and now >= self.origination_due:
            self.originate(now)

    def run_due(self, now: float) -> None:
        """After an input: the origination and the floods whose time has come (routes: `recompute_routes`)."""
        self.originate_if_due(now)
        if self.flood_due is not None and now >= self.flood_due:
            self.flush_floods()

    # ------------------------------------------------------------ our own record

    def trigger_origination(self, now: float) -> None:
        due = max(now, self.last_origination + self._settings.min_announce_gap)
        if self.origination_due is None or due < self.origination_due:
            self.origination_due = due

    def originate(self, now: float) -> None:
        identity = self._identity
        self.own_seq += 1
        neighbours = tuple(sorted(n.announced.address for n in self._neighbours.up() if n.announced is not None))
        record = LinkStateRecord(identity.broker_id, identity.epoch, self.own_seq, 0, 0, neighbours)
        self.lsdb.store_own(record, now)
        self._outbox.send_up(wire.FEDERATE, Federate(record), exclude=None)
        self.last_origination = now
        self.origination_due = None
        self.changed(now)

    def announce_leaving(self) -> None:
        """On a clean shutdown: tell the neighbours we leave (a record with the leaving flag)."""
        identity = self._identity
        self.own_seq += 1
        record = LinkStateRecord(identity.broker_id, identity.epoch, self.own_seq, 0, wire.FLAG_LEAVING, ())
        self._outbox.send_up(wire.FEDERATE, Federate(record), exclude=None)

    def on_own_record(self, record: LinkStateRecord, source: Address, now: float) -> None:
        """A record of ours from an earlier life that is newer than our counters: jump past it, within the
        ranges (docs/protocol.md, "Ranges"): the same epoch takes its seq, unless no seq is left after it; then,
        as for a newer epoch, the epoch after the record's, unless that is beyond MAX_JUMP_EPOCH (the rest of
        the range is for restarts): then the record is refused (`own_epoch_exhausted`), never adopted. Only a
        forgery carries such a record (a life of ours cannot have counted that far). `source`: the neighbour it
        came from."""
        identity = self._identity
        if record.freshness <= (identity.epoch, self.own_seq):
            return
        if record.epoch == identity.epoch and record.seq < wire.MAX_SEQ:
            self.own_seq = record.seq
        elif record.epoch < wire.MAX_JUMP_EPOCH:
            previous = identity.epoch
            identity.jump_epoch(record.epoch + 1)
            self.own_seq = 0
            self._outbox.emit(events.EPOCH_CHANGED, now, epoch=identity.epoch, previous=previous,
                              reason="older life announced a newer epoch")
        else:
            self._outbox.drop("own_epoch_exhausted", event=events.PACKET_DROPPED, now=now,
                              reason="own_epoch_exhausted", detail=f"a record of our address with epoch "
                              f"{record.epoch} seq {record.seq}: no epoch to jump to within the range "
                              f"(at most {wire.MAX_JUMP_EPOCH}); a forgery", source=str(source), size=0)
            return
        self.trigger_origination(now)

    # ------------------------------------------------------------ flooding (`fd`, `tu`)

    def changed(self, now: float) -> None:
        """The table changed: if that moves any route, schedule the route computation."""
        self.changes += 1
        if not self.routes_dirty and self.lsdb.routes_affected(self.routes):
            self.routes_dirty = True
            self.spf_due = max(now + self._settings.spf_delay, self.last_spf + self._settings.spf_hold)

    def on_records(self, records: list[LinkStateRecord], neighbour: Neighbour, bundle: bool, now: float) -> None:
        address = self._identity.address
        forward: list[StoredRecord] = []
        for record in records:
            if record.origin.address == address:
                self.on_own_record(record, neighbour.transport, now)
                continue
            outcome = self.lsdb.accept(record, 1, now)
            if outcome in ("old", "shorter"):
                # Only newer records are forwarded; a shorter path changes nothing we compute. A copy of
                # a record waiting to be forwarded tells us this neighbour needs no copy from us.
                queued = self.flood_queue.get(record.origin.address)
                if queued is not None and queued[0].record.freshness == record.freshness:
                    queued[1].add(neighbour.transport)
                continue
            self.changed(now)
            self.stored_origins.add(record.origin.address)
            stored = self.lsdb.records[record.origin.address]
            if self._settings.flood_delay > 0:
                self.flood_queue[record.origin.address] = (stored, {neighbour.transport})
                if self.flood_due is None:
                    self.flood_due = now + self._settings.flood_delay
            else:
                forward.append(stored)
        if not forward:
            return
        others = [n.transport for n in self._neighbours.up() if n.transport != neighbour.transport]
        if bundle:
            self._outbox.send_records(forward, others)
        else:
            self._outbox.send(wire.FEDERATE, Federate(forward[0].record), others)

    def take_stored_origins(self) -> set[Address]:
        """The origins of the records stored since the last call (the node tells the mesh)."""
        origins, self.stored_origins = self.stored_origins, set()
        return origins

    def flush_floods(self) -> None:
        """Forward the records that waited `flood_delay`: one `fd` or `tu` bundle per group of neighbours
        that need the same records (not to those that sent us a copy)."""
        queue, self.flood_queue = self.flood_queue, {}
        self.flood_due = None
        groups: dict[tuple[Address, ...], list[Address]] = {}
        for neighbour in self._neighbours.up():
            wanted = tuple(origin for origin, (_, have) in sorted(queue.items()) if neighbour.transport not in have)
            if wanted:
                groups.setdefault(wanted, []).append(neighbour.transport)
        for origins, transports in groups.items():
            records = [queue[origin][0] for origin in origins]
            if len(records) == 1:
                self._outbox.send(wire.FEDERATE, Federate(records[0].record), transports)
            else:
                self._outbox.send_records(records, transports)

    # ------------------------------------------------------------ routes

    def recompute_routes(self, now: float, pending: bool = False) -> RouteChange | None:
        """Compute the routes if the computation is due (with `pending`: if one is pending at all, for
        decisions that need current routes); None when nothing was computed. What the change means to the
        rest of the node, the node says; then it calls `resolve_collisions` and `elect_management_core`."""
        if not self.routes_dirty or not (pending or (self.spf_due is not None and now >= self.spf_due)):
            return None
        self.routes_dirty = False
        self.spf_due = None
        self.last_spf = now
        previous = self.routes
        routes = self.routes = self.lsdb.compute_routes(previous)
        added: frozenset[Address]
        removed: frozenset[Address]
        if routes.members is previous.members:
            added = removed = frozenset()
        else:
            added = routes.members - previous.members
            removed = previous.members - routes.members
        if added or removed:
            self._outbox.view_changed()
            self._outbox.emit(events.TABLE_CHANGED, now, added=addresses_text(added), removed=addresses_text(removed),
                              size=len(routes.members))
        ids_changed = previous.ids is not routes.ids and previous.ids != routes.ids
        moved = bool(previous.next_hops != routes.next_hops or added or removed or ids_changed)
        changed: set[Address] = set(added | removed)
        if moved:
            old_hops, new_hops = previous.next_hops, routes.next_hops
            changed.update(a for a in old_hops.keys() | new_hops.keys() if old_hops.get(a) != new_hops.get(a))
            if ids_changed:
                changed.update(a for a in previous.ids.keys() | routes.ids.keys()
                               if previous.ids.get(a) != routes.ids.get(a))
        return RouteChange(added, removed, moved, ids_changed and self.lsdb.member_ids_changed, frozenset(changed))

    def elect_management_core(self, change: RouteChange, now: float) -> None:
        """After a route computation: the lowest id among the reachable members is the management core; as
        management core, announce it, and flood the records that changed membership."""
        identity = self._identity
        routes = self.routes
        if change.removed or change.member_ids or self._elected_as != identity.broker_id:
            # Every member has a record (links exist only between stored records), hence an id.
            core = min(identity.broker_id, min(map(routes.ids.__getitem__, routes.members - {identity.address}),
                                               default=identity.broker_id))
        else:  # members only joined, ids unchanged: the lowest is the one we had or a newcomer
            core = min(self.management_core, min(map(routes.ids.__getitem__, change.added),
                                                 default=self.management_core))
        self._elected_as = identity.broker_id
        if core != self.management_core:
            previous_core = self.management_core
            self.management_core = core
            self._outbox.view_changed()
            self._outbox.emit(events.MANAGEMENT_CORE_CHANGED, now, core=id_text(core), previous=id_text(previous_core))
            if core == identity.broker_id:
                self.announce_management_core()
        if self.management_core == identity.broker_id and (change.added or change.removed):
            self.flood_membership_change(change.added, change.removed)

    def flood_membership_change(self, added: frozenset[Address], removed: frozenset[Address]) -> None:
        """As management core, tell everyone at once which records changed membership."""
        records = self.lsdb.records
        touched = set(added)
        for gone in removed:
            stored = records.get(gone)
            if stored is not None:
                touched.update(a for a in stored.record.neighbours if a in self.routes.members)
        touched.add(self._identity.address)
        self._outbox.send_records([records[a] for a in sorted(touched) if a in records],
                                  [n.transport for n in self._neighbours.up()])

    # ------------------------------------------------------------ id collisions (`rc`)

    def resolve_collisions(self, now: float) -> bool:
        """After a route computation: reachable members that share our vid. The lowest address keeps it and
        tells the others (`rc`); returns True when we took a new vid (our topic cores must announce it)."""
        identity = self._identity
        routes = self.routes
        same = sorted(a for a in self.lsdb.origins_with_vid(identity.vid)
                      if a != identity.address and a in routes.members
                      and routes.ids.get(a, identity.broker_id).vid == identity.vid)
        if not same:
            return False
        if same[0] < identity.address:
            self.change_vid(now, reason=f"collision with {same[0]}")
            return True
        for other in same:
            self.send_reconsider(Reconsider(BrokerId(identity.vid, other), identity.broker_id))
        return False

    def send_reconsider(self, message: Reconsider) -> None:
        hops = self.routes.next_hops.get(message.target.address)
        if not hops:
            return
        transport = self._neighbours.transport_for(min(hops))
        if transport is not None:
            self._outbox.send(wire.RECONSIDER, message, [transport])

    def on_reconsider(self, message: Reconsider, now: float) -> bool:
        """An `rc`: forwarded toward its target; when we are the target, we take a new vid (returns True)."""
        identity = self._identity
        if not self.reconsiders_seen.add((message.target, message.holder)):
            return False
        if message.target.address != identity.address:
            self.send_reconsider(message)
            return False
        if message.target.vid == identity.vid and message.holder.vid == identity.vid and \
                message.holder.address < identity.address:
            self.change_vid(now, reason=f"reconsider from {message.holder.address}")
            return True
        return False

    def change_vid(self, now: float, reason: str) -> None:
        """Draw a vid no reachable member has, and announce our record under it."""
        identity = self._identity
        taken = {broker_id.vid for broker_id in self.routes.ids.values()}
        previous = identity.vid
        vid = previous
        while vid in taken:
            vid = self._rng.randrange(VID_RANGE)
        identity.renumber(vid)
        self._outbox.emit(events.ID_CHANGED, now, vid=vid, previous=previous, reason=reason)
        self._outbox.view_changed()
        self.originate(now)
        self.management_core = min(self.management_core, identity.broker_id)

    # ------------------------------------------------------------ management core (`ca`)

    def announce_management_core(self) -> None:
        identity = self._identity
        self.core_seq += 1
        self._outbox.send_up(wire.CORE_ANNOUNCEMENT,
                             CoreAnnouncement(identity.broker_id, identity.epoch, self.core_seq, 0), exclude=None)

    def on_core_announcement(self, message: CoreAnnouncement, sender: Address, now: float) -> None:
        """`ca` is advisory: everyone computes the core from the table; this confirms it is alive."""
        held = self.core_announcements.get(message.core.address)
        distance = wire.further(message.distance)
        fresh = (message.epoch, message.seq)
        if held is not None and (fresh < held[:2] or (fresh == held[:2] and distance >= held[2])):
            return
        if held is None and len(self.core_announcements) >= self._settings.max_nodes:
            self._outbox.drop("core_announcements_full")
            return
        self.core_announcements[message.core.address] = (message.epoch, message.seq, distance, now)
        self._outbox.send_up(wire.CORE_ANNOUNCEMENT,
                             CoreAnnouncement(message.core, message.epoch, message.seq, distance), exclude=sender)

    def periodic(self, now: float) -> None:
        """Every announce interval: management-core refresh and expiry of records and announcements.
        Our own record is not re-flooded: it is originated only when our neighbours change."""
        if self.management_core == self._identity.broker_id:
            self.announce_management_core()
        lifetime = self._settings.announcement_lifetime
        if self.lsdb.expire(lifetime, self.routes.members, now):
            self.changed(now)
        for address, held in list(self.core_announcements.items()):
            if now - held[3] > lifetime:
                del self.core_announcements[address]
