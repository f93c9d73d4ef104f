"""Federation key files: parse, check, generate (`federation-wrapper genkey > federation.key`).

Theory of operation: a key file holds one or more keys, one per line, in
hex or base64; blank lines and lines starting with `#` are ignored. The first
key signs what this wrapper sends; every key is accepted on receipt, which
is how a key is rotated without downtime (docs/security.md). A line made
only of hex digits (even count) is read as hex, anything else as base64
(standard or URL-safe, padding optional). Keys have 16 to 64 bytes; 32
random bytes (what `genkey` prints) is the recommended size.

Every mistake raises KeyFileError naming the file and the line, without
ever printing key material. `permission_warning` tells when other users can
read the file: anyone who reads it can forge the whole federation's traffic.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
import stat
import string
from pathlib import Path

from federation.envelope.keys import MAX_KEY_BYTES, MIN_KEY_BYTES

GENERATED_KEY_BYTES = 32
_HEX = frozenset(string.hexdigits)


class KeyFileError(ValueError):
    """The key file is missing, unreadable or holds a bad key; the message names the file and line."""


def generate_key() -> str:
    """A new random key as one line of hex (32 bytes from the OS's CSPRNG)."""
    return secrets.token_hex(GENERATED_KEY_BYTES)


def parse_keys(text: str, where: str) -> tuple[bytes, ...]:
    """The keys of a key file's text, in order; KeyFileError for a bad line, a repeat or no key at all."""
    keys: list[bytes] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key = _decode(line, f"{where}, line {number}")
        if key in keys:
            raise KeyFileError(f"{where}, line {number}: repeats the key of an earlier line; remove it")
        keys.append(key)
    if not keys:
        raise KeyFileError(f"{where}: no key in the file; put a key on one line (`federation-wrapper genkey > FILE`)")
    return tuple(keys)


def _decode(line: str, where: str) -> bytes:
    if len(line) % 2 == 0 and all(character in _HEX for character in line):
        key = bytes.fromhex(line)
    else:
        try:
            key = base64.b64decode(line.replace("-", "+").replace("_", "/") + "=" * (-len(line) % 4),
                                   validate=True)
        except (binascii.Error, ValueError):
            raise KeyFileError(f"{where}: not a key in hex or base64 (the line is not shown: it may be secret)")\
                from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise KeyFileError(f"{where}: a key of {len(key)} bytes; keys have {MIN_KEY_BYTES} to {MAX_KEY_BYTES} "
                           f"bytes (make one with `federation-wrapper genkey`)")
    return key


def read_key_file(path: Path) -> tuple[bytes, ...]:
    """The keys of the file at `path`; KeyFileError with what to do when it cannot be used."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KeyFileError(f"key file {str(path)!r} not found; make one with "
                           f"`federation-wrapper genkey > {path}` and copy it to every wrapper") from None
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise KeyFileError(f"cannot read key file {str(path)!r}: {reason}") from None
    return parse_keys(text, f"key file {path}")


def permission_warning(path: Path) -> str | None:
    """A warning when users other than the owner may read the key file, else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if mode & (stat.S_IRGRP | stat.S_IROTH | stat.S_IWGRP | stat.S_IWOTH):
        return (f"key file {path} can be read or written by other users (mode {stat.S_IMODE(mode):04o}); "
                f"anyone who reads it can forge federation traffic: chmod 600 {path}")
    return None
