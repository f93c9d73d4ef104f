"""An append-only file of records that survives a killed process: the wrapper's durable memory.

Theory of operation
-------------------
The wrapper keeps a few things across a crash that it must not lose or repeat: the QoS 1/2 publications it
has taken from its broker and not yet handed on (the custody spool), the injections its broker has not
completed, what it has already injected. Each is a stream of small records written as things happen and
read back once, at start. A `RecordLog` is that stream in one file:

- A record is a 4-byte big-endian length, a 4-byte CRC-32 of the payload, then the payload. `append` writes
  any number of records with **one** `os.write` on a descriptor opened with O_APPEND: once it returns, the
  bytes are in the kernel's page cache and survive the process being killed (SIGKILL, an exception, OOM);
  they survive a power loss only with `fsync=True`, which syncs after each append (the caller batches, so
  that is once per read pass, not once per record).
- Reading stops at the first record that is cut short or whose CRC does not match: a crash in the middle of
  a write leaves a torn tail, which is cut off (`torn_bytes` says how much) so the next append starts clean.
  Records after a corrupt one are not trusted either; a torn tail is the only damage a crash can cause.
- The owner decides what is still live. When most of the file is dead, it calls `rewrite` with the live
  records: they go to a temporary file, which is synced and renamed over the log (then the directory is
  synced), so a crash during compaction leaves the old file or the new one, never a mix.

No locking: one wrapper owns its state directory (`federation.daemon.state` holds the lock).
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

HEADER = struct.Struct(">II")
"""payload length, CRC-32 of the payload"""
MAX_RECORD = 64 * 1024 * 1024
"""bytes: a length above this is taken for damage, not a record"""


class RecordLogError(Exception):
    """The log's file cannot be opened, read or written; the message names the file and what to do."""


class RecordLog:
    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        self.path = path
        self.fsync = fsync
        self.torn_bytes = 0
        """bytes cut off the end at open: a record a crash left half written"""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            data = path.read_bytes() if path.exists() else b""
        except OSError as error:
            raise RecordLogError(f"cannot read {path}: {error.strerror}; check the state directory's "
                                 f"permissions (the wrapper's user must own it)") from error
        self._records, good = parse(data)
        self.torn_bytes = len(data) - good
        self._fd = self._open()
        if self.torn_bytes:
            os.ftruncate(self._fd, good)
        self.size_bytes = good

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except OSError as error:
            raise RecordLogError(f"cannot open {self.path} for writing: {error.strerror}") from error

    def loaded(self) -> list[bytes]:
        """The records found at open, oldest first (handed over once; the log keeps no copy)."""
        records, self._records = self._records, []
        return records

    def append(self, payloads: Sequence[bytes]) -> None:
        """Write `payloads` as records, in one write: durable against a killed process when this returns. OSError
        when the file system refuses them (a full disk): then none of them is in the log."""
        if not payloads:
            return
        data = frame(payloads)
        try:
            written = os.write(self._fd, data)
            while written < len(data):  # a regular file takes everything unless the disk is full
                more = os.write(self._fd, data[written:])
                if more == 0:
                    raise OSError(errno.ENOSPC, f"{self.path}: the disk is full")
                written += more
        except OSError:
            # A part written before the disk filled would be a torn record in the middle of the log once later
            # appends succeed, and reading stops at the first one: what was written of this append goes again.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self.size_bytes)
            raise
        self.size_bytes += len(data)
        if self.fsync:
            os.fsync(self._fd)

    def rewrite(self, payloads: Iterable[bytes]) -> None:
        """Replace the whole log with `payloads` (compaction), atomically."""
        temporary = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        data = frame(list(payloads))
        try:
            with open(temporary, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
        except OSError:
            with contextlib.suppress(OSError):
                temporary.unlink()  # a full disk: the half-written copy would only take more of it
            raise
        os.replace(temporary, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        os.close(self._fd)
        self._fd = self._open()
        self.size_bytes = len(data)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def frame(payloads: Sequence[bytes]) -> bytes:
    parts: list[bytes] = []
    for payload in payloads:
        parts.append(HEADER.pack(len(payload), zlib.crc32(payload)))
        parts.append(payload)
    return b"".join(parts)


def parse(data: bytes) -> tuple[list[bytes], int]:
    """The whole records at the start of `data`, and the offset where the good part ends."""
    records: list[bytes] = []
    offset, end = 0, len(data)
    view = memoryview(data)
    while offset + HEADER.size <= end:
        length, crc = HEADER.unpack_from(data, offset)
        start = offset + HEADER.size
        if length > MAX_RECORD or start + length > end:
            break
        payload = bytes(view[start:start + length])
        if zlib.crc32(payload) != crc:
            break
        records.append(payload)
        offset = start + length
    return records, offset
