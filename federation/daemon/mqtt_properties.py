"""MQTT v5 properties as the federation carries them: a plain dict, converted to and from paho's `Properties`.

Theory of operation: a publication's properties cross the overlay inside
`tm.properties` (docs/protocol.md), as a dict of the properties worth
carrying to another broker's subscribers (user properties, content type,
response topic, correlation data, payload format, message expiry); the
rest (topic alias, subscription identifiers) belong to one connection.
`properties_to_dict` reads them from what paho received; `dict_to_properties`
builds paho's object for an injection and skips, rather than fails on, any
value a remote wrapper sent that paho or MQTT would refuse.
"""

from __future__ import annotations

from typing import Any

from paho.mqtt.exception import MQTTException
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

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
