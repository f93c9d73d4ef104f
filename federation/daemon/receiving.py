"""Datagrams from the overlay socket into the node: control packets at once, data a slice per loop pass.

Theory of operation (docs/daemon.md "Overload"): the control plane goes
first. On each readable event `Receiving` takes every datagram already
waiting (`RECEIVE_BATCH`, read `RECEIVE_CHUNK` at a time while the pass
is under `RECEIVE_PASS_SECONDS`), opens each through the envelope, hands
every packet but the data ones (`tm`, `tb`, `tq`) to the node at once and
queues the data in a bounded `PacketBacklog`. The data is handled
`DATA_SLICE` packets (and `DATA_SLICE_BYTES`) at a time, one slice per
loop pass with the socket read again in between: a hello waits for at
most one slice, not for seconds of queued data, and a backlog the node
cannot work off is dropped QoS 0 first and counted instead of overflowing
the kernel's buffer unseen. The backlog's level (or the injection queue's,
when the broker is what holds the data up) is what the node tells the
neighbours that sent the data (QoS 0 pacing, `rb`).

The running wrapper (running.py) owns the loop: each pass ends with its
`drain`, which sends what the node made.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sized

from federation.daemon.backpressure import PacketBacklog
from federation.daemon.clock import Clock
from federation.daemon.flow_control import INJECTION_BACKLOG, report_shed
from federation.daemon.udp import OverlayProtocol
from federation.envelope.datagrams import Envelope
from federation.protocol import wire
from federation.protocol.node import Node
from federation.protocol.types import Address

RECEIVE_BATCH = 4096
"""datagrams read from the socket in one pass (every one waiting, up to this): control packets go first"""
RECEIVE_CHUNK = 256
"""datagrams read at a time within a pass, the time spent checked after each"""
RECEIVE_PASS_SECONDS = 0.05
"""a pass reads no further chunk after this long, the rest left in the socket for the next: under a flood of
packets the node handles one by one (fake records, about 0.2 ms each), the loop still gets to its signals,
timers and status requests every few tens of milliseconds (SIGTERM is honoured within a second, issue 22)"""
DATA_SLICE = 256
"""received `tm` handled per loop pass before the socket is read again (each pass ends with one write to the
broker; 256 against 64 measured 0.096 against 0.106 wrapper CPU s per 1,000 publications, about 10 ms a pass)"""
DATA_SLICE_BYTES = 64 * 1024
"""and at most about this many bytes of them: a `tb` carries up to a datagram of publications, so 256 of them
would be some 4,000 publications in one pass (the hello waiting that long, and more injections made per pass
than the broker is handed)"""
DATA_SLICE_BYTES_WAITING = 8 * 1024
"""the byte bound while injections wait for the broker's room: the loop then gets back to the broker's
acknowledgements after about a hundred small publications, so the next injections go out at once (the broker's
Receive Maximum, 20 by default for Mosquitto, makes injecting a window: a broker left waiting behind a long pass
idles)"""
RECEIVE_BACKLOG = 20000
"""received `tm` waiting to be handled; beyond it (or RECEIVE_BACKLOG_BYTES) the oldest QoS 0 one is dropped"""
RECEIVE_BACKLOG_BYTES = 32 * 1024 * 1024


class Receiving:
    """The overlay socket's datagrams into the node, and the backlog of data packets waiting their slice."""

    def __init__(self, node: Node, envelope: Envelope, protocol: OverlayProtocol, clock: Clock,
                 loop: asyncio.AbstractEventLoop, injection_queue: Sized, drain: Callable[[float], None],
                 stopping: Callable[[], bool]) -> None:
        """`injection_queue`: remote publications waiting for the broker (its length counts in the pacing level
        and shortens the slices); `drain`: sends what the node made, after every pass; `stopping`: true once
        the wrapper shuts down, when nothing received is handled any more."""
        self.node = node
        self.envelope = envelope
        self.protocol = protocol
        self.clock = clock
        self.loop = loop
        self.injection_queue = injection_queue
        self._drain = drain
        self._stopping = stopping
        self.backlog: PacketBacklog[Address] = PacketBacklog(RECEIVE_BACKLOG, RECEIVE_BACKLOG_BYTES)
        self._pass_scheduled = False

    def on_datagram(self, data: bytes, source: Address) -> None:
        """The socket is readable (asyncio gave us its first datagram): one pass."""
        if not self._stopping():
            self.data_pass(self.receive([(data, source)]))

    def receive(self, datagrams: list[tuple[bytes, Address]]) -> float:
        """`datagrams`, and those waiting in the socket (up to RECEIVE_BATCH, read RECEIVE_CHUNK at a time while
        the pass is under RECEIVE_PASS_SECONDS): control packets to the node now, `tm` queued.

        Returns the time the last of them were handled at; each chunk is handled at a time read after the
        socket: every one of them arrived before it, which the hello exchange's clock bound relies on (an
        echo stamped before it arrived would make a shared clock look offset)."""
        node = self.node
        envelope = self.envelope
        backlog = self.backlog
        queued_from: set[Address] = set()
        started = time.monotonic()
        read = 0
        while True:
            chunk = self.protocol.read_waiting(min(RECEIVE_CHUNK, RECEIVE_BATCH - read))
            read += len(chunk)
            datagrams += chunk
            now = self.clock.now()
            for data, source in datagrams:
                queued = False
                for packet in envelope.receive_datagram(data, source, now):
                    if wire.packet_type(packet) not in wire.DATA_TYPES:
                        node.receive_packet(packet, source, now)
                        continue
                    queued = True
                    for dropped in backlog.push(packet, source):
                        if dropped is None:  # QoS 1/2: never acknowledged, so its sender sends it again
                            node.drop("receive_backlog_qos12")
                        else:
                            report_shed(node, "receive_backlog_qos0", "receive_backlog", dropped, now)
                if queued:
                    queued_from.add(source)
            if len(chunk) < RECEIVE_CHUNK or read >= RECEIVE_BATCH \
                    or time.monotonic() - started >= RECEIVE_PASS_SECONDS:
                break
            datagrams = []
        if queued_from:  # only neighbours are told (the node checks): a datagram's source address may be forged
            node.on_receive_backlog(self.backlog_level(), queued_from, now)
        return now

    def backlog_level(self) -> int:
        """The receive backlog in packets, or its bytes scaled to its packet bound if they fill it faster, or the
        injection queue scaled likewise if the broker is what holds the data up (the pacing level)."""
        backlog = self.backlog
        return max(len(backlog), backlog.bytes * backlog.max_packets // backlog.max_bytes,
                   len(self.injection_queue) * backlog.max_packets // INJECTION_BACKLOG)

    def _scheduled_pass(self) -> None:
        self._pass_scheduled = False
        if self._stopping():
            return
        # what arrived meanwhile: its hellos go before the next slice
        self.data_pass(self.receive([]))

    def data_pass(self, now: float) -> None:
        """Handle one slice of queued `tm`; the rest in later loop passes, each reading the socket first."""
        node = self.node
        budget = DATA_SLICE_BYTES_WAITING if len(self.injection_queue) else DATA_SLICE_BYTES
        for packet, source in self.backlog.take(DATA_SLICE, budget):
            node.receive_packet(packet, source, now)
        if node.receive_busy:
            node.on_receive_backlog(self.backlog_level(), (), now)
        if len(self.backlog) and not self._pass_scheduled:
            self._pass_scheduled = True
            self.loop.call_soon(self._scheduled_pass)
        self._drain(now)
