"""The federation table: every node's latest announcement, the routes they give, and its digest.

Each node floods one link-state record (`fd`): its id, boot epoch, sequence
number and the neighbours it currently hears. A link counts only when both
ends list each other, so a one-way or stale claim never creates a route, and
a node that dies disappears as soon as its neighbours re-announce without it
(no count-to-infinity, no waiting for expiry). Shortest paths by hop count
give, per reachable node, the distance and every first hop on a shortest
path (the "next hops"; several when paths are redundant).

Flood suppression follows the protocol: a record is taken and forwarded only
when its (epoch, seq) is newer than the one held. Records are re-originated
only when something changed; what repairs a lost update is anti-entropy
between direct neighbours: every announce interval each node sends its
neighbours a constant-size *digest* of the records of its reachable members
(16 buckets, each the XOR of 64-bit hashes of (address, epoch, seq)), and a
neighbour whose digest differs answers with a summary of the differing
buckets, from which the other side requests what it misses. Steady-state
cost per node is therefore independent of the federation's size.

Unreachable records are kept until they expire (a record's clock restarts
whenever it is received or found reachable), so a partition that heals
quickly needs no full re-learning.

The confirmed (two-way) links are kept as an adjacency map, updated per
record, so a route computation walks only real links, and a change can be
judged before any computation: a link appearing or vanishing between two
unreachable nodes, or between two nodes at the same distance, moves no
route (shortest paths only ever go one hop further at a time), so it needs
no breadth-first search at all. When links have only appeared since the
last computation (a cold start, a partition healing), distances can only
shrink, so the routes are updated from the previous ones, starting at the
nodes the new links bring closer; a link gone (or a record expired) means a
full search.

A full table makes room for a new record by evicting the foreign record
received longest ago (the lowest (received_at, address)). Under a flood of
fake records that happens once per record, so it must not scan the table:
a min-heap of (received_at, address) finds it with lazy updates. An entry's
time is never later than its record's (clocks only grow, and a record whose
time moves back gets a new entry), so the heap's minimum is a lower bound:
an entry found on top with an older time than its record's is pushed again
with the current one, an entry of a record gone is dropped, and the first
entry that matches its record is the oldest. Refreshing a record costs
nothing then; each refresh costs at most one re-push later; the heap is
rebuilt when its stale entries outnumber the records. The heap is built only
when the table first fills up: a table below `capacity` never evicts, so it
keeps no heap (and pays nothing for it).

*Storage* (federation.protocol.stored_records): what a node stores per
record is an immutable `StoredRecord`, which a `RecordPool` shares among
the simulator's nodes; the node's own clock for it (`received_at`) lives
in a dict beside it. The confirmed links are not stored either: a record's
peers are confirmed by looking up the peer's record (`peers`), which is
what a stored copy of them would say, without a set per member. The digest
of the reachable records is kept up to date as records and routes change,
so a neighbour's `dd` costs nothing to compare.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from federation.protocol.stored_records import MakeStored, StoredRecord, stored_record
from federation.protocol.types import Address, BrokerId
from federation.protocol.wire import (
    DIGEST_BUCKETS,
    MAX_DISTANCE,
    LinkStateRecord,
    SummaryEntry,
)


@dataclass(frozen=True)
class Routes:
    members: frozenset[Address]
    """reachable nodes, this node included"""
    distance: dict[Address, int]
    next_hops: dict[Address, frozenset[Address]]
    """destination -> neighbours (announced addresses) on a shortest path to it"""
    ids: dict[Address, BrokerId]
    """origin -> BrokerId of every record held when the routes were computed (never changed after: the table
    makes a new dict when an id changes)"""


Digest = tuple[int, tuple[int, ...]]
"""(entries, DIGEST_BUCKETS bucket hashes)"""


class LinkStateDatabase:
    def __init__(self, own: Address, capacity: int, make_stored: MakeStored = stored_record) -> None:
        self.own = own
        self.capacity = capacity
        self._make_stored = make_stored
        self.records: dict[Address, StoredRecord] = {}
        self.received_at: dict[Address, float] = {}
        """origin -> when its record was last received or found reachable (its expiry clock)"""
        self.refused = 0
        self.changed_links: list[tuple[Address, Address, bool]] = []
        """(a, b, confirmed) for links confirmed (True) or broken (False) since routes were last computed,
        less those `routes_affected` found irrelevant"""
        self.changed_ids: list[Address] = []
        """origins whose BrokerId changed (or appeared, or went) since the last `routes_affected`"""
        self.ids: dict[Address, BrokerId] = {}
        """origin -> the BrokerId its record announces (replaced, not changed, once routes were given it)"""
        self._ids_given = False
        """`ids` was handed to a `Routes`: copy it before changing it"""
        self._own_vid: int | None = None
        """the vid our own stored record announces"""
        self._same_vid: set[Address] = set()
        """the other origins whose records announce our vid (the collision check asks for them)"""
        self._ages: list[tuple[float, Address]] | None = None
        """(received_at, origin) of the foreign records, a min-heap with lazy updates (see the module's text);
        None until the table first needs to evict"""
        self.eviction_steps = 0
        """heap entries looked at to find whom to evict (a count of work, for tests)"""
        self._reachable: frozenset[Address] = frozenset()
        """the members of the routes computed last, whose records the kept digest covers"""
        self._digest_count = 0
        self._digest_buckets = [0] * DIGEST_BUCKETS
        self._hop_sets: dict[frozenset[Address], frozenset[Address]] = {}
        """the distinct next-hop sets of the routes (`_hop_set`)"""
        self.member_ids_changed = True
        """the last `compute_routes` saw the record of a member it reaches appear, change its id or go"""

    def accept(self, record: LinkStateRecord, hops_travelled: int, now: float) -> str:
        """Store a received record. Returns "new" (newer: forward; routes may change), "refresh"
        (newer but the same links: forward, routes unchanged), "shorter" (same freshness, shorter
        distance: kept, not forwarded) or "old" (ignore)."""
        address = record.origin.address
        distance = record.distance + hops_travelled
        if distance > MAX_DISTANCE:
            distance = MAX_DISTANCE
        held = self.records.get(address)
        if held is None:
            if len(self.records) >= self.capacity and not self._evict_one():
                self.refused += 1
                return "old"
        else:
            current = held.record
            if record.seq != current.seq or record.epoch != current.epoch:
                if (record.epoch, record.seq) < (current.epoch, current.seq):
                    return "old"
            else:  # the version we hold
                self._touch(address, now)
                if distance < current.distance:
                    self.records[address] = self._make_stored(current, distance)  # nothing else depends on it
                    return "shorter"
                return "old"
        self._store(self._make_stored(record, distance), held, now)
        if held is not None and _same_links(held.record, record):
            return "refresh"  # a re-announcement with the same links: forward it, routes are unchanged
        return "new"

    def store_own(self, record: LinkStateRecord, now: float) -> None:
        self._store(self._make_stored(record, record.distance), self.records.get(record.origin.address), now)

    def _store(self, stored: StoredRecord, held: StoredRecord | None, now: float) -> None:
        address = stored.record.origin.address
        self.records[address] = stored
        if address in self._reachable:
            if held is not None:
                self._digest_remove(held)
            self._digest_add(stored)
        received_at = self.received_at
        previous_time = received_at.get(address)
        received_at[address] = now
        if address != self.own and self._ages is not None and (previous_time is None or now < previous_time):
            self._push_age(now, address)
        if held is None or held.record.origin != stored.record.origin:
            self.changed_ids.append(address)
            ids = self._own_ids()
            ids[address] = stored.record.origin
            self._index_vid(address, held, stored)
        records = self.records
        before = held.listed if held is not None else frozenset()
        after = stored.listed
        if before == after:
            return
        changed = self.changed_links
        for peer in before - after:
            other = records.get(peer)
            if other is not None and address in other.listed and peer != address:
                changed.append((address, peer, False))
        for peer in after - before:
            other = records.get(peer)
            if other is not None and address in other.listed and peer != address:  # never a link to itself
                changed.append((address, peer, True))

    def _own_ids(self) -> dict[Address, BrokerId]:
        """`ids`, ready to change (a copy if routes hold it)."""
        if self._ids_given:
            self.ids = dict(self.ids)
            self._ids_given = False
        return self.ids

    def origins_with_vid(self, vid: int) -> frozenset[Address]:
        """The origins whose records announce `vid` (ours included): kept for our own vid, found by a scan for
        another."""
        if vid == self._own_vid:
            return frozenset(self._same_vid | {self.own})
        return frozenset(address for address, origin in self.ids.items() if origin.vid == vid)

    def vid_index_size(self) -> int:
        """Origins kept as announcing our vid (no more than the records: a bound the fuzz tests check)."""
        return len(self._same_vid)

    def _index_vid(self, address: Address, held: StoredRecord | None, stored: StoredRecord) -> None:
        vid = stored.record.origin.vid
        if address == self.own:
            if vid != self._own_vid:
                self._own_vid = vid
                self._same_vid = {a for a, origin in self.ids.items() if origin.vid == vid and a != address}
            return
        if held is not None and held.record.origin.vid == self._own_vid:
            self._same_vid.discard(address)
        if vid == self._own_vid:
            self._same_vid.add(address)

    def peers(self, address: Address) -> list[Address]:
        """The confirmed (two-way) links of a stored record: the peers it lists whose records list it."""
        records = self.records
        stored = records.get(address)
        if stored is None:
            return []
        found = []
        for peer in stored.listed:
            other = records.get(peer)
            if other is not None and address in other.listed and peer != address:
                found.append(peer)
        return found

    def _delete(self, address: Address) -> None:
        stored = self.records.pop(address)
        del self.received_at[address]
        if address in self._reachable:
            self._digest_remove(stored)
        self.changed_ids.append(address)
        del self._own_ids()[address]
        self._same_vid.discard(address)
        records = self.records
        for peer in sorted(stored.listed):
            other = records.get(peer)
            if other is not None and address in other.listed and peer != address:
                self.changed_links.append((address, peer, False))

    def _evict_one(self) -> bool:
        """Make room by dropping the oldest record that is not our own (lowest (received_at, address))."""
        ages, received_at = self._ages, self.received_at
        if ages is None:  # the first time the table is full: the heap, from the clocks
            ages = self._ages = [(when, origin) for origin, when in received_at.items() if origin != self.own]
            heapq.heapify(ages)
        while ages:
            self.eviction_steps += 1
            when, address = ages[0]
            current = received_at.get(address)
            if current is None or address == self.own:
                heapq.heappop(ages)  # a record gone (or ours, never evicted)
            elif current != when:
                heapq.heapreplace(ages, (current, address))  # refreshed since: its current time
            else:
                heapq.heappop(ages)
                self._delete(address)
                return True
        return False

    def _touch(self, address: Address, now: float) -> None:
        """Restart a record's expiry clock (a new heap entry only when the clock went back: the heap's times
        are lower bounds)."""
        received_at = self.received_at
        back = now < received_at[address]
        received_at[address] = now
        if back and self._ages is not None and address != self.own:
            self._push_age(now, address)

    def _push_age(self, when: float, address: Address) -> None:
        """An entry for a record stored with this time; or, when stale entries outnumber the records, the heap
        rebuilt from the clocks (this one included)."""
        ages = self._ages
        assert ages is not None
        if len(ages) > 2 * len(self.records) + 64:
            ages[:] = [(received, origin) for origin, received in self.received_at.items() if origin != self.own]
            heapq.heapify(ages)
        else:
            heapq.heappush(ages, (when, address))

    def routes_affected(self, routes: Routes) -> bool:
        """Do the changes since `routes` were computed move anything they say? Exact: False means a new
        computation would give the same routes (the changes are then forgotten); True keeps them for
        `compute_routes`."""
        distance = routes.distance
        affected = any(address in distance for address in self.changed_ids) or any(
            distance.get(a) != distance.get(b)  # one end reachable and not the other, or on different levels
            for a, b, _ in self.changed_links)
        if not affected:
            self.changed_links, self.changed_ids = [], []
        return affected

    def expire(self, lifetime: float, reachable: frozenset[Address], now: float) -> list[Address]:
        """Drop unreachable records not received for `lifetime`; reachable ones are kept alive by
        the links their neighbours announce (their clock restarts here)."""
        received_at = self.received_at
        touched = reachable & received_at.keys()
        if self._ages is None:
            received_at.update(dict.fromkeys(touched, now))
        else:  # one by one: a clock that goes back needs a heap entry (the heap's times are lower bounds)
            for address in touched:
                self._touch(address, now)
        own = self.own
        stale = sorted(address for address in received_at.keys() - reachable
                       if address != own and now - received_at[address] > lifetime)
        for address in stale:
            self._delete(address)
        return stale

    # ------------------------------------------------------------ anti-entropy

    def _digest_add(self, stored: StoredRecord) -> None:
        self._digest_buckets[stored.bucket] ^= stored.hash
        self._digest_count += 1

    def _digest_remove(self, stored: StoredRecord) -> None:
        self._digest_buckets[stored.bucket] ^= stored.hash
        self._digest_count -= 1

    def _reach(self, members: frozenset[Address]) -> None:
        """The routes now reach `members`: the kept digest covers their records."""
        before = self._reachable
        if members is before:
            return
        records = self.records
        for address in before - members:
            stored = records.get(address)
            if stored is not None:
                self._digest_remove(stored)
        for address in members - before:
            stored = records.get(address)
            if stored is not None:
                self._digest_add(stored)
        self._reachable = members

    def digest(self, members: Iterable[Address]) -> Digest:
        """The digest of the records of `members` (the reachable nodes, this one included); kept up to date for
        the members of the routes computed last."""
        if members is self._reachable:
            return self._digest_count, tuple(self._digest_buckets)
        buckets = [0] * DIGEST_BUCKETS
        count = 0
        records = self.records
        for address in members:
            stored = records.get(address)
            if stored is not None:
                buckets[stored.bucket] ^= stored.hash
                count += 1
        return count, tuple(buckets)

    def summary(self, members: Iterable[Address], buckets: frozenset[int]) -> list[SummaryEntry]:
        """(origin, epoch, seq) of the records of `members` that fall in `buckets`, sorted by origin."""
        entries = []
        for address in sorted(members):
            stored = self.records.get(address)
            if stored is not None and stored.bucket in buckets:
                entries.append(SummaryEntry(address, stored.record.epoch, stored.record.seq))
        return entries

    # ------------------------------------------------------------ routes

    def compute_routes(self, previous: Routes | None = None) -> Routes:
        """Routes over confirmed (two-way) links from this node, from `previous` (the routes computed last,
        exact for the table as it was then) when given: when the changes since only confirmed links, a
        partial update from the nodes they bring closer (`_add_links`); when links also went, first a partial
        update without every link that changed (`_remove_links`), then with those there now; without
        `previous`, a full breadth-first search."""
        changes, changed_ids = self.changed_links, self.changed_ids
        self.changed_links, self.changed_ids = [], []
        if previous is None:
            routes = self._search()
        elif all(confirmed for _, _, confirmed in changes):
            routes = self._add_links(previous, changes)
        else:
            routes = self._change_links(previous, changes)
        self._reach(routes.members)
        distance = routes.distance
        self.member_ids_changed = any(address in distance for address in changed_ids)
        return routes

    def _routes_ids(self) -> dict[Address, BrokerId]:
        """`ids` for a new `Routes`: the dict itself, copied before the next change (`_own_ids`)."""
        self._ids_given = True
        return self.ids

    def _hop_set(self, hops: frozenset[Address]) -> frozenset[Address]:
        """One object per distinct set of next hops (a node has few: subsets of its neighbours)."""
        shared = self._hop_sets.setdefault(hops, hops)
        if len(self._hop_sets) > 4096:
            self._hop_sets = {hops: hops}
        return shared

    def _add_links(self, previous: Routes, changes: list[tuple[Address, Address, bool]]) -> Routes:
        """Routes after links were only added. Distances only shrink: relax outward from the nearer end
        of each new link, level by level; then recompute the next hops of every node whose distance or
        parents changed, and of those below it whose parents' next hops changed, in order of distance."""
        peers = self.peers
        own = self.own
        distance = dict(previous.distance)
        next_hops = dict(previous.next_hops)
        levels: dict[int, set[Address]] = {}
        """distance -> nodes whose next hops must be recomputed"""

        def touch(node: Address) -> None:
            levels.setdefault(distance[node], set()).add(node)

        closer: dict[int, set[Address]] = {}
        """distance -> nodes brought to that distance, whose links must be relaxed"""
        for a, b, _ in changes:
            da, db = distance.get(a), distance.get(b)
            if da == db:
                continue  # both unreachable, or on one level: on no shortest path
            near, far = (a, b) if db is None or (da is not None and da < db) else (b, a)
            here = distance[near] + 1
            reached = distance.get(far)
            if reached is None or reached > here:
                distance[far] = here
                closer.setdefault(here, set()).add(far)
            if distance[far] == here:
                touch(far)  # a new parent
        while closer:  # relax outward, nearest first (unit weights: each level settles before the next)
            depth = min(closer)
            here = depth + 1
            for node in closer.pop(depth):
                if distance[node] != depth:
                    continue  # brought closer still, later in this loop
                for peer in peers(node):
                    reached = distance.get(peer)
                    if reached is None or reached > here:
                        distance[peer] = here
                        closer.setdefault(here, set()).add(peer)
                        touch(peer)
                    elif reached == here:
                        touch(peer)  # a new parent
        hop_set = self._hop_set
        while levels:  # next hops, level by level
            depth = min(levels)
            below = depth + 1
            for node in levels.pop(depth):
                if distance[node] != depth:
                    continue  # touched before its distance shrank; handled at its final level
                linked = peers(node)
                if depth == 1:
                    hops = frozenset([node])
                else:
                    hops = frozenset().union(*(next_hops[p] for p in linked if distance.get(p) == depth - 1))
                if next_hops.get(node) != hops:
                    next_hops[node] = hop_set(hops)
                    for peer in linked:
                        if distance.get(peer) == below:
                            levels.setdefault(below, set()).add(peer)
        members = previous.members if len(distance) == len(previous.distance) else frozenset(distance)
        assert own in distance
        return Routes(members, distance, next_hops, self._routes_ids())

    def _linked(self, a: Address, b: Address) -> bool:
        """Is a - b a confirmed link now?"""
        records = self.records
        first, second = records.get(a), records.get(b)
        return first is not None and second is not None and a != b and b in first.listed and a in second.listed

    def _change_links(self, previous: Routes, changes: list[tuple[Address, Address, bool]]) -> Routes:
        """Routes after links went (and maybe came): without every pair that changed (`_remove_links`), then
        with the pairs linked now added back (`_add_links`), each exact for the links it is given."""
        pairs = {(a, b) if a < b else (b, a) for a, b, _ in changes}
        routes = self._remove_links(previous, pairs)
        if routes is None:
            return self._search()  # too much moved: a search from scratch costs less
        present = [(a, b, True) for a, b in sorted(pairs) if self._linked(a, b)]
        return self._add_links(routes, present) if present else routes

    def _remove_links(self, previous: Routes, pairs: set[tuple[Address, Address]]) -> Routes | None:
        """Routes over the links now less `pairs` (and so over the links of `previous` less `pairs`: nothing
        else changed). Distances only grow: a node whose every parent (neighbour one level nearer) is gone or
        lost its own way is *affected*; only affected nodes are placed again, from their unaffected
        neighbours outward, level by level; then the next hops of every node whose parents may have changed,
        and of those below them whose parents' next hops changed. None when more than a tenth of the members
        are affected (a partition): a full search is cheaper then."""
        own = self.own
        excluded: dict[Address, set[Address]] = {}
        for a, b in pairs:
            excluded.setdefault(a, set()).add(b)
            excluded.setdefault(b, set()).add(a)
        known: dict[Address, list[Address]] = {}

        def linked(node: Address) -> list[Address]:
            found = known.get(node)
            if found is None:
                gone = excluded.get(node)
                found = known[node] = self.peers(node) if gone is None else \
                    [peer for peer in self.peers(node) if peer not in gone]
            return found

        old = previous.distance
        suspects: dict[int, set[Address]] = {}
        """level -> nodes that may have lost every parent"""
        for a, b in pairs:
            da, db = old.get(a), old.get(b)
            if da is not None and db is not None and abs(da - db) == 1:
                far = a if da > db else b
                suspects.setdefault(old[far], set()).add(far)
        affected: set[Address] = set()
        examined: set[Address] = set()
        limit = len(old) // 10
        while suspects:  # nearest first: a parent's fate is known before its children's
            depth = min(suspects)
            for node in suspects.pop(depth):
                if node == own or node in affected:
                    continue
                examined.add(node)
                neighbours = linked(node)
                if any(old.get(peer) == depth - 1 and peer not in affected for peer in neighbours):
                    continue  # still a parent on a shortest path that holds
                affected.add(node)
                if len(affected) > limit:
                    return None
                for peer in neighbours:
                    if old.get(peer) == depth + 1:
                        suspects.setdefault(depth + 1, set()).add(peer)
        if not affected and not examined:
            return Routes(previous.members, previous.distance, previous.next_hops, self._routes_ids())
        distance = dict(old)
        next_hops = dict(previous.next_hops)
        for node in affected:
            del distance[node]
            next_hops.pop(node, None)
        reach: dict[int, set[Address]] = {}
        """level -> affected nodes reachable at that distance (or more, when reached again)"""
        for node in affected:
            best = min((distance[peer] + 1 for peer in linked(node) if peer in distance), default=None)
            if best is not None:
                reach.setdefault(best, set()).add(node)
        placed: list[Address] = []
        while reach:
            depth = min(reach)
            for node in reach.pop(depth):
                if node in distance:
                    continue  # placed nearer already
                distance[node] = depth
                placed.append(node)
                for peer in linked(node):
                    if peer in affected and peer not in distance:
                        reach.setdefault(depth + 1, set()).add(peer)
        levels: dict[int, set[Address]] = {}
        """level -> nodes whose next hops must be recomputed"""
        for node in examined - affected:
            levels.setdefault(distance[node], set()).add(node)
        for node in placed:
            here = distance[node]
            levels.setdefault(here, set()).add(node)
            for peer in linked(node):
                if distance.get(peer) == here + 1:
                    levels.setdefault(here + 1, set()).add(peer)  # it may have a new parent
        hop_set = self._hop_set
        while levels:
            depth = min(levels)
            for node in levels.pop(depth):
                if depth == 0 or distance.get(node) != depth:
                    continue
                neighbours = linked(node)
                if depth == 1:
                    hops = frozenset([node])
                else:
                    hops = frozenset().union(*(next_hops[p] for p in neighbours if distance.get(p) == depth - 1))
                if next_hops.get(node) != hops:
                    next_hops[node] = hop_set(hops)
                    for peer in neighbours:
                        if distance.get(peer) == depth + 1:
                            levels.setdefault(depth + 1, set()).add(peer)
        members = previous.members if len(distance) == len(old) else frozenset(distance)
        return Routes(members, distance, next_hops, self._routes_ids())

    def _search(self) -> Routes:
        """Breadth-first search over confirmed (two-way) links from this node."""
        records = self.records
        own = self.own
        distance = {own: 0}
        next_hops: dict[Address, frozenset[Address]] = {}
        hop_set = self._hop_set
        for peer in self.peers(own):
            distance[peer] = 1
            next_hops[peer] = hop_set(frozenset([peer]))
        frontier = deque(next_hops)
        while frontier:
            node = frontier.popleft()
            here = distance[node] + 1
            hops = next_hops[node]
            for peer in records[node].listed:
                reached = distance.get(peer)
                if reached is not None and (reached != here or hops <= next_hops[peer]):
                    continue  # nearer, or reached from here already: the link changes nothing
                other = records.get(peer)
                if other is None or node not in other.listed or peer == node:
                    continue  # one-way: no link
                if reached is None:
                    distance[peer] = here
                    next_hops[peer] = hops
                    frontier.append(peer)
                else:
                    next_hops[peer] = hop_set(next_hops[peer] | hops)
        return Routes(frozenset(distance), distance, next_hops, self._routes_ids())


def _same_links(held: LinkStateRecord, record: LinkStateRecord) -> bool:
    return (held.origin == record.origin and held.epoch == record.epoch and held.flags == record.flags
            and held.neighbours == record.neighbours)
