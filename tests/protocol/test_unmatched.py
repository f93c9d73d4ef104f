"""Publications that come on a filter the local broker federates and match no local subscription the node knows
(`Node.hold_unmatched`, `Node.settle_unmatched`): handed over marked instead of silently not injected, delivered or
counted as not subscribed here once the embedder settles them, and a QoS 1/2 one's custody held until then."""

from __future__ import annotations

from federation.protocol.settings import Settings
from federation.protocol.types import Injection

from node_harness import Harness

COVERED = ["dev/1/cmd", "dev/2/cmd", "dev/3/cmd"]
"""three devices on node 2: federated as `dev/+/cmd` (aggregate_fanout 2)"""


def covering_line(hold: bool = True) -> Harness:
    harness = Harness([(1, 2)], settings=Settings(aggregate_fanout=2))
    harness.injections_done = False  # the test reports QoS 1/2 injections itself
    for number, filter_ in enumerate(COVERED):
        harness.do(2, "local_subscribe", f"device{number}", filter_, 1)
    if hold:
        harness.nodes[2].hold_unmatched()
    harness.run(10.0)
    harness.do(1, "local_publish", "dev/1/cmd", b"probe", 1, False, None)
    harness.run(11.0)
    assert [injection.topic for _, injection in harness.delivered] == ["dev/1/cmd"], "the line did not converge"
    assert harness.nodes[2].local.wanted == {"dev/+/cmd": 1}
    for _, injection in harness.delivered:
        harness.nodes[2].injection_done(injection.publication, harness.now)
    harness.run(12.0)
    harness.delivered.clear()
    harness.events.clear()
    harness.released.clear()
    return harness


def marked(harness: Harness) -> list[Injection]:
    return [injection for index, injection in harness.delivered if index == 2 and injection.unmatched_hops is not None]


def test_without_the_hold_an_unmatched_publication_is_not_handed_over() -> None:
    harness = covering_line(hold=False)
    harness.do(1, "local_publish", "dev/77/cmd", b"x", 1, False, None)
    harness.run(13.0)
    assert harness.delivered == []
    assert len(harness.released) == 1  # nobody here wanted it: custody ended at once


def test_an_unmatched_qos1_publication_is_handed_over_marked_and_delivered_once_its_subscription_is_known() -> None:
    harness = covering_line()
    node = harness.nodes[2]
    delivered_before = node.counters["publications_delivered"]
    harness.do(1, "local_publish", "dev/77/cmd", b"late", 1, False, None)
    harness.run(13.0)
    (injection,) = marked(harness)
    assert (injection.topic, injection.filter, injection.unmatched_hops) == ("dev/77/cmd", "dev/+/cmd", 1)
    assert node.counters["publications_unmatched"] == 1
    assert node.counters["publications_delivered"] == delivered_before  # not yet
    assert harness.released == []  # custody waits for the settling
    harness.do(2, "local_subscribe", "late", "dev/77/cmd", 1)  # the log line, read before the fence
    assert node.settle_unmatched(injection, harness.now) is True
    assert node.counters["publications_delivered"] == delivered_before + 1
    harness.flush(2)
    assert any(event["type"] == "publications_delivered" for event in harness.events)
    node.injection_done(injection.publication, harness.now)  # the broker's PUBACK
    harness.run(14.0)
    assert len(harness.released) == 1


def test_still_unmatched_after_the_fence_is_not_subscribed_here_and_its_custody_ends() -> None:
    harness = covering_line()
    node = harness.nodes[2]
    harness.do(1, "local_publish", "dev/88/cmd", b"nobody", 1, False, None)
    harness.run(13.0)
    (injection,) = marked(harness)
    assert node.settle_unmatched(injection, harness.now) is False
    assert node.counters["publications_not_subscribed"] == 1
    assert not node.drops.get("unmatched_hold_full") and not node.drops.get("unmatched_fence_timeout")
    harness.flush(2)
    harness.run(14.0)
    assert len(harness.released) == 1  # acknowledged: nobody here wants it


def test_given_up_on_it_is_not_counted_as_not_subscribed() -> None:
    harness = covering_line()
    node = harness.nodes[2]
    harness.do(1, "local_publish", "dev/88/cmd", b"nobody", 1, False, None)
    harness.run(13.0)
    (injection,) = marked(harness)
    assert node.settle_unmatched(injection, harness.now, confirmed=False) is False
    assert node.counters["publications_not_subscribed"] == 0  # the embedder counts the drop


def test_qos0_runs_mark_the_unmatched_ones_only() -> None:
    harness = covering_line()
    run = [("dev/1/cmd", b"a"), ("dev/99/cmd", b"b"), ("dev/2/cmd", b"c"), ("dev/98/cmd", b"d")]
    harness.do(1, "local_publish_run", run)
    harness.run(13.0)
    got = [(injection.topic, injection.unmatched_hops is not None) for index, injection in harness.delivered
           if index == 2]
    assert got == [("dev/1/cmd", False), ("dev/99/cmd", True), ("dev/2/cmd", False), ("dev/98/cmd", True)]
    harness.delivered.clear()
    harness.do(1, "local_publish_run", [("dev/97/cmd", b"e"), ("dev/96/cmd", b"f")])  # none wanted: the loop
    harness.run(14.0)
    assert [injection.topic for injection in marked(harness)] == ["dev/97/cmd", "dev/96/cmd"]


def test_a_transit_filter_is_not_marked() -> None:
    """Only the filters the local broker federates: what a node carries for others is not its broker's."""
    harness = Harness([(1, 2), (2, 3)], settings=Settings(aggregate_fanout=2))
    harness.nodes[2].hold_unmatched()
    harness.do(3, "local_subscribe", "far", "far/#", 0)
    harness.run(10.0)
    harness.do(1, "local_publish", "far/x", b"x", 0, False, None)
    harness.run(11.0)
    assert [index for index, _ in harness.delivered] == [3]
