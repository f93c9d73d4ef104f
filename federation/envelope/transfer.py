"""Bulk transfers: large packets cross as a windowed, acknowledged stream of fragments.

Theory of operation: a protocol packet above the envelope's `bulk_threshold`
(a publication of up to `max_publication_bytes`, 16 MiB by default) does not
go as plain fragments, of which one lost loses the whole packet. It becomes
a *transfer* from one envelope to one neighbour's envelope: data items, each
in its own sealed datagram (authenticated and replay-protected like any
other), and acknowledgement items going back. Both are items of the
envelope's frame (docs/protocol.md, "Bulk transfers"); this module is
sans-I/O, as the envelope: items and time in, items out.

- *Window.* The receiver says how many fragments it takes beyond the first
  one it misses: its share of `receive_window` (bytes of the socket's
  receive buffer the envelope may fill, as the daemon read it from the
  kernel), split evenly between the senders that have transfers in
  progress, each datagram counted with the kernel's overhead. The sender
  keeps at most min(that window, its congestion window) fragments
  unacknowledged, so no burst it sends is larger than what the receiver's
  kernel buffer holds: the window is the pacing, and acknowledgements clock
  the next fragments out (one acknowledgement per destination per pass of
  the receiver's loop).
- *Selective acknowledgement.* An acknowledgement gives the count of
  fragments received in a row from the first (cumulative) and up to
  MAX_RANGES ranges received beyond it. A fragment is lost when REORDER
  fragments sent after it were acknowledged (as TCP's duplicate threshold),
  or when nothing was acknowledged for a retransmission timeout (2 x the
  smoothed RTT, at least MIN_RTO, doubling up to MAX_RTO); only lost
  fragments are sent again. A loss halves the congestion window (once per
  round trip); every window of acknowledged fragments grows it by one.
- *Memory.* A receiver admits a transfer (allocates one buffer of its
  declared size, at once) only if all transfers together stay within
  `memory` and, while several senders want room, the sender stays within
  an even share of it (a sender that holds nothing is always admitted when
  the memory has room): a flood from one neighbour cannot starve another.
  A transfer not admitted is answered with a window of 0: its sender probes
  again later. What is counted is what is held: the buffer and the map of
  received fragments as `sys.getsizeof` sees them, plus a fixed overhead.
  A sender holds the packets of its transfers, at most `memory` bytes
  queued; beyond it a packet is refused (`transfer_queue_full`).
- *Repeats.* A sender's node sends a QoS 1/2 packet again until it is
  acknowledged (docs/protocol.md rule 7a), which for a large one may take
  several seconds of custody downstream. A packet equal to one in transfer
  to the same neighbour joins it; one equal to a packet delivered there in
  the last `repeat_hold` seconds is not sent again (counted): the
  neighbour has it, and if its acknowledgement was what got lost, the next
  repeat after the hold goes whole.
- *Giving up.* A sender gives a transfer up after `timeout` seconds without
  progress (`transfer_failed`; the node sends a QoS 1/2 packet again), a
  receiver a partial one likewise (`transfer_timeout`), and a fragment that
  contradicts its transfer, or one above `max_packet`, is refused
  (`transfer_invalid`, the sender told to give up).
"""

from __future__ import annotations

import hashlib
import math
import struct
import sys
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from federation.protocol.types import Address

DATA_ITEM = struct.Struct(">BIIIHH")
"""item kind 3, transfer id, fragment index, total length, fragment size, this fragment's length; then the bytes"""
ACK_ITEM = struct.Struct(">BIBIIB")
"""item kind 4, transfer id, status, cumulative, window (fragments), range count; then the ranges"""
RANGE = struct.Struct(">II")
"""first fragment index, end (exclusive) of a range received beyond the cumulative count"""
ITEM_DATA = 3
ITEM_ACK = 4
STATUS_PROGRESS = 0
STATUS_DONE = 1
STATUS_REFUSED = 2

