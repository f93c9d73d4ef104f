"""Local event files as logrotate leaves them: compressed generations made readable, unreadable ones refused.

Theory of operation
-------------------
The shipped logrotate file (packaging/logrotate/mqtt-federation) keeps
`events.jsonl`, the uncompressed `events.jsonl.1` and `events.jsonl.N.gz`.
Spark's text reader would decompress a `.gz` by its name, but the job's
own fast path (arrow_blocks.py) reads bytes, and a compressed file read as
text is nothing but corrupt lines: the report would then be built from the
rest of the data, and say so only in a warning. So before anything is read,
every local file is opened here, on the driver:

- a gzip, bzip2 or xz file (known by its first bytes, whatever its name) is
  decompressed into a local directory of the job's, checked to the end of
  its stream, and read from there;
- a file that cannot be read, a damaged or cut compressed stream, another
  compression (zstd, lz4, zip) or binary data (a NUL byte in its first
  64 KiB: no event log holds one) is a problem.

Every problem is collected, and the job stops with all of them named
(`InputError`, exit status 2) instead of reporting on part of the input.
Files Spark reads by URL (hdfs:, s3a:, ...) are left to Spark, which
decompresses `.gz` and `.bz2` by their names.

`order` sorts rotated generations oldest first (`events.jsonl.14.gz` ...
`events.jsonl.1`, `events.jsonl`), so the files are given in the order
their lines were written.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import re
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import IO, cast

PROBE_BYTES = 64 * 1024
"""bytes of a file (decompressed) looked at for binary data"""
CHUNK_BYTES = 1 << 20
Opener = Callable[[str], IO[bytes]]


def _gzip(path: str) -> IO[bytes]:
    return cast(IO[bytes], gzip.open(path, "rb"))  # typeshed: a GzipFile is no IO[bytes]


def _bzip2(path: str) -> IO[bytes]:
    return bz2.open(path, "rb")


def _xz(path: str) -> IO[bytes]:
    return lzma.open(path, "rb")


COMPRESSIONS: dict[bytes, tuple[str, Opener | None]] = {
    b"\x1f\x8b": ("gzip", _gzip),
    b"BZh": ("bzip2", _bzip2),
    b"\xfd7zXZ\x00": ("xz", _xz),
    b"\x28\xb5\x2f\xfd": ("zstd", None),
    b"\x04\x22\x4d\x18": ("lz4", None),
    b"PK\x03\x04": ("zip", None),
}
"""leading bytes -> (name, opener); None: a compression the job does not read"""
DECOMPRESS_HINT = {"zstd": "zstd -d", "lz4": "lz4 -d", "zip": "unzip"}
ROTATED = re.compile(r"^(?P<base>.*?\.jsonl)(?:[.-](?P<generation>\d+))?(?P<compressed>\.(?:gz|bz2|xz))?$")
"""an event log and its rotated generations: events.jsonl, events.jsonl.1, events.jsonl.2.gz; also logrotate's
dateext form events.jsonl-20261207(.gz)"""


class UnreadableInput(ValueError):
    """Some input files cannot be read; the message names every one and why."""


@dataclass
class Prepared:
    """The files to read (decompressed copies in place of compressed ones) and the directory holding the copies."""

    given: list[str]
    paths: list[str]
    decompressed: dict[str, str] = field(default_factory=dict)
    """given file -> its decompressed copy"""
    directory: str | None = None

    def close(self) -> None:
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


def is_event_file(name: str) -> bool:
    """Whether a file name in a directory given as --events is an event log or a rotated generation of one."""
    return ROTATED.match(os.path.basename(name)) is not None


def order(paths: Iterable[str]) -> list[str]:
    """Sorted by name, the generations of one log oldest first (the highest number first, the live file last)."""
    def key(path: str) -> tuple[str, str, int]:
        directory, name = os.path.split(path)
        match = ROTATED.match(name)
        if match is None:
            return directory, name, 0
        generation = match.group("generation")
        # dateext generations count up with time; numbered ones count down (1 is the newest rotated)
        number = int(generation) if generation is not None else 0
        rank = number if generation is not None and len(generation) >= 8 else -number
        return directory, match.group("base"), rank if generation is not None else 1 << 62
    return sorted(paths, key=key)


def prepare(files: list[str], is_local: Callable[[str], bool], directory: str | None = None) -> Prepared:
    """Open every local file: compressed ones decompressed into `directory` (a new temporary directory if None),
    unreadable ones collected. Raises UnreadableInput naming them all (after removing any copy made)."""
    prepared = Prepared(list(files), [])
    problems: list[str] = []
    try:
        for index, path in enumerate(files):
            if not is_local(path):
                prepared.paths.append(path)
                continue
            local = path[len("file:"):] if path.startswith("file:") else path
            try:
                head = _head(local)
                kind, opener = _compression(head)
                if kind is None:
                    _check_text(head, local)
                    prepared.paths.append(path)
                    continue
                if opener is None:
                    raise UnreadableInput(f"compressed with {kind}, which the job does not read: decompress it "
                                          f"first ({DECOMPRESS_HINT.get(kind, kind)})")
                if prepared.directory is None:
                    if directory is not None:
                        os.makedirs(directory, exist_ok=True)
                    prepared.directory = tempfile.mkdtemp(prefix="decompressed-", dir=directory)
                copy = os.path.join(prepared.directory, f"{index:05d}-{_plain_name(local)}")
                _decompress(local, copy, kind, opener)
                prepared.paths.append(copy)
                prepared.decompressed[path] = copy
            except UnreadableInput as problem:
                problems.append(f"{path}: {problem}")
            except OSError as error:
                problems.append(f"{path}: cannot read it ({error.strerror or error})")
        if problems:
            raise UnreadableInput(f"{len(problems)} of {len(files)} event files cannot be read, so no report was "
                                  f"made from the others: " + "; ".join(problems))
    except BaseException:
        prepared.close()
        raise
    return prepared


def _head(path: str) -> bytes:
    if os.path.isdir(path):
        raise UnreadableInput("a directory (give its files, or the directory alone as --events)")
    with open(path, "rb") as source:
        return source.read(PROBE_BYTES)


def _compression(head: bytes) -> tuple[str | None, Opener | None]:
    for magic, (kind, opener) in COMPRESSIONS.items():
        if head.startswith(magic):
            return kind, opener
    return None, None


def _check_text(head: bytes, path: str) -> None:
    if b"\0" in head:
        raise UnreadableInput("binary data, not JSON lines (a compressed file of another kind, or no event log)")


def _plain_name(path: str) -> str:
    name = os.path.basename(path)
    for suffix in (".gz", ".bz2", ".xz"):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


def _decompress(path: str, target: str, kind: str, opener: Opener) -> None:
    """The whole stream into `target`: a cut or damaged stream is an UnreadableInput, never a partial copy."""
    try:
        with opener(path) as source, open(target, "wb") as sink:
            first = True
            while chunk := source.read(CHUNK_BYTES):
                if first:
                    _check_text(chunk[:PROBE_BYTES], path)
                    first = False
                sink.write(chunk)
    except EOFError:
        raise UnreadableInput(f"the {kind} stream is cut short (a file still being compressed, or a partial "
                              f"copy)") from None
    except (gzip.BadGzipFile, zlib.error, lzma.LZMAError) as error:
        raise UnreadableInput(f"damaged {kind} data ({error})") from None
    except OSError as error:
        if error.errno is None:  # bz2 reports damaged data as a bare OSError
            raise UnreadableInput(f"damaged {kind} data ({error})") from None
        raise
