"""Numbers from the network are range-checked; a node's own epoch only moves within its range (issue 22).

docs/protocol.md "Ranges". Two nodes in memory (tests/node_harness.py); node 2 plays a key holder and sends
node 1 records that name node 1's own address, at each edge of the ranges. Node 1 must never adopt what it
cannot count past (the zombie: a record with epoch 2^64-1 made it jump to 2^64, and msgpack raised
OverflowError on every send after), and must keep working: its next packets encode and its neighbour keeps it.
"""

from __future__ import annotations

import random

import msgpack
import pytest

from federation.protocol import wire
from federation.protocol.node import Node
from federation.protocol.types import BrokerId

from node_harness import Harness, address

MAX_EPOCH, MAX_JUMP_EPOCH, MAX_SEQ = wire.MAX_EPOCH, wire.MAX_JUMP_EPOCH, wire.MAX_SEQ


def pair() -> Harness:
    harness = Harness([(1, 2)])
    harness.run(5.0)
    assert harness.nodes[1].neighbours.get(address(2)) is not None
    assert len(harness.nodes[1].table.routes.members) == 2
    return harness


def send_record_about_1(harness: Harness, epoch: int, seq: int) -> None:
    """Node 2's address sends node 1 a record of node 1's address, encoded by hand (any number msgpack takes)."""
    victim = harness.nodes[1]
    sender = harness.nodes[2]
    data = msgpack.packb([wire.FEDERATE, wire.PROTOCOL_VERSION,
                          [sender.identity.vid, address(2).host, address(2).port, sender.identity.epoch],
                          [victim.identity.vid, address(1).host, address(1).port, epoch, seq, 0, 0,
                           [[address(2).host, address(2).port]]]], use_bin_type=True)
    victim.receive_packet(data, address(2), harness.now)
    harness.flush(1)


def still_working(harness: Harness) -> None:
    """Node 1 sends (everything it makes encodes) and node 2 keeps seeing it up, for a few hello intervals."""
    harness.run(harness.now + 5 * harness.settings.hello_interval)
    assert harness.nodes[2].neighbours.get(address(1)).up  # type: ignore[union-attr]
    assert len(harness.nodes[2].table.routes.members) == 2
    assert 0 <= harness.nodes[1].identity.epoch <= MAX_EPOCH and harness.nodes[1].table.own_seq <= MAX_SEQ


@pytest.mark.parametrize(("epoch", "seq"), [(2**64 - 1, 1), (MAX_EPOCH + 1, 1), (2**53 + 1, 1), (1, 2**64 - 1),
                                            (1, MAX_SEQ + 1)])
def test_the_zombie_record_and_every_number_past_the_ranges_is_dropped_at_decode(epoch: int, seq: int) -> None:
    harness = pair()
    victim = harness.nodes[1]
    before = victim.identity.epoch, victim.table.own_seq
    send_record_about_1(harness, epoch, seq)
    assert victim.drops["out_of_range"] == 1
    assert (victim.identity.epoch, victim.table.own_seq) == before
    dropped = [e for e in harness.events if e["type"] == "packet_dropped" and e["node"] == str(address(1))]
    assert dropped and dropped[-1]["reason"] == "out_of_range"
    still_working(harness)


def test_a_newer_epoch_below_the_jump_limit_is_jumped_past() -> None:
    harness = pair()
    send_record_about_1(harness, MAX_JUMP_EPOCH - 1, 5)
    assert harness.nodes[1].identity.epoch == MAX_JUMP_EPOCH  # the highest a jump reaches
    still_working(harness)
    held = harness.nodes[2].table.lsdb.records[address(1)].record
    assert held.epoch == MAX_JUMP_EPOCH  # its new life is what its neighbour believes


@pytest.mark.parametrize("epoch", [MAX_JUMP_EPOCH, MAX_JUMP_EPOCH + 1, MAX_EPOCH])
def test_a_record_that_cannot_be_jumped_past_is_refused_not_adopted(epoch: int) -> None:
    harness = pair()
    victim = harness.nodes[1]
    before = victim.identity.epoch, victim.table.own_seq
    send_record_about_1(harness, epoch, 1)
    assert victim.drops["own_epoch_exhausted"] == 1 and victim.drops["out_of_range"] == 0
    assert (victim.identity.epoch, victim.table.own_seq) == before
    assert victim.table.lsdb.records[address(1)].record.epoch == before[0]  # its own record, not the forgery
    still_working(harness)


def test_the_same_epoch_takes_the_seq_unless_none_is_left_after_it() -> None:
    harness = pair()
    victim = harness.nodes[1]
    epoch = victim.identity.epoch
    send_record_about_1(harness, epoch, MAX_SEQ - 1)
    assert victim.identity.epoch == epoch and victim.table.own_seq >= MAX_SEQ - 1
    still_working(harness)
    assert victim.table.own_seq == MAX_SEQ  # it originated once more: the last seq of the epoch
    send_record_about_1(harness, epoch, MAX_SEQ)  # not newer than ours now: nothing
    assert victim.identity.epoch == epoch
    fresh = pair()
    send_record_about_1(fresh, fresh.nodes[1].identity.epoch, MAX_SEQ)  # the last seq: the next epoch instead
    assert fresh.nodes[1].identity.epoch == epoch + 1 and fresh.nodes[1].table.own_seq <= 1
    still_working(fresh)