MAX_RANGES = 16
REORDER = 3
"""fragments sent after one and acknowledged before it: that one is lost"""
MIN_RTO = 0.05
MAX_RTO = 2.0
INITIAL_RTO = 0.3
INITIAL_WINDOW_BYTES = 128 * 1024
"""bytes sent before the receiver's first acknowledgement says its window"""
DATAGRAM_COST = 1024
"""bytes the kernel charges a receive buffer per datagram beyond its payload (the socket buffer's bookkeeping)"""
INCOMING_OVERHEAD = 1024
"""bytes charged per transfer received for its objects, besides its buffer and its map"""
WAITING_FOR = 5.0
"""seconds a sender refused for want of memory counts for the fair share"""
COMPLETED_REMEMBERED = 1024
"""transfers a receiver remembers as complete (to answer a repeated last fragment), per envelope"""

TRANSFER_FAILED = "transfer_failed"
TRANSFER_TIMEOUT = "transfer_timeout"
TRANSFER_INVALID = "transfer_invalid"
TRANSFER_QUEUE_FULL = "transfer_queue_full"
TRANSFER_REASONS = (TRANSFER_FAILED, TRANSFER_TIMEOUT, TRANSFER_INVALID, TRANSFER_QUEUE_FULL)

IncomingKey = tuple[str, int, int]
"""(sender identity, sender epoch, transfer id)"""


@dataclass(frozen=True)
class TransferConfig:
    max_packet: int
    """bytes: the largest transfer admitted"""
    memory: int
    """bytes held at most by transfers received, all senders together (and by transfers queued to send)"""
    receive_window: int
    """bytes of our socket's receive buffer the senders may fill together"""
    timeout: float
    """seconds without progress after which a transfer is given up, at either end"""
    repeat_hold: float = 30.0
    """seconds during which a packet equal to one delivered to the same neighbour is not sent again"""


@dataclass(frozen=True)
class TransferDrop:
    reason: str
    detail: str
    source: Address
    size: int


@dataclass
class Outgoing:
    transfer_id: int
    to: Address
    packet: bytes
    size: int
    count: int
    started: float
    acked: bytearray = field(init=False)
    acked_count: int = 0
    base: int = 0
    """every fragment below it is acknowledged"""
    next_new: int = 0
    in_flight: dict[int, tuple[int, float, bool]] = field(default_factory=dict)
    """index -> (transmission order, time sent, sent before)"""
    lost: deque[int] = field(default_factory=deque)
    sent_order: int = 0
    window: int = -1
    """fragments the receiver takes (its last acknowledgement; 0: no room yet), -1 before it said"""
    congestion: int = 0
    growth: int = 0
    srtt: float | None = None
    rto: float = INITIAL_RTO
    last_progress: float = 0.0
    last_loss: float = -1.0
    due: float | None = None
    """when the retransmission timer fires (None: nothing in flight)"""
    receiver_epoch: int = 0
    """the envelope epoch of the receiver's acknowledgements (another one: it restarted and lost what it had)"""

    def __post_init__(self) -> None:
        self.acked = bytearray(self.count)
        self.last_progress = self.started


@dataclass
class Incoming:
    key: IncomingKey
    source: Address
    total: int
    size: int
    count: int
    buffer: bytearray
    have: bytearray
    charge: int
    last_progress: float
    received: int = 0
    cumulative: int = 0


