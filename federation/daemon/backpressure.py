"""Bounded queues between the wrapper and a slow broker or a slow network.

Theory of operation
-------------------
The node produces injections (publications for the local broker) and
datagrams as fast as they arrive; the broker and the socket take them as
fast as they can. When one of them is slow, an unbounded queue in between
turns the slowness into unbounded memory. The daemon therefore keeps what
the broker cannot take yet in an `InjectionQueue` of at most `capacity`
items, handed over only while the broker's own backlog is small
(backpressure), and when the queue is full it drops **the oldest QoS 0
item first**: QoS 0 is best effort by contract, while a QoS 1/2 publication
was acknowledged hop by hop and has no other copy coming. Only when nothing
of QoS 0 is left does the oldest QoS 1/2 item go. Every drop is counted by
QoS, and the caller reports it.

The same rule holds toward the network. `shed_qos0` takes the node's
outgoing packets while the socket's send side is backed up and keeps
everything but QoS 0 `tm`: hellos and the rest of the control plane must
never be lost to data, and QoS 1/2 copies are tracked and retransmitted by
`federation.protocol.reliable` anyway. It works on whole protocol packets, before
the envelope batches them into datagrams (a datagram may mix a hello with
publications, so it cannot be judged as a whole).

`PacketBacklog` is the receive side: the daemon reads every datagram
waiting in the socket at once, handles the control packets at once (so a
hello never waits behind seconds of data: liveness, docs/protocol.md rule
1) and queues the `tm` here, to be handled a slice at a time. Bounded in
packets and bytes; full, it drops the oldest QoS 0 `tm` (looking at the
oldest `PEEK_LIMIT` only, so a drop costs little), else the oldest. A
dropped QoS 1/2 one is retransmitted by its sender, which never got a `ta`.

Sans-I/O: no clock, no sockets; the runtime drives it.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from typing import Generic, TypeVar

from federation.protocol import wire
from federation.protocol.types import PublicationId

Item = TypeVar("Item")


class InjectionQueue(Generic[Item]):
    """FIFO of (item, qos) with a capacity; full: the oldest QoS 0 item is dropped, else the oldest."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._qos0: deque[tuple[int, Item]] = deque()
        self._reliable: deque[tuple[int, Item]] = deque()
        self._order = 0
        self.dropped: Counter[str] = Counter()
        """"qos0" and "qos12": items dropped because the queue was full"""

    def __len__(self) -> int:
        return len(self._qos0) + len(self._reliable)

    def push(self, item: Item, qos: int) -> Item | None:
        """Queue `item`; returns the item dropped to make room (possibly `item` itself), or None."""
        self._order += 1
        (self._qos0 if qos == 0 else self._reliable).append((self._order, item))
        if len(self) <= self.capacity:
            return None
        if self._qos0:
            self.dropped["qos0"] += 1
            return self._qos0.popleft()[1]
        self.dropped["qos12"] += 1
        return self._reliable.popleft()[1]

    def pop(self) -> Item | None:
        """The oldest item of either kind (arrival order is kept), or None when empty."""
        if not self._qos0 and not self._reliable:
            return None
        if not self._reliable or (self._qos0 and self._qos0[0][0] < self._reliable[0][0]):
            return self._qos0.popleft()[1]
        return self._reliable.popleft()[1]

    def take_within(self, reliable: int, room: int) -> list[Item]:
        """Up to `room` items, oldest first, stopping before the oldest QoS 1/2 item once `reliable` of them
        were taken (the broker's Receive Maximum: the QoS 0 items behind it wait too, to keep the order)."""
        if not self._reliable:
            queue = self._qos0
            return [queue.popleft()[1] for _ in range(min(room, len(queue)))]
        out: list[Item] = []
        qos0, rest = self._qos0, self._reliable
        while len(out) < room:
            if rest and (not qos0 or rest[0][0] < qos0[0][0]):
                if reliable <= 0:
                    break
                reliable -= 1
                out.append(rest.popleft()[1])
            elif qos0:
                out.append(qos0.popleft()[1])
            else:
                break
        return out

    def drain(self) -> list[Item]:
        """Every item, oldest first; the queue is then empty."""
        return self.take(len(self))

    def take(self, room: int) -> list[Item]:
        """Up to `room` items, oldest first."""
        if not self._reliable or not self._qos0:  # one kind only (a flood is all QoS 0): no order to merge
            queue = self._qos0 or self._reliable
            return [queue.popleft()[1] for _ in range(min(room, len(queue)))]
        out: list[Item] = []
        while len(out) < room:
            item = self.pop()
            if item is None:
                break
            out.append(item)
        return out


