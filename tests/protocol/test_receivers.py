"""The origin's end-to-end custody (federation.protocol.receivers, docs/protocol.md rule 7f).

A publication stays in its origin's custody until every broker that subscribed to its filter when it was made has
it, also across a partition with subscribers on both sides, a core that stops cleanly and a restart of the origin;
it is repaired to them, in their stream's order, when they are back in reach, and given up (counted, reported) only
after `receiver_hold`. Nodes are wired in memory (tests/node_harness.py).
"""

from __future__ import annotations

from dataclasses import replace

from federation.protocol import wire
from federation.protocol.settings import Settings
from federation.protocol.types import Address, PublicationId

from node_harness import Harness


def delivered(harness: Harness, node: int) -> list[int]:
    """The seqs node injected, in order (copies included)."""
    return [injection.publication[2] for index, injection in harness.delivered if index == node]


def publish(harness: Harness, count: int, gap: float = 0.01, node: int = 0, topic: str = "f/x") -> list[PublicationId]:
    made = []
    for _ in range(count):
        publication = harness.do(node, "local_publish", topic, b"p", 1, False, None)
        assert publication is not None
        made.append(publication)  # type: ignore[arg-type]
        harness.run(harness.now + gap)
    return made


def ring(settings: Settings | None = None) -> Harness:
    """0-1-2-3-0, the origin 0, subscribers to f/# at 1 (the core: the lower id) and 2; converged."""
    harness = Harness([(0, 1), (1, 2), (2, 3), (3, 0)], settings=settings)
    harness.do(1, "local_subscribe", "s1", "f/#", 1)
    harness.do(2, "local_subscribe", "s2", "f/#", 1)
    harness.run(10.0)
    return harness


def split(harness: Harness) -> None:
    harness.cut_link(1, 2)
    harness.cut_link(3, 0)


def heal(harness: Harness) -> None:
    harness.heal(1, 2)
    harness.heal(3, 0)


def in_order_once(seqs: list[int], expected: list[PublicationId]) -> bool:
    return seqs == [publication[2] for publication in expected]


def test_a_split_with_subscribers_on_both_sides_loses_nothing_on_the_far_side() -> None:
    harness = ring()
    made = publish(harness, 50)
    split(harness)
    made += publish(harness, 3000)  # 30 s: far past the lifetime after which the near side forgets the far one
    origin = harness.nodes[0]
    assert origin.counters["custody_released"] < len(made) - 2000, "released what the far side does not have"
    assert origin.receivers.status()["awaiting"] > 2000
    heal(harness)
    made += publish(harness, 300)
    harness.run(harness.now + 30)
    assert in_order_once(delivered(harness, 1), made)
    assert in_order_once(delivered(harness, 2), made), "the far side did not get everything, in order, once"
    assert origin.counters["custody_released"] == len(made) and origin.counters["custody_given_up"] == 0
    assert origin.counters["repairs_delivered"] > 2000
    assert origin.receivers.status()["awaiting"] == 0 and not origin.drops.get("receiver_hold_expired")
    assert any(node.counters["repairs_relayed"] for node in (harness.nodes[1], harness.nodes[3]))


def test_a_core_that_stops_cleanly_loses_nothing_and_its_broker_gets_what_it_missed_when_it_is_back() -> None:
    harness = Harness([(0, 1), (1, 2), (0, 2)])  # 1 is the core (the lower id of the two subscribers)
    harness.do(1, "local_subscribe", "s1", "f/#", 1)
    harness.do(2, "local_subscribe", "s2", "f/#", 1)
    harness.run(10.0)
    made = publish(harness, 100, gap=0.001)
    harness.nodes[1].shutdown(harness.now)
    harness.flush(1)
    harness.kill(1)
    made += publish(harness, 500, gap=0.001)
    harness.run(harness.now + 5)
    assert in_order_once(delivered(harness, 2), made)
    origin = harness.nodes[0]
    assert origin.receivers.status()["awaited"] == {"10.0.0.1:10500": len(made) - 100 + 1} or \
        origin.receivers.status()["awaited"].get("10.0.0.1:10500", 0) >= len(made) - 100
    restarted = harness.start(1)
    restarted.restore(streams=harness_positions(harness, 1))
    harness.do(1, "local_subscribe", "s1", "f/#", 1)
    harness.run(harness.now + 20)
    assert sorted(set(delivered(harness, 1))) == [publication[2] for publication in made]
    assert origin.counters["custody_released"] == len(made) and origin.receivers.status()["awaiting"] == 0


def harness_positions(harness: Harness, node: int) -> dict[tuple[Address, str], tuple[int, int]]:
    """What the node's journal would give back: the last position injected per stream."""
    positions: dict[tuple[Address, str], tuple[int, int]] = {}
    for index, injection in harness.delivered:
        if index == node and injection.filter is not None:
            origin, epoch, seq = injection.publication
            positions[(origin, injection.filter)] = (epoch, seq)
    return positions


