"""Publications and acknowledgements a run at a time: the MQTT session's data path.

Theory of operation: most of what the wrapper's broker link carries is
"plain" publications (QoS 0 or 1, not retained, not DUP, no properties, a
topic that is not a broker's `$` one) and the PUBACKs of its own QoS 1
ones. A run of them is read or built in one call that trades in lists, so
nothing is made per message between the bytes and the caller:

* `parse_plain_run(data, pos, limit)`, MQTT 5 only (the property length
  byte is part of what it checks): federation/daemon/mqtt_runs.py's, in C
  where the extension was built. It stops at the first packet that is not
  plain, not whole, or of the other QoS; the session's general path
  (federation/mqtt/codec.py) takes that one.
* `parse_puback_run(data, pos, limit, protocol)`: the packet ids and reason
  codes of consecutive PUBACKs without properties.
* `append_publishes(out, topics, payloads, qos, retain, packet_ids, protocol)`:
  PUBLISH packets appended to one buffer, without properties; QoS 0 with
  MQTT 5 through the C `append_qos0_run`.

mqtt_runs lives in the daemon for now (the C extension's module name); the
wiring of issue 41 moves it here, below the daemon, where it belongs.
"""

from __future__ import annotations

from collections.abc import Sequence

from federation.daemon.mqtt_runs import NATIVE, append_qos0_run, parse_plain_run
from federation.mqtt.codec import MQTT_5, topic_name_error

__all__ = ["NATIVE", "append_publishes", "parse_plain_run", "parse_puback_run", "topic_field"]

TOPIC_FIELD_CACHE = 4096
"""topics whose PUBLISH topic field `topic_field` remembers (all forgotten when more are seen)"""
_topic_fields: dict[str, bytes] = {}


def topic_field(topic: str) -> bytes:
    """A PUBLISH's topic field (length, UTF-8) for a topic that may be published on, else b"" (`topic_name_error`).
    Remembered: injections repeat topics, and this is per publication."""
    field = _topic_fields.get(topic)
    if field is not None:
        return field
    if topic_name_error(topic) is None:
        data = topic.encode("utf-8")
        field = len(data).to_bytes(2, "big") + data
    else:
        field = b""
    if len(_topic_fields) >= TOPIC_FIELD_CACHE:
        _topic_fields.clear()
    _topic_fields[topic] = field
    return field


def parse_puback_run(data: bytes | bytearray, pos: int, limit: int, protocol: int
                     ) -> tuple[int, list[int], list[int]]:
    """(end, packet ids, reason codes) of at most `limit` whole PUBACKs without properties from `pos` on: remaining
    length 2 (success), or 3 with MQTT 5 (a reason code). Stops at anything else."""
    ids: list[int] = []
    codes: list[int] = []
    end = len(data)
    v5 = protocol == MQTT_5
    while len(ids) < limit and end - pos >= 4 and data[pos] == 0x40:
        length = data[pos + 1]
        if length == 2:
            code = 0
        elif length == 3 and v5 and end - pos >= 5:
            code = data[pos + 4]
        else:
            break
        packet_id = (data[pos + 2] << 8) | data[pos + 3]
        if not packet_id:
            break  # malformed: the general path says so
        ids.append(packet_id)
        codes.append(code)
        pos += 2 + length
    return pos, ids, codes


def append_publishes(out: bytearray, topics: Sequence[str], payloads: Sequence[bytes], qos: int, retain: bool,
                     packet_ids: Sequence[int], protocol: int) -> int:
    """Append a PUBLISH without properties for each (topic, payload[, packet id]) from the first on, as paho builds
    it; how many. Stops at the first whose topic cannot be published on (`topic_name_error`) or whose packet passes
    MQTT's size limit: the caller's to refuse."""
    if qos == 0 and protocol == MQTT_5 and isinstance(topics, list) and isinstance(payloads, list):
        return int(append_qos0_run(out, topics, payloads, retain))
    first = 0x30 | qos << 1 | retain
    extra = (2 if qos else 0) + (1 if protocol == MQTT_5 else 0)
    count = 0
    for index, topic in enumerate(topics):
        field = topic_field(topic)
        payload = payloads[index]
        length = len(field) + extra + len(payload)
        if not field or length > 268435455:
            break
        out.append(first)
        while True:
            byte, length = length & 0x7F, length >> 7
            if length:
                out.append(byte | 0x80)
            else:
                out.append(byte)
                break
        out += field
        if qos:
            packet_id = packet_ids[index]
            out.append(packet_id >> 8)
            out.append(packet_id & 0xFF)
        if extra & 1:
            out.append(0)
        out += payload
        count += 1
    return count
