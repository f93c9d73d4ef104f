"""A full topic table (`max_topics`) is said, and a local filter it has no room for is served by `#`, never not at
all (docs/drops.md `topic_table_full`)."""

from __future__ import annotations

from federation.protocol import events
from federation.protocol.settings import Settings

from node_harness import Harness

SMALL = Settings(hello_interval=0.2, announce_interval=1.0, max_topics=5, aggregate_fanout=0, stats_interval=1.0)


def test_filters_beyond_the_table_are_served_by_multi_level_and_said() -> None:
    harness = Harness([(1, 2)], settings=SMALL)
    harness.run(1.0)
    for index in range(8):  # three more than the table holds
        harness.do(2, "local_subscribe", "c", f"dev/{index}/cmd", 1)
    harness.run(3.0)
    node = harness.nodes[2]
    assert len(node.mesh.topics) == 6  # five, and the `#` that serves the rest
    assert node.local.refused and "#" in node.local.wanted
    assert "#" in harness.nodes[1].mesh.cores()
    problem = node.limits_problem(harness.now)
    assert problem is not None and "max_topics 5" in problem and "served by '#'" in problem
    assert node.drops["topic_table_full"] >= 3
    full = [e for e in harness.events if e["type"] == events.TOPIC_TABLE_FULL]
    assert full and full[0]["limit"] == 5 and full[0]["covered_by"] == "#"
    for index in range(8):  # every one served, the refused ones by `#`
        harness.do(1, "local_publish", f"dev/{index}/cmd", b"x", 1, False, None)
    harness.run(5.0)
    assert sorted(injection.topic for _, injection in harness.delivered) == [f"dev/{i}/cmd" for i in range(8)]
    # Room again: the refused filters are taken at the next announce round, and `#` goes once they are joined.
    for index in range(5):
        harness.do(2, "local_unsubscribe", "c", f"dev/{index}/cmd")
    harness.run(30.0)
    assert not node.local.refused and "#" not in node.local.wanted
    assert node.limits_problem(harness.now) is None
    assert set(node.mesh.cores()) == {f"dev/{i}/cmd" for i in range(5, 8)}


def test_a_remote_filter_beyond_the_table_is_said_and_makes_the_node_not_ready() -> None:
    harness = Harness([(1, 2)], settings=SMALL)
    harness.run(1.0)
    for index in range(7):
        harness.do(2, "local_subscribe", "c", f"site/{index}", 1)
    harness.run(3.0)
    node = harness.nodes[1]  # holds others' claims only
    assert len(node.mesh.topics) == 5 and node.mesh.refused_topics >= 2
    problem = node.limits_problem(harness.now)
    assert problem is not None and "do not reach their subscribers" in problem
