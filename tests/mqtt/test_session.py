"""federation.mqtt's session in memory: the test plays the broker with the codec, on a virtual clock, and scripts a
conversation (connect, subscribe, QoS 0/1/2 both ways, flow control, keepalive, resumption with and without the
session, a broker that breaks MQTT). tests/real/test_mqtt_session_real.py runs it against Mosquitto and paho."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.mqtt.codec import (
    MQTT_5,
    MQTT_311,
    PUBACK,
    PUBCOMP,
    PUBREC,
    PUBREL,
    Ack,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    Publish,
    SubAck,
    Subscribe,
    SubscriptionOptions,
    decode_all,
    encode,
)
from federation.mqtt.errors import LocalProtocolError
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
)
from federation.mqtt.session import MqttSession, SessionSettings, State

PACKAGE = Path(__file__).resolve().parents[2] / "federation" / "mqtt"


class Wire:
    """A session and the test as its broker, in memory; `now` is the virtual clock."""

    def __init__(self, **options: object) -> None:
        self.session = MqttSession(SessionSettings("c", **options))  # type: ignore[arg-type]
        self.now = 1000.0

    @property
    def protocol(self) -> int:
        return self.session.protocol

    def sent(self) -> list[Packet]:
        """What the session has queued, as packets (and taken: written)."""
        return decode_all(self.session.data_to_send(self.now), self.protocol)

    def answer(self, *packets: Packet) -> list[Event]:
        return self.session.receive_data(b"".join(encode(packet, self.protocol) for packet in packets), self.now)

    def connect(self, session_present: bool = False, **properties: object) -> Connected:
        self.session.connect(self.now)
        connect = self.sent()
        assert len(connect) == 1 and isinstance(connect[0], Connect)
        events = self.answer(ConnAck(session_present, 0, dict(properties) or None))  # type: ignore[arg-type]
        assert len(events) == 1 and isinstance(events[0], Connected), events
        return events[0]

    def reconnect(self, session_present: bool, **properties: object) -> Connected:
        self.session.connection_lost()
        return self.connect(session_present, **properties)


def test_connect_offers_the_session_s_settings() -> None:
    wire = Wire(keepalive=30, clean_start=False, session_expiry=3600, receive_maximum=1024, username="u",
                password=b"p")
    wire.session.connect(wire.now)
    assert wire.sent() == [Connect("c", MQTT_5, False, 30, {"session_expiry_interval": 3600,
                                                            "receive_maximum": 1024}, "u", b"p")]
    events = wire.answer(ConnAck(False, 0, {"receive_maximum": 20, "server_keep_alive": 10}))
    assert events == [Connected(False, MQTT_5, 20, 10)]
    assert wire.session.state is State.CONNECTED and wire.session.send_quota == 20


def test_subscribe_and_unsubscribe() -> None:
    wire = Wire()
    wire.connect()
    options = SubscriptionOptions(qos=2, no_local=True)
    packet_id = wire.session.subscribe([("a/#", options)])
    assert wire.sent() == [Subscribe(packet_id, [("a/#", options)])]
    assert wire.answer(SubAck(packet_id, [2])) == [Subscribed(packet_id, (2,))]
    assert wire.answer(SubAck(99, [0])) == [] and wire.session.counts.unknown_acks == 1


def test_publishing_at_every_qos() -> None:
    wire = Wire()
    wire.connect()
    assert wire.session.publish("t", b"0") == 0
    first = wire.session.publish("t", b"1", qos=1)
    second = wire.session.publish("t", b"2", qos=2, retain=True, properties={"content_type": "x"})
    assert wire.sent() == [Publish("t", b"0"), Publish("t", b"1", 1, packet_id=first),
                           Publish("t", b"2", 2, True, packet_id=second, properties={"content_type": "x"})]
    assert wire.answer(Ack(PUBACK, first, 0x10), Ack(PUBREC, second)) == [Completed([first], [0x10]),
                                                                          Received(second, 0)]
    assert wire.sent() == [Ack(PUBREL, second)]  # queued behind the event: the caller journals first
    assert wire.answer(Ack(PUBREC, second)) == []  # a repeated PUBREC: the PUBREL again, no second event
    assert wire.sent() == [Ack(PUBREL, second)]
    assert wire.answer(Ack(PUBCOMP, second)) == [Completed([second], [0])]
    assert wire.session.in_flight() == ()


def test_a_refusing_pubrec_completes_without_a_pubrel() -> None:
    wire = Wire()
    wire.connect()
    packet_id = wire.session.publish("t", b"", qos=2)
    wire.sent()
    assert wire.answer(Ack(PUBREC, packet_id, 0x87)) == [Completed([packet_id], [0x87])]
    assert wire.sent() == [] and wire.session.counts.refused == 1


def test_plain_publications_come_as_runs_and_others_alone() -> None:
    wire = Wire(manual_ack=True)
    wire.connect()
    events = wire.answer(Publish("a", b"1"), Publish("b", b"2"), Publish("c", b"3", 1, packet_id=5),
                         Publish("d", b"4", 1, packet_id=6), Publish("e", b"5", 1, True, packet_id=7),
                         Publish("$SYS/x", b"6"), Publish("f", b"7", 2, packet_id=8))
    assert events == [MessageRun(["a", "b"], [b"1", b"2"], 0, []), MessageRun(["c", "d"], [b"3", b"4"], 1, [5, 6]),
                      Message("e", b"5", 1, True, False, 7, None), Message("$SYS/x", b"6", 0, False, False, 0, None),
                      Message("f", b"7", 2, False, False, 8, None)]
    assert wire.sent() == []  # manual: nothing acknowledged until the caller says
    assert wire.session.acknowledge([(5, 1), (6, 1), (7, 1), (8, 2)]) == 4
    assert wire.sent() == [Ack(PUBACK, 5), Ack(PUBACK, 6), Ack(PUBACK, 7), Ack(PUBREC, 8)]
    assert wire.answer(Ack(PUBREL, 8)) == []
    assert wire.sent() == [Ack(PUBCOMP, 8)]


def test_automatic_acknowledgements() -> None:
    wire = Wire()
    wire.connect()
    wire.answer(Publish("a", b"1", 1, packet_id=1), Publish("b", b"2", 1, True, packet_id=2),
                Publish("c", b"3", 2, packet_id=3))
    assert wire.sent() == [Ack(PUBACK, 1), Ack(PUBACK, 2), Ack(PUBREC, 3)]


def test_a_qos2_repeat_is_answered_not_handed_over_and_a_reused_id_waits_for_its_pubrel() -> None:
    wire = Wire(manual_ack=True)
    wire.connect()
    wire.answer(Publish("a", b"1", 2, packet_id=4))
    wire.session.acknowledge([(4, 2)])
    assert wire.sent() == [Ack(PUBREC, 4)]
    assert wire.answer(Publish("a", b"1", 2, dup=True, packet_id=4)) == []  # sent again: PUBREC again
    assert wire.sent() == [Ack(PUBREC, 4)] and wire.session.counts.duplicates_answered == 1
    # Mosquitto 2.0.11 reuses the id for a new message before our PUBCOMP (incoming.py): handed over, its
    # acknowledgement held until the PUBREL of the one before
    assert wire.answer(Publish("b", b"2", 1, packet_id=4)) == [MessageRun(["b"], [b"2"], 1, [4])]
    wire.session.acknowledge([(4, 1)])
    assert wire.sent() == [] and wire.session.acks.acks_held == 1
    wire.answer(Ack(PUBREL, 4))
    assert wire.sent() == [Ack(PUBCOMP, 4), Ack(PUBACK, 4)]


def test_flow_control_by_the_broker_s_receive_maximum() -> None:
    wire = Wire()
    wire.connect(receive_maximum=3)
    taken, ids = wire.session.publish_run(["t"] * 5, [b"%d" % n for n in range(5)], qos=1)
    assert (taken, ids) == (3, [1, 2, 3]) and wire.session.send_quota == 0
    with pytest.raises(LocalProtocolError, match="Receive Maximum"):
        wire.session.publish("t", b"x", qos=1)
    assert wire.session.publish("t", b"qos 0 is not counted") == 0
    assert len(wire.sent()) == 4
    wire.answer(Ack(PUBACK, 2))
    assert wire.session.send_quota == 1
    assert wire.session.publish_run(["t", "t"], [b"3", b"4"], qos=1) == (1, [4])


def test_a_resumed_session_sends_its_flights_again_in_order_within_the_new_receive_maximum() -> None:
    wire = Wire(clean_start=False, session_expiry=60)
    wire.connect()
    wire.session.publish_run(["a", "b", "c"], [b"1", b"2", b"3"], qos=2)
    wire.session.publish("d", b"4", qos=1)
    wire.sent()
    wire.answer(Ack(PUBREC, 1))
    wire.sent()
    connected = wire.reconnect(True, receive_maximum=2)
    assert connected.session_present and connected.resent == 2
    assert wire.sent() == [Ack(PUBREL, 1), Publish("b", b"2", 2, dup=True, packet_id=2)]
    assert wire.session.send_quota == 0  # two more wait to be sent again before anything new
    wire.answer(Ack(PUBCOMP, 1))
    assert wire.sent() == [Publish("c", b"3", 2, dup=True, packet_id=3)]
    wire.answer(Ack(PUBREC, 2))
    assert wire.sent() == [Ack(PUBREL, 2)]
    wire.answer(Ack(PUBCOMP, 2))
    assert wire.sent() == [Publish("d", b"4", 1, dup=True, packet_id=4)]


def test_a_session_lost_hands_its_flights_back_and_forgets_what_it_owed() -> None:
    wire = Wire(clean_start=False, session_expiry=60, manual_ack=True)
    wire.connect()
    wire.session.publish("a", b"1", qos=1)
    wire.session.publish("b", b"2", qos=2)
    wire.sent()
    wire.answer(Ack(PUBREC, 2), Publish("in", b"x", 2, packet_id=9), Publish("in", b"y", 1, packet_id=10))
    wire.session.acknowledge([(9, 2)])
    wire.sent()
    connected = wire.reconnect(False)
    assert connected.abandoned == (OutgoingMessage(1, "a", b"1", 1), OutgoingMessage(2, "b", b"2", 2, released=True))
    assert wire.sent() == [] and wire.session.in_flight() == ()
    # The broker restarted and numbers from 1 again: id 9 is a new message, not a repeat of the one we answered,
    # and an acknowledgement owed to the old session is not written (it would name the new session's message).
    assert wire.answer(Publish("new", b"z", 2, dup=True, packet_id=9)) == [Message("new", b"z", 2, False, True, 9,
                                                                                     None)]
    assert wire.session.acknowledge([(10, 1)]) == 0 and wire.session.acks.stale == 1
    wire.session.acknowledge([(9, 2)])
    assert wire.sent() == [Ack(PUBREC, 9)]


def test_restored_flights_are_sent_again_or_handed_back() -> None:
    journal = [OutgoingMessage(7, "a", b"1", 1), OutgoingMessage(8, "b", b"2", 2, released=True)]
    kept = Wire(clean_start=False, session_expiry=60)
    kept.session.restore(journal)
    assert kept.connect(True).resent == 2
    assert kept.sent() == [Publish("a", b"1", 1, dup=True, packet_id=7), Ack(PUBREL, 8)]
    assert kept.session.publish("c", b"3", qos=1) == 9
    lost = Wire(clean_start=False, session_expiry=60)
    lost.session.restore(journal)
    assert lost.connect(False).abandoned == tuple(journal)


def test_keepalive_pings_and_a_missing_pingresp_fails_the_connection() -> None:
    wire = Wire(keepalive=10)
    wire.connect()
    assert wire.session.get_timer() == wire.now + 10
    wire.now += 10
    assert wire.session.handle_timer(wire.now) == []
    assert wire.sent() == [PingReq()]
    assert wire.answer(PingResp()) == [PingAnswered(1)]
    assert wire.session.get_timer() == wire.now + 10
    wire.now += 10
    wire.session.handle_timer(wire.now)
    wire.sent()
    wire.now += 10
    events = wire.session.handle_timer(wire.now)
    assert [type(event) for event in events] == [ProtocolFailure] and wire.session.state is State.ERROR


def test_an_on_demand_ping_is_answered_in_order() -> None:
    wire = Wire(keepalive=0)
    wire.connect()
    wire.session.publish("t", b"", qos=0, retain=True)
    assert wire.session.ping(wire.now) == 1
    assert wire.sent() == [Publish("t", b"", 0, True), PingReq()]
    assert wire.session.get_timer() is None  # keepalive 0: nothing timed
    assert wire.answer(PingResp()) == [PingAnswered(1)]


def test_mqtt_311_is_offered_when_the_broker_does_not_speak_5() -> None:
    wire = Wire()
    wire.session.connect(wire.now)
    wire.sent()
    refused = wire.session.receive_data(bytes.fromhex("20 02 00 01"), wire.now)  # a 3.1.1 broker's refusal
    assert refused == [ConnectRefused(1, MQTT_5, True)] and wire.session.state is State.CLOSING
    wire.session.connection_lost()
    assert wire.connect().protocol == MQTT_311
    assert wire.session.publish("t", b"x", qos=1) == 1
    assert wire.session.data_to_send(wire.now) == bytes.fromhex("32 06 0001 74 0001 78")  # no properties


def test_a_malformed_packet_fails_the_connection_with_a_reason() -> None:
    wire = Wire()
    wire.connect()
    events = wire.session.receive_data(bytes.fromhex("30 04 0001 61 00 36 05 0001 61 0001"), wire.now)
    assert events[0] == MessageRun(["a"], [b""], 0, [])
    assert isinstance(events[1], ProtocolFailure) and events[1].reason_code == 0x81
    assert wire.sent() == [Disconnect(0x81)]
    with pytest.raises(LocalProtocolError, match="close the connection"):
        wire.session.receive_data(b"\xd0\x00", wire.now)


def test_packets_out_of_place_are_protocol_errors() -> None:
    wire = Wire()
    wire.session.connect(wire.now)
    wire.sent()
    events = wire.answer(PingResp())
    assert isinstance(events[0], ProtocolFailure) and events[0].reason_code == 0x82
    clean = Wire(clean_start=True)
    clean.session.connect(clean.now)
    clean.sent()
    assert isinstance(clean.answer(ConnAck(True))[0], ProtocolFailure)  # session present after a clean start


def test_the_broker_s_disconnect() -> None:
    wire = Wire()
    wire.connect()
    events = wire.answer(Disconnect(0x8B, {"reason_string": "shutting down"}))
    assert events == [BrokerDisconnected(0x8B, "shutting down")] and wire.session.state is State.CLOSING


def test_misuse_is_refused_and_changes_nothing() -> None:
    wire = Wire()
    with pytest.raises(LocalProtocolError, match="wait for Connected"):
        wire.session.publish("t", b"")
    wire.connect(maximum_qos=1, retain_available=0)
    for call in (lambda: wire.session.publish("a/+", b""), lambda: wire.session.publish("t", b"", qos=2),
                 lambda: wire.session.publish("t", b"", retain=True)):
        with pytest.raises(LocalProtocolError):
            call()
    assert wire.sent() == [] and wire.session.flights.last_id == 0


BROKER_STREAM = [Publish("a", b"1"), Publish("b", b"2", 1, packet_id=1), Publish("c", b"3", 2, packet_id=2),
                 Ack(PUBACK, 1), Publish("d", b"4", 1, packet_id=3), Publish("e", b"x" * 200), PingResp(),
                 Publish("f", b"6", 0, True, properties={"user_property": [("k", "v")]})]


def flatten(events: list[Event]) -> list[tuple[object, ...]]:
    """What the events say, a message at a time (runs may split differently with the bytes)."""
    flat: list[tuple[object, ...]] = []
    for event in events:
        if isinstance(event, MessageRun):
            ids = event.packet_ids or [0] * len(event.topics)
            flat += [("message", topic, payload, event.qos, ident)
                     for topic, payload, ident in zip(event.topics, event.payloads, ids, strict=True)]
        elif isinstance(event, Message):
            flat.append(("message", event.topic, event.payload, event.qos, event.packet_id))
        elif isinstance(event, Completed):
            flat += [("completed", ident) for ident in event.packet_ids]
        else:
            flat.append((event,))
    return flat


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=30))
def test_the_same_bytes_in_any_pieces_give_the_same_events(cuts: list[int]) -> None:
    def run(pieces: list[bytes]) -> list[tuple[object, ...]]:
        wire = Wire(manual_ack=True)
        wire.connect()
        wire.session.publish("mine", b"", qos=1)
        wire.sent()
        wire.session.ping(wire.now)
        events: list[Event] = []
        for piece in pieces:
            events += wire.session.receive_data(piece, wire.now)
        return flatten(events)

    stream = b"".join(encode(packet, MQTT_5) for packet in BROKER_STREAM)
    pieces, pos = [], 0
    for cut in cuts:
        pieces.append(stream[pos:pos + cut])
        pos += cut
    pieces.append(stream[pos:])
    assert run([piece for piece in pieces if piece]) == run([stream])


def test_the_session_imports_no_io() -> None:
    forbidden = {"socket", "asyncio", "threading", "time", "paho", "random", "selectors", "ssl"}
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert not {name for name in imported if name.split(".")[0] in forbidden}, path.name
