"""MQTT 5 properties: one table of every property, and its encoding both ways.

Theory of operation: a property list is a plain dict keyed by the property's
name in snake case (`message_expiry_interval`, `user_property`, ...), the
keys docs/protocol.md uses for `tm.properties`, so a publication's
properties can cross the federation without a conversion object. Properties
MQTT allows more than once are lists: `user_property` of (name, value)
pairs, `subscription_identifier` of integers. `PROPERTIES` is the one table
(identifier, name, type, repeatable) that encoding, decoding and the tests
read. Encoding writes them in ascending identifier order, as paho does, so
the bytes match paho's for the same properties (tests/mqtt/test_codec.py).
Decoding refuses what MQTT calls malformed (an unknown identifier, a value
past the list's end, a string that is not UTF-8) or a protocol error (a
single-valued property twice) with `RemoteProtocolError`.
"""

from __future__ import annotations

from federation.mqtt.errors import PROTOCOL_ERROR, RemoteProtocolError

PropertyValue = int | str | bytes | list[tuple[str, str]] | list[int]
Properties = dict[str, PropertyValue]
"""a property list: name -> value (module docstring)"""

BYTE, TWO, FOUR, VARIABLE, STRING, BINARY, PAIR = range(7)
"""the value types of MQTT 5 section 2.2.2.2"""

PROPERTIES: tuple[tuple[int, str, int, bool], ...] = (
    (0x01, "payload_format_indicator", BYTE, False),
    (0x02, "message_expiry_interval", FOUR, False),
    (0x03, "content_type", STRING, False),
    (0x08, "response_topic", STRING, False),
    (0x09, "correlation_data", BINARY, False),
    (0x0B, "subscription_identifier", VARIABLE, True),
    (0x11, "session_expiry_interval", FOUR, False),
    (0x12, "assigned_client_identifier", STRING, False),
    (0x13, "server_keep_alive", TWO, False),
    (0x15, "authentication_method", STRING, False),
    (0x16, "authentication_data", BINARY, False),
    (0x17, "request_problem_information", BYTE, False),
    (0x18, "will_delay_interval", FOUR, False),
    (0x19, "request_response_information", BYTE, False),
    (0x1A, "response_information", STRING, False),
    (0x1C, "server_reference", STRING, False),
    (0x1F, "reason_string", STRING, False),
    (0x21, "receive_maximum", TWO, False),
    (0x22, "topic_alias_maximum", TWO, False),
    (0x23, "topic_alias", TWO, False),
    (0x24, "maximum_qos", BYTE, False),
    (0x25, "retain_available", BYTE, False),
    (0x26, "user_property", PAIR, True),
    (0x27, "maximum_packet_size", FOUR, False),
    (0x28, "wildcard_subscription_available", BYTE, False),
    (0x29, "subscription_identifier_available", BYTE, False),
    (0x2A, "shared_subscription_available", BYTE, False),
)
"""(identifier, name, type, may repeat) of every MQTT 5 property, by identifier"""

_BY_ID = {identifier: (name, kind, repeats) for identifier, name, kind, repeats in PROPERTIES}
_BY_NAME = {name: (identifier, kind, repeats) for identifier, name, kind, repeats in PROPERTIES}
_INTEGER_LIMITS = {BYTE: 0xFF, TWO: 0xFFFF, FOUR: 0xFFFFFFFF, VARIABLE: 268435455}
NO_PROPERTIES = b"\x00"
"""an empty property list on the wire (its length, 0)"""


