"""Decode each distinct control datagram, and each distinct link-state record, once per simulation.

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

Records go further. A `fd` or `tu` that one node forwards differs from what
the next node forwards (the sender, the bundle's mix), but each record in it
is the same bytes at every node at the same distance from its origin: the
flood of one record version has a few distinct encodings, received
thousands of times at 1,000 nodes. So a `fd` or `tu` that is not in the
packet cache is walked with msgpack's streaming reader, which finds where
each record's bytes start and end without building them; a record whose
bytes were decoded before is taken from a second cache, keyed by those bytes
and `max_neighbours`, and only the others are decoded (`wire.record_of`,
the decoder's own check). That path gives a packet only when the datagram is
exactly what `wire.decode` accepts (the same size limit, one msgpack value
with nothing after it, the type, the version, a valid sender, four fields,
valid records: `wire.record_of`); anything else, or anything it cannot tell, goes to
`wire.decode`, which decodes it or names the fault, as it always did.

Only control packets are cached; `tm` (publications) are decoded per node as
in the daemon, so the data path the simulator measures is the real one. The
decoded objects are frozen, so sharing them between nodes is safe.
"""

from __future__ import annotations

import msgpack

from federation.protocol import wire
from federation.protocol.types import Address, BrokerId
from federation.protocol.wire import DATA_TYPES, DecodeError, Packet, packet_type
from federation.protocol.wire_types import Federate, LinkStateRecord, Sender, TopologyUpdate

DEFAULT_CAPACITY = 4096
RECORD_CAPACITY = 1 << 16
"""distinct record encodings kept (two generations of this many)"""

_RECORD_KINDS = (wire.FEDERATE, wire.TOPOLOGY_UPDATE)


class DecodeCache:
    def __init__(self, capacity: int = DEFAULT_CAPACITY, record_capacity: int = RECORD_CAPACITY) -> None:
        if capacity <= 0 or record_capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self.record_capacity = record_capacity
        self._results: dict[tuple[bytes, int, int], Packet | DecodeError] = {}
        self._records: dict[tuple[bytes, int], LinkStateRecord] = {}
        self._older_records: dict[tuple[bytes, int], LinkStateRecord] = {}
        self.hits = 0
        self.misses = 0
        self.record_hits = 0
        self.record_misses = 0

    def __call__(self, data: bytes, max_packet: int, max_neighbours: int) -> Packet:
        """`wire.decode(data, max_packet, max_neighbours)`, from the cache when these bytes were seen."""
        kind = packet_type(data)
        if kind in DATA_TYPES:
            return wire.decode(data, max_packet, max_neighbours)
        key = (data, max_packet, max_neighbours)
        result = self._results.get(key)
        if result is None:
            self.misses += 1
            try:
                packet = self._records_packet(data, max_packet, max_neighbours) if kind in _RECORD_KINDS else None
                result = packet if packet is not None else wire.decode(data, max_packet, max_neighbours)
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

    def _records_packet(self, data: bytes, max_packet: int, max_neighbours: int) -> Packet | None:
        """The `fd` or `tu` in `data` with its records from the record cache, or None when `wire.decode` must
        decide (not exactly a valid packet of the two, as far as this can tell)."""
        if len(data) > max_packet:
            return None
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, use_list=True)
        unpacker.feed(data)
        try:
            if unpacker.read_array_header() != 4:
                return None
            kind = unpacker.unpack()
            version = unpacker.unpack()
            fields = unpacker.unpack()
            if type(kind) is not str or kind not in _RECORD_KINDS or type(version) is not int \
                    or version != wire.PROTOCOL_VERSION:
                return None
            if not (type(fields) is list and len(fields) == 4 and type(fields[0]) is int
                    and 0 <= fields[0] <= wire.MAX_U64 and type(fields[1]) is str and len(fields[1]) <= 255
                    and type(fields[2]) is int and 0 <= fields[2] <= 65535 and type(fields[3]) is int
                    and 0 <= fields[3] <= wire.MAX_EPOCH):
                return None
            sender = Sender(BrokerId(fields[0], Address(fields[1], fields[2])), fields[3])
            if kind == wire.FEDERATE:
                record = self._record(data, unpacker, max_neighbours)
                if record is None or unpacker.tell() != len(data):
                    return None
                return Packet(kind, sender, Federate(record))
            records = []
            for _ in range(unpacker.read_array_header()):
                record = self._record(data, unpacker, max_neighbours)
                if record is None:
                    return None
                records.append(record)
            if unpacker.tell() != len(data):
                return None  # more than one msgpack value
            return Packet(kind, sender, TopologyUpdate(tuple(records)))
        except Exception:  # noqa: BLE001 - not what this path reads: `wire.decode` names the fault
            return None

    def _record(self, data: bytes, unpacker: msgpack.Unpacker, max_neighbours: int) -> LinkStateRecord | None:
        """The record whose bytes come next in `data` (the unpacker moves past them), or None if not valid."""
        start = unpacker.tell()
        unpacker.skip()
        key = (data[start:unpacker.tell()], max_neighbours)
        record = self._records.get(key)
        if record is not None:
            self.record_hits += 1
            return record
        record = self._older_records.pop(key, None)
        if record is None:
            self.record_misses += 1
            try:
                record = wire.record_of(msgpack.unpackb(key[0], raw=False, strict_map_key=True, use_list=True),
                                        max_neighbours)
            except DecodeError:
                return None
        else:
            self.record_hits += 1
        records = self._records
        records[key] = record
        if len(records) >= self.record_capacity:
            self._older_records, self._records = records, {}
        return record
