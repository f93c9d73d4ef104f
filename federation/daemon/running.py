"""A started wrapper: the asyncio glue between the overlay socket, the broker connection and the node.

Theory of operation: one asyncio loop owns the node. Three inputs reach it,
all on the loop thread: datagrams from the UDP endpoint, batches of broker
items from the paho client, which the same loop drives (`LoopHandOff`), and one timer
(`loop.call_at`) set to `node.get_timer()`. After every input `Running`
drains the node's outputs at once (`_drain_outputs`): datagrams to the
socket, injections to the broker, events to the event log and the counters;
the timer is re-armed once per loop iteration.

Every part exists before the first input: the runtime (runtime.py) opens
the resources, boots the node and opens the UDP endpoint, and builds one
`Running` from them, which wires the rest (the broker adapter, the flow
control, the queues) in its constructor; `start` starts the node and the
broker connection, `shutdown` leaves the federation and releases it all.

Overload (docs/daemon.md "Overload"): the control plane goes first. On
each readable event the wrapper takes every datagram already waiting
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

Shutdown (SIGINT/SIGTERM) leaves the federation cleanly: `node.shutdown`
announces the departure, the datagrams are flushed, the subscription table
and the event log are written, then the broker connection is closed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import Counter
from itertools import repeat
from typing import Any

from federation.daemon import wrapper_events
from federation.daemon.backpressure import PacketBacklog
from federation.daemon.broker import BrokerAdapter
from federation.daemon.broker_health import BrokerHealth
from federation.daemon.broker_items import (
    BrokerItem,
    Connected,
    Disconnected,
    LogLine,
    LoopHandOff,
    Publication,
    PublicationRun,
    SubscriptionCount,
    split_oversized_runs,
)
from federation.daemon.broker_log import BrokerLogTracker, ClientSubscribed
from federation.daemon.broker_subscriptions import BrokerSubscriptions
from federation.daemon.clock import Clock
from federation.daemon.config import DaemonConfig
from federation.daemon.flow_control import INJECTION_BACKLOG, FlowControl, report_shed
from federation.daemon.health import Readiness
from federation.daemon.injections import InjectionJournal
from federation.daemon.metrics import Snapshot
from federation.daemon.reload import Reloads, reload_files
from federation.daemon.retained import RetainedStore, RetainedValue, prepare, stamp
from federation.daemon.retained_scan import (
    SCAN_SUBSCRIPTIONS,
    HeldRetained,
    RetainedScan,
    ScanCounts,
    scan_client_id,
    to_originate,
)
from federation.daemon.snapshots import metrics_snapshot, status_document, wrapper_readiness
from federation.daemon.spool import Spool, SpooledPublication
from federation.daemon.startup import Resources
from federation.daemon.state import PersistedState, StateSaver
from federation.daemon.status import encode_reply
from federation.daemon.udp import (
    SOCKET_BUFFER,
    DropReporter,
    OverlayProtocol,
    announce_security,
    kernel_receive_drops,
)
from federation.envelope.datagrams import Envelope
from federation.protocol import events, wire
from federation.protocol.node import Node
from federation.protocol.types import Address, Event, Injection, expand_runs, only_runs

log = logging.getLogger("federation.daemon")

KERNEL_DROPS_CHECK_INTERVAL = 10.0
"""seconds between reads of the kernel's count of datagrams dropped for a full receive buffer"""
EVENT_LOG_FLUSH_INTERVAL = 1.0
"""seconds between flushes of the event log buffer"""
SHUTDOWN_DRAIN_TIMEOUT = 1.0
"""seconds to wait for the socket to send the last datagrams at shutdown"""
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
PACE_RECHECK_SLACK = 0.001
"""seconds after a neighbour's hold ends at which a paced wrapper looks again (the hold has then expired)"""
REFUSAL_LOG_INTERVAL = 60.0
"""seconds between log lines about publications refused for their size (every one is counted)"""
HOUSEKEEPING_INTERVAL = 1.0
"""seconds between looks at what ends with time in the broker's subscriptions (a resubscribe grace, over-delivery)"""