def encode_variable_integer(value: int) -> bytes:
    """MQTT's variable byte integer (1 to 4 bytes, 7 bits each, least significant first)."""
    if not 0 <= value <= 268435455:
        raise ValueError(f"{value} does not fit MQTT's variable byte integer (0 to 268,435,455)")
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def decode_variable_integer(data: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of the variable byte integer at `pos`; RemoteProtocolError when it is longer
    than four bytes or runs past `end`."""
    value = 0
    shift = 0
    while pos < end:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 21:
            break
    raise RemoteProtocolError("a variable byte integer longer than 4 bytes or cut short")


def encode_string(value: str) -> bytes:
    """A UTF-8 string with its two-byte length."""
    data = value.encode("utf-8")
    if len(data) > 0xFFFF:
        raise ValueError(f"a string of {len(data)} bytes: MQTT's limit is 65,535")
    return len(data).to_bytes(2, "big") + data


def encode_binary(value: bytes | bytearray) -> bytes:
    if len(value) > 0xFFFF:
        raise ValueError(f"binary data of {len(value)} bytes: MQTT's limit is 65,535")
    return len(value).to_bytes(2, "big") + bytes(value)


def encode_properties(properties: Properties | None) -> bytes:
    """A property list on the wire: its length, then each property in ascending identifier order (as paho packs
    them). ValueError for an unknown name or a value of the wrong type or range: the caller's mistake."""
    if not properties:
        return NO_PROPERTIES
    body = bytearray()
    for identifier, name, kind, repeats in PROPERTIES:
        if name not in properties:
            continue
        value = properties[name]
        values = value if repeats else [value]
        if not isinstance(values, list):
            raise ValueError(f"property {name} may repeat: give a list")
        for item in values:
            body.append(identifier)
            body += _encode_value(name, kind, item)
    unknown = sorted(set(properties) - _BY_NAME.keys())
    if unknown:
        raise ValueError(f"unknown MQTT 5 properties {unknown}: the names are those of federation.mqtt.properties")
    return encode_variable_integer(len(body)) + bytes(body)


def _encode_value(name: str, kind: int, value: object) -> bytes:
    if kind == PAIR:
        if not (isinstance(value, (tuple, list)) and len(value) == 2
                and isinstance(value[0], str) and isinstance(value[1], str)):
            raise ValueError(f"property {name}: each value is a (name, value) pair of strings, not {value!r}")
        return encode_string(value[0]) + encode_string(value[1])
    if kind == STRING:
        if not isinstance(value, str):
            raise ValueError(f"property {name} is a string, not {value!r}")
        return encode_string(value)
    if kind == BINARY:
        if not isinstance(value, (bytes, bytearray)):
            raise ValueError(f"property {name} is binary data, not {value!r}")
        return encode_binary(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _INTEGER_LIMITS[kind]:
        raise ValueError(f"property {name} is an integer of 0 to {_INTEGER_LIMITS[kind]}, not {value!r}")
    if kind == VARIABLE:
        return encode_variable_integer(value)
    return value.to_bytes({BYTE: 1, TWO: 2, FOUR: 4}[kind], "big")


def decode_string(data: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[str, int]:
    """(string, position after it) of the UTF-8 string with its length at `pos`."""
    if pos + 2 > end:
        raise RemoteProtocolError("a string's length runs past the packet's end")
    stop = pos + 2 + ((data[pos] << 8) | data[pos + 1])
    if stop > end:
        raise RemoteProtocolError("a string runs past the packet's end")
    try:
        text = bytes(data[pos + 2:stop]).decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError("a string that is not UTF-8") from None
    if "\x00" in text:
        raise RemoteProtocolError("a string with U+0000 (MQTT section 1.5.4)")
    return text, stop


def decode_binary(data: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[bytes, int]:
    if pos + 2 > end:
        raise RemoteProtocolError("binary data's length runs past the packet's end")
    stop = pos + 2 + ((data[pos] << 8) | data[pos + 1])
    if stop > end:
        raise RemoteProtocolError("binary data runs past the packet's end")
    return bytes(data[pos + 2:stop]), stop


def decode_properties(data: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[Properties | None, int]:
    """(the property list at `pos`, None when empty; position after it)."""
    length, pos = decode_variable_integer(data, pos, end)
    stop = pos + length
    if stop > end:
        raise RemoteProtocolError("a property list runs past the packet's end")
    if not length:
        return None, pos
    properties: Properties = {}
    while pos < stop:
        identifier, pos = decode_variable_integer(data, pos, stop)
        entry = _BY_ID.get(identifier)
        if entry is None:
            raise RemoteProtocolError(f"unknown property identifier 0x{identifier:02x}")
        name, kind, repeats = entry
        value: PropertyValue
        if kind == BYTE:
            if pos >= stop:
                raise RemoteProtocolError(f"property {name} runs past the property list")
            value, pos = data[pos], pos + 1
        elif kind in (TWO, FOUR):
            size = 2 if kind == TWO else 4
            if pos + size > stop:
                raise RemoteProtocolError(f"property {name} runs past the property list")
            value, pos = int.from_bytes(data[pos:pos + size], "big"), pos + size
        elif kind == VARIABLE:
            value, pos = decode_variable_integer(data, pos, stop)
        elif kind == STRING:
            value, pos = decode_string(data, pos, stop)
        elif kind == BINARY:
            value, pos = decode_binary(data, pos, stop)
        else:
            key, pos = decode_string(data, pos, stop)
            text, pos = decode_string(data, pos, stop)
            value = (key, text)  # type: ignore[assignment]  # one item of the list below
        if repeats:
            properties.setdefault(name, []).append(value)  # type: ignore[union-attr, arg-type]
        elif name in properties:
            raise RemoteProtocolError(f"property {name} more than once", PROTOCOL_ERROR)
        else:
            properties[name] = value
    return properties, pos
