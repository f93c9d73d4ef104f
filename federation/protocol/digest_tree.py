"""A set of keyed entries summarised as a tree of digests, for anti-entropy that costs what differs.

Theory of operation
-------------------
Two neighbours that should hold the same set (the topic cores' claims; a
child's memberships and its parent's record of them) compare it without
sending it: each entry has a 64-bit hash, and the tree groups entries by
the leading nibbles of their hashes. A *bucket* is a path of nibbles
(`depth` of them, packed in `path`); its digest is how many entries it holds
and the XOR of their hashes, and a bucket's *children* are the 16 buckets one
nibble deeper. Comparing the 16 children of the root tells which sixteenth
of the set differs; descending only into the buckets that differ finds the
few entries that do in a handful of round trips, whatever the size of the
set (`federation.protocol.topic_sync` runs the exchange).

The first `STORED_DEPTH` levels are kept up to date as entries come and go
(one dictionary update per level), and the entries of each deepest stored
bucket are indexed, so deeper digests and a bucket's entries are computed
from a 256th of the entries at most (390 of 100,000), and a small tree costs
little memory.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from hashlib import blake2b
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)

CHILDREN = 16
BITS = 4
MAX_DEPTH = 15
"""a bucket path has at most this many nibbles (60 of the hash's 64 bits)"""
STORED_DEPTH = 2
"""levels kept up to date (256 buckets at the deepest): beyond, digests are computed from the entries of the
deepest stored bucket (a 256th of them; at depth 4 a node of a thousand-node simulation held 600 KB of buckets
for a thousand claims)"""


def entry_hash(text: str) -> int:
    """The 64-bit hash of an entry's text (BLAKE2b, 8 bytes, big-endian): the same on every node."""
    return int.from_bytes(blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def bucket_of(value: int, depth: int) -> int:
    """The path of the bucket at `depth` that a hash falls in (its leading `depth` nibbles)."""
    return value >> (64 - BITS * depth) if depth else 0


class DigestTree(Generic[Key]):
    """Entries key -> 64-bit hash, with the count and XOR of every bucket (see the module docstring)."""

    __slots__ = ("entries", "_levels", "_index")

    def __init__(self) -> None:
        self.entries: dict[Key, int] = {}
        self._levels: list[dict[int, list[int]]] = [{} for _ in range(STORED_DEPTH + 1)]
        """depth -> bucket path -> [count, xor]"""
        self._index: dict[int, set[Key]] = {}
        """bucket path at STORED_DEPTH -> its keys"""

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def set(self, key: Key, value: int | None) -> bool:
        """Give a key its hash (None: remove it). True when the tree changed."""
        old = self.entries.get(key)
        if old == value:
            return False
        if old is not None:
            self._account(old, -1)
            deepest = bucket_of(old, STORED_DEPTH)
            keys = self._index[deepest]
            keys.discard(key)
            if not keys:
                del self._index[deepest]
        if value is None:
            del self.entries[key]
            return True
        self.entries[key] = value
        self._account(value, +1)
        self._index.setdefault(bucket_of(value, STORED_DEPTH), set()).add(key)
        return True

    def _account(self, value: int, delta: int) -> None:
        for depth, level in enumerate(self._levels):
            path = bucket_of(value, depth)
            cell = level.get(path)
            if cell is None:
                cell = level[path] = [0, 0]
            cell[0] += delta
            cell[1] ^= value
            if cell[0] == 0:
                del level[path]

    def digest(self, depth: int = 0, path: int = 0) -> tuple[int, int]:
        """(count, xor) of one bucket."""
        if depth <= STORED_DEPTH:
            cell = self._levels[depth].get(path)
            return (cell[0], cell[1]) if cell is not None else (0, 0)
        count = xor = 0
        for key in self._keys_deep(depth, path):
            count += 1
            xor ^= self.entries[key]
        return count, xor

    def children(self, depth: int, path: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The counts and XORs of the 16 children of a bucket (`depth` < MAX_DEPTH)."""
        child_depth = depth + 1
        if child_depth <= STORED_DEPTH:
            level = self._levels[child_depth]
            cells = [level.get((path << BITS) | nibble) for nibble in range(CHILDREN)]
            return (tuple(cell[0] if cell else 0 for cell in cells), tuple(cell[1] if cell else 0 for cell in cells))
        counts = [0] * CHILDREN
        xors = [0] * CHILDREN
        for key in self._keys_deep(depth, path):
            value = self.entries[key]
            nibble = bucket_of(value, child_depth) & (CHILDREN - 1)
            counts[nibble] += 1
            xors[nibble] ^= value
        return tuple(counts), tuple(xors)

    def keys(self, depth: int, path: int) -> Iterator[Key]:
        """The keys of the entries in a bucket."""
        if depth >= STORED_DEPTH:
            yield from self._keys_deep(depth, path)
            return
        shift = BITS * (STORED_DEPTH - depth)
        for deepest, keys in list(self._index.items()):
            if deepest >> shift == path:
                yield from list(keys)

    def _keys_deep(self, depth: int, path: int) -> Iterator[Key]:
        """The keys in a bucket at STORED_DEPTH or deeper."""
        keys = self._index.get(path >> (BITS * (depth - STORED_DEPTH)), ())
        for key in list(keys):
            if bucket_of(self.entries[key], depth) == path:
                yield key
