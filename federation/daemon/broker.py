"""The wrapper's one MQTT v5 connection to its local Mosquitto broker (paho-mqtt 2.x).

Theory of operation: paho runs its own network thread (`loop_start`), which
also reconnects with exponential backoff (0.5 s doubling to 10 s) while the
broker is down. Nothing in that thread touches the node: every callback turns
what happened into a small item (`LogLine`, `Publication`, `Connected`, ...)
and hands it to `deliver`, which the runtime makes thread-safe (see
`LoopHandOff`). Subscriptions are made in `on_connect`, so every reconnect
subscribes again:

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

Remote publications are injected with `publish` on this same connection:
no_local then keeps the broker from echoing them back, which is what stops a
federated publication from being federated again. MQTT v5 properties travel
as a plain dict (keys as in docs/protocol.md, `tm.properties`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.exception import MQTTException
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from federation.broker_log import LOG_TOPIC_FILTER, LOG_TOPIC_PREFIX
from federation.types import Address, Injection

log = logging.getLogger("federation.daemon.broker")

PUBLICATION_FILTER = "#"
RECONNECT_MIN_DELAY = 0.5
"""seconds before the first reconnection attempt; doubles per failed attempt"""
RECONNECT_MAX_DELAY = 10.0
"""seconds: the cap of the reconnection backoff"""
MAX_INFLIGHT = 1000
"""QoS 1/2 messages in flight to the broker at once (paho's default is 20)"""
KEEPALIVE = 30
"""seconds"""
SESSION_EXPIRY = 60
"""seconds the broker keeps the wrapper's session (and queues its QoS 1/2 messages) after a disconnection"""

# tm.properties key -> paho Properties attribute, for single-valued properties.
_SCALAR_PROPERTIES = (
    ("content_type", "ContentType", str),
    ("response_topic", "ResponseTopic", str),
    ("correlation_data", "CorrelationData", bytes),
    ("payload_format_indicator", "PayloadFormatIndicator", int),
    ("message_expiry_interval", "MessageExpiryInterval", int),
)
_INTEGER_RANGES: dict[str, tuple[int, int]] = {
    "payload_format_indicator": (0, 1),
    "message_expiry_interval": (0, 2**32 - 1),
}


# ------------------------------------------------------------------ what the paho thread hands over


@dataclass(frozen=True, slots=True)
class LogLine:
    """A message on `$SYS/broker/log/...`."""

    topic: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class Publication:
    """A publication made by a local client (never one the wrapper injected: no_local)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class Connected:
    """CONNACK success; the subscriptions are being made."""


@dataclass(frozen=True, slots=True)
class ConnectRefused:
    """CONNACK failure (e.g. not authorised); paho keeps retrying."""

    reason: str


@dataclass(frozen=True, slots=True)
class ConnectFailed:
    """The TCP connection could not be made (broker down or unreachable); paho retries with backoff."""


@dataclass(frozen=True, slots=True)
class Disconnected:
    reason: str
    expected: bool
    """True when the wrapper asked for it (shutdown)"""


@dataclass(frozen=True, slots=True)
class Subscribed:
    """SUBACK for the two subscriptions: the reason codes, in order (log, publications)."""

    refused: tuple[str, ...]
    """filters the broker refused, with its reason ("$SYS/broker/log/#: Not authorized")"""


BrokerItem = LogLine | Publication | Connected | ConnectRefused | ConnectFailed | Disconnected | Subscribed


class LoopHandOff:
    """Thread-safe hand-over of items to the asyncio loop, in order, in batches.

    `put` may be called from any thread. The consumer runs on the loop with
    every item queued since its last run: one loop wake-up per burst instead
    of one per message.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, consumer: Callable[[list[BrokerItem]], None]) -> None:
        self._loop = loop
        self._consumer = consumer
        self._items: collections.deque[BrokerItem] = collections.deque()
        self._scheduled = False
        self._lock = threading.Lock()

    def put(self, item: BrokerItem) -> None:
        self._items.append(item)
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: the daemon is exiting
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            self._scheduled = False
        batch: list[BrokerItem] = []
        items = self._items
        while items:
            batch.append(items.popleft())
        if batch:
            self._consumer(batch)


# ------------------------------------------------------------------ properties


