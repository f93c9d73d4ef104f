"""The broker connection's session, its QoS 1/2 injections and their journal, without a broker.

A Unix socket pair stands in for the TCP connection, so what the adapter writes is exactly what a broker
would read, and the test plays the broker's side (CONNACK, PUBREC, PUBCOMP, PUBREL). The window of
injections the broker's Receive Maximum allows is `FlowControl`'s (federation/daemon/flow_control.py).
"""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Iterator, Sequence
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from federation.daemon.broker import BrokerAdapter
from federation.daemon.broker_items import BrokerItem, Connected, LogLine, Publication, RetainedApplied
from federation.daemon.flow_control import FlowControl
from federation.protocol.node import Node
from federation.protocol.types import Address, Injection, PublicationId

from mqtt_bytes import split_packets

BROKER = Address("127.0.0.1", 1883)
ORIGIN = Address("10.0.0.9", 10500)


def injection(seq: int, qos: int = 2, properties: dict[str, Any] | None = None) -> Injection:
    return Injection(f"t/{seq}", b"p%d" % seq, qos, False, properties, (ORIGIN, 1, seq))


def connack(session_present: bool, receive_maximum: int | None = None) -> bytes:
    properties = b"" if receive_maximum is None else b"\x21" + receive_maximum.to_bytes(2, "big")
    body = bytes([1 if session_present else 0, 0, len(properties)]) + properties
    return bytes([0x20, len(body)]) + body


def ack(kind: int, *mids: int, reason: int | None = None) -> bytes:
    """PUBACK (0x40), PUBREC (0x50), PUBREL (0x62) or PUBCOMP (0x70) packets."""
    tail = b"" if reason is None else bytes([reason])
    return b"".join(bytes([kind, 2 + len(tail)]) + mid.to_bytes(2, "big") + tail for mid in mids)


def mid_of(packet: bytes) -> int:
    """The packet id of a QoS 1/2 PUBLISH."""
    start = 1
    while packet[start] & 0x80:
        start += 1
    topic_end = start + 3 + int.from_bytes(packet[start + 1:start + 3], "big")
    return int.from_bytes(packet[topic_end:topic_end + 2], "big")


class Recorder:
    """An `InjectionRecorder` that notes what it is told, and what the socket held at that moment."""

    def __init__(self) -> None:
        self.told: list[tuple[str, Any]] = []
        self.peer: socket.socket | None = None

    def _unread(self) -> bytes:
        assert self.peer is not None
        return read_all(self.peer, keep=True)

    def started(self, injections: Sequence[tuple[int, Injection]]) -> None:
        self.told.append(("started", ([mid for mid, _ in injections], self._unread())))

    def released(self, mid: int) -> None:
        self.told.append(("released", (mid, self._unread())))

    def finished(self, mids: Sequence[int]) -> None:
        self.told.append(("finished", list(mids)))

    def abandoned(self, mids: Sequence[int]) -> None:
        self.told.append(("abandoned", list(mids)))


_kept: dict[int, bytes] = {}


def read_all(peer: socket.socket, keep: bool = False) -> bytes:
    """What the adapter wrote; `keep`: peek, and hand it out again with the next read."""
    peer.setblocking(False)
    data = _kept.pop(peer.fileno(), b"")
    try:
        while chunk := peer.recv(1 << 16):
            data += chunk
    except BlockingIOError:
        pass
    if keep:
        _kept[peer.fileno()] = data
    return data


