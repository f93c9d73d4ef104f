"""The retained stores' anti-entropy (docs/protocol.md rule 10, `rd`, `rs`, `rr`, `rv`): the digest kept as a store
changes, strict decoding of the four packets, and neighbours whose stores differ ending with the newest value of
every topic (deletions included), each carried with its original version; nothing is sent without retained
values, and one exchange is bounded."""

from __future__ import annotations

import msgpack
import pytest

from federation.protocol import wire
from federation.protocol.retained_sync import MAX_SUMMARY, MAX_VALUES, MemoryRetainedIndex, RetainedVersions
from federation.protocol.types import Address, BrokerId
from federation.protocol.wire_types import (
    RetainedCopy,
    RetainedDigest,
    RetainedEntry,
    RetainedRequest,
    RetainedSummary,
    RetainedValues,
    RetainedVersion,
    Sender,
)

from node_harness import Harness, address

SENDER = Sender(BrokerId(1, Address("10.0.0.1", 10500)), 3)


def version(origin: int, seq: int, origin_ms: int = 0, epoch: int = 1) -> RetainedVersion:
    return (origin_ms, epoch, seq, address(origin).host, address(origin).port)


def copy(topic: str, v: RetainedVersion, payload: bytes = b"v") -> RetainedCopy:
    return RetainedCopy(topic, v, 1, payload, {"federation_origin_ms": v[0]} if v[0] else None)


def reason(data: bytes) -> str:
    with pytest.raises(wire.DecodeError) as error:
        wire.decode(data)
    return error.value.reason


def test_the_digest_depends_on_the_versions_held_not_on_the_order_they_came_in() -> None:
    one, other = RetainedVersions(), RetainedVersions()
    one.put("a", version(1, 1))
    one.put("b", version(1, 2))
    one.put("a", version(2, 5))  # replaced: the old version's hash is taken out
    other.put("b", version(1, 2))
    other.put("a", version(2, 5))
    assert one.digest() == other.digest() and one.digest().count == 2
    other.put("c", version(1, 3))
    assert one.digest() != other.digest()
    other.remove("c")
    other.remove("c")  # twice: nothing more
    assert one.digest() == other.digest()
    assert [entry.topic for entry in one.entries(frozenset(range(wire.DIGEST_BUCKETS)))] == ["a", "b"]
    assert RetainedVersions().digest() == RetainedDigest(0, (0,) * wire.DIGEST_BUCKETS)


def test_the_four_packets_round_trip_and_are_decoded_strictly() -> None:
    bodies = [RetainedDigest(2, tuple(range(16))),
              RetainedSummary((RetainedEntry("s/a", version(1, 2, 1_700_000_000_000)),)),
              RetainedRequest(("s/a", "s/b")),
              RetainedValues((copy("s/a", version(1, 2, 5)), RetainedCopy("s/b", version(2, 1), 0, b"", None)))]
    for kind, body in zip((wire.RETAINED_DIGEST, wire.RETAINED_SUMMARY, wire.RETAINED_REQUEST,
                           wire.RETAINED_VALUES), bodies, strict=True):
        packet = wire.decode(wire.encode(kind, SENDER, body))
        assert (packet.type, packet.body) == (kind, body)
    sender = [1, "h", 1, 1]
    entry = ["s/a", 0, 1, 2, "h", 1]
    value = [*entry, 1, b"v", None]
    assert reason(msgpack.packb(["rd", 5, sender, 0, list(range(15))])) == "wrong_type"
    assert reason(msgpack.packb(["rd", 5, sender, wire.MAX_COUNT + 1, list(range(16))])) == "out_of_range"
    assert reason(msgpack.packb(["rs", 5, sender, [entry[:5]]])) == "wrong_type"
    assert reason(msgpack.packb(["rs", 5, sender, [["s/+", *entry[1:]]]])) == "bad_topic"
    assert reason(msgpack.packb(["rs", 5, sender, [["s/a", -1, *entry[2:]]]])) == "out_of_range"
    assert reason(msgpack.packb(["rs", 5, sender, [["s/a", 0, wire.MAX_EPOCH + 1, *entry[3:]]]])) == "out_of_range"
    assert reason(msgpack.packb(["rs", 5, sender, [["s/a", 0, 1, wire.MAX_SEQ + 1, "h", 1]]])) == "out_of_range"
    assert reason(msgpack.packb(["rs", 5, sender, [["s/a", 0, 1, 2, "h", 70000]]])) == "out_of_range"
    assert reason(msgpack.packb(["rr", 5, sender, ["s/#"]])) == "bad_topic"
    assert reason(msgpack.packb(["rr", 5, sender, "s/a"])) == "wrong_type"
    assert reason(msgpack.packb(["rv", 5, sender, [[*entry, 3, b"v", None]]])) == "out_of_range"
    assert reason(msgpack.packb(["rv", 5, sender, [[*entry, 1, "v", None]]])) == "wrong_type"
    assert reason(msgpack.packb(["rv", 5, sender, [[*entry, 1, b"v", "p"]]])) == "wrong_type"
    assert reason(msgpack.packb(["rv", 5, sender, [value], []])) == "wrong_length"


