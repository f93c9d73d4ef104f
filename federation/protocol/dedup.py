"""Bounded memory of things already seen, forgetting the oldest half at once.

Used for publication ids (duplicate suppression) and for injections (a
publication reaches the local broker once even when its topic matches
several federated filters). Memory is bounded by `capacity`; the last
`capacity // 2` ids are always remembered; an id forgotten and then seen
again is treated as new, so half the capacity must exceed the number of
publications that can still be in flight in the overlay.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from federation.protocol.types import Address

SEQ_BITS = 64
"""a publication's seq is below 2**64 (a msgpack unsigned integer), so `base | seq` never reaches the next base"""


class StreamNumbers:
    """A number for each stream of publications (origin host and port, epoch, and the filter, or None for the
    injection cache's), so that a cache key is one int: `base(...) | seq`.

    Why ints: a tuple key is hashed anew at every lookup (tuples do not keep their hash), 0.3 µs for the five
    fields on this machine, two to three times per cache and publication; and a tuple stays tracked by the
    garbage collector until its first collection, a key holding the `Address` (a named tuple) for good, so
    full collections walked the 2 x `duplicate_cache_size` keys of a node (40 ms each). An int is hashed for
    nothing and never tracked, and a run of publications (`tb`) looks its stream up once.

    Bounded as `SeenCache`: two generations of `capacity // 2` streams; a stream forgotten (more than that
    many others used since) gets a new number, and the ids remembered under its old one are not recognised
    again, so the capacity must exceed the streams in use at once (origins x filters)."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self._generation = max(1, capacity // 2)
        self._newer: dict[tuple[str, int, int, str | None], int] = {}
        self._older: dict[tuple[str, int, int, str | None], int] = {}
        self._next = 0

    def base(self, host: str, port: int, epoch: int, filter_: str | None) -> int:
        """The stream's number shifted past the seq: a publication's key is `base | seq`."""
        stream = (host, port, epoch, filter_)
        base = self._newer.get(stream)
        if base is None:
            base = self._older.get(stream)
            if base is None:
                self._next += 1
                base = self._next << SEQ_BITS
            self._newer[stream] = base
            if len(self._newer) >= self._generation:
                self._older, self._newer = self._newer, {}
        return base

    def __len__(self) -> int:
        return len(self._newer) + len(self._older.keys() - self._newer.keys())


class StreamBases(dict[str, int]):
    """filter -> `StreamNumbers.base` of one origin epoch's stream on that filter, looked up once per filter: for
    the publications of a run, whose seen-cache keys are then `bases[filter_] | seq`."""

    def __init__(self, streams: StreamNumbers, origin: Address, epoch: int) -> None:
        super().__init__()
        self._streams, self._origin, self._epoch = streams, origin, epoch

    def __missing__(self, filter_: str) -> int:
        base = self[filter_] = self._streams.base(self._origin.host, self._origin.port, self._epoch, filter_)
        return base


def seen_key(streams: StreamNumbers, origin: Address, epoch: int, seq: int, filter_: str) -> int:
    """The duplicate cache's key for a publication on one filter's mesh."""
    return streams.base(origin.host, origin.port, epoch, filter_) | seq


def injected_key(streams: StreamNumbers, origin: Address, epoch: int, seq: int) -> int:
    """The injection cache's key for a publication (whatever its filters)."""
    return streams.base(origin.host, origin.port, epoch, None) | seq


class SeenCache:
    """The keys added lately, in two generations of at most `capacity // 2` each: a key is looked up in both
    and added to the newer; when the newer is full, the older is forgotten whole and the newer takes its
    place. So every one of the last `capacity // 2` keys is remembered, at most `capacity` are, and a key
    seen again is carried into the newer generation (as a least-recently-used cache would keep it).

    Why not an LRU (an OrderedDict, one eviction per addition): deleting one key per addition fills the
    table with deleted slots that every later lookup steps over, and profiles of a wrapper at full rate
    showed the two caches at a quarter of its CPU; two sets that are only ever added to and dropped whole
    cost a few set operations per key."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._generation = max(1, capacity // 2)
        self._newer: set[Hashable] = set()
        self._older: set[Hashable] = set()
        self.evictions = 0
        """keys forgotten (the older generation's, each time it is dropped)"""

    def add(self, key: Hashable) -> bool:
        """Remember `key`; return True when it was new."""
        newer = self._newer
        if key in newer:
            return False
        known = key in self._older
        newer.add(key)
        if len(newer) >= self._generation:
            self.evictions += len(self._older - newer)
            self._older, self._newer = newer, set()
        return not known

    def add_all(self, keys: list[Hashable]) -> None:
        """`add` each of `keys`, in order (a run of publications; what `add` would return is not wanted): one set
        operation when the newer generation does not fill meanwhile."""
        newer = self._newer
        if len(newer) + len(keys) < self._generation:
            newer.update(keys)  # no generation change on the way: the same sets as adding one at a time
            return
        add = self.add
        for key in keys:
            add(key)

    def all_new(self, keys: list[Hashable]) -> set[Hashable] | None:
        """`keys` as a set if every one is new (none known, none twice) and adding them fills no generation, so
        that `add` one at a time would return True for each; else None. Nothing changes (`take_new` adds them)."""
        fresh = set(keys)
        newer = self._newer
        if len(fresh) == len(keys) and len(newer) + len(fresh) < self._generation \
                and newer.isdisjoint(fresh) and self._older.isdisjoint(fresh):
            return fresh
        return None

    def take_new(self, fresh: set[Hashable]) -> None:
        """Add what `all_new` returned, the cache unchanged since: what `add` one at a time would leave."""
        self._newer |= fresh

    def add_if_all_new(self, keys: list[Hashable]) -> bool:
        """Add `keys` and return True if `all_new` says they are; else change nothing and return False (the caller
        takes them one at a time)."""
        fresh = self.all_new(keys)
        if fresh is None:
            return False
        self.take_new(fresh)
        return True

    def __contains__(self, key: Hashable) -> bool:
        return key in self._newer or key in self._older

    def discard(self, key: Hashable) -> None:
        """Forget `key` (a copy taken and then given back: its next arrival is new again)."""
        self._newer.discard(key)
        self._older.discard(key)

    def __len__(self) -> int:
        return len(self._newer) + len(self._older - self._newer)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._newer | self._older)
