"""The recording client: a paho-mqtt MQTT v5 client that writes down everything its broker tells it.

Theory of operation: the suite's verdict is made from what clients see, so
the client records it all, with no interpretation: every message (topic,
payload size and digest, QoS, retain flag, MQTT 5 properties, the time it
came), and every answer to what it did (CONNACK's session present, the
SUBACK and UNSUBACK reason codes, the acknowledgement of each QoS 1/2
publication, a disconnection it did not ask for). Each action waits for its
answer with a deadline, as a careful application does, so the order of a
scenario's actions is the order the broker sees.

Every connection is a new paho client (`reconnect_on_failure=False`, paho's
network thread): a connection that ends stays ended, so a killed client is
not quietly connected again, and a reconnection is the scenario's own
`Connect`. The records outlive the connections.

Two kinds of message are the suite's, not the scenario's, and never enter
the record: probes (the payload starts with `PROBE_MARK`; the runner
publishes them until a new subscription reaches its subscriber from every
site) and fences (on `FENCE_TOPIC`, to which every connection subscribes at
QoS 2: on one broker a fence published after a scenario's publications
arrives after all of them, so its arrival says they are over).
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from federation.daemon.lean_client import stop_network_thread
from federation.harness.processes import LaunchError, poll
from suites.transparency.scenario import Properties, Will

PROBE_MARK = b"\x00tp-probe "
"""how a probe's payload begins (`<mark><subscriber> <site> <n>`)"""
FENCE_TOPIC = "$tp/fence"
"""a `$` topic: no wrapper federates it and `topic #` bridges do not carry it, so a fence stays on its broker"""
PREVIEW_BYTES = 24
STOP_TIMEOUT = 5.0


class ClientError(LaunchError):
    """A client could not do what the scenario asked (no CONNACK, a refused connection, no SUBACK ...)."""


@dataclass(frozen=True)
class Message:
    """One message as its subscriber got it."""

    client: str
    topic: str
    size: int
    digest: str
    """the payload's SHA-256, first 16 hex digits"""
    preview: str
    """the payload's start when it is printable text"""
    qos: int
    retain: bool
    properties: dict[str, Any]
    at: float
    """seconds since the scenario started"""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(document: dict[str, Any]) -> Message:
        return Message(**document)


@dataclass(frozen=True)
class Control:
    """An answer to one of the client's own actions, or a disconnection it did not ask for.
    `kind`: connack, suback, unsuback, ack, disconnected; `detail`: what the broker said."""

    client: str
    kind: str
    detail: str
    at: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(document: dict[str, Any]) -> Control:
        return Control(**document)


def digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()[:16]


def preview(payload: bytes) -> str:
    head = payload[:PREVIEW_BYTES]
    try:
        text = head.decode()
    except UnicodeDecodeError:
        return ""
    return text if text.isprintable() else ""


def received_properties(properties: PahoProperties | None) -> dict[str, Any]:
    """The MQTT 5 properties of a received PUBLISH, as plain JSON values (names as in `scenario.Properties`)."""
    found: dict[str, Any] = {}
    if properties is None:
        return found
    for name, key in (("UserProperty", "user"), ("ContentType", "content_type"), ("ResponseTopic", "response_topic"),
                      ("CorrelationData", "correlation_data"), ("PayloadFormatIndicator", "payload_format"),
                      ("MessageExpiryInterval", "message_expiry"), ("SubscriptionIdentifier", "subscription_ids"),
                      ("TopicAlias", "topic_alias")):
        value = getattr(properties, name, None)
        if value is None:
            continue
        if isinstance(value, bytes):
            value = value.hex()
        elif isinstance(value, (list, tuple)):
            value = [list(item) if isinstance(item, tuple) else item for item in value]
        found[key] = value
    return found


