"""The wrapper's one MQTT v5 connection to its local Mosquitto broker (paho-mqtt 2.x).

Theory of operation: every callback turns what happened into a small item
(`LogLine`, `Publication`, `Connected`, ...) and hands it to `deliver`; the
runtime queues them (`LoopHandOff`) and feeds them to the node in batches.
Two ways to drive paho:

* on an asyncio loop (`loop=`, what the wrapper does): paho's external-loop
  API, no thread. The socket is watched with `add_reader`; one wake-up reads
  every complete packet waiting (FIONREAD says when to stop), so a burst of
  publications costs one pass through the event loop, not one per message;
  the client (`LeanClient`, federation/daemon/lean_client.py) parses the
  plain QoS 0/1 publications of that burst itself, in one loop, instead of
  paho's several reads and objects per packet. It relies on private names
  of paho's; if the installed paho lacks one, the adapter says so at
  construction and uses `PublicClient` (paho's documented API) instead.
  Publishing writes to the socket at once, in the caller's thread, which is
  the loop's. Only a connection attempt runs in the loop's default executor,
  because paho's connect blocks (up to its 5 s timeout for an unreachable
  host); reconnection uses exponential backoff (0.5 s doubling to 10 s) and
  `loop_misc` runs every second for the keepalive. Why: with paho in its own
  thread the two threads handed the GIL back and forth for every message
  (paho wakes its thread through a socket pair on every publish), which
  cost 12-25% of the wrapper's CPU per message (docs/benchmarks.md).
  `pause_reading` / `resume_reading` let the runtime stop taking
  publications while the next hop lags (backpressure); the broker queues
  for the wrapper meanwhile.
* in paho's own network thread (`loop_start`, without `loop=`): simpler, for
  tools and tests; paho reconnects with the same backoff.

Subscriptions are made in `on_connect`, so every reconnect subscribes again:

* `$SYS/broker/log/#` (QoS 2): the broker's log lines, from which
  `BrokerLogTracker` learns local subscriptions. The broker logs the
  wrapper's own SUBSCRIBE on that topic, so a first line proves the broker
  has `log_dest topic` and `log_type all`.
* `#` with no_local, retain-as-published and retain handling 2, at QoS 2 so
  each publication arrives with the QoS it was published with, with its
  live retain flag, and without the stored retained messages at subscribe
  time.

The session is kept for `SESSION_EXPIRY` seconds after a disconnection
(clean start 0, session expiry 60 s): when the connection drops, or the
wrapper restarts quickly, the broker queues the log lines (QoS 2, which it
expires after 20 s) and the QoS 1/2 publications meanwhile and delivers them
on reconnection, so a subscription made during the gap is not missed. A
broker restart without persistence loses the session; nothing can be
recovered then.

The login (broker_auth.py): a user name and password, and TLS with a CA
and a client certificate, are set on paho's client before it connects. A
refused CONNACK is `ConnectRefused`; a failed TLS handshake, or a
connection the broker closes before its CONNACK (how a TLS 1.3 broker
refuses a client certificate), is `ConnectFailed(tls=True)`; both are
retried with the same backoff, and broker_health.py tells the operator what
to fix. With TLS, a record read may leave decrypted bytes inside the SSL
object that neither wake the loop nor show in FIONREAD: the read pass
looks at them too (`_tls_pending`).

Remote publications are injected with `publish` on this same connection:
no_local then keeps the broker from echoing them back, which is what stops a
federated publication from being federated again. MQTT v5 properties travel
as a plain dict (keys as in docs/protocol.md, `tm.properties`; converted by
mqtt_properties.py).
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import logging
import socket
import ssl
import termios
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.exception import MQTTException
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from federation.daemon.broker_auth import BrokerAuth
from federation.daemon.broker_items import (
    BrokerItem,
    Connected,
    ConnectFailed,
    ConnectRefused,
    Disconnected,
    LogLine,
    Publication,
    Subscribed,
)
from federation.daemon.broker_log import LOG_TOPIC_FILTER, LOG_TOPIC_PREFIX
from federation.daemon.lean_client import LeanClient, PublicClient, lean_qos0_publish, missing_paho_names
from federation.daemon.mqtt_properties import dict_to_properties, properties_to_dict
from federation.protocol.histogram import Histogram
from federation.protocol.types import Address, Injection

log = logging.getLogger("federation.daemon.broker")

PUBLICATION_FILTER = "#"
RECONNECT_MIN_DELAY = 0.5
"""seconds before the first reconnection attempt; doubles per failed attempt"""
RECONNECT_MAX_DELAY = 10.0
"""seconds: the cap of the reconnection backoff"""
MAX_INFLIGHT = 0
"""QoS 1/2 messages paho keeps in flight to the broker at once: 0, no limit of paho's, because the runtime
already hands paho at most `BROKER_BACKLOG` unfinished ones, and with a limit paho walks its whole table of
messages on every PUBACK (`_update_inflight`). 1,000 against 0: 3,824-4,467 against 5,294-5,673 QoS 1
msg/s through `federation-2` (2 alternating runs)"""
KEEPALIVE = 30
"""seconds"""
SESSION_EXPIRY = 60
"""seconds the broker keeps the wrapper's session (and queues its QoS 1/2 messages) after a disconnection"""
MISC_INTERVAL = 1.0
"""seconds between calls of paho's `loop_misc` (keepalive, ping timeout) on an asyncio loop"""
MAX_PACKETS_PER_WAKEUP = 256
"""packets read from the broker in one pass before the event loop gets to run other callbacks"""

