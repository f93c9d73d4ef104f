"""Reassembly of fragmented packets, with a deadline and a memory cap.

Theory of operation: the envelope splits a protocol packet larger than one
datagram into `count` fragments of one message (identified per sender and
epoch by a 32-bit message id). The receiver keeps a partial message per
(sender, epoch, message id) until every index has arrived, then joins the
pieces in index order and checks the length against the declared total.

Everything here is bounded, because a sender (or a key holder pretending to
be many senders) could otherwise make the receiver hold fragments forever:

- a message may declare at most `max_message` bytes (`fragment_invalid`);
- a partial message lives `timeout` seconds from its first fragment
  (`reassembly_timeout`, checked on every fragment and by `expire`);
- all partial messages together hold at most `memory` bytes, charged by the
  bytes actually received plus a fixed overhead per fragment; beyond it the
  oldest partial messages are evicted (`reassembly_evicted`);
- one sender holds at most `per_sender` partial messages; its oldest is
  evicted first.

Fragments that contradict their message (another count or total, an index
out of range, more bytes than declared) drop the whole message
(`fragment_invalid`): an honest sender never sends them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from federation.protocol.types import Address

REASSEMBLY_TIMEOUT = "reassembly_timeout"
REASSEMBLY_EVICTED = "reassembly_evicted"
FRAGMENT_INVALID = "fragment_invalid"

FRAGMENT_OVERHEAD = 64
"""bytes charged per stored fragment on top of its length (Python object overhead, roughly)"""

MessageKey = tuple[str, int, int]
"""(sender identity, sender epoch, message id)"""


@dataclass
class Partial:
    count: int
    total: int
    started: float
    source: Address
    pieces: dict[int, bytes] = field(default_factory=dict)
    received: int = 0
    """bytes of the pieces held"""

    @property
    def charge(self) -> int:
        return self.received + FRAGMENT_OVERHEAD * len(self.pieces)


@dataclass(frozen=True)
class Dropped:
    """A partial message given up, for the envelope's counters and `packet_dropped` events."""

    reason: str
    detail: str
    source: Address
    size: int


class Reassembler:
    def __init__(self, max_message: int, memory: int, timeout: float, per_sender: int = 32) -> None:
        if memory < 2 * max_message:
            raise ValueError(f"reassembly memory ({memory} bytes) must hold at least two messages of "
                             f"max_message ({max_message} bytes)")
        self.max_message = max_message
        self.memory = memory
        self.timeout = timeout
        self.per_sender = per_sender
        self._partials: OrderedDict[MessageKey, Partial] = OrderedDict()  # oldest first
        self._per_sender: dict[str, int] = {}
        self.used = 0
        self.completed = 0

    def __len__(self) -> int:
        return len(self._partials)

    def add(self, key: MessageKey, index: int, count: int, total: int, piece: bytes, source: Address,
            now: float) -> tuple[bytes | None, list[Dropped]]:
        """Store one fragment; (the whole packet when it completes the message, messages given up)."""
        dropped = self.expire(now)
        if not (count >= 2 and 0 <= index < count and 0 < total <= self.max_message and piece
                and len(piece) <= total and count <= total):
            dropped.append(Dropped(FRAGMENT_INVALID, f"fragment {index}/{count} of {total} bytes "
                                                     f"(limit {self.max_message})", source, len(piece)))
            return None, dropped
        partial = self._partials.get(key)
        if partial is None:
            partial = Partial(count, total, now, source)
            self._partials[key] = partial
            self._per_sender[key[0]] = self._per_sender.get(key[0], 0) + 1
            if self._per_sender[key[0]] > self.per_sender:
                oldest = next(k for k in self._partials if k[0] == key[0])
                dropped.append(self._drop(oldest, REASSEMBLY_EVICTED, "too many partial messages from one sender"))
        if index in partial.pieces and partial.count == count and partial.total == total:
            return None, dropped  # a duplicate (the replay window stops repeats; a buggy sender may not)
        if partial.count != count or partial.total != total or partial.received + len(piece) > total:
            dropped.append(self._drop(key, FRAGMENT_INVALID, f"fragment {index}/{count} of {total} bytes "
                                                             f"contradicts {partial.count} fragments of "
                                                             f"{partial.total} bytes"))
            return None, dropped
        charge = len(piece) + FRAGMENT_OVERHEAD
        while self.used + charge > self.memory:
            victim = next((k for k in self._partials if k != key), None)
            if victim is None:
                dropped.append(self._drop(key, REASSEMBLY_EVICTED, "message larger than the reassembly memory"))
                return None, dropped
            dropped.append(self._drop(victim, REASSEMBLY_EVICTED, "reassembly memory full"))
        partial.pieces[index] = piece
        partial.received += len(piece)
        self.used += charge
        if len(partial.pieces) < partial.count:
            return None, dropped
        self._remove(key)
        if partial.received != partial.total:
            dropped.append(Dropped(FRAGMENT_INVALID, f"{partial.received} bytes received, {partial.total} declared",
                                   source, partial.received))
            return None, dropped
        self.completed += 1
        return b"".join(partial.pieces[i] for i in range(partial.count)), dropped

    def expire(self, now: float) -> list[Dropped]:
        """Give up every partial message older than the timeout."""
        dropped: list[Dropped] = []
        while self._partials:
            key, partial = next(iter(self._partials.items()))
            if now - partial.started < self.timeout:
                break
            dropped.append(self._drop(key, REASSEMBLY_TIMEOUT,
                                      f"{len(partial.pieces)} of {partial.count} fragments after {self.timeout:g} s"))
        return dropped

    def next_deadline(self) -> float | None:
        for partial in self._partials.values():
            return partial.started + self.timeout
        return None

    def _drop(self, key: MessageKey, reason: str, detail: str) -> Dropped:
        partial = self._remove(key)
        return Dropped(reason, detail, partial.source, partial.received)

    def _remove(self, key: MessageKey) -> Partial:
        partial = self._partials.pop(key)
        self.used -= partial.charge
        remaining = self._per_sender[key[0]] - 1
        if remaining:
            self._per_sender[key[0]] = remaining
        else:
            del self._per_sender[key[0]]
        return partial
