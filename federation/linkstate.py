"""The federation table: every node's latest announcement and the routes they give.

Each node floods one link-state record (`fd`): its id, boot epoch, sequence
number and the neighbours it currently hears. A link counts only when both
ends list each other, so a one-way or stale claim never creates a route, and
a node that dies disappears as soon as its neighbours re-announce without it
(no count-to-infinity, no waiting for expiry). Shortest paths by hop count
give, per reachable node, the distance and every first hop on a shortest
path (the "next hops"; several when paths are redundant).

Flood suppression follows the protocol: a record is taken and forwarded when
its (epoch, seq) is newer than the one held, or equal with a shorter
distance. Unreachable records are kept until they expire, so a partition that
heals quickly needs no full re-learning.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from federation.types import Address, BrokerId
from federation.wire import FLAG_LEAVING, LinkStateRecord


@dataclass
class StoredRecord:
    record: LinkStateRecord
    """distance is the hop count from the origin to this node"""
    received_at: float


@dataclass(frozen=True)
class Routes:
    members: frozenset[Address]
    """reachable nodes, this node included"""
    distance: dict[Address, int]
    next_hops: dict[Address, frozenset[Address]]
    """destination -> neighbours (announced addresses) on a shortest path to it"""
    ids: dict[Address, BrokerId]


class LinkStateDatabase:
    def __init__(self, own: Address, capacity: int) -> None:
        self.own = own
        self.capacity = capacity
        self.records: dict[Address, StoredRecord] = {}
        self.refused = 0

    def accept(self, record: LinkStateRecord, hops_travelled: int, now: float) -> str:
        """Store a received record. Returns "new" (forward; routes may change), "refresh"
        (newer but the same links: forward, routes unchanged), "shorter" (same
        freshness, shorter distance: forward, routes unchanged) or "old" (ignore)."""
        address = record.origin.address
        distance = record.distance + hops_travelled
        held = self.records.get(address)
        if held is None:
            if len(self.records) >= self.capacity and not self._evict_one():
                self.refused += 1
                return "old"
        elif record.freshness < held.record.freshness:
            return "old"
        elif record.freshness == held.record.freshness:
            if distance < held.record.distance:
                held.record = _with_distance(held.record, distance)
                held.received_at = now
                return "shorter"
            held.received_at = now
            return "old"
        self.records[address] = StoredRecord(_with_distance(record, distance), now)
        if held is not None and _same_links(held.record, record):
            return "refresh"  # a periodic re-announcement: forward it, routes are unchanged
        return "new"

    def store_own(self, record: LinkStateRecord, now: float) -> None:
        self.records[record.origin.address] = StoredRecord(record, now)

    def _evict_one(self) -> bool:
        """Make room by dropping the oldest record that is not our own."""
        candidates = [(stored.received_at, address) for address, stored in self.records.items()
                      if address != self.own]
        if not candidates:
            return False
        del self.records[min(candidates)[1]]
        return True

    def expire(self, lifetime: float, reachable: frozenset[Address], now: float) -> list[Address]:
        """Drop unreachable records older than `lifetime`; reachable ones are kept fresh
        by the links their neighbours announce."""
        stale = [address for address, stored in self.records.items()
                 if address != self.own and address not in reachable and now - stored.received_at > lifetime]
        for address in stale:
            del self.records[address]
        return stale

    def compute_routes(self) -> Routes:
        """Breadth-first search over confirmed (two-way) links from this node."""
        own = self.records.get(self.own)
        ids = {address: stored.record.origin for address, stored in self.records.items()}
        if own is None:
            return Routes(frozenset([self.own]), {self.own: 0}, {}, ids)
        listed = {
            address: (frozenset() if stored.record.flags & FLAG_LEAVING else frozenset(stored.record.neighbours))
            for address, stored in self.records.items()
        }
        distance = {self.own: 0}
        next_hops: dict[Address, frozenset[Address]] = {}
        frontier = deque([self.own])
        while frontier:
            node = frontier.popleft()
            for peer in sorted(listed.get(node, ())):
                if node not in listed.get(peer, ()):
                    continue  # one-way claim: not a link
                hops = frozenset([peer]) if node == self.own else next_hops[node]
                if peer not in distance:
                    distance[peer] = distance[node] + 1
                    next_hops[peer] = hops
                    frontier.append(peer)
                elif distance[peer] == distance[node] + 1:
                    next_hops[peer] = next_hops[peer] | hops
        return Routes(frozenset(distance), distance, next_hops, ids)


def _same_links(held: LinkStateRecord, record: LinkStateRecord) -> bool:
    return (held.origin == record.origin and held.epoch == record.epoch and held.flags == record.flags
            and held.neighbours == record.neighbours)


def _with_distance(record: LinkStateRecord, distance: int) -> LinkStateRecord:
    if record.distance == distance:
        return record
    return LinkStateRecord(record.origin, record.epoch, record.seq, distance, record.flags, record.neighbours)
