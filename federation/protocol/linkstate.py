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
rebuilt when its stale entries outnumber the records.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from federation.protocol.types import Address, BrokerId
from federation.protocol.wire import (
    DIGEST_BUCKETS,
    FLAG_LEAVING,
    MAX_DISTANCE,
    LinkStateRecord,
    SummaryEntry,
    record_size,
)


def entry_hash(address: Address, epoch: int, seq: int) -> int:
    """The 64-bit hash of one record version in a digest (docs/protocol.md, "Anti-entropy")."""
    text = f"{address.host}|{address.port}|{epoch}|{seq}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


@functools.lru_cache(maxsize=65536)
def bucket_of(address: Address) -> int:
    """The digest bucket of an origin: depends on the address only, so every version lands in the same one."""
    text = f"{address.host}|{address.port}".encode()
    return hashlib.blake2b(text, digest_size=8).digest()[0] % DIGEST_BUCKETS


@dataclass(slots=True)
class StoredRecord:
    record: LinkStateRecord
    """distance is the hop count from the origin to this node"""
    received_at: float
    """when the record was last received or found reachable (its expiry clock)"""
    listed: frozenset[Address] = field(init=False)
    """the neighbours the record lists (none when leaving), for the two-way check"""
    bucket: int = field(init=False)
    digest_hash: int | None = field(init=False, default=None)
    """`entry_hash` of this version, computed when a digest first needs it"""
    encoded_size: int | None = field(init=False, default=None)
    """`wire.record_size` of the record, computed when a bundle first needs it"""

    def __post_init__(self) -> None:
        record = self.record
        self.listed = frozenset() if record.flags & FLAG_LEAVING else frozenset(record.neighbours)
        self.bucket = bucket_of(record.origin.address)

    @property
    def size(self) -> int:
        value = self.encoded_size
        if value is None:
            value = self.encoded_size = record_size(self.record)
        return value

    @property
    def hash(self) -> int:
        value = self.digest_hash
        if value is None:
            record = self.record
            value = self.digest_hash = entry_hash(record.origin.address, record.epoch, record.seq)
        return value


@dataclass(frozen=True)
class Routes:
    members: frozenset[Address]
    """reachable nodes, this node included"""
    distance: dict[Address, int]
    next_hops: dict[Address, frozenset[Address]]
    """destination -> neighbours (announced addresses) on a shortest path to it"""
    ids: dict[Address, BrokerId]


Digest = tuple[int, tuple[int, ...]]
"""(entries, DIGEST_BUCKETS bucket hashes)"""