def test_a_receiver_that_left_during_the_split_is_forgotten_and_nothing_waits_for_it() -> None:
    harness = ring()
    made = publish(harness, 20)
    split(harness)
    made += publish(harness, 200)
    harness.do(2, "local_unsubscribe", "s2", "f/#")
    harness.run(harness.now + 1)
    heal(harness)
    harness.run(harness.now + 20)
    origin = harness.nodes[0]
    assert delivered(harness, 2) == [publication[2] for publication in made[:20]]  # nothing after it left
    assert origin.counters["receivers_left"] >= 1 and origin.receivers.status()["awaiting"] == 0
    assert origin.counters["custody_released"] == len(made) and origin.counters["custody_given_up"] == 0
    assert Address("10.0.0.2", 10500) not in origin.receivers.targets("f/#")


def test_a_receiver_out_of_reach_past_the_hold_is_given_up_counted_and_reported() -> None:
    harness = ring(Settings(receiver_hold=30.0))
    publish(harness, 10)
    split(harness)
    late = publish(harness, 100)
    harness.run(harness.now + 25)  # the near side gives up on the far one after a lifetime (15 s): they await it
    assert harness.nodes[0].receivers.status()["awaiting"] == len(late)
    harness.run(harness.now + 35)
    origin = harness.nodes[0]
    assert origin.drops["receiver_hold_expired"] == len(late)
    dropped = [event for event in harness.events if event["type"] == "publication_dropped"
               and event["reason"] == "receiver_hold_expired"]
    assert len(dropped) == len(late) and all(event["to"] == ["10.0.0.2:10500"] for event in dropped)
    assert origin.counters["custody_given_up"] == len(late) and origin.counters["custody_released"] == 10
    assert {publication for index, publication in harness.released if index == 0} >= set(late)  # the spool forgets


def test_more_awaiting_than_the_bound_gives_the_oldest_up() -> None:
    harness = ring(Settings(max_awaiting=50))
    publish(harness, 5)
    split(harness)
    late = publish(harness, 120)
    harness.run(harness.now + 25)  # the near side gives up on the far one after a lifetime (15 s)
    origin = harness.nodes[0]
    assert origin.receivers.status()["awaiting"] == 50
    assert origin.drops["receiver_hold_full"] == len(late) - 50
    heal(harness)
    harness.run(harness.now + 20)
    # The newest 50 arrive; the gaps given up before them are skipped after `reorder_timeout`, as lost ones are.
    assert {publication[2] for publication in late[-50:]} <= set(delivered(harness, 2))
    assert origin.receivers.status()["awaiting"] == 0


def test_a_restarted_origin_still_awaits_the_far_side_with_what_it_knew() -> None:
    harness = ring()
    publish(harness, 10)
    known = harness.nodes[0].receivers_known()
    assert known == {"f/#": ["10.0.0.1:10500", "10.0.0.2:10500"]}
    split(harness)
    spooled = publish(harness, 100)
    harness.kill(0)  # killed with all of them in its spool (the far side does not have them)
    restarted = harness.start(0)  # a new epoch
    restarted.restore(receivers=known)
    harness.run(harness.now + 3)  # it learns the filters from its neighbours
    for publication in spooled:  # the embedder replays its spool with the original ids
        restarted.local_publish("f/x", b"p", 1, False, None, harness.now, publication_id=publication)
    harness.flush(0)
    harness.run(harness.now + 25)  # past the near side's lifetime for the far one
    assert restarted.receivers.status()["awaiting"] == len(spooled)
    heal(harness)
    harness.run(harness.now + 20)
    assert [seq for seq in delivered(harness, 2) if seq > 10] == [publication[2] for publication in spooled]
    assert restarted.receivers.status()["awaiting"] == 0


def test_a_repair_copy_round_trips_on_the_wire() -> None:
    target = Address("10.0.0.2", 10500)
    message = wire.TopicMessage("$repair/10.0.0.2/10500/f/#", Address("10.0.0.0", 10500), 1, 9, wire.MODE_REPAIR,
                                0, "f/x", b"p", 1, False, None, (1, 8), target)
    sender = wire.Sender(wire.BrokerId(1, Address("10.0.0.0", 10500)), 1)
    packet = wire.decode(wire.encode(wire.TOPIC_MESSAGE, sender, message))
    assert packet.body == message
    wrong = replace(message, target=Address("10.0.0.3", 10500))
    try:
        wire.decode(wire.encode(wire.TOPIC_MESSAGE, sender, wrong))
    except wire.DecodeError as error:
        assert error.reason == "bad_filter"
    else:
        raise AssertionError("a repair naming another target than its filter's was taken")