class StoringHarness(Harness):
    """Every node has a retained store that keeps what its broker is given with retain (newest wins), as the
    wrapper's does."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.stores: dict[int, MemoryRetainedIndex] = {}
        self.sent_packets: list[bytes] = []
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def start(self, index: int) -> object:
        node = super().start(index)
        node.attach_retained(self.stores.setdefault(index, MemoryRetainedIndex()))
        return node

    def lose(self, data: bytes, source: Address, target: int) -> bool:
        self.sent_packets.append(data)
        return False

    def flush(self, index: int) -> None:
        node = self.nodes.get(index)
        if node is not None:
            injections = node.injections_to_make()
            for injection in injections:
                if injection.retain:
                    origin, epoch, seq = injection.publication
                    props = injection.properties or {}
                    self.stores[index].offer(RetainedCopy(injection.topic, (props.get("federation_origin_ms", 0),
                                             epoch, seq, origin.host, origin.port), injection.qos,
                                             injection.payload, injection.properties))
            node.outbox.injections[:0] = injections  # the harness records them as usual
        super().flush(index)


def test_neighbours_whose_stores_differ_end_with_the_newest_value_of_every_topic() -> None:
    h = StoringHarness([(0, 1), (1, 2)])
    h.stores[0].offer(copy("s/a", version(0, 9, 2000), b"newest"))
    h.stores[0].offer(copy("s/gone", version(0, 10, 3000), b""))  # a deletion, newer than node 2's value
    h.stores[0].offer(copy("s/b", version(0, 1, 1000), b"old"))
    h.stores[2].offer(copy("s/a", version(2, 50, 1000), b"old"))
    h.stores[2].offer(copy("s/gone", version(2, 51, 2500), b"value"))
    h.stores[2].offer(copy("s/b", version(2, 52, 1500), b"newer"))
    h.stores[2].offer(copy("s/c", version(2, 53, 1500), b"only here"))
    h.run(3 * h.settings.announce_interval + 1)
    expected = {"s/a": (version(0, 9, 2000), b"newest"), "s/gone": (version(0, 10, 3000), b""),
                "s/b": (version(2, 52, 1500), b"newer"), "s/c": (version(2, 53, 1500), b"only here")}
    for index, store in h.stores.items():
        assert {t: (c.version, c.payload) for t, c in store.copies.items()} == expected, index
    assert h.stores[0].retained_versions.digest() == h.stores[2].retained_versions.digest()
    # each value came as an injection with retain and its original publication id, never twice to one node (a
    # node may first get a value that is newer than its own and later the newest, from its other neighbour)
    brought = [(index, i.publication) for index, i in h.delivered]
    assert len(brought) == len(set(brought))
    assert all(i.retain and i.filter is None for _, i in h.delivered)
    assert {(index, i.topic) for index, i in h.delivered} >= {(0, "s/b"), (0, "s/c"), (2, "s/a"), (2, "s/gone")}
    (newest,) = [i for index, i in h.delivered if index == 2 and i.topic == "s/a"]
    assert newest.publication == (address(0), 1, 9) and newest.properties == {"federation_origin_ms": 2000}
    # converged: the digests agree and nothing more than digests is sent
    before = {index: dict(node.sent_by_type) for index, node in h.nodes.items()}
    h.run(h.now + 2 * h.settings.announce_interval)
    for index, node in h.nodes.items():
        assert {k: node.sent_by_type[k] - before[index].get(k, 0) for k in ("rs", "rr", "rv")} == \
            {"rs": 0, "rr": 0, "rv": 0}


def test_without_retained_values_nothing_is_sent_for_them() -> None:
    h = StoringHarness([(0, 1), (1, 2)])
    h.run(3 * h.settings.announce_interval)
    assert all(not node.sent_by_type[kind] for node in h.nodes.values() for kind in ("rd", "rs", "rr", "rv"))


def test_a_node_with_an_empty_store_answers_a_digest_with_its_own_and_gets_everything() -> None:
    h = StoringHarness([(0, 1)])
    h.stores[0].offer(copy("s/a", version(0, 1)))
    h.run(2 * h.settings.announce_interval)
    assert h.nodes[1].sent_by_type["rd"] >= 1 and h.nodes[1].sent_by_type["rr"] == 1
    assert set(h.stores[1].copies) == {"s/a"}


def test_one_exchange_is_bounded_and_a_large_store_still_comes_over() -> None:
    h = StoringHarness([(0, 1)])
    topics = MAX_SUMMARY + 100
    for seq in range(topics):
        h.stores[0].offer(copy(f"s/{seq:04}", version(0, seq + 1)))
    interval = h.settings.announce_interval
    h.run(0.5 * interval)  # the exchange when the link came up: one digest each way
    received = h.nodes[0].received_by_type
    summaries = [wire.decode(data).body for data in h.sent_packets]
    summarised = sum(len(body.entries) for body in summaries if isinstance(body, RetainedSummary))
    assert received["rd"] == 1 and summarised == MAX_SUMMARY
    assert 0 < len(h.stores[1].copies) <= MAX_SUMMARY  # at most MAX_VALUES per summary or request packet
    assert h.nodes[1].counters["retained_values_injected"] == len(h.stores[1].copies)
    assert h.nodes[0].counters["retained_values_sent"] <= (received["rr"] + received["rs"]) * MAX_VALUES
    h.run(h.now + 4 * interval)
    assert len(h.stores[1].copies) == topics
