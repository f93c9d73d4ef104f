from __future__ import annotations

import random

import msgpack
import pytest

from federation.protocol import wire, wire_decode
from federation.protocol.types import Address, BrokerId
from federation.protocol.wire import DecodeError

SENDER = wire.Sender(BrokerId(3, Address("10.0.0.1", 10500)), 7)
CORE = BrokerId(1, Address("10.0.0.9", 10500))
RECORD = wire.LinkStateRecord(SENDER.broker_id, 7, 2, 1, 0, (Address("10.0.0.2", 10500), Address("::1", 1)))

SAMPLES: list[tuple[str, wire.Body]] = [
    (wire.HELLO, wire.Hello(1, 12.5)),
    (wire.HELLO_BACK, wire.HelloBack(1, 12.5, 13.0)),
    (wire.FEDERATE, wire.Federate(RECORD)),
    (wire.TOPOLOGY_UPDATE, wire.TopologyUpdate((RECORD, RECORD))),
    (wire.DATABASE_DIGEST, wire.DatabaseDigest(3, tuple(range(0, 2**64 - 1, 2**60)))),
    (wire.DATABASE_SUMMARY, wire.DatabaseSummary((wire.SummaryEntry(Address("10.0.0.2", 10500), 7, 2),
                                                  wire.SummaryEntry(Address("::1", 1), wire.MAX_EPOCH, wire.MAX_SEQ)))),
    (wire.DATABASE_SUMMARY, wire.DatabaseSummary(())),
    (wire.DATABASE_REQUEST, wire.DatabaseRequest((Address("10.0.0.2", 10500), Address("::1", 1)))),
    (wire.RECONSIDER, wire.Reconsider(CORE, SENDER.broker_id)),
    (wire.CORE_ANNOUNCEMENT, wire.CoreAnnouncement(CORE, 1, 2, 3)),
    (wire.TOPIC_CORE, wire.TopicCore("a/+/c", CORE, 1, 2, 3, 0)),
    (wire.RECONSIDER_TOPIC_CORE, wire.TopicCore("a/#", CORE, 1, 2, 3, wire.FLAG_WITHDRAWN)),
    (wire.TOPIC_CORE, wire.TopicCore("#", CORE, 1, 2, 3, 0, 21000)),           # a capability-ranked claim
    (wire.TOPIC_CORE, wire.TopicCore("kitchen/#", CORE, 1, 2, 3, wire.FLAG_OWNER)),  # an ownership announcement
    (wire.TOPIC_SUBSCRIBE, wire.TopicSubscribe("a/#", CORE, wire.FLAG_PRUNE)),
    (wire.TOPIC_DIGEST, wire.TopicDigest(wire.SET_RECORDED, 3, 0xABC, tuple(range(16)), (2**64 - 1,) * 16)),
    (wire.TOPIC_REQUEST, wire.TopicRequest(wire.SET_MEMBERSHIPS, 15, 16**15 - 1)),
    (wire.TOPIC_SUBSCRIPTIONS, wire.TopicSubscriptions(2, 7, False, (wire.TopicSubscribe("a/+", CORE, 2),))),
    (wire.TOPIC_ACK, wire.TopicAck("a/#", Address("10.0.0.1", 10500), 7, 9)),
    (wire.RECEIVER_BUSY, wire.ReceiverBusy(0.2)),
    (wire.RECEIVER_BUSY, wire.ReceiverBusy(0.0)),
    (wire.TOPIC_MESSAGE, wire.TopicMessage("a/#", Address("10.0.0.1", 10500), 7, 9, wire.MODE_IN_MESH, 2,
                                           "a/b c", b"\x00\xff" * 10, 1, True,
                                           {"user_property": [["k", "v"]], "content_type": "text/plain"})),
    (wire.TOPIC_MESSAGE, wire.TopicMessage("a/#", Address("h", 1), 0, 0, 0, 0, "a", b"", 0, False, None)),
    (wire.TOPIC_BATCH, wire.TopicBatch("a/#", Address("h", 1), 0, 1, 3, [1, "a/b", b"x", 2, "a/c c", b""])),
    (wire.TOPIC_MESSAGE, wire.TopicMessage("$share/g/a/#", Address("h", 1), 7, 9, wire.MODE_TO_MEMBER, 1, "a/b",
                                           b"p", 2, False, None, None, Address("10.0.0.3", 10500))),
    (wire.TOPIC_ACK, wire.TopicAck("$share/g/a/#", Address("10.0.0.1", 10500), 7, 9)),
    (wire.SHARED_GROUPS, wire.SharedGroups(Address("10.0.0.2", 10500), 7, 3, (("g", "a/#"), ("h", "+/b")))),
    (wire.SHARED_GROUPS, wire.SharedGroups(Address("10.0.0.2", 10500), 7, 4, ())),
]


