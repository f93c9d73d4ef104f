"""Bounded memory of things already seen, evicting the oldest first.

Used for publication ids (duplicate suppression) and for injections (a
publication reaches the local broker once even when its topic matches
several federated filters). Memory is bounded by `capacity`; an id evicted
and then seen again is treated as new, so the capacity must exceed the
number of publications that can still be in flight in the overlay.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from federation.types import Address

SeenKey = tuple[str, int, int, int, str]
"""(origin host, origin port, epoch, seq, filter): a publication seen on one filter's mesh"""
InjectedKey = tuple[str, int, int, int]
"""(origin host, origin port, epoch, seq): a publication the local broker has"""


def seen_key(origin: Address, epoch: int, seq: int, filter_: str) -> SeenKey:
    """The duplicate cache's key. Flat, of strings and ints only, so the garbage collector stops tracking it
    at its first look: a key holding the `Address` (a named tuple, always tracked) stays tracked, and the
    2 x `duplicate_cache_size` remembered keys of a node, replaced at the publication rate, then made a
    full collection walk them every few thousand publications (40 ms each; 2-3 µs per publication)."""
    return (origin.host, origin.port, epoch, seq, filter_)


def injected_key(origin: Address, epoch: int, seq: int) -> InjectedKey:
    """The injection cache's key; flat, as `seen_key`."""
    return (origin.host, origin.port, epoch, seq)


class SeenCache:
    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, None] = OrderedDict()
        self.evictions = 0

    def add(self, key: Hashable) -> bool:
        """Remember `key`; return True when it was new."""
        if key in self._entries:
            self._entries.move_to_end(key)
            return False
        self._entries[key] = None
        if len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
            self.evictions += 1
        return True

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