def publish_properties(properties: Properties, packet: int = PacketTypes.PUBLISH) -> PahoProperties | None:
    """A scenario's properties as paho's (None when there are none)."""
    if properties.empty:
        return None
    built = PahoProperties(packet)  # type: ignore[no-untyped-call]
    if properties.user:
        built.UserProperty = list(properties.user)
    if properties.content_type is not None:
        built.ContentType = properties.content_type
    if properties.response_topic is not None:
        built.ResponseTopic = properties.response_topic
    if properties.correlation_data is not None:
        built.CorrelationData = properties.correlation_data
    if properties.payload_format is not None:
        built.PayloadFormatIndicator = properties.payload_format
    if properties.message_expiry is not None:
        built.MessageExpiryInterval = properties.message_expiry
    if properties.topic_alias is not None and packet == PacketTypes.PUBLISH:
        built.TopicAlias = properties.topic_alias
    return built


class _Connection:
    """One paho client and the answers awaited on it (mid -> reason codes)."""

    def __init__(self, client: mqtt.Client) -> None:
        self.client = client
        self.connected = threading.Event()
        self.ended = threading.Event()
        self.connack: str | None = None
        self.answers: dict[int, list[str]] = {}
        self.closing = False
        """we asked for the end (DISCONNECT, kill, close): not recorded as `disconnected`"""


