"""The wrapper's one MQTT v5 connection to its local Mosquitto broker (paho-mqtt 2.x).

Theory of operation: every callback turns what happened into a small item
(`LogLine`, `Publication`, `Connected`, ...) and hands it to `deliver`; the
runtime queues them (`LoopHandOff`) and feeds them to the node in batches.
Two ways to drive paho:

* on an asyncio loop (`loop=`, what the wrapper does): paho's external-loop
  API, no thread. The socket is watched with `add_reader`; one wake-up reads
  every complete packet waiting (FIONREAD says when to stop), so a burst of
  publications costs one pass through the event loop, not one per message
  (the read side is `BrokerReading`, federation/daemon/broker_reading.py);
  the client (`LeanClient`, federation/daemon/lean_client.py) parses the
  plain QoS 0/1 publications of that burst itself, in one loop, instead of
  paho's several reads and objects per packet. It relies on private names
  of paho's; if the installed paho lacks one, the adapter says so at
  construction and uses `PublicClient` (paho's documented API) instead.
  Publishing writes to the socket at once, in the caller's thread, which is
  the loop's. Only a connection attempt runs in the loop's default executor,
  because paho's connect blocks (up to its 5 s timeout for an unreachable
  host); reconnection uses exponential backoff (0.25 s doubling to 1 s) and
  `loop_misc` runs every second for the keepalive. Why: with paho in its own
  thread the two threads handed the GIL back and forth for every message
  (paho wakes its thread through a socket pair on every publish), which
  cost 12-25% of the wrapper's CPU per message (docs/benchmarks.md).
  `pause_reading` / `resume_reading` let the runtime stop taking
  publications while the next hop lags (backpressure); the broker queues
  for the wrapper meanwhile. While the broker sends fast, the reading also
  stops watching the socket for a millisecond or two after each pass, so
  that the next pass takes more at once (federation.daemon.read_coalescing).
* in paho's own network thread (`loop_start`, without `loop=`): simpler, for
  tools and tests; paho reconnects with the same backoff.

Subscriptions are made in `on_connect`, so every reconnect subscribes again:

* `$SYS/broker/log/#` (QoS 1): the broker's log lines, from which
  `BrokerLogTracker` learns local subscriptions. The broker logs the
  wrapper's own SUBSCRIBE on that topic, so a first line proves the broker
  has `log_dest topic` and `log_type all`. QoS 1, not 2: a line is handed
  over at its PUBLISH and acknowledged once the node took it either way (at
  least once: a line the broker sends again after a reconnection is read
  again, which the tracker's table takes as it took it), and QoS 2 costs
  twice the packets (PUBREC, PUBREL, PUBCOMP) and a write per PUBREL; with
  100,000 subscribe lines in a burst it also met Mosquitto 2.0.11's reused
  packet ids (lean_client.py) at every line.
* `#` with no_local, retain-as-published and retain handling 2, at QoS 2 so
  each publication arrives with the QoS it was published with, with its
  live retain flag, and without the stored retained messages at subscribe
  time.
* `$SYS/broker/subscriptions/count` (QoS 0, its retained value at once):
  how many subscriptions the broker holds, to find those the wrapper never
  saw (federation.daemon.broker_subscriptions).
* `$SYS/broker/clients/+` and `$SYS/broker/uptime` (QoS 1, in order with
  the log): the counts that settle what became of MQTT 5 sessions
  (federation.daemon.session_ledger).
* `$federation/handover/<client id>/#` (QoS 1, without no_local): the fences
  this connection publishes when a client is taken over here
  (`publish_fence`), read back in order with the local clients' QoS 1/2
  publications (federation.daemon.roaming: which of them the client's
  session had).

Acknowledgements of what the broker sends are manual (paho's `manual_ack`):
each publication and log line carries its packet id, and the runtime
acknowledges a pass's items in one place once its node has taken them
(`acknowledge`), so the broker keeps a publication until then. The
connection announces a Receive Maximum (`RECEIVE_MAXIMUM`): how many of them
the broker may have unacknowledged toward us.

The session is persistent (clean start 0, session expiry
`broker_session_expiry`, 3600 s by default): when the connection drops, or
the wrapper restarts, the broker queues the log lines (QoS 1, which it
expires after 20 s) and the QoS 1/2 publications meanwhile and delivers them
on reconnection, and it keeps its half of our unfinished QoS 1/2 injections.
A CONNACK without the session after this run had one (`Connected.session_lost`:
the broker restarted without persistence, or the session expired) means its
clients lost their subscriptions too (the runtime holds their publications
until they subscribe again, federation.daemon.broker_subscriptions).

The login (broker_auth.py): a user name and password, and TLS with a CA
and a client certificate, are set on paho's client before it connects. A
refused CONNACK is `ConnectRefused`; a failed TLS handshake, or a
connection the broker closes before its CONNACK (how a TLS 1.3 broker
refuses a client certificate), is `ConnectFailed(tls=True)`; both are
retried with the same backoff, and broker_health.py tells the operator what
to fix. With TLS, a record read may leave decrypted bytes inside the SSL
object that neither wake the loop nor show in FIONREAD: the read pass
looks at them too (`_tls_pending`).


Remote publications are injected on this same connection by an `Injector`
(injector.py: runs of packets, packet ids, the injection journal, what a new
session means for the unfinished ones). The broker's Receive Maximum (read
from the CONNACK, `receive_maximum`) bounds how many of ours may be
unfinished: `FlowControl` hands over no more (`injection_window`). MQTT v5
properties travel as a plain dict (keys as in docs/protocol.md,
`tm.properties`; converted by mqtt_properties.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from federation.daemon import read_coalescing
from federation.daemon.broker_auth import BrokerAuth
from federation.daemon.broker_items import (
    CLOSED_BEFORE_CONNACK,
    BrokerItem,
    ClientCount,
    Connected,
    ConnectFailed,
    ConnectRefused,
    CountsRound,
    Disconnected,
    HandoverFence,
    LogLine,
    Publication,
    PublicationRun,
    RetainedApplied,
    Subscribed,
    SubscriptionCount,
)
from federation.daemon.broker_log import LOG_TOPIC_FILTER, LOG_TOPIC_PREFIX
from federation.daemon.broker_reading import BrokerReading
from federation.daemon.config import DEFAULT_SESSION_EXPIRY
from federation.daemon.injector import InjectionRecorder, Injector
from federation.daemon.lean_client import (
    LeanClient,
    PublicClient,
    missing_paho_names,
    paho_version,
    stop_network_thread,
)
from federation.daemon.mqtt_properties import properties_to_dict
from federation.protocol.histogram import Histogram
from federation.protocol.types import Address, Injection, InjectionRun, PublicationId

log = logging.getLogger("federation.daemon.broker")

PUBLICATION_FILTER = "#"
SUBSCRIPTION_COUNT_TOPIC = "$SYS/broker/subscriptions/count"
UPTIME_TOPIC = "$SYS/broker/uptime"
"""the first message of every round of Mosquitto's `$SYS` counts (federation.daemon.session_ledger)"""
CLIENTS_FILTER = "$SYS/broker/clients/+"
CLIENTS_TOTAL_TOPIC = "$SYS/broker/clients/total"
CLIENTS_DISCONNECTED_TOPIC = "$SYS/broker/clients/disconnected"
LOG_QOS = 1
"""QoS of the wrapper's subscription to the broker's log (module docstring: why 1, not 2), and of its `$SYS` counts:
at one QoS they reach it in the broker's order (a QoS 0 count could overtake log lines that wait for room)"""
FENCE_PREFIX = "$federation/handover/"
"""a takeover's fence topic is this, the wrapper's client id and a name of its own (the wrapper's user needs `topic
readwrite $federation/handover/#` in an ACL: configs/mosquitto.acl; federation.daemon.kicker)"""
OWN_SUBSCRIPTIONS = 6
"""subscriptions the wrapper's own connection holds (the log, `#`, the subscription count, the client counts, the
uptime, its fences), all six in the broker's count"""
RECONNECT_MIN_DELAY = 0.25
"""seconds before the first reconnection attempt; doubles per failed attempt"""
RECONNECT_MAX_DELAY = 1.0
"""seconds: the cap of the reconnection backoff. Short, because the broker is the wrapper's own (an attempt
costs one refused TCP connection) and a restarted broker's clients that subscribe again before the wrapper is
back on its log are not seen doing so (docs/daemon.md "Subscriptions the wrapper did not see"): with 0.5 s
doubling to 10 s the wrapper came back 7.7 s after a broker killed for 4 s, 3 s after its subscribers"""
MAX_INFLIGHT = 0
"""QoS 1/2 messages paho keeps in flight to the broker at once: 0, no limit of paho's, because the runtime
hands paho at most the broker's Receive Maximum of unfinished ones (`FlowControl`), and with a limit paho
walks its whole table of messages on every PUBACK (`_update_inflight`). 1,000 against 0: 3,824-4,467 against
5,294-5,673 QoS 1 msg/s through `federation-2` (2 alternating runs)"""
KEEPALIVE = 30
"""seconds"""
RECEIVE_MAXIMUM = 1024
"""QoS 1/2 publications the broker may send us unacknowledged (our CONNECT's Receive Maximum). The runtime
acknowledges a read pass's publications once its node has taken them, so this bounds what the wrapper has
read and not yet taken into custody; a few read passes' worth (`broker_reading.MAX_PACKETS_PER_WAKEUP`), so the
broker never waits for an acknowledgement while the wrapper keeps up"""
DEFAULT_RECEIVE_MAXIMUM = 65535
"""the broker's Receive Maximum when its CONNACK names none (MQTT 5 section 3.2.2.3.3)"""
MISC_INTERVAL = 1.0
"""seconds between calls of paho's `loop_misc` (keepalive, ping timeout) on an asyncio loop"""

