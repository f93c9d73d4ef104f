"""MQTT 3.1.1 and 5 packets: encoded to bytes and decoded from them, one packet at a time.

Theory of operation: every packet of both versions is a small dataclass
(`Connect`, `ConnAck`, `Publish`, `Ack` for PUBACK/PUBREC/PUBREL/PUBCOMP,
`Subscribe`, `SubAck`, `Unsubscribe`, `UnsubAck`, `PingReq`, `PingResp`,
`Disconnect`, `Auth`); `encode(packet, protocol)` gives its bytes and
`decode_packet(data, pos, protocol)` reads the one at `pos` (None while it
has not arrived whole). Both directions exist for every packet, so the
session (client side) and the tests' scripted broker share one codec.
`protocol` is the level of the connection: 4 (3.1.1) or 5; the packets of
3.1.1 are those of 5 without properties and reason codes (a 3.1.1 SUBACK's
return codes are its reason codes; a 3.1.1 UNSUBACK has none).

The bytes are paho's for the same packet (properties in identifier order,
an acknowledgement saying success without a reason code, a DISCONNECT
without a reason as two bytes): tests/mqtt/test_codec.py checks it, and
the session is compared with paho packet for packet on a real broker.

Decoding checks what MQTT calls malformed or a protocol error in a packet
taken alone (reserved flag bits, QoS 3, DUP at QoS 0, a packet id of 0, a
wildcard in a topic name, a string that is not UTF-8, bytes left over) and
raises `RemoteProtocolError`; what depends on the session's state (an
unknown packet id, a packet out of place) is the session's to judge.
Publications in runs (the data path) are read and built by
federation/mqtt/runs.py; this module is the general path and the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

from federation.mqtt.errors import PROTOCOL_ERROR, RemoteProtocolError
from federation.mqtt.properties import (
    Properties,
    decode_binary,
    decode_properties,
    decode_string,
    encode_binary,
    encode_properties,
    encode_string,
    encode_variable_integer,
)

MQTT_311 = 4
MQTT_5 = 5
PROTOCOLS = (MQTT_311, MQTT_5)
"""protocol levels the codec speaks"""

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = 8, 9, 10, 11, 12, 13, 14, 15
PACKET_NAMES = {CONNECT: "CONNECT", CONNACK: "CONNACK", PUBLISH: "PUBLISH", PUBACK: "PUBACK", PUBREC: "PUBREC",
                PUBREL: "PUBREL", PUBCOMP: "PUBCOMP", SUBSCRIBE: "SUBSCRIBE", SUBACK: "SUBACK",
                UNSUBSCRIBE: "UNSUBSCRIBE", UNSUBACK: "UNSUBACK", PINGREQ: "PINGREQ", PINGRESP: "PINGRESP",
                DISCONNECT: "DISCONNECT", AUTH: "AUTH"}
MAX_REMAINING_LENGTH = 268435455
"""MQTT's largest remaining length (four length bytes)"""
FLAGGED = (PUBREL, SUBSCRIBE, UNSUBSCRIBE)
"""packet types whose fixed header's flags must be 0b0010 (every other but PUBLISH: 0)"""


# ------------------------------------------------------------------ the packets
# Plain (not frozen) slotted dataclasses: a PUBLISH is decoded per message on the general path, and a frozen
# dataclass's __init__ costs an object.__setattr__ per field. Nothing changes a packet once built.


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties | None = None


@dataclass(slots=True)
class Connect:
    client_id: str
    protocol: int = MQTT_5
    clean_start: bool = True
    keepalive: int = 60
    properties: Properties | None = None
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None


@dataclass(slots=True)
class ConnAck:
    session_present: bool
    reason_code: int = 0
    """MQTT 5's reason code; with 3.1.1 its return code (0 to 5)"""
    properties: Properties | None = None


@dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int = 0
    properties: Properties | None = None


@dataclass(slots=True)
class Ack:
    """PUBACK, PUBREC, PUBREL or PUBCOMP (`kind`)."""

    kind: int
    packet_id: int
    reason_code: int = 0
    properties: Properties | None = None


