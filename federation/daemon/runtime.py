"""The running wrapper: asyncio glue around the sans-I/O node.

Theory of operation: one asyncio loop owns the node. Three inputs reach it,
all on the loop thread: datagrams from the UDP endpoint, batches of broker
items from the paho client, which the same loop drives (`LoopHandOff`), and one timer
(`loop.call_at`) set to `node.get_timer()`. After every input the runtime
drains the node's outputs at once (`_drain_outputs`): datagrams to the
socket, injections to the broker, events to the event log and the counters;
the timer is re-armed once per loop iteration.

Overload (docs/daemon.md "Overload"): the control plane goes first. On
each readable event the runtime takes every datagram already waiting
(`RECEIVE_BATCH`), handles every packet but `tm` at once and queues the
`tm` in a bounded `PacketBacklog`, handled `DATA_SLICE` at a time, one
slice per loop pass with the socket read again in between: a hello waits
for at most one slice, not for seconds of queued data, and a backlog the
node cannot work off is dropped QoS 0 first and counted instead of
overflowing the kernel's buffer unseen. Between the broker and the overlay
`FlowControl` (flow_control.py) bounds what waits: remote publications
queued for a slow broker, reading paused while QoS 1/2 copies wait for
acknowledgements, and, while the socket's send side is backed up
(`OverlayProtocol.writing_paused`), QoS 0 `tm` shed before the envelope
and the broker not read. The broker connection's health and warnings are
`BrokerHealth` (broker_health.py); the status document and the metrics
snapshot are built by snapshots.py.

The node's clock is unix time (so event traces from different machines line
up) that never steps backwards: wall time read once at start plus monotonic
time elapsed since (`Clock`). A wall-clock step (NTP, an operator) does not
make the node see time run backwards; the cost is that the event times of
a long run drift from the wall clock by any step made after start.

Startup order is chosen so that every mistake a person can fix (state
directory in use, port in use, metrics port in use, event log unwritable)
fails with exit status 2 before the epoch is advanced or anything is sent.
Shutdown (SIGINT/SIGTERM) leaves the federation cleanly: `node.shutdown`
announces the departure, the datagrams are flushed, the subscription table
and the event log are written, then the broker connection is closed.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from federation.daemon.backpressure import PacketBacklog
from federation.daemon.broker import BrokerAdapter
from federation.daemon.broker_health import BrokerHealth
from federation.daemon.broker_items import BrokerItem, LogLine, LoopHandOff, Publication
from federation.daemon.broker_log import BrokerLogTracker
from federation.daemon.config import DaemonConfig, is_wildcard
from federation.daemon.event_log import EventLog, EventLogError
from federation.daemon.flow_control import INJECTION_BACKLOG, FlowControl, report_shed
from federation.daemon.metrics import Snapshot, start_metrics_server
from federation.daemon.snapshots import metrics_snapshot, snapshot_from_thread, status_document
from federation.daemon.state import BackgroundWriter, LocalSubscriptions, PersistedState, StateStore, next_epoch
from federation.daemon.status import encode_reply
from federation.daemon.systemd import service_notifications
from federation.daemon.udp import (
    SOCKET_BUFFER,
    DropReporter,
    LocalAddresses,
    OverlayProtocol,
    announce_security,
    kernel_receive_drops,
    open_socket,
)
from federation.envelope.datagrams import Envelope, EnvelopeConfig, EnvelopeConfigError, envelope_epoch
from federation.protocol import events, wire
from federation.protocol.node import Node
from federation.protocol.types import Address, Event

log = logging.getLogger("federation.daemon")

KERNEL_DROPS_CHECK_INTERVAL = 10.0
"""seconds between reads of the kernel's count of datagrams dropped for a full receive buffer"""
STATE_SAVE_DELAY = 0.5
"""seconds: subscription-table writes are debounced to at most one per this delay"""
EVENT_LOG_FLUSH_INTERVAL = 1.0
"""seconds between flushes of the event log buffer"""
SHUTDOWN_DRAIN_TIMEOUT = 1.0
"""seconds to wait for the socket to send the last datagrams at shutdown"""
RECEIVE_BATCH = 4096
"""datagrams read from the socket in one pass (every one waiting, up to this): control packets go first"""
DATA_SLICE = 256
"""received `tm` handled per loop pass before the socket is read again (each pass ends with one write to the
broker; 256 against 64 measured 0.096 against 0.106 wrapper CPU s per 1,000 publications, about 10 ms a pass)"""
DATA_SLICE_BYTES = 64 * 1024
"""and at most about this many bytes of them: a `tb` carries up to a datagram of publications, so 256 of them
would be some 4,000 publications in one pass (the hello waiting that long, and more injections made per pass
than the broker is handed)"""
RECEIVE_BACKLOG = 20000
"""received `tm` waiting to be handled; beyond it (or RECEIVE_BACKLOG_BYTES) the oldest QoS 0 one is dropped"""
RECEIVE_BACKLOG_BYTES = 32 * 1024 * 1024
PACE_RECHECK_SLACK = 0.001
"""seconds after a neighbour's hold ends at which a paced wrapper looks again (the hold has then expired)"""
REFUSAL_LOG_INTERVAL = 60.0
"""seconds between log lines about publications refused for their size (every one is counted)"""


