"""The two ways an MQTT session fails, as h11 tells them apart.

`LocalProtocolError`: the caller misused the session (publishing while not
connected, past the broker's Receive Maximum, an invalid topic): nothing was
sent, the session is unchanged, and the caller can fix its call.

`RemoteProtocolError`: the broker sent something MQTT does not allow (a
malformed packet, a packet out of place). Raised by the codec; the session
catches it at its one inbound boundary (`MqttSession.receive_data`), turns
it into a `ProtocolFailure` event, queues a DISCONNECT with the reason code
(MQTT 5) and stays in its ERROR state until the caller closes the
connection: a connection whose byte stream is broken cannot be read on.
"""

from __future__ import annotations

MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
PACKET_TOO_LARGE = 0x95


class LocalProtocolError(Exception):
    """The caller asked for something the session's state or MQTT does not allow; nothing was done."""


class RemoteProtocolError(Exception):
    """The broker broke MQTT; `reason_code` is what an MQTT 5 DISCONNECT says about it (0x81 malformed, 0x82
    protocol error)."""

    def __init__(self, message: str, reason_code: int = MALFORMED_PACKET) -> None:
        super().__init__(message)
        self.reason_code = reason_code
