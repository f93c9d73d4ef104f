"""The unmatched hold (federation.daemon.subscription_fence): marked injections held until a fence published after
them is read back, then settled by the node; their streams' later injections behind them; one fence in flight; the
bounds and the timeout. Sans-I/O: the node's settling is a table of topics subscribed, time is passed in."""

from __future__ import annotations

from typing import Any

from federation.daemon.subscription_fence import (
    FULL_REASON,
    TIMEOUT_REASON,
    UnmatchedHold,
    fence_number,
)
from federation.protocol.types import Address, Injection, InjectionRun

ORIGIN = Address("127.0.0.1", 10500)
OTHER = Address("127.0.0.2", 10500)


class Node:
    """What the hold asks of the node: settling (is the topic subscribed now?) and counting drops."""

    def __init__(self) -> None:
        self.subscribed: set[str] = set()
        self.settled: list[tuple[str, bool, bool]] = []
        self.drops: list[tuple[str, dict[str, Any]]] = []

    def settle(self, injection: Injection, now: float, confirmed: bool) -> bool:
        matched = injection.topic in self.subscribed
        self.settled.append((injection.topic, confirmed, matched))
        return matched

    def drop(self, reason: str, /, count: int = 1, *, event: str | None = None, now: float = 0.0,
             **fields: Any) -> None:
        self.drops.append((reason, {"event": event, **fields}))


def made(seq: int, topic: str, unmatched: bool = False, origin: Address = ORIGIN, filter_: str = "dev/+/cmd",
         payload: bytes = b"x") -> Injection:
    return Injection(topic, payload, 1, False, None, (origin, 1, seq), filter_, 2 if unmatched else None)


def hold_of(node: Node, **bounds: Any) -> UnmatchedHold:
    return UnmatchedHold(node.settle, node.drop, **bounds)


def topics(items: list[Any]) -> list[str]:
    return [item.topic for item in items]


def test_nothing_marked_passes_as_it_is_and_asks_for_no_fence() -> None:
    node = Node()
    hold = hold_of(node)
    given = [made(1, "dev/1/cmd"), made(2, "dev/2/cmd")]
    assert hold.admit(given, 0.0) is given
    assert hold.fence_to_publish(0.0) is None
    assert not hold.holding


def test_a_marked_one_waits_for_a_fence_published_after_it_then_is_injected_if_a_subscription_was_learnt() -> None:
    node = Node()
    hold = hold_of(node)
    assert hold.admit([made(1, "dev/77/cmd", unmatched=True)], 0.0) == []
    assert hold.fence_to_publish(0.0) == 1
    assert hold.fence_to_publish(0.0) is None  # one in flight at most
    node.subscribed.add("dev/77/cmd")  # the log line, read before the fence
    released = hold.fence_read(1, 0.01)
    assert topics(released) == ["dev/77/cmd"]
    assert released[0].unmatched_hops is None  # injected as any other
    assert node.settled == [("dev/77/cmd", True, True)]
    assert not hold.holding and hold.injected == 1 and hold.held_count == 0 and hold.held_bytes == 0


def test_still_unmatched_after_its_fence_is_not_subscribed_here_not_a_drop() -> None:
    node = Node()
    hold = hold_of(node)
    hold.admit([made(1, "dev/88/cmd", unmatched=True)], 0.0)
    hold.fence_to_publish(0.0)
    assert hold.fence_read(1, 0.01) == []
    assert node.settled == [("dev/88/cmd", True, False)]
    assert hold.not_subscribed == 1 and not node.drops


def test_later_injections_of_a_held_stream_wait_behind_it_and_other_streams_pass() -> None:
    node = Node()
    hold = hold_of(node)
    out = hold.admit([made(1, "dev/77/cmd", unmatched=True), made(2, "dev/1/cmd"),
                      made(3, "dev/2/cmd", origin=OTHER), made(4, "dev/3/cmd", filter_="other/#")], 0.0)
    assert [item.publication[2] for item in out] == [3, 4]  # another origin, another filter: other streams
    assert hold.held_count == 2
    hold.fence_to_publish(0.0)
    node.subscribed.add("dev/77/cmd")
    assert [item.publication[2] for item in hold.fence_read(1, 0.01)] == [1, 2]  # in their order


def test_a_fence_covers_what_came_before_it_and_the_next_one_comes_no_sooner_than_the_spacing() -> None:
    node = Node()
    hold = hold_of(node, spacing=0.1)
    hold.admit([made(1, "a/1", unmatched=True, filter_="a/+")], 0.0)
    assert hold.fence_to_publish(0.0) == 1
    assert hold.fence_due(0.0) is None  # nothing held that fence 1 does not cover
    hold.admit([made(2, "a/2", unmatched=True, filter_="a/+")], 0.005)  # arrived after fence 1 was published
    hold.admit([made(3, "a/3", unmatched=True, filter_="a/+")], 0.006)
    assert hold.fence_to_publish(0.006) is None
    assert hold.fence_due(0.006) == 0.1
    assert hold.fence_to_publish(0.1) == 2  # one fence for both, while fence 1 is still in flight
    node.subscribed |= {"a/1", "a/2", "a/3"}
    assert topics(hold.fence_read(1, 0.2)) == ["a/1"]  # fence 1 says nothing of the later two
    assert topics(hold.fence_read(2, 0.3)) == ["a/2", "a/3"]
    assert hold.fences == 2 and not hold.holding and not hold.in_flight


