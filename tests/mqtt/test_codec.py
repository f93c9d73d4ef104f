"""federation.mqtt's codec: byte fixtures from the MQTT specifications, paho's bytes for the same packets, every
packet both ways at both protocol levels, the data path's run helpers against the general path, and what a
malformed packet is refused for."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from federation.mqtt import runs
from federation.mqtt.codec import (
    MQTT_5,
    MQTT_311,
    PUBACK,
    PUBCOMP,
    PUBREC,
    PUBREL,
    Ack,
    Auth,
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
    UnsubAck,
    Unsubscribe,
    Will,
    decode_all,
    decode_packet,
    encode,
    encode_publish,
)
from federation.mqtt.errors import MALFORMED_PACKET, PROTOCOL_ERROR, RemoteProtocolError
from federation.mqtt.properties import PROPERTIES, Properties, decode_properties, encode_properties

# ------------------------------------------------------------------ fixtures written from the specifications


def test_connect_fixtures() -> None:
    # MQTT 3.1.1 section 3.1: "MQTT", level 4, clean session, keepalive 60, client id "c1"
    assert encode(Connect("c1", MQTT_311, True, 60), MQTT_311) == bytes.fromhex(
        "10 0e 0004 4d515454 04 02 003c 0002 6331")
    # MQTT 5: the same with an empty property list, then session expiry 3600 and receive maximum 1024 (0x11, 0x21)
    assert encode(Connect("c1", MQTT_5, True, 60), MQTT_5) == bytes.fromhex(
        "10 0f 0004 4d515454 05 02 003c 00 0002 6331")
    connect = Connect("c1", MQTT_5, False, 30, {"session_expiry_interval": 3600, "receive_maximum": 1024},
                      "user", b"pw")
    assert encode(connect, MQTT_5) == bytes.fromhex(
        "10 21 0004 4d515454 05 c0 001e 08 11 00000e10 21 0400 0002 6331 0004 75736572 0002 7077")


def test_connack_and_publish_fixtures() -> None:
    connack = bytes.fromhex("20 09 01 00 06 21 0014 22 000a")  # session present, receive maximum 20, alias max 10
    assert decode_packet(connack, 0, MQTT_5) == (
        ConnAck(True, 0, {"receive_maximum": 20, "topic_alias_maximum": 10}), len(connack))
    assert decode_packet(bytes.fromhex("20 02 00 05"), 0, MQTT_311) == (ConnAck(False, 5), 4)
    # a 3.1.1 broker's refusal of a v5 CONNECT: two bytes, no properties
    assert decode_packet(bytes.fromhex("20 02 00 01"), 0, MQTT_5) == (ConnAck(False, 1), 4)
    publish = bytes.fromhex("3b 0f 0003 612f62 0007 05 02 0000003c 6869")  # QoS 1, DUP, retain, expiry 60, "hi"
    assert decode_packet(publish, 0, MQTT_5) == (
        Publish("a/b", b"hi", 1, True, True, 7, {"message_expiry_interval": 60}), len(publish))
    assert decode_packet(bytes.fromhex("34 09 0003 612f62 0007 6869"), 0, MQTT_311) == (
        Publish("a/b", b"hi", 2, False, False, 7), 11)


def test_acknowledgement_fixtures() -> None:
    assert encode(Ack(PUBACK, 258), MQTT_5) == bytes.fromhex("40 02 0102")  # success: no reason code (as paho)
    assert encode(Ack(PUBREL, 258), MQTT_5) == bytes.fromhex("62 02 0102")
    assert encode(Ack(PUBREC, 258, 0x87), MQTT_5) == bytes.fromhex("50 03 0102 87")
    assert encode(Ack(PUBREC, 258, 0x87), MQTT_311) == bytes.fromhex("50 02 0102")
    assert decode_packet(bytes.fromhex("40 03 0102 10"), 0, MQTT_5) == (Ack(PUBACK, 258, 0x10), 5)
    assert decode_packet(bytes.fromhex("70 08 0102 92 04 1f 0001 78"), 0, MQTT_5) == (
        Ack(PUBCOMP, 258, 0x92, {"reason_string": "x"}), 10)
    assert encode(Disconnect(), MQTT_5) == b"\xe0\x00"
    assert encode(Disconnect(0x8D), MQTT_5) == b"\xe0\x01\x8d"
    assert encode(PingReq(), MQTT_5) == b"\xc0\x00"


def test_subscribe_fixtures() -> None:
    options = SubscriptionOptions(qos=2, no_local=True, retain_as_published=True, retain_handling=2)
    assert encode(Subscribe(1, [("#", options)]), MQTT_5) == bytes.fromhex("82 07 0001 00 0001 23 2e")
    assert encode(Subscribe(1, [("#", options)]), MQTT_311) == bytes.fromhex("82 06 0001 0001 23 02")
    assert decode_packet(bytes.fromhex("90 05 0001 00 02 80"), 0, MQTT_5) == (SubAck(1, [2, 0x80]), 7)
    assert decode_packet(bytes.fromhex("b0 02 0001"), 0, MQTT_311) == (UnsubAck(1, []), 4)


# ------------------------------------------------------------------ paho's bytes for the same packets


def paho_properties(kind: int, **values: object) -> PahoProperties:
    properties = PahoProperties(kind)  # type: ignore[no-untyped-call]
    for name, value in values.items():
        setattr(properties, name, value)
    return properties


def test_properties_are_packed_as_paho_packs_them() -> None:
    ours: Properties = {"payload_format_indicator": 1, "message_expiry_interval": 20, "content_type": "text/plain",
                        "response_topic": "r/t", "correlation_data": b"\x00\x01",
                        "user_property": [("a", "1"), ("b", "2")]}
    theirs = paho_properties(PacketTypes.PUBLISH, PayloadFormatIndicator=1, MessageExpiryInterval=20,
                             ContentType="text/plain", ResponseTopic="r/t", CorrelationData=b"\x00\x01",
                             UserProperty=[("a", "1"), ("b", "2")])
    assert encode_properties(ours) == theirs.pack()
    connect = paho_properties(PacketTypes.CONNECT, SessionExpiryInterval=3600, ReceiveMaximum=1024)
    assert encode_properties({"receive_maximum": 1024, "session_expiry_interval": 3600}) == connect.pack()
    assert decode_properties(theirs.pack(), 0, len(theirs.pack())) == (ours, len(theirs.pack()))


def test_subscription_options_are_paho_s() -> None:
    for qos in (0, 1, 2):
        for flags in range(8):
            for handling in (0, 1, 2):
                theirs = SubscribeOptions(qos=qos, noLocal=bool(flags & 1), retainAsPublished=bool(flags & 2),
                                          retainHandling=handling)
                ours = SubscriptionOptions(qos, bool(flags & 1), bool(flags & 2), handling)
                assert bytes((ours.encode(MQTT_5),)) == theirs.pack()


# ------------------------------------------------------------------ every packet both ways


EVERY_PACKET: list[Packet] = [
    Connect("client", MQTT_5, False, 30, {"session_expiry_interval": 10}, "u", b"p",
            Will("w/t", b"gone", 1, True, {"will_delay_interval": 5})),
    ConnAck(True, 0, {"receive_maximum": 7, "maximum_qos": 1, "assigned_client_identifier": "x"}),
    Publish("t", b"", 0), Publish("a/b/c", b"x" * 300, 2, True, True, 65535, {"user_property": [("k", "v")]}),
    Ack(PUBACK, 1, 0x10), Ack(PUBREC, 2), Ack(PUBREL, 3, 0x92), Ack(PUBCOMP, 4),
    Subscribe(5, [("a/+", SubscriptionOptions(1)), ("#", SubscriptionOptions(2, True, True, 2))],
              {"subscription_identifier": [3]}),
    SubAck(5, [1, 0x80]), Unsubscribe(6, ["a/+", "#"]), UnsubAck(6, [0, 0x11]), PingReq(), PingResp(),
    Disconnect(0x04, {"reason_string": "bye"}), Auth(0x18, {"authentication_method": "m"}),
]


@pytest.mark.parametrize("packet", EVERY_PACKET, ids=lambda packet: type(packet).__name__)
def test_every_packet_round_trips_at_mqtt_5(packet: Packet) -> None:
    data = encode(packet, MQTT_5)
    assert decode_packet(data, 0, MQTT_5) == (packet, len(data))
    assert decode_packet(data[:-1], 0, MQTT_5) is None  # not whole yet


def without_v5(packet: Packet) -> Packet:
    """What `packet` is at MQTT 3.1.1: no properties, no reason codes but a SUBACK's."""
    if isinstance(packet, Connect):
        will = packet.will and Will(packet.will.topic, packet.will.payload, packet.will.qos, packet.will.retain)
        return Connect(packet.client_id, MQTT_311, packet.clean_start, packet.keepalive, None, packet.username,
                       packet.password, will)
    if isinstance(packet, Subscribe):
        return Subscribe(packet.packet_id, [(name, SubscriptionOptions(options.qos))
                                            for name, options in packet.filters])
    if isinstance(packet, UnsubAck):
        return UnsubAck(packet.packet_id, [])
    if isinstance(packet, Ack):
        return Ack(packet.kind, packet.packet_id)
    if isinstance(packet, (Disconnect, Auth)):
        return type(packet)()
    if hasattr(packet, "properties"):
        fields = {name: getattr(packet, name) for name in packet.__slots__}  # type: ignore[union-attr]
        fields["properties"] = None
        return type(packet)(**fields)
    return packet


