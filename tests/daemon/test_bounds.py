"""Bounded queues toward a slow broker or network (federation.daemon.backpressure), and the neighbour
table's eviction."""

from __future__ import annotations

import dataclasses
import random

import pytest

from federation.daemon.backpressure import InjectionQueue, is_qos0_publication
from federation.protocol import wire
from federation.protocol.node import Node
from federation.protocol.settings import Settings
from federation.protocol.types import Address, BrokerId


def test_a_full_queue_drops_the_oldest_qos0_first_then_the_oldest() -> None:
    queue: InjectionQueue[str] = InjectionQueue(3)
    assert queue.push("a1", 1) is None and queue.push("b0", 0) is None and queue.push("c0", 0) is None
    assert queue.push("d2", 2) == "b0"       # full: the oldest QoS 0 goes, although a1 is older
    assert queue.push("e1", 1) == "c0"
    assert queue.push("f1", 1) == "a1"       # no QoS 0 left: the oldest of all
    assert queue.push("g0", 0) == "g0"       # a new QoS 0 item into a queue full of QoS 1/2 is dropped at once
    assert dict(queue.dropped) == {"qos0": 3, "qos12": 1}
    assert queue.take(10) == ["d2", "e1", "f1"] and len(queue) == 0


def test_take_keeps_arrival_order_across_qos() -> None:
    queue: InjectionQueue[int] = InjectionQueue(10)
    for number, qos in enumerate([1, 0, 0, 2, 0]):
        queue.push(number, qos)
    assert queue.take(2) == [0, 1] and queue.take(5) == [2, 3, 4] and queue.pop() is None


def test_qos0_publications_are_recognised_on_the_wire() -> None:
    sender = wire.Sender(BrokerId(1, Address("h", 1)), 1)
    message = wire.TopicMessage("a/#", Address("h", 1), 1, 1, 0, 0, "a/b", b"x" * 70000, 0, False, None)
    assert is_qos0_publication(wire.encode(wire.TOPIC_MESSAGE, sender, message))
    qos1 = wire.TopicMessage("a/#", Address("h", 1), 1, 1, 0, 0, "a/b", b"x", 1, False, None)
    assert not is_qos0_publication(wire.encode(wire.TOPIC_MESSAGE, sender, qos1))
    assert not is_qos0_publication(wire.encode(wire.HELLO, sender, wire.Hello(1, 0.0)))
    assert not is_qos0_publication(b"\x9b\xa2tm garbage")


@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("retain", [False, True])
@pytest.mark.parametrize("payload", [b"", b"\x00\xc2\xc0", b"x" * 300])
def test_the_qos_read_from_the_last_bytes_is_the_decoded_one(qos: int, retain: bool, payload: bytes) -> None:
    """Shedding reads a `tm`'s QoS from its last bytes (wire.plain_topic_message_qos); it must agree with
    decoding, whatever the payload ends with, and give up (None) where only decoding can tell."""
    sender = wire.Sender(BrokerId(1, Address("h", 1)), 1)
    message = wire.TopicMessage("a/#", Address("h", 1), 1, 7, 0, 0, "a/b", payload, qos, retain, None)
    packet = wire.encode(wire.TOPIC_MESSAGE, sender, message)
    body = wire.decode(packet).body
    assert isinstance(body, wire.TopicMessage)
    assert wire.plain_topic_message_qos(packet) == body.qos == qos
    assert is_qos0_publication(packet) == (qos == 0)
    with_properties = wire.encode(wire.TOPIC_MESSAGE, sender, dataclasses.replace(
        message, properties={"content_type": "text/plain"}))
    assert wire.plain_topic_message_qos(with_properties) is None
    assert is_qos0_publication(with_properties) == (qos == 0)  # decoded instead
    assert wire.plain_topic_message_qos(wire.encode(wire.HELLO, sender, wire.Hello(1, 0.0))) is None
    assert wire.plain_topic_message_qos(packet[:3]) is None


def test_hellos_from_fake_sources_cannot_fill_the_neighbour_table_for_good() -> None:
    settings = Settings(max_neighbours=4)
    node = Node(Address("10.0.0.1", 10500), [Address("10.0.0.2", 10500)], 1, random.Random(1), settings, vid=1)
    node.start(0.0)
    for index in range(10):
        fake = Address(f"10.9.9.{index}", 10500)
        hello = wire.encode(wire.HELLO, wire.Sender(BrokerId(50 + index, fake), 1), wire.Hello(1, 0.0))
        node.receive_packet(hello, fake, 0.1)
    assert len(node.neighbours.all()) == 4 and node.neighbours.refused == 7
    node.handle_timer(settings.neighbour_dead_after + 0.2)   # they never answered our hello
    assert [str(n.transport) for n in node.neighbours.all()] == ["10.0.0.2:10500"]
    assert node.neighbours.forgotten == 3
