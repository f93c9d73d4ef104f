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

`is_qos0_publication` lets the daemon shed QoS 0 `tm` packets first when
the socket's send buffer is full (QoS 1/2 ones are retransmitted by
`federation.reliable` if the kernel drops them).

Sans-I/O: no clock, no sockets; the runtime drives it.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Generic, TypeVar

from federation import wire

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

    def take(self, room: int) -> list[Item]:
        """Up to `room` items, oldest first."""
        out: list[Item] = []
        while len(out) < room:
            item = self.pop()
            if item is None:
                break
            out.append(item)
        return out


def is_qos0_publication(packet: bytes) -> bool:
    """Is this encoded packet a QoS 0 `tm` (the first thing to shed when the network is congested)?"""
    if wire.packet_type(packet) != wire.TOPIC_MESSAGE:
        return False
    try:
        body = wire.decode(packet, len(packet), 1 << 16).body
    except wire.DecodeError:
        return False
    return isinstance(body, wire.TopicMessage) and body.qos == 0
