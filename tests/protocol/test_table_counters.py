"""Eviction counters of the small tables docs/security.md lists under "Bounds on the node's own tables"."""

from __future__ import annotations

import random

from federation.protocol.node import Node
from federation.protocol.ownership import OwnershipTable
from federation.protocol.settings import Settings
from federation.protocol.types import Address, BrokerId
from federation.protocol.wire import TopicMessage

HERE = Address("127.0.0.1", 10500)


def message(seq: int) -> TopicMessage:
    return TopicMessage("a/#", Address("127.0.0.2", 10500), 1, seq, 0, 0, "a/b", b"x", 1, False, None)


def test_recent_qos1_publications_forgotten_for_room_are_counted() -> None:
    node = Node(HERE, [], epoch=1, rng=random.Random(1), settings=Settings(max_unacked=8))
    for seq in range(20):
        node.reliable.remember(message(seq), None, now=1.0)
    assert len(node.reliable.recent) == 8
    assert node.reliable.recent_evicted == 12
    assert node.status(1.0)["reliable"]["recent_evicted"] == 12


def test_recent_publications_that_aged_out_are_not_evictions() -> None:
    node = Node(HERE, [], epoch=1, rng=random.Random(1), settings=Settings(max_unacked=8))
    for seq in range(5):
        node.reliable.remember(message(seq), None, now=1.0)
    node.reliable.remember(message(99), None, now=1.0 + node.reliable.replay_window + 1)
    assert len(node.reliable.recent) == 1 and node.reliable.recent_evicted == 0


def test_forgotten_withdrawals_and_refused_ownerships_are_counted() -> None:
    table = OwnershipTable([], capacity=2)
    owners = [BrokerId(n, Address(f"10.0.0.{n}", 10500)) for n in range(1, 5)]
    for owner in owners:  # announce, then withdraw: each withdrawal is remembered until room runs out
        assert table.receive("s/#", owner, 1, 1, 1, withdrawn=False, now=0.0) in ("new", "old")
        assert table.receive("s/#", owner, 1, 2, 1, withdrawn=True, now=0.0) == "new"
    assert len(table.withdrawn) == 2
    assert table.status()["withdrawn_forgotten"] == 2
    for owner in owners[:3]:
        table.receive(f"t{owner.vid}/#", owner, 2, 1, 1, withdrawn=False, now=0.0)
    assert len(table.entries) == 2 and table.status()["refused"] == 1