@dataclass(slots=True)
class SubscriptionOptions:
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0

    def encode(self, protocol: int) -> int:
        if protocol == MQTT_311:
            return self.qos
        return self.qos | self.no_local << 2 | self.retain_as_published << 3 | self.retain_handling << 4


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    filters: list[tuple[str, SubscriptionOptions]]
    properties: Properties | None = None


@dataclass(slots=True)
class SubAck:
    packet_id: int
    reason_codes: list[int]
    properties: Properties | None = None


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    filters: list[str]
    properties: Properties | None = None


@dataclass(slots=True)
class UnsubAck:
    packet_id: int
    reason_codes: list[int]
    """empty with 3.1.1 (its UNSUBACK has none)"""
    properties: Properties | None = None


@dataclass(slots=True)
class PingReq:
    pass


@dataclass(slots=True)
class PingResp:
    pass


@dataclass(slots=True)
class Disconnect:
    reason_code: int = 0
    properties: Properties | None = None


@dataclass(slots=True)
class Auth:
    reason_code: int = 0
    properties: Properties | None = None


Packet = (Connect | ConnAck | Publish | Ack | Subscribe | SubAck | Unsubscribe | UnsubAck | PingReq | PingResp
          | Disconnect | Auth)


# ------------------------------------------------------------------ encoding


def fixed_header(first_byte: int, remaining_length: int) -> bytes:
    if remaining_length > MAX_REMAINING_LENGTH:
        raise ValueError(f"a packet of {remaining_length} bytes: MQTT's limit is {MAX_REMAINING_LENGTH}")
    return bytes((first_byte,)) + encode_variable_integer(remaining_length)


def topic_name_error(topic: str) -> str | None:
    """Why `topic` cannot be published on (None when it can): MQTT section 4.7.3 and paho's checks."""
    data = topic.encode("utf-8", "surrogatepass")
    if not data:
        return "an empty topic"
    if len(data) > 0xFFFF:
        return f"a topic of {len(data)} bytes (MQTT's limit is 65,535)"
    if "+" in topic or "#" in topic:
        return f"a wildcard in topic {topic!r} (a topic name has none)"
    if "\x00" in topic:
        return "U+0000 in a topic"
    try:
        topic.encode("utf-8")
    except UnicodeEncodeError:
        return f"topic {topic!r} is not encodable as UTF-8"
    return None


def encode_publish(publish: Publish, protocol: int) -> bytes:
    """A PUBLISH; ValueError for a topic or packet MQTT does not allow (the caller's mistake)."""
    error = topic_name_error(publish.topic)
    if error is not None:
        raise ValueError(f"cannot publish: {error}")
    if publish.qos not in (0, 1, 2):
        raise ValueError(f"QoS {publish.qos}: MQTT has 0, 1 and 2")
    if publish.qos and not 0 < publish.packet_id <= 0xFFFF:
        raise ValueError(f"packet id {publish.packet_id} at QoS {publish.qos}: it is 1 to 65,535")
    body = bytearray(encode_string(publish.topic))
    if publish.qos:
        body += publish.packet_id.to_bytes(2, "big")
    if protocol == MQTT_5:
        body += encode_properties(publish.properties)
    body += publish.payload
    first = PUBLISH << 4 | (publish.dup and publish.qos > 0) << 3 | publish.qos << 1 | publish.retain
    return fixed_header(first, len(body)) + body


def encode_ack(kind: int, packet_id: int, protocol: int, reason_code: int = 0,
               properties: Properties | None = None) -> bytes:
    """PUBACK, PUBREC, PUBREL or PUBCOMP: two bytes of packet id, and with MQTT 5 a reason code when it is not
    success or properties follow (MQTT 5 section 3.4.2.1), as paho writes them."""
    first = kind << 4 | (0x02 if kind == PUBREL else 0)
    if protocol == MQTT_311 or (not reason_code and not properties):
        return bytes((first, 2, packet_id >> 8, packet_id & 0xFF))
    body = bytes((packet_id >> 8, packet_id & 0xFF, reason_code))
    if properties:
        body += encode_properties(properties)
    return fixed_header(first, len(body)) + body


