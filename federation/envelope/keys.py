"""Federation keys: what one key derives (its wire id, its MAC key, its AEAD keys) and the table of the configured ones.

A key is 16 to 64 secret bytes (`federation-wrapper genkey` makes one).
Everything the envelope needs is derived from it with keyed BLAKE2b
(`derive`): a 4-byte id that names the key on the wire, so a receiver
picks the key at once and tells an unknown key from a forgery; a MAC key;
and an AEAD root, from which each sender's epoch gets a ChaCha20-Poly1305
key of its own (its nonces are the envelope's sequence numbers).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from federation.envelope.config import EnvelopeConfigError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

TAG_SIZE = 16
"""bytes of a MAC or AEAD tag"""
MIN_KEY_BYTES = 16
MAX_KEY_BYTES = 64
KDF_PERSON = b"fed-envelope-kdf"
MAC_PERSON = b"fed-envelope-mac"


def derive(secret: bytes, label: bytes, size: int) -> bytes:
    return hashlib.blake2b(label, key=secret, digest_size=size, person=KDF_PERSON).digest()


class FederationKey:
    """One federation key and what is derived from it: its wire id, its MAC key, its AEAD root key."""

    __slots__ = ("key_id", "aead_root", "_mac_base")

    def __init__(self, secret: bytes) -> None:
        if not MIN_KEY_BYTES <= len(secret) <= MAX_KEY_BYTES:
            raise EnvelopeConfigError(f"a federation key must have {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes, "
                                      f"got {len(secret)}; make one with `federation-wrapper genkey`")
        self.key_id = int.from_bytes(derive(secret, b"key id v1", 4), "big")
        self.aead_root = derive(secret, b"aead v1", 32)
        # The keyed state is made once and copied per datagram: cheaper than keying BLAKE2b each time.
        self._mac_base = hashlib.blake2b(key=derive(secret, b"mac v1", 32), digest_size=TAG_SIZE,
                                         person=MAC_PERSON)

    def mac(self, data: bytes) -> bytes:
        hasher = self._mac_base.copy()
        hasher.update(data)
        return hasher.digest()

    def cipher(self, sender: bytes, epoch: int) -> ChaCha20Poly1305:
        """The AEAD of one sender's epoch: nonces are sequence numbers, unique under this key."""
        # Imported here: `cryptography` costs start-up time that wrappers without encryption need not pay.
        from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

        return ChaCha20Poly1305(derive(self.aead_root, b"sender\x00" + sender + epoch.to_bytes(8, "big"), 32))


def nonce(seq: int) -> bytes:
    return b"\x00\x00\x00\x00" + seq.to_bytes(8, "big")


def key_table(secrets: Sequence[bytes]) -> tuple[list[FederationKey], dict[int, FederationKey]]:
    """The keys in order, and by key id; EnvelopeConfigError for a key given twice (or sharing an id)."""
    keys = [FederationKey(secret) for secret in secrets]
    by_id: dict[int, FederationKey] = {}
    for position, key in enumerate(keys):
        if key.key_id in by_id:
            raise EnvelopeConfigError(f"key {position + 1} repeats an earlier key (or shares its id); "
                                      f"remove the duplicate")
        by_id[key.key_id] = key
    return keys, by_id
