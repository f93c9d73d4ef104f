"""The caller's side of an MQTT session: packet ids, QoS 1/2 publications in flight, and the broker's quota.

Theory of operation: MQTT's session state on the client side is the QoS 1
and 2 publications the broker has not completed (MQTT 5 section 4.1). They
are kept here in the order they were first sent (`messages`, packet id ->
topic, payload, QoS, retain, properties), with the QoS 2 ones whose PUBREC
came (`released`: what is sent again for them is the PUBREL). A new
connection that keeps the session sends them all again in that order
(`resume`), a PUBLISH with DUP or a PUBREL; one that does not hands them
back (`abandon`), because the broker has none of them.

Flow control (MQTT 5 section 4.9): the broker's Receive Maximum bounds the
publications in flight. `quota` is what may go now; a session resumed with
a smaller Receive Maximum than it has in flight sends the first ones and
keeps the rest `unsent`, sent as completions make room, before anything
new (so nothing overtakes them: `quota` is 0 while any wait).

Packet ids are paho's sequence (1, 2, ... 65,535, 1, ...), shared with
SUBSCRIBE and UNSUBSCRIBE (`requests`), skipping ids still in use, so a
session and paho that make the same calls send the same ids.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from federation.mqtt.codec import PUBREL, Publish, encode_ack, encode_publish
from federation.mqtt.errors import LocalProtocolError
from federation.mqtt.events import OutgoingMessage
from federation.mqtt.properties import Properties

FlightEntry = tuple[str, bytes, int, bool, "Properties | None"]
"""topic, payload, qos, retain, properties of a publication in flight"""
MAX_PACKET_ID = 0xFFFF
UNLIMITED = 65535
"""the Receive Maximum of a broker that names none (and of every MQTT 3.1.1 broker: 3.1.1 has no flow control)"""


class Flights:
    """The caller's publications in flight and the packet ids in use (module docstring)."""

    def __init__(self) -> None:
        self.messages: dict[int, FlightEntry] = {}
        self.released: set[int] = set()
        self.unsent: deque[int] = deque()
        self.requests: dict[int, int] = {}
        """packet id -> SUBSCRIBE or UNSUBSCRIBE (the packet type) awaiting its SUBACK or UNSUBACK"""
        self.last_id = 0
        self.receive_maximum = UNLIMITED

    def quota(self) -> int:
        """QoS 1/2 publications that may be sent now."""
        if self.unsent:
            return 0
        return max(0, self.receive_maximum - len(self.messages))

    def allocate(self, count: int) -> list[int]:
        """`count` packet ids not in use, in paho's order."""
        ids: list[int] = []
        in_use = self.messages
        requests = self.requests
        last = self.last_id
        tried = 0
        while len(ids) < count:
            last = last + 1 if last < MAX_PACKET_ID else 1
            tried += 1
            if tried > MAX_PACKET_ID:
                raise LocalProtocolError("all 65,535 packet ids are in use")
            if last in in_use or last in requests:
                continue
            ids.append(last)
        self.last_id = last
        return ids

    def take(self, ids: Sequence[int], topics: Sequence[str], payloads: Sequence[bytes], qos: int, retain: bool,
             properties: Properties | None = None) -> None:
        """Publications written now under `ids`: in flight until the broker completes them."""
        messages = self.messages
        for index, packet_id in enumerate(ids):
            messages[packet_id] = (topics[index], payloads[index], qos, retain, properties)

    def complete(self, packet_id: int, qos: int) -> bool:
        """The broker's PUBACK (`qos` 1) or PUBCOMP (2), or PUBREC refusing a QoS 2 one (`qos` 2 too): True when it
        completes one of ours of that QoS, now forgotten."""
        entry = self.messages.get(packet_id)
        if entry is None or entry[2] != qos:
            return False
        del self.messages[packet_id]
        self.released.discard(packet_id)
        return True

    def release(self, packet_id: int) -> bool | None:
        """A PUBREC saying success: None when it names none of our QoS 2 publications, else whether it is the first
        (False: a repeat; its PUBREL is sent again all the same)."""
        entry = self.messages.get(packet_id)
        if entry is None or entry[2] != 2:
            return None
        if packet_id in self.released:
            return False
        self.released.add(packet_id)
        return True

    def resume(self, out: bytearray, protocol: int) -> int:
        """A new connection kept the session: every publication in flight queued again into `out`, in order, as far
        as the broker's Receive Maximum allows (the rest `unsent`); how many were queued."""
        self.unsent.clear()
        self.unsent.extend(self.messages)
        return self.send_unsent(out, protocol)

    def send_unsent(self, out: bytearray, protocol: int) -> int:
        """Those `unsent`, again, as far as the Receive Maximum allows: a PUBLISH with DUP, or a PUBREL."""
        room = self.receive_maximum - (len(self.messages) - len(self.unsent))
        sent = 0
        unsent = self.unsent
        while unsent and sent < room:
            packet_id = unsent.popleft()
            if packet_id in self.released:
                out += encode_ack(PUBREL, packet_id, protocol)
            else:
                topic, payload, qos, retain, properties = self.messages[packet_id]
                out += encode_publish(Publish(topic, payload, qos, retain, True, packet_id, properties), protocol)
            sent += 1
        return sent

    def abandon(self) -> tuple[OutgoingMessage, ...]:
        """A new connection without the session: everything in flight handed back, in order, and forgotten."""
        abandoned = self.view()
        self.messages.clear()
        self.released.clear()
        self.unsent.clear()
        return abandoned

    def connection_lost(self) -> None:
        """SUBACKs and UNSUBACKs of the closed connection never come (MQTT does not send those requests again)."""
        self.requests.clear()
        self.unsent.clear()

    def restore(self, messages: Sequence[OutgoingMessage]) -> None:
        """Publications a previous run of the caller had in flight (its journal), before a connection: the first
        CONNACK sends them again or hands them back. New packet ids follow them."""
        for message in messages:
            if message.qos not in (1, 2) or not 0 < message.packet_id <= MAX_PACKET_ID:
                raise LocalProtocolError(f"cannot restore {message!r}: QoS 1 or 2 with a packet id of 1 to 65,535")
            if message.packet_id in self.messages:
                raise LocalProtocolError(f"packet id {message.packet_id} is restored twice")
            self.messages[message.packet_id] = (message.topic, message.payload, message.qos, message.retain,
                                                message.properties)
            if message.released:
                self.released.add(message.packet_id)
            self.last_id = max(self.last_id, message.packet_id)

    def view(self) -> tuple[OutgoingMessage, ...]:
        """What is in flight, in order."""
        released = self.released
        return tuple(OutgoingMessage(packet_id, topic, payload, qos, retain, properties, packet_id in released)
                     for packet_id, (topic, payload, qos, retain, properties) in self.messages.items())
