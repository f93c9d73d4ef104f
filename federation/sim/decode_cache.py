"""Decode each distinct control datagram once per simulation.

Theory of operation
-------------------
A node encodes a packet once and sends the same bytes to each of its
neighbours, so in the simulator every flooded record arrives as identical
bytes at several nodes, and each of them would parse and validate it again.
Strict decoding is a pure function of (bytes, max_packet, max_neighbours),
so its result can be shared: this cache keeps the last `capacity` results
(packets, or the DecodeError) keyed by exactly those three values. Nothing is
weakened: different bytes are decoded from scratch, a rejected datagram is
rejected again with the same reason, and the real daemon does not use the
cache (there identical datagrams from different senders are rare).

Only control packets are cached; `tm` (publications) are decoded per node as
in the daemon, so the data path the simulator measures is the real one. The
decoded objects are frozen, so sharing them between nodes is safe.
"""

from __future__ import annotations

from federation.protocol import wire
from federation.protocol.wire import DATA_TYPES, DecodeError, Packet, packet_type

DEFAULT_CAPACITY = 4096


class DecodeCache:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._results: dict[tuple[bytes, int, int], Packet | DecodeError] = {}
        self.hits = 0
        self.misses = 0

    def __call__(self, data: bytes, max_packet: int, max_neighbours: int) -> Packet:
        """`wire.decode(data, max_packet, max_neighbours)`, from the cache when these bytes were seen."""
        if packet_type(data) in DATA_TYPES:
            return wire.decode(data, max_packet, max_neighbours)
        key = (data, max_packet, max_neighbours)
        result = self._results.get(key)
        if result is None:
            self.misses += 1
            try:
                result = wire.decode(data, max_packet, max_neighbours)
            except DecodeError as error:
                result = error
            results = self._results
            results[key] = result
            if len(results) > self.capacity:
                del results[next(iter(results))]  # the oldest entry (dicts keep insertion order)
        else:
            self.hits += 1
        if isinstance(result, DecodeError):
            raise DecodeError(result.reason, result.detail)
        return result
