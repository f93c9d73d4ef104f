"""Link-state records as a table stores them: immutable, hashed for the digest, shared where nodes share a process.

A table holds one record per member of the federation, so the
whole federation holds N^2; in the simulator, where N nodes share one
process, that is most of the memory. So what a node stores per record is
split: a `StoredRecord` is the immutable part (the record with the distance
it travelled, the neighbours it lists, its digest bucket and hash, its
encoded size), and the node's own clock for it (`received_at`) lives in a
dict beside it. A `StoredRecord` depends on the record only, so a
`RecordPool` given to the table (the simulator gives one to every node)
hands every node the same object for equal records, with canonical
addresses inside; a node alone (the daemon) makes its own (`StoredRecord`).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable

from federation.protocol.types import Address, BrokerId
from federation.protocol.wire import DIGEST_BUCKETS, FLAG_LEAVING, LinkStateRecord, record_size


def entry_hash(address: Address, epoch: int, seq: int) -> int:
    """The 64-bit hash of one record version in a digest (docs/protocol.md, "Anti-entropy")."""
    text = f"{address.host}|{address.port}|{epoch}|{seq}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


@functools.lru_cache(maxsize=65536)
def bucket_of(address: Address) -> int:
    """The digest bucket of an origin: depends on the address only, so every version lands in the same one."""
    text = f"{address.host}|{address.port}".encode()
    return hashlib.blake2b(text, digest_size=8).digest()[0] % DIGEST_BUCKETS


class StoredRecord:
    """One version of a record as a table stores it: the record, with the distance it travelled to this node,
    and what is derived from it. Immutable (the hash and the size are computed on first use and never change
    after), so the nodes of one process may share it (`RecordPool`); the node's clock for the record is the
    table's `received_at`."""

    __slots__ = ("record", "listed", "bucket", "digest_hash", "encoded_size")

    def __init__(self, record: LinkStateRecord) -> None:
        self.record = record
        """distance is the hop count from the origin to this node"""
        self.listed: frozenset[Address] = frozenset() if record.flags & FLAG_LEAVING else frozenset(record.neighbours)
        """the neighbours the record lists (none when leaving), for the two-way check"""
        self.bucket = bucket_of(record.origin.address)
        self.digest_hash: int | None = None
        """`entry_hash` of this version, computed when a digest first needs it"""
        self.encoded_size: int | None = None
        """`wire.record_size` of the record, computed when a bundle first needs it"""

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


MakeStored = Callable[[LinkStateRecord, int], StoredRecord]
"""what a table stores a record as, given the record received and the distance it travelled to this node:
`stored_record`, or a `RecordPool` shared by the nodes of a process"""


def stored_record(record: LinkStateRecord, distance: int) -> StoredRecord:
    """A table's own `StoredRecord` of `record` with `distance` (the default `MakeStored`)."""
    return StoredRecord(_with_distance(record, distance))


class RecordPool:
    """One `StoredRecord` per distinct record, shared by every table that is given the pool (the simulator's
    nodes), with one `Address` object per address inside. Equal records (same origin, version, distance and
    neighbours) are interchangeable, so sharing changes nothing a node computes; it saves a copy per node.
    Bounded: two generations of `capacity` entries each; a record whose entry was forgotten is made again
    (a second copy, nothing worse)."""

    def __init__(self, capacity: int = 1 << 18) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._current: dict[LinkStateRecord, StoredRecord] = {}
        self._previous: dict[LinkStateRecord, StoredRecord] = {}
        self._received: dict[tuple[int, int], tuple[LinkStateRecord, StoredRecord]] = {}
        """(id of a record object received, distance) -> (that object, kept alive here so its id stays its own,
        and what it is stored as): the decode cache hands the nodes one object per distinct record, so most
        lookups need no hash of the record"""
        self._addresses: dict[Address, Address] = {}
        self.made = 0
        self.shared = 0

    def __call__(self, record: LinkStateRecord, distance: int) -> StoredRecord:
        received = self._received
        key = (id(record), distance)
        known = received.get(key)
        if known is not None and known[0] is record:
            self.shared += 1
            return known[1]
        stored = self._by_value(_with_distance(record, distance))
        if len(received) >= self.capacity:
            received.clear()
        received[key] = (record, stored)
        return stored

    def _by_value(self, record: LinkStateRecord) -> StoredRecord:
        current = self._current
        stored = current.get(record)
        if stored is not None:
            self.shared += 1
            return stored
        stored = self._previous.pop(record, None)
        if stored is None:
            self.made += 1
            stored = StoredRecord(self._canonical(record))
        else:
            self.shared += 1
        current[record] = stored
        if len(current) >= self.capacity:
            self._previous, self._current = current, {}
            if len(self._addresses) >= self.capacity:
                self._addresses = {}
        return stored

    def _canonical(self, record: LinkStateRecord) -> LinkStateRecord:
        addresses = self._addresses
        origin = record.origin
        address = addresses.setdefault(origin.address, origin.address)
        neighbours = tuple([addresses.setdefault(a, a) for a in record.neighbours])
        return LinkStateRecord(BrokerId(origin.vid, address), record.epoch, record.seq, record.distance,
                               record.flags, neighbours)


def _with_distance(record: LinkStateRecord, distance: int) -> LinkStateRecord:
    if record.distance == distance:
        return record
    return LinkStateRecord(record.origin, record.epoch, record.seq, distance, record.flags, record.neighbours)