class Running:
    """One started wrapper: its node and every part around it, wired to the loop, until `shutdown`."""

    def __init__(self, config: DaemonConfig, clock: Clock, loop: asyncio.AbstractEventLoop, resources: Resources,
                 node: Node, envelope: Envelope, persisted: PersistedState, protocol: OverlayProtocol,
                 transport: asyncio.DatagramTransport) -> None:
        """Wire the parts (on the loop's thread); nothing is sent or read before the loop runs again."""
        self.config = config
        self.clock = clock
        self.loop = loop
        self.resources = resources
        self.node = node
        self.envelope = envelope
        self.protocol = protocol
        self.transport = transport
        self.event_log = resources.event_log
        self.subscriptions = persisted.subscriptions
        self.saver = (StateSaver(resources.store, persisted, loop, lambda: node.epoch, clock.now, node.known_filters)
                      if resources.store is not None else None)
        """writes the subscription table and the epoch; None without a state directory"""
        self.tracker = BrokerLogTracker(config.client_id, helper_client_ids=(scan_client_id(config.client_id),))
        self.broker_health = BrokerHealth(config.broker, config.client_id, loop.call_later, config.broker_auth)
        self.journal: InjectionJournal | None = resources.journal
        """the injection journal (with a state directory)"""
        self.spool: Spool | None = resources.spool
        """the custody spool of our own QoS 1/2 publications (with a state directory)"""
        self.retained = resources.retained if resources.retained is not None else RetainedStore()
        """the newest retained value of every topic (kept in the state directory when there is one)"""
        node.attach_retained(self.retained)  # the node compares it with the neighbours' stores (rule 10)
        self.retained_scan: RetainedScan | None = None
        """the reading of the broker's retained messages under way (retained_scan.py)"""
        self.retained_scan_counts = ScanCounts()
        self._retained_scan_due = False
        """the broker connected with the session kept: its retained messages are read once the wrapper is ready"""
        self.restored_filters = persisted.filters
        """the filters the node knew in its previous life (`Node.restore`)"""
        self.outbox = wrapper_events.WrapperEvents(str(node.address))
        """the daemon's own events, written with the node's"""
        hand_off = LoopHandOff(loop, self._on_broker_items)
        # paho driven by this loop (no network thread); a burst read from the broker reaches the node at once.
        self.broker = BrokerAdapter(config.broker, config.client_id, hand_off.put, config.max_qos, loop=loop,
                                    flush=hand_off.flush, on_completed=self._on_broker_completed,
                                    hold=hand_off.hold, auth=config.broker_auth,
                                    session_expiry=config.broker_session_expiry, recorder=self.journal)
        if self.journal is not None:
            self.broker.restore([(entry.mid, entry.injection, entry.released) for entry in self.journal.in_flight()])
        self.broker_subscriptions = BrokerSubscriptions(node, node.drop, self.outbox, self.subscriptions,
                                                        config.resubscribe_grace, node.injection_failed)
        """a broker that lost its subscriptions, and subscriptions it holds that the wrapper did not see"""
        self.duplicates_suppressed = 0
        """remote QoS 1/2 publications not injected because the journal says the broker completed them"""
        self.flow = FlowControl()
        self.receive_backlog: PacketBacklog[Address] = PacketBacklog(RECEIVE_BACKLOG, RECEIVE_BACKLOG_BYTES)
        self.drop_reporter = DropReporter()
        self.event_counts: Counter[str] = Counter()
        self.kernel_receive_drops = 0
        """datagrams the kernel dropped for this wrapper's full UDP receive buffer, as of the last check"""
        self.started_at = clock.now()
        self.reloads = Reloads()
        """what SIGHUPs did (`reload`)"""
        self._refused_logged_at = float("-inf")
        self._refused_unlogged = 0
        self._data_pass_scheduled = False
        self._rearm_scheduled = False
        self.stopping = False
        """set when the shutdown starts: nothing received is handled any more"""
        self._timer: asyncio.TimerHandle | None = None
        """the node's timer, while it has a deadline"""
        self._timer_deadline: float | None = None
        self._pace_handle: asyncio.TimerHandle | None = None
        """the look at the broker again once a neighbour's hold on us ends, while one is pending"""
        self._flush_handle = loop.call_later(EVENT_LOG_FLUSH_INTERVAL, self._periodic_flush)
        self._drops_handle = loop.call_later(KERNEL_DROPS_CHECK_INTERVAL, self._check_kernel_drops)
        self._housekeeping_handle = loop.call_later(HOUSEKEEPING_INTERVAL, self._housekeeping)
        protocol.attach(self._on_datagram, self._answer_status, self._on_send_resumed)

    @property
    def sock(self) -> socket.socket:
        """The overlay's UDP socket (the transport's)."""
        return self.resources.sock

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the node (with what the state directory kept: stream positions, filters, subscriptions, the
        spooled publications) and the broker connection."""
        node = self.node
        now = self.clock.now()
        if self.journal is not None or self.restored_filters:
            node.restore(streams=self.journal.stream_positions() if self.journal is not None else None,
                         filters=self.restored_filters)
        node.start(now)
        replayed = self.subscriptions.replay(node, now)
        if replayed:
            log.info("replayed %d saved subscriptions of %d clients into the node", replayed,
                     len(self.subscriptions.clients))
        self.broker_subscriptions.table_changed(now)
        self._replay_spool(now)  # before anything new is read from the broker: order is kept
        self._drain_outputs(now)
        self.broker.start()
        config = self.config
        log.info("wrapper %s (id %s, epoch %d) listening on UDP %s; neighbours: %s; broker %s as %r %s",
                 config.announced, node.broker_id, node.epoch, config.bind,
                 ", ".join(str(n) for n in config.neighbours) or "none (waiting for hellos)",
                 config.broker, config.client_id, config.broker_auth.describe())
        announce_security(self.envelope, config.bind, config.broker, config.key_file)
        for warning in config.broker_auth.permission_warnings():
            log.warning("%s", warning)

    def _replay_spool(self, now: float) -> None:
        """Our QoS 1/2 publications a previous run took from the broker (and acknowledged) but had not delivered
        everywhere: originated again under their ids, in their order; those past their expiry are dropped."""
        spool = self.spool
        if spool is None or not spool.entries:
            return
        node = self.node
        expired = {entry.key: reason for entry, reason in spool.due_to_drop(time.time())}
        for entry in spool.recovered():
            if entry.key in expired:
                self._drop_spooled(entry, expired[entry.key] == "spool_expired", now)
                continue
            node.local_publish(entry.topic, entry.payload, entry.qos, entry.retain, entry.properties, now,
                               publication_id=(node.address, entry.epoch, entry.seq))
        if expired:
            spool.release(expired)
        log.info("sent again %d publications of a previous run from the custody spool (%d expired)",
                 len(spool.entries), len(expired))

    def _drop_spooled(self, entry: SpooledPublication, expired: bool, now: float) -> None:
        """A spooled publication past its message expiry (`expired`) or the spool's `max_age`: counted, reported."""
        node = self.node
        reason = "spool_expired" if expired else "spool_age"
        node.drop(reason, event=events.PUBLICATION_DROPPED, now=now,
                  pub=events.publication_text((node.address, entry.epoch, entry.seq)), filter=None, reason=reason)

    async def shutdown(self) -> None:
        """Leave the federation, flush, save, disconnect from the broker, release everything."""
        self.stopping = True
        pause = getattr(self.transport, "pause_reading", None)  # asyncio's selector transports; not in the ABC
        if pause is not None:
            pause()  # what still arrives waits in the socket, dropped with it at close
        now = self.clock.now()
        self.node.shutdown(now)
        self._drain_outputs(now)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = time.monotonic() + SHUTDOWN_DRAIN_TIMEOUT
        while self.unsent_bytes() > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self.saver is not None:
            await self.saver.save_now()
        self.broker.stop()  # on the loop's thread, as the adapter requires; it does not block
        log.info("wrapper %s stopped", self.config.announced)
        self.close()

    def reload(self) -> None:
        """SIGHUP: reopen the event log at its path, re-read the key file and the broker password file; what
        cannot be read keeps what the wrapper has (reload.py)."""
        reload_files(self.config, self.event_log, self.envelope, self.broker, self.broker_health, self.reloads)

    def close(self) -> None:
        """Cancel every timer and release the resources (the socket through its transport)."""
        for handle in (self._flush_handle, self._drops_handle, self._housekeeping_handle, self._pace_handle,
                       self._timer):
            if handle is not None:
                handle.cancel()
        if self.saver is not None:
            self.saver.cancel()
        if self.retained_scan is not None:
            self.retained_scan.close()
            self.retained_scan = None
        self.broker_health.close()
        self.resources.close(self.transport)

    def unsent_bytes(self) -> int:
        """Bytes asyncio holds for the overlay socket (it said EAGAIN)."""
        size = getattr(self.transport, "get_write_buffer_size", None)  # asyncio's; not in the typed ABC
        return int(size()) if size is not None else 0

    def read_kernel_receive_drops(self) -> int | None:
        """The kernel's count of datagrams dropped for a full receive buffer, now (None: not known)."""
        return kernel_receive_drops(self.sock)

    # ------------------------------------------------------------ inputs

    def _on_datagram(self, data: bytes, source: Address) -> None:
        if not self.stopping:
            self._data_pass(self._receive_datagrams(self.node, [(data, source)]))

    def _receive_datagrams(self, node: Node, datagrams: list[tuple[bytes, Address]]) -> float:
        """`datagrams`, and those waiting in the socket (up to RECEIVE_BATCH, read RECEIVE_CHUNK at a time while
        the pass is under RECEIVE_PASS_SECONDS): control packets to the node now, `tm` queued.

        Returns the time the last of them were handled at; each chunk is handled at a time read after the
        socket: every one of them arrived before it, which the hello exchange's clock bound relies on (an
        echo stamped before it arrived would make a shared clock look offset)."""
        envelope = self.envelope
        backlog = self.receive_backlog
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
            node.on_receive_backlog(self._backlog_level(), queued_from, now)
        return now

    def _backlog_level(self) -> int:
        """The receive backlog in packets, or its bytes scaled to its packet bound if they fill it faster, or the
        injection queue scaled likewise if the broker is what holds the data up (the pacing level)."""
        backlog = self.receive_backlog
        return max(len(backlog), backlog.bytes * backlog.max_packets // backlog.max_bytes,
                   len(self.flow.injection_queue) * backlog.max_packets // INJECTION_BACKLOG)

    def _scheduled_data_pass(self) -> None:
        self._data_pass_scheduled = False
        if self.stopping:
            return
        # what arrived meanwhile: its hellos go before the next slice
        self._data_pass(self._receive_datagrams(self.node, []))

    def _data_pass(self, now: float) -> None:
        """Handle one slice of queued `tm`; the rest in later loop passes, each reading the socket first."""
        node = self.node
        budget = DATA_SLICE_BYTES_WAITING if len(self.flow.injection_queue) else DATA_SLICE_BYTES
        for packet, source in self.receive_backlog.take(DATA_SLICE, budget):
            node.receive_packet(packet, source, now)
        if node.receive_busy:
            node.on_receive_backlog(self._backlog_level(), (), now)
        if len(self.receive_backlog) and not self._data_pass_scheduled:
            self._data_pass_scheduled = True
            self.loop.call_soon(self._scheduled_data_pass)
        self._drain_outputs(now)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_deadline = None
        now = self.clock.now()
        try:
            self.node.handle_timer(now)
            self.envelope.handle_timer(now)  # reassembly timeouts, at most a hello interval late
        finally:
            self._drain_outputs(now)

    def _on_broker_items(self, batch: list[BrokerItem]) -> None:
        node = self.node
        now = self.clock.now()
        changed = False
        limit = node.settings.max_publication_bytes
        acks: list[tuple[int, int]] = []
        spooled: list[SpooledPublication] = []
        spool = self.spool
        # Plain publications of one QoS in a row: one run (`tb` for QoS 0, `tq` for QoS 1/2: federation.protocol
        # .publications), their packet ids kept for the spool.
        run: list[tuple[str, bytes]] = []
        run_qos = 0
        run_mids: list[int] = []
        batch = split_oversized_runs(batch, limit)  # such runs one at a time: a refusal is per publication
        try:
            for item in batch:
                if type(item) is PublicationRun:  # plain ones, read as a run (LeanClient.lean_run)
                    qos = item.qos
                    if run and qos != run_qos:
                        self._publish_run(run, run_qos, run_mids, now, spooled)
                        run, run_mids = [], []
                    run += zip(item.topics, item.payloads, strict=True)
                    run_qos = qos
                    if qos:
                        run_mids += item.mids
                        acks += zip(item.mids, repeat(qos))
                    continue
                if isinstance(item, Publication):
                    qos = item.qos
                    if qos:
                        acks.append((item.mid, qos))
                        if item.dup and spool is not None and spool.redelivery(item.mid, item.topic, item.payload):
                            continue  # in custody since before a restart: acknowledged now, not originated twice
                    if len(item.payload) > limit:
                        self._refuse_publication(item, now)
                    elif not item.retain and item.properties is None:
                        if run and qos != run_qos:
                            self._publish_run(run, run_qos, run_mids, now, spooled)
                            run, run_mids = [], []
                        run.append((item.topic, item.payload))
                        run_qos = qos
                        if qos:
                            run_mids.append(item.mid)
                    else:
                        if run:
                            self._publish_run(run, run_qos, run_mids, now, spooled)
                            run, run_mids = [], []
                        entry = self._originate(item, now)
                        if entry is not None:
                            spooled.append(entry)
                    continue
                if run:  # kept in order with what follows
                    self._publish_run(run, run_qos, run_mids, now, spooled)
                    run, run_mids = [], []
                if isinstance(item, LogLine):
                    if item.qos:
                        acks.append((item.mid, item.qos))
                    self.broker_health.count_log_line()
                    for event in self.tracker.feed(item.topic, item.payload):
                        changed = self.subscriptions.apply(event, node, now) or changed
                        if isinstance(event, ClientSubscribed):
                            released = self.broker_subscriptions.subscribed(event.client, event.filter, now)
                            if released:  # held since the broker restarted: now, in their order
                                self.flow.requeue(node, released, now)
                elif isinstance(item, SubscriptionCount):
                    released = self.broker_subscriptions.counted(item.count, now)
                    if released:
                        self.flow.requeue(node, released, now)
                else:
                    self._on_broker_state(item, now)
            if run:
                self._publish_run(run, run_qos, run_mids, now, spooled)
        finally:
            # The one place the broker's publications (and log lines) are acknowledged: after the node took them
            # and, for QoS 1/2, the spool holds them (one write: a killed wrapper loses none it acknowledged).
            if spooled and spool is not None:
                spool.add(spooled)
            self.broker.acknowledge(acks)
        if changed:
            self.broker_subscriptions.table_changed(now)
            if self.saver is not None:
                self.saver.schedule()
        self._drain_outputs(now)

    def _publish_run(self, run: list[tuple[str, bytes]], qos: int, mids: list[int], now: float,
                     spooled: list[SpooledPublication]) -> None:
        """A run of plain local publications of one QoS to the node; the spool entries of QoS 1/2 ones to `spooled`."""
        made = self.node.local_publish_run(run, now, qos=qos)
        if not qos or self.spool is None:
            return
        wall = time.time()
        for (topic, payload), mid, publication in zip(run, mids, made, strict=True):
            if publication is not None:
                spooled.append(SpooledPublication(publication[1], publication[2], topic, payload, qos, False, None,
                                                  wall, mid))

    def _originate(self, item: Publication, now: float) -> SpooledPublication | None:
        """A local publication with a QoS, the retain flag or properties, to the node: stamped (version, expiry:
        retained.py), a retained one stored; returns the spool entry to write for a QoS 1/2 one."""
        wall = time.time()
        properties = stamp(item.properties, item.retain, wall)
        publication = self.node.local_publish(item.topic, item.payload, item.qos, item.retain, properties, now)
        if publication is None:
            return None
        if item.retain:
            self.retained.offer(item.topic, publication, item.qos, item.payload, properties)
        if not item.qos or self.spool is None:
            return None
        return SpooledPublication(publication[1], publication[2], item.topic, item.payload, item.qos, item.retain,
                                  properties, wall, item.mid)

    def _start_retained_scan(self, now: float) -> None:
        """Read the retained messages the broker holds on a second connection (retained_scan.py) when one is due,
        none is under way, the wrapper is ready and a neighbour is up (even without configured neighbours: what
        is originated must have somewhere to go); the store's values now are what the reading is compared with."""
        if not self._retained_scan_due or self.retained_scan is not None or not wrapper_readiness(self).ready \
                or not any(neighbour.up for neighbour in self.node.neighbours.all()):
            return
        self._retained_scan_due = False
        before = dict(self.retained.values)
        loop = self.loop
        scan: RetainedScan | None = None

        def done(held: list[HeldRetained], problem: str | None) -> None:  # on the scan's thread
            loop.call_soon_threadsafe(self._on_retained_scan, scan, before, held, problem)

        scan = RetainedScan(self.config.broker, self.config.client_id, self.config.broker_auth, done)
        self.retained_scan = scan
        self.broker_subscriptions.helpers_subscribed(SCAN_SUBSCRIPTIONS, now)
        scan.start()

    def _drop_retained_scan(self, now: float) -> None:
        """The reading under way is not used (the broker restarted meanwhile); it ends off the loop's thread."""
        scan = self.retained_scan
        if scan is not None:
            self.retained_scan = None
            self.broker_subscriptions.helpers_subscribed(0, now)
            self.loop.run_in_executor(None, scan.close)

    def _on_retained_scan(self, scan: RetainedScan | None, before: dict[str, RetainedValue],
                          held: list[HeldRetained], problem: str | None) -> None:
        """A reading of the broker's retained messages ended: those the federation does not know are originated
        as local retained publications (`to_originate`, docs/protocol.md rule 10)."""
        if scan is not self.retained_scan or self.stopping:
            return
        self.retained_scan = None
        now = self.clock.now()
        self.broker_subscriptions.helpers_subscribed(0, now)
        limit = self.node.settings.max_publication_bytes
        spooled: list[SpooledPublication] = []
        originated = 0
        for message in list(to_originate(held, before, self.retained.values)):
            item = Publication(message.topic, message.payload, message.qos, True, message.properties)
            if len(item.payload) > limit:
                self._refuse_publication(item, now)
                continue
            entry = self._originate(item, now)
            originated += 1
            if entry is not None:
                spooled.append(entry)
        if spooled and self.spool is not None:
            self.spool.add(spooled)
        counts = self.retained_scan_counts
        counts.scans += 1
        counts.read += len(held)
        counts.originated += originated
        if problem is not None:
            counts.incomplete += 1
            log.warning("reading the broker's retained messages on a second connection (client id %r) may be "
                        "incomplete: %s; those not read are federated when published again", scan_client_id(
                            self.config.client_id), problem)
        log.info("the broker holds %d retained messages: %d of them the federation did not know, originated now",
                 len(held), originated)
        self._drain_outputs(now)

    def _on_broker_state(self, item: BrokerItem, now: float) -> None:
        """A change of the broker connection: health and warnings, events, and what a new session means."""
        self.broker_health.on_state(item, now)
        if isinstance(item, Connected):
            reinjected = list(item.reinjected)
            self.outbox.emit(wrapper_events.BROKER_CONNECTED, now, session_present=item.session_present,
                             session_lost=item.session_lost, receive_maximum=item.receive_maximum,
                             resent=item.resent, reinjected=len(reinjected))
            if item.resent:
                log.info("broker session kept: sending %d unfinished injections again (same packet ids)",
                         item.resent)
            if reinjected:
                log.warning("the broker did not keep the wrapper's session: publishing %d unfinished injections "
                            "anew", len(reinjected))
            if item.session_lost:
                self.broker_subscriptions.broker_restarted(now)
            if reinjected or item.session_lost:
                # Those the broker lost were handed over before what waits now; all of it now passes the hold.
                waiting = [*reinjected, *self.flow.injection_queue.drain()]
                self.flow.requeue(self.node, self.broker_subscriptions.admit(waiting, now), now)
            # A broker that kept the session holds what it held before (not an older persistence file): read it.
            self._retained_scan_due = not item.session_lost
            if item.session_lost and self.retained_scan is not None:
                self._drop_retained_scan(now)
            self._start_retained_scan(now)
            if item.session_lost and self.retained.values:
                # A broker without our session restarted, and without persistence its retained messages are gone:
                # ours go back first (the broker's persistence may have kept them: injecting them again is harmless).
                values = self.retained.reinjections(time.time())
                log.info("the broker did not keep the wrapper's session: giving it the %d retained values of the "
                         "retained store again", len(values))
                self.flow.requeue(self.node, values, now)
        elif isinstance(item, Disconnected):
            self.outbox.emit(wrapper_events.BROKER_DISCONNECTED, now, reason=item.reason,
                             unfinished=item.unfinished)

    def _refuse_publication(self, item: Publication, now: float) -> None:
        """A local publication above max_publication_bytes: not federated (never truncated), counted, logged."""
        node = self.node
        limit = node.settings.max_publication_bytes
        node.drop("publication_too_large")
        event = Event(now, str(node.address), events.PUBLICATION_DROPPED,
                      {"pub": None, "filter": None, "reason": "too_large", "topic": item.topic,
                       "size": len(item.payload)})
        self.event_counts[event.type] += 1
        if self.event_log is not None:
            self.event_log.write([event])
        self._refused_unlogged += 1
        if now - self._refused_logged_at >= REFUSAL_LOG_INTERVAL:
            self._refused_logged_at = now
            others, self._refused_unlogged = self._refused_unlogged - 1, 0
            if others:
                log.warning("%d more publications above max_publication_bytes were refused since the last such "
                            "line (drop publication_too_large: %d in all)", others,
                            node.drops["publication_too_large"])
            log.warning("publication on %r refused: its payload of %d bytes is above max_publication_bytes (%d); "
                        "it reaches this broker's own subscribers but is not federated (set the broker's "
                        "message_size_limit to the same value so the publisher is refused at the source, or raise "
                        "settings.max_publication_bytes and max_packet on every wrapper to allow it; further "
                        "refusals are counted as drop publication_too_large and logged once a minute)",
                        item.topic, len(item.payload), limit)

    def _answer_status(self, addr: Any) -> None:
        """A status request from this host (udp.py checked): the status document, to `addr`."""
        try:
            reply = encode_reply(self.status_document())
        except (TypeError, ValueError) as error:  # a bug, not a reason to stop the daemon
            log.error("cannot build the status reply: %s", error)
            return
        self.transport.sendto(reply, addr)

    # ------------------------------------------------------------ outputs

    def _drain_outputs(self, now: float) -> None:
        """Everything the node and the envelope have to give, to where it goes (`_route_outputs`); then the
        timer is re-armed."""
        try:
            self._route_outputs(now)
        finally:  # whatever fails, the timer keeps running; after the sends, which it does not delay
            self._schedule_rearm()

    def _route_outputs(self, now: float) -> None:
        """The node's packets through the envelope (batched, fragmented, signed) to the socket, its injections
        to the broker (or the bounded queue), its events and the envelope's drops to the counters and the
        event log; and the broker's reading paused or resumed."""
        node = self.node
        paced_until = node.paced_until(now)  # first: a hold that ended makes the ready we owe upstream
        broker = self.broker
        made = node.injections_and_runs_to_make()
        # The usual pass of a receiving wrapper at QoS 0: runs only (none retained, with properties or QoS 1/2,
        # so nothing for `_prepare` or the journal), nothing held: written whole when nothing waits.
        runs = only_runs(made)
        if not (runs and not self.broker_subscriptions.hold.active and self.flow.inject_runs(node, broker, runs)):
            injections = expand_runs(made)
            if injections:
                injections = self._prepare(injections, now)
            # Before the packets: an injection the journal says is done acknowledges its copy in this same drain.
            self.flow.inject(node, broker, now, self._admit(injections, now) if injections else injections)
        released = node.custody_released()
        if released and self.spool is not None:  # delivered everywhere: the spool may forget them
            self.spool.release((epoch, seq) for _origin, epoch, seq in released)
        packets = node.packets_to_send()
        if packets and self.protocol.writing_paused:
            packets = self.flow.shed(node, packets, now)
        envelope = self.envelope
        for packet, target in packets:
            envelope.send(packet, target, now)
        transport = self.transport
        for data, target in envelope.datagrams_to_send(now):
            transport.sendto(data, (target.host, target.port))
        self._apply_backpressure(node, broker, now, paced_until)
        emitted = node.events_emitted()
        dropped = envelope.events_emitted()
        if dropped:
            self.drop_reporter.report(dropped, now)
            emitted += dropped
        own = self.outbox.drain()
        if own:
            emitted += own
        if emitted:
            counts = self.event_counts
            for event in emitted:
                counts[event.type] += 1
                if event.type == events.EPOCH_CHANGED and self.saver is not None:
                    self.saver.schedule()
            if self.event_log is not None:
                self.event_log.write(emitted)

    def _prepare(self, injections: list[Injection], now: float) -> list[Injection]:
        """Expiry counted down, retained ones checked against the store (federation.daemon.retained); those not
        injected are counted and done (a newer value, or nothing left to deliver)."""
        kept, dropped = prepare(injections, self.retained, time.time())
        node = self.node
        for publication, expired in dropped:
            if expired is not None:  # None: the stored value itself, which the broker holds: no drop
                reason = "message_expired" if expired else "retained_stale"
                node.drop(reason, event=events.PUBLICATION_DROPPED, now=now,
                          pub=events.publication_text(publication), filter=None, reason=reason)
            node.injection_done(publication, now)
        return kept

    def _admit(self, injections: list[Injection], now: float) -> list[Injection]:
        """The node's injections that go to the broker: not those the journal says the broker completed or has
        in flight (a copy sent again by an upstream wrapper after we restarted), and not yet those held since it
        restarted."""
        journal = self.journal
        if journal is not None and (journal.has_completed or journal.recovered):
            kept: list[Injection] = []
            node = self.node
            for injection in injections:
                if not injection.qos:
                    kept.append(injection)
                elif journal.is_completed(injection.publication):
                    self.duplicates_suppressed += 1
                    node.injection_done(injection.publication, now)  # the broker has it: custody ends
                elif journal.in_flight_publication(injection.publication):
                    self.duplicates_suppressed += 1  # the journal's own resend completes it (its outcome)
                else:
                    kept.append(injection)
            injections = kept
        return self.broker_subscriptions.admit(injections, now)

    def _on_send_resumed(self) -> None:
        """The socket took the buffered datagrams: read from the broker again if only that held it."""
        now = self.clock.now()
        self._apply_backpressure(self.node, self.broker, now, self.node.paced_until(now))

    def _on_broker_completed(self) -> None:
        """The broker has some of our QoS 1/2 injections (PUBACK, PUBREC, PUBCOMP), or took the bytes its socket
        had refused: the node hears which (its custody of them ends, their copies are acknowledged) and the
        broker gets what waits for room, at once."""
        outcomes = self.broker.take_injection_outcomes()
        if not outcomes and not len(self.flow.injection_queue):
            return
        node = self.node
        now = self.clock.now()
        if len(self.flow.injection_queue):
            # What waits for room goes first: the broker works on it while the node settles the completions (its
            # Receive Maximum, 20 by default, makes this loop a window the broker must never wait on).
            self.flow.inject(node, self.broker, now)
        for publication, done in outcomes:
            if done:
                node.injection_done(publication, now)
            else:
                node.injection_failed(publication, now)
        self._drain_outputs(now)

    def _apply_backpressure(self, node: Node, broker: BrokerAdapter, now: float, paced_until: float | None) -> None:
        """Pause or resume reading from the broker (`FlowControl.apply_backpressure`); while a neighbour
        paces us, look again when its hold ends (nothing else may wake us: we read nothing meanwhile).
        `paced_until`: `Node.paced_until(now)`, the end of the longest hold on us, None when nothing paces us."""
        self.flow.apply_backpressure(node, broker, self.protocol.writing_paused, now, paced=paced_until is not None)
        if paced_until is not None and self._pace_handle is None:
            self._pace_handle = self.loop.call_later(paced_until - now + PACE_RECHECK_SLACK, self._pace_ended)

    def _pace_ended(self) -> None:
        self._pace_handle = None
        self._drain_outputs(self.clock.now())  # sends the ready its end may make, then reads again

    def _schedule_rearm(self) -> None:
        """Re-arm the node timer once per loop iteration, however many inputs it had."""
        if not self._rearm_scheduled:
            self._rearm_scheduled = True
            self.loop.call_soon(self._rearm_timer)

    def _rearm_timer(self) -> None:
        self._rearm_scheduled = False
        deadline = self.node.get_timer()
        transfer = self.envelope.transfer_timer()  # bulk transfers' retransmissions: not late, unlike reassembly
        if transfer is not None and (deadline is None or transfer < deadline):
            deadline = transfer
        if deadline == self._timer_deadline and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_deadline = deadline
        if deadline is not None:
            loop = self.loop
            self._timer = loop.call_at(loop.time() + max(0.0, deadline - self.clock.now()), self._on_timer)

    # ------------------------------------------------------------ housekeeping

    def _periodic_flush(self) -> None:
        if self.event_log is not None:
            self.event_log.flush()
        self._flush_handle = self.loop.call_later(EVENT_LOG_FLUSH_INTERVAL, self._periodic_flush)

    def _housekeeping(self) -> None:
        self._housekeeping_handle = self.loop.call_later(HOUSEKEEPING_INTERVAL, self._housekeeping)
        now = self.clock.now()
        self.broker_subscriptions.tick(now)
        self._start_retained_scan(now)
        self._drain_outputs(now)

    def _check_kernel_drops(self) -> None:
        """Warn when the kernel dropped datagrams meant for us: losses nothing else in the wrapper can see."""
        self._drops_handle = self.loop.call_later(KERNEL_DROPS_CHECK_INTERVAL, self._check_kernel_drops)
        drops = self.read_kernel_receive_drops()
        if drops is None or drops <= self.kernel_receive_drops:
            return
        log.warning("the kernel dropped %d datagrams for this wrapper in the last %g s (%d in all): its UDP receive "
                    "buffer was full because neighbours send faster than it handles them; QoS 0 publications "
                    "among them are lost, QoS 1/2 ones are sent again. Lower the publication rate, or raise "
                    "net.core.rmem_max (the wrapper asks for %d bytes)", drops - self.kernel_receive_drops,
                    KERNEL_DROPS_CHECK_INTERVAL, drops, SOCKET_BUFFER)
        self.kernel_receive_drops = drops

    # ------------------------------------------------------------ status and metrics

    def status_document(self) -> dict[str, Any]:
        return status_document(self, self.clock.now())

    def metrics_snapshot(self) -> Snapshot:
        """Copies of every number the metrics expose (runs on the loop thread)."""
        return metrics_snapshot(self, self.clock.now())

    def readiness(self) -> Readiness:
        """Ready when the broker is connected and its log flows, and a neighbour is up if any are configured (on
        the loop thread; health.py)."""
        return wrapper_readiness(self)