class Side:
    """A loop-driven adapter with a recorder on a socket pair; the test is the broker."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.items: list[BrokerItem] = []
        self.recorder = Recorder()
        self.adapter = BrokerAdapter(BROKER, "session-test", self.items.append, loop=self.loop,
                                     recorder=self.recorder)
        self.client: Any = self.adapter.client
        self.client._clean_start = False  # what `start` sets (connect_async with clean start 0)
        self.socks: list[socket.socket] = []
        self.peer = self.connect()

    def connect(self) -> socket.socket:
        ours, peer = socket.socketpair()
        ours.setblocking(False)
        self.socks += [ours, peer]
        self.client._sock = ours
        self.adapter.reading.watched = ours
        self.recorder.peer = peer
        return peer

    def receive(self, data: bytes) -> bytes:
        self.peer.sendall(data)
        self.adapter.reading.on_readable()
        return read_all(self.peer)

    def reconnect(self, session_present: bool, receive_maximum: int | None = None) -> bytes:
        """The connection drops and paho makes a new one (`reconnect` resets its messages), which the broker
        accepts with or without the session; what the client writes then."""
        self.client._sock = None
        self.client._out_packet.clear()
        self.client._messages_reconnect_reset()
        self.peer = self.connect()
        return self.receive(connack(session_present, receive_maximum))

    def close(self) -> None:
        self.client._sock = None
        for sock in self.socks:
            sock.close()
        self.loop.close()


@pytest.fixture
def side() -> Iterator[Side]:
    made = Side()
    try:
        yield made
    finally:
        made.close()


def test_qos2_injections_with_properties_write_what_pahos_publish_writes(side: Side) -> None:
    made = [injection(1), injection(2, properties={"content_type": "text/plain", "user_property": [["k", "v"]]}),
            injection(3, qos=1, properties={"message_expiry_interval": 60}), injection(4, qos=0)]
    side.client._last_mid = 65533  # the ids wrap: 65534, 65535, 1
    side.adapter.publish_all(made)
    written = read_all(side.peer)
    reference = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    ours, theirs = socket.socketpair()
    reference._sock = ours  # type: ignore[assignment]
    reference._last_mid = 65533  # type: ignore[attr-defined]
    try:
        from federation.daemon.mqtt_properties import dict_to_properties
        for item in made:
            reference.publish(item.topic, item.payload, item.qos, item.retain,
                              dict_to_properties(item.properties)[0])
        expected = read_all(theirs)
    finally:
        reference._sock = None
        ours.close()
        theirs.close()
    assert written == expected
    assert list(side.client._out_messages) == [65534, 65535, 1] and side.adapter.backlog() == 3


def test_the_journal_hears_of_injections_before_their_bytes_and_of_pubrec_before_the_pubrel(side: Side) -> None:
    side.adapter.publish_all([injection(1), injection(2)])
    (kind, (mids, unread_then)), = side.recorder.told
    assert kind == "started" and mids == [1, 2] and unread_then == b""  # nothing written yet
    assert [mid_of(p) for p in split_packets(read_all(side.peer))] == [1, 2]
    written = side.receive(ack(0x50, 1))  # PUBREC
    assert side.recorder.told[1] == ("released", (1, b""))  # recorded, then the PUBREL
    assert written == ack(0x62, 1)
    assert side.receive(ack(0x50, 1)) == ack(0x62, 1)  # a repeated PUBREC: PUBREL again, nothing recorded
    assert len(side.recorder.told) == 2
    side.receive(ack(0x70, 1))  # PUBCOMP: finished, told once per read pass
    assert side.recorder.told[2:] == [("finished", [1])]
    assert side.adapter.counts["acknowledged"] == 1 and side.adapter.backlog() == 1


def test_a_kept_session_gets_the_same_packet_ids_again_with_dup_or_the_pubrel(side: Side) -> None:
    side.adapter.publish_all([injection(1), injection(2), injection(3)])
    first = split_packets(read_all(side.peer))
    side.receive(ack(0x50, 2))
    again = side.reconnect(session_present=True)
    resent = [p for p in split_packets(again) if p[0] & 0xF0 in (0x30, 0x60)]
    assert resent == [bytes([first[0][0] | 0x08]) + first[0][1:], ack(0x62, 2), bytes([first[2][0] | 0x08])
                      + first[2][1:]]
    connected = [item for item in side.items if isinstance(item, Connected)]
    assert connected == [Connected(True, False, 65535, 3, ())]
    assert side.adapter.backlog() == 3 and side.adapter.counts["resent"] == 3


def test_without_the_session_unfinished_injections_are_handed_back_to_be_published_anew(side: Side) -> None:
    side.receive(connack(session_present=False, receive_maximum=20))  # the first connection of this run
    side.adapter.publish_all([injection(1), injection(2, qos=1), injection(3)])
    mids = [mid_of(p) for p in split_packets(read_all(side.peer)) if p[0] & 0xF0 == 0x30]
    side.receive(ack(0x50, mids[0]))  # past PUBREC: a PUBREL would be answered "done" by a broker that lost it
    again = side.reconnect(session_present=False, receive_maximum=10)
    assert [p for p in split_packets(again) if p[0] & 0xF0 in (0x30, 0x60)] == []  # nothing sent again
    connected = [item for item in side.items if isinstance(item, Connected)]
    assert connected[-1] == Connected(False, True, 10, 0, (injection(1), injection(2, qos=1), injection(3)))
    assert side.adapter.backlog() == 0 and not side.client._out_messages
    assert ("abandoned", mids) in side.recorder.told
    assert side.adapter.sessions_lost == 1 and side.adapter.receive_maximum == 10


def test_a_restarted_wrapper_sends_the_journals_unfinished_injections_as_paho_would_its_own() -> None:
    side = Side()
    try:
        side.client._sock = None
        side.adapter.restore([(40, injection(1), False), (41, injection(2), True), (42, injection(3, qos=1), False)])
        assert side.adapter.backlog() == 3
        again = side.reconnect(session_present=True)
        resent = [p for p in split_packets(again) if p[0] & 0xF0 in (0x30, 0x60)]
        assert [(p[0], mid_of(p) if p[0] & 0xF0 == 0x30 else None) for p in resent] == [
            (0x3C, 40), (0x62, None), (0x3A, 42)]  # QoS 2 DUP, the PUBREL of 41, QoS 1 DUP
        assert resent[1] == ack(0x62, 41)
        side.adapter.publish_all([injection(4)])  # new ids come after the restored ones (43 went to SUBSCRIBE)
        assert [mid_of(p) for p in split_packets(read_all(side.peer))] == [44]
    finally:
        side.close()


def test_a_qos2_publication_is_handed_over_at_once_and_its_pubrec_waits_for_the_runtime(side: Side) -> None:
    """The PUBREC is the acknowledgement that makes the broker forget the publication (it resends a PUBREL, not
    the message, after that): it goes out only once the runtime took the publication into its spool."""
    assert side.receive(ack(0x62, 77)) == ack(0x70, 77)  # a previous run's PUBREL: PUBCOMP at once
    publish = bytes([0x34, 9, 0, 3]) + b"q/2" + bytes([0, 5, 0]) + b"x"  # QoS 2 PUBLISH, mid 5
    assert side.receive(publish) == b""  # no PUBREC yet: handed over
    [publication] = [item for item in side.items if isinstance(item, Publication)]
    assert (publication.topic, publication.qos, publication.mid, publication.dup) == ("q/2", 2, 5, False)
    side.adapter.acknowledge([(5, 2)])
    assert read_all(side.peer) == ack(0x50, 5)  # the runtime's PUBREC
    assert side.receive(ack(0x62, 5)) == ack(0x70, 5)  # and the PUBREL that follows is completed at once


def test_a_publication_the_broker_sends_again_carries_its_dup_flag(side: Side) -> None:
    """After a restart the broker's DUP copy of a publication the spool already holds is recognised by it."""
    publish = bytes([0x3C, 9, 0, 3]) + b"q/2" + bytes([0, 6, 0]) + b"y"  # QoS 2 PUBLISH, DUP, mid 6
    assert side.receive(publish) == b""
    [publication] = [item for item in side.items if isinstance(item, Publication)]
    assert (publication.mid, publication.dup, publication.payload) == (6, True, b"y")


