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

The datagrams reach the node through `Receiving` (receiving.py): control
packets at once, the data a slice per loop pass, so under overload the
control plane goes first (docs/daemon.md "Overload"). The broker's own
publications reach it through `LocalPublications` (local_publications.py),
in runs, with the spool written before the broker gets its
acknowledgements. Between the broker and the overlay
`FlowControl` (flow_control.py) bounds what waits: remote publications
queued for a slow broker, reading paused while QoS 1/2 copies wait for
acknowledgements, and, while the socket's send side is backed up
(`OverlayProtocol.writing_paused`), QoS 0 `tm` shed before the envelope
and the broker not read. The broker connection's health and warnings are
`BrokerHealth` (broker_health.py); the status document and the metrics
snapshot are built by snapshots.py.

SIGHUP loads the configuration again and takes up what changed
(reconfiguring.py, which also resolves the neighbours' names again).
Shutdown (SIGINT/SIGTERM) leaves the federation cleanly: `node.shutdown`
announces the departure, the datagrams are flushed, the subscription table
and the event log are written, then the broker connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from federation.daemon import wrapper_events
from federation.daemon.backpressure import PacketBacklog
from federation.daemon.broker import FENCE_PREFIX, BrokerAdapter
from federation.daemon.broker_health import BrokerHealth
from federation.daemon.broker_items import (
    BrokerItem,
    ClientCount,
    Connected,
    CountsRound,
    Disconnected,
    HandoverFence,
    LogLine,
    LoopHandOff,
    Publication,
    PublicationRun,
    RetainedApplied,
    SubscriptionCount,
    split_oversized_runs,
)
from federation.daemon.broker_log import BrokerLogTracker, ClientSubscribed
from federation.daemon.broker_sessions import BrokerSessions
from federation.daemon.broker_subscriptions import BrokerSubscriptions
from federation.daemon.client_registry import is_record
from federation.daemon.clock import Clock
from federation.daemon.config import DaemonConfig
from federation.daemon.flow_control import HELD_BYTES, HELD_MAX, FlowControl
from federation.daemon.health import Readiness
from federation.daemon.injections import InjectionJournal
from federation.daemon.kicker import Outcome, SessionKicker
from federation.daemon.local_publications import LocalPublications
from federation.daemon.metrics import Snapshot
from federation.daemon.policy_edges import PolicyEdges
from federation.daemon.policy_subscriptions import PolicySubscriptions
from federation.daemon.receiving import Receiving
from federation.daemon.reconfiguring import Reconfiguring
from federation.daemon.reload import Reloads
from federation.daemon.retained import RetainedStore, prepare
from federation.daemon.retained_order import RetainedGate, RetainedOrder
from federation.daemon.retained_scan import RetainedReading, scan_client_id
from federation.daemon.roaming import Roaming
from federation.daemon.snapshots import metrics_snapshot, status_document, wrapper_readiness
from federation.daemon.spool import Spool, SpooledPublication
from federation.daemon.startup import Resources
from federation.daemon.state import PersistedState, StateSaver
from federation.daemon.status import encode_reply
from federation.daemon.storage import StorageHealth
from federation.daemon.subscription_fence import FENCE_NAME, Made, UnmatchedHold, fence_number
from federation.daemon.udp import (
    SOCKET_BUFFER,
    DropReporter,
    OverlayProtocol,
    announce_security,
    kernel_receive_drops,
)
from federation.envelope.datagrams import Envelope
from federation.protocol import events
from federation.protocol.node import Node
from federation.protocol.types import Address, Event, Injection, expand_runs, only_runs

log = logging.getLogger("federation.daemon")

KERNEL_DROPS_CHECK_INTERVAL = 10.0
"""seconds between reads of the kernel's count of datagrams dropped for a full receive buffer"""
EVENT_LOG_FLUSH_INTERVAL = 1.0
"""seconds between flushes of the event log buffer"""
SHUTDOWN_DRAIN_TIMEOUT = 1.0
"""seconds to wait for the socket to send the last datagrams at shutdown"""
PACE_RECHECK_SLACK = 0.001
"""seconds after a neighbour's hold ends at which a paced wrapper looks again (the hold has then expired)"""
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
        self.stopping = False
        """set when the shutdown starts: nothing received is handled any more"""
        self.subscriptions = persisted.subscriptions
        self.saver = (StateSaver(resources.store, persisted, loop, lambda: node.epoch, clock.now, node.known_filters,
                                 node.receivers_known)
                      if resources.store is not None else None)
        """writes the subscription table and the epoch; None without a state directory"""
        self.tracker = BrokerLogTracker(config.client_id, helper_client_ids=(scan_client_id(config.client_id),))
        self.broker_health = BrokerHealth(config.broker, config.client_id, loop.call_later, config.broker_auth)
        self.journal: InjectionJournal | None = resources.journal
        """the injection journal (with a state directory)"""
        self.spool: Spool | None = resources.spool
        """the custody spool of our own QoS 1/2 publications (with a state directory)"""
        self.storage = StorageHealth(str(config.state_dir) if config.state_dir is not None else None)
        """whether the state directory takes writes (a full disk is a state: storage.py)"""
        self._held: list[BrokerItem] = []
        """publications read from the broker while the intake is paused, in order, not yet acknowledged"""
        self._held_count = 0
        """publications in `_held` (a run counts its publications)"""
        self._held_bytes = 0
        if self.journal is not None:
            self.journal.on_write = self._journal_written
        self.retained = resources.retained if resources.retained is not None else RetainedStore()
        """the newest retained value of every topic (kept in the state directory when there is one)"""
        node.attach_retained(self.retained)  # the node compares it with the neighbours' stores (rule 10)
        self.retained_order = RetainedOrder()
        """which retained injections the broker has not processed yet: a local write's version follows the
        broker's order (retained_order.py, issue 39)"""
        self.retained_gate = RetainedGate(self.retained, self.retained_order)
        self.restored_filters = persisted.filters
        """the filters the node knew in its previous life (`Node.restore`)"""
        self.restored_receivers = persisted.receivers
        """the brokers known to subscribe to each filter in its previous life (`Node.restore`, rule 7f)"""
        self._receivers_saved = 0
        """`Node.receivers_changes` when the state was last scheduled for saving"""
        self.outbox = wrapper_events.WrapperEvents(str(node.address))
        """the daemon's own events, written with the node's"""
        self.edges = PolicyEdges(config.topic_policy)
        """the topic policy where publications leave the broker and enter it, and what it kept out"""
        self.subscription_sink = PolicySubscriptions(node, config.topic_policy)
        """the local subscriptions told to the node as the federation filters the policy lets them import"""
        self.sessions = BrokerSessions(self.subscriptions, self.subscription_sink, config.client_id)
        """the log's events into the table, and which MQTT 5 sessions the broker kept (issue 39: session_ledger.py)"""
        self.local = LocalPublications(node, self.spool, self.retained, self._record_event, self.edges,
                                       self.retained_order, self.storage)
        """the broker's publications into the node, the spool and the retained store"""
        hand_off = LoopHandOff(loop, self._on_broker_items)
        # paho driven by this loop (no network thread); a burst read from the broker reaches the node at once.
        self.broker = BrokerAdapter(config.broker, config.client_id, hand_off.put, config.max_qos, loop=loop,
                                    flush=hand_off.flush, on_completed=self._on_broker_completed,
                                    hold=hand_off.hold, auth=config.broker_auth,
                                    session_expiry=config.broker_session_expiry, recorder=self.journal,
                                    read_coalesce=config.broker_read_coalesce)
        self.broker.injector.retained = self.retained_gate
        if self.journal is not None:
            self.broker.restore([(entry.mid, entry.injection, entry.released) for entry in self.journal.in_flight()])
        self.broker_subscriptions = BrokerSubscriptions(self.subscription_sink, node.drop, self.outbox,
                                                        self.subscriptions,
                                                        config.resubscribe_grace, node.injection_failed)
        """a broker that lost its subscriptions, and subscriptions it holds that the wrapper did not see"""
        self.retained_reading = RetainedReading(config, loop, clock, self.retained, self.local,
                                                self.broker_subscriptions.helpers_subscribed,
                                                self._may_read_retained, lambda: self.stopping, self._drain_outputs)
        """when the broker's retained messages are read, and what the federation does not know of them originated"""
        self.unmatched = UnmatchedHold(node.settle_unmatched, node.drop)
        """publications that match no subscription the wrapper has read yet, held until its broker's log is read up
        to a fence published after they arrived (subscription_fence.py)"""
        self._unmatched_fence_prefix = f"{FENCE_PREFIX}{config.client_id}/{FENCE_NAME}{node.epoch}-"
        """its fences' topics (the epoch tells this run's from a queued one of an earlier run)"""
        self._unmatched_released: list[Made] = []
        """what a fence read released, for the next drain (before what the node makes then)"""
        self._unmatched_warned_at = float("-inf")
        self._fence_handle: asyncio.TimerHandle | None = None
        """the next fence's publication, while one is due later (`UnmatchedHold.fence_due`)"""
        node.hold_unmatched()
        self.roaming = Roaming(node.address, self.subscriptions, self.subscription_sink, self.retained,
                               self.local.originate_record, self._start_kicker, self.tracker.is_connected,
                               lambda client: client in self.sessions.ledger.offline, self._publish_fence,
                               node)
        """one client id federation-wide: the registry of clients, takeovers and handovers (roaming.py, issue 39)"""
        self.local.observe = self.roaming.local_published
        self._kickers: set[SessionKicker] = set()
        self.duplicates_suppressed = 0
        """remote QoS 1/2 publications not injected because the journal says the broker completed them"""
        self.flow = FlowControl()
        self.receiving = Receiving(node, envelope, protocol, clock, loop, self.flow.injection_queue,
                                   self._drain_outputs, lambda: self.stopping)
        """datagrams into the node, the data a slice per loop pass (receiving.py)"""
        self.drop_reporter = DropReporter()
        self.event_counts: Counter[str] = Counter()
        self.kernel_receive_drops = 0
        """datagrams the kernel dropped for this wrapper's full UDP receive buffer, as of the last check"""
        self.started_at = clock.now()
        self.reloads = Reloads()
        """what SIGHUPs did (`reload`)"""
        self.reconfiguring = Reconfiguring(self, self._drain_outputs)
        """SIGHUP's loading of the configuration, and the neighbours' names resolved again"""
        self._rearm_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        """the node's timer, while it has a deadline"""
        self._timer_deadline: float | None = None
        self._pace_handle: asyncio.TimerHandle | None = None
        """the look at the broker again once a neighbour's hold on us ends, while one is pending"""
        self._flush_handle = loop.call_later(EVENT_LOG_FLUSH_INTERVAL, self._periodic_flush)
        self._drops_handle = loop.call_later(KERNEL_DROPS_CHECK_INTERVAL, self._check_kernel_drops)
        self._housekeeping_handle = loop.call_later(HOUSEKEEPING_INTERVAL, self._housekeeping)
        protocol.attach(self.receiving.on_datagram, self._answer_status, self._on_send_resumed)

    @property
    def receive_backlog(self) -> PacketBacklog[Address]:
        """Data packets received and waiting for their slice (`Receiving.backlog`)."""
        return self.receiving.backlog

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
        if self.journal is not None or self.restored_filters or self.restored_receivers:
            node.restore(streams=self.journal.stream_positions() if self.journal is not None else None,
                         filters=self.restored_filters, receivers=self.restored_receivers)
        node.start(now)
        replayed = self.subscriptions.replay(self.subscription_sink, now)
        if replayed:
            log.info("replayed %d saved subscriptions of %d clients into the node", replayed,
                     len(self.subscriptions.clients))
        self.broker_subscriptions.table_changed(now)
        self._replay_spool(now)  # before anything new is read from the broker: order is kept
        self._drain_outputs(now)
        self.broker.start()
        self.reconfiguring.schedule_resolution()
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
        """SIGHUP: the event log reopened at once, the configuration loaded again and what changed taken up
        (reconfiguring.py)."""
        self.reconfiguring.reload()

    def close(self) -> None:
        """Cancel every timer and release the resources (the socket through its transport)."""
        self.reconfiguring.close()
        for handle in (self._flush_handle, self._drops_handle, self._housekeeping_handle, self._pace_handle,
                       self._fence_handle, self._timer):
            if handle is not None:
                handle.cancel()
        if self.saver is not None:
            self.saver.cancel()
        self.retained_reading.close()
        for kicker in list(self._kickers):
            kicker.close()
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
        local = self.local
        batch = split_oversized_runs(batch, node.settings.max_publication_bytes)  # a refusal is per publication
        try:
            for item in batch:
                if type(item) is PublicationRun:  # plain ones, read as a run (LeanClient.lean_run)
                    if self._holding():
                        self._hold(item, len(item.payloads), sum(map(len, item.payloads)))
                    else:
                        local.add_run(item, now)
                    continue
                if isinstance(item, Publication):
                    if self._holding():
                        self._hold(item, 1, len(item.payload))
                    else:
                        local.add(item, now)
                    continue
                if type(item) is HandoverFence:
                    if self._holding():  # behind the publications read before it: they are numbered first
                        self._hold(item, 0, 0)
                    elif (number := fence_number(item.topic, self._unmatched_fence_prefix)) is not None:
                        # every log line before it was read above: the subscriptions the broker took before it
                        self._unmatched_released += self.unmatched.fence_read(number, now)
                        self._publish_unmatched_fence(now)
                    else:
                        local.flush(now)
                        node_id = node.identity
                        self.roaming.fence_read(item.topic, (node_id.epoch, node_id.publication_seq), now)
                        self._requeue_roaming(now)
                    continue
                local.flush(now)  # kept in order with what follows
                if isinstance(item, LogLine):
                    if item.qos:
                        local.acknowledge(item.mid, item.qos)
                    self.broker_health.count_log_line()
                    changed = self.sessions.log_line(now) or changed  # a $SYS round before it is complete
                    for event in self.tracker.feed(item.topic, item.payload):
                        changed = self.sessions.apply(event, now) or changed
                        released = self.roaming.log_event(event, now)
                        if released:  # held for a session this broker took from another: now, in their order
                            self.flow.requeue(node, released, now)
                        if isinstance(event, ClientSubscribed) and not event.own:
                            released = self.broker_subscriptions.subscribed(event.client, event.filter, now)
                            if released:  # held since the broker restarted: now, in their order
                                self.flow.requeue(node, released, now)
                elif isinstance(item, RetainedApplied):
                    self.retained_gate.applied(item.publication)
                    checks = self.retained_order.take_checks()
                    if checks and not self.edges.active:  # (a policy maps topics: the broker's are not the store's)
                        self.retained_reading.check(checks, now)
                elif isinstance(item, CountsRound):
                    changed = self.sessions.round_started(now) or changed
                elif isinstance(item, ClientCount):
                    if item.total:
                        self.sessions.total_counted(item.count)
                    else:
                        self.sessions.disconnected_counted(item.count)
                elif isinstance(item, SubscriptionCount):
                    self.sessions.subscriptions_counted(item.count)
                    released = self.broker_subscriptions.counted(item.count, now)
                    if released:
                        self.flow.requeue(node, released, now)
                else:
                    self._on_broker_state(item, now)
            local.flush(now)
        finally:
            # The one place the broker's publications (and log lines) are acknowledged: after the node took them
            # and, for QoS 1/2, the spool holds them (one write: a killed wrapper loses none it acknowledged).
            acks, spooled = local.take()
            if spooled and self.spool is not None:
                self.spool.add(spooled)
            self.broker.acknowledge(acks)
        if changed:
            self.broker_subscriptions.table_changed(now)
            if self.saver is not None:
                self.saver.schedule()
        self._drain_outputs(now)

    def _record_event(self, event: Event) -> None:
        """An event the daemon makes itself (a refused publication's): counted and written to the event log."""
        self.event_counts[event.type] += 1
        if self.event_log is not None:
            self.event_log.write([event])

    def _publish_fence(self, fence: str, filters: Iterable[str]) -> dict[Address, list[tuple[int, int]]] | None:
        """A takeover's fence on the broker connection, behind every injection written so far (roaming.py): which
        of them, on the session's topics, the broker processes before it; None when not connected."""
        had = self.broker.injector.released_matching(filters)
        return had if self.broker.publish_fence(fence) else None

    def _requeue_roaming(self, now: float) -> None:
        """What roaming released outside a call that returns it (a handover made), to the broker in order; what it
        will never inject (a handover gave its copy) done, so its custody ends."""
        node = self.node
        released = self.roaming.take_released()
        if released:
            self.flow.requeue(node, released, now)
        for injection in self.roaming.take_left_out():
            if injection.qos:
                node.injection_done(injection.publication, now)

    def _start_kicker(self, client: str, clean: bool, ready: Callable[[str, float], None],
                      done: Callable[[Outcome, float], None]) -> None:
        """Take `client` over on the broker (kicker.py); `ready` gets its fence and `done` its outcome, on the loop's
        thread."""
        config, loop = self.config, self.loop
        kicker: SessionKicker | None = None

        def on_loop(call: Callable[[], None]) -> None:  # from the kicker's thread
            def run() -> None:
                if not self.stopping:
                    call()
                    now = self.clock.now()
                    self._requeue_roaming(now)
                    self._drain_outputs(now)
            with contextlib.suppress(RuntimeError):  # the loop is closed: the wrapper is exiting
                loop.call_soon_threadsafe(run)

        def fenced(fence: str) -> None:
            on_loop(lambda: ready(fence, self.clock.now()))

        def finished(outcome: Outcome) -> None:
            def end() -> None:
                self._kickers.discard(kicker)  # type: ignore[arg-type]
                done(outcome, self.clock.now())
            on_loop(end)

        kicker = SessionKicker(config.broker, config.broker_auth, client, clean, config.client_id,
                               self.tracker.add_kicker, fenced, finished)
        self._kickers.add(kicker)
        kicker.start()

    def _may_read_retained(self) -> bool:
        """A reading of the broker's retained messages may start: the wrapper is ready and a neighbour is up (even
        without configured neighbours: what is originated must have somewhere to go)."""
        return wrapper_readiness(self).ready and any(neighbour.up for neighbour in self.node.neighbours.all())

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
            self.sessions.connected(item.session_lost)
            number = self.unmatched.republish(now)
            if number is not None:
                self.broker.publish_fence(f"{self._unmatched_fence_prefix}{number}")
            if item.session_lost:
                self.broker_subscriptions.broker_restarted(now)
            if reinjected or item.session_lost:
                # Those the broker lost were handed over before what waits now; all of it now passes the hold.
                waiting = [*reinjected, *self.flow.injection_queue.drain()]
                self.flow.requeue(self.node, self.broker_subscriptions.admit(waiting, now), now)
            self.retained_reading.connected(item.session_lost, now)
            if item.session_lost and self.retained.values:
                # A broker without our session restarted, and without persistence its retained messages are gone:
                # ours go back first (the broker's persistence may have kept them: injecting them again is harmless).
                values = self.retained.reinjections(time.time())
                if self.edges.active:  # the store holds the federation's topics: those the policy imports, mapped
                    values = self.edges.imports(values, lambda publication: None)
                log.info("the broker did not keep the wrapper's session: giving it the %d retained values of the "
                         "retained store again", len(values))
                self.flow.requeue(self.node, values, now)
        elif isinstance(item, Disconnected):
            self.outbox.emit(wrapper_events.BROKER_DISCONNECTED, now, reason=item.reason,
                             unfinished=item.unfinished)
            # What was held came on that connection: its QoS 1/2 ones, never acknowledged, come again (the session
            # keeps them); its packet ids mean nothing on the next connection.
            self._held, self._held_count, self._held_bytes = [], 0, 0

    def _answer_status(self, addr: Any, brief: bool = False) -> None:
        """A status request from this host (udp.py checked): the status document, to `addr` (`brief`: without
        the bulky lists)."""
        try:
            reply = encode_reply(self.status_document(brief))
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
        if made:
            made = self.unmatched.admit(made, now)
            self._publish_unmatched_fence(now)
        if self._unmatched_released:  # settled by a fence: before anything newer, never held again
            made = self._unmatched_released + made
            self._unmatched_released = []
        # The usual pass of a receiving wrapper at QoS 0: runs only (none retained, with properties or QoS 1/2,
        # so nothing for `_prepare` or the journal), nothing held: written whole when nothing waits.
        runs = only_runs(made)
        edges = self.edges
        mapped = bool(runs) and edges.active
        if mapped:  # QoS 0 runs: nothing for the retained store, so under the topic policy at once
            runs = edges.import_runs(runs)
            made = list(runs)
        if not (runs and not self.broker_subscriptions.hold.active and not self.roaming.holding
                and self.flow.inject_runs(node, broker, runs)):
            injections = expand_runs(made)
            if injections:
                injections = self._prepare(injections, now)  # the store keeps the federation's topics
                if edges.active and not mapped:
                    injections = edges.imports(injections, lambda publication: node.injection_done(publication, now))
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
                elif event.type == events.TOPIC_TABLE_FULL:  # at most one per stats_interval (the node's)
                    log.warning("%s", node.limits_problem(now) or f"the topic table is full: {event.fields}")
            if self.event_log is not None:
                self.event_log.write(emitted)

    def _publish_unmatched_fence(self, now: float) -> None:
        """A fence for the publications held that match no known subscription, when one is due; a timer for the
        next one when it is due later."""
        unmatched = self.unmatched
        number = unmatched.fence_to_publish(now)
        if number is not None:
            self.broker.publish_fence(f"{self._unmatched_fence_prefix}{number}")  # not connected: `republish`
        due = unmatched.fence_due(now)
        if due is not None and self._fence_handle is None:
            self._fence_handle = self.loop.call_later(due - now, self._on_fence_due)

    def _on_fence_due(self) -> None:
        self._fence_handle = None
        self._publish_unmatched_fence(self.clock.now())

    def _prepare(self, injections: list[Injection], now: float) -> list[Injection]:
        """Expiry counted down, retained ones checked against the store (federation.daemon.retained); those not
        injected are counted and done (a newer value, or nothing left to deliver)."""
        kept, dropped = prepare(injections, self.retained, time.time())
        node = self.node
        if any(injection.retain and is_record(injection.topic) for injection in kept):
            # The registry of client ids (client_registry.py) travels as retained values: never to the broker.
            released: list[Injection] = []
            for injection in kept:
                if injection.retain and is_record(injection.topic):
                    released += self.roaming.record(injection, now)
                    node.injection_done(injection.publication, now)
            kept = [injection for injection in kept if not (injection.retain and is_record(injection.topic))]
            if released:
                self.flow.requeue(node, released, now)
            self._requeue_roaming(now)
        for injection in kept:
            if injection.retain:
                self.retained_gate.prepared(injection)
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
        admitted = self.roaming.admit(self.broker_subscriptions.admit(injections, now), now)
        self._requeue_roaming(now)
        return admitted

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
        """Pause or resume the intake of publications from the broker (`FlowControl.apply_backpressure`; the
        spool's high-water mark and a full disk pause it too); while a neighbour paces us, look again when its hold
        ends. The socket is read meanwhile (the acknowledgements of our injections come on it), and what it brings
        is held, up to `HELD_MAX` publications or `HELD_BYTES`: only beyond them does the reading stop.
        `paced_until`: `Node.paced_until(now)`, the end of the longest hold on us, None when nothing paces us."""
        spool_full = self.spool is not None and self.spool.paused
        paused = self.flow.apply_backpressure(node, self.protocol.writing_paused, now,
                                              paced=paced_until is not None or spool_full or self.local.stalled)
        if not paused and self._held and not self.local.stalled:
            self.loop.call_soon(self._release_held)
        full = self._held_count >= HELD_MAX or self._held_bytes >= HELD_BYTES
        if full and not broker.reading_paused:
            broker.pause_reading()
        elif not full and broker.reading_paused:
            broker.resume_reading()
        if paced_until is not None and self._pace_handle is None:
            self._pace_handle = self.loop.call_later(paced_until - now + PACE_RECHECK_SLACK, self._pace_ended)

    @property
    def intake_paused(self) -> bool:
        """Publications read from the broker wait here instead of reaching the node (backpressure, a full disk)."""
        return self.flow.intake_paused or self.local.stalled or bool(self._held)

    def _holding(self) -> bool:
        return self.flow.intake_paused or self.local.stalled or bool(self._held)  # behind what is held: in order

    def _hold(self, item: BrokerItem, count: int, size: int) -> None:
        self._held.append(item)
        self._held_count += count
        self._held_bytes += size
        if (self._held_count >= HELD_MAX or self._held_bytes >= HELD_BYTES) and not self.broker.reading_paused:
            self.broker.pause_reading()  # enough kept here: the broker keeps the rest

    def _release_held(self) -> None:
        """The intake resumed: what was held goes to the node, in order, as one batch (acknowledged then)."""
        if self.flow.intake_paused or self.local.stalled or not self._held:
            return
        held, self._held, self._held_count, self._held_bytes = self._held, [], 0, 0
        self._on_broker_items(held)

    def _journal_written(self, error: Exception | None) -> None:
        """The injection journal's append: refused (a full disk: no new QoS 1/2 copies are taken until the probe
        says the directory takes writes again, so none is injected without the record that keeps a QoS 2 one from
        a second injection after a restart) or written (not proof enough: a small record may still fit in the last
        page of the file on a full disk; `_retry_storage` decides)."""
        if error is not None:
            self.storage.failed("the injection journal", error, self.clock.now())
            self.node.report_storage(False)

    def _storage_recovered(self, now: float) -> None:
        self.storage.recovered(now)
        self.node.report_storage(True)

    def _retry_storage(self, now: float) -> None:
        """Every second while the state directory refuses writes: does it take them again? Then the journal records
        the disk refused are written (a restart must not inject again what the broker completed), what waits for the
        spool goes to the node (and its packet ids are acknowledged), and new copies are taken again."""
        if self.storage.ok or not self.storage.probe():
            return
        if self.journal is not None and not self.journal.write_unwritten():
            return  # still refused (the probe's room was not enough)
        if not self.local.retry(now):
            return
        acks, _spooled = self.local.take()
        self.broker.acknowledge(acks)
        if self.spool is not None:
            self.spool.write_releases()  # what the full disk refused of the releases
        self._storage_recovered(now)
        self._drain_outputs(now)

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
        self._retry_storage(now)
        self.broker_subscriptions.tick(now)
        timeouts = self.unmatched.timeouts
        self._unmatched_released += self.unmatched.tick(now)
        if self.unmatched.timeouts > timeouts and now - self._unmatched_warned_at >= 60.0:
            self._unmatched_warned_at = now
            log.warning("a fence the wrapper published to %s* did not come back within %g s: publications that "
                        "matched no subscription it knew were settled without it (dropped as %s when still "
                        "unmatched). Does the broker's ACL give the wrapper `topic readwrite $federation/handover/#` "
                        "(configs/mosquitto.acl)?", self._unmatched_fence_prefix, self.unmatched.timeout,
                        "unmatched_fence_timeout")
        self._publish_unmatched_fence(now)
        released = self.roaming.tick(now)
        if released:
            self.flow.requeue(self.node, released, now)
        self._requeue_roaming(now)
        self.retained_reading.start_if_due(now)
        if self.saver is not None and self.node.receivers_changes != self._receivers_saved:
            self._receivers_saved = self.node.receivers_changes  # who subscribes where: kept across a restart
            self.saver.schedule()
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

    def status_document(self, brief: bool = False) -> dict[str, Any]:
        return status_document(self, self.clock.now(), brief)

    def metrics_snapshot(self) -> Snapshot:
        """Copies of every number the metrics expose (runs on the loop thread)."""
        return metrics_snapshot(self, self.clock.now())

    def readiness(self) -> Readiness:
        """Ready when the broker is connected and its log flows, and a neighbour is up if any are configured (on
        the loop thread; health.py)."""
        return wrapper_readiness(self)

