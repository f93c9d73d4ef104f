"""Shared subscription groups in the node (docs/protocol.md rule 9), on the in-memory harness: membership
flooded and forgotten, the choice every node computes alike, QoS 0 and 1 to one member broker, none sent
when the origin's broker has a member, and nothing at all sent by a federation without shared subscriptions."""

from __future__ import annotations

from collections import Counter

from federation.protocol import wire
from federation.protocol.settings import Settings
from federation.protocol.shared import shared_filter, weight

from node_harness import Harness, address

SHARED = "$share/g/s/#"
GROUP = ("g", "s/#")


def started(links: list[tuple[int, int]]) -> Harness:
    harness = Harness(links)
    for index in harness.indexes:
        harness.start(index)
    harness.run(5.0)
    return harness


def test_members_are_known_everywhere_and_forgotten_when_they_leave() -> None:
    harness = started([(1, 2), (2, 3), (3, 4)])
    harness.do(2, "local_subscribe", "m2", SHARED, 1)
    harness.do(4, "local_subscribe", "m4", SHARED, 1)
    harness.run(6.0)
    for index in (1, 3):
        assert harness.nodes[index].shared.status()["members"] == {SHARED: [str(address(2)), str(address(4))]}
    assert harness.nodes[2].shared.status() == {"local": [SHARED], "members": {SHARED: [str(address(4))]}}
    harness.do(4, "local_disconnect", "m4")
    harness.run(7.0)
    assert harness.nodes[1].shared.status()["members"] == {SHARED: [str(address(2))]}
    harness.kill(2)  # no withdrawal: forgotten after expire_intervals announce intervals without a refresh
    settings = Settings()
    harness.run(7.0 + (settings.expire_intervals + 1.5) * settings.announce_interval)
    assert harness.nodes[1].shared.status()["members"] == {}


def test_each_publication_goes_to_the_best_ranked_member_broker_once() -> None:
    harness = started([(1, 2), (2, 3), (3, 4)])
    harness.do(2, "local_subscribe", "m2", SHARED, 1)
    harness.do(4, "local_subscribe", "m4", SHARED, 0)
    harness.run(6.0)
    made = [harness.do(1, "local_publish", "s/t", f"p{n}".encode(), n % 2, False, None) for n in range(40)]
    harness.run(8.0)
    served = Counter(injection.publication for _, injection in harness.delivered)
    assert set(served) == set(made) and set(served.values()) == {1}
    for index, injection in harness.delivered:
        best = max((address(2), address(4)), key=lambda m: weight(SHARED, injection.publication, m))
        assert address(index) == best and injection.filter == SHARED
    assert {index for index, _ in harness.delivered} == {2, 4}
    assert sorted(publication for _, publication in harness.released) == \
        sorted(p for n, p in enumerate(made) if n % 2)  # QoS 1 custody released


def test_a_member_on_the_origin_broker_means_nothing_is_sent_for_the_group() -> None:
    harness = started([(1, 2), (2, 3)])
    harness.do(1, "local_subscribe", "m1", SHARED, 1)
    harness.do(3, "local_subscribe", "m3", SHARED, 1)
    harness.run(6.0)
    harness.do(1, "local_publish", "s/t", b"x", 1, False, None)
    harness.run(7.0)
    assert harness.delivered == []
    assert harness.nodes[1].shared.ranking(GROUP, (address(1), 1, 1))[0] in (address(1), address(3))


def test_a_federation_without_shared_subscriptions_sends_no_sg() -> None:
    harness = started([(1, 2), (2, 3)])
    harness.do(3, "local_subscribe", "plain", "s/#", 1)
    harness.run(12.0)
    assert all(node.sent_by_type.get(wire.SHARED_GROUPS, 0) == 0 for node in harness.nodes.values())
    assert shared_filter(GROUP) == SHARED


def test_a_restarted_node_replaces_its_earlier_lifes_groups_at_once() -> None:
    harness = started([(1, 2), (2, 3)])
    harness.do(3, "local_subscribe", "m3", SHARED, 1)
    harness.run(6.0)
    assert harness.nodes[1].shared.status()["members"] == {SHARED: [str(address(3))]}
    harness.kill(3)
    harness.run(10.0)  # longer than the neighbour-down time (a restart usually is)
    harness.start(3)  # a new life whose broker has no member: it hears its old groups back and withdraws them
    assert harness.nodes[1].shared.status()["members"] == {SHARED: [str(address(3))]}
    harness.run(11.0)  # well within the expiry (15 s after the last refresh)
    assert harness.nodes[1].shared.status()["members"] == {}
    assert harness.nodes[2].shared.status()["members"] == {}