def test_a_refusal_counts_as_refused_not_delivered(side: Side) -> None:
    side.adapter.publish_all([injection(1, qos=1), injection(2)])
    read_all(side.peer)
    side.receive(ack(0x40, 1, reason=0x87) + ack(0x50, 2, reason=0x87))
    side.receive(ack(0x70, 2))  # paho sends the PUBREL anyway; the broker completes it
    assert side.adapter.counts["refused"] == 2 and side.adapter.counts["acknowledged"] == 0
    assert side.adapter.backlog() == 0


# ------------------------------------------------------------------ packet ids the broker reuses


def qos2_publish(mid: int, payload: bytes, dup: bool = False) -> bytes:
    return bytes([0x3C if dup else 0x34, 8 + len(payload), 0, 3]) + b"q/2" + mid.to_bytes(2, "big") + b"\0" + payload


def log_line(mid: int, text: bytes) -> bytes:
    """A QoS 1 log line as Mosquitto sends it: with a message expiry property."""
    topic = b"$SYS/broker/log/M/subscribe"
    body = len(topic).to_bytes(2, "big") + topic + mid.to_bytes(2, "big") + bytes([5, 0x02, 0, 0, 0, 20]) + text
    return bytes([0x32, len(body)]) + body


def test_a_reused_packet_id_is_a_new_message_whose_pubrec_waits_for_the_previous_pubrel(side: Side) -> None:
    """Mosquitto 2.0.11 numbers messages when it queues them: with more than 65,535 queued for the wrapper an id
    comes again (without DUP) while the message that had it waits for its PUBREL. It is handed over, and its
    PUBREC goes out only after the earlier one's PUBCOMP: at once, the broker would take it for the earlier
    message's and later see a PUBCOMP for a message it still waits a PUBREC for (protocol error)."""
    assert side.receive(qos2_publish(5, b"first")) == b""
    side.adapter.acknowledge([(5, 2)])
    assert read_all(side.peer) == ack(0x50, 5)
    assert side.receive(qos2_publish(5, b"second")) == b""  # the id again before its PUBREL, no DUP
    assert [item.payload for item in side.items if isinstance(item, Publication)] == [b"first", b"second"]
    side.adapter.acknowledge([(5, 2)])
    assert read_all(side.peer) == b"" and side.client.acks_held == 1  # held: 5 still waits for its PUBREL
    assert side.receive(ack(0x62, 5)) == ack(0x70, 5) + ack(0x50, 5)  # the first completed, then the second's
    assert side.receive(ack(0x62, 5)) == ack(0x70, 5)
    assert side.receive(qos2_publish(5, b"third")) == b""  # a new message again, nothing held now
    side.adapter.acknowledge([(5, 2)])
    assert read_all(side.peer) == ack(0x50, 5)