@pytest.mark.parametrize("kind,body", SAMPLES, ids=[s[0] for s in SAMPLES])
def test_round_trip(kind: str, body: wire.Body) -> None:
    data = wire.encode(kind, SENDER, body)
    packet = wire.decode(data)
    assert packet.type == kind and packet.sender == SENDER and packet.body == body
    assert wire.packet_type(data) == kind


def reason(data: bytes, **limits: int) -> str:
    with pytest.raises(DecodeError) as caught:
        wire.decode(data, **limits)
    return caught.value.reason


def test_topic_digests_are_strict() -> None:
    header = ["td", 5, [1, "h", 1, 1]]
    counts, hashes = list(range(16)), [0] * 16
    assert wire.decode(msgpack.packb([*header, 0, 1, 15, counts, hashes])).body == \
        wire.TopicDigest(0, 1, 15, tuple(counts), tuple(hashes))
    assert reason(msgpack.packb([*header, 3, 0, 0, counts, hashes])) == "out_of_range"  # no such set
    assert reason(msgpack.packb([*header, 0, 1, 16, counts, hashes])) == "out_of_range"  # a path of 2 nibbles
    assert reason(msgpack.packb([*header, 0, 15, 0, counts, hashes])) == "out_of_range"  # children past the depth
    assert reason(msgpack.packb([*header, 0, 0, 0, counts[:15], hashes[:15]])) == "wrong_type"  # 1 or 16
    assert reason(msgpack.packb([*header, 0, 0, 0, counts[:1], hashes])) == "wrong_type"
    assert wire.decode(msgpack.packb([*header, 2, 0, 0, [7], [9]])).body == wire.TopicDigest(2, 0, 0, (7,), (9,))
    assert reason(msgpack.packb([*header, 0, 0, 0, counts, [-1] * 16])) == "out_of_range"
    assert reason(msgpack.packb(["tr", 5, [1, "h", 1, 1], 2, 0, 0])) == "out_of_range"  # a record is not asked for
    tz = ["tz", 5, [1, "h", 1, 1], 1, 3]
    assert reason(msgpack.packb([*tz, 1, [["a/+", [1, "h", 1], 0]]])) == "wrong_type"  # complete is a boolean
    assert reason(msgpack.packb([*tz, True, [["a/#/b", [1, "h", 1], 0]]])) == "bad_filter"
    assert reason(msgpack.packb([*tz, True, [["a/b", [1, "h", 1]]]])) == "wrong_type"


