from __future__ import annotations

import random

import msgpack
import pytest

from federation import wire
from federation.types import Address, BrokerId
from federation.wire import DecodeError

SENDER = wire.Sender(BrokerId(3, Address("10.0.0.1", 10500)), 7)
CORE = BrokerId(1, Address("10.0.0.9", 10500))
RECORD = wire.LinkStateRecord(SENDER.broker_id, 7, 2, 1, 0, (Address("10.0.0.2", 10500), Address("::1", 1)))

SAMPLES: list[tuple[str, wire.Body]] = [
    (wire.HELLO, wire.Hello(1, 12.5)),
    (wire.HELLO_BACK, wire.HelloBack(1, 12.5, 13.0)),
    (wire.FEDERATE, wire.Federate(RECORD)),
    (wire.TOPOLOGY_UPDATE, wire.TopologyUpdate((RECORD, RECORD))),
    (wire.RECONSIDER, wire.Reconsider(CORE, SENDER.broker_id)),
    (wire.CORE_ANNOUNCEMENT, wire.CoreAnnouncement(CORE, 1, 2, 3)),
    (wire.TOPIC_CORE, wire.TopicCore("a/+/c", CORE, 1, 2, 3, 0)),
    (wire.RECONSIDER_TOPIC_CORE, wire.TopicCore("a/#", CORE, 1, 2, 3, wire.FLAG_WITHDRAWN)),
    (wire.TOPIC_SUBSCRIBE, wire.TopicSubscribe("a/#", CORE, wire.FLAG_PRUNE)),
    (wire.TOPIC_MESSAGE, wire.TopicMessage("a/#", Address("10.0.0.1", 10500), 7, 9, wire.MODE_IN_MESH, 2,
                                           "a/b c", b"\x00\xff" * 10, 1, True,
                                           {"user_property": [["k", "v"]], "content_type": "text/plain"})),
    (wire.TOPIC_MESSAGE, wire.TopicMessage("a/#", Address("h", 1), 0, 0, 0, 0, "a", b"", 0, False, None)),
]


@pytest.mark.parametrize("kind,body", SAMPLES, ids=[s[0] for s in SAMPLES])
def test_round_trip(kind: str, body: wire.Body) -> None:
    data = wire.encode(kind, SENDER, body)
    packet = wire.decode(data)
    assert packet.type == kind and packet.sender == SENDER and packet.body == body
    assert wire.packet_type(data) == kind


def test_publication_id_of_tm_only() -> None:
    kind, body = SAMPLES[-2]
    assert isinstance(body, wire.TopicMessage)
    assert wire.publication_id_of(wire.encode(kind, SENDER, body)) == (Address("10.0.0.1", 10500), 7, 9)
    assert wire.publication_id_of(wire.encode(*SAMPLES[0][:1], SENDER, SAMPLES[0][1])) is None


def reason(data: bytes, **limits: int) -> str:
    with pytest.raises(DecodeError) as caught:
        wire.decode(data, **limits)
    return caught.value.reason


def test_strict_rejections_have_reasons() -> None:
    good = wire.encode(wire.HELLO, SENDER, wire.Hello(1, 2.0))
    assert reason(b"") == "malformed"
    assert reason(good[:-1]) == "malformed"
    assert reason(good + b"\x00") == "malformed"
    assert reason(msgpack.packb({"a": 1})) == "malformed"
    assert reason(msgpack.packb(["zz", 1, [1, "h", 1, 1]])) == "unknown_type"
    assert reason(msgpack.packb(["hl", 2, [1, "h", 1, 1], 1, 2.0])) == "version"
    assert reason(msgpack.packb(["hl", 1, [1, "h", 1, 1], "x", 2.0])) == "wrong_type"
    assert reason(msgpack.packb(["hl", 1, [1, "h", 1, 1], 1])) == "wrong_length"
    assert reason(msgpack.packb(["hl", 1, [-1, "h", 1, 1], 1, 2.0])) == "wrong_type"
    assert reason(msgpack.packb(["hl", 1, [1, "h", 70000, 1], 1, 2.0])) == "wrong_type"
    assert reason(msgpack.packb(["hl", 1, [1, "h", 1, 1], 1, float("nan")])) == "wrong_type"
    assert reason(good, max_packet=5) == "oversized"
    tm = msgpack.packb(["tm", 1, [1, "h", 1, 1], "f", ["h", 1], 0, 0, 0, 0, "t", "not-bytes", 0, False, None])
    assert reason(tm) == "wrong_type"
    tm = msgpack.packb(["tm", 1, [1, "h", 1, 1], "f", ["h", 1], 0, 0, 0, 0, "t", b"", 3, False, None])
    assert reason(tm) == "wrong_type"
    many = wire.LinkStateRecord(SENDER.broker_id, 1, 1, 0, 0, tuple(Address("h", p) for p in range(1, 40)))
    assert reason(wire.encode(wire.FEDERATE, SENDER, wire.Federate(many)), max_neighbours=8) == "too_many_neighbours"


def test_random_mutations_never_raise_anything_else() -> None:
    rng = random.Random(5)
    encoded = [wire.encode(kind, SENDER, body) for kind, body in SAMPLES]
    outcomes = {"ok": 0, "dropped": 0}
    for _ in range(20000):
        data = bytearray(rng.choice(encoded))
        for _ in range(rng.randint(1, 4)):
            action = rng.random()
            position = rng.randrange(len(data)) if data else 0
            if action < 0.5 and data:
                data[position] = rng.randrange(256)
            elif action < 0.75:
                del data[position:position + rng.randint(1, 3)]
            else:
                data[position:position] = bytes([rng.randrange(256)])
        try:
            wire.decode(bytes(data))
            outcomes["ok"] += 1
        except DecodeError:
            outcomes["dropped"] += 1
    assert outcomes["dropped"] > 10000


def test_filters_and_topics_from_peers_are_validated() -> None:
    bad_filter = msgpack.packb(["ts", 1, [1, "h", 1, 1], "a/#/b", [1, "h", 1], 0])
    assert reason(bad_filter) == "bad_filter"
    system = msgpack.packb(["tc", 1, [1, "h", 1, 1], "$SYS/#", [1, "h", 1], 1, 1, 0, 0])
    assert reason(system) == "bad_filter"
    tm = msgpack.packb(["tm", 1, [1, "h", 1, 1], "a/#", ["h", 1], 0, 0, 0, 0, "a/+", b"", 0, False, None])
    assert reason(tm) == "bad_topic"
