"""Replay protection for the datagram envelope: one sliding window per sender, bounded sender table.

Theory of operation: every authenticated datagram carries its sender's
identity (the announced address), the sender's *envelope epoch* (strictly
greater at every restart of the sender) and a per-epoch sequence number
that grows by one per datagram. A receiver remembers, per sender, the
newest epoch it has accepted, the highest sequence number of that epoch,
and a bitmap of which of the `size` numbers below it were seen (the IPsec /
DTLS anti-replay window, RFC 4303 section 3.4.3). A datagram is refused when:

- its epoch is older than the sender's newest (`stale_epoch`): a packet
  captured before the sender restarted can never be replayed after it;
- its number is already marked (`replayed`);
- its number is `size` or more below the highest (`too_old`): the window
  cannot tell whether it was seen, so it is refused.

A newer epoch resets the window: a restarted sender is believed at once.
The window is only checked and moved *after* the datagram's MAC verified
(the envelope calls `check`, verifies, then `commit`), so forged datagrams
can neither consume sequence numbers nor push a sender's epoch forward.

The sender table holds at most `capacity` senders, least recently heard
evicted first (counted). Entries are only created by datagrams that passed
authentication, so only a holder of the federation key can fill it; and a
key holder can forge any packet anyway, so evicting a window gives such an
attacker nothing it did not have.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

STALE_EPOCH = "stale_epoch"
REPLAYED = "replayed"
TOO_OLD = "too_old"


class ReplayWindow:
    """(epoch, sequence) acceptance for one sender: `check` without side effects, then `commit`."""

    __slots__ = ("size", "epoch", "highest", "bitmap", "_mask")

    def __init__(self, size: int, epoch: int, seq: int) -> None:
        if size < 1:
            raise ValueError(f"replay window size must be at least 1, got {size}")
        self.size = size
        self._mask = (1 << size) - 1
        self.epoch = epoch
        self.highest = seq
        self.bitmap = 1  # bit i set: sequence number `highest - i` was seen

    def check(self, epoch: int, seq: int) -> str | None:
        """The reason to refuse (epoch, seq), or None when it is new."""
        if epoch != self.epoch:
            return STALE_EPOCH if epoch < self.epoch else None
        if seq > self.highest:
            return None
        offset = self.highest - seq
        if offset >= self.size:
            return TOO_OLD
        if (self.bitmap >> offset) & 1:
            return REPLAYED
        return None

    def commit(self, epoch: int, seq: int) -> None:
        """Mark (epoch, seq) seen; call only after `check` returned None for it and the MAC verified."""
        if epoch > self.epoch:
            self.epoch, self.highest, self.bitmap = epoch, seq, 1
        elif seq > self.highest:
            shift = seq - self.highest
            self.bitmap = ((self.bitmap << shift) | 1) & self._mask if shift < self.size else 1
            self.highest = seq
        else:
            self.bitmap |= 1 << (self.highest - seq)


class SenderState:
    """What a receiver keeps per sender: its replay window and, in AEAD mode, the cipher of its epoch."""

    __slots__ = ("window", "cipher_epoch", "cipher_key_id", "cipher")

    def __init__(self, window: ReplayWindow) -> None:
        self.window = window
        self.cipher_epoch = -1
        self.cipher_key_id = -1
        self.cipher: Any = None


class SenderTable:
    """Sender identity -> SenderState, at most `capacity` entries, least recently heard evicted."""

    def __init__(self, capacity: int, window_size: int) -> None:
        if capacity < 1:
            raise ValueError(f"sender table capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.window_size = window_size
        self._senders: OrderedDict[str, SenderState] = OrderedDict()
        self.evictions = 0

    def get(self, sender: str) -> SenderState | None:
        return self._senders.get(sender)

    def check(self, sender: str, epoch: int, seq: int) -> str | None:
        state = self._senders.get(sender)
        return None if state is None else state.window.check(epoch, seq)

    def commit(self, sender: str, epoch: int, seq: int) -> SenderState:
        """Mark (epoch, seq) of `sender` seen (creating its entry); the sender becomes most recent."""
        state = self._senders.get(sender)
        if state is None:
            state = SenderState(ReplayWindow(self.window_size, epoch, seq))
            self._senders[sender] = state
            if len(self._senders) > self.capacity:
                self._senders.popitem(last=False)
                self.evictions += 1
        else:
            state.window.commit(epoch, seq)
            self._senders.move_to_end(sender)
        return state

    def __len__(self) -> int:
        return len(self._senders)

    def __contains__(self, sender: object) -> bool:
        return sender in self._senders

    def epochs(self) -> dict[str, int]:
        """sender -> newest accepted epoch, sorted by sender (for status)."""
        return {sender: self._senders[sender].window.epoch for sender in sorted(self._senders)}