# ------------------------------------------------------------------ the adapter


def paho_version() -> str:
    """The installed paho-mqtt's version, for messages."""
    try:
        return metadata.version("paho-mqtt")
    except metadata.PackageNotFoundError:
        return "(version unknown)"


def _set_cork(sock: Any, on: bool) -> bool:
    """TCP_CORK on or off: while on, the kernel holds partial segments, so a burst of small publications
    leaves as full segments; turning it off sends what is held. False if the option cannot be set."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1 if on else 0)
    except (OSError, AttributeError):
        return False
    return True


def _tls_pending(sock: Any) -> int:
    """Bytes TLS has decrypted and holds for the next read (0 for a plain socket): a TLS record may carry several
    MQTT packets, and what is left of it after a read makes the raw socket neither readable nor FIONREAD > 0."""
    return sock.pending() if isinstance(sock, ssl.SSLSocket) else 0


CLOSED_BEFORE_CONNACK = "the broker closed the connection before answering CONNECT"
RESET_IN_HANDSHAKE = "the broker reset the connection during the TLS handshake"


def connect_failure(error: BaseException, tls: bool) -> ConnectFailed:
    """What a failed connection attempt tells the operator: a TLS handshake failure, or the socket's error."""
    if isinstance(error, ssl.SSLError):
        reason = str(getattr(error, "reason", None) or error).replace("_", " ").lower()
        verify = getattr(error, "verify_message", None)
        return ConnectFailed(f"{reason}: {verify}" if verify else reason, tls=True)
    if tls and isinstance(error, (ConnectionResetError, ConnectionAbortedError)):
        return ConnectFailed(RESET_IN_HANDSHAKE, tls=True)
    return ConnectFailed(getattr(error, "strerror", None) or str(error))


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
                 hold: Callable[[], None] | None = None, auth: BrokerAuth | None = None) -> None:
        self.broker = broker
        self.client_id = client_id
        self.max_qos = max_qos
        self._deliver = deliver
        self._loop = loop
        self._flush = flush
        """with `loop`: called after each burst read from the broker, to hand its items over at once"""
        self._hold = hold
        """with `loop` and `flush`: called before each burst read (`flush` follows: nothing need be scheduled)"""
        self._stopping = False
        self.connected = False
        self.injected = 0
        self.inject_failed = 0
        self.properties_skipped = 0
        missing = missing_paho_names()
        if missing:
            log.warning("paho-mqtt %s lacks what the wrapper's short data path uses (%s; "
                        "federation/daemon/lean_client.py is written for paho-mqtt 2.2.0, which setup.cfg pins): "
                        "using paho's public API instead, which works but costs more CPU per message; install "
                        "paho-mqtt==2.2.0 to get the short path back", paho_version(), ", ".join(missing))
        client: LeanClient | PublicClient = (PublicClient if missing else LeanClient)(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        if loop is not None and isinstance(client, LeanClient):
            client.lean_publish = self._on_lean_publish  # the buffered reads need `_on_readable`'s draining
        client.max_inflight_messages_set(MAX_INFLIGHT)
        client.max_queued_messages_set(0)  # unlimited
        # paho's signature says int, but it sleeps on floats; the first retry comes after 0.5 s.
        client.reconnect_delay_set(RECONNECT_MIN_DELAY, RECONNECT_MAX_DELAY)  # type: ignore[arg-type]
        self.auth = auth or BrokerAuth()
        """user, password and TLS files of the login (`_apply_auth`)"""
        self._apply_auth(client, self.auth)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        client.publish_completed = self._on_publish_completed
        self.client = client
        self._unfinished: set[int] = set()
        """mids of the QoS 1/2 publications handed to paho that the broker has not completed (`backlog`)"""
        self._handed_at: dict[int, float] = {}
        """monotonic time each of `_unfinished` was handed to paho"""
        self.injection_latency = Histogram()
        """seconds from handing a QoS 1/2 publication to the connection to the broker's PUBACK / PUBCOMP"""
        self._completed = False
        self._on_completed = on_completed
        """with `loop`: called after a read pass in which the broker completed some of our QoS 1/2 publications,
        and when paho's bytes that the socket refused have all gone out (`output_blocked` ended): room for more"""
        # Driven by an asyncio loop: the watched socket and the pending timers.
        self._watched: socket.socket | None = None
        self._writing = False
        self._retry_delay = RECONNECT_MIN_DELAY
        self._refused = False
        """the broker refused the current connection attempt (CONNACK failure)"""
        self._connect_handle: asyncio.Handle | None = None
        self._connecting: asyncio.Future[Any] | None = None
        self._keepalive_handle: asyncio.TimerHandle | None = None
        self._available = array.array("i", [0])
        self._paused = False
        self._read_retry: asyncio.Handle | None = None
        """a pending read pass for packets already in our buffer (`_schedule_read_retry`)"""
        if loop is not None:
            client.on_socket_open = self._on_socket_open
            client.on_socket_close = self._on_socket_close

    @staticmethod
    def _apply_auth(client: mqtt.Client, auth: BrokerAuth) -> None:
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

    def start(self) -> None:
        """Start connecting; never blocks and never fails on a broker that is down."""
        connect_properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        connect_properties.SessionExpiryInterval = SESSION_EXPIRY
        self.client.connect_async(self.broker.host, self.broker.port, keepalive=KEEPALIVE, clean_start=False,
                                  properties=connect_properties)
        loop = self._loop
        if loop is None:
            self.client.loop_start()
            return
        self._connect_handle = loop.call_soon(self._connect)
        self._keepalive_handle = loop.call_later(MISC_INTERVAL, self._keepalive)

    def publish(self, injection: Injection) -> bool:
        """Publish a remote publication into the broker; False if paho refused it (not connected, QoS 0)."""
        properties, skipped = dict_to_properties(injection.properties) if injection.properties else (None, ())
        if skipped:
            self.properties_skipped += len(skipped)
            log.debug("publication %s: skipped invalid properties %s", injection.publication, skipped)
        qos = min(injection.qos, self.max_qos)
        try:
            info = self.client.publish(injection.topic, injection.payload, qos=qos, retain=injection.retain,
                                       properties=properties)
        except (ValueError, MQTTException) as error:
            log.warning("cannot inject publication on %r: %s", injection.topic, error)
            self.inject_failed += 1
            return False
        if self._loop is not None and not self._writing and self.client.want_write():
            self._watch_writes()  # the socket was full: the rest goes out when it is writable
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS and not (qos > 0 and info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN):
            # QoS 1/2 messages refused for "no connection" are queued by paho and sent after reconnecting.
            self.inject_failed += 1
            return False
        if qos:
            self._unfinished.add(info.mid)  # stored by paho until PUBACK / PUBCOMP, also while disconnected
            self._handed_at[info.mid] = time.monotonic()
        self.injected += 1
        return True

    def backlog(self) -> int:
        """QoS 1/2 publications handed to paho that the broker has not completed yet (in flight or queued)."""
        return len(self._unfinished)

    @property
    def output_blocked(self) -> bool:
        """The socket to the broker refused bytes that paho now holds (written when it is writable): the broker
        is slower than what we hand it, so more should wait in our bounded queue, not in paho's unbounded one."""
        return self._writing

    def publish_all(self, injections: Sequence[Injection]) -> None:
        """Publish several; on a loop, corked (TCP_CORK), so the broker gets them in as few segments as fit.
        A run of QoS 0 publications without properties is built here and written with one `send`; a run of
        QoS 1 ones without properties goes to `LeanClient.send_qos1` (one write, paho still tracks each).
        With paho's public path (`PublicClient`), `publish` each."""
        sock = self._watched if len(injections) > 1 and self._loop is not None else None
        corked = sock is not None and _set_cork(sock, True)
        client = self.client
        max_qos = self.max_qos
        run = bytearray()
        count = 0
        qos1: list[Injection] = []
        try:
            if not isinstance(client, LeanClient):
                for injection in injections:
                    self.publish(injection)
                return
            for injection in injections:
                if not injection.properties:
                    qos = injection.qos if injection.qos < max_qos else max_qos
                    if qos == 1:
                        if count:
                            self._send_qos0_run(client, run, count)
                            run, count = bytearray(), 0
                        qos1.append(injection)
                        continue
                    if qos1:
                        self._send_qos1_run(client, qos1)
                        qos1 = []
                    if qos == 0 and lean_qos0_publish(run, injection.topic, injection.payload, injection.retain):
                        count += 1
                        continue
                elif qos1:
                    self._send_qos1_run(client, qos1)
                    qos1 = []
                if count:
                    self._send_qos0_run(client, run, count)
                    run, count = bytearray(), 0
                self.publish(injection)
            if count:
                self._send_qos0_run(client, run, count)
            if qos1:
                self._send_qos1_run(client, qos1)
        finally:
            if corked and sock is self._watched:  # not if the connection dropped meanwhile
                _set_cork(sock, False)

    def _send_qos0_run(self, client: LeanClient, run: bytearray, count: int) -> None:
        """`count` QoS 0 PUBLISH packets built in `run`, written with one `send`."""
        if client.send_qos0(run) != MQTTErrorCode.MQTT_ERR_SUCCESS:
            self.inject_failed += count  # not connected: paho refuses QoS 0 publications too
            return
        self.injected += count
        if self._loop is not None and not self._writing and client.want_write():
            self._watch_writes()

    def _send_qos1_run(self, client: LeanClient, injections: Sequence[Injection]) -> None:
        """QoS 1 publications without properties: what `send_qos1` takes, then the rest through `publish`."""
        # Taken ones join `_unfinished`: in paho's `_out_messages` until PUBACK, also across a reconnection.
        mids = client.send_qos1([(injection.topic, injection.payload, injection.retain) for injection in injections],
                                self._unfinished)
        if mids:
            self.injected += len(mids)
            handed = time.monotonic()
            for mid in mids:
                self._handed_at[mid] = handed
            if self._loop is not None and not self._writing and client.want_write():
                self._watch_writes()
        for injection in injections[len(mids):]:
            self.publish(injection)

    @property
    def reading_paused(self) -> bool:
        return self._paused

    def pause_reading(self) -> None:
        """On a loop: stop reading from the broker (it queues for us meanwhile); backpressure."""
        if self._loop is None or self._paused:
            return
        self._paused = self.client.paused = True
        if self._read_retry is not None:
            self._read_retry.cancel()
            self._read_retry = None
        if self._watched is not None:
            self._loop.remove_reader(self._watched)

    def resume_reading(self) -> None:
        if self._loop is None or not self._paused:
            return
        self._paused = self.client.paused = False
        if self._watched is not None:
            self._loop.add_reader(self._watched, self._on_readable)
            if self.client.buffered() or _tls_pending(self._watched):
                self._schedule_read_retry()  # what we read before the pause does not make the socket readable

    def stop(self) -> None:
        """Disconnect cleanly. Threaded: stop paho's thread (waits at most about a second). On a loop: call it
        on the loop's thread; it does not block."""
        self._stopping = True
        if self._loop is None:
            try:
                self.client.disconnect()
            finally:
                self.client.loop_stop()
            return
        for handle in (self._connect_handle, self._keepalive_handle):
            if handle is not None:
                handle.cancel()
        self._connect_handle = self._keepalive_handle = None
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
            self._deliver(connect_failure(error, self.auth.tls))
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
        assert self._loop is not None
        self._watched = sock
        if not self._paused:
            self._loop.add_reader(sock, self._on_readable)
        self._write_pending()

    def _on_socket_close(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        """paho is about to close `sock`: stop watching it first, so its descriptor number can be reused."""
        if sock is not self._watched or sock is None:
            return
        assert self._loop is not None
        self._loop.remove_reader(sock)
        if self._writing:
            self._loop.remove_writer(sock)
            self._writing = False
        self._watched = None

    def _on_readable(self) -> None:
        """Read every complete packet waiting (at most MAX_PACKETS_PER_WAKEUP, and none once paused), then send
        what they caused."""
        if self._hold is not None:
            self._hold()
        try:
            self._read_pass()
        finally:
            if self._flush is not None:
                self._flush()

    def _read_pass(self) -> None:
        client = self.client
        sock = self._watched
        fileno = sock.fileno() if sock is not None else -1
        budget = MAX_PACKETS_PER_WAKEUP if fileno >= 0 else 0
        while budget > 0 and not self._paused:
            read = client.read_packets(budget)
            if read <= 0 or client.socket() is not sock:
                break  # nothing (more) now, or the connection is gone
            budget -= read
            if client.buffered() or _tls_pending(sock):
                continue  # complete packets may wait in the client's (or TLS's) read buffer: the socket may be empty
            try:
                fcntl.ioctl(fileno, termios.FIONREAD, self._available)
            except OSError:
                break
            if self._available[0] <= 0:
                break
        if (client.buffered() or _tls_pending(sock)) and client.socket() is sock:
            self._schedule_read_retry()  # the socket may not wake us for what we hold already
        self._write_pending()
        if self._completed:
            self._completed = False
            if self._on_completed is not None:
                self._on_completed()

    def _schedule_read_retry(self) -> None:
        """Read again soon: complete packets wait in our buffer. At most one retry is pending, or a flood
        would add one more read pass per loop iteration and starve the timers and the UDP socket."""
        if self._read_retry is None and not self._paused and self._loop is not None:
            self._read_retry = self._loop.call_soon(self._retry_read)

    def _retry_read(self) -> None:
        self._read_retry = None
        if not self._paused and self._watched is not None:
            self._on_readable()

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
        self.connected = True
        self._retry_delay = RECONNECT_MIN_DELAY
        self._deliver(Connected())
        client.subscribe([
            (LOG_TOPIC_FILTER, SubscribeOptions(qos=2)),
            (PUBLICATION_FILTER, SubscribeOptions(qos=2, noLocal=True, retainAsPublished=True, retainHandling=2)),
        ])

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        self._deliver(ConnectFailed())

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: ReasonCode,
                       properties: Properties | None) -> None:
        was_connected, self.connected = self.connected, False
        if was_connected or self._stopping or self._refused:
            self._deliver(Disconnected(str(reason_code), self._stopping))
        else:  # closed before CONNACK: with TLS, how a broker refuses a client certificate (after the handshake)
            self._deliver(ConnectFailed(CLOSED_BEFORE_CONNACK, tls=True))
        if self._loop is not None:
            self._schedule_connect()

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, reason_codes: list[ReasonCode],
                      properties: Properties | None) -> None:
        filters = (LOG_TOPIC_FILTER, PUBLICATION_FILTER)
        refused = tuple(f"{topic_filter}: {code}" for topic_filter, code in zip(filters, reason_codes, strict=False)
                        if code.is_failure)
        self._deliver(Subscribed(refused))

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        try:
            topic = message.topic
        except UnicodeDecodeError:
            return  # the broker checks UTF-8; nothing valid to federate
        if topic.startswith("$"):
            if topic.startswith(LOG_TOPIC_PREFIX):
                self._deliver(LogLine(topic, bytes(message.payload)))
            return
        self._deliver(Publication(topic, bytes(message.payload), message.qos, bool(message.retain),
                                  properties_to_dict(message.properties)))

    def _on_lean_publish(self, topic_bytes: bytes, payload: bytes, qos: int, retain: bool) -> None:
        """`LeanClient`'s short path: a PUBLISH without properties, as `_on_message` would see it."""
        try:
            topic = topic_bytes.decode("utf-8")
        except UnicodeDecodeError:
            return
        if topic.startswith("$"):
            if topic.startswith(LOG_TOPIC_PREFIX):
                self._deliver(LogLine(topic, payload))
            return
        self._deliver(Publication(topic, payload, qos, retain, None))

    def _on_publish_completed(self, mid: int) -> None:
        if mid in self._unfinished:
            self._unfinished.discard(mid)
            self._completed = True
            handed = self._handed_at.pop(mid, None)
            if handed is not None:
                self.injection_latency.observe(time.monotonic() - handed)