@pytest.mark.parametrize("packet", EVERY_PACKET, ids=lambda packet: type(packet).__name__)
def test_every_packet_round_trips_at_mqtt_311(packet: Packet) -> None:
    plain = without_v5(packet)
    data = encode(plain, MQTT_311)
    assert decode_packet(data, 0, MQTT_311) == (plain, len(data))


TOPICS = st.text(st.characters(blacklist_characters="+#\x00", blacklist_categories=["Cs"]), min_size=1, max_size=40)


@given(TOPICS, st.binary(max_size=300), st.integers(0, 2), st.booleans(), st.integers(1, 65535),
       st.sampled_from((MQTT_311, MQTT_5)))
def test_publish_round_trips(topic: str, payload: bytes, qos: int, retain: bool, packet_id: int, protocol: int) -> None:
    publish = Publish(topic, payload, qos, retain, bool(qos) and retain, packet_id if qos else 0)
    data = encode_publish(publish, protocol)
    assert decode_packet(data, 0, protocol) == (publish, len(data))


# ------------------------------------------------------------------ the data path's runs against the general path


@pytest.mark.parametrize("protocol", [MQTT_311, MQTT_5])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_append_publishes_builds_what_encode_builds(protocol: int, qos: int) -> None:
    topics = ["a", "b/" + "x" * 200, "ü/c"]
    payloads = [b"", b"p" * 20000, b"\x00"]
    ids = [1, 65535, 7] if qos else []
    out = bytearray()
    assert runs.append_publishes(out, topics, payloads, qos, qos == 1, ids, protocol) == 3
    expected = b"".join(
        encode_publish(Publish(topic, payload, qos, qos == 1, False, ids[index] if qos else 0), protocol)
        for index, (topic, payload) in enumerate(zip(topics, payloads, strict=True)))
    assert bytes(out) == expected