def encode(packet: Packet, protocol: int) -> bytes:
    """The bytes of any packet at protocol level `protocol` (4 or 5)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol level {protocol}: the codec speaks 4 (MQTT 3.1.1) and 5")
    v5 = protocol == MQTT_5
    if isinstance(packet, Publish):
        return encode_publish(packet, protocol)
    if isinstance(packet, Ack):
        return encode_ack(packet.kind, packet.packet_id, protocol, packet.reason_code, packet.properties)
    if isinstance(packet, PingReq):
        return b"\xc0\x00"
    if isinstance(packet, PingResp):
        return b"\xd0\x00"
    body = bytearray()
    if isinstance(packet, Connect):
        return _encode_connect(packet)
    if isinstance(packet, ConnAck):
        body += bytes((int(packet.session_present), packet.reason_code))
        if v5:
            body += encode_properties(packet.properties)
        return fixed_header(CONNACK << 4, len(body)) + body
    if isinstance(packet, Subscribe):
        if not packet.filters:
            raise ValueError("a SUBSCRIBE names at least one filter")
        body += packet.packet_id.to_bytes(2, "big")
        if v5:
            body += encode_properties(packet.properties)
        for topic_filter, options in packet.filters:
            body += encode_string(topic_filter)
            body.append(options.encode(protocol))
        return fixed_header(SUBSCRIBE << 4 | 2, len(body)) + body
    if isinstance(packet, SubAck):
        body += packet.packet_id.to_bytes(2, "big")
        if v5:
            body += encode_properties(packet.properties)
        body += bytes(packet.reason_codes)
        return fixed_header(SUBACK << 4, len(body)) + body
    if isinstance(packet, Unsubscribe):
        if not packet.filters:
            raise ValueError("an UNSUBSCRIBE names at least one filter")
        body += packet.packet_id.to_bytes(2, "big")
        if v5:
            body += encode_properties(packet.properties)
        for topic_filter in packet.filters:
            body += encode_string(topic_filter)
        return fixed_header(UNSUBSCRIBE << 4 | 2, len(body)) + body
    if isinstance(packet, UnsubAck):
        body += packet.packet_id.to_bytes(2, "big")
        if v5:
            body += encode_properties(packet.properties)
            body += bytes(packet.reason_codes)
        return fixed_header(UNSUBACK << 4, len(body)) + body
    if isinstance(packet, (Disconnect, Auth)):
        kind = DISCONNECT if isinstance(packet, Disconnect) else AUTH
        if v5 and (packet.reason_code or packet.properties):
            body.append(packet.reason_code)
            if packet.properties:
                body += encode_properties(packet.properties)
        return fixed_header(kind << 4, len(body)) + body
    raise TypeError(f"not an MQTT packet: {packet!r}")


def _encode_connect(connect: Connect) -> bytes:
    """A CONNECT as paho's `_send_connect` builds it (a password only with a user name, as 3.1.1 requires)."""
    v5 = connect.protocol == MQTT_5
    flags = 0x02 if connect.clean_start else 0
    will = connect.will
    if will is not None:
        flags |= 0x04 | will.qos << 3 | will.retain << 5
    if connect.username is not None:
        flags |= 0x80
        if connect.password is not None:
            flags |= 0x40
    body = bytearray(b"\x00\x04MQTT")
    body += bytes((connect.protocol, flags))
    body += connect.keepalive.to_bytes(2, "big")
    if v5:
        body += encode_properties(connect.properties)
    body += encode_string(connect.client_id)
    if will is not None:
        if v5:
            body += encode_properties(will.properties)
        body += encode_string(will.topic)
        body += encode_binary(will.payload)
    if connect.username is not None:
        body += encode_string(connect.username)
        if connect.password is not None:
            body += encode_binary(connect.password)
    return fixed_header(CONNECT << 4, len(body)) + body


# ------------------------------------------------------------------ decoding


def packet_bounds(data: bytes | bytearray | memoryview, pos: int) -> tuple[int, int] | None:
    """(where the packet at `pos` starts its variable header, where it ends), or None while its fixed header or
    body has not arrived whole; RemoteProtocolError for a remaining length longer than four bytes."""
    end = len(data)
    start = pos + 1
    length = 0
    shift = 0
    while True:
        if start >= end:
            return None
        byte = data[start]
        start += 1
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift > 21:
            raise RemoteProtocolError("a remaining length longer than four bytes")
    stop = start + length
    return (start, stop) if stop <= end else None


