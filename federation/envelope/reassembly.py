"""Reassembly of fragmented packets, with a deadline, a memory cap that counts what is held, and fair shares.

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
- all partial messages together hold at most `memory` bytes, and the bytes
  counted are the memory really held: each piece as the bytes object it is
  (`sys.getsizeof`), the growth of its message's index, and a fixed charge
  per message and per sender for the bookkeeping (objects, keys, the two
  ordered maps), measured with `tracemalloc` (`tests/envelope/test_reassembly.py`
  holds the charge against what `tracemalloc` sees). A flood of one-byte
  fragments costs the attacker the same cap as a flood of full ones;
- fairness between senders (max-min): beyond the cap, the *oldest partial
  message of the sender holding the most bytes* is evicted
  (`reassembly_evicted`). So one sender name that floods can take all the
  memory nobody else needs, but never what another sender holds while it
  holds more than that sender: it evicts its own messages first. A message
  of the largest holder that would need more than it can get is dropped
  itself;
- one sender holds at most `per_sender` partial messages; its oldest is
  evicted first.

Every operation per fragment is O(1) or O(log senders) amortised: the
partial messages are kept oldest first, globally (for the timeout) and per
sender (for its evictions), and the largest holder comes from a max-heap
with lazy deletion. A fragment only marks its sender changed; when room is
needed, the changed senders get a heap entry with their current count
first, then entries that no longer match their sender's count are skipped
(the heap is rebuilt when stale entries outnumber the senders). So the
common case, a packet reassembled without pressure, never touches the heap.

Fragments that contradict their message (another count or total, an index
out of range, more bytes than declared) drop the whole message
(`fragment_invalid`): an honest sender never sends them.
"""

from __future__ import annotations

import heapq
import sys
from collections import OrderedDict
from dataclasses import dataclass, field

from federation.protocol.types import Address

REASSEMBLY_TIMEOUT = "reassembly_timeout"
REASSEMBLY_EVICTED = "reassembly_evicted"
FRAGMENT_INVALID = "fragment_invalid"

MESSAGE_OVERHEAD = 640
"""bytes charged per partial message for its bookkeeping: the Partial, its empty index, its key (a tuple of the
sender name, two ints) and its entries in the two ordered maps (measured: about 560 bytes on CPython 3.11)"""
SENDER_OVERHEAD = 800
"""bytes charged per sender with partial messages: its share record, its ordered map, its slot in the map of
senders and its entries in the heap of holders (measured: about 670)"""
SMALL_INT = 256
"""CPython caches the ints up to this one; a larger fragment index is one more object per fragment"""
INT_SIZE = sys.getsizeof(SMALL_INT + 1)
BYTES_OVERHEAD = sys.getsizeof(b"")
"""a bytes object of n bytes takes n + this (33 on 64-bit CPython)"""
_sizeof = sys.getsizeof

MessageKey = tuple[str, int, int]
"""(sender identity, sender epoch, message id)"""


@dataclass(slots=True)
class Partial:
    key: MessageKey
    count: int
    total: int
    started: float
    source: Address
    share: SenderShare
    pieces: dict[int, bytes] = field(default_factory=dict)
    received: int = 0
    """bytes of the pieces held"""
    index_size: int = field(init=False)
    """`sys.getsizeof(pieces)` when last charged"""
    charge: int = field(init=False)
    """bytes of memory this message holds, as counted against the cap"""

    def __post_init__(self) -> None:
        self.index_size = _sizeof(self.pieces)
        self.charge = MESSAGE_OVERHEAD + self.index_size


