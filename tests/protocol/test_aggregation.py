"""Aggregation: the filters a node federates for its raw ones (federation.protocol.aggregation)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.protocol.aggregation import Aggregation, covers
from federation.protocol.topic_filter import FilterIndex, matches, validate_filter


def replay(aggregation: Aggregation, seen: set[str]) -> set[str]:
    """The effective set as the batches of changes tell it (what the node hears of)."""
    for batch in aggregation.take_changes():
        assert not set(batch.added) & seen, f"{batch.added} entered twice"
        assert set(batch.removed) <= seen, f"{batch.removed} left without having entered"
        seen = (seen | set(batch.added)) - set(batch.removed)
    return seen


def check(aggregation: Aggregation, raws: set[str], seen: set[str]) -> set[str]:
    seen = replay(aggregation, seen)
    assert seen == set(aggregation.effective)
    assert len(aggregation) == len(raws)
    for raw in raws:
        serving = aggregation.serving(raw)
        assert serving in aggregation.effective, (raw, serving)
        assert covers(serving, raw), f"{raw} is served by {serving}, which does not cover it"
    for form in aggregation.effective:
        assert not any(other != form and covers(other, form) for other in aggregation.effective), form
        assert any(aggregation.form_of(raw) == form for raw in raws), f"{form} serves no raw filter"
    return seen


@pytest.mark.parametrize(("wider", "narrower", "expected"), [
    ("a/#", "a", True), ("a/#", "a/b/c", True), ("a/+", "a/b", True), ("a/+", "a/+", True),
    ("a/+", "a/#", False), ("a/+/#", "a/#", False), ("#", "x/+/#", True), ("a/b", "a/+", False),
    ("a/+/c", "a/b/c", True), ("a/+/c", "a/b", False), ("+/+", "a/b/c", False), ("a", "a/#", False),
])
def test_covers_is_mqtt_containment(wider: str, narrower: str, expected: bool) -> None:
    assert covers(wider, narrower) is expected


def test_covers_agrees_with_matching_on_topics() -> None:
    levels = ["a", "b", "+", "#"]
    filters = {"/".join(p) for n in (1, 2, 3) for p in _products(levels, n)
               if "#" not in p[:-1]}
    topics = {"/".join(p) for n in (1, 2, 3, 4) for p in _products(["a", "b", "c"], n)}
    for wider in filters:
        for narrower in filters:
            if covers(wider, narrower):
                assert all(matches(wider, topic) for topic in topics if matches(narrower, topic)), (wider, narrower)


def _products(levels: list[str], n: int) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = [()]
    for _ in range(n):
        out = [(*p, level) for p in out for level in levels]
    return out


def test_per_device_filters_collapse_to_one_and_open_again() -> None:
    aggregation = Aggregation(fanout=32)
    raws = {f"dev/{i}/cmd" for i in range(1000)}
    for raw in sorted(raws):
        aggregation.add(raw)
    seen = check(aggregation, raws, set())
    assert seen == {"dev/+/cmd"}
    for raw in sorted(raws)[:990]:
        aggregation.remove(raw)
        raws.discard(raw)
    seen = check(aggregation, raws, seen)
    assert seen == raws  # fewer than half the fan-out: each federated as itself again


def test_hysteresis_keeps_the_cover_between_half_and_full_fanout() -> None:
    aggregation = Aggregation(fanout=8)
    for i in range(9):
        aggregation.add(f"d/{i}")
    assert set(aggregation.effective) == {"d/+"}
    for i in range(5):
        aggregation.remove(f"d/{i}")
    assert set(aggregation.effective) == {"d/+"}  # 4 left: not below half of 8
    aggregation.remove("d/5")
    assert set(aggregation.effective) == {"d/6", "d/7", "d/8"}


def test_a_wildcard_of_the_same_broker_covers_its_exact_filters() -> None:
    aggregation = Aggregation(fanout=0)
    raws = {"dev/1/cmd", "dev/2/cmd", "other"}
    for raw in sorted(raws):
        aggregation.add(raw)
    seen = check(aggregation, raws, set())
    aggregation.add("dev/#")
    raws.add("dev/#")
    batches = aggregation.take_changes()
    assert [(b.added, b.removed) for b in batches] == [(("dev/#",), ("dev/1/cmd", "dev/2/cmd"))]
    seen = (seen | {"dev/#"}) - {"dev/1/cmd", "dev/2/cmd"}
    seen = check(aggregation, raws, seen)
    aggregation.remove("dev/#")
    raws.discard("dev/#")
    seen = check(aggregation, raws, seen)
    assert seen == {"dev/1/cmd", "dev/2/cmd", "other"}


def test_filters_that_differ_below_the_collapsed_level_coarsen_to_multi_level() -> None:
    aggregation = Aggregation(fanout=4)
    raws = {f"dev/{i}/x{i}" for i in range(10)}
    for raw in sorted(raws):
        aggregation.add(raw)
    assert set(check(aggregation, raws, set())) == {"dev/#"}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.sampled_from(["a", "b", "c", "d", "+", "#", ""]), min_size=1,
                                                       max_size=4)), max_size=120),
       st.sampled_from([0, 1, 2, 3, 5]))
def test_every_raw_filter_is_served_by_an_effective_filter_that_covers_it(
        operations: list[tuple[bool, list[str]]], fanout: int) -> None:
    aggregation = Aggregation(fanout)
    raws: set[str] = set()
    seen: set[str] = set()
    for add, levels in operations:
        raw = "/".join(levels)
        if validate_filter(raw) is not None:
            continue
        if add:
            aggregation.add(raw)
            raws.add(raw)
        else:
            aggregation.remove(raw)
            raws.discard(raw)
        seen = check(aggregation, raws, seen)
    for raw in sorted(raws):
        aggregation.remove(raw)
    assert check(aggregation, set(), seen) == set()
    assert aggregation.federated == {}


def test_churn_of_many_devices_keeps_everything_served() -> None:
    rng = random.Random(7)
    aggregation = Aggregation(fanout=16)
    raws: set[str] = set()
    seen: set[str] = set()
    pool = [f"site/{s}/dev/{d}/{leaf}" for s in range(3) for d in range(60) for leaf in ("cmd", "#", "cfg")]
    for step in range(3000):
        raw = rng.choice(pool)
        if raw in raws:
            aggregation.remove(raw)
            raws.discard(raw)
        else:
            aggregation.add(raw)
            raws.add(raw)
        if step % 50 == 0:
            seen = check(aggregation, raws, seen)
    check(aggregation, raws, seen)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["a", "b", "$x", "+", "#", ""]), min_size=1, max_size=4), max_size=40),
       st.lists(st.lists(st.sampled_from(["a", "b", "$x", "c", ""]), min_size=1, max_size=5), max_size=20),
       st.sampled_from([0, 1, 2]))
def test_matching_gives_what_a_filter_index_gives(filters: list[list[str]], topics: list[list[str]],
                                                  fanout: int) -> None:
    aggregation = Aggregation(fanout)
    index = FilterIndex()
    for levels in filters:
        raw = "/".join(levels)
        if validate_filter(raw) is None and not raw.startswith("$"):
            aggregation.add(raw)
            index.add(raw)
    for levels in topics:
        topic = "/".join(levels)
        assert aggregation.matching(topic) == index.matching(topic), topic