def test_strict_rejections_have_reasons() -> None:
    good = wire.encode(wire.HELLO, SENDER, wire.Hello(1, 2.0))
    assert reason(b"") == "malformed"
    assert reason(good[:-1]) == "malformed"
    assert reason(good + b"\x00") == "malformed"
    assert reason(msgpack.packb({"a": 1})) == "malformed"
    assert reason(msgpack.packb(["zz", 5, [1, "h", 1, 1]])) == "unknown_type"
    assert reason(msgpack.packb(["hl", 1, [1, "h", 1, 1], 1, 2.0])) == "version"  # a version 1 node
    assert reason(msgpack.packb(["hl", 2, [1, "h", 1, 1], 1, 2.0])) == "version"  # version 2: no `tq`, `tk`
    assert reason(msgpack.packb(["hl", 3, [1, "h", 1, 1], 1, 2.0])) == "version"  # version 3: claims refreshed
    assert reason(msgpack.packb(["hl", 4, [1, "h", 1, 1], 1, 2.0])) == "version"  # version 4: no reach, no repair
    assert reason(msgpack.packb(["hl", 6, [1, "h", 1, 1], 1, 2.0])) == "version"
    assert reason(msgpack.packb(["hl", 5, [1, "h", 1, 1], "x", 2.0])) == "wrong_type"
    assert reason(msgpack.packb(["hl", 5, [1, "h", 1, 1], 1])) == "wrong_length"
    assert reason(msgpack.packb(["hl", 5, [-1, "h", 1, 1], 1, 2.0])) == "out_of_range"
    assert reason(msgpack.packb(["hl", 5, [1, "h", 70000, 1], 1, 2.0])) == "out_of_range"
    assert reason(msgpack.packb(["hl", 5, [1, "h", 1, 1], 1, float("nan")])) == "wrong_type"
    assert reason(good, max_packet=5) == "oversized"
    tm = msgpack.packb(["tm", 5, [1, "h", 1, 1], "f", ["h", 1], 0, 0, 0, 0, None, "t", "not-bytes", 0, False,
                         None])
    assert reason(tm) == "wrong_type"
    tm = msgpack.packb(["tm", 5, [1, "h", 1, 1], "f", ["h", 1], 0, 0, 0, 0, None, "t", b"", 3, False, None])
    assert reason(tm) == "out_of_range"
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
    bad_filter = msgpack.packb(["ts", 5, [1, "h", 1, 1], "a/#/b", [1, "h", 1], 0])
    assert reason(bad_filter) == "bad_filter"
    system = msgpack.packb(["tc", 5, [1, "h", 1, 1], "$SYS/#", [1, "h", 1], 1, 1, 0, 0])
    assert reason(system) == "bad_filter"
    tm = msgpack.packb(["tm", 5, [1, "h", 1, 1], "a/#", ["h", 1], 0, 0, 0, 0, None, "a/+", b"", 0, False, None])
    assert reason(tm) == "bad_topic"


def test_topic_core_rank_is_an_optional_seventh_field() -> None:
    plain = wire.encode(wire.TOPIC_CORE, SENDER, wire.TopicCore("a/#", CORE, 1, 2, 3, 0))
    assert len(msgpack.unpackb(plain)) == 3 + 6  # rank 0 is left off: the v1 layout
    ranked = wire.encode(wire.TOPIC_CORE, SENDER, wire.TopicCore("a/#", CORE, 1, 2, 3, 0, 5))
    assert msgpack.unpackb(ranked)[-1] == 5
    explicit_zero = msgpack.packb(["tc", 5, [1, "h", 1, 1], "a/#", [1, "h", 1], 1, 1, 0, 0, 0])
    body = wire.decode(explicit_zero).body
    assert isinstance(body, wire.TopicCore) and body.rank == 0
    assert reason(msgpack.packb(["tc", 5, [1, "h", 1, 1], "a/#", [1, "h", 1], 1, 1, 0, 0, -1])) == "out_of_range"
    assert reason(msgpack.packb(["rt", 5, [1, "h", 1, 1], "a/#", [1, "h", 1], 1, 1, 0, 0, 1, 2])) == "wrong_length"
    assert reason(msgpack.packb(["tc", 5, [1, "h", 1, 1], "a/#", [1, "h", 1], 1, 1, 0])) == "wrong_length"


def test_hello_back_carries_the_three_clock_stamps() -> None:
    """hb = [echo_seq, t1 (the hello's sent_at, echoed), t2 = t3 (replied_at, the replier's clock)]."""
    data = wire.encode(wire.HELLO_BACK, SENDER, wire.HelloBack(4, 1_763_700_000.125, 1_763_700_000.5))
    assert msgpack.unpackb(data)[3:] == [4, 1_763_700_000.125, 1_763_700_000.5]  # unix times keep sub-ms precision
    assert reason(msgpack.packb(["hb", 5, [1, "h", 1, 1], 4, 1.0, float("nan")])) == "wrong_type"
    assert reason(msgpack.packb(["hb", 5, [1, "h", 1, 1], 4, 1.0])) == "wrong_length"


