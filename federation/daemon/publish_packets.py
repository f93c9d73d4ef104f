"""PUBLISH packets built for injections, byte for byte as paho builds them, without paho's per-packet objects.

`LeanClient.send_reliable` writes a run of QoS 1/2 injections as one
buffer: each packet is `append_publish` of the topic field (length and
UTF-8, `topic_field`: remembered per topic, since injections repeat topics),
the packet id, the packed properties and the payload. A topic paho would
refuse (a wildcard, empty, too long) or a packet above MQTT's largest gets
an empty field (`publishable_field`), and the caller refuses it as paho
would.
"""

from __future__ import annotations

MAX_PACKET_LENGTH = 268435455
"""MQTT's largest remaining length (four length bytes)"""


TOPIC_FIELD_CACHE = 4096
"""topics whose PUBLISH topic field `topic_field` remembers (all forgotten when more are seen)"""
_topic_fields: dict[str, bytes] = {}


def publishable_field(topic: str, payload: bytes, properties: int = 1) -> bytes:
    """`topic_field`, remembered per topic, or b"" when the packet would not pass MQTT's limits (paho's check,
    with room for a packet id and `properties` bytes of packed properties)."""
    field = _topic_fields.get(topic)
    if field is None:
        field = topic_field(topic)
    return field if len(field) + len(payload) + 2 + properties <= MAX_PACKET_LENGTH else b""


def topic_field(topic: str) -> bytes:
    """The topic field of a PUBLISH (length, UTF-8) for a topic that may be published here, else b"" (paho
    raises for a wildcard or a topic too long, and a broker disconnects a client that publishes on an empty
    topic without an alias). Remembered: injections repeat topics, and this is per publication."""
    topic_bytes = topic.encode("utf-8")
    valid = 0 < len(topic_bytes) <= 0xFFFF and b"+" not in topic_bytes and b"#" not in topic_bytes
    field = len(topic_bytes).to_bytes(2, "big") + topic_bytes if valid else b""
    if len(_topic_fields) >= TOPIC_FIELD_CACHE:
        _topic_fields.clear()
    _topic_fields[topic] = field
    return field


NO_PROPERTIES = b"\x00"
"""the packed properties of a PUBLISH without any: a property length of 0"""


def append_publish(out: bytearray, field: bytes, payload: bytes, retain: bool, mid: int, qos: int = 1,
                    properties: bytes = NO_PROPERTIES) -> None:
    """Append a PUBLISH as paho's `_send_publish` builds it: QoS `qos` with packet id `mid`, QoS 0 when `mid` is
    0; `field` from `topic_field`, `properties` packed (`Properties.pack`, property length first)."""
    length = len(properties) + len(field) + len(payload)  # topic field, properties, payload
    if mid:
        length += 2
        out.append(0x30 | qos << 1 | retain)
    else:
        out.append(0x31 if retain else 0x30)
    while True:
        byte, length = length & 0x7F, length >> 7
        if length:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            break
    out += field
    if mid:
        out += mid.to_bytes(2, "big")
    out += properties
    out += payload