def test_a_repeat_with_dup_of_an_answered_id_is_answered_again_and_not_handed_over(side: Side) -> None:
    side.receive(qos2_publish(6, b"once"))
    side.adapter.acknowledge([(6, 2)])
    read_all(side.peer)
    assert side.receive(qos2_publish(6, b"once", dup=True)) == ack(0x50, 6)  # the broker missed our PUBREC
    assert [item.payload for item in side.items if isinstance(item, Publication)] == [b"once"]


def test_a_log_line_reusing_the_id_of_a_qos2_publication_is_acknowledged_after_its_pubcomp(side: Side) -> None:
    """A PUBACK for an id whose oldest message is a QoS 2 one is a protocol error to Mosquitto: it waits too, and
    several acknowledgements held for one id go out in order, each PUBREC waiting for a PUBREL of its own."""
    side.receive(qos2_publish(7, b"publication"))
    side.adapter.acknowledge([(7, 2)])
    assert read_all(side.peer) == ack(0x50, 7)
    side.receive(log_line(7, b"1700000000: c 1 a/b") + qos2_publish(7, b"again") + log_line(7, b"1700000000: c 1 a/c"))
    lines = [item for item in side.items if isinstance(item, LogLine)]
    assert [(line.payload, line.mid, line.qos) for line in lines] == [(b"1700000000: c 1 a/b", 7, 1),
                                                                       (b"1700000000: c 1 a/c", 7, 1)]
    side.adapter.acknowledge([(7, 1), (7, 2), (7, 1)])
    assert read_all(side.peer) == b""
    assert side.receive(ack(0x62, 7)) == ack(0x70, 7) + ack(0x40, 7) + ack(0x50, 7)
    assert side.receive(ack(0x62, 7)) == ack(0x70, 7) + ack(0x40, 7)
    assert side.client.acks_held == 3


def test_acknowledgements_held_on_a_connection_that_dropped_are_forgotten(side: Side) -> None:
    """The broker sends their messages again (DUP) after the PUBREL of the one before: they are handed over again
    and acknowledged then, not with a PUBREC left from the old connection."""
    side.receive(qos2_publish(8, b"a"))
    side.adapter.acknowledge([(8, 2)])
    side.receive(qos2_publish(8, b"b"))
    side.adapter.acknowledge([(8, 2)])
    read_all(side.peer)
    side.reconnect(session_present=True)
    assert side.receive(ack(0x62, 8)) == ack(0x70, 8)  # the first's PUBREL again: nothing held any more
    assert side.receive(qos2_publish(8, b"b", dup=True)) == b""  # the second again, handed over again
    assert [item.payload for item in side.items if isinstance(item, Publication)] == [b"a", b"b", b"b"]