def properties_to_dict(properties: Properties | None) -> dict[str, Any] | None:
    """The v5 properties worth carrying, as a plain dict (None when there are none)."""
    if properties is None:
        return None
    carried: dict[str, Any] = {}
    user = getattr(properties, "UserProperty", None)
    if user:
        carried["user_property"] = [[str(name), str(value)] for name, value in user]
    for key, attribute, _kind in _SCALAR_PROPERTIES:
        value = getattr(properties, attribute, None)
        if value is not None:
            carried[key] = bytes(value) if isinstance(value, (bytes, bytearray)) else value
    return carried or None


def dict_to_properties(carried: dict[str, Any] | None) -> tuple[Properties | None, list[str]]:
    """paho Properties for a publication, and the keys that were skipped as invalid."""
    if not carried:
        return None, []
    properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    skipped: list[str] = []
    for key, value in carried.items():
        try:
            if key == "user_property":
                pairs = [(str(pair[0]), str(pair[1])) for pair in value]
                if pairs:
                    properties.UserProperty = pairs
                continue
            spec = next((s for s in _SCALAR_PROPERTIES if s[0] == key), None)
            if spec is None or not isinstance(value, spec[2]) or isinstance(value, bool):
                skipped.append(key)
                continue
            bounds = _INTEGER_RANGES.get(key)
            if bounds is not None and isinstance(value, int) and not bounds[0] <= value <= bounds[1]:
                skipped.append(key)
                continue
            setattr(properties, spec[1], value)
        except (TypeError, ValueError, IndexError, MQTTException):
            skipped.append(key)
    return properties, skipped


# ------------------------------------------------------------------ the adapter


class BrokerAdapter:
    """One paho client: connect, subscribe, hand items over, inject publications.

    `deliver` is called from paho's network thread: it must only queue.
    `publish` and `stop` may be called from the asyncio thread (paho's
    publish is thread-safe).
    """

    def __init__(self, broker: Address, client_id: str, deliver: Callable[[BrokerItem], None],
                 max_qos: int = 2) -> None:
        self.broker = broker
        self.client_id = client_id
        self.max_qos = max_qos
        self._deliver = deliver
        self._stopping = False
        self.connected = False
        self.injected = 0
        self.inject_failed = 0
        self.properties_skipped = 0
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        client.max_inflight_messages_set(MAX_INFLIGHT)
        client.max_queued_messages_set(0)  # unlimited
        # paho's signature says int, but it sleeps on floats; the first retry comes after 0.5 s.
        client.reconnect_delay_set(RECONNECT_MIN_DELAY, RECONNECT_MAX_DELAY)  # type: ignore[arg-type]
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        self.client = client

    # The asyncio side.

    def start(self) -> None:
        """Start connecting in paho's thread; never blocks and never fails on a broker that is down."""
        connect_properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        connect_properties.SessionExpiryInterval = SESSION_EXPIRY
        self.client.connect_async(self.broker.host, self.broker.port, keepalive=KEEPALIVE, clean_start=False,
                                  properties=connect_properties)
        self.client.loop_start()

    def publish(self, injection: Injection) -> bool:
        """Publish a remote publication into the broker; False if paho refused it (not connected, QoS 0)."""
        properties, skipped = dict_to_properties(injection.properties)
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
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS and not (qos > 0 and info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN):
            # QoS 1/2 messages refused for "no connection" are queued by paho and sent after reconnecting.
            self.inject_failed += 1
            return False
        self.injected += 1
        return True

    def stop(self) -> None:
        """Disconnect cleanly and stop paho's thread (waits at most about a second)."""
        self._stopping = True
        try:
            self.client.disconnect()
        finally:
            self.client.loop_stop()

    # paho's thread.

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: ReasonCode,
                    properties: Properties | None) -> None:
        if reason_code.is_failure:
            self._deliver(ConnectRefused(str(reason_code)))
            return
        sock = client.socket()
        if isinstance(sock, socket.socket):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as error:
                log.debug("cannot set TCP_NODELAY: %s", error)
        self.connected = True
        self._deliver(Connected())
        client.subscribe([
            (LOG_TOPIC_FILTER, SubscribeOptions(qos=2)),
            (PUBLICATION_FILTER, SubscribeOptions(qos=2, noLocal=True, retainAsPublished=True, retainHandling=2)),
        ])

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        self._deliver(ConnectFailed())

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: ReasonCode,
                       properties: Properties | None) -> None:
        self.connected = False
        self._deliver(Disconnected(str(reason_code), self._stopping))

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