def decode_packet(data: bytes | bytearray | memoryview, pos: int, protocol: int) -> tuple[Packet, int] | None:
    """(the packet at `pos`, the position after it), or None while it has not arrived whole."""
    bounds = packet_bounds(data, pos)
    if bounds is None:
        return None
    start, stop = bounds
    first = data[pos]
    kind = first >> 4
    flags = first & 0x0F
    if kind == PUBLISH:
        return decode_publish(data, first, start, stop, protocol), stop
    if kind == 0:
        raise RemoteProtocolError("packet type 0 (reserved)")
    expected = 0x02 if kind in FLAGGED else 0
    if flags != expected:
        raise RemoteProtocolError(f"{PACKET_NAMES[kind]} with flags 0x{flags:x} (MQTT says 0x{expected:x})")
    return _decode_other(kind, data, start, stop, protocol), stop


def decode_publish(data: bytes | bytearray | memoryview, first: int, start: int, stop: int,
                   protocol: int) -> Publish:
    """The PUBLISH whose first byte is `first` and whose variable header and payload are `data[start:stop]`."""
    qos = (first >> 1) & 0x03
    if qos == 3:
        raise RemoteProtocolError("a PUBLISH at QoS 3")
    dup = bool(first & 0x08)
    if dup and not qos:
        raise RemoteProtocolError("a PUBLISH at QoS 0 with DUP set", PROTOCOL_ERROR)
    topic, pos = decode_string(data, start, stop)
    if "+" in topic or "#" in topic:
        raise RemoteProtocolError(f"a wildcard in the topic name {topic!r}", PROTOCOL_ERROR)
    packet_id = 0
    if qos:
        if pos + 2 > stop:
            raise RemoteProtocolError("a PUBLISH cut before its packet id")
        packet_id = (data[pos] << 8) | data[pos + 1]
        if not packet_id:
            raise RemoteProtocolError("a PUBLISH with packet id 0", PROTOCOL_ERROR)
        pos += 2
    properties = None
    if protocol == MQTT_5:
        properties, pos = decode_properties(data, pos, stop)
    return Publish(topic, bytes(data[pos:stop]), qos, bool(first & 0x01), dup, packet_id, properties)


def _packet_id(data: bytes | bytearray | memoryview, pos: int, stop: int, kind: int) -> int:
    if pos + 2 > stop:
        raise RemoteProtocolError(f"{PACKET_NAMES[kind]} cut before its packet id")
    packet_id = (data[pos] << 8) | data[pos + 1]
    if not packet_id:
        raise RemoteProtocolError(f"{PACKET_NAMES[kind]} with packet id 0", PROTOCOL_ERROR)
    return packet_id