def test_database_messages_are_validated() -> None:
    sender = [1, "h", 1, 1]
    sixteen = list(range(16))
    assert isinstance(wire.decode(msgpack.packb(["dd", 5, sender, 0, sixteen])).body, wire.DatabaseDigest)
    assert reason(msgpack.packb(["dd", 5, sender, 0, sixteen[:15]])) == "wrong_type"  # exactly 16 buckets
    assert reason(msgpack.packb(["dd", 5, sender, 0, sixteen[:15] + [-1]])) == "out_of_range"
    assert reason(msgpack.packb(["dd", 5, sender, -1, sixteen])) == "out_of_range"
    assert reason(msgpack.packb(["dd", 5, sender, wire.MAX_COUNT + 1, sixteen])) == "out_of_range"
    assert reason(msgpack.packb(["dd", 5, sender, 0])) == "wrong_length"
    assert reason(msgpack.packb(["ds", 5, sender, [["h", 1, 1]]])) == "wrong_type"
    assert reason(msgpack.packb(["ds", 5, sender, [["h", 70000, 1, 1]]])) == "out_of_range"
    assert reason(msgpack.packb(["ds", 5, sender, [[1, 1, 1, 1]]])) == "wrong_type"
    assert reason(msgpack.packb(["dr", 5, sender, [["h"]]])) == "wrong_type"
    assert reason(msgpack.packb(["dr", 5, sender, "h"])) == "wrong_type"
    assert reason(msgpack.packb(["dr", 5, sender, [], []])) == "wrong_length"


def test_record_fast_path_accepts_exactly_what_the_checked_path_accepts() -> None:
    """`_fast_record` skips the per-field names; it must never accept what `_record_of` rejects."""
    rng = random.Random(11)
    good = msgpack.unpackb(msgpack.packb(wire._record(RECORD)))
    replacements: list[object] = [-1, 0, 1, 255, 256, 65535, 65536, 2**64 - 1, "", "x" * 256, "h", None, 1.5, True,
                                  [], ["h"], ["h", 1], ["h", 1, 2], [["h", 1]], [["h", -1]], [["h" * 300, 1]],
                                  [[1, 1]], [["h", 1]] * 9]
    agreed = {"accepted": 0, "rejected": 0}
    for _ in range(5000):
        value = [list(item) if isinstance(item, list) else item for item in good]
        for _ in range(rng.randint(1, 2)):
            if value and rng.random() < 0.8:
                value[rng.randrange(len(value))] = rng.choice(replacements)
            else:
                value = value[: rng.randrange(9)]
        fast = wire_decode._fast_record(value, 8)
        try:
            checked = wire_decode._record_of(value, "r", 8)
        except DecodeError:
            assert fast is None, value
            agreed["rejected"] += 1
            continue
        assert fast == checked and type(fast.origin.address) is Address, value
        agreed["accepted"] += 1
    assert agreed["accepted"] > 100 and agreed["rejected"] > 1000


def test_topic_ack_is_strict() -> None:
    """`ta` = [filter, origin addr, epoch, seq, reach] (docs/protocol.md); anything else is dropped with a reason."""
    header = ["ta", 5, [1, "h", 1, 1]]
    good = wire.decode(msgpack.packb(header + ["a/#", ["10.0.0.1", 10500], 7, 9, [["10.0.0.2", 10500]]]))
    assert good.body == wire.TopicAck("a/#", Address("10.0.0.1", 10500), 7, 9, (Address("10.0.0.2", 10500),))
    assert good.body.publication == (Address("10.0.0.1", 10500), 7, 9)
    repair = wire.decode(msgpack.packb(header + ["$repair/10.0.0.2/10500/a/#", ["10.0.0.1", 10500], 7, 9, []]))
    assert repair.body == wire.TopicAck("$repair/10.0.0.2/10500/a/#", Address("10.0.0.1", 10500), 7, 9, ())
    for fields, reason in [(["a/#", ["h", 1], 7, 9], "wrong_length"), (["a/#", ["h", 1], -1, 9, []], "out_of_range"),
                           (["a/#/b", ["h", 1], 7, 9, []], "bad_filter"),
                           (["$SYS/#", ["h", 1], 7, 9, []], "bad_filter"),
                           (["a/#", ["h", 70000], 7, 9, []], "out_of_range"),
                           (["a/#", ["h", 1], 7, 9, [["h", 70000]]], "out_of_range"),
                           (["a/#", ["h", 1], 7, 9, "h"], "wrong_type"),
                           (["a/#", ["h", 1], 7, 9, [["h", 1]] * (wire.MAX_REACH + 1)], "out_of_range"),
                           (["$repair/h/x/a/#", ["h", 1], 7, 9, []], "bad_filter"),
                           (["$repair/h/1/a/#/b", ["h", 1], 7, 9, []], "bad_filter")]:
        with pytest.raises(wire.DecodeError) as caught:
            wire.decode(msgpack.packb(header + fields))
        assert caught.value.reason == reason, fields


