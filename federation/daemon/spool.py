"""The origin's custody spool: QoS 1/2 publications taken from the local broker and not yet delivered everywhere.

Theory of operation
-------------------
The broker forgets a QoS 1/2 publication once the wrapper acknowledges it. So the wrapper acknowledges only
what it can no longer lose: per read pass it gives the publications their ids, appends them to this spool in
one write (`federation.daemon.record_log`: survives a killed process), and only then sends the PUBACKs
(PUBREC/PUBCOMP for QoS 2). An entry stays until the node reports the publication's custody complete (every
next hop acknowledged it, and every hop after them, docs/protocol.md "Custody"), or until a bound drops it
(`due_to_drop`). A restarted wrapper replays the live entries into its node with their original ids, before it
reads anything new from its broker, so receivers recognise what they already have and order is kept.

A wrapper killed after the spool write and before its acknowledgement reached the broker gets those
publications again from its persistent session, flagged DUP, with the same packet id: `redelivery` finds the
recovered entry they match (packet id, topic and payload), and the runtime acknowledges them without
originating them a second time.

Records (msgpack arrays): `["p", epoch, seq, topic, payload, qos, retain, properties, received_at, mid]`
for a publication taken into custody (`mid`, the broker's packet id, came later: a record without it reads
as 0), `["P", epoch, qos, received_at, [[seq, topic, payload, mid], ...]]` for plain publications (not
retained, no properties) taken together (a run read in one pass: one record), `["d", epoch, seq]` for one
released or dropped, `["D", epoch, [seq, ...]]` for several of one epoch
released together (one record for what one acknowledgement released). `received_at` is wall-clock seconds:
a publication's MQTT message expiry counts from it, and so does `max_age`. The file is compacted
(`RecordLog.rewrite`) when dead records outweigh live ones by `COMPACT_RATIO` and it is over
`COMPACT_MIN_BYTES`.

Bounds, each a documented setting: `max_bytes` (payload bytes in custody) and `max_age` (seconds). Over
`high_water` of `max_bytes` the runtime stops reading from its broker (it queues for the wrapper's
persistent session) until the spool drains below `low_water`; a publication is dropped only when it is over
`max_age` or its message expiry, and each drop is counted, logged and reported by the caller.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import groupby
from typing import Any

import msgpack

from federation.daemon.record_log import RecordLog

SPOOL_FILE = "spool.log"
"""the spool's file in the state directory"""
COMPACT_RATIO = 4
"""compact when the file holds more than this many times the bytes of the live entries"""
COMPACT_MIN_BYTES = 16 * 1024 * 1024
"""never compact a file smaller than this. A compaction fsyncs the file and its directory on the loop's thread:
a publication costs 86 bytes of records (64 B payload), so with a floor of 1 MiB a sending wrapper at 13,500 QoS 1
publications/s compacted about once a second, 5% of its time (py-spy, 2026-12-06); 16 MiB makes that about every
14 s at that rate, for up to 15 MiB more disk"""

ENTRY_OVERHEAD = 64
"""bytes an entry counts beyond its topic and payload (against `max_bytes`)"""

SpoolId = tuple[int, int]
"""(epoch, seq) of a publication this wrapper originated"""


@dataclass(slots=True)
class SpooledPublication:
    """One publication in custody. Not frozen (though never changed): a frozen dataclass sets each field through
    `object.__setattr__`, 1.05 against 0.35 µs to make one, and the spool makes one per QoS 1/2 publication."""

    epoch: int
    seq: int
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict[str, Any] | None
    received_at: float
    """wall-clock seconds when the broker handed it over"""
    mid: int = 0
    """the broker's packet id when it handed it over (recognises its DUP redelivery after a restart)"""

    @property
    def key(self) -> SpoolId:
        return (self.epoch, self.seq)

    @property
    def size(self) -> int:
        return len(self.payload) + len(self.topic) + ENTRY_OVERHEAD

    def expires_at(self) -> float | None:
        """Wall-clock seconds at which its MQTT message expiry ends, if it has one."""
        interval = (self.properties or {}).get("message_expiry_interval")
        return None if interval is None else self.received_at + float(interval)

    def encode(self) -> bytes:
        data: bytes = msgpack.packb(["p", self.epoch, self.seq, self.topic, self.payload, self.qos, self.retain,
                                     self.properties, self.received_at, self.mid], use_bin_type=True)
        return data