class SenderShare:
    """The partial messages of one sender, oldest first, and the bytes they are charged."""

    __slots__ = ("name", "partials", "used", "changed")

    def __init__(self, name: str) -> None:
        self.name = name
        self.partials: OrderedDict[MessageKey, Partial] = OrderedDict()
        self.used = SENDER_OVERHEAD
        self.changed = False
        """`used` moved since this sender's last heap entry"""


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
        self._shares: dict[str, SenderShare] = {}
        self._heap: list[tuple[int, str]] = []
        """(-used, sender name): the largest holder on top; entries that no longer match are skipped"""
        self._changed: list[SenderShare] = []
        """senders whose count moved since their last heap entry"""
        self.used = 0
        """bytes charged for everything held (pieces and bookkeeping)"""
        self.completed = 0
        self.evictions = 0
        """partial messages evicted for room (memory or the per-sender count)"""
        self.heap_steps = 0
        """heap entries pushed or looked at when choosing whom to evict (a count of work, for tests)"""

    def __len__(self) -> int:
        return len(self._partials)

    def senders(self) -> int:
        """senders that hold partial messages"""
        return len(self._shares)

    def held_by(self, sender: str) -> int:
        """bytes charged to `sender` (0 when it holds nothing)"""
        share = self._shares.get(sender)
        return 0 if share is None else share.used

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
            share = self._shares.get(key[0])
            if share is None:
                share = self._shares[key[0]] = SenderShare(key[0])
                self.used += share.used
            key = (share.name, key[1], key[2])  # one name object per sender, not one per message
            partial = Partial(key, count, total, now, source, share)
            self._partials[key] = partial
            share.partials[key] = partial
            self._charge(share, partial.charge)
            if len(share.partials) > self.per_sender:
                dropped.append(self._evict(next(iter(share.partials)), "too many partial messages from one sender"))
        elif index in partial.pieces and partial.count == count and partial.total == total:
            return None, dropped  # a duplicate (the replay window stops repeats; a buggy sender may not)
        if partial.count != count or partial.total != total or partial.received + len(piece) > total:
            dropped.append(self._drop(partial, FRAGMENT_INVALID, f"fragment {index}/{count} of {total} bytes "
                                                                 f"contradicts {partial.count} fragments of "
                                                                 f"{partial.total} bytes"))
            return None, dropped
        pieces = partial.pieces
        size = len(piece)
        pieces[index] = piece
        index_size = _sizeof(pieces)
        charge = size + BYTES_OVERHEAD + index_size - partial.index_size
        partial.index_size = index_size
        if index > SMALL_INT:
            charge += INT_SIZE
        partial.received += size
        partial.charge += charge
        share = partial.share
        share.used += charge
        self.used += charge
        if not share.changed:
            share.changed = True
            self._changed.append(share)
        if self.used > self.memory and not self._make_room(partial, dropped):
            return None, dropped
        if len(pieces) < partial.count:
            return None, dropped
        self._remove(partial)
        if partial.received != partial.total:
            dropped.append(Dropped(FRAGMENT_INVALID, f"{partial.received} bytes received, {partial.total} declared",
                                   source, partial.received))
            return None, dropped
        self.completed += 1
        return b"".join([pieces[i] for i in range(partial.count)]), dropped

    def _make_room(self, current: Partial, dropped: list[Dropped]) -> bool:
        """Evict the oldest partial message of the largest holder until everything fits; False when that
        meant `current` itself (then dropped)."""
        while self.used > self.memory:
            share = self._largest()
            victim = next(iter(share.partials.values()))
            if victim is current:
                if len(share.partials) == 1:
                    dropped.append(self._evict(current.key, "larger than its sender's share of the reassembly "
                                                            "memory"))
                    return False
                iterator = iter(share.partials.values())
                next(iterator)
                victim = next(iterator)
            dropped.append(self._evict(victim.key, "reassembly memory full: the oldest partial packet of the "
                                                   "sender holding the most"))
        return True

    def _largest(self) -> SenderShare:
        heap, shares = self._heap, self._shares
        if self._changed:
            self._enter_changed(heap, shares)
        while True:
            self.heap_steps += 1
            negative_used, name = heap[0]
            holder = shares.get(name)
            if holder is not None and holder.used == -negative_used:
                return holder
            heapq.heappop(heap)

    def _enter_changed(self, heap: list[tuple[int, str]], shares: dict[str, SenderShare]) -> None:
        """A heap entry for every sender whose count moved (or the heap rebuilt, when stale entries abound)."""
        changed, self._changed = self._changed, []
        for share in changed:
            share.changed = False
        if len(heap) + len(changed) > 2 * len(shares) + 64:
            heap[:] = [(-share.used, share.name) for share in shares.values()]
            heapq.heapify(heap)
            self.heap_steps += len(heap)
            return
        for share in changed:
            if shares.get(share.name) is share:
                heapq.heappush(heap, (-share.used, share.name))
                self.heap_steps += 1

    def _charge(self, share: SenderShare, amount: int) -> None:
        share.used += amount
        self.used += amount
        if not share.changed:
            share.changed = True
            self._changed.append(share)

    def expire(self, now: float) -> list[Dropped]:
        """Give up every partial message older than the timeout."""
        dropped: list[Dropped] = []
        partials = self._partials
        while partials:
            partial = next(iter(partials.values()))
            if now - partial.started < self.timeout:
                break
            dropped.append(self._drop(partial, REASSEMBLY_TIMEOUT,
                                      f"{len(partial.pieces)} of {partial.count} fragments after {self.timeout:g} s"))
        return dropped

    def next_deadline(self) -> float | None:
        for partial in self._partials.values():
            return partial.started + self.timeout
        return None

    def _evict(self, key: MessageKey, detail: str) -> Dropped:
        self.evictions += 1
        return self._drop(self._partials[key], REASSEMBLY_EVICTED, detail)

    def _drop(self, partial: Partial, reason: str, detail: str) -> Dropped:
        self._remove(partial)
        return Dropped(reason, detail, partial.source, partial.received)

    def _remove(self, partial: Partial) -> None:
        del self._partials[partial.key]
        share = partial.share
        del share.partials[partial.key]
        if share.partials:
            self._charge(share, -partial.charge)
        else:
            del self._shares[share.name]
            self.used -= share.used