# ------------------------------------------------------------------ the adapter


def _set_cork(sock: Any, on: bool) -> bool:
    """TCP_CORK on or off: while on, the kernel holds partial segments, so a burst of small publications
    leaves as full segments; turning it off sends what is held. False if the option cannot be set."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1 if on else 0)
    except (OSError, AttributeError):
        return False
    return True


class BrokerAdapter:
    """One paho client: connect, subscribe, hand items over, inject publications.

    With `loop`, everything runs on that asyncio loop's thread: build the
    adapter and call `start`, `publish` and `stop` there (`deliver` is then
    called there too, and `flush` after each burst read). Without it paho
    runs its own thread: `deliver` is called from that thread and must only
    queue; `publish` and `stop` may be called from any thread (paho's publish
    is thread-safe).
    """

    def __init__(self, broker: Address, client_id: str, deliver: Callable[[BrokerItem], None],
                 max_qos: int = 2, loop: asyncio.AbstractEventLoop | None = None,
                 flush: Callable[[], None] | None = None, on_completed: Callable[[], None] | None = None,
                 hold: Callable[[], None] | None = None, auth: BrokerAuth | None = None,
                 session_expiry: int = DEFAULT_SESSION_EXPIRY, recorder: InjectionRecorder | None = None,
                 read_coalesce: float = read_coalescing.DEFAULT_SECONDS) -> None:
        if recorder is not None and loop is None:
            raise ValueError("an injection recorder needs the loop-driven adapter (it is told on the loop's thread)")
        self.broker = broker
        self.client_id = client_id
        self.fence_filter = f"{FENCE_PREFIX}{client_id}/#"
        """where this connection's takeover fences are published (`publish_fence`)"""
        self.max_qos = max_qos
        self.session_expiry = session_expiry
        self._deliver = deliver
        self._loop = loop
        self._stopping = False
        self.connected = False
        self.session_present: bool | None = None
        """the last CONNACK's session present flag (None before the first)"""
        self.receive_maximum = 0
        """the broker's Receive Maximum from the last CONNACK (0 before the first)"""
        self._had_session = False
        self.sessions_lost = 0
        """CONNACKs without the session after this run had one"""
        missing = missing_paho_names()
        if missing:
            log.warning("paho-mqtt %s lacks what the wrapper's short data path uses (%s; "
                        "federation/daemon/lean_client.py is written for paho-mqtt 2.2.0, which setup.cfg pins): "
                        "using paho's public API instead, which works but costs more CPU per message; install "
                        "paho-mqtt==2.2.0 to get the short path back", paho_version(), ", ".join(missing))
        client: LeanClient | PublicClient = (PublicClient if missing else LeanClient)(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5, manual_ack=True)
        if loop is not None and isinstance(client, LeanClient):
            client.lean_publish = self._on_lean_publish  # the buffered reads need `BrokerReading`'s draining
            client.lean_run = self._on_lean_run
        client.max_inflight_messages_set(MAX_INFLIGHT)
        client.max_queued_messages_set(0)  # unlimited
        # paho's signature says int, but it sleeps on floats; the first retry comes after 0.5 s.
        client.reconnect_delay_set(RECONNECT_MIN_DELAY, RECONNECT_MAX_DELAY)  # type: ignore[arg-type]
        self.auth = auth or BrokerAuth()
        """user, password and TLS files of the login (`apply_auth`)"""
        self.apply_auth(client, self.auth)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        client.publish_completed = self._on_publish_completed
        self.client = client
        self.injector = Injector(client, broker, max_qos, recorder, self._wrote)
        """what this connection publishes into the broker (injector.py)"""
        self.injector.applied = lambda publication: self._deliver(RetainedApplied(publication))
        client.pubrec_received = self._on_pubrec
        self._completed = False
        self._on_completed = on_completed
        """with `loop`: called after a read pass in which the broker completed some of our QoS 1/2 publications,
        and when paho's bytes that the socket refused have all gone out (`output_blocked` ended): room for more"""
        # Driven by an asyncio loop: the read side, the write side's state and the pending timers.
        self.reading = BrokerReading(loop, client, self._after_read_pass, hold, flush, read_coalesce) \
            if loop is not None else None
        """with `loop`: the socket watched and read (broker_reading.py); `hold` and `flush` frame each pass"""
        self._writing = False
        self._retry_delay = RECONNECT_MIN_DELAY
        self._refused = False
        """the broker refused the current connection attempt (CONNACK failure)"""
        self._connect_handle: asyncio.Handle | None = None
        self._connecting: asyncio.Future[Any] | None = None
        self._keepalive_handle: asyncio.TimerHandle | None = None
        if loop is not None:
            client.on_socket_open = self._on_socket_open
            client.on_socket_close = self._on_socket_close

    @staticmethod
    def apply_auth(client: mqtt.Client, auth: BrokerAuth) -> None:
        """The login's user and password, and its TLS context, on paho's client (read at the next connection)."""
        if auth.username is not None:
            client.username_pw_set(auth.username, auth.password)
        context = auth.ssl_context()
        if context is not None:
            client.tls_set_context(context)

    def update_password(self, auth: BrokerAuth) -> None:
        """A password re-read from the password file (SIGHUP): used from the next connection on, which is made
        at once if the wrapper is not connected (the backoff starts again)."""
        self.auth = auth
        if auth.username is not None:
            self.client.username_pw_set(auth.username, auth.password)
        loop = self._loop
        if loop is None or self.connected or self._stopping or self._connecting is not None:
            return
        if self._connect_handle is not None:
            self._connect_handle.cancel()
        self._retry_delay = RECONNECT_MIN_DELAY
        self._connect_handle = loop.call_soon(self._connect)

    @property
    def on_loop(self) -> bool:
        """True when an asyncio loop drives paho (no network thread)."""
        return self._loop is not None

    # The asyncio side.

    def restore(self, unfinished: Sequence[tuple[int, Injection, bool]]) -> None:
        """Before `start`: the QoS 1/2 injections a previous run left unfinished (mid, injection, past PUBREC), from
        the injection journal (`Injector.restore`)."""
        self.injector.restore(unfinished)

    def start(self) -> None:
        """Start connecting; never blocks and never fails on a broker that is down."""
        connect_properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        connect_properties.SessionExpiryInterval = self.session_expiry
        connect_properties.ReceiveMaximum = RECEIVE_MAXIMUM
        self.client.connect_async(self.broker.host, self.broker.port, keepalive=KEEPALIVE, clean_start=False,
                                  properties=connect_properties)
        loop = self._loop
        if loop is None:
            self.client.loop_start()
            return
        self._connect_handle = loop.call_soon(self._connect)
        self._keepalive_handle = loop.call_later(MISC_INTERVAL, self._keepalive)

    def publish(self, injection: Injection) -> bool:
        """Publish one remote publication with paho's `publish` (`Injector.publish`)."""
        return self.injector.publish(injection)

    def publish_runs(self, runs: Sequence[InjectionRun]) -> None:
        """QoS 0 runs, in order (`Injector.publish_runs`); on the loop's thread, corked as `publish_all`."""
        self._corked(len(runs) > 1, lambda: self.injector.publish_runs(runs))

    def publish_all(self, injections: Sequence[Injection]) -> None:
        """Publish several, in order (`Injector.publish_all`); on a loop, corked (TCP_CORK), so the broker gets
        them in as few segments as fit (not when they take one write anyway: `Injector.plan`)."""
        planned = self.injector.plan(injections)
        self._corked(len(planned) > 1, lambda: self.injector.write_planned(planned))

    def _corked(self, several: bool, write: Callable[[], None]) -> None:
        sock = self._watched if several and self._loop is not None else None
        corked = sock is not None and _set_cork(sock, True)
        try:
            write()
        finally:
            if corked and sock is self._watched:  # not if the connection dropped meanwhile
                _set_cork(sock, False)

    def backlog(self) -> int:
        """QoS 1/2 publications handed to paho that the broker has not completed yet (in flight or queued)."""
        return self.injector.backlog()

    def injection_window(self) -> int:
        """How many more QoS 1/2 injections the broker takes now: its Receive Maximum less those unfinished
        (0 while not connected: what is handed over then waits for the next connection in our queue)."""
        if not self.connected:
            return 0
        return max(0, self.receive_maximum - self.injector.backlog())

    @property
    def injected(self) -> int:
        return self.injector.injected

    @property
    def inject_failed(self) -> int:
        return self.injector.inject_failed

    @property
    def counts(self) -> dict[str, int]:
        return self.injector.counts

    @property
    def injection_latency(self) -> Histogram:
        """seconds from handing a QoS 1/2 publication to the connection to the broker's PUBACK / PUBCOMP"""
        return self.injector.injection_latency

    @property
    def output_blocked(self) -> bool:
        """The socket to the broker refused bytes that paho now holds (written when it is writable): the broker
        is slower than what we hand it, so more should wait in our bounded queue, not in paho's unbounded one."""
        return self._writing

    def _wrote(self) -> None:
        """paho was handed bytes: on a loop, watch the socket if it could not take them all."""
        if self._loop is not None and not self._writing and self.client.want_write():
            self._watch_writes()  # the rest goes out when it is writable

    def acknowledge(self, acks: Sequence[tuple[int, int]]) -> None:
        """Acknowledge received QoS 1/2 publications and log lines (mid, qos): the runtime calls it once its node
        has taken them, for a whole pass at once (one write)."""
        if not acks:
            return
        self.client.send_acks(acks)
        self._wrote()

    @property
    def reading_paused(self) -> bool:
        return self.reading is not None and self.reading.paused

    @property
    def read_waits(self) -> int:
        """read passes followed by a wait so far (federation.daemon.read_coalescing)"""
        return self.reading.coalescing.waits if self.reading is not None else 0

    @property
    def _watched(self) -> socket.socket | None:
        return self.reading.watched if self.reading is not None else None

    def pause_reading(self) -> None:
        """On a loop: stop reading from the broker (it queues for us meanwhile); backpressure."""
        if self.reading is not None:
            self.reading.pause()

    def resume_reading(self) -> None:
        if self.reading is not None:
            self.reading.resume()

    def stop(self) -> None:
        """Disconnect cleanly. Threaded: stop paho's thread (waits at most about a second). On a loop: call it
        on the loop's thread; it does not block."""
        self._stopping = True
        if self._loop is None:
            try:
                self.client.disconnect()
            finally:
                stop_network_thread(self.client)
            return
        for handle in (self._connect_handle, self._keepalive_handle):
            if handle is not None:
                handle.cancel()
        self._connect_handle = self._keepalive_handle = None
        if self.reading is not None:
            self.reading.stop()
        self.client.disconnect()  # writes DISCONNECT at once and closes the socket (paho calls _on_socket_close)

    # Driving paho from the asyncio loop (loop thread, except `_blocking_connect`).

    def _connect(self) -> None:
        self._connect_handle = None
        if self._stopping or self._connecting is not None:
            return
        assert self._loop is not None
        self._refused = False
        self._connecting = self._loop.run_in_executor(None, self._blocking_connect)
        self._connecting.add_done_callback(self._connect_done)

    def _blocking_connect(self) -> None:
        """In the executor: TCP connect and CONNECT (paho calls `_on_socket_open` from here)."""
        self.client.reconnect()

    def _connect_done(self, future: asyncio.Future[Any]) -> None:
        self._connecting = None
        error = future.exception()
        if self._stopping:
            if error is None:
                self.client.disconnect()
            return
        if error is not None:
            if not isinstance(error, OSError):
                log.error("connecting to broker %s failed: %r", self.broker, error)
            self._deliver(ConnectFailed.of(error, self.auth.tls))
            self._schedule_connect()
            return
        if self.client.socket() is None:  # closed while CONNECT was written: reported by `_on_disconnect`
            self._schedule_connect()
            return
        self._write_pending()  # CONNECT may still wait in paho's queue

    def _schedule_connect(self) -> None:
        if self._stopping or self._connect_handle is not None or self._connecting is not None:
            return
        assert self._loop is not None
        delay, self._retry_delay = self._retry_delay, min(self._retry_delay * 2, RECONNECT_MAX_DELAY)
        self._connect_handle = self._loop.call_later(delay, self._connect)

    def _on_socket_open(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._watch, sock)

    def _watch(self, sock: socket.socket) -> None:
        if self.client.socket() is not sock or sock.fileno() < 0:
            return  # closed meanwhile (stop, or a failed attempt)
        assert self.reading is not None
        self.reading.watch(sock)
        self._write_pending()

    def _on_socket_close(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        """paho is about to close `sock`: stop watching it first, so its descriptor number can be reused."""
        assert self._loop is not None and self.reading is not None
        if not self.reading.forget(sock):
            return
        if self._writing:
            self._loop.remove_writer(sock)
            self._writing = False

    def _after_read_pass(self) -> None:
        """What a read pass caused: paho's queued bytes written, finished injections settled, and the runtime told
        when the broker completed some of ours."""
        self._write_pending()
        self.injector.flush_finished()
        if self._completed:
            self._completed = False
            if self._on_completed is not None:
                self._on_completed()

    def _write_pending(self) -> None:
        """Packets queued inside paho's callbacks (SUBSCRIBE in on_connect) or refused by a full socket wait
        in paho's queue: write them now, and watch for writability if some remain."""
        client = self.client
        if client.want_write() and self._watched is not None:
            client.loop_write()
            if client.want_write() and not self._writing:
                self._watch_writes()

    def _watch_writes(self) -> None:
        sock = self._watched
        if sock is None or self._writing:
            return
        assert self._loop is not None
        self._writing = True
        self._loop.add_writer(sock, self._on_writable)

    def _on_writable(self) -> None:
        client = self.client
        client.loop_write()
        sock = self._watched
        if self._writing and sock is not None and not client.want_write():
            assert self._loop is not None
            self._loop.remove_writer(sock)
            self._writing = False
            if self._on_completed is not None:
                self._on_completed()

    def _keepalive(self) -> None:
        """paho's `loop_misc` every MISC_INTERVAL: a PINGREQ when due, the connection closed when the broker's
        answer is overdue."""
        assert self._loop is not None
        self._keepalive_handle = self._loop.call_later(MISC_INTERVAL, self._keepalive)
        if self._watched is not None:
            self.client.loop_misc()
            self._write_pending()

    # paho's callbacks: paho's thread, or the loop's.

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: ReasonCode,
                    properties: Properties | None) -> None:
        """CONNACK. Called before paho sends the unfinished messages again: without the session, they are taken
        back from paho here (they would be new messages to the broker, and a PUBREL of one past PUBREC would be
        answered as done while the broker never delivered it) and handed over to be published anew."""
        if reason_code.is_failure:
            self._refused = True
            self._deliver(ConnectRefused(str(reason_code)))
            return
        sock = client.socket()
        if isinstance(sock, socket.socket):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as error:
                log.debug("cannot set TCP_NODELAY: %s", error)
        session_present = bool(flags.session_present)
        receive_maximum = int(getattr(properties, "ReceiveMaximum", 0) or DEFAULT_RECEIVE_MAXIMUM)
        session_lost = not session_present and self._had_session
        self._had_session = True
        if session_lost:
            self.sessions_lost += 1
        self.client.session_started(session_present)  # before any packet of the new session is read
        resent, reinjected = self.injector.connected(session_present)
        self.connected = True
        self.session_present = session_present
        self.receive_maximum = receive_maximum
        self._retry_delay = RECONNECT_MIN_DELAY
        self._deliver(Connected(session_present, session_lost, receive_maximum, resent, tuple(reinjected)))
        client.subscribe([
            (LOG_TOPIC_FILTER, SubscribeOptions(qos=LOG_QOS)),
            (PUBLICATION_FILTER, SubscribeOptions(qos=2, noLocal=True, retainAsPublished=True, retainHandling=2)),
            (SUBSCRIPTION_COUNT_TOPIC, SubscribeOptions(qos=LOG_QOS)),
            (CLIENTS_FILTER, SubscribeOptions(qos=LOG_QOS)),
            (UPTIME_TOPIC, SubscribeOptions(qos=LOG_QOS)),
            (self.fence_filter, SubscribeOptions(qos=LOG_QOS)),
        ])

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        self._deliver(ConnectFailed())

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: ReasonCode,
                       properties: Properties | None) -> None:
        was_connected, self.connected = self.connected, False
        self.injector.connection_lost()
        if was_connected or self._stopping or self._refused:
            self._deliver(Disconnected(str(reason_code), self._stopping, self.injector.backlog()))
        else:  # closed before CONNACK: with TLS, how a broker refuses a client certificate (after the handshake)
            self._deliver(ConnectFailed(CLOSED_BEFORE_CONNACK, tls=True))
        if self._loop is not None:
            self._schedule_connect()

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, reason_codes: list[ReasonCode],
                      properties: Properties | None) -> None:
        filters = (LOG_TOPIC_FILTER, PUBLICATION_FILTER, SUBSCRIPTION_COUNT_TOPIC, CLIENTS_FILTER, UPTIME_TOPIC,
                   self.fence_filter)
        refused = tuple(f"{topic_filter}: {code}" for topic_filter, code in zip(filters, reason_codes, strict=False)
                        if code.is_failure)
        self._deliver(Subscribed(refused))

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        try:
            topic = message.topic
        except UnicodeDecodeError:
            self._acknowledge_now(message.mid, message.qos)  # the broker checks UTF-8; nothing valid to federate
            return
        if topic.startswith("$"):
            self._system_message(topic, bytes(message.payload), message.qos, message.mid)
            return
        self._deliver(Publication(topic, bytes(message.payload), message.qos, bool(message.retain),
                                  properties_to_dict(message.properties), message.mid, bool(message.dup)))

    def _on_lean_publish(self, topic_bytes: bytes, payload: bytes, qos: int, retain: bool, mid: int) -> None:
        """`LeanClient`'s short path: a PUBLISH without properties, as `_on_message` would see it."""
        try:
            topic = topic_bytes.decode("utf-8")
        except UnicodeDecodeError:
            self._acknowledge_now(mid, qos)
            return
        if topic.startswith("$"):
            self._system_message(topic, payload, qos, mid)
            return
        self._deliver(Publication(topic, payload, qos, retain, None, mid))

    def _on_lean_run(self, topics: list[str], payloads: list[bytes], qos: int, mids: list[int]) -> None:
        """`LeanClient`'s run of plain publications, handed over as one item."""
        self._deliver(PublicationRun(topics, payloads, qos, mids))

    def _system_message(self, topic: str, payload: bytes, qos: int, mid: int) -> None:
        """A `$` topic: a log line (acknowledged by the runtime with the publications), the subscription count,
        or something not asked for (acknowledged at once)."""
        if topic.startswith(LOG_TOPIC_PREFIX):
            self._deliver(LogLine(topic, payload, mid, qos))
            return
        self._acknowledge_now(mid, qos)
        if topic.startswith(FENCE_PREFIX):
            self._deliver(HandoverFence(topic))
            return
        if topic == UPTIME_TOPIC:
            self._deliver(CountsRound())
            return
        if topic not in (SUBSCRIPTION_COUNT_TOPIC, CLIENTS_TOTAL_TOPIC, CLIENTS_DISCONNECTED_TOPIC):
            return  # the other client counts
        try:
            count = int(payload)
        except ValueError:
            log.debug("%s: not a number: %r", topic, payload[:40])
            return
        if topic == SUBSCRIPTION_COUNT_TOPIC:
            self._deliver(SubscriptionCount(count))
        else:
            self._deliver(ClientCount(topic == CLIENTS_TOTAL_TOPIC, count))

    def publish_fence(self, topic: str) -> bool:
        """Publish a takeover's fence (QoS 1, empty) on this connection, behind every injection handed over so far;
        False when not connected (then no fence comes)."""
        if not self.connected:
            return False
        info = self.client.publish(topic, b"", qos=1)
        self._wrote()
        return info.rc == mqtt.MQTT_ERR_SUCCESS

    def _acknowledge_now(self, mid: int, qos: int) -> None:
        if qos:
            self.client.send_acks([(mid, qos)])

    def take_injection_outcomes(self) -> list[tuple[PublicationId, bool]]:
        """QoS 1/2 injections the broker has now (True) or will not get from this connection (False), since the
        last call (`Injector.take_outcomes`)."""
        return self.injector.take_outcomes()

    def _on_pubrec(self, mid: int, reason: int) -> None:
        self.injector.on_pubrec(mid, reason)
        self._completed = True  # the broker has a QoS 2 injection: the node's custody of it may end

    def _on_publish_completed(self, mid: int, reason: int) -> None:
        if self.injector.on_completed(mid, reason):
            self._completed = True