class StartupError(Exception):
    """Something a person must fix before the wrapper can run (exit status 2)."""


CLOCK_ANCHOR_TRIES = 5


class Clock:
    """Unix time that never steps backwards: wall time at start plus monotonic time elapsed.

    The wall reading is paired with the monotonic midpoint of the tightest of a few bracketed reads: a
    preemption between two plain reads would shift this wrapper's clock from its neighbours' on the same
    host by the time it was off the CPU, and the event-log clock correction would see a real offset."""

    def __init__(self) -> None:
        best: tuple[float, float, float] | None = None
        for _ in range(CLOCK_ANCHOR_TRIES):
            before = time.monotonic()
            wall = time.time()
            after = time.monotonic()
            if best is None or after - before < best[0]:
                best = (after - before, wall, (before + after) / 2)
        assert best is not None
        _, self._wall_start, self._monotonic_start = best

    def now(self) -> float:
        return self._wall_start + (time.monotonic() - self._monotonic_start)


class Runtime:
    """One wrapper: build it from a config, then `await run()`; returns the exit status."""

    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.clock = Clock()
        self.node: Node | None = None
        self.tracker = BrokerLogTracker(config.client_id)
        self.subscriptions = LocalSubscriptions()
        self.persisted = PersistedState()
        self.store: StateStore | None = StateStore(config.state_dir) if config.state_dir is not None else None
        self.event_log: EventLog | None = None
        self.event_counts: Counter[str] = Counter()
        self.broker: BrokerAdapter | None = None
        self.protocol: OverlayProtocol | None = None
        self.envelope: Envelope | None = None
        self.flow = FlowControl()
        self.drop_reporter = DropReporter()
        self.receive_backlog: PacketBacklog[Address] = PacketBacklog(RECEIVE_BACKLOG, RECEIVE_BACKLOG_BYTES)
        self._data_pass_scheduled = False
        self.kernel_receive_drops = 0
        """datagrams the kernel dropped for this wrapper's full UDP receive buffer, as of the last check"""
        self._drops_handle: asyncio.TimerHandle | None = None
        self._pace_handle: asyncio.TimerHandle | None = None
        self._refused_logged_at = float("-inf")
        self.transport: asyncio.DatagramTransport | None = None
        self.metrics_server: Any = None
        self._sock: socket.socket | None = None
        self.started_at = 0.0
        self.broker_health = BrokerHealth(config.broker, config.client_id, self._call_later)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline: float | None = None
        self._rearm_scheduled = False
        self._save_handle: asyncio.TimerHandle | None = None
        self._writer: BackgroundWriter | None = None
        self._flush_handle: asyncio.TimerHandle | None = None

    @property
    def broker_connected(self) -> bool:
        return self.broker_health.connected

    @property
    def log_lines(self) -> int:
        """Broker log lines read, over every connection."""
        return self.broker_health.log_lines

    # ------------------------------------------------------------ lifecycle

    async def run(self, handle_signals: bool = True) -> int:
        """Run until SIGINT/SIGTERM (or `request_stop`); returns 0 after a clean shutdown.

        `handle_signals=False` lets a test run the runtime outside the main thread.
        """
        loop = asyncio.get_running_loop()
        self._loop = loop
        stop = self._stop = asyncio.Event()
        signals = (signal.SIGINT, signal.SIGTERM) if handle_signals else ()
        for signum in signals:  # installed first: a signal during startup still ends in a clean shutdown
            loop.add_signal_handler(signum, stop.set)
        try:
            try:
                self._open(loop)
                node = self._start_node()
                self.transport, _protocol = await loop.create_datagram_endpoint(self.protocol_factory,
                                                                                sock=self._sock)
            except BaseException:
                self._close_resources()
                raise
            try:
                self._start_running(loop, node)
                with service_notifications(loop):  # systemd: READY=1, WATCHDOG=1 while running, STOPPING=1
                    await stop.wait()
            finally:
                await self._shutdown()
        finally:
            for signum in signals:
                loop.remove_signal_handler(signum)
        return 0

    def _start_running(self, loop: asyncio.AbstractEventLoop, node: Node) -> None:
        hand_off = LoopHandOff(loop, self._on_broker_items)
        # paho driven by this loop (no network thread); a burst read from the broker reaches the node at once.
        self.broker = BrokerAdapter(self.config.broker, self.config.client_id, hand_off.put, self.config.max_qos,
                                    loop=loop, flush=hand_off.flush, on_completed=self._on_broker_completed,
                                    hold=hand_off.hold)
        now = self.clock.now()
        node.start(now)
        replayed = self.subscriptions.replay(node, now)
        if replayed:
            log.info("replayed %d saved subscriptions of %d clients into the node", replayed,
                     len(self.subscriptions.clients))
        self._drain_outputs(now)
        self.broker.start()
        self._flush_handle = loop.call_later(EVENT_LOG_FLUSH_INTERVAL, self._periodic_flush)
        self._drops_handle = loop.call_later(KERNEL_DROPS_CHECK_INTERVAL, self._check_kernel_drops)
        log.info("wrapper %s (id %s, epoch %d) listening on UDP %s; neighbours: %s; broker %s as %r",
                 self.config.announced, node.broker_id, node.epoch, self.config.bind,
                 ", ".join(str(n) for n in self.config.neighbours) or "none (waiting for hellos)",
                 self.config.broker, self.config.client_id)
        assert self.envelope is not None
        announce_security(self.envelope, self.config.bind, self.config.broker, self.config.key_file)

    def protocol_factory(self) -> OverlayProtocol:
        assert self.protocol is not None
        return self.protocol

    def request_stop(self) -> None:
        """Ask the runtime to shut down (thread-safe)."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def _call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        """`loop.call_later` for the parts built before the loop runs (`BrokerHealth`)."""
        assert self._loop is not None
        return self._loop.call_later(delay, callback)

    def _open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take every resource that can fail because of the configuration; StartupError-like exceptions."""
        config = self.config
        if self.store is not None:
            self.store.lock()
        self._sock = open_socket(config.bind, config.family)
        known = {config.announced.host}
        if not is_wildcard(config.bind.host):
            known.add(config.bind.host)
        self.protocol = OverlayProtocol(self._on_datagram, self._on_status, LocalAddresses(known), sock=self._sock,
                                        on_resume_writing=self._on_send_resumed)
        if config.metrics_port is not None:
            try:
                self.metrics_server = start_metrics_server(config.metrics_bind, config.metrics_port,
                                                           self.metrics_snapshot_threadsafe)
            except OSError as error:
                raise StartupError(
                    f"--metrics-port: cannot serve metrics on {config.metrics_bind}:{config.metrics_port}: "
                    f"{error.strerror or error}; choose another --metrics-port (or metrics_bind)") from None
        if config.event_log is not None:
            try:
                self.event_log = EventLog(config.event_log, config.event_types)
            except EventLogError as error:
                raise StartupError(str(error)) from None

    def _start_node(self) -> Node:
        config = self.config
        wall = time.time()
        epoch = int(wall)
        if self.store is not None:
            persisted, warning = self.store.load()
            if warning:
                log.warning("%s", warning)
            epoch = next_epoch(persisted.epoch, wall)
            broker = str(config.broker)
            if persisted.broker is not None and persisted.broker != broker and persisted.subscriptions.clients:
                log.warning("saved subscriptions were learned from broker %s, not %s: not replaying them",
                            persisted.broker, broker)
                persisted.subscriptions = LocalSubscriptions()
            persisted.epoch = epoch
            persisted.broker = broker
            self.persisted = persisted
            self.subscriptions = persisted.subscriptions
            try:
                self.store.save(persisted, wall)  # the new epoch is on disk before anything is sent
            except OSError as error:
                raise StartupError(f"--state-dir: cannot write {self.store.path}: {error.strerror or error}; "
                                   f"give a writable directory") from None
        self.node = Node(config.announced, config.neighbours, epoch, random.Random(), config.settings,
                         vid=config.vid, name=config.name)
        self.node.publication_events = config.publication_events
        try:
            self.envelope = Envelope(config.announced, envelope_epoch(epoch, wall),
                                     EnvelopeConfig.from_settings(self.node.settings, config.keys, config.encryption),
                                     drop_sink=self.node.count_drop)
        except EnvelopeConfigError as error:
            raise StartupError(str(error)) from None
        self.started_at = self.clock.now()
        return self.node

    async def _shutdown(self) -> None:
        node = self.node
        assert node is not None
        now = self.clock.now()
        node.shutdown(now)
        self._drain_outputs(now)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = time.monotonic() + SHUTDOWN_DRAIN_TIMEOUT
        while self.unsent_bytes() > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._writer is not None:
            await self._writer.drain()  # the thread's write first: one writer at a time
        self._save_state(synchronous=True)
        if self.broker is not None:
            if self.broker.on_loop:
                self.broker.stop()  # on the loop's thread, as the adapter requires; it does not block
            else:  # paho's thread joins within about a second; do not block the loop meanwhile
                await asyncio.get_running_loop().run_in_executor(None, self.broker.stop)
        log.info("wrapper %s stopped", self.config.announced)
        self._close_resources()

    def unsent_bytes(self) -> int:
        """Bytes asyncio holds for the overlay socket (it said EAGAIN)."""
        size = getattr(self.transport, "get_write_buffer_size", None)
        return int(size()) if size is not None and self.transport is not None else 0

    def read_kernel_receive_drops(self) -> int | None:
        """The kernel's count of datagrams dropped for a full receive buffer, now (None: not known)."""
        return kernel_receive_drops(self._sock) if self._sock is not None else None

    def _close_resources(self) -> None:
        for handle in (self._save_handle, self._flush_handle, self._drops_handle, self._pace_handle, self._timer):
            if handle is not None:
                handle.cancel()
        self.broker_health.close()
        if self.event_log is not None:
            self.event_log.close()
        if self.transport is not None:
            self.transport.close()
        elif self._sock is not None:
            self._sock.close()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
            self.metrics_server = None
        if self.store is not None:
            self.store.unlock()

    # ------------------------------------------------------------ inputs

    def _on_datagram(self, data: bytes, source: Address) -> None:
        node = self.node
        if node is None:
            return
        self._data_pass(self._receive(node, [(data, source)]))

    def _receive(self, node: Node, datagrams: list[tuple[bytes, Address]]) -> float:
        """`datagrams`, and every one waiting in the socket: control packets to the node now, `tm` queued.

        Returns the time they were handled at, read after the socket: every one of them arrived before it,
        which the hello exchange's clock bound relies on (an echo stamped before it arrived would make a
        shared clock look offset)."""
        envelope = self.envelope
        assert envelope is not None
        if self.protocol is not None:
            datagrams += self.protocol.read_waiting(RECEIVE_BATCH)
        now = self.clock.now()
        backlog = self.receive_backlog
        queued_from: set[Address] = set()
        for data, source in datagrams:
            queued = False
            for packet in envelope.receive_datagram(data, source, now):
                if wire.packet_type(packet) not in wire.DATA_TYPES:
                    node.receive_datagram(packet, source, now)
                    continue
                queued = True
                for dropped in backlog.push(packet, source):
                    if dropped is None:  # QoS 1/2: never acknowledged, so its sender sends it again
                        node.count_drop("receive_backlog_qos12")
                    else:
                        report_shed(node, "receive_backlog_qos0", "receive_backlog", dropped, now)
            if queued:
                queued_from.add(source)
        if queued_from:  # only neighbours are told: a datagram's source address may be forged
            node.pacing.on_receive_backlog(self._backlog_level(),
                                           (source for source in queued_from if node.neighbours.get(source)), now)
        return now

    def _backlog_level(self) -> int:
        """The receive backlog in packets, or its bytes scaled to its packet bound if they fill it faster, or the
        injection queue scaled likewise if the broker is what holds the data up (the pacing level)."""
        backlog = self.receive_backlog
        return max(len(backlog), backlog.bytes * backlog.max_packets // backlog.max_bytes,
                   len(self.flow.injection_queue) * backlog.max_packets // INJECTION_BACKLOG)

    def _scheduled_data_pass(self) -> None:
        self._data_pass_scheduled = False
        node = self.node
        if node is None:
            return
        self._data_pass(self._receive(node, []))  # what arrived meanwhile: its hellos go before the next slice

    def _data_pass(self, now: float) -> None:
        """Handle one slice of queued `tm`; the rest in later loop passes, each reading the socket first."""
        node = self.node
        assert node is not None
        for packet, source in self.receive_backlog.take(DATA_SLICE, DATA_SLICE_BYTES):
            node.receive_datagram(packet, source, now)
        if node.pacing.busy:
            node.pacing.on_receive_backlog(self._backlog_level(), (), now)
        if len(self.receive_backlog) and not self._data_pass_scheduled and self._loop is not None:
            self._data_pass_scheduled = True
            self._loop.call_soon(self._scheduled_data_pass)
        self._drain_outputs(now)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_deadline = None
        node = self.node
        if node is None:
            return
        now = self.clock.now()
        try:
            node.handle_timer(now)
            if self.envelope is not None:
                self.envelope.handle_timer(now)  # reassembly timeouts, at most a hello interval late
        finally:
            self._drain_outputs(now)

    def _on_broker_items(self, batch: list[BrokerItem]) -> None:
        node = self.node
        if node is None:
            return
        now = self.clock.now()
        changed = False
        limit = node.settings.max_publication_bytes
        # QoS 0 publications in a row: one `tb` run (federation.protocol.publication_batch)
        run: list[tuple[str, bytes]] = []
        for item in batch:
            if isinstance(item, Publication):
                if len(item.payload) > limit:
                    self._refuse_publication(item, now)
                elif not item.qos and not item.retain and item.properties is None:
                    run.append((item.topic, item.payload))
                else:
                    if run:
                        node.local_publish_run(run, now)
                        run = []
                    node.local_publish(item.topic, item.payload, item.qos, item.retain, item.properties, now)
                continue
            if run:  # kept in order with what follows
                node.local_publish_run(run, now)
                run = []
            if isinstance(item, LogLine):
                self.broker_health.log_line()
                for event in self.tracker.feed(item.topic, item.payload):
                    changed = self.subscriptions.apply(event, node, now) or changed
            else:
                self.broker_health.on_state(item, now)
        if run:
            node.local_publish_run(run, now)
        if changed:
            self._schedule_save()
        self._drain_outputs(now)

    def _refuse_publication(self, item: Publication, now: float) -> None:
        """A local publication above max_publication_bytes: not federated (never truncated), counted, logged."""
        node = self.node
        assert node is not None
        limit = node.settings.max_publication_bytes
        node.count_drop("publication_too_large")
        event = Event(now, str(node.address), events.PUBLICATION_DROPPED,
                      {"pub": None, "filter": None, "reason": "too_large", "topic": item.topic,
                       "size": len(item.payload)})
        self.event_counts[event.type] += 1
        if self.event_log is not None:
            self.event_log.write([event])
        if now - self._refused_logged_at >= REFUSAL_LOG_INTERVAL:
            self._refused_logged_at = now
            log.warning("publication on %r refused: its payload of %d bytes is above max_publication_bytes (%d); "
                        "it reaches this broker's own subscribers but is not federated (raise "
                        "settings.max_publication_bytes and max_packet on every wrapper to allow it; further "
                        "refusals are counted as drop publication_too_large and logged once a minute)",
                        item.topic, len(item.payload), limit)

    def _on_status(self, addr: Any) -> None:
        if self.transport is None:
            return
        try:
            reply = encode_reply(self.status_document())
        except (TypeError, ValueError) as error:  # a bug, not a reason to stop the daemon
            log.error("cannot build the status reply: %s", error)
            return
        self.transport.sendto(reply, addr)

    # ------------------------------------------------------------ outputs

    def _drain_outputs(self, now: float) -> None:
        try:
            self._send_outputs(now)
        finally:  # whatever fails, the timer keeps running; after the sends, which it does not delay
            self._schedule_rearm()

    def _send_outputs(self, now: float) -> None:
        node = self.node
        assert node is not None
        transport = self.transport
        paced_until = node.pacing.paced(now)  # first: a hold that ended makes the ready we owe upstream
        datagrams = node.datagrams_to_send()
        if datagrams and self.protocol is not None and self.protocol.writing_paused:
            datagrams = self.flow.shed(node, datagrams, now)
        envelope = self.envelope
        if envelope is not None:  # batch, fragment, sign
            for data, target in datagrams:
                envelope.send(data, target, now)
            datagrams = envelope.datagrams_to_send(now)
        if transport is not None:
            for data, target in datagrams:
                transport.sendto(data, (target.host, target.port))
        broker = self.broker
        if broker is not None:
            self.flow.inject(node, broker, now)
            if broker.on_loop:
                self._apply_backpressure(node, broker, now, paced_until)
        emitted = node.events_emitted()
        if envelope is not None:
            dropped = envelope.events_emitted()
            if dropped:
                self.drop_reporter.report(dropped, now)
                emitted += dropped
        if emitted:
            counts = self.event_counts
            for event in emitted:
                counts[event.type] += 1
                if event.type == events.EPOCH_CHANGED and self.store is not None:
                    self.persisted.epoch = node.epoch
                    self._schedule_save()
            if self.event_log is not None:
                self.event_log.write(emitted)

    def _on_send_resumed(self) -> None:
        """The socket took the buffered datagrams: read from the broker again if only that held it."""
        if self.node is not None and self.broker is not None and self.broker.on_loop:
            now = self.clock.now()
            self._apply_backpressure(self.node, self.broker, now, self.node.pacing.paced(now))

    def _on_broker_completed(self) -> None:
        """The broker completed some of our QoS 1/2 publications, or took the bytes its socket had refused: hand
        it what waits for room at once."""
        if self.node is not None and self.broker is not None and len(self.flow.injection_queue):
            self.flow.inject(self.node, self.broker, self.clock.now())

    def _apply_backpressure(self, node: Node, broker: BrokerAdapter, now: float, paced_until: float | None) -> None:
        """Pause or resume reading from the broker (`FlowControl.apply_backpressure`); while a neighbour
        paces us, look again when its hold ends (nothing else may wake us: we read nothing meanwhile).
        `paced_until`: `Pacing.paced(now)`, the end of the longest hold on us, None when nothing paces us."""
        send_paused = self.protocol is not None and self.protocol.writing_paused
        self.flow.apply_backpressure(node, broker, send_paused, now, paced=paced_until is not None)
        if paced_until is not None and self._pace_handle is None and self._loop is not None:
            self._pace_handle = self._loop.call_later(paced_until - now + PACE_RECHECK_SLACK, self._pace_ended)

    def _pace_ended(self) -> None:
        self._pace_handle = None
        if self.node is not None:
            self._drain_outputs(self.clock.now())  # sends the ready its end may make, then reads again

    def _schedule_rearm(self) -> None:
        """Re-arm the node timer once per loop iteration, however many inputs it had."""
        if not self._rearm_scheduled and self._loop is not None:
            self._rearm_scheduled = True
            self._loop.call_soon(self._rearm_timer)

    def _rearm_timer(self) -> None:
        self._rearm_scheduled = False
        node, loop = self.node, self._loop
        if node is None or loop is None:
            return
        deadline = node.get_timer()
        if deadline == self._timer_deadline and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_deadline = deadline
        if deadline is not None:
            self._timer = loop.call_at(loop.time() + max(0.0, deadline - self.clock.now()), self._on_timer)

    def _periodic_flush(self) -> None:
        if self.event_log is not None:
            self.event_log.flush()
        assert self._loop is not None
        self._flush_handle = self._loop.call_later(EVENT_LOG_FLUSH_INTERVAL, self._periodic_flush)

    def _check_kernel_drops(self) -> None:
        """Warn when the kernel dropped datagrams meant for us: losses nothing else in the wrapper can see."""
        assert self._loop is not None
        self._drops_handle = self._loop.call_later(KERNEL_DROPS_CHECK_INTERVAL, self._check_kernel_drops)
        drops = self.read_kernel_receive_drops()
        if drops is None or drops <= self.kernel_receive_drops:
            return
        log.warning("the kernel dropped %d datagrams for this wrapper in the last %g s (%d in all): its UDP receive "
                    "buffer was full because neighbours send faster than it handles them; QoS 0 publications "
                    "among them are lost, QoS 1/2 ones are sent again. Lower the publication rate, or raise "
                    "net.core.rmem_max (the wrapper asks for %d bytes)", drops - self.kernel_receive_drops,
                    KERNEL_DROPS_CHECK_INTERVAL, drops, SOCKET_BUFFER)
        self.kernel_receive_drops = drops

    def _schedule_save(self) -> None:
        if self.store is None or self._save_handle is not None or self._loop is None:
            return
        self._save_handle = self._loop.call_later(STATE_SAVE_DELAY, self._save_state)

    def _save_state(self, synchronous: bool = False) -> None:
        """Write the subscription table and epoch: in the writer thread while running (the fsync must not
        stall the loop), on this thread at shutdown."""
        self._save_handle = None
        store = self.store
        if store is None:
            return
        if self.node is not None:
            self.persisted.epoch = max(self.persisted.epoch or 0, self.node.epoch)
        self.persisted.subscriptions = self.subscriptions
        content = store.encode(self.persisted, self.clock.now())
        if not synchronous and self._loop is not None:
            if self._writer is None:
                self._writer = BackgroundWriter(store, self._loop, self._save_failed)
            self._writer.submit(content)
            return
        try:
            store.write(content)
        except OSError as error:
            self._save_failed(error)

    def _save_failed(self, error: OSError) -> None:
        assert self.store is not None
        log.error("cannot save the state file %s: %s (will retry at the next change)", self.store.path, error)

    # ------------------------------------------------------------ status and metrics

    def status_document(self) -> dict[str, Any]:
        return status_document(self, self.clock.now())

    def metrics_snapshot(self) -> Snapshot:
        """Copies of every number the metrics expose (runs on the loop thread)."""
        return metrics_snapshot(self)

    def metrics_snapshot_threadsafe(self, timeout: float = 2.0) -> Snapshot | None:
        """Called from the metrics thread: run `metrics_snapshot` on the loop and wait for it."""
        if self._loop is None or self.node is None:
            return None
        return snapshot_from_thread(self._loop, self.metrics_snapshot, timeout)