def test_receiver_busy_is_strict() -> None:
    """`rb` = [hold seconds], 0 to 3600 (docs/protocol.md); anything else is dropped with a reason."""
    header = ["rb", 5, [1, "h", 1, 1]]
    assert wire.decode(msgpack.packb(header + [1])).body == wire.ReceiverBusy(1.0)
    for fields, reason in [([], "wrong_length"), ([0.2, 1], "wrong_length"), ([-0.1], "out_of_range"),
                           ([3601.0], "out_of_range"), ([float("nan")], "wrong_type"), ([float("inf")], "out_of_range"),
                           (["0.2"], "wrong_type"), ([True], "wrong_type")]:
        with pytest.raises(wire.DecodeError) as caught:
            wire.decode(msgpack.packb(header + fields))
        assert caught.value.reason == reason, fields


def test_record_size_is_the_encoded_size() -> None:
    rng = random.Random(4)
    for _ in range(2000):
        host = rng.choice(["h", "10.0.0.1", "é" * rng.randint(0, 40), "x" * rng.randint(0, 255), "::1"])
        neighbours = tuple(Address(rng.choice([host, "a" * rng.randint(0, 70)]), rng.randint(0, 65535))
                           for _ in range(rng.choice([0, 1, 4, 15, 16, 40])))
        values = [rng.choice([0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, wire.MAX_EPOCH, wire.MAX_SEQ,
                              2**64 - 1]) for _ in range(4)]
        record = wire.LinkStateRecord(BrokerId(values[0], Address(host, rng.randint(0, 65535))), values[1], values[2],
                                      rng.choice([0, 127, 128, 65535]), rng.choice([0, 1, 255]), neighbours)
        assert wire.record_size(record) == len(msgpack.packb(wire._record(record), use_bin_type=True)), record


def test_shared_group_packets_are_strict() -> None:
    """A mode 2 `tm` names a shared filter and a target, and only it; `sg` groups are (name, federated filter)."""
    origin, target = Address("h", 1), Address("10.0.0.3", 10500)

    def tm(filter_: str, mode: int, target: Address | None) -> bytes:
        return wire.encode(wire.TOPIC_MESSAGE, SENDER, wire.TopicMessage(filter_, origin, 7, 9, mode, 0, "a/b", b"",
                                                                         1, False, None, None, target))

    assert reason(tm("$share/g/a/#", wire.MODE_IN_MESH, None)) == "bad_filter"
    assert reason(tm("a/#", wire.MODE_TO_MEMBER, target)) == "bad_filter"
    assert reason(tm("$share/g/$SYS/#", wire.MODE_TO_MEMBER, target)) == "bad_filter"
    assert reason(tm("$share/g/a/#", wire.MODE_TO_MEMBER, None)) == "wrong_length"
    assert reason(tm("a/#", wire.MODE_IN_MESH, target)) == "wrong_length"
    assert reason(wire.encode(wire.TOPIC_ACK, SENDER, wire.TopicAck("$share/g", origin, 7, 9))) == "bad_filter"

    def sg(*groups: list[object]) -> bytes:
        return msgpack.packb([wire.SHARED_GROUPS, wire.PROTOCOL_VERSION, [3, "10.0.0.1", 10500, 7], ["h", 1], 7, 3,
                              list(groups)], use_bin_type=True)

    assert wire.decode(sg(["g", "a/#"])).body == wire.SharedGroups(origin, 7, 3, (("g", "a/#"),))
    assert reason(sg(["g/x", "a"])) == "bad_filter"
    assert reason(sg(["g+", "a"])) == "bad_filter"
    assert reason(sg(["g", "a/#/b"])) == "bad_filter"
    assert reason(sg(["g", "$SYS/#"])) == "bad_filter"
    assert reason(sg(["g"])) == "wrong_type"