def test_a_broker_that_lost_the_session_numbers_anew_and_no_id_of_the_old_session_is_held(side: Side) -> None:
    """Issue 39: a QoS 2 publication answered with PUBREC whose PUBREL never came (the broker was killed) leaves
    its packet id answered. A broker restarted without persistence gives Session Present 0 and numbers its
    messages from 1 again; MQTT 5 (section 4.1.0) has the client discard its session state then. A new message
    under that id is acknowledged at once, not held for a PUBREL that will never come (a Receive Maximum slot
    lost, the message left unacknowledged at the broker)."""
    assert side.receive(qos2_publish(5, b"old life")) == b""
    side.adapter.acknowledge([(5, 2)])
    assert read_all(side.peer) == ack(0x50, 5)  # PUBREC; the broker dies before its PUBREL
    side.reconnect(session_present=False)
    read_all(side.peer)  # the subscriptions of the new session
    assert side.receive(qos2_publish(5, b"new life")) == b""  # handed over ...
    side.adapter.acknowledge([(5, 2)])
    assert read_all(side.peer) == ack(0x50, 5)  # ... and acknowledged at once: nothing held
    assert side.client.acks_held == 0
    assert side.receive(ack(0x62, 5)) == ack(0x70, 5)
    assert [item.payload for item in side.items if isinstance(item, Publication)] == [b"old life", b"new life"]


def test_after_a_lost_session_a_dup_copy_under_an_old_answered_id_is_handed_over(side: Side) -> None:
    """The repeat rule (a DUP PUBLISH under an id we answered is the broker missing our PUBREC) holds only within
    one broker session: in a new one, that id answered before names nothing, and a DUP copy (the new session's
    message sent again after a reconnection that kept it) is a message to hand over, not to drop."""
    side.receive(qos2_publish(9, b"old life"))
    side.adapter.acknowledge([(9, 2)])
    read_all(side.peer)
    side.reconnect(session_present=False)
    read_all(side.peer)
    side.reconnect(session_present=True)  # the new session, kept across a second reconnection
    read_all(side.peer)
    assert side.receive(qos2_publish(9, b"new life", dup=True)) == b""
    assert [item.payload for item in side.items if isinstance(item, Publication)] == [b"old life", b"new life"]


def test_acknowledgements_held_behind_a_lost_session_are_forgotten(side: Side) -> None:
    """A reused id's acknowledgement held for the PUBREL of the message before it: without the session that
    message is gone, and so is what waited for it."""
    side.receive(qos2_publish(3, b"a"))
    side.adapter.acknowledge([(3, 2)])
    side.receive(qos2_publish(3, b"b"))  # reused before its PUBREL: its PUBREC is held
    side.adapter.acknowledge([(3, 2)])
    read_all(side.peer)
    assert side.client.acks_held == 1
    side.reconnect(session_present=False)
    read_all(side.peer)
    assert side.receive(ack(0x62, 3)) == ack(0x70, 3)  # a stray PUBREL completes, and releases nothing held


# ------------------------------------------------------------------ retained injections (issue 39, item 4)


