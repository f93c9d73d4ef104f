"""The envelope's configuration: its keys, encryption and limits, and the error a wrong one raises.

`EnvelopeConfig.from_settings` builds it from the protocol settings
(federation.protocol.settings) a node holds; `validate` names the field
and the fix of a wrong value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from federation.protocol.settings import Settings

ENCRYPTION_NONE = "none"
ENCRYPTION_CHACHA = "chacha20-poly1305"
ENCRYPTIONS = (ENCRYPTION_NONE, ENCRYPTION_CHACHA)


class EnvelopeConfigError(ValueError):
    """A bad envelope configuration (a key of the wrong size, encryption without a key...)."""


@dataclass(frozen=True)
class EnvelopeConfig:
    """Limits and keys of one envelope; `from_settings` builds it from the protocol settings."""

    keys: tuple[bytes, ...] = ()
    """federation keys: the first signs, all are accepted; empty: open mode"""
    encryption: str = ENCRYPTION_NONE
    """`none` or `chacha20-poly1305` (needs a key)"""
    max_datagram: int = 1400
    """bytes: largest datagram sent (batches and fragments stay under it)"""
    max_packet: int = 327680
    """bytes: largest protocol packet sent or reassembled"""
    reassembly_timeout: float = 5.0
    """seconds a partial message waits for its missing fragments"""
    reassembly_memory: int = 8 * 1024 * 1024
    """bytes of memory partial messages hold at most, all senders together (pieces and bookkeeping, as charged
    by federation.envelope.reassembly)"""
    max_senders: int = 256
    """senders whose replay windows are kept (least recently heard evicted)"""
    replay_window: int = 1024
    """sequence numbers below the highest one still accepted once (reordering tolerance)"""
    bulk_threshold: int = 0
    """bytes: a packet above it goes as a bulk transfer (federation.envelope.transfer); 0: never (fragments)"""
    transfer_memory: int = 64 * 1024 * 1024
    """bytes held at most by bulk transfers received, all senders together (and by those queued to send)"""
    transfer_timeout: float = 30.0
    """seconds without progress after which a bulk transfer is given up"""
    receive_window: int = 1024 * 1024
    """bytes of the socket's receive buffer that bulk transfers may fill (the daemon sets what the kernel gave)"""
    resend_window: float = 2.0
    """seconds: packets sent to a peer before its epoch was known (refused there) are sent again when the peer's
    first datagram teaches it, if at most this old"""

    @classmethod
    def from_settings(cls, settings: Settings, keys: Sequence[bytes] = (),
                      encryption: str = ENCRYPTION_NONE) -> EnvelopeConfig:
        """`settings` as a `Node` holds them: `max_datagram` 0 (choose) is made a size by the node."""
        if not settings.max_datagram:
            raise EnvelopeConfigError("max_datagram 0 (choose) is not a size yet: pass the settings the Node holds "
                                      "(`Settings.with_datagram_for` made it one)")
        return cls(tuple(keys), encryption, settings.max_datagram, settings.max_packet,
                   settings.reassembly_timeout, settings.reassembly_memory, max(64, 4 * settings.max_neighbours),
                   bulk_threshold=settings.bulk_threshold, transfer_memory=settings.transfer_memory,
                   transfer_timeout=settings.transfer_timeout,
                   resend_window=max(1.0, 2 * settings.hello_interval))

    @property
    def max_fragmented(self) -> int:
        """bytes: the largest packet sent (and reassembled) as plain fragments; above it, bulk transfers"""
        return min(self.max_packet, self.bulk_threshold) if self.bulk_threshold else self.max_packet

    def validate(self) -> None:
        if self.encryption not in ENCRYPTIONS:
            raise EnvelopeConfigError(f"encryption: expected one of {', '.join(ENCRYPTIONS)}, "
                                      f"got {self.encryption!r}")
        if self.encryption != ENCRYPTION_NONE and not self.keys:
            raise EnvelopeConfigError(f"encryption {self.encryption} needs a federation key: give --key-file "
                                      f"(make a key with `federation-wrapper genkey > federation.key`)")
        if not 256 <= self.max_datagram <= 65507:
            raise EnvelopeConfigError(f"max_datagram: expected 256 to 65507 bytes, got {self.max_datagram}")
        if self.reassembly_timeout <= 0:
            raise EnvelopeConfigError(f"reassembly_timeout: must be positive, got {self.reassembly_timeout}")
        if self.reassembly_memory < 2 * self.max_fragmented:
            raise EnvelopeConfigError(f"reassembly_memory ({self.reassembly_memory}) must hold two fragmented "
                                      f"packets of {self.max_fragmented} bytes (max_packet, bulk_threshold)")
        if self.bulk_threshold and self.transfer_memory < self.max_packet + 65536:
            raise EnvelopeConfigError(f"transfer_memory ({self.transfer_memory}) must hold a packet of max_packet "
                                      f"({self.max_packet}) and 64 KiB more")
