"""The receiver's injection journal: what the wrapper has published into its broker at QoS 1/2, and how far.

Theory of operation
-------------------
A remote QoS 1/2 publication reaches a subscriber once the wrapper's broker has taken it: PUBACK for QoS 1;
for QoS 2 the broker answers PUBREC, holds the message until our PUBREL and only then delivers it (Mosquitto
2.0), then answers PUBCOMP. paho keeps this exchange in memory, and the wrapper's broker session (clean
start 0, `broker_session_expiry`) keeps the broker's half across a disconnection: on reconnecting with the
session present paho sends the unfinished ones again with the same packet id and DUP, or the PUBREL of those
past PUBREC, and the broker delivers each once. A wrapper that is killed loses paho's half. This journal is
that half on disk, as an MQTT client with file persistence keeps it, in a `RecordLog`
(`injections.log` in the state directory, durable against a killed process when a write returns):

- `started`, before the PUBLISH packets are queued: one record per injection, or per run of one stream's
  injections, with what a PUBLISH needs to be sent again (publication id, packet id, topic, payload, qos,
  retain, properties), in one write per run;
- `released`, when the first PUBREC of a QoS 2 injection arrives and **before** our PUBREL is written: a
  restarted wrapper then sends the PUBREL again, not the PUBLISH (once the broker has completed a packet id,
  a PUBLISH with it is a new message, delivered again);
- `finished`, after PUBACK / PUBCOMP, a pass's completions in one write: the injection leaves the in-flight
  table and its publication id joins the completed ids (also when the broker refused it: it would refuse a
  copy again).

At start `in_flight()` is what a previous run left unfinished; the adapter hands it to paho under its old
packet ids before connecting (`LeanClient.restore`), so paho sends it again exactly as it would its own, or
publishes it anew (new packet ids, `abandoned` here, then `started` again) when the broker lost the session.
The completed ids of the last `completed_window` injections (the node's `duplicate_cache_size`) are kept
across restarts: an upstream wrapper that never got our acknowledgement sends its copy again after we
restart, and the daemon does not inject what the journal says is done (`is_completed`, counted as
`duplicate_suppressed`; the protocol side will load these into the node's injection cache instead).

Records (msgpack arrays): `["i", mid, host, port, epoch, seq, topic, payload, qos, retain, properties, filter]`
(`["I", host, port, epoch, filter, [[mid, seq, topic, payload, qos, retain, properties], ...]]` for injections
of one stream started together: one record for a run),
`["r", mid]`, `["c", mid]` (finished; `["C", [mid, ...]]` for a pass's completions in one record), `["a", mid]`
(abandoned: forgotten, not completed), and, written only by compaction, `["K", host, port, epoch, [seq, ...],
filter]` (consecutive completed ids of one stream; an older journal's `["k", host, port, epoch, seq, filter]` holds
one). Packet ids are reused (16 bits), so a record
refers to the latest `i` of its packet id before it. The file is rewritten with the live records
(`RecordLog.rewrite`: atomic) when it is over `COMPACT_MIN_BYTES` and `COMPACT_RATIO` times their size.
No fsync per record: a power loss is not covered (the spool's `spool_fsync` will say how for both).

A full disk refuses appends while the injections under way go on. A refused record is kept (`_unwritten`, in
order) and goes first in the next append, so the file never holds a record without those before it: a `c` the
disk refused is not lost, and a restart does not send again what the broker completed (a QoS 2 PUBLISH would
then be a new message). The runtime calls `write_unwritten` every second while the disk is full. Beyond
`UNWRITTEN_MAX_BYTES` the kept records are dropped and the whole file is rewritten from the tables instead
(`compact`), which is as exact; nothing is appended until that worked. Only a wrapper killed, or stopped
while the disk is still full, leaves records unwritten: `close` says how many (an ERROR line); meanwhile
`status()["unwritten"]` counts those waiting.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

import msgpack

from federation.daemon.record_log import RecordLog, RecordLogError
from federation.protocol.types import Address, Injection, PublicationId

log = logging.getLogger("federation.daemon")

JOURNAL_FILE = "injections.log"
"""the journal's file in the state directory"""
COMPACT_RATIO = 4
"""compact when the file holds more than this many times the bytes of the live records"""
COMPACT_MIN_BYTES = 1024 * 1024
"""never compact a file smaller than this"""
COMPLETED_RECORD_BYTES = 40
"""about what one completed id costs in a compacted file (for the compaction estimate)"""
WRITE_ERROR_LOG_INTERVAL = 60.0
"""seconds between log lines about failed journal writes (each one is counted)"""
UNWRITTEN_MAX_BYTES = 16 * 1024 * 1024
"""records the disk refused, kept for the next append, at most (beyond: the file is rewritten from the tables)"""


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One injection the broker has not completed: its packet id, what it is, and whether it is past PUBREC."""

    mid: int
    injection: Injection
    released: bool = False
    """QoS 2 past PUBREC: the broker holds it and waits for our PUBREL"""


def _publication(fields: Sequence[Any]) -> PublicationId:
    return (Address(str(fields[0]), int(fields[1])), int(fields[2]), int(fields[3]))


def _id_fields(publication: PublicationId) -> list[Any]:
    origin, epoch, seq = publication
    return [origin.host, origin.port, epoch, seq]


def _stream_of(item: tuple[PublicationId, str | None]) -> tuple[Address, int, str | None]:
    """(origin, epoch, filter) of a completed id: what a compacted `K` record shares."""
    (origin, epoch, _seq), filter_ = item
    return origin, epoch, filter_


def _encode(kind: str, *fields: Any) -> bytes:
    data: bytes = msgpack.packb([kind, *fields], use_bin_type=True)
    return data


def _started(mid: int, injection: Injection) -> bytes:
    return _encode("i", mid, *_id_fields(injection.publication), injection.topic, injection.payload, injection.qos,
                   injection.retain, injection.properties, injection.filter)


def _run_of(item: tuple[int, Injection]) -> tuple[Address, int, str | None]:
    """(origin, epoch, filter) of a started injection: what the injections of one `I` record share."""
    (origin, epoch, _seq) = item[1].publication
    return origin, epoch, item[1].filter


def _started_records(injections: Sequence[tuple[int, Injection]]) -> list[tuple[bytes, int]]:
    """The records of these, each with how many injections it holds: those of one stream that follow each other
    as one `I` record (a run injected together: one msgpack call, not one each), one alone as its `i`."""
    if len(injections) == 1:
        return [(_started(*injections[0]), 1)]
    records: list[tuple[bytes, int]] = []
    for (origin, epoch, filter_), group in groupby(injections, _run_of):
        stretch = list(group)
        if len(stretch) == 1:
            records.append((_started(*stretch[0]), 1))
            continue
        items = [[mid, injection.publication[2], injection.topic, injection.payload, injection.qos, injection.retain,
                  injection.properties] for mid, injection in stretch]
        records.append((_encode("I", origin.host, origin.port, epoch, filter_, items), len(items)))
    return records


class InjectionJournal:
    """The journal of one wrapper's QoS 1/2 injections (see the module docstring). Used on the loop's thread."""

    def __init__(self, log: RecordLog, completed_window: int) -> None:
        if completed_window < 1:
            raise ValueError(f"completed_window must be >= 1, got {completed_window}")
        self.log = log
        self.completed_window = completed_window
        self._in_flight: dict[int, JournalEntry] = {}
        """mid -> entry, in the order they were started"""
        self._in_flight_ids: dict[PublicationId, int] = {}
        """publication -> the mid of its injection in flight"""
        self._sizes: dict[int, int] = {}
        """mid -> bytes of its `i` record (for the compaction estimate)"""
        self._completed: OrderedDict[PublicationId, str | None] = OrderedDict()
        """publication -> the filter whose stream released it, in the order the broker completed them"""
        self.undecodable = 0
        """records found at open that could not be read (counted, skipped)"""
        self.write_errors = 0
        """appends or compactions that failed (a full disk): the injections go on, unrecorded"""
        self.on_write: Callable[[Exception | None], None] | None = None
        """told after every append: the error that refused it, or None when it was written (the runtime's)"""
        self._error_logged_at = float("-inf")
        self._unwritten: list[bytes] = []
        """records the disk refused, in order: they go first in the next append (see the module docstring)"""
        self._unwritten_bytes = 0
        self._rewrite_due = False
        """the refused records were too many to keep: the file is exact again only once `compact` worked"""
        self.unwritten_at_close = 0
        """records still refused when the journal was closed (a restart may inject their injections again)"""
        self.compactions = 0
        for record in log.loaded():
            self._load(record)
        self.recovered = len(self._in_flight)
        """injections a previous run left unfinished"""

    # ------------------------------------------------------------ reading the file

    def _load(self, record: bytes) -> None:
        try:
            fields = msgpack.unpackb(record, raw=False)
            kind = fields[0]
            if kind == "i":
                mid = int(fields[1])
                properties = fields[10]
                if properties is not None and not isinstance(properties, dict):
                    raise ValueError("properties")
                filter_ = fields[11] if len(fields) > 11 and isinstance(fields[11], str) else None
                injection = Injection(str(fields[6]), bytes(fields[7]), int(fields[8]), bool(fields[9]), properties,
                                      _publication(fields[2:6]), filter_)
                self._start(mid, injection, len(record))
            elif kind == "I":
                origin = Address(str(fields[1]), int(fields[2]))
                epoch = int(fields[3])
                filter_ = fields[4] if isinstance(fields[4], str) else None
                share = len(record) // max(1, len(fields[5]))
                for mid, seq, topic, payload, qos, retain, properties in fields[5]:
                    if properties is not None and not isinstance(properties, dict):
                        raise ValueError("properties")
                    self._start(int(mid), Injection(str(topic), bytes(payload), int(qos), bool(retain), properties,
                                                    (origin, epoch, int(seq)), filter_), share)
            elif kind == "r":
                self._release(int(fields[1]))
            elif kind == "c":
                self._finish(int(fields[1]))
            elif kind == "C":
                for mid in fields[1]:
                    self._finish(int(mid))
            elif kind == "a":
                self._forget(int(fields[1]))
            elif kind == "k":
                filter_ = fields[5] if len(fields) > 5 and isinstance(fields[5], str) else None
                self._complete(_publication(fields[1:5]), filter_)
            elif kind == "K":
                origin = Address(str(fields[1]), int(fields[2]))
                epoch = int(fields[3])
                filter_ = fields[5] if isinstance(fields[5], str) else None
                for seq in fields[4]:
                    self._complete((origin, epoch, int(seq)), filter_)
            else:
                self.undecodable += 1
        except (ValueError, TypeError, IndexError, msgpack.UnpackException):
            self.undecodable += 1

    # ------------------------------------------------------------ the tables

    def _start(self, mid: int, injection: Injection, size: int) -> None:
        self._forget(mid)  # a packet id in use again: the old entry is over
        self._in_flight[mid] = JournalEntry(mid, injection)
        self._in_flight_ids[injection.publication] = mid
        self._sizes[mid] = size

    def _release(self, mid: int) -> bool:
        entry = self._in_flight.get(mid)
        if entry is None or entry.released:
            return False
        self._in_flight[mid] = JournalEntry(mid, entry.injection, True)
        return True

    def _finish(self, mid: int) -> bool:
        entry = self._forget(mid)
        if entry is None:
            return False
        self._complete(entry.injection.publication, entry.injection.filter)
        return True

    def _forget(self, mid: int) -> JournalEntry | None:
        self._sizes.pop(mid, None)
        entry = self._in_flight.pop(mid, None)
        if entry is not None and self._in_flight_ids.get(entry.injection.publication) == mid:
            del self._in_flight_ids[entry.injection.publication]
        return entry

    def _complete(self, publication: PublicationId, filter_: str | None) -> None:
        completed = self._completed
        completed[publication] = filter_
        completed.move_to_end(publication)
        while len(completed) > self.completed_window:
            completed.popitem(last=False)

    # ------------------------------------------------------------ what the adapter tells it

    def in_flight(self) -> list[JournalEntry]:
        """The injections not completed, oldest first: at start, what a previous run left in flight."""
        return list(self._in_flight.values())

    @property
    def has_completed(self) -> bool:
        return bool(self._completed)

    def completed_ids(self) -> list[PublicationId]:
        """The publications the broker completed (within the last `completed_window`), oldest first."""
        return list(self._completed)

    def stream_positions(self) -> dict[tuple[Address, str], tuple[int, int]]:
        """(origin, filter) -> (epoch, seq) of the latest publication of that stream the broker completed or
        has in flight (the journal sends those again itself): where a restarted node's order goes on
        (`Node.restore`). A stream's publications are injected in its order, so the latest is its position."""
        positions: dict[tuple[Address, str], tuple[int, int]] = {}
        entries = [*self._completed.items(),
                   *((entry.injection.publication, entry.injection.filter) for entry in self._in_flight.values())]
        for (origin, epoch, seq), filter_ in entries:
            if filter_ is None:
                continue
            key = (origin, filter_)
            position = positions.get(key)
            if position is None or (epoch, seq) > position:
                positions[key] = (epoch, seq)
        return positions

    def in_flight_publication(self, publication: PublicationId) -> bool:
        """An injection of this publication is in flight (the journal sends it again; it is not made twice)."""
        return publication in self._in_flight_ids

    def is_completed(self, publication: PublicationId) -> bool:
        """The broker completed an injection of this publication (within the last `completed_window`)."""
        return publication in self._completed

    def started(self, injections: Sequence[tuple[int, Injection]]) -> None:
        """(mid, injection) about to be written to the broker: recorded, in one write, before they are."""
        if not injections:
            return
        records = _started_records(injections)
        index = 0
        for record, count in records:
            share = len(record) // count  # for the compaction estimate
            for mid, injection in injections[index:index + count]:
                self._start(mid, injection, share)
            index += count
        self._append([record for record, _ in records])  # after the tables: a rewrite instead of it holds them

    def released(self, mid: int) -> None:
        """The first PUBREC of a QoS 2 injection: recorded before our PUBREL is written."""
        if self._release(mid):
            self._append([_encode("r", mid)])

    def finished(self, mids: Iterable[int]) -> None:
        """The broker completed these (PUBACK, PUBCOMP; also a refusal): one write for them all."""
        done = [mid for mid in mids if self._finish(mid)]
        if done:
            self._append([_encode("c", done[0]) if len(done) == 1 else _encode("C", done)])
            self._maybe_compact()

    def abandoned(self, mids: Iterable[int]) -> None:
        """These packet ids will not be completed (the broker lost the session: published anew, under new ids)."""
        gone = [mid for mid in mids if self._forget(mid) is not None]
        if gone:
            self._append([_encode("a", mid) for mid in gone])
            self._maybe_compact()

    def _append(self, records: list[bytes]) -> None:
        """Write records, after those the disk refused before; a failure (a full disk) is counted and told
        (`on_write`: the runtime then takes no new QoS 1/2 copies until the disk takes writes again,
        federation.daemon.storage), the records are kept for the next append, and the injections under way go
        on: delivery must not stop for what a restart would need."""
        error = self._write(records)
        if self.on_write is not None:
            self.on_write(error)

    def _write(self, records: list[bytes]) -> Exception | None:
        """`records` (the tables already hold what they say) to the file behind the refused ones, or the whole file
        rewritten when those were too many; the error that refused it, None once the file is exact."""
        if self._rewrite_due:
            return self._rewrite()
        pending = [*self._unwritten, *records] if self._unwritten else records
        if not pending:
            return None
        try:
            self.log.append(pending)
        except (OSError, RecordLogError) as error:
            self._write_failed(error)
            self._keep(records)
            return error
        self._unwritten, self._unwritten_bytes = [], 0
        return None

    def _keep(self, records: list[bytes]) -> None:
        """Refused records, for the next append; beyond `UNWRITTEN_MAX_BYTES` the file is to be rewritten."""
        self._unwritten += records
        self._unwritten_bytes += sum(map(len, records))
        if self._unwritten_bytes > UNWRITTEN_MAX_BYTES:
            self._unwritten, self._unwritten_bytes = [], 0
            self._rewrite_due = True

    def _rewrite(self) -> Exception | None:
        """The whole file from the tables (`compact`); the error that refused it, None once it is written."""
        return self.compact()

    @property
    def unwritten(self) -> int:
        """Records the disk refused and the file does not hold yet (-1: too many to keep, a rewrite is due)."""
        return -1 if self._rewrite_due else len(self._unwritten)

    def write_unwritten(self) -> bool:
        """What the disk refused, again (the runtime's retry, once the state directory takes writes); True when the
        file holds everything the tables say."""
        if not self._unwritten and not self._rewrite_due:
            return True
        return self._write([]) is None

    def _write_failed(self, error: Exception) -> None:
        self.write_errors += 1
        if self.on_write is not None:
            return  # the runtime says it, once (federation.daemon.storage)
        now = time.monotonic()
        if now - self._error_logged_at >= WRITE_ERROR_LOG_INTERVAL:
            self._error_logged_at = now
            log.error("cannot write the injection journal %s: %s; injections go on and their records wait to be "
                      "written (a wrapper stopped before then may inject some twice after it starts again: free disk "
                      "space; %d failed writes so far)", self.log.path, error, self.write_errors)

    # ------------------------------------------------------------ compaction

    def live_bytes(self) -> int:
        """About what a compacted file would hold."""
        return sum(self._sizes.values()) + COMPLETED_RECORD_BYTES * len(self._completed)

    def _maybe_compact(self) -> None:
        size = self.log.size_bytes
        if size >= COMPACT_MIN_BYTES and size > COMPACT_RATIO * max(self.live_bytes(), 1):
            self.compact()

    def compact(self) -> OSError | None:
        """Rewrite the file with the live records only (atomically); the error that refused it, if one did."""
        records = []
        for (origin, epoch, filter_), completed in groupby(self._completed.items(), _stream_of):
            # consecutive completed ids of one stream: one record
            seqs = [seq for (_, _, seq), _ in completed]
            records.append(_encode("K", origin.host, origin.port, epoch, seqs, filter_))
        for entry in self._in_flight.values():
            records.append(_started(entry.mid, entry.injection))
            if entry.released:
                records.append(_encode("r", entry.mid))
        try:
            self.log.rewrite(records)
        except OSError as error:
            self._write_failed(error)
            return error
        self.compactions += 1
        # The file now holds exactly the tables: what the disk had refused is in it.
        self._unwritten, self._unwritten_bytes, self._rewrite_due = [], 0, False
        return None

    def status(self) -> dict[str, Any]:
        return {"in_flight": len(self._in_flight), "completed_ids": len(self._completed),
                "completed_window": self.completed_window, "file_bytes": self.log.size_bytes,
                "recovered": self.recovered, "undecodable": self.undecodable, "compactions": self.compactions,
                "write_errors": self.write_errors, "unwritten": self.unwritten,
                "unwritten_at_close": self.unwritten_at_close}

    def close(self) -> None:
        """Close the file, after a last try at what the disk refused; what is still refused is said and counted."""
        if not self.write_unwritten():
            self.unwritten_at_close = self.unwritten
            log.error("the injection journal %s lacks %s records the full disk refused: the next start may send "
                      "again injections the broker completed in this run (a QoS 2 one then arrives twice); free "
                      "space in the state directory before starting the wrapper again", self.log.path,
                      "its latest" if self._rewrite_due else str(len(self._unwritten)))
        self.log.close()
