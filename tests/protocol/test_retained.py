"""Retained publications in the node (docs/protocol.md rule 10): the built-in `//retained//` tree, made at the
first retained publication, its core on the lowest id; every node injects each retained publication once, with
retain, subscribers or not; the origin waits `retained_tree_wait` for the tree; nothing changes for the rest."""

from __future__ import annotations

from federation.protocol.modes import RETAINED_FILTER
from federation.protocol.types import BrokerId

from node_harness import Harness, address

SEED_LINKS = [(0, 1), (0, 2), (1, 4), (1, 5), (2, 5), (4, 5), (4, 3), (5, 3)]


def injected(h: Harness, pub: object) -> list[tuple[int, bool]]:
    return sorted((index, injection.retain) for index, injection in h.delivered if injection.publication == pub)


def test_a_retained_publication_reaches_every_node_with_retain_and_the_tree_is_made_on_demand() -> None:
    h = Harness(SEED_LINKS)
    h.run(1.0)
    h.do(3, "local_subscribe", "s", "live/#", 1)
    h.run(2.0)
    assert all(RETAINED_FILTER not in node.mesh.topics for node in h.nodes.values())  # nothing without one
    plain = h.do(4, "local_publish", "live/x", b"p", 1, False, None)
    h.run(h.now + 0.5)
    assert injected(h, plain) == [(3, False)]
    first = h.do(4, "local_publish", "status/x", b"v1", 1, True, None)
    h.run(h.now + 0.2)
    assert injected(h, first) == []  # the origin waits for the tree (retained_tree_wait)
    h.run(h.now + 1.0)
    assert injected(h, first) == [(0, True), (1, True), (2, True), (3, True), (5, True)]
    for node in h.nodes.values():
        state = node.mesh.topics[RETAINED_FILTER]
        assert state.core == BrokerId(0, address(0)) and state.member  # placed on the lowest id, everyone joined
        assert RETAINED_FILTER not in node.view().topic_cores  # not a subscription: left out of the view
    second = h.do(2, "local_publish", "status/y", b"", 0, True, None)  # a deletion, QoS 0, at once
    h.run(h.now + 0.2)
    assert injected(h, second) == [(0, True), (1, True), (3, True), (4, True), (5, True)]
    live = h.do(5, "local_publish", "live/y", b"r", 1, True, None)  # retained, with a live subscriber: once
    h.run(h.now + 0.5)
    assert [index for index, _ in injected(h, live)] == [0, 1, 2, 3, 4]


def test_a_client_subscription_to_the_reserved_filter_is_not_federated() -> None:
    h = Harness([(0, 1)])
    h.run(1.0)
    h.do(1, "local_subscribe", "c", RETAINED_FILTER, 0)
    h.run(2.0)
    assert all(RETAINED_FILTER not in node.mesh.topics for node in h.nodes.values())
    assert h.nodes[1].local_count(RETAINED_FILTER) == 0