def test_a_stream_stays_in_order_behind_a_marked_one_that_waits_for_the_next_fence() -> None:
    node = Node()
    hold = hold_of(node, spacing=0.1)
    hold.admit([made(1, "dev/1/cmd", unmatched=True)], 0.0)
    hold.fence_to_publish(0.0)
    hold.admit([made(2, "dev/2/cmd", unmatched=True), made(3, "dev/3/cmd")], 0.005)
    assert hold.fence_to_publish(0.1) == 2
    node.subscribed |= {"dev/1/cmd", "dev/2/cmd"}
    assert topics(hold.fence_read(1, 0.2)) == ["dev/1/cmd"]  # 3 matched, but waits behind 2
    assert topics(hold.fence_read(2, 0.3)) == ["dev/2/cmd", "dev/3/cmd"]


def test_a_later_fence_read_first_releases_what_the_earlier_one_covered_too() -> None:
    node = Node()
    hold = hold_of(node, spacing=0.1)
    hold.admit([made(1, "dev/1/cmd", unmatched=True)], 0.0)
    hold.fence_to_publish(0.0)
    hold.admit([made(2, "dev/2/cmd", unmatched=True)], 0.05)
    hold.fence_to_publish(0.1)
    node.subscribed |= {"dev/1/cmd", "dev/2/cmd"}
    assert topics(hold.fence_read(2, 0.2)) == ["dev/1/cmd", "dev/2/cmd"]
    assert hold.fence_read(1, 0.2) == [] and not hold.in_flight


def test_stale_and_unknown_fences_release_nothing() -> None:
    node = Node()
    hold = hold_of(node)
    hold.admit([made(1, "dev/1/cmd", unmatched=True)], 0.0)
    hold.fence_to_publish(0.0)
    assert hold.fence_read(7, 0.01) == []  # never published in this run
    assert hold.fence_read(0, 0.01) == []
    assert hold.holding


def test_runs_of_a_held_stream_wait_and_count_their_publications() -> None:
    node = Node()
    hold = hold_of(node)
    run = InjectionRun(["dev/1/cmd", "dev/2/cmd"], [b"ab", b"c"], ORIGIN, 1, [2, 3], "dev/+/cmd")
    assert hold.admit([made(1, "dev/9/cmd", unmatched=True, payload=b"1234"), run], 0.0) == []
    assert hold.held_count == 3 and hold.held_bytes == 7
    hold.fence_to_publish(0.0)
    assert hold.fence_read(1, 0.01) == [run]  # dev/9/cmd not subscribed: the run goes on alone
    assert hold.held_count == 0 and hold.held_bytes == 0


def test_beyond_the_bounds_the_oldest_is_settled_at_once_and_dropped_with_a_reason_when_unmatched() -> None:
    node = Node()
    hold = hold_of(node, max_held=2)
    node.subscribed.add("dev/2/cmd")
    out = hold.admit([made(1, "dev/1/cmd", unmatched=True), made(2, "dev/2/cmd", unmatched=True),
                      made(3, "dev/3/cmd", unmatched=True), made(4, "dev/4/cmd", unmatched=True)], 0.0)
    assert topics(out) == ["dev/2/cmd"]  # matched when pushed out: injected
    assert [reason for reason, _ in node.drops] == [FULL_REASON]
    assert node.drops[0][1]["event"] == "publication_dropped" and node.drops[0][1]["filter"] == "dev/+/cmd"
    assert ("dev/1/cmd", False, False) in node.settled
    assert hold.held_count == 2 and hold.dropped == 1


def test_a_bound_in_bytes_too() -> None:
    node = Node()
    hold = hold_of(node, max_held_bytes=10)
    hold.admit([made(1, "dev/1/cmd", unmatched=True, payload=b"x" * 8)], 0.0)
    out = hold.admit([made(2, "dev/1/cmd", payload=b"y" * 8)], 0.0)  # held for order: pushes the marked one out
    assert [reason for reason, _ in node.drops] == [FULL_REASON]
    assert topics(out) == ["dev/1/cmd"] and out[0].payload == b"y" * 8  # nothing ahead of it any more: it goes
    assert not hold.holding and hold.held_bytes == 0


def test_a_fence_that_does_not_come_back_settles_what_waited_for_it_as_a_drop_after_the_timeout() -> None:
    node = Node()
    hold = hold_of(node, timeout=10.0)
    hold.admit([made(1, "dev/1/cmd", unmatched=True), made(2, "dev/2/cmd", unmatched=True)], 0.0)
    hold.fence_to_publish(0.0)
    assert hold.tick(9.9) == []
    node.subscribed.add("dev/2/cmd")
    assert topics(hold.tick(10.0)) == ["dev/2/cmd"]
    assert [reason for reason, _ in node.drops] == [TIMEOUT_REASON]
    assert hold.timeouts == 1 and not hold.in_flight
    assert hold.fence_read(1, 10.5) == []  # late: given up on


def test_a_new_broker_connection_publishes_a_fence_again_only_while_one_is_in_flight() -> None:
    node = Node()
    hold = hold_of(node)
    assert hold.republish(0.0) is None
    hold.admit([made(1, "dev/1/cmd", unmatched=True)], 0.0)
    assert hold.fence_to_publish(0.0) == 1
    assert hold.republish(1.0) == 2
    assert hold.fence_due(1.0) is None
    node.subscribed.add("dev/1/cmd")
    assert topics(hold.fence_read(2, 1.1)) == ["dev/1/cmd"]


def test_fence_topics() -> None:
    prefix = "$federation/handover/w1/subscriptions-5-"
    assert fence_number(prefix + "12", prefix) == 12
    assert fence_number(prefix + "x", prefix) is None
    assert fence_number("$federation/handover/w1/123-4", prefix) is None
