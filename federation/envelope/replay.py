"""Replay protection for the datagram envelope: one sliding window per sender, bounded sender table; and the
first packets sent to a peer whose epoch was not known yet, kept to be sent again once it is (`FirstContact`).

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

The windows live in memory, so they protect a receiver only within one of
its lives. What protects it across its own restarts is the *receiver
epoch* every datagram carries (`PeerEpochs`): the receiver's envelope epoch
as the sender last learned it from the receiver's own datagrams. A receiver
delivers only datagrams stamped with its current epoch, and its epoch is
strictly greater at every start; so a datagram captured before a restart
names an older epoch and is refused after it (`receiver_epoch`), although
the new life's windows are empty. A sender learns the epoch from the
header of any authentic datagram of the receiver (it needs none of its
content), so after a restart one datagram each way re-anchors a pair of
wrappers: the restarted one's first hellos are refused by the others, but
teach them its epoch (and the envelope sends them again once the answers
teach it theirs: datagrams.FirstContact). Nothing is delivered without the
stamp, not even a hello: a replayed old hello therefore does nothing either.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any

from federation.protocol.types import Address

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


class PeerEpochs:
    """Destination -> the receiver epoch to stamp on datagrams sent there (0: not known yet).

    The stamp for address D is, in this order:

    1. the newest epoch in the sender table of the sender *named* D (a wrapper names itself by its
       announced address, which is where its neighbours send: the usual case). Only datagrams of that
       name can move it, so an authentic datagram of another wrapper (a key holder's, or one re-sent by
       an attacker from D's address) changes nothing;
    2. else (a wrapper behind NAT: it names itself otherwise than the address its datagrams come from)
       the newest epoch of the sender *bound* to D: the name of the last datagram from D that carried
       our current epoch (so produced for this life of ours, never a capture of an earlier one);
    3. else the sender epoch of the last authentic datagram *heard* from D, anchored or not: what a pair
       of wrappers that just (re)started bootstraps from.

    Each map holds at most `capacity` addresses, the oldest entry forgotten first.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"peer epoch capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._bound: dict[Address, str] = {}
        self._heard: dict[Address, int] = {}

    def heard(self, source: Address, sender: str, epoch: int, anchored: bool) -> None:
        """An authentic datagram from `source`, of `sender` at `epoch`; `anchored`: it carried our epoch."""
        heard = self._heard
        if heard.get(source) != epoch:
            heard[source] = epoch
            if len(heard) > self.capacity:
                del heard[next(iter(heard))]
        if anchored:
            bound = self._bound
            if bound.get(source) != sender:
                bound[source] = sender
                if len(bound) > self.capacity:
                    del bound[next(iter(bound))]

    def stamp(self, to: Address, senders: SenderTable) -> int:
        state = senders.get(str(to))
        if state is not None:
            return state.window.epoch
        name = self._bound.get(to)
        if name is not None:
            state = senders.get(name)
            if state is not None:
                return state.window.epoch
        return self._heard.get(to, 0)

    def set(self, to: Address, epoch: int) -> None:
        """Stamp `epoch` on what goes to `to` until it is heard otherwise (a sender named `to`, once heard,
        takes precedence: rule 1)."""
        self._bound.pop(to, None)
        self._heard.pop(to, None)
        self._heard[to] = epoch
        if len(self._heard) > self.capacity:
            del self._heard[next(iter(self._heard))]

    def __len__(self) -> int:
        return len(self._heard.keys() | self._bound.keys())


class FirstContact:
    """Packets sent to peers whose epoch was not known yet (stamped 0, so certainly refused there), kept to be sent
    again, stamped right, as soon as the peer's first datagram teaches its epoch. Without it, every link would come
    up a hello interval late after a start: each side's first hello is refused. Only packets at most `window`
    seconds old go again, at most PACKETS and BYTES per peer, for at most `capacity` peers (the oldest forgotten);
    each goes again once. Nothing else is resent: a packet sent with a stale non-zero stamp (the peer restarted
    meanwhile) is lost like any lost datagram (hellos repeat, QoS 1/2 publications are retransmitted)."""

    PACKETS = 16
    BYTES = 64 * 1024

    def __init__(self, capacity: int, window: float) -> None:
        self.capacity = capacity
        self.window = window
        self._kept: dict[Address, deque[tuple[float, bytes]]] = {}

    def __contains__(self, to: object) -> bool:
        return to in self._kept

    def keep(self, to: Address, packets: list[bytes], now: float) -> None:
        kept = self._kept.get(to)
        if kept is None:
            kept = self._kept[to] = deque()
            if len(self._kept) > self.capacity:
                del self._kept[next(iter(self._kept))]
        kept.extend((now, packet) for packet in packets)
        size = sum(len(packet) for _, packet in kept)
        while kept and (len(kept) > self.PACKETS or size > self.BYTES):
            size -= len(kept.popleft()[1])

    def release(self, to: Address, now: float) -> list[bytes]:
        kept = self._kept.pop(to, ())
        return [packet for sent_at, packet in kept if now - sent_at <= self.window]
