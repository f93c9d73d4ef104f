"""A node told its configured neighbours changed (the wrapper reloaded its YAML file): new ones come up, dropped
ones go down at once and are forgotten, and what was in custody toward a dropped one still arrives."""

from __future__ import annotations

from federation.protocol import events

from node_harness import Harness, address


def up(harness: Harness, index: int) -> set[int]:
    return {int(n.transport.host.rsplit(".", 1)[1]) for n in harness.nodes[index].neighbours.all() if n.up}


def test_a_neighbour_added_at_run_time_comes_up_and_carries_publications() -> None:
    harness = Harness([(1, 2)])
    harness.start(3)  # a wrapper of its own, listing nobody
    harness.do(3, "local_subscribe", "s", "t/#", 1)
    harness.run(5.0)
    assert up(harness, 2) == {1} and up(harness, 3) == set()
    added, removed = harness.do(2, "set_configured_neighbours", [address(1), address(3)])
    assert (added, removed) == ([address(3)], [])
    harness.run(harness.now + 0.1)  # one round trip: the hello goes at once
    assert up(harness, 2) == {1, 3} and up(harness, 3) == {2}
    harness.run(harness.now + 5.0)
    harness.do(1, "local_publish", "t/x", b"over the new link", 1, False, None)
    harness.run(harness.now + 2.0)
    assert [(index, injection.topic) for index, injection in harness.delivered] == [(3, "t/x")]


def test_a_neighbour_no_longer_listed_goes_down_at_once_and_is_forgotten() -> None:
    harness = Harness([(1, 2), (2, 3)])
    harness.run(5.0)
    assert up(harness, 2) == {1, 3}
    harness.events.clear()
    added, removed = harness.do(2, "set_configured_neighbours", [address(1), address(3)])
    assert (added, removed) == ([], [])  # the same list: nothing happens
    added, removed = harness.do(2, "set_configured_neighbours", [address(1)])
    assert (added, removed) == ([], [address(3)])
    assert up(harness, 2) == {1}
    assert harness.nodes[2].neighbours.get(address(3)) is None
    downs = [event for event in harness.events if event["type"] == events.NEIGHBOUR_DOWN]
    assert [event["neighbour"] for event in downs] == [str(address(3))]
    assert harness.nodes[2].neighbours.all()[0].flaps == 0  # not a failure of the link


def test_a_peer_that_still_lists_the_node_is_accepted_again_as_unconfigured() -> None:
    """One side's list is enough for a link (docs/daemon.md): 3 still lists 2, so its hellos bring the link back,
    now as a neighbour 2 did not configure."""
    harness = Harness([(1, 2), (2, 3)])
    harness.run(5.0)
    harness.do(2, "set_configured_neighbours", [address(1)])
    harness.run(harness.now + 2.0)
    neighbour = harness.nodes[2].neighbours.get(address(3))
    assert neighbour is not None and neighbour.up and not neighbour.configured


def test_qos1_in_custody_toward_a_dropped_neighbour_still_arrives_by_another_way() -> None:
    """A ring 1-2-3-4: 1 publishes QoS 1 toward 3 while 2 drops 3 (and 3 drops 2): the copies reroute via 4."""
    harness = Harness([(1, 2), (2, 3), (3, 4), (4, 1)])
    harness.do(3, "local_subscribe", "s", "q/#", 1)
    harness.run(8.0)
    for seq in range(1, 21):
        harness.do(1, "local_publish", "q/t", str(seq).encode(), 1, False, None)
        if seq == 10:
            harness.do(2, "set_configured_neighbours", [address(1)])
            harness.do(3, "set_configured_neighbours", [address(4)])
    harness.run(harness.now + 15.0)
    payloads = [int(injection.payload) for index, injection in harness.delivered if index == 3]
    assert sorted(set(payloads)) == list(range(1, 21))
    assert payloads == sorted(payloads)  # in order (rule 7d)