def test_at_the_jump_limit_the_last_seq_of_its_epoch_is_refused() -> None:
    harness = Harness([(1, 2)])
    harness.kill(1)
    harness.epochs[1] = MAX_JUMP_EPOCH - 1
    harness.start(1)  # epoch MAX_JUMP_EPOCH: no jump left
    harness.run(5.0)
    victim = harness.nodes[1]
    assert victim.identity.epoch == MAX_JUMP_EPOCH
    send_record_about_1(harness, MAX_JUMP_EPOCH, MAX_SEQ)
    assert victim.drops["own_epoch_exhausted"] == 1 and victim.identity.epoch == MAX_JUMP_EPOCH
    still_working(harness)


def test_a_node_takes_only_an_epoch_of_the_range() -> None:
    for epoch in (0, MAX_EPOCH):
        assert Node(address(1), [], epoch, random.Random(1)).identity.epoch == epoch
    for epoch in (-1, MAX_EPOCH + 1, 2**64):
        with pytest.raises(ValueError, match="Ranges"):
            Node(address(1), [], epoch, random.Random(1))


@pytest.mark.parametrize(("field", "value", "accepted"), [
    ("sender.epoch", MAX_EPOCH, True), ("sender.epoch", MAX_EPOCH + 1, False),
    ("hl.seq", MAX_SEQ, True), ("hl.seq", MAX_SEQ + 1, False),
    ("hl.sent_at", 2.0**40, True), ("hl.sent_at", 2.0**40 + 1, False), ("hl.sent_at", float("inf"), False),
    ("hl.sent_at", -1.0, False),
])
def test_hello_numbers_at_their_edges(field: str, value: float, accepted: bool) -> None:
    sender = [1, "h", 1, 1]
    fields: list[object] = [1, 2.0]
    if field == "sender.epoch":
        sender[3] = int(value)
    elif field == "hl.seq":
        fields[0] = int(value)
    else:
        fields[1] = value
    data = msgpack.packb([wire.HELLO, wire.PROTOCOL_VERSION, sender, *fields])
    if accepted:
        wire.decode(data)
    else:
        with pytest.raises(wire.DecodeError) as caught:
            wire.decode(data)
        assert caught.value.reason == "out_of_range"


@pytest.mark.parametrize(("kind", "fields", "bad"), [
    (wire.CORE_ANNOUNCEMENT, [[1, "h", 1], MAX_EPOCH, MAX_SEQ, wire.MAX_DISTANCE], [2, 3]),
    (wire.TOPIC_CORE, ["a/#", [1, "h", 1], MAX_EPOCH, MAX_SEQ, wire.MAX_DISTANCE, 0], [2, 3]),
    (wire.TOPIC_ACK, ["a/#", ["h", 1], MAX_EPOCH, MAX_SEQ, []], [2, 3]),
    (wire.DATABASE_SUMMARY, [[["h", 1, MAX_EPOCH, MAX_SEQ]]], []),
    (wire.DATABASE_DIGEST, [wire.MAX_COUNT, list(range(16))], [0]),
    (wire.HELLO_BACK, [MAX_SEQ, 2.0**40, 2.0**40], [0, 1, 2]),
    (wire.TOPIC_BATCH, ["a/#", ["h", 1], MAX_EPOCH, 0, 0, [MAX_SEQ, "a/b", b""]], [2]),
    (wire.TOPIC_MESSAGE, ["a/#", ["h", 1], MAX_EPOCH, MAX_SEQ, 0, 0, [MAX_EPOCH - 1, MAX_SEQ], "a/b", b"", 0, False,
                          None], [2, 3]),
])
def test_each_epoch_seq_count_and_time_is_accepted_at_its_edge_and_refused_past_it(
        kind: str, fields: list[object], bad: list[int]) -> None:
    header = [kind, wire.PROTOCOL_VERSION, [1, "h", 1, 1]]
    wire.decode(msgpack.packb(header + fields, use_bin_type=True))
    for index in bad:
        over = list(fields)
        value = over[index]
        over[index] = value + 1 if isinstance(value, int) else float("inf")
        with pytest.raises(wire.DecodeError) as caught:
            wire.decode(msgpack.packb(header + over, use_bin_type=True))
        assert caught.value.reason == "out_of_range", (kind, index)


def test_a_distance_saturates_instead_of_leaving_its_range() -> None:
    assert wire.further(0) == 1 and wire.further(wire.MAX_DISTANCE - 1) == wire.MAX_DISTANCE
    assert wire.further(wire.MAX_DISTANCE) == wire.MAX_DISTANCE
    harness = pair()
    far = BrokerId(77, address(77))
    record = wire.LinkStateRecord(far, 1, 1, wire.MAX_DISTANCE, 0, ())
    harness.nodes[1].receive_packet(wire.encode(wire.FEDERATE, wire.Sender(harness.nodes[2].identity.broker_id,
                                                                            harness.nodes[2].identity.epoch),
                                                wire.Federate(record)), address(2), harness.now)
    harness.flush(1)
    assert harness.nodes[1].table.lsdb.records[address(77)].record.distance == wire.MAX_DISTANCE
    harness.run(harness.now + 1.0)
    assert harness.nodes[2].drops["out_of_range"] == 0  # what node 1 forwarded decodes
