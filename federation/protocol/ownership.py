"""Owned topic subtrees (seed 000): a configured broker is the core of every filter inside its subtree.

Theory of operation
-------------------
Some operators want a known broker to hold a part of the topic tree
("the kitchen broker owns `kitchen/#`"). A node lists such subtrees in its
`owned` setting and announces each one with a `tc` carrying the *owner* flag
(docs/protocol.md). Ownership announcements are not claims of a filter's
core: they are never answered with `rt` and never suppressed by a better
claim. Each one floods like a link-state record (newer-or-shorter per
(subtree, owner)), so every node learns every owner, refreshed every
announce interval, forgotten when it expires or the table shows the owner
unreachable or restarted.

The owner of a federated filter F is the live owner of a subtree that
*covers* F (`federation.protocol.modes.covers`). A filter that merely overlaps a
subtree (`+/temperature` against `kitchen/#`) is not owned: it is placed as
if nothing were owned, and publications in the subtree still reach its
subscribers through its own mesh. Two nodes owning overlapping subtrees is a
configuration error: each of them reports it when it hears the other's
announcement (an `ownership_conflict` event, a counter, the status), and
until it is fixed the lowest BrokerId among the live owners covering a
filter owns it, so every node still agrees.

This table is pure bookkeeping; `federation.protocol.mesh` sends and floods.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from federation.protocol.modes import covers, overlaps
from federation.protocol.types import Address, BrokerId


@dataclass
class OwnerEntry:
    """Another node's announcement that it owns `subtree`."""

    subtree: str
    owner: BrokerId
    epoch: int
    seq: int
    distance: int
    heard_at: float

    @property
    def freshness(self) -> tuple[int, int]:
        return (self.epoch, self.seq)


@dataclass(frozen=True)
class Conflict:
    """Our subtree `own` overlaps `other_subtree`, owned by `other`."""

    own: str
    other_subtree: str
    other: BrokerId


OwnerKey = tuple[str, Address]


class OwnershipTable:
    def __init__(self, own: Iterable[str], capacity: int) -> None:
        self.own: tuple[str, ...] = tuple(sorted(set(own)))
        self.capacity = capacity
        self.seq = 0
        """sequence number of our own announcements (all our subtrees share it)"""
        self.entries: dict[OwnerKey, OwnerEntry] = {}
        self.withdrawn: dict[OwnerKey, tuple[int, int]] = {}
        """the freshness of the last withdrawal heard per (subtree, owner): older copies are ignored"""
        self.conflicts: dict[tuple[str, str, Address], Conflict] = {}
        self.refused = 0
        """announcements of new ownerships refused because the table was full"""
        self.withdrawn_forgotten = 0
        """withdrawals forgotten (the oldest) to make room: a late copy of that ownership could be taken again"""

    # ------------------------------------------------------------ announcements heard

    def receive(self, subtree: str, owner: BrokerId, epoch: int, seq: int, distance: int, withdrawn: bool,
                now: float) -> str:
        """Take an announcement (`distance` as travelled to us). Returns "old" (ignore it), "refresh"
        (a newer copy of an ownership we hold, or a shorter path: flood it on) or "new" (an ownership we
        did not hold, or a withdrawal: flood it on; owners changed)."""
        key = (subtree, owner.address)
        freshness = (epoch, seq)
        gone = self.withdrawn.get(key)
        if gone is not None and freshness <= gone:
            return "old"
        held = self.entries.get(key)
        if held is not None:
            if freshness < held.freshness:
                return "old"
            if freshness == held.freshness and not withdrawn:
                held.heard_at = max(held.heard_at, now)
                if distance >= held.distance:
                    return "old"
                held.distance = distance
                return "refresh"
        if withdrawn:
            self.entries.pop(key, None)
            self._bury(key, freshness)
            return "new"
        if held is not None and held.owner == owner:
            held.epoch, held.seq, held.distance, held.heard_at = epoch, seq, distance, now
            return "refresh"
        if held is None and len(self.entries) >= self.capacity:
            self.refused += 1
            return "old"
        self.entries[key] = OwnerEntry(subtree, owner, epoch, seq, distance, now)
        return "new"

    def _bury(self, key: OwnerKey, freshness: tuple[int, int]) -> None:
        """Remember what was withdrawn or expired, so late copies of it are not taken again."""
        if key not in self.withdrawn and len(self.withdrawn) >= self.capacity:
            del self.withdrawn[next(iter(self.withdrawn))]
            self.withdrawn_forgotten += 1
        self.withdrawn[key] = max(freshness, self.withdrawn.get(key, freshness))

    def new_conflicts(self) -> list[Conflict]:
        """Conflicts between our subtrees and the entries held, not reported before (sorted)."""
        found = []
        for entry in sorted(self.entries.values(), key=lambda e: (e.subtree, e.owner)):
            for own in self.own:
                if not overlaps(own, entry.subtree):
                    continue
                key = (own, entry.subtree, entry.owner.address)
                if key not in self.conflicts:
                    conflict = Conflict(own, entry.subtree, entry.owner)
                    self.conflicts[key] = conflict
                    found.append(conflict)
        return found

    def forget_conflicts(self) -> None:
        """Drop reported conflicts whose other announcement is gone (they are reported again if it returns)."""
        for key in [k for k in self.conflicts if (k[1], k[2]) not in self.entries]:
            del self.conflicts[key]

    def expire(self, lifetime: float, now: float) -> bool:
        """Forget announcements not refreshed for `lifetime`; True if any went."""
        stale = [key for key, entry in self.entries.items() if now - entry.heard_at > lifetime]
        for key in stale:
            self._bury(key, self.entries.pop(key).freshness)
        if stale:
            self.forget_conflicts()
        return bool(stale)

    # ------------------------------------------------------------ questions

    def owner_of(self, filter_: str, me: BrokerId, live: Callable[[OwnerEntry], BrokerId | None]) -> BrokerId | None:
        """The owner of a federated filter: the lowest BrokerId among the live owners of a subtree covering it.

        `live(entry)` gives the owner's current BrokerId if it is live (reachable, same life), else None.
        """
        best: BrokerId | None = None
        if any(covers(subtree, filter_) for subtree in self.own):
            best = me
        for entry in self.entries.values():
            if not covers(entry.subtree, filter_):
                continue
            current = live(entry)
            if current is not None and (best is None or current < best):
                best = current
        return best

    def covers_anything(self) -> bool:
        return bool(self.own) or bool(self.entries)

    def status(self) -> dict[str, object]:
        return {
            "owned": list(self.own),
            "owners": [{"subtree": e.subtree, "owner": str(e.owner)}
                       for e in sorted(self.entries.values(), key=lambda e: (e.subtree, e.owner))],
            "conflicts": [{"subtree": c.own, "other_subtree": c.other_subtree, "other": str(c.other)}
                          for _, c in sorted(self.conflicts.items())],
            "refused": self.refused,
            "withdrawn_forgotten": self.withdrawn_forgotten,
        }
