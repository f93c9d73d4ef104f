"""The Spark job's sequential parts, without Spark: filter regexes, timelines, the replay, clock offsets."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.protocol.topic_filter import matches, validate_filter
from federation.spark import clocks
from federation.spark.replay import Replay, parse_broker_id
from federation.spark.timeline import Disruption, Timeline, World, from_sim_events, inferred
from federation.spark.topics import filter_regex

# ---------------------------------------------------------------- topic filters as regexes

LEVELS = st.sampled_from(["a", "b", "", "x y", "é", "+", "#", "$SYS", "a.b", "(", "[x]", "*", "\\"])


@settings(max_examples=400, deadline=None)
@given(filter_levels=st.lists(LEVELS, min_size=1, max_size=4),
       topic_levels=st.lists(LEVELS.filter(lambda s: s not in ("+", "#")), min_size=1, max_size=4))
def test_filter_regex_matches_exactly_what_the_engine_matches(filter_levels: list[str],
                                                              topic_levels: list[str]) -> None:
    filter_ = "/".join(filter_levels)
    topic = "/".join(topic_levels)
    if validate_filter(filter_) is not None or not topic:
        return
    # Python's re reads these patterns as java.util.regex does (escapes, (?!...), [^/]).
    assert bool(re.fullmatch(filter_regex(filter_), topic)) == matches(filter_, topic), (filter_, topic)


@pytest.mark.parametrize(("filter_", "topic", "expected"), [
    ("a/#", "a", True), ("a/#", "a/b/c", True), ("a/+", "a/", True), ("a/+", "a/b/c", False),
    ("#", "$SYS/x", False), ("+/x", "$a/x", False), ("a.b", "axb", False), ("mytopic/#", "mytopic/x", True),
])
def test_filter_regex_examples(filter_: str, topic: str, expected: bool) -> None:
    assert bool(re.fullmatch(filter_regex(filter_), topic)) is expected


# ---------------------------------------------------------------- timelines

NAMES = {"n0": "10.0.0.1:10500", "n1": "10.0.0.2:10500", "n2": "10.0.0.3:10500"}


def test_world_components_follow_cuts_kills_and_one_way_cuts() -> None:
    world = World(NAMES, [("n0", "n1"), ("n1", "n2")])
    world.apply(Disruption(0, "start", "start"))
    assert world.components() == [("n0", "n1", "n2")]
    world.apply(Disruption(1, "cut", "cut n1->n2", a="n1", b="n2", oneway=True))
    assert world.components() == [("n0", "n1"), ("n2",)]  # a link carries traffic only if both ways work
    world.apply(Disruption(2, "heal", "heal n1-n2", a="n1", b="n2"))
    world.apply(Disruption(3, "kill", "kill n1", node="n1"))
    assert world.components() == [("n0",), ("n2",)]
    world.apply(Disruption(4, "loss", "loss 10% n0-n1", percent=10, link=("n0", "n1")))
    assert world.loss_active()
    world.apply(Disruption(5, "loss", "loss 0% all links", percent=0))
    assert not world.loss_active()


def test_same_instant_disruptions_share_a_phase_labelled_like_the_simulator() -> None:
    records = [
        {"t": 0.0, "type": "sim_start", "nodes": NAMES, "links": [["n0", "n1"], ["n1", "n2"]]},
        {"t": 12.0, "type": "sim_cut", "a": "n0", "b": "n1", "oneway": False},
        {"t": 12.0, "type": "sim_kill", "name": "n2"},
        {"t": 20.0, "type": "sim_loss", "percent": 10.0, "link": None},
    ]
    timeline = from_sim_events(records, settle=5)
    assert timeline is not None
    phases = timeline.phases(end=30)
    assert [p.label for p in phases] == ["start", "cut n0-n1, kill n2 @12.0s", "loss 10% all links @20.0s"]
    assert phases[1].components == [("n0",), ("n1",)]
    assert phases[1].end == 20.0 and phases[2].end == 30
    assert phases[2].loss_active


def test_detected_timeline_from_node_events() -> None:
    def row(t: float, node: str, kind: str, **fields: Any) -> SimpleNamespace:
        return SimpleNamespace(t=t, node=node, type=kind, name=fields.get("name"),
                               neighbours=fields.get("neighbours"), neighbour=fields.get("neighbour"))

    a, b = NAMES["n0"], NAMES["n1"]
    rows = [row(0.0, a, "node_started", name="n0", neighbours=[b]),
            row(0.5, b, "node_started", name="n1", neighbours=[a]),
            row(9.0, a, "neighbour_down", neighbour=b), row(9.4, b, "neighbour_down", neighbour=a),
            row(15.0, a, "neighbour_up", neighbour=b), row(20.0, b, "node_stopped")]
    timeline = inferred(rows, settle=5)
    assert timeline.names == {"n0": a, "n1": b} and timeline.links == [("n0", "n1")]
    phases = timeline.phases(phase_gap=3.0)
    assert [p.label for p in phases] == ["start n0, start n1 @0.0s", "cut n0-n1 @9.0s", "heal n0-n1 @15.0s",
                                         "stop n1 @20.0s"]
    assert [p.components for p in phases] == [[("n0", "n1")], [("n0",), ("n1",)], [("n0", "n1")], [("n0",)]]


# ---------------------------------------------------------------- the replay

def _event(t: float, node: str, kind: str, **fields: Any) -> SimpleNamespace:
    base = dict.fromkeys(("name", "broker_id", "neighbours", "added", "removed", "core", "previous", "filter",
                          "reason", "vid", "client", "federated", "parents", "neighbour"))
    base.update(fields)
    return SimpleNamespace(t=t, node=node, type=kind, **base)


def test_replay_finds_the_instant_every_view_agrees() -> None:
    a, b = NAMES["n0"], NAMES["n1"]
    timeline = Timeline({"n0": a, "n1": b}, [("n0", "n1")], [Disruption(0.0, "start", "start")], settle=5)
    phases = timeline.phases(end=10)
    events = [
        _event(0.0, a, "node_started", broker_id=f"5@{a}"), _event(0.0, b, "node_started", broker_id=f"3@{b}"),
        _event(0.0, a, "subscription_added", client="c", filter="$share/g/x/#", federated="x/#"),
        _event(0.1, a, "table_changed", added=[b], removed=[]),
        _event(0.1, a, "management_core_changed", core=f"3@{b}", previous=f"5@{a}"),
        _event(0.2, b, "table_changed", added=[a], removed=[]),
        # both agree on members and core now, but x/# has no topic core yet
        _event(0.5, a, "topic_core_changed", filter="x/#", core=f"5@{a}", reason="claimed"),
        _event(0.7, b, "topic_core_changed", filter="x/#", core=f"5@{a}", reason="announced"),
        _event(3.0, a, "subscription_removed", client="c", filter="$share/g/x/#", federated="x/#"),
    ]
    result = Replay(phases, timeline.names).run(events)
    assert result.phases[0].settled_at == 0.7
    assert result.phases[0].components[0].settled_at == 0.7
    assert [(s.node, s.federated, s.since, s.until) for s in result.subscriptions] == [(a, "x/#", 0.0, 3.0)]
    assert result.core_changes[0]["kind"] == "management"


def test_replay_keeps_subscriptions_a_restarted_node_replays_and_drops_the_others() -> None:
    a = NAMES["n0"]
    timeline = Timeline({"n0": a}, [], [Disruption(0.0, "start", "start"),
                                        Disruption(5.0, "restart", "restart n0", node="n0")], settle=5)
    events = [
        _event(0.0, a, "node_started", broker_id=f"1@{a}"),
        _event(1.0, a, "subscription_added", client="c1", filter="k/#", federated="k/#"),
        _event(1.0, a, "subscription_added", client="c2", filter="m", federated="m"),
        _event(5.0, a, "node_started", broker_id=f"1@{a}"),
        _event(5.0, a, "subscription_added", client="c1", filter="k/#", federated="k/#"),
    ]
    result = Replay(timeline.phases(end=9), timeline.names).run(events)
    spans = {(s.client, s.since, s.until) for s in result.subscriptions}
    assert spans == {("c1", 1.0, None), ("c2", 1.0, 5.0)}


def test_replay_reports_why_a_component_never_converged() -> None:
    a, b = NAMES["n0"], NAMES["n1"]
    timeline = Timeline({"n0": a, "n1": b}, [("n0", "n1")], [Disruption(0.0, "start", "start")], settle=5)
    events = [_event(0.0, a, "node_started", broker_id=f"1@{a}")]  # n1 never logged anything
    result = Replay(timeline.phases(end=5), timeline.names).run(events)
    assert result.phases[0].settled_at is None
    assert result.phases[0].components[0].problem == "no view yet from n1"


def test_parse_broker_id() -> None:
    assert parse_broker_id("7@10.0.0.1:10500") == (7, "10.0.0.1", 10500)
    assert parse_broker_id("3@::1:10500") == (3, "::1", 10500)
    assert parse_broker_id(None) is None and parse_broker_id("junk") is None


# ---------------------------------------------------------------- clock offsets

def test_offsets_compose_along_the_path_of_least_error() -> None:
    samples = [
        clocks.Sample("A", "B", 0.30, 0.001),   # B = A + 0.30
        clocks.Sample("B", "A", -0.31, 0.010),  # worse sample of the same pair: ignored
        clocks.Sample("C", "B", 0.10, 0.002),   # B = C + 0.10, so C = A + 0.20
        clocks.Sample("A", "C", 0.50, 0.050),   # a poor direct measure: the two-hop path is better
    ]
    estimate = clocks.estimate(samples, ["A", "B", "C", "D"], mode="auto", reference="A")
    assert estimate.offsets["B"].offset == pytest.approx(0.30)
    assert estimate.offsets["C"].offset == pytest.approx(0.20)
    assert estimate.offsets["C"].error == pytest.approx(0.003) and estimate.offsets["C"].hops == 2
    assert estimate.offsets["D"].error is None and not estimate.offsets["D"].applied
    assert estimate.correction() == {"B": pytest.approx(0.30), "C": pytest.approx(0.20)}


def test_auto_mode_leaves_offsets_within_their_error_bound() -> None:
    samples = [clocks.Sample("A", "B", 0.0004, 0.001), clocks.Sample("B", "C", 0.2, 0.001)]
    estimate = clocks.estimate(samples, ["A", "B", "C"], mode="auto", reference="A")
    assert not estimate.offsets["B"].applied  # 0.4 ms offset, 1 ms bound: indistinguishable from 0
    assert estimate.offsets["C"].applied
    assert clocks.estimate(samples, ["A", "B", "C"], mode="never", reference="A").correction() == {}
    assert set(clocks.estimate(samples, ["A", "B", "C"], mode="always", reference="A").correction()) == {"B", "C"}


def test_the_reference_is_the_centre_of_the_measurements() -> None:
    samples = [clocks.Sample("A", "B", 0.0, 0.001), clocks.Sample("B", "C", 0.0, 0.001)]
    assert clocks.estimate(samples, ["A", "B", "C"]).reference == "B"


def test_the_reference_is_the_clock_most_nodes_share() -> None:
    # D's clock is 0.3 s ahead; A, B, C agree. D is a leaf, so B would be the centre by error alone.
    samples = [clocks.Sample("A", "B", 0.0, 0.001), clocks.Sample("B", "C", 0.0, 0.001),
               clocks.Sample("B", "D", 0.3, 0.001)]
    estimate = clocks.estimate(samples, ["A", "B", "C", "D"])
    assert estimate.reference in ("A", "B", "C")
    assert estimate.correction() == {"D": pytest.approx(0.3)}
