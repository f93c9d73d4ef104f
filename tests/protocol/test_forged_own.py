"""Forgeries of a node's own traffic that the node itself can recognise (found by the live fuzz, open mode).

* A publication claiming the node's own address and epoch, numbered past the last one it made: nobody else can
  make it legitimately. Taken in, it entered the duplicate caches of every node it reached, and the node's real
  publication of that number was then dropped there as a duplicate: acknowledged and never delivered.
* A hello back echoing a hello's seq with another send time: the round trip was taken from the echoed time, so a
  forged one set the neighbour's round trip to days (retransmission timeouts at their maximum, late hellos never
  noticed, claims held off for as long).
"""

from __future__ import annotations

import pytest

from federation.protocol import wire
from federation.protocol.types import BrokerId
from federation.protocol.wire_types import HelloBack, TopicBatch, TopicMessage, TopicReliableBatch

from node_harness import Harness, address

FILTER = "f/#"


def star(qos: int) -> Harness:
    """Node 1 between nodes 2 and 3, both subscribed to f/# at `qos`; converged (a probe from 1 reached both)."""
    harness = Harness([(1, 2), (1, 3)])
    harness.do(2, "local_subscribe", "two", FILTER, qos)
    harness.do(3, "local_subscribe", "three", FILTER, qos)
    harness.run(10.0)
    harness.do(1, "local_publish", "f/probe", b"probe", qos, False, None)
    harness.run(11.0)
    assert {index for index, injection in harness.delivered if injection.topic == "f/probe"} == {2, 3}
    return harness


def from_node(harness: Harness, index: int, kind: str, body: object) -> None:
    """`body` arrives at node 1 as if node `index` had sent it."""
    sender = wire.Sender(BrokerId(index, address(index)), harness.epochs[index])
    harness.nodes[1].receive_packet(wire.encode(kind, sender, body), address(index), harness.now)
    harness.flush(1)


def forgery(kind: str, harness: Harness) -> object:
    node = harness.nodes[1]
    origin, epoch, seq = node.address, node.identity.epoch, node.identity.publication_seq + 1
    if kind == wire.TOPIC_MESSAGE:
        return TopicMessage(FILTER, origin, epoch, seq, 0, 1, "f/forged", b"forged", 0, False, None)
    if kind == "tm-qos1":
        return TopicMessage(FILTER, origin, epoch, seq, 0, 1, "f/forged", b"forged", 1, False, None, (epoch, seq - 1))
    if kind == wire.TOPIC_BATCH:
        return TopicBatch(FILTER, origin, epoch, 0, 1, [seq, "f/forged", b"forged"])
    return TopicReliableBatch(FILTER, origin, epoch, 0, 1, 1, [seq - 1, None, "f/echo", b"echo",
                                                                seq, seq - 1, "f/forged", b"forged"])


@pytest.mark.parametrize("kind", [wire.TOPIC_MESSAGE, "tm-qos1", wire.TOPIC_BATCH, wire.TOPIC_RELIABLE_BATCH])
def test_a_forged_publication_of_our_own_next_number_is_dropped_and_the_real_one_arrives(kind: str) -> None:
    qos = 1 if kind in ("tm-qos1", wire.TOPIC_RELIABLE_BATCH) else 0
    harness = star(qos)
    node = harness.nodes[1]
    acks_before = node.sent_by_type[wire.TOPIC_ACK] + node.sent_by_type[wire.TOPIC_ACKS]
    from_node(harness, 2, wire.TOPIC_MESSAGE if kind == "tm-qos1" else kind, forgery(kind, harness))
    harness.run(12.0)
    assert node.drops["forged_own"] == 1
    assert [e for e in harness.events if e.get("reason") == "forged_own"], "no packet_dropped event"
    assert not [i for _, i in harness.delivered if i.topic == "f/forged"], "the forgery was delivered"
    if qos:  # acknowledged, so that a neighbour relaying it would stop resending it
        assert node.sent_by_type[wire.TOPIC_ACK] + node.sent_by_type[wire.TOPIC_ACKS] > acks_before

    harness.do(1, "local_publish", "f/real", b"real", qos, False, None)
    harness.run(13.0)
    assert {index for index, injection in harness.delivered if injection.topic == "f/real"} == {2, 3}


def test_an_echo_of_a_publication_we_made_is_a_duplicate_not_a_forgery() -> None:
    harness = star(0)
    node = harness.nodes[1]
    origin, epoch, seq = node.address, node.identity.epoch, node.identity.publication_seq
    from_node(harness, 2, wire.TOPIC_MESSAGE, TopicMessage(FILTER, origin, epoch, seq, 0, 1, "f/probe", b"probe", 0,
                                                           False, None))
    assert node.drops["forged_own"] == 0
    assert node.counters["duplicates_dropped"] >= 1


def test_a_hello_back_with_a_forged_send_time_leaves_the_round_trip_alone() -> None:
    harness = Harness([(1, 2)])
    harness.run(5.0)
    node = harness.nodes[1]
    neighbour = node.neighbours.get(address(2))
    assert neighbour is not None and neighbour.up and neighbour.rtt is not None
    rtt = neighbour.rtt
    harness.run(node.liveness.next_hello + harness.latency / 2)  # a hello is out, its answer not back yet
    seq = node.neighbours.hello_seq
    transport, sent_at = node.neighbours.hellos_sent[seq]
    assert transport == address(2)
    stale = node.drops["stale_hello_back"]

    from_node(harness, 2, wire.HELLO_BACK, HelloBack(seq, 0.001, harness.now))  # sent days ago, says the echo
    assert node.drops["stale_hello_back"] == stale + 1
    assert neighbour.rtt == rtt

    from_node(harness, 2, wire.HELLO_BACK, HelloBack(seq, sent_at, harness.now))  # the right echo counts
    assert node.drops["stale_hello_back"] == stale + 1
    assert neighbour.rtt is not None and neighbour.rtt < rtt

    from_node(harness, 2, wire.HELLO_BACK, HelloBack(seq, sent_at, harness.now))  # once
    assert node.drops["stale_hello_back"] == stale + 2
    harness.run(harness.now + 5.0)  # the real answer to that hello is stale too; the later ones count
    assert node.drops["stale_hello_back"] == stale + 3
    assert neighbour.up and neighbour.rtt is not None and neighbour.rtt < 0.01