class Transfers:
    """Every transfer of one envelope, both ways."""

    def __init__(self, config: TransferConfig, fragment_size: int) -> None:
        self.config = config
        self.fragment_size = fragment_size
        self.next_id = 0
        self.outgoing: dict[Address, deque[Outgoing]] = {}
        """per destination, the transfers in order: the first is the one being sent"""
        self.queued_bytes = 0
        self.delivered: dict[Address, deque[tuple[float, int, bytes]]] = {}
        """per destination: (time, length, digest) of the packets delivered lately"""
        self.incoming: dict[IncomingKey, Incoming] = {}
        self.held_by: dict[str, int] = {}
        self.used = 0
        self.waiting: dict[str, float] = {}
        """senders refused for want of memory lately -> when"""
        self.completed: OrderedDict[IncomingKey, None] = OrderedDict()
        self.acks_due: dict[IncomingKey, Address] = {}
        self.refusals: list[tuple[Address, int]] = []
        self.counters: dict[str, int] = {}

    def _count(self, name: str, amount: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + amount

    # ------------------------------------------------------------ sending side

    def offer(self, packet: bytes, to: Address, now: float) -> TransferDrop | None:
        """Take `packet` for `to` as a transfer (or join or skip an equal one); a drop when the queue is full."""
        queue = self.outgoing.get(to)
        if queue is not None and any(len(t.packet) == len(packet) and t.packet == packet for t in queue):
            self._count("transfers_joined")
            return None
        delivered = self.delivered.get(to)
        if delivered:
            while delivered and now - delivered[0][0] > self.config.repeat_hold:
                delivered.popleft()
            if any(length == len(packet) for _, length, _ in delivered):
                digest = _digest(packet)
                if any(d == digest for _, _, d in delivered):
                    self._count("transfers_repeat_skipped")
                    return None
        if self.queued_bytes + len(packet) > self.config.memory:
            return TransferDrop(TRANSFER_QUEUE_FULL, f"{len(packet)} bytes to {to}: {self.queued_bytes} bytes "
                                                     f"queued already (limit {self.config.memory})",
                                to, len(packet))
        self.next_id = (self.next_id + 1) & 0xFFFFFFFF
        count = math.ceil(len(packet) / self.fragment_size)
        transfer = Outgoing(self.next_id, to, packet, self.fragment_size, count, now)
        transfer.congestion = max(2, INITIAL_WINDOW_BYTES // (self.fragment_size + DATAGRAM_COST))
        self.outgoing.setdefault(to, deque()).append(transfer)
        self.queued_bytes += len(packet)
        self._count("transfers_started")
        return None

    def data_to_send(self, now: float) -> list[tuple[Address, bytes, bytes]]:
        """(destination, item header, fragment) for every fragment the windows allow now, lost ones first."""
        out: list[tuple[Address, bytes, bytes]] = []
        for to in sorted(self.outgoing, key=str):
            transfer = self.outgoing[to][0]
            window = transfer.congestion if transfer.window < 0 else min(transfer.congestion, transfer.window)
            allowed = window - len(transfer.in_flight)
            while allowed > 0:
                index = self._next_index(transfer)
                if index is None:
                    break
                out.append((to, *self._fragment(transfer, index, now)))
                allowed -= 1
            if transfer.in_flight and transfer.due is None:
                transfer.due = now + transfer.rto
        return out

    def _next_index(self, transfer: Outgoing) -> int | None:
        while transfer.lost:
            index = transfer.lost.popleft()
            if not transfer.acked[index] and index not in transfer.in_flight:
                return index
        while transfer.next_new < transfer.count:
            index = transfer.next_new
            transfer.next_new += 1
            if not transfer.acked[index]:
                return index
        return None

    def _fragment(self, transfer: Outgoing, index: int, now: float) -> tuple[bytes, bytes]:
        start = index * transfer.size
        piece = transfer.packet[start:start + transfer.size]
        transfer.sent_order += 1
        again = index < transfer.next_new - 1 or index in transfer.in_flight
        transfer.in_flight[index] = (transfer.sent_order, now, again)
        self._count("transfer_fragments_sent")
        if again:
            self._count("transfer_fragments_resent")
        return DATA_ITEM.pack(ITEM_DATA, transfer.transfer_id, index, len(transfer.packet), transfer.size,
                              len(piece)), piece

    def on_ack(self, source: Address, epoch: int, transfer_id: int, status: int, cumulative: int, window: int,
               ranges: list[tuple[int, int]], now: float) -> TransferDrop | None:
        queue = self.outgoing.get(source)
        if not queue or queue[0].transfer_id != transfer_id:
            self._count("transfer_acks_unmatched")
            return None
        transfer = queue[0]
        if epoch != transfer.receiver_epoch:
            if transfer.receiver_epoch:  # the receiver restarted: what its former life acknowledged is gone
                self._count("transfers_restarted")
                transfer.acked = bytearray(transfer.count)
                transfer.acked_count = transfer.next_new = transfer.base = 0
                transfer.in_flight.clear()
                transfer.lost.clear()
            transfer.receiver_epoch = epoch
        if status == STATUS_REFUSED:
            self._finish(transfer, now)
            return TransferDrop(TRANSFER_FAILED, f"{source} refused transfer {transfer_id} of "
                                                 f"{len(transfer.packet)} bytes", source, len(transfer.packet))
        if status == STATUS_DONE:
            cumulative, ranges = transfer.count, []
        transfer.window = window
        transfer.last_progress = now  # it answers: alive (a window of 0 means no room yet, not gone)
        newest = 0
        progressed = False
        for start, end in [(transfer.base, min(cumulative, transfer.count)), *ranges]:
            for index in range(max(0, start), min(end, transfer.count)):
                if transfer.acked[index]:
                    continue
                transfer.acked[index] = 1
                transfer.acked_count += 1
                progressed = True
                sent = transfer.in_flight.pop(index, None)
                if sent is not None:
                    newest = max(newest, sent[0])
                    if not sent[2]:
                        self._sample(transfer, now - sent[1])
        if cumulative > transfer.base:
            transfer.base = min(cumulative, transfer.count)
        if progressed:
            transfer.growth += 1
            if transfer.growth >= transfer.congestion:
                transfer.growth = 0
                transfer.congestion += 1
            transfer.due = now + transfer.rto if transfer.in_flight else None
        if newest:
            lost = [index for index, (order, _, _) in transfer.in_flight.items() if order + REORDER < newest]
            if lost:
                self._lose(transfer, lost, now)
        if transfer.acked_count == transfer.count:
            self._finish(transfer, now)
            self.delivered.setdefault(source, deque()).append((now, len(transfer.packet), _digest(transfer.packet)))
            self._count("transfers_sent")
        return None

    def _sample(self, transfer: Outgoing, rtt: float) -> None:
        transfer.srtt = rtt if transfer.srtt is None else 0.875 * transfer.srtt + 0.125 * rtt
        transfer.rto = min(MAX_RTO, max(MIN_RTO, 2 * transfer.srtt))

    def _lose(self, transfer: Outgoing, lost: list[int], now: float) -> None:
        for index in sorted(lost):
            del transfer.in_flight[index]
            transfer.lost.append(index)
        self._count("transfer_fragments_lost", len(lost))
        if now - transfer.last_loss > (transfer.srtt or transfer.rto):
            transfer.last_loss = now
            transfer.congestion = max(2, transfer.congestion // 2)

    def _finish(self, transfer: Outgoing, now: float) -> None:
        queue = self.outgoing[transfer.to]
        queue.popleft()
        if not queue:
            del self.outgoing[transfer.to]
        else:  # the next one starts now: its wait in the queue was no lack of progress of its own
            queue[0].last_progress = max(queue[0].last_progress, now)
        self.queued_bytes -= len(transfer.packet)

    # ------------------------------------------------------------ receiving side

    def on_data(self, key: IncomingKey, source: Address, index: int, total: int, size: int, piece: bytes,
                now: float) -> tuple[bytes | None, TransferDrop | None]:
        """Store one fragment: (the whole packet when it completes its transfer, a drop)."""
        if key in self.completed:
            self.acks_due[key] = source
            return None, None
        transfer = self.incoming.get(key)
        count = math.ceil(total / size) if size else 0
        last = total - (count - 1) * size if count else 0
        if not (0 < total <= self.config.max_packet and count >= 2 and index < count
                and len(piece) == (last if index == count - 1 else size)) or (
                transfer is not None and (transfer.total != total or transfer.size != size)):
            if transfer is not None:
                self._forget(transfer)
            self.refusals.append((source, key[2]))
            return None, TransferDrop(TRANSFER_INVALID, f"fragment {index} of {total} bytes in fragments of {size} "
                                                        f"(limit {self.config.max_packet})", source, len(piece))
        if transfer is None:
            transfer = self._admit(key, source, total, size, count, now)
            if transfer is None:
                self.acks_due[key] = source
                return None, None
        if not transfer.have[index]:
            start = index * size
            transfer.buffer[start:start + len(piece)] = piece
            transfer.have[index] = 1
            transfer.received += 1
            transfer.last_progress = now
            if index == transfer.cumulative:
                found = transfer.have.find(0, index)
                transfer.cumulative = count if found < 0 else found
        self.acks_due[key] = source
        if transfer.received < count:
            return None, None
        self._forget(transfer)
        self.completed[key] = None
        self.acks_due[key] = source  # its DONE, at once: the sender's next transfer waits for it (not for a timeout)
        while len(self.completed) > COMPLETED_REMEMBERED:
            self.completed.popitem(last=False)
        self._count("transfers_received")
        return bytes(transfer.buffer), None

    def _admit(self, key: IncomingKey, source: Address, total: int, size: int, count: int,
               now: float) -> Incoming | None:
        sender = key[0]
        for name, since in list(self.waiting.items()):
            if now - since > WAITING_FOR:
                del self.waiting[name]
        charge = sys.getsizeof(bytearray(0)) + total + sys.getsizeof(bytearray(0)) + count + INCOMING_OVERHEAD
        wanting = set(self.held_by) | set(self.waiting) | {sender}
        share = self.config.memory // len(wanting)
        held = self.held_by.get(sender, 0)
        if self.used + charge > self.config.memory or (held and held + charge > share):
            self.waiting[sender] = now
            self._count("transfers_deferred")
            return None
        self.waiting.pop(sender, None)
        buffer = bytearray(total)
        have = bytearray(count)
        charge = sys.getsizeof(buffer) + sys.getsizeof(have) + INCOMING_OVERHEAD
        transfer = Incoming(key, source, total, size, count, buffer, have, charge, now)
        self.incoming[key] = transfer
        self.held_by[sender] = held + charge
        self.used += charge
        return transfer

    def _forget(self, transfer: Incoming) -> None:
        del self.incoming[transfer.key]
        sender = transfer.key[0]
        left = self.held_by[sender] - transfer.charge
        if left:
            self.held_by[sender] = left
        else:
            del self.held_by[sender]
        self.used -= transfer.charge
        self.acks_due.pop(transfer.key, None)

    def acks_to_send(self) -> list[tuple[Address, bytes]]:
        """(destination, acknowledgement item) for every transfer that received something since the last call."""
        out: list[tuple[Address, bytes]] = [(source, ACK_ITEM.pack(ITEM_ACK, transfer_id, STATUS_REFUSED, 0, 0, 0))
                                            for source, transfer_id in self.refusals]
        self.refusals = []
        due, self.acks_due = self.acks_due, {}
        senders = {key[0] for key in self.incoming} or {""}
        for key, source in sorted(due.items(), key=lambda item: (item[0][0], item[0][1], item[0][2])):
            transfer = self.incoming.get(key)
            if transfer is None:
                status = STATUS_DONE if key in self.completed else STATUS_PROGRESS
                out.append((source, ACK_ITEM.pack(ITEM_ACK, key[2], status, 0, 0, 0)))
                continue
            mine = sum(1 for other in self.incoming if other[0] == key[0])
            share = self.config.receive_window // (len(senders) * mine)
            window = max(1, share // (transfer.size + DATAGRAM_COST))
            ranges = _ranges(transfer.have, transfer.cumulative)
            out.append((source, ACK_ITEM.pack(ITEM_ACK, key[2], STATUS_PROGRESS, transfer.cumulative, window,
                                              len(ranges)) + b"".join(RANGE.pack(*r) for r in ranges)))
        return out

    # ------------------------------------------------------------ timers, status

    def next_deadline(self) -> float | None:
        deadlines = [t.due for queue in self.outgoing.values() if (t := queue[0]).due is not None]
        deadlines += [queue[0].last_progress + self.config.timeout for queue in self.outgoing.values()]
        deadlines += [t.last_progress + self.config.timeout for t in self.incoming.values()]
        return min(deadlines) if deadlines else None

    def on_timer(self, now: float) -> list[TransferDrop]:
        dropped: list[TransferDrop] = []
        for to in sorted(self.outgoing, key=str):
            transfer = self.outgoing[to][0]
            if now - transfer.last_progress >= self.config.timeout:
                self._finish(transfer, now)
                dropped.append(TransferDrop(TRANSFER_FAILED, f"transfer {transfer.transfer_id} of "
                                                             f"{len(transfer.packet)} bytes to {to}: no progress for "
                                                             f"{self.config.timeout:g} s ({transfer.acked_count} of "
                                                             f"{transfer.count} fragments acknowledged)",
                                            to, len(transfer.packet)))
                continue
            if transfer.due is not None and now >= transfer.due:
                transfer.due = None
                transfer.rto = min(MAX_RTO, transfer.rto * 2)
                self._count("transfer_timeouts")
                if transfer.in_flight:
                    self._lose(transfer, list(transfer.in_flight), now)
                if transfer.window == 0 and transfer.acked_count < transfer.count:
                    transfer.window = 1  # a probe: the receiver had no room; it answers again
        for incoming in [t for t in self.incoming.values() if now - t.last_progress >= self.config.timeout]:
            self._forget(incoming)
            dropped.append(TransferDrop(TRANSFER_TIMEOUT, f"{incoming.received} of {incoming.count} fragments "
                                                          f"after {self.config.timeout:g} s without progress",
                                        incoming.source, incoming.total))
        return dropped

    def status(self) -> dict[str, int]:
        return {"sending": sum(len(queue) for queue in self.outgoing.values()), "queued_bytes": self.queued_bytes,
                "receiving": len(self.incoming), "receive_bytes": self.used, "receive_memory": self.config.memory,
                "receive_window": self.config.receive_window, **dict(sorted(self.counters.items()))}


def _digest(packet: bytes) -> bytes:
    return hashlib.blake2b(packet, digest_size=16).digest()


def _ranges(have: bytearray, cumulative: int) -> list[tuple[int, int]]:
    """Up to MAX_RANGES ranges of fragments received beyond `cumulative` (which is missing)."""
    ranges: list[tuple[int, int]] = []
    position = cumulative
    count = len(have)
    while len(ranges) < MAX_RANGES and position < count:
        start = have.find(1, position)
        if start < 0:
            break
        end = have.find(0, start)
        end = count if end < 0 else end
        ranges.append((start, end))
        position = end
    return ranges


def parse_ack(body: bytes, position: int, end: int) -> tuple[tuple[int, int, int, int, list[tuple[int, int]]], int]:
    """(transfer id, status, cumulative, window, ranges), and the position after the item; ValueError if cut."""
    if position + ACK_ITEM.size > end:
        raise ValueError("cut acknowledgement")
    _, transfer_id, status, cumulative, window, count = ACK_ITEM.unpack_from(body, position)
    position += ACK_ITEM.size
    if position + count * RANGE.size > end or status > STATUS_REFUSED:
        raise ValueError("cut acknowledgement ranges")
    ranges = [RANGE.unpack_from(body, position + i * RANGE.size) for i in range(count)]
    return (transfer_id, status, cumulative, window, ranges), position + count * RANGE.size