PEEK_LIMIT = 64
"""oldest backlog entries looked at for a QoS 0 `tm` to drop"""
_NONE_DROPPED: tuple[bytes | None, ...] = ()


def qos0_publications(packet: bytes) -> list[tuple[PublicationId, str]]:
    """The (publication, filter) of each QoS 0 publication this encoded packet carries: a QoS 0 `tm`'s one, a
    `tb`'s every one; none for anything else (the first thing to shed is what this lists)."""
    if wire.packet_type(packet) not in wire.DATA_TYPES:
        return []
    try:
        body = wire.decode(packet, len(packet), 1 << 16).body
    except wire.DecodeError:
        return []
    if isinstance(body, wire.TopicMessage):
        return [(body.publication, body.filter)] if body.qos == 0 else []
    if isinstance(body, wire.TopicBatch):
        return [((body.origin, body.epoch, seq), body.filter) for seq in body.items[::3]]
    return []


def is_qos0_publication(packet: bytes) -> bool:
    """Is this encoded packet a QoS 0 `tm` (the first thing to shed when the network is congested)?
    Read from its last bytes when it has no properties (the common case: shedding must cost less than
    handling, or an overloaded wrapper falls further behind with every drop), else decoded."""
    qos = wire.plain_topic_message_qos(packet)
    if qos is not None:
        return qos == 0
    return bool(qos0_publications(packet))


Target = TypeVar("Target")


def shed_qos0(packets: list[tuple[bytes, Target]]) -> tuple[list[tuple[bytes, Target]], list[tuple[bytes, Target]]]:
    """Split outgoing packets into those to send and the QoS 0 `tm` shed (each list in the given order)."""
    kept: list[tuple[bytes, Target]] = []
    shed: list[tuple[bytes, Target]] = []
    for item in packets:
        (shed if is_qos0_publication(item[0]) else kept).append(item)
    return kept, shed


class PacketBacklog(Generic[Target]):
    """FIFO of received (packet, source), bounded in packets and bytes; full: the oldest QoS 0 `tm` goes."""

    def __init__(self, max_packets: int, max_bytes: int) -> None:
        if max_packets <= 0 or max_bytes <= 0:
            raise ValueError("bounds must be positive")
        self.max_packets = max_packets
        self.max_bytes = max_bytes
        self._items: deque[tuple[bytes, Target]] = deque()
        self.bytes = 0
        self.dropped: Counter[str] = Counter()
        """"qos0" and "qos12": packets dropped because the backlog was full"""

    def __len__(self) -> int:
        return len(self._items)

    def push(self, packet: bytes, source: Target) -> Sequence[bytes | None]:
        """Queue a packet; returns what was dropped to make room (possibly this packet): a QoS 0 `tm`, still
        encoded (decode it only to report it), or None for another packet (QoS 1/2: its sender retransmits it)."""
        self._items.append((packet, source))
        self.bytes += len(packet)
        if len(self._items) <= self.max_packets and self.bytes <= self.max_bytes:
            return _NONE_DROPPED  # the common case: no list made per packet
        dropped: list[bytes | None] = []
        while len(self._items) > self.max_packets or self.bytes > self.max_bytes:
            dropped.append(self._drop_one())
        return dropped

    def _drop_one(self) -> bytes | None:
        items = self._items
        for index in range(min(PEEK_LIMIT, len(items))):
            packet = items[index][0]
            if is_qos0_publication(packet):
                self.bytes -= len(packet)
                del items[index]
                self.dropped["qos0"] += 1
                return packet
        packet, _source = items.popleft()
        self.bytes -= len(packet)
        self.dropped["qos12"] += 1
        return None

    def take(self, count: int, max_bytes: int | None = None) -> list[tuple[bytes, Target]]:
        """Up to `count` packets, oldest first, and (if given) no more once `max_bytes` are reached."""
        out: list[tuple[bytes, Target]] = []
        items = self._items
        budget = max_bytes if max_bytes is not None else self.max_bytes
        while items and len(out) < count and budget > 0:
            item = items.popleft()
            size = len(item[0])
            self.bytes -= size
            budget -= size
            out.append(item)
        return out
