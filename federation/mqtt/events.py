"""What an MQTT session tells its caller: small dataclasses, one per thing that happened.

`MqttSession.receive_data` and `handle_timer` return them in the order the
broker's packets caused them. Publications come two ways: a `MessageRun`
holds plain ones (QoS 0 or 1, not retained, not DUP, no properties, not a
`$` topic; federation/mqtt/runs.py) in lists, a run of one for a lone
message, so the data path makes nothing per message; every other one is a
`Message`. Completions of the caller's own QoS 1/2 publications read
together are one `Completed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from federation.mqtt.properties import Properties


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """A QoS 1/2 publication of the caller's that the broker has not completed (`MqttSession.in_flight`)."""

    packet_id: int
    topic: str
    payload: bytes
    qos: int
    retain: bool = False
    properties: Properties | None = None
    released: bool = False
    """QoS 2: the broker's PUBREC came and our PUBREL was written (what is sent again is the PUBREL)"""


@dataclass(frozen=True, slots=True)
class Connected:
    """A CONNACK saying success. With `session_present` the session's unfinished publications have been queued
    again (`resent`: PUBLISH with DUP, or PUBREL); without it the broker has none of them, and they are
    `abandoned` for the caller to publish anew (MQTT 5 section 4.1.0: a client told Session Present 0 discards
    its session state)."""

    session_present: bool
    protocol: int
    receive_maximum: int
    """how many QoS 1/2 publications the broker takes unacknowledged from us (65,535 when it names none)"""
    keepalive: int
    """the keepalive in force: ours, or the broker's Server Keep Alive"""
    resent: int = 0
    abandoned: tuple[OutgoingMessage, ...] = ()
    maximum_packet_size: int = 0
    """the largest packet the broker takes (0: no limit named)"""
    maximum_qos: int = 2
    retain_available: bool = True
    assigned_client_id: str | None = None
    properties: Properties | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ConnectRefused:
    """A CONNACK refusing the connection (the broker closes it next). `unsupported_protocol`: the broker does not
    speak this protocol level; the session's next `connect` offers the next one in `SessionSettings.protocols`."""

    reason_code: int
    protocol: int
    unsupported_protocol: bool = False
    reason_string: str | None = None


@dataclass(frozen=True, slots=True)
class Subscribed:
    """A SUBACK: one reason code per filter of the SUBSCRIBE (the granted QoS, or 0x80 and above: refused)."""

    packet_id: int
    reason_codes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Unsubscribed:
    """An UNSUBACK (MQTT 3.1.1's has no reason codes: empty)."""

    packet_id: int
    reason_codes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MessageRun:
    """Plain publications read together (module docstring), in lists: topics, payloads, their QoS, and their
    packet ids at QoS 1 (to acknowledge with `MqttSession.acknowledge`; empty at QoS 0)."""

    topics: list[str]
    payloads: list[bytes]
    qos: int
    packet_ids: list[int]


@dataclass(slots=True)
class Message:
    """A publication that is not plain. Not frozen, though nothing changes one: one is made per message, and a
    frozen dataclass's `__init__` costs an `object.__setattr__` per field.

    QoS 2 ones are handed over at their PUBLISH (the broker lets go of a message at our PUBREC, which
    `acknowledge` writes once the caller holds it). `dup`: the broker sent it again after a reconnection."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    packet_id: int
    properties: Properties | None


@dataclass(frozen=True, slots=True)
class Completed:
    """The broker completed some of our QoS 1/2 publications (PUBACK, PUBCOMP, or a PUBREC refusing one), in the
    order read; a reason code of 0x80 or more says it refused that one."""

    packet_ids: list[int]
    reason_codes: list[int]


@dataclass(frozen=True, slots=True)
class Received:
    """The first PUBREC of one of our QoS 2 publications, success: the broker holds it and delivers it once. The
    PUBREL is queued behind this event: a caller that journals it before `data_to_send` has it first."""

    packet_id: int
    reason_code: int


@dataclass(frozen=True, slots=True)
class PingAnswered:
    """A PINGRESP: `number` PINGREQs of this connection have been answered (the broker has processed what was
    written before each)."""

    number: int


@dataclass(frozen=True, slots=True)
class BrokerDisconnected:
    """The broker's DISCONNECT (MQTT 5): it closes the connection next."""

    reason_code: int
    reason_string: str | None = None


@dataclass(frozen=True, slots=True)
class ProtocolFailure:
    """The broker broke MQTT, or did not answer a PINGREQ in time (`reason_code` 0x8D, keep alive timeout): the
    session is in its ERROR state; write what `data_to_send` holds (an MQTT 5 DISCONNECT) and close."""

    reason_code: int
    description: str


Event = (Connected | ConnectRefused | Subscribed | Unsubscribed | MessageRun | Message | Completed | Received
         | PingAnswered | BrokerDisconnected | ProtocolFailure)
