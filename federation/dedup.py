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
