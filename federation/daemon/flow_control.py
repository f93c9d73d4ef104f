"""Flow control between the local broker and the overlay, for a wrapper under overload.

Theory of operation: publications cross the wrapper in two directions, and
each direction can outrun the other side. `FlowControl` holds the three
decisions that keep the queues bounded (docs/daemon.md "Overload"), kept
apart from the running wrapper (running.py), which owns the loop and calls
them once per drain of the node's outputs:

- into the broker (`inject`): remote QoS 1/2 publications are handed to
  paho only while fewer than the broker's Receive Maximum (from its
  CONNACK; Mosquitto announces `max_inflight_messages`, 20 by default, and
  drops a client that sends more QoS 2 ones) are unfinished, and at most
  `BROKER_BACKLOG`; nothing is handed over while the broker is not
  connected or its socket refuses bytes. The rest wait, in order (a QoS 0
  publication behind a waiting QoS 1/2 one waits too), in a bounded
  `InjectionQueue` that drops the oldest QoS 0 one first, and above
  `INJECTION_BACKLOG_HIGH` the node stops acknowledging new QoS 1/2 copies
  (`Node.report_delivery_backlog`), so their senders keep them instead;
- out of the broker (`apply_backpressure`): the *intake* of publications
  pauses while `BACKPRESSURE_WINDOW` QoS 1/2 copies wait for the next hop's
  acknowledgement, or while the socket's send side is backed up, or the
  custody spool is over its high-water mark, and starts again at half the
  window (or after `BACKPRESSURE_MAX_PAUSE`). A paused intake never stops
  the reading of the broker's socket: the acknowledgements of our own
  injections arrive on the same connection, and a wrapper that stopped
  reading them could not complete its injections, so its neighbours' copies
  stayed unacknowledged, and their intake paused in turn (issue 37: after a
  partition healed, two wrappers held each other at 17 publications/s). The
  runtime keeps what it reads meanwhile (QoS 1/2 ones at most the Receive
  Maximum it announced, the broker sends no more unacknowledged) and stops
  reading the socket only when that holds more than `HELD_MAX` publications
  or `HELD_BYTES` (a flood of QoS 0, or of large ones);
- onto the socket (`shed`): while the send side is backed up, QoS 0 `tm`
  are dropped before the envelope, never control packets nor QoS 1/2;
- paced (`apply_backpressure`, `paced`): while a neighbour says its receive
  backlog is long (`rb`, federation.protocol.pacing), reading stops as well: QoS 0
  has no acknowledgement to hold the wrapper back otherwise.

Every drop is counted on the node (`Node.drop`); the counts here (`send_shed`,
`backpressure_pauses`, the queue's `dropped`) are what the status document
shows. A drop is also emitted as `publication_dropped` with its reason; a
QoS 0 one only when the node makes the per-publication events
(`Node.publication_events`, for an event log that keeps them): under a
sustained flood the drops are as many as the publications, and decoding
each dropped packet and writing a line for it made an overloaded wrapper
spend most of its time on what it could not deliver, and so drop more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from federation.daemon.backpressure import InjectionQueue, qos0_publications, shed_qos0
from federation.daemon.broker import BrokerAdapter
from federation.protocol import events, wire
from federation.protocol.node import Node
from federation.protocol.types import Address, Injection, InjectionRun

BACKPRESSURE_WINDOW = 512
"""QoS 1/2 copies waiting for acknowledgements (at most half of `max_unacked`) at which the wrapper stops
taking publications from its broker; it takes them again at half as many. A window, as TCP has: it bounds the
backlog a slower next wrapper has to work through (and the hellos queued behind it) to well under a second"""
BACKPRESSURE_BYTES = 16 * 1024 * 1024
"""the same window in payload bytes (at most half of `max_unacked_bytes`): large publications fill it first, and it
bounds what a wrapper puts in flight, so what each hop after it holds (issue 37: a flood of 100 kB publications had
each wrapper hold most of the flood)"""
BACKPRESSURE_MAX_PAUSE = 10.0
"""seconds: take publications again anyway (a lagging hop must not keep the broker's clients queued for ever)"""
HELD_MAX = 20000
"""publications read while the intake is paused, kept by the runtime, beyond which it stops reading the socket"""
HELD_BYTES = 16 * 1024 * 1024
"""the same bound in payload bytes"""
INJECTION_BACKLOG = 10000
"""remote publications waiting for a slow local broker; beyond it the oldest QoS 0 one is dropped first"""
INJECTION_BACKLOG_HIGH = INJECTION_BACKLOG * 7 // 8
"""waiting publications from which new QoS 1/2 copies are left unacknowledged (`Node.report_delivery_backlog`)"""
BROKER_BACKLOG = 2000
"""QoS 1/2 publications handed to paho and not completed by the broker, above which the rest wait in our queue
even when the broker's Receive Maximum is larger (MQTT's default, 65535, when it names none); at most this many
injections handed over at once, and none while paho holds bytes the socket refused"""


class FlowControl:
    """The injection queue, the broker read pauses and the send-side shedding of one wrapper."""

    def __init__(self) -> None:
        self.injection_queue: InjectionQueue[Injection] = InjectionQueue(INJECTION_BACKLOG)
        self.backpressure_pauses = 0
        """times the intake of publications from the broker was paused"""
        self.intake_paused = False
        """publications read from the broker wait (in the runtime) instead of reaching the node"""
        self.send_shed = 0
        """QoS 0 `tm` dropped because the socket's send side was backed up"""
        self._paused_at = 0.0

    def shed(self, node: Node, packets: list[tuple[bytes, Address]], now: float) -> list[tuple[bytes, Address]]:
        """The send side is backed up: drop the QoS 0 `tm` (counted, reported), keep the rest. Judged per
        protocol packet, before the envelope batches packets into datagrams."""
        kept, shed = shed_qos0(packets)
        for packet, target in shed:
            self.send_shed += 1
            report_shed(node, "send_backlog_qos0", "send_backlog", packet, now, target)
        return kept

    def inject(self, node: Node, broker: BrokerAdapter, now: float, handed: Sequence[Injection] = ()) -> None:
        """Hand remote publications (`handed`, then what waits) to the broker within its Receive Maximum; the
        rest wait in a bounded queue that drops the oldest QoS 0 publication first (federation.daemon.backpressure),
        counted and reported."""
        queue = self.injection_queue
        window = min(broker.injection_window(), BROKER_BACKLOG - broker.backlog()) if broker.max_qos else BROKER_BACKLOG
        blocked = broker.output_blocked or not broker.connected
        if handed and not len(queue) and not blocked:
            cut = _within(handed, window)  # the common case: nothing waits, and the window takes them all
            if cut < len(handed):
                self._queue(node, handed[cut:], now)
                handed = handed[:cut]
        else:
            if handed:  # some wait already, or the broker cannot take these now: they go behind, in the queue
                self._queue(node, handed, now)
            handed = [] if blocked else queue.take_within(window, BROKER_BACKLOG)
        if handed:
            broker.publish_all(handed)
        # QoS 1/2 copies are acknowledged to the previous hop on arrival: stop taking new ones before the
        # queue must drop them (it drops QoS 0 first, but a flood of QoS 1 alone would lose some).
        node.report_delivery_backlog(len(queue) >= INJECTION_BACKLOG_HIGH)

    def inject_runs(self, node: Node, broker: BrokerAdapter, runs: Sequence[InjectionRun]) -> bool:
        """`inject` for a pass whose injections are all QoS 0 runs (`InjectionRun`), when nothing waits and the
        broker takes bytes: written at once, as `inject` would hand their `Injection`s over (no window limits
        QoS 0), without an object per publication. False: nothing done (the caller goes through `inject`)."""
        if len(self.injection_queue) or broker.output_blocked or not broker.connected:
            return False
        broker.publish_runs(runs)
        node.report_delivery_backlog(False)  # as `inject` with an empty queue
        return True

    def requeue(self, node: Node, injections: Sequence[Injection], now: float) -> None:
        """Injections that wait for `inject` again, behind what waits (held ones released, or those the broker
        lost with its session: the caller puts them before what waits with `InjectionQueue.drain`)."""
        self._queue(node, injections, now)

    def _queue(self, node: Node, injections: Sequence[Injection], now: float) -> None:
        queue = self.injection_queue
        for injection in injections:
            dropped = queue.push(injection, injection.qos)
            if dropped is not None:
                node.drop("inject_backlog_qos0" if dropped.qos == 0 else "inject_backlog_qos12")
                if dropped.qos:  # custody: its copy goes back to its sender, which sends it again
                    node.injection_failed(dropped.publication, now)
                if node.publication_events or dropped.qos:  # a QoS 1/2 one is always reported
                    node.emit(events.PUBLICATION_DROPPED, now, pub=events.publication_text(dropped.publication),
                              filter=None, reason="broker_backlog")

    def apply_backpressure(self, node: Node, send_paused: bool, now: float, paced: bool = False) -> bool:
        """Stop taking publications from the broker while too many QoS 1/2 copies wait for the next hop's
        acknowledgement, and take them again once most are acknowledged (or after BACKPRESSURE_MAX_PAUSE);
        returns whether the intake is paused (the runtime keeps what it reads meanwhile: the module docstring).

        Without it a burst faster than the next wrapper runs past `max_unacked`: the oldest copies stop
        being tracked, and those the receiver dropped are lost. Paused, the broker queues for the
        wrapper as it would for a slow client (`max_queued_messages 0` in the shipped config).

        `send_paused`: the socket's send side is backed up (the kernel said EAGAIN, asyncio buffers), so
        whatever we read now would only be shed (QoS 0) or queue behind the buffer: do not read until it
        drains.

        `paced`: a neighbour's receive backlog is long (its `rb`, federation.protocol.pacing), or the spool is
        over its high-water mark: what we read now would wait there or be dropped there; do not take it until its
        hold ends or it says it is ready.
        """
        outstanding, outstanding_bytes = node.unacked_copies, node.unacked_bytes
        window = min(BACKPRESSURE_WINDOW, node.settings.max_unacked // 2)
        window_bytes = min(BACKPRESSURE_BYTES, node.settings.max_unacked_bytes // 2)
        if self.intake_paused:
            if (outstanding <= window // 2 and outstanding_bytes <= window_bytes // 2 and not send_paused
                    and not paced) or now - self._paused_at >= BACKPRESSURE_MAX_PAUSE:
                self.intake_paused = False
        elif outstanding >= window or outstanding_bytes >= window_bytes or send_paused or paced:
            self.intake_paused = True
            self._paused_at = now
            self.backpressure_pauses += 1
        return self.intake_paused


def _within(injections: Sequence[Injection], window: int) -> int:
    """How many of `injections`, from the first, hold at most `window` QoS 1/2 ones."""
    if window >= len(injections):
        return len(injections)
    reliable = 0
    for index, injection in enumerate(injections):
        if injection.qos:
            if reliable == window:
                return index
            reliable += 1
    return len(injections)


def report_shed(node: Node, counter: str, reason: str, packet: bytes, now: float, to: Address | None = None) -> None:
    """A QoS 0 `tm` or `tb` dropped under overload, still encoded: each publication in it counted as drop
    `counter` and reported as `publication_dropped` when the node makes the per-publication events (a `tm` is
    decoded only for that; a `tb`, to count what it carried)."""
    if not node.publication_events and wire.packet_type(packet) == wire.TOPIC_MESSAGE:
        node.drop(counter)  # one publication: nothing to decode
        return
    publications = qos0_publications(packet)
    node.drop(counter, len(publications) or 1)
    if not node.publication_events:
        return
    for publication, filter_ in publications:
        fields: dict[str, Any] = {"pub": events.publication_text(publication), "filter": filter_, "reason": reason}
        if to is not None:
            fields["to"] = [str(to)]
        node.emit(events.PUBLICATION_DROPPED, now, **fields)