def test_append_publishes_stops_at_a_topic_that_cannot_be_published() -> None:
    out = bytearray()
    assert runs.append_publishes(out, ["ok", "a/+", "ok"], [b"1", b"2", b"3"], 1, False, [1, 2, 3], MQTT_5) == 1
    assert decode_all(out, MQTT_5) == [Publish("ok", b"1", 1, False, False, 1)]


def test_puback_runs() -> None:
    data = bytes.fromhex("40 02 0001 40 03 0002 10 40 02 0003 50 02 0004")
    assert runs.parse_puback_run(data, 0, 10, MQTT_5) == (13, [1, 2, 3], [0, 0x10, 0])
    assert runs.parse_puback_run(data, 0, 2, MQTT_5) == (9, [1, 2], [0, 0x10])
    assert runs.parse_puback_run(data, 0, 10, MQTT_311) == (4, [1], [0])  # 3.1.1 has no reason codes
    assert runs.parse_puback_run(data[:3], 0, 10, MQTT_5) == (0, [], [])


# ------------------------------------------------------------------ malformed packets


@pytest.mark.parametrize(("data", "reason"), [
    ("30 ff ff ff ff 01", MALFORMED_PACKET),  # a remaining length of five bytes
    ("36 05 0001 61 0001", MALFORMED_PACKET),  # QoS 3
    ("38 04 0001 61 00", PROTOCOL_ERROR),  # DUP at QoS 0
    ("32 06 0001 61 0000 00", PROTOCOL_ERROR),  # packet id 0
    ("30 04 0001 23 00", PROTOCOL_ERROR),  # a wildcard in a topic name
    ("30 04 0001 ff 00", MALFORMED_PACKET),  # not UTF-8
    ("30 06 0001 61 02 7f 00", MALFORMED_PACKET),  # an unknown property
    ("30 0a 0001 61 06 23 0001 23 0002", PROTOCOL_ERROR),  # topic alias twice
    ("41 02 0001", MALFORMED_PACKET),  # reserved flags of a PUBACK
    ("60 02 0001", MALFORMED_PACKET),  # a PUBREL without its flags
    ("20 03 02 00 00", MALFORMED_PACKET),  # CONNACK flags' reserved bits
    ("d0 01 00", MALFORMED_PACKET),  # bytes left over in a PINGRESP
    ("00 00", MALFORMED_PACKET),  # packet type 0
])
def test_malformed_packets_are_refused_with_a_reason(data: str, reason: int) -> None:
    with pytest.raises(RemoteProtocolError) as refused:
        decode_packet(bytes.fromhex(data), 0, MQTT_5)
    assert refused.value.reason_code == reason


def test_encoding_refuses_what_mqtt_does_not_allow() -> None:
    for topic in ("", "a/#", "a/+/b"):
        with pytest.raises(ValueError, match="cannot publish"):
            encode_publish(Publish(topic, b""), MQTT_5)
    with pytest.raises(ValueError, match="unknown MQTT 5 properties"):
        encode_properties({"no_such_property": 1})
    with pytest.raises(ValueError, match="integer of 0 to 65535"):
        encode_properties({"receive_maximum": 70000})


def test_the_property_table_has_every_identifier_once() -> None:
    identifiers = [identifier for identifier, _name, _kind, _repeats in PROPERTIES]
    assert identifiers == sorted(set(identifiers)) and len(identifiers) == 27