class RecordingClient:
    """One named client of a scenario; see the module docstring. `clock`: the scenario's start
    (`time.monotonic()`), against which arrival times are taken."""

    def __init__(self, name: str, client_id: str, clock: float) -> None:
        self.name = name
        self.client_id = client_id
        self.clock = clock
        self.messages: list[Message] = []
        self.controls: list[Control] = []
        self.probes: set[tuple[str, str]] = set()
        """(the subscriber a probe was meant for, its site) of the probes that arrived since `forget_probes`: a
        probe meant for a member of a shared group may reach another member"""
        self.fences: set[int] = set()
        self.site: str | None = None
        self._lock = threading.Lock()
        self._connection: _Connection | None = None

    # -------------------------------------------------------------- what it saw

    @property
    def online(self) -> bool:
        connection = self._connection
        return connection is not None and connection.connected.is_set() and not connection.ended.is_set()

    def message_count(self) -> int:
        with self._lock:
            return len(self.messages)

    def has_fence(self, number: int) -> bool:
        with self._lock:
            return number in self.fences

    def probe_sites(self, meant_for: str | None = None) -> set[str]:
        """The sites of the probes meant for `meant_for` (by default this client) that arrived here."""
        name = self.name if meant_for is None else meant_for
        with self._lock:
            return {site for subscriber, site in self.probes if subscriber == name}

    def forget_probes(self, meant_for: str | None = None) -> None:
        name = self.name if meant_for is None else meant_for
        with self._lock:
            self.probes = {(subscriber, site) for subscriber, site in self.probes if subscriber != name}

    def _now(self) -> float:
        return round(time.monotonic() - self.clock, 4)

    def _control(self, kind: str, detail: str) -> None:
        with self._lock:
            self.controls.append(Control(self.name, kind, detail, self._now()))

    # -------------------------------------------------------------- actions

    def connect(self, host: str, port: int, *, site: str, clean_start: bool = True, session_expiry: int = 0,
                will: tuple[Will, str, bytes] | None = None, timeout: float = 10.0) -> None:
        """Connect and wait for CONNACK (recorded); subscribe to the fences. `will`: the will, its expanded
        topic and its payload. ClientError if no CONNACK comes or the broker refuses."""
        self.close()
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=mqtt.MQTTv5,
                             reconnect_on_failure=False)
        connection = _Connection(client)
        client.on_connect = lambda *args: self._on_connect(connection, *args)
        client.on_disconnect = lambda *args: self._on_disconnect(connection, *args)
        client.on_message = self._on_message
        client.on_subscribe = lambda _c, _u, mid, codes, _p: self._answer(connection, mid, codes)
        client.on_unsubscribe = lambda _c, _u, mid, codes, _p: self._answer(connection, mid, codes)
        client.on_publish = lambda _c, _u, mid, code, _p: self._answer(connection, mid, [code])
        if will is not None:
            spec, topic, payload = will
            will_properties = publish_properties(spec.properties, PacketTypes.WILLMESSAGE)
            if spec.delay:
                will_properties = will_properties or PahoProperties(PacketTypes.WILLMESSAGE)  # type: ignore[no-untyped-call]
                will_properties.WillDelayInterval = spec.delay
            client.will_set(topic, payload, spec.qos, spec.retain, will_properties)
        properties = PahoProperties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = session_expiry
        self._connection = connection
        self.site = site
        try:
            client.connect(host, port, keepalive=60, clean_start=clean_start, properties=properties)
        except OSError as error:
            raise ClientError(f"client {self.name} ({self.client_id}): cannot connect to {host}:{port}: {error}") \
                from None
        client.loop_start()
        if not connection.connected.wait(timeout):
            self.close()
            raise ClientError(f"client {self.name}: no CONNACK from {host}:{port} within {timeout:g} s "
                              f"(answer: {connection.connack})")
        result, mid = client.subscribe(FENCE_TOPIC, options=SubscribeOptions(qos=2))
        if result != mqtt.MQTT_ERR_SUCCESS or mid is None:
            raise ClientError(f"client {self.name}: SUBSCRIBE {FENCE_TOPIC} not sent: {mqtt.error_string(result)}")
        self._await(connection, mid, timeout, f"the SUBACK of {FENCE_TOPIC}")

    def subscribe(self, topic_filter: str, *, qos: int, no_local: bool = False, retain_as_published: bool = False,
                  retain_handling: int = 0, identifier: int | None = None, timeout: float = 10.0) -> list[str]:
        connection = self._live("subscribe")
        properties = None
        if identifier is not None:
            properties = PahoProperties(PacketTypes.SUBSCRIBE)  # type: ignore[no-untyped-call]
            properties.SubscriptionIdentifier = identifier
        options = SubscribeOptions(qos=qos, noLocal=no_local, retainAsPublished=retain_as_published,
                                   retainHandling=retain_handling)
        result, mid = connection.client.subscribe(topic_filter, options=options, properties=properties)
        if result != mqtt.MQTT_ERR_SUCCESS or mid is None:
            raise ClientError(f"client {self.name}: SUBSCRIBE {topic_filter[:60]!r} not sent: "
                              f"{mqtt.error_string(result)}")
        codes = self._await(connection, mid, timeout, "a SUBACK")
        self._control("suback", f"{topic_filter} {' '.join(codes)}")
        return codes

    def unsubscribe(self, topic_filter: str, timeout: float = 10.0) -> list[str]:
        connection = self._live("unsubscribe")
        result, mid = connection.client.unsubscribe(topic_filter)
        if result != mqtt.MQTT_ERR_SUCCESS or mid is None:
            raise ClientError(f"client {self.name}: UNSUBSCRIBE not sent: {mqtt.error_string(result)}")
        codes = self._await(connection, mid, timeout, "an UNSUBACK")
        self._control("unsuback", f"{topic_filter} {' '.join(codes)}")
        return codes

    def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool, properties: Properties,
                timeout: float = 10.0) -> str | None:
        """PUBLISH; at QoS 1/2 wait for PUBACK/PUBCOMP and record its reason. The reason (None at QoS 0)."""
        connection = self._live("publish")
        info = connection.client.publish(topic, payload, qos=qos, retain=retain,
                                         properties=publish_properties(properties))
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            raise ClientError(f"client {self.name}: PUBLISH on {topic[:60]!r} not sent: {mqtt.error_string(info.rc)}")
        if qos == 0:
            return None
        reason = self._await(connection, info.mid, timeout, f"the acknowledgement of a QoS {qos} publication")[0]
        self._control("ack", f"q{qos} {topic or '(alias)'} {reason}")
        return reason

    def publish_probe(self, topic: str, payload: bytes) -> None:
        """A probe or a fence: QoS 1 or 2 as given by the topic's use, no waiting, not recorded."""
        connection = self._live("publish")
        qos = 2 if topic == FENCE_TOPIC else 1
        connection.client.publish(topic, payload, qos=qos)

    def disconnect(self, with_will: bool = False, timeout: float = 10.0) -> None:
        connection = self._live("disconnect")
        connection.closing = True
        reason = ReasonCode(PacketTypes.DISCONNECT, "Disconnect with will message" if with_will
                            else "Normal disconnection")
        connection.client.disconnect(reasoncode=reason)
        if not connection.ended.wait(timeout):
            raise ClientError(f"client {self.name}: the connection did not end within {timeout:g} s of DISCONNECT")
        stop_network_thread(connection.client)

    def kill(self, timeout: float = 10.0) -> None:
        """Close the TCP connection without DISCONNECT (both directions shut: the broker reads end of file)."""
        connection = self._live("be killed")
        connection.closing = True
        sock = connection.client.socket()
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if not connection.ended.wait(timeout):
            raise ClientError(f"client {self.name}: paho did not notice its closed socket within {timeout:g} s")
        stop_network_thread(connection.client)

    def close(self) -> None:
        """End the connection, if any, with a clean DISCONNECT (no will). Never raises."""
        connection = self._connection
        if connection is None:
            return
        connection.closing = True
        with contextlib.suppress(Exception):  # whatever state paho is in
            if not connection.ended.is_set():
                connection.client.disconnect()
                connection.ended.wait(STOP_TIMEOUT)
        with contextlib.suppress(Exception):
            stop_network_thread(connection.client)

    # -------------------------------------------------------------- paho's callbacks (its network thread)

    def _live(self, what: str) -> _Connection:
        connection = self._connection
        if connection is None or not self.online:
            raise ClientError(f"client {self.name} cannot {what}: it is not connected")
        return connection

    def _answer(self, connection: _Connection, mid: int, codes: list[ReasonCode]) -> None:
        with self._lock:
            connection.answers[mid] = [str(code) for code in codes]

    def _await(self, connection: _Connection, mid: int, timeout: float, what: str) -> list[str]:
        def answered() -> list[str] | None:
            if connection.ended.is_set():
                raise ClientError(f"client {self.name}: the connection ended while waiting for {what}")
            with self._lock:
                return connection.answers.pop(mid, None)

        try:
            return poll(answered, timeout, what, interval=0.005)
        except ClientError:
            raise
        except LaunchError:
            raise ClientError(f"client {self.name}: no {what} within {timeout:g} s") from None

    def _on_connect(self, connection: _Connection, client: mqtt.Client, userdata: Any, flags: Any,
                    reason_code: ReasonCode, properties: Any) -> None:
        connection.connack = str(reason_code)
        session = int(bool(getattr(flags, "session_present", False)))
        self._control("connack", f"{reason_code} session_present={session}")
        if reason_code.is_failure:
            return
        sock = client.socket()
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection.connected.set()

    def _on_disconnect(self, connection: _Connection, client: mqtt.Client, userdata: Any, flags: Any,
                       reason_code: ReasonCode, properties: Any) -> None:
        if not connection.closing:
            self._control("disconnected", f"by the broker or the network: {reason_code}")
        connection.ended.set()

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        payload = bytes(message.payload)
        if message.topic == FENCE_TOPIC:
            with contextlib.suppress(ValueError), self._lock:
                self.fences.add(int(payload.decode()))
            return
        if payload.startswith(PROBE_MARK):
            words = payload[len(PROBE_MARK):].decode(errors="replace").split(" ")
            if len(words) == 3:
                with self._lock:
                    self.probes.add((words[0], words[1]))
            return
        received = Message(self.name, message.topic, len(payload), digest(payload), preview(payload), message.qos,
                           bool(message.retain), received_properties(message.properties), self._now())
        with self._lock:
            self.messages.append(received)


@dataclass
class ProbeClient:
    """The suite's own client on one site: publishes probes and fences (never part of a recording)."""

    site: str
    client: RecordingClient
    sent: int = field(default=0)

    def probe(self, topic: str, subscriber: str) -> None:
        self.sent += 1
        self.client.publish_probe(topic, PROBE_MARK + f"{subscriber} {self.site} {self.sent}".encode())

    def fence(self, number: int) -> None:
        self.client.publish_probe(FENCE_TOPIC, str(number).encode())