class LinkStateDatabase:
    def __init__(self, own: Address, capacity: int) -> None:
        self.own = own
        self.capacity = capacity
        self.records: dict[Address, StoredRecord] = {}
        self.refused = 0
        self.links: dict[Address, set[Address]] = {}
        """confirmed two-way links: address -> the peers it and they both list"""
        self.changed_links: list[tuple[Address, Address, bool]] = []
        """(a, b, confirmed) for links confirmed (True) or broken (False) since routes were last computed,
        less those `routes_affected` found irrelevant"""
        self.changed_ids: list[Address] = []
        """origins whose BrokerId changed (or appeared, or went) since the last `routes_affected`"""
        self.ids: dict[Address, BrokerId] = {}
        """origin -> the BrokerId its record announces"""
        self.by_vid: dict[int, set[Address]] = {}
        """vid -> origins announcing it (for collision checks without a scan)"""
        self._ages: list[tuple[float, Address]] = []
        """(received_at, origin) of the foreign records, a min-heap with lazy updates (see the module's text)"""
        self.eviction_steps = 0
        """heap entries looked at to find whom to evict (a count of work, for tests)"""

    def accept(self, record: LinkStateRecord, hops_travelled: int, now: float) -> str:
        """Store a received record. Returns "new" (newer: forward; routes may change), "refresh"
        (newer but the same links: forward, routes unchanged), "shorter" (same freshness, shorter
        distance: kept, not forwarded) or "old" (ignore)."""
        address = record.origin.address
        distance = min(record.distance + hops_travelled, MAX_DISTANCE)
        held = self.records.get(address)
        if held is None:
            if len(self.records) >= self.capacity and not self._evict_one():
                self.refused += 1
                return "old"
        elif record.freshness < held.record.freshness:
            return "old"
        elif record.freshness == held.record.freshness:
            self._touch(held, now)
            if distance < held.record.distance:
                held.record = _with_distance(held.record, distance)
                held.encoded_size = None
                return "shorter"
            return "old"
        self._store(StoredRecord(_with_distance(record, distance), now), held)
        if held is not None and _same_links(held.record, record):
            return "refresh"  # a re-announcement with the same links: forward it, routes are unchanged
        return "new"

    def store_own(self, record: LinkStateRecord, now: float) -> None:
        self._store(StoredRecord(record, now), self.records.get(record.origin.address))

    def _store(self, stored: StoredRecord, held: StoredRecord | None) -> None:
        address = stored.record.origin.address
        self.records[address] = stored
        if address != self.own and (held is None or stored.received_at < held.received_at):
            self._push_age(stored.received_at, address)
        if held is None or held.record.origin != stored.record.origin:
            self.changed_ids.append(address)
            if held is not None:
                self._forget_id(held.record.origin)
            self.ids[address] = stored.record.origin
            self.by_vid.setdefault(stored.record.origin.vid, set()).add(address)
        before = held.listed if held is not None else frozenset()
        for peer in before - stored.listed:
            self._unlink(address, peer)
        for peer in stored.listed - before:
            other = self.records.get(peer)
            if other is not None and address in other.listed and peer != address:  # never a link to itself
                self.links.setdefault(address, set()).add(peer)
                self.links.setdefault(peer, set()).add(address)
                self.changed_links.append((address, peer, True))

    def _unlink(self, address: Address, peer: Address) -> None:
        peers = self.links.get(address)
        if peers is None or peer not in peers:
            return
        peers.discard(peer)
        self.links[peer].discard(address)
        self.changed_links.append((address, peer, False))

    def _forget_id(self, origin: BrokerId) -> None:
        same = self.by_vid.get(origin.vid)
        if same is not None:
            same.discard(origin.address)
            if not same:
                del self.by_vid[origin.vid]

    def _delete(self, address: Address) -> None:
        stored = self.records.pop(address)
        self.changed_ids.append(address)
        del self.ids[address]
        self._forget_id(stored.record.origin)
        for peer in sorted(self.links.pop(address, ())):
            self.links[peer].discard(address)
            self.changed_links.append((address, peer, False))

    def _evict_one(self) -> bool:
        """Make room by dropping the oldest record that is not our own (lowest (received_at, address))."""
        ages, records = self._ages, self.records
        while ages:
            self.eviction_steps += 1
            received_at, address = ages[0]
            stored = records.get(address)
            if stored is None or address == self.own:
                heapq.heappop(ages)  # a record gone (or ours, never evicted)
            elif stored.received_at != received_at:
                heapq.heapreplace(ages, (stored.received_at, address))  # refreshed since: its current time
            else:
                heapq.heappop(ages)
                self._delete(address)
                return True
        return False

    def _touch(self, stored: StoredRecord, now: float) -> None:
        """Restart a record's expiry clock (a new heap entry only when the clock went back: the heap's times
        are lower bounds)."""
        back = now < stored.received_at
        stored.received_at = now
        if back:
            self._push_age(now, stored.record.origin.address)

    def _push_age(self, received_at: float, address: Address) -> None:
        """An entry for a record stored with this time; or, when stale entries outnumber the records, the heap
        rebuilt from the records (this one included)."""
        ages = self._ages
        if len(ages) > 2 * len(self.records) + 64:
            ages[:] = [(stored.received_at, origin) for origin, stored in self.records.items() if origin != self.own]
            heapq.heapify(ages)
        else:
            heapq.heappush(ages, (received_at, address))

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
        stale = []
        for address, stored in self.records.items():
            if address in reachable:
                if address != self.own:
                    self._touch(stored, now)
                else:
                    stored.received_at = now
            elif address != self.own and now - stored.received_at > lifetime:
                stale.append(address)
        for address in stale:
            self._delete(address)
        return stale

    # ------------------------------------------------------------ anti-entropy

    def digest(self, members: Iterable[Address]) -> Digest:
        """The digest of the records of `members` (the reachable nodes, this one included)."""
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
        """Routes over confirmed (two-way) links from this node. From `previous` (the routes computed
        last, exact for the table as it was then) when the changes since only confirmed links: a
        partial update from the nodes they bring closer; otherwise a full breadth-first search."""
        changes = self.changed_links
        self.changed_links, self.changed_ids = [], []
        if previous is not None and all(confirmed for _, _, confirmed in changes):
            return self._add_links(previous, changes)
        return self._search()

    def _add_links(self, previous: Routes, changes: list[tuple[Address, Address, bool]]) -> Routes:
        """Routes after links were only added. Distances only shrink: relax outward from the nearer end
        of each new link, level by level; then recompute the next hops of every node whose distance or
        parents changed, and of those below it whose parents' next hops changed, in order of distance."""
        links = self.links
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
                for peer in links[node]:
                    reached = distance.get(peer)
                    if reached is None or reached > here:
                        distance[peer] = here
                        closer.setdefault(here, set()).add(peer)
                        touch(peer)
                    elif reached == here:
                        touch(peer)  # a new parent
        while levels:  # next hops, level by level
            depth = min(levels)
            below = depth + 1
            for node in levels.pop(depth):
                if distance[node] != depth:
                    continue  # touched before its distance shrank; handled at its final level
                if depth == 1:
                    hops = frozenset([node])
                else:
                    hops = frozenset().union(*(next_hops[p] for p in links[node] if distance.get(p) == depth - 1))
                if next_hops.get(node) != hops:
                    next_hops[node] = hops
                    for peer in links[node]:
                        if distance.get(peer) == below:
                            levels.setdefault(below, set()).add(peer)
        members = previous.members if len(distance) == len(previous.distance) else frozenset(distance)
        assert own in distance
        return Routes(members, distance, next_hops, dict(self.ids))

    def _search(self) -> Routes:
        """Breadth-first search over confirmed (two-way) links from this node."""
        ids = dict(self.ids)
        links = self.links
        distance = {self.own: 0}
        next_hops: dict[Address, frozenset[Address]] = {}
        for peer in links.get(self.own, ()):
            distance[peer] = 1
            next_hops[peer] = frozenset([peer])
        frontier = deque(next_hops)
        while frontier:
            node = frontier.popleft()
            here = distance[node] + 1
            hops = next_hops[node]
            for peer in links[node]:
                reached = distance.get(peer)
                if reached is None:
                    distance[peer] = here
                    next_hops[peer] = hops
                    frontier.append(peer)
                elif reached == here and not hops <= next_hops[peer]:
                    next_hops[peer] = next_hops[peer] | hops
        return Routes(frozenset(distance), distance, next_hops, ids)


def _same_links(held: LinkStateRecord, record: LinkStateRecord) -> bool:
    return (held.origin == record.origin and held.epoch == record.epoch and held.flags == record.flags
            and held.neighbours == record.neighbours)


def _with_distance(record: LinkStateRecord, distance: int) -> LinkStateRecord:
    if record.distance == distance:
        return record
    return LinkStateRecord(record.origin, record.epoch, record.seq, distance, record.flags, record.neighbours)