def _decode_other(kind: int, data: bytes | bytearray | memoryview, pos: int, stop: int, protocol: int) -> Packet:
    v5 = protocol == MQTT_5
    properties: Properties | None = None
    packet: Packet
    if kind in (PUBACK, PUBREC, PUBREL, PUBCOMP):
        packet_id = _packet_id(data, pos, stop, kind)
        pos += 2
        reason_code = 0
        if v5 and pos < stop:
            reason_code = data[pos]
            pos += 1
            if pos < stop:
                properties, pos = decode_properties(data, pos, stop)
        packet = Ack(kind, packet_id, reason_code, properties)
    elif kind in (PINGREQ, PINGRESP):
        packet = PingReq() if kind == PINGREQ else PingResp()
    elif kind == CONNACK:
        if pos + 2 > stop:
            raise RemoteProtocolError("a CONNACK shorter than 2 bytes")
        acknowledge_flags, reason_code = data[pos], data[pos + 1]
        if acknowledge_flags & 0xFE:
            raise RemoteProtocolError(f"CONNACK flags 0x{acknowledge_flags:02x} (reserved bits set)")
        pos += 2
        if v5 and pos < stop:  # a 3.1.1 broker's refusal of a v5 CONNECT has no properties (`MqttSession`)
            properties, pos = decode_properties(data, pos, stop)
        packet = ConnAck(bool(acknowledge_flags), reason_code, properties)
    elif kind in (SUBACK, UNSUBACK):
        packet_id = _packet_id(data, pos, stop, kind)
        pos += 2
        if v5:
            properties, pos = decode_properties(data, pos, stop)
        codes = list(data[pos:stop])
        pos = stop
        packet = SubAck(packet_id, codes, properties) if kind == SUBACK else UnsubAck(packet_id, codes, properties)
    elif kind in (DISCONNECT, AUTH):
        reason_code = 0
        if v5 and pos < stop:
            reason_code = data[pos]
            pos += 1
            if pos < stop:
                properties, pos = decode_properties(data, pos, stop)
        packet = Disconnect(reason_code, properties) if kind == DISCONNECT else Auth(reason_code, properties)
    elif kind == SUBSCRIBE:
        packet_id = _packet_id(data, pos, stop, kind)
        pos += 2
        if v5:
            properties, pos = decode_properties(data, pos, stop)
        filters: list[tuple[str, SubscriptionOptions]] = []
        while pos < stop:
            topic_filter, pos = decode_string(data, pos, stop)
            if pos >= stop:
                raise RemoteProtocolError("a SUBSCRIBE filter without its options")
            options = data[pos]
            pos += 1
            if options & 0x03 == 3 or options & 0xC0 or (options >> 4) & 0x03 == 3:
                raise RemoteProtocolError(f"subscription options 0x{options:02x}")
            filters.append((topic_filter, SubscriptionOptions(options & 0x03, bool(options & 0x04),
                                                              bool(options & 0x08), (options >> 4) & 0x03)))
        if not filters:
            raise RemoteProtocolError("a SUBSCRIBE without filters", PROTOCOL_ERROR)
        packet = Subscribe(packet_id, filters, properties)
    elif kind == UNSUBSCRIBE:
        packet_id = _packet_id(data, pos, stop, kind)
        pos += 2
        if v5:
            properties, pos = decode_properties(data, pos, stop)
        names: list[str] = []
        while pos < stop:
            topic_filter, pos = decode_string(data, pos, stop)
            names.append(topic_filter)
        if not names:
            raise RemoteProtocolError("an UNSUBSCRIBE without filters", PROTOCOL_ERROR)
        packet = Unsubscribe(packet_id, names, properties)
    else:
        packet, pos = _decode_connect(data, pos, stop)
    if pos != stop:
        raise RemoteProtocolError(f"{stop - pos} bytes left over at the end of a {PACKET_NAMES[kind]}")
    return packet


def _decode_connect(data: bytes | bytearray | memoryview, pos: int, stop: int) -> tuple[Connect, int]:
    name, pos = decode_string(data, pos, stop)
    if name != "MQTT" or pos + 4 > stop:
        raise RemoteProtocolError(f"a CONNECT for protocol {name!r}")
    protocol, flags = data[pos], data[pos + 1]
    keepalive = (data[pos + 2] << 8) | data[pos + 3]
    pos += 4
    if protocol not in PROTOCOLS:
        raise RemoteProtocolError(f"a CONNECT at protocol level {protocol}")
    if flags & 0x01:
        raise RemoteProtocolError("CONNECT's reserved flag set")
    properties = None
    if protocol == MQTT_5:
        properties, pos = decode_properties(data, pos, stop)
    client_id, pos = decode_string(data, pos, stop)
    will = None
    if flags & 0x04:
        will_properties = None
        if protocol == MQTT_5:
            will_properties, pos = decode_properties(data, pos, stop)
        will_topic, pos = decode_string(data, pos, stop)
        will_payload, pos = decode_binary(data, pos, stop)
        will = Will(will_topic, will_payload, (flags >> 3) & 0x03, bool(flags & 0x20), will_properties)
    username = password = None
    if flags & 0x80:
        username, pos = decode_string(data, pos, stop)
    if flags & 0x40:
        password, pos = decode_binary(data, pos, stop)
    return Connect(client_id, protocol, bool(flags & 0x02), keepalive, properties, username, password, will), pos


def decode_all(data: bytes | bytearray | memoryview, protocol: int) -> list[Packet]:
    """Every whole packet of `data`, in order (tests and tools: a partial packet at the end is an error)."""
    packets: list[Packet] = []
    pos = 0
    while pos < len(data):
        decoded = decode_packet(data, pos, protocol)
        if decoded is None:
            raise RemoteProtocolError(f"{len(data) - pos} bytes at the end are not a whole packet")
        packet, pos = decoded
        packets.append(packet)
    return packets