def _records(publications: Iterable[SpooledPublication]) -> list[bytes]:
    """The records of these, in their order: plain ones that share epoch, QoS and arrival as one `P` record."""
    records: list[bytes] = []
    for key, group in groupby(publications, _run_key):  # a run read together: one record
        if key is None:
            records.extend(publication.encode() for publication in group)
        else:
            epoch, qos, received_at = key
            items = [(publication.seq, publication.topic, publication.payload, publication.mid)
                     for publication in group]
            records.append(msgpack.packb(["P", epoch, qos, received_at, items], use_bin_type=True))
    return records


def _run_key(publication: SpooledPublication) -> tuple[int, int, float] | None:
    """What plain publications taken together share (one `P` record); None for one with its own record."""
    if publication.retain or publication.properties is not None:
        return None
    return publication.epoch, publication.qos, publication.received_at


@dataclass(frozen=True)
class SpoolLimits:
    max_bytes: int = 256 * 1024 * 1024
    max_age: float = 24 * 3600.0
    high_water: float = 0.75
    low_water: float = 0.5


class Spool:
    def __init__(self, log: RecordLog, limits: SpoolLimits = SpoolLimits()) -> None:
        self.log = log
        self.limits = limits
        self.entries: OrderedDict[SpoolId, SpooledPublication] = OrderedDict()
        """live entries, oldest first"""
        self.live_bytes = 0
        self.undecodable = 0
        """records found at open that could not be read (counted, skipped)"""
        for record in log.loaded():
            self._load(record)
        self.recovered_count = len(self.entries)
        self._recovered_by_mid: dict[int, SpoolId] = {entry.mid: entry.key for entry in self.entries.values()
                                                      if entry.mid}
        """packet id -> the recovered entry the previous run took with it (the newest per id)"""
        self.redeliveries_recognised = 0
        """DUP publications the broker sent again that were already in custody (acknowledged, not originated)"""
        self.paused = False
        """over the high-water mark: the runtime does not read from its broker"""
        self._deferred: list[bytes] = []
        """release records a full disk refused: written before the next records (`release`, `add`)"""

    def _load(self, record: bytes) -> None:
        try:
            fields = msgpack.unpackb(record, raw=False)
            kind = fields[0]
            if kind == "p":
                entry = SpooledPublication(int(fields[1]), int(fields[2]), str(fields[3]), bytes(fields[4]),
                                           int(fields[5]), bool(fields[6]), fields[7], float(fields[8]),
                                           int(fields[9]) if len(fields) > 9 else 0)
                self._keep(entry)
            elif kind == "P":
                epoch, qos, received_at = int(fields[1]), int(fields[2]), float(fields[3])
                for seq, topic, payload, mid in fields[4]:
                    self._keep(SpooledPublication(epoch, int(seq), str(topic), bytes(payload), qos, False, None,
                                                  received_at, int(mid)))
            elif kind == "d":
                self._forget((int(fields[1]), int(fields[2])))
            elif kind == "D":
                epoch = int(fields[1])
                for seq in fields[2]:
                    self._forget((epoch, int(seq)))
            else:
                self.undecodable += 1
        except (ValueError, TypeError, IndexError, msgpack.UnpackException):
            self.undecodable += 1

    def _keep(self, entry: SpooledPublication) -> None:
        if entry.key not in self.entries:
            self.entries[entry.key] = entry
            self.live_bytes += entry.size

    def _forget(self, key: SpoolId) -> bool:
        entry = self.entries.pop(key, None)
        if entry is None:
            return False
        self.live_bytes -= entry.size
        return True

    # ------------------------------------------------------------ use

    def recovered(self) -> list[SpooledPublication]:
        """The live entries, oldest first: at start, what a previous run left in custody."""
        return list(self.entries.values())

    def redelivery(self, mid: int, topic: str, payload: bytes) -> SpooledPublication | None:
        """The live recovered entry a DUP publication from the broker repeats (same packet id, topic and
        payload), if any: the previous run spooled it and died before its acknowledgement reached the broker."""
        key = self._recovered_by_mid.get(mid)
        entry = None if key is None else self.entries.get(key)
        if entry is None or entry.topic != topic or entry.payload != payload:
            return None
        del self._recovered_by_mid[mid]  # the broker sends a publication again once per reconnection at most
        self.redeliveries_recognised += 1
        return entry

    def add(self, publications: list[SpooledPublication]) -> None:
        """Take publications into custody: durable when this returns (then acknowledge them to the broker)."""
        if not publications:
            return
        self.log.append([*self._deferred, *_records(publications)])  # OSError (a full disk): none of it kept
        self._deferred = []
        entries, added = self.entries, 0
        for publication in publications:  # `_keep` each, the byte count updated once
            key = (publication.epoch, publication.seq)
            if key not in entries:
                entries[key] = publication
                added += publication.size
        self.live_bytes += added
        self._update_pause()

    def release(self, keys: Iterable[SpoolId]) -> int:
        """Custody complete (or the publication dropped): forget these; returns how many were held."""
        entries, released, freed = self.entries, [], 0
        for key in keys:  # `_forget` each, the byte count updated once
            entry = entries.pop(key, None)
            if entry is not None:
                released.append(key)
                freed += entry.size
        self.live_bytes -= freed
        if released:
            by_epoch: dict[int, list[int]] = {}
            for epoch, seq in released:
                seqs = by_epoch.get(epoch)
                if seqs is None:
                    by_epoch[epoch] = [seq]
                else:
                    seqs.append(seq)
            records = [msgpack.packb(["d", epoch, seqs[0]] if len(seqs) == 1 else ["D", epoch, seqs])
                       for epoch, seqs in by_epoch.items()]
            self._update_pause()
            self.write_releases(records)
        return len(released)

    def write_releases(self, records: list[bytes] | None = None) -> bool:
        """Write release records (and those a full disk refused before): False when the disk refuses them again
        (kept for the next try: forgetting them would only make a restart send those publications once more)."""
        pending = [*self._deferred, *(records or [])]
        if not pending:
            return True
        try:
            self.log.append(pending)
        except OSError:
            self._deferred = pending
            return False
        self._deferred = []
        self._maybe_compact()
        return True

    @property
    def releases_unwritten(self) -> int:
        return len(self._deferred)

    def due_to_drop(self, now_wall: float) -> list[tuple[SpooledPublication, str]]:
        """Entries over `max_age` or past their message expiry, with the reason (the caller drops and reports
        them, then calls `release`)."""
        found: list[tuple[SpooledPublication, str]] = []
        horizon = now_wall - self.limits.max_age
        for entry in self.entries.values():
            if entry.received_at < horizon:
                found.append((entry, "spool_age"))
                continue
            expires = entry.expires_at()
            if expires is not None and expires <= now_wall:
                found.append((entry, "spool_expired"))
        return found

    def _update_pause(self) -> None:
        limit = self.limits.max_bytes
        if self.paused:
            self.paused = self.live_bytes > limit * self.limits.low_water
        else:
            self.paused = self.live_bytes >= limit * self.limits.high_water

    def _maybe_compact(self) -> None:
        size = self.log.size_bytes
        if size >= COMPACT_MIN_BYTES and size > COMPACT_RATIO * max(self.live_bytes, 1):
            # No room for the compacted copy (a full disk): the log stays as it is, compacted at a later release.
            with contextlib.suppress(OSError):
                self.log.rewrite(_records(self.entries.values()))

    def status(self) -> dict[str, Any]:
        oldest = next(iter(self.entries.values()), None)
        return {"publications": len(self.entries), "bytes": self.live_bytes, "max_bytes": self.limits.max_bytes,
                "paused": self.paused, "file_bytes": self.log.size_bytes, "recovered": self.recovered_count,
                "undecodable": self.undecodable,
                "redeliveries_recognised": self.redeliveries_recognised,
                "oldest_received_at": None if oldest is None else round(oldest.received_at, 3)}
