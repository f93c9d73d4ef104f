"""One MQTT client session, sans-I/O: bytes in, events out; no socket, no clock, no thread inside.

Theory of operation (h11's shape, aioquic's timers): the caller owns the
transport. It calls `connect(now)` when its TCP (or TLS) connection is up,
writes what `data_to_send(now)` returns, feeds what it reads to
`receive_data(data, now)` and acts on the events that come back
(federation/mqtt/events.py), calls `handle_timer(now)` when `get_timer()`
says, and `connection_lost()` when the transport closes; then `connect`
again on a new one. Time is always an argument, so a test drives the
session with a virtual clock.

    IDLE --connect--> CONNECTING --CONNACK ok--> CONNECTED --disconnect--> CLOSING
                           |  refused: CLOSING          |  broker's DISCONNECT: CLOSING
                           +--- malformed, out of place, or no PINGRESP: ERROR
    any state --connection_lost--> IDLE (the session's state is kept for the next connection)

What lives where: the codec (codec.py, properties.py) turns packets into
bytes and back; `Flights` (outgoing.py) holds our QoS 1/2 publications in
flight, packet ids and the broker's Receive Maximum; `Acknowledgements`
(incoming.py) what we owe for the broker's; runs.py reads and builds runs
of plain publications. This module decides every transition.

Protocol level: `SessionSettings.protocols` in order of preference, MQTT 5
first. A broker that does not speak one answers a CONNACK "unsupported
protocol version" (MQTT 5 0x84, or a 3.1.1 broker's two-byte CONNACK with
return code 1); the event says so and the next `connect` offers the next
level.

The data path, batch-shaped: in `receive_data`, plain publications are
read a run at a time (`MessageRun`) and PUBACKs likewise (`Completed`);
`publish_run` builds one buffer for many publications. Flow control is the
caller's to respect, as h11 makes it: `send_quota` says how many QoS 1/2
publications the broker takes now, `publish_run` takes at most that many
and `publish` refuses past it (`LocalProtocolError`), so nothing queues
without bound inside. Our own Receive Maximum is announced in the CONNECT;
a broker that sends past it is counted (`counts.receive_maximum_exceeded`)
but not disconnected, since Mosquitto 2.0.11 does so under load (incoming.py).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from federation.mqtt.codec import (
    MQTT_5,
    MQTT_311,
    PROTOCOLS,
    PUBACK,
    PUBREC,
    PUBREL,
    SUBSCRIBE,
    UNSUBSCRIBE,
    Ack,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingResp,
    Publish,
    SubAck,
    Subscribe,
    SubscriptionOptions,
    UnsubAck,
    Unsubscribe,
    Will,
    decode_packet,
    encode,
    encode_ack,
    encode_publish,
)
from federation.mqtt.errors import PROTOCOL_ERROR, LocalProtocolError, RemoteProtocolError
from federation.mqtt.events import (
    BrokerDisconnected,
    Completed,
    Connected,
    ConnectRefused,
    Event,
    Message,
    MessageRun,
    OutgoingMessage,
    PingAnswered,
    ProtocolFailure,
    Received,
    Subscribed,
    Unsubscribed,
)
from federation.mqtt.incoming import Acknowledgements
from federation.mqtt.outgoing import UNLIMITED, Flights
from federation.mqtt.properties import Properties
from federation.mqtt.runs import append_publishes, parse_plain_run, parse_puback_run

UNSUPPORTED_PROTOCOL_VERSION = 0x84
KEEPALIVE_TIMEOUT = 0x8D
REFUSED = 0x80
"""reason codes from this one up are failures (MQTT 5 section 2.4)"""
RUN_LIMIT = 1 << 16
"""packets read into one run at most (a run's lists stay a bounded size)"""


class State(enum.Enum):
    IDLE = "idle"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    CLOSING = "closing"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """How the session connects; checked when built (ValueError says what is wrong)."""

    client_id: str
    protocols: tuple[int, ...] = (MQTT_5, MQTT_311)
    """protocol levels to offer, in order (module docstring)"""
    keepalive: int = 60
    """seconds; 0: none"""
    clean_start: bool = True
    session_expiry: int = 0
    """seconds the broker keeps the session after the connection (MQTT 5; 3.1.1 keeps one while clean_start is 0)"""
    receive_maximum: int = UNLIMITED
    """QoS 1/2 publications the broker may send us unacknowledged (MQTT 5)"""
    manual_ack: bool = False
    """acknowledge the broker's QoS 1/2 publications only when told (`MqttSession.acknowledge`), not on arrival"""
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    connect_properties: Properties | None = None
    """more CONNECT properties (MQTT 5), e.g. user properties"""

    def __post_init__(self) -> None:
        if len(self.client_id.encode("utf-8")) > 0xFFFF:
            raise ValueError("client id longer than 65,535 bytes")
        if not self.protocols or any(level not in PROTOCOLS for level in self.protocols):
            raise ValueError(f"protocols {self.protocols}: offer 5 (MQTT 5) and/or 4 (MQTT 3.1.1)")
        if not 0 <= self.keepalive <= 0xFFFF:
            raise ValueError(f"keepalive {self.keepalive}: 0 to 65,535 seconds")
        if not 0 <= self.session_expiry <= 0xFFFFFFFF:
            raise ValueError(f"session expiry {self.session_expiry}: 0 to 4,294,967,295 seconds")
        if not 1 <= self.receive_maximum <= UNLIMITED:
            raise ValueError(f"receive maximum {self.receive_maximum}: 1 to 65,535")
        if self.password is not None and self.username is None:
            raise ValueError("a password needs a user name (MQTT 3.1.1, and paho)")


@dataclass(slots=True)
class SessionCounts:
    """What the session saw that a caller may want to count or show (plain numbers, never reset)."""

    packets_read: int = 0
    duplicates_answered: int = 0
    """QoS 2 publications the broker sent again (DUP) under an id we had answered: PUBREC again, not handed over"""
    unknown_acks: int = 0
    """PUBACK, PUBREC, PUBCOMP, SUBACK or UNSUBACK for no packet id of ours (ignored, as paho does)"""
    receive_maximum_exceeded: int = 0
    """publications that came while our Receive Maximum of them was unacknowledged"""
    resent: int = 0
    abandoned: int = 0
    refused: int = 0
    """our QoS 1/2 publications the broker completed with a reason code of 0x80 or more"""


class MqttSession:
    """The client side of one MQTT session over any number of connections (module docstring)."""

    def __init__(self, settings: SessionSettings) -> None:
        self.settings = settings
        self.state = State.IDLE
        self._protocol_index = 0
        self.protocol = settings.protocols[0]
        """the protocol level of the current (or next) connection"""
        self.flights = Flights()
        self.acks = Acknowledgements()
        self.counts = SessionCounts()
        self.keepalive = settings.keepalive
        """the keepalive in force (the broker may set it: Server Keep Alive)"""
        self.maximum_packet_size = 0
        self.maximum_qos = 2
        self.retain_available = True
        self.pings_sent = 0
        self.pings_answered = 0
        self._out = bytearray()
        self._in = b""
        self._in_pos = 0
        self._last_sent = 0.0
        self._last_received = 0.0
        self._waiting_since: float | None = None
        """when the oldest unanswered PINGREQ (or the CONNECT) was written"""

    # ------------------------------------------------------------------ the connection

    def connect(self, now: float) -> None:
        """A new transport is up: queue the CONNECT."""
        if self.state is not State.IDLE:
            raise LocalProtocolError(f"connect in state {self.state.value}: call connection_lost first")
        settings = self.settings
        properties: Properties | None = None
        if self.protocol == MQTT_5:
            properties = dict(settings.connect_properties or {})
            if settings.session_expiry:
                properties["session_expiry_interval"] = settings.session_expiry
            if settings.receive_maximum != UNLIMITED:
                properties["receive_maximum"] = settings.receive_maximum
        self._out += encode(Connect(settings.client_id, self.protocol, settings.clean_start, settings.keepalive,
                                    properties or None, settings.username, settings.password, settings.will),
                            self.protocol)
        self.state = State.CONNECTING
        self.keepalive = settings.keepalive
        self._last_sent = self._last_received = now
        self._waiting_since = now
        self.pings_answered = self.pings_sent

    def connection_lost(self) -> None:
        """The transport closed (whatever the state): unwritten bytes are dropped, the session is kept."""
        self.state = State.IDLE
        self._out = bytearray()
        self._in = b""
        self._in_pos = 0
        self._waiting_since = None
        self.flights.connection_lost()
        self.acks.connection_lost()

    def disconnect(self, reason_code: int = 0) -> None:
        """Queue a DISCONNECT; the caller closes the transport once it is written."""
        if self.state not in (State.CONNECTING, State.CONNECTED):
            raise LocalProtocolError(f"disconnect in state {self.state.value}")
        self._out += encode(Disconnect(reason_code), self.protocol)
        self.state = State.CLOSING

    def data_to_send(self, now: float) -> bytearray:
        """The bytes to write, in order; taken, they count as sent at `now` (keepalive)."""
        out = self._out
        if not out:
            return out
        self._out = bytearray()
        self._last_sent = now
        return out

    def get_timer(self) -> float | None:
        """When `handle_timer` is due next (None: nothing to time)."""
        if self.state not in (State.CONNECTING, State.CONNECTED) or not self.keepalive:
            return None
        if self._waiting_since is not None:
            return self._waiting_since + self.keepalive
        return min(self._last_sent, self._last_received) + self.keepalive

    def handle_timer(self, now: float) -> list[Event]:
        """A PINGREQ when nothing was sent or read for a keepalive (paho's rule); failure when the CONNACK or a
        PINGRESP is a keepalive late."""
        deadline = self.get_timer()
        if deadline is None or now < deadline:
            return []
        if self._waiting_since is not None:
            self.state = State.ERROR
            waited = "CONNACK" if self.pings_answered == self.pings_sent else "PINGRESP"
            return [ProtocolFailure(KEEPALIVE_TIMEOUT, f"no {waited} within the keepalive ({self.keepalive} s): "
                                                       "the broker or the path to it is stuck; close the connection")]
        self._ping(now)
        return []

    def ping(self, now: float) -> int:
        """A PINGREQ now, behind everything queued before it: the number its PINGRESP brings `pings_answered` to
        (the broker has then processed what was written before it)."""
        self._require_connected("ping")
        return self._ping(now)

    def _ping(self, now: float) -> int:
        self._out += b"\xc0\x00"
        self.pings_sent += 1
        if self._waiting_since is None:
            self._waiting_since = now
        return self.pings_sent

    # ------------------------------------------------------------------ what the caller sends

    @property
    def send_quota(self) -> int:
        """QoS 1/2 publications the broker takes now (0 when not connected)."""
        return self.flights.quota() if self.state is State.CONNECTED else 0

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                properties: Properties | None = None) -> int:
        """Queue one publication; its packet id (0 at QoS 0). LocalProtocolError when not connected, past the
        broker's quota, or not allowed (topic, QoS, retain, size, properties)."""
        self._require_connected("publish")
        self._check_publication(qos, retain)
        if properties and self.protocol != MQTT_5:
            raise LocalProtocolError("properties need MQTT 5; this connection is MQTT 3.1.1")
        if qos and self.flights.quota() < 1:
            raise LocalProtocolError(f"the broker's Receive Maximum ({self.flights.receive_maximum}) of QoS 1/2 "
                                     f"publications is in flight: wait for completions (send_quota)")
        packet_id = self.flights.allocate(1)[0] if qos else 0
        try:
            data = encode_publish(Publish(topic, bytes(payload), qos, retain, False, packet_id, properties),
                                  self.protocol)
        except ValueError as error:
            raise LocalProtocolError(str(error)) from None
        if self.maximum_packet_size and len(data) > self.maximum_packet_size:
            raise LocalProtocolError(f"a PUBLISH of {len(data)} bytes: the broker takes at most "
                                     f"{self.maximum_packet_size}")
        if qos:
            self.flights.take((packet_id,), (topic,), (payload,), qos, retain, properties)
        self._out += data
        return packet_id

    def publish_run(self, topics: Sequence[str], payloads: Sequence[bytes], qos: int = 0, retain: bool = False
                    ) -> tuple[int, list[int]]:
        """Queue the leading publications of a run (one QoS, one retain flag, no properties) as one buffer:
        (how many were taken, their packet ids at QoS 1/2). It stops at the broker's quota or at a publication
        `publish` would refuse (its topic or size): `publish` of that one says why."""
        self._require_connected("publish")
        self._check_publication(qos, retain)
        count = min(len(topics), len(payloads))
        if qos:
            count = min(count, self.flights.quota())
        if self.maximum_packet_size:
            count = self._within_packet_size(topics, payloads, count)
        if count <= 0:
            return 0, []
        if count < len(topics):
            topics, payloads = topics[:count], payloads[:count]
        flights = self.flights
        last_id = flights.last_id
        ids = flights.allocate(count) if qos else []
        taken = append_publishes(self._out, topics, payloads, qos, retain, ids, self.protocol)
        if qos:
            if taken < count:  # the ids after the last one taken go back: paho's sequence stays unbroken
                ids = ids[:taken]
                flights.last_id = ids[-1] if ids else last_id
            flights.take(ids, topics, payloads, qos, retain)
        return taken, ids

    def _within_packet_size(self, topics: Sequence[str], payloads: Sequence[bytes], count: int) -> int:
        limit = self.maximum_packet_size - 10  # fixed header (5), packet id (2), property length (1), with room
        for index in range(count):
            if len(topics[index]) * 4 + 2 + len(payloads[index]) > limit:
                return index
        return count

    def _check_publication(self, qos: int, retain: bool) -> None:
        if qos not in (0, 1, 2):
            raise LocalProtocolError(f"QoS {qos}: MQTT has 0, 1 and 2")
        if qos > self.maximum_qos:
            raise LocalProtocolError(f"QoS {qos}: the broker takes at most QoS {self.maximum_qos} (its CONNACK)")
        if retain and not self.retain_available:
            raise LocalProtocolError("a retained publication: the broker has no retained messages (its CONNACK)")

    def acknowledge(self, acks: Sequence[tuple[int, int]]) -> int:
        """With `manual_ack`: acknowledge the broker's publications the caller has taken, (packet id, qos) each, in
        one buffer (incoming.py); how many were written or held. Not connected: none (the broker sends them
        again, DUP, on the next connection)."""
        if self.state is not State.CONNECTED or not acks:
            return 0
        return self.acks.acknowledge(acks, self._out)

    def subscribe(self, filters: Sequence[tuple[str, SubscriptionOptions]],
                  properties: Properties | None = None) -> int:
        """Queue a SUBSCRIBE; its packet id (the SUBACK's `Subscribed` names it)."""
        self._require_connected("subscribe")
        packet_id = self.flights.allocate(1)[0]
        try:
            data = encode(Subscribe(packet_id, list(filters), properties), self.protocol)
        except ValueError as error:
            raise LocalProtocolError(str(error)) from None
        self.flights.requests[packet_id] = SUBSCRIBE
        self._out += data
        return packet_id

    def unsubscribe(self, filters: Sequence[str], properties: Properties | None = None) -> int:
        """Queue an UNSUBSCRIBE; its packet id (the UNSUBACK's `Unsubscribed` names it)."""
        self._require_connected("unsubscribe")
        packet_id = self.flights.allocate(1)[0]
        try:
            data = encode(Unsubscribe(packet_id, list(filters), properties), self.protocol)
        except ValueError as error:
            raise LocalProtocolError(str(error)) from None
        self.flights.requests[packet_id] = UNSUBSCRIBE
        self._out += data
        return packet_id

    def restore(self, messages: Sequence[OutgoingMessage]) -> None:
        """Before connecting: QoS 1/2 publications a previous run had in flight (its journal), under their packet
        ids. The next CONNACK sends them again (session present) or hands them back (`Connected.abandoned`)."""
        if self.state is not State.IDLE:
            raise LocalProtocolError("restore before connecting")
        self.flights.restore(messages)

    def in_flight(self) -> tuple[OutgoingMessage, ...]:
        """Our QoS 1/2 publications the broker has not completed, in order."""
        return self.flights.view()

    def _require_connected(self, what: str) -> None:
        if self.state is not State.CONNECTED:
            raise LocalProtocolError(f"{what} in state {self.state.value}: wait for Connected")

    # ------------------------------------------------------------------ what the broker sends

    def receive_data(self, data: bytes | bytearray, now: float) -> list[Event]:
        """Bytes read from the transport: the events they complete, in order. A broken stream ends in a
        `ProtocolFailure` (state ERROR); bytes read after our DISCONNECT or a refusal are dropped."""
        if self.state in (State.IDLE, State.ERROR):
            raise LocalProtocolError(f"receive_data in state {self.state.value}: "
                                     + ("connect first" if self.state is State.IDLE else "close the connection"))
        if not data:
            return []
        self._last_received = now
        if self.state is State.CLOSING:
            return []
        if self._in_pos < len(self._in):  # part of a packet waited: it and what follows, in one buffer
            self._in = self._in[self._in_pos:] + data
        else:
            self._in = data if type(data) is bytes else bytes(data)  # payloads are sliced from it: bytes, not views
        self._in_pos = 0
        events: list[Event] = []
        try:
            self._read(events)
        except RemoteProtocolError as error:
            self._fail(events, error.reason_code, str(error))
        return events

    def _fail(self, events: list[Event], reason_code: int, description: str) -> None:
        if self.protocol == MQTT_5 and self.state in (State.CONNECTING, State.CONNECTED):
            self._out += encode(Disconnect(reason_code), MQTT_5)
        self.state = State.ERROR
        self._in = b""
        self._in_pos = 0
        events.append(ProtocolFailure(reason_code, description))

    def _read(self, events: list[Event]) -> None:
        data = self._in
        pos = self._in_pos
        end = len(data)
        v5 = self.protocol == MQTT_5
        counts = self.counts
        try:
            while pos < end and (self.state is State.CONNECTED or self.state is State.CONNECTING):
                first = data[pos]
                if self.state is State.CONNECTED:
                    if v5 and (first == 0x30 or first == 0x32):
                        stop, qos, topics, payloads, ids = parse_plain_run(data, pos, RUN_LIMIT)
                        if topics and not (qos and 0 in ids):  # packet id 0: the general path refuses it
                            counts.packets_read += len(topics)
                            self._take_run(events, topics, payloads, qos, ids)
                            pos = stop
                            continue
                    elif first == 0x40:
                        stop, ids, codes = parse_puback_run(data, pos, RUN_LIMIT, self.protocol)
                        if ids:
                            counts.packets_read += len(ids)
                            self._completions(events, ids, codes, 1)
                            pos = stop
                            continue
                decoded = decode_packet(data, pos, self.protocol)
                if decoded is None:
                    break
                packet, pos = decoded
                counts.packets_read += 1
                self._handle(packet, events)
        finally:
            self._in_pos = pos

    def _take_run(self, events: list[Event], topics: list[str], payloads: list[bytes], qos: int,
                  ids: list[int]) -> None:
        if qos:
            self._count_incoming(len(ids))
            if self.settings.manual_ack:
                self.acks.delivered_run(ids)
            else:
                for packet_id in ids:
                    self._out += bytes((0x40, 2, packet_id >> 8, packet_id & 0xFF))
        last = events[-1] if events else None
        if type(last) is MessageRun and last.qos == qos:
            last.topics.extend(topics)
            last.payloads.extend(payloads)
            last.packet_ids.extend(ids)
        else:
            events.append(MessageRun(topics, payloads, qos, ids))

    def _count_incoming(self, count: int) -> None:
        over = self.acks.unacknowledged + count - self.settings.receive_maximum
        if over > 0:
            self.counts.receive_maximum_exceeded += min(over, count)

    def _handle(self, packet: Packet, events: list[Event]) -> None:
        if self.state is State.CONNECTING:
            if not isinstance(packet, ConnAck):
                raise RemoteProtocolError(f"{type(packet).__name__} before the CONNACK", PROTOCOL_ERROR)
            self._connack(packet, events)
            return
        if isinstance(packet, Publish):
            self._publish(packet, events)
        elif isinstance(packet, Ack):
            self._ack(packet, events)
        elif isinstance(packet, PingResp):
            if self.pings_answered < self.pings_sent:
                self.pings_answered += 1
                if self.pings_answered == self.pings_sent:
                    self._waiting_since = None
                events.append(PingAnswered(self.pings_answered))
        elif isinstance(packet, (SubAck, UnsubAck)):
            kind = SUBSCRIBE if isinstance(packet, SubAck) else UNSUBSCRIBE
            if self.flights.requests.get(packet.packet_id) != kind:
                self.counts.unknown_acks += 1
                return
            del self.flights.requests[packet.packet_id]
            codes = tuple(packet.reason_codes)
            events.append(Subscribed(packet.packet_id, codes) if kind == SUBSCRIBE
                          else Unsubscribed(packet.packet_id, codes))
        elif isinstance(packet, Disconnect):
            self.state = State.CLOSING
            reason = packet.properties.get("reason_string") if packet.properties else None
            events.append(BrokerDisconnected(packet.reason_code, reason if isinstance(reason, str) else None))
        elif isinstance(packet, Auth):
            raise RemoteProtocolError("AUTH: this session asked for no enhanced authentication", PROTOCOL_ERROR)
        else:
            raise RemoteProtocolError(f"a broker does not send {type(packet).__name__}", PROTOCOL_ERROR)

    def _connack(self, connack: ConnAck, events: list[Event]) -> None:
        code = connack.reason_code
        if code:
            # A 3.1.1 broker answers an MQTT 5 CONNECT with its own two-byte CONNACK, return code 1.
            unsupported = code in (1, UNSUPPORTED_PROTOCOL_VERSION)
            protocol = self.protocol
            if unsupported and self._protocol_index + 1 < len(self.settings.protocols):
                self._protocol_index += 1
                self.protocol = self.settings.protocols[self._protocol_index]
            reason = connack.properties.get("reason_string") if connack.properties else None
            self.state = State.CLOSING
            events.append(ConnectRefused(code, protocol, unsupported, reason if isinstance(reason, str) else None))
            return
        if connack.session_present and self.settings.clean_start:
            raise RemoteProtocolError("session present after a clean start", PROTOCOL_ERROR)
        properties = connack.properties or {}
        flights = self.flights
        receive_maximum = properties.get("receive_maximum", UNLIMITED)
        flights.receive_maximum = receive_maximum if isinstance(receive_maximum, int) and receive_maximum else UNLIMITED
        keepalive = properties.get("server_keep_alive")
        if isinstance(keepalive, int):
            self.keepalive = keepalive
        size = properties.get("maximum_packet_size", 0)
        self.maximum_packet_size = size if isinstance(size, int) else 0
        maximum_qos = properties.get("maximum_qos", 2)
        self.maximum_qos = maximum_qos if isinstance(maximum_qos, int) else 2
        self.retain_available = properties.get("retain_available", 1) != 0
        assigned = properties.get("assigned_client_identifier")
        self._waiting_since = None
        self.state = State.CONNECTED
        resent = 0
        abandoned: tuple[OutgoingMessage, ...] = ()
        if connack.session_present:
            resent = flights.resume(self._out, self.protocol)
            self.counts.resent += resent
        else:
            abandoned = flights.abandon()
            self.counts.abandoned += len(abandoned)
            self.acks.session_lost()
        events.append(Connected(connack.session_present, self.protocol, flights.receive_maximum, self.keepalive,
                                resent, abandoned, self.maximum_packet_size, self.maximum_qos, self.retain_available,
                                assigned if isinstance(assigned, str) else None, connack.properties))

    def _publish(self, publish: Publish, events: list[Event]) -> None:
        qos = publish.qos
        packet_id = publish.packet_id
        topic = publish.topic
        if not topic:
            raise RemoteProtocolError("a PUBLISH without a topic (topic aliases were not offered)", PROTOCOL_ERROR)
        if publish.properties and "topic_alias" in publish.properties:
            raise RemoteProtocolError("a topic alias: this session offered none", PROTOCOL_ERROR)
        acks = self.acks
        if qos == 2 and acks.is_repeat(packet_id, publish.dup):
            acks.repeat(packet_id, self._out)
            self.counts.duplicates_answered += 1
            return
        if qos:
            self._count_incoming(1)
            acks.delivered(packet_id, publish.dup)
        plain = (qos < 2 and not publish.retain and not publish.dup and not publish.properties
                 and topic[0] != "$")
        if plain:
            last = events[-1] if events else None
            if type(last) is MessageRun and last.qos == qos:
                last.topics.append(topic)
                last.payloads.append(publish.payload)
                if qos:
                    last.packet_ids.append(packet_id)
            else:
                events.append(MessageRun([topic], [publish.payload], qos, [packet_id] if qos else []))
        else:
            events.append(Message(topic, publish.payload, qos, publish.retain, publish.dup, packet_id,
                                  publish.properties))
        if qos and not self.settings.manual_ack:
            acks.acknowledge(((packet_id, qos),), self._out)

    def _ack(self, ack: Ack, events: list[Event]) -> None:
        kind = ack.kind
        packet_id = ack.packet_id
        if kind == PUBREL:
            self.acks.released(packet_id, self._out)
            return
        flights = self.flights
        if kind == PUBREC:
            if ack.reason_code >= REFUSED:  # the flow ends here: no PUBREL (MQTT 5 section 4.3.3)
                self._completions(events, [packet_id], [ack.reason_code], 2)
                return
            first = flights.release(packet_id)
            if first is None:
                self.counts.unknown_acks += 1
                # MQTT 5: answer with "packet identifier not found", so the broker's flow ends too
                self._out += encode_ack(PUBREL, packet_id, self.protocol, 0x92 if self.protocol == MQTT_5 else 0)
                return
            if first:
                events.append(Received(packet_id, ack.reason_code))
            self._out += encode_ack(PUBREL, packet_id, self.protocol)
            return
        self._completions(events, [packet_id], [ack.reason_code], 1 if kind == PUBACK else 2)

    def _completions(self, events: list[Event], ids: list[int], codes: list[int], qos: int) -> None:
        """PUBACKs (`qos` 1), PUBCOMPs or refusing PUBRECs (2): those completing one of ours join the last event if
        it is a `Completed`; room they make goes to publications waiting to be sent again."""
        flights = self.flights
        done_ids: list[int] = []
        done_codes: list[int] = []
        for index, packet_id in enumerate(ids):
            if flights.complete(packet_id, qos):
                done_ids.append(packet_id)
                done_codes.append(codes[index])
            else:
                self.counts.unknown_acks += 1
        if not done_ids:
            return
        self.counts.refused += sum(1 for code in done_codes if code >= REFUSED)
        last = events[-1] if events else None
        if type(last) is Completed:
            last.packet_ids.extend(done_ids)
            last.reason_codes.extend(done_codes)
        else:
            events.append(Completed(done_ids, done_codes))
        if flights.unsent:
            flights.send_unsent(self._out, self.protocol)