class Gate:
    """A `RetainedWrites` that admits everything and notes what was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[PublicationId, bool]] = []

    def admit(self, injection: Injection, exact: bool = True) -> bool:
        self.asked.append((injection.publication, exact))
        return True


def retained(seq: int, qos: int) -> Injection:
    return Injection(f"r/{seq}", b"v%d" % seq, qos, True, None, (ORIGIN, 1, seq))


def qos0_publish(topic: bytes, payload: bytes, retain: bool = False) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic + b"\0" + payload
    return bytes([0x31 if retain else 0x30, len(body)]) + body


def test_a_retained_injection_is_applied_at_its_answer_in_order_with_the_local_publications(side: Side) -> None:
    """federation.daemon.retained_order: the broker answers in the order it processes, so a local write read
    before the answer came first, one read after came later; the runtime must see them in that order."""
    gate = Gate()
    side.adapter.injector.retained = gate
    side.adapter.publish_all([retained(1, qos=1)])
    assert gate.asked == [((ORIGIN, 1, 1), True)]
    [packet] = split_packets(read_all(side.peer))
    mid = mid_of(packet)
    side.receive(qos0_publish(b"r/1", b"local-before", retain=True) + ack(0x40, mid)
                 + qos0_publish(b"r/1", b"local-after", retain=True))
    order = [("applied", item.publication) if isinstance(item, RetainedApplied) else ("local", item.payload)
             for item in side.items if isinstance(item, (RetainedApplied, Publication))]
    assert order == [("local", b"local-before"), ("applied", (ORIGIN, 1, 1)), ("local", b"local-after")]


def test_a_qos0_retained_injection_is_followed_by_a_pingreq_whose_pingresp_applies_it(side: Side) -> None:
    gate = Gate()
    side.adapter.injector.retained = gate
    side.adapter.publish_all([retained(2, qos=0), retained(3, qos=0)])
    assert gate.asked == [((ORIGIN, 1, 2), False), ((ORIGIN, 1, 3), False)]  # a PINGRESP is not an exact answer
    written = split_packets(read_all(side.peer))
    assert [packet[0] for packet in written] == [0x31, 0x31, 0xC0]  # two retained PUBLISH, then one PINGREQ
    assert not any(isinstance(item, RetainedApplied) for item in side.items)
    side.receive(b"\xd0\x00")  # PINGRESP
    assert [item.publication for item in side.items if isinstance(item, RetainedApplied)] == [(ORIGIN, 1, 2),
                                                                                             (ORIGIN, 1, 3)]


def test_a_qos0_retained_injection_whose_answer_cannot_come_is_applied_when_the_connection_drops(side: Side) -> None:
    side.adapter.injector.retained = Gate()
    side.adapter.publish_all([retained(4, qos=0)])
    read_all(side.peer)
    side.reconnect(session_present=True)
    assert [item.publication for item in side.items if isinstance(item, RetainedApplied)] == [(ORIGIN, 1, 4)]


def test_retained_injections_need_no_answer_without_a_gate(side: Side) -> None:
    """Only the runtime asks for the order (its gate): without one nothing is added to the connection."""
    side.adapter.publish_all([retained(5, qos=0)])
    assert [packet[0] for packet in split_packets(read_all(side.peer))] == [0x31]


# ------------------------------------------------------------------ the broker's Receive Maximum


class WindowBroker:
    """What `FlowControl` reads of the adapter: a broker announcing `receive_maximum`, completing on demand."""

    on_loop = True
    output_blocked = False
    max_qos = 2

    def __init__(self, receive_maximum: int) -> None:
        self.receive_maximum = receive_maximum
        self.connected = True
        self.unfinished: list[Injection] = []
        self.handed: list[Injection] = []
        self.most_unfinished = 0

    def backlog(self) -> int:
        return len(self.unfinished)

    def injection_window(self) -> int:
        return max(0, self.receive_maximum - len(self.unfinished)) if self.connected else 0

    def publish_all(self, items: Sequence[Injection]) -> None:
        self.handed += items
        self.unfinished += [item for item in items if item.qos]
        self.most_unfinished = max(self.most_unfinished, len(self.unfinished))

    def complete(self, count: int) -> None:
        del self.unfinished[:count]


def test_qos12_injections_never_exceed_the_receive_maximum_and_wait_in_order() -> None:
    node = Node(ORIGIN, [], 1, random.Random(1))
    flow = FlowControl()
    broker = WindowBroker(20)
    made = [injection(seq, qos=seq % 3) for seq in range(1, 301)]  # QoS 0, 1 and 2 mixed
    flow.inject(node, broker, 0.0, made[:150])  # type: ignore[arg-type]
    flow.inject(node, broker, 0.0, made[150:])  # type: ignore[arg-type]
    assert len(broker.unfinished) == 20 and broker.handed == made[:len(broker.handed)]
    assert made[len(broker.handed)].qos  # the QoS 0 ones behind the first that waits wait too: order is kept
    while len(broker.handed) < len(made):
        broker.complete(7)
        flow.inject(node, broker, 0.0)  # type: ignore[arg-type]  # what a read pass with completions calls
        assert broker.most_unfinished <= 20
    assert broker.handed == made and not len(flow.injection_queue) and not node.drops


def test_nothing_is_handed_over_while_the_broker_is_not_connected() -> None:
    node = Node(ORIGIN, [], 1, random.Random(1))
    flow = FlowControl()
    broker = WindowBroker(20)
    broker.connected = False
    made = [injection(seq, qos=seq % 2) for seq in range(1, 11)]
    flow.inject(node, broker, 0.0, made)  # type: ignore[arg-type]
    assert broker.handed == [] and len(flow.injection_queue) == 10
    broker.connected = True
    flow.inject(node, broker, 0.0)  # type: ignore[arg-type]
    assert broker.handed == made
