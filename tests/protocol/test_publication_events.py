"""Event schema version 2: what happens to publications, one event per run (federation.protocol.publication_events).

A run event carries exactly what the per-publication events of version 1 carried; `expand` gives them back; runs
are cut where what the publications share differs, and come before any later event of the same input.
"""

from __future__ import annotations

import random

from federation.protocol import events
from federation.protocol.node import Node
from federation.protocol.publication_events import PublicationRuns, expand, expand_all, ranges
from federation.protocol.types import Address, Event
from federation.protocol.wire import MODE_IN_MESH, MODE_TO_MEMBER, MODE_TOWARD_CORE

ORIGIN = Address("10.0.0.1", 10500)
OTHER = Address("10.0.0.2", 10500)


def test_ranges_are_sorted_merged_and_cover_every_seq() -> None:
    assert ranges([5, 6, 7, 9, 1, 2, 7]) == [[1, 2], [5, 7], [9, 9]]
    assert ranges([]) == []
    assert ranges([2**63 - 1]) == [[2**63 - 1, 2**63 - 1]]


def test_a_run_event_expands_to_the_version_1_events_it_replaces() -> None:
    runs = PublicationRuns("10.0.0.2:10500")
    for seq, topic in ((3, "a/x"), (4, "a/y"), (6, "a/x")):
        runs.delivered(1.5, ORIGIN, 7, seq, topic, "a/#", 2)
    for seq in (3, 4):
        runs.forwarded(1.5, ORIGIN, 7, seq, "a/#", ["10.0.0.3:10500"], MODE_IN_MESH)
    runs.duplicate(1.5, ORIGIN, 7, 9, "a/#", "10.0.0.4:10500")
    taken = runs.take()
    assert not runs
    assert [(e.type, e.time) for e in taken] == [(events.PUBLICATIONS_DELIVERED, 1.5),
                                                 (events.PUBLICATIONS_FORWARDED, 1.5),
                                                 (events.DUPLICATES_DROPPED, 1.5)]
    assert taken[0].fields == {"origin": "10.0.0.1:10500", "epoch": 7, "seqs": [[3, 4], [6, 6]],
                               "topics": ["a/x", "a/y", "a/x"], "filter": "a/#", "hops": 2}
    assert taken[1].fields["mode"] == "mesh" and taken[1].fields["seqs"] == [[3, 4]]
    records = expand_all(e.to_json_dict() for e in taken)
    assert [(r["type"], r["pub"], r.get("topic")) for r in records] == [
        ("publication_delivered", "10.0.0.1:10500/7/3", "a/x"), ("publication_delivered", "10.0.0.1:10500/7/4", "a/y"),
        ("publication_delivered", "10.0.0.1:10500/7/6", "a/x"), ("publication_forwarded", "10.0.0.1:10500/7/3", None),
        ("publication_forwarded", "10.0.0.1:10500/7/4", None), ("duplicate_dropped", "10.0.0.1:10500/7/9", None)]
    assert records[0] == {"v": 2, "t": 1.5, "node": "10.0.0.2:10500", "type": "publication_delivered",
                          "pub": "10.0.0.1:10500/7/3", "topic": "a/x", "filter": "a/#", "hops": 2}
    assert list(expand({"type": "node_started", "t": 1})) == [{"type": "node_started", "t": 1}]


def test_one_topic_for_all_is_written_once_and_runs_split_where_they_differ() -> None:
    runs = PublicationRuns("n")
    runs.originated_run(2.0, ORIGIN, 1, [1, 2, 3], ["t", "t", "t"], 1, False, 30, ["t/#", "#"])
    runs.originated(2.0, ORIGIN, 1, 4, "t", 1, False, 5, ["t/#"])
    runs.originated(2.0, ORIGIN, 1, 5, "t", 0, False, 5, ["t/#"])  # another QoS: another run
    runs.forwarded(2.0, ORIGIN, 1, 1, "t/#", ["a"], MODE_TOWARD_CORE)
    runs.forwarded(2.0, ORIGIN, 1, 2, "t/#", ["b"], MODE_TOWARD_CORE)  # another next hop
    runs.forwarded(2.0, OTHER, 1, 3, "$share/g/t/#", ["b"], MODE_TO_MEMBER)
    taken = runs.take()
    assert [e.fields["seqs"] for e in taken] == [[[1, 4]], [[5, 5]], [[1, 1]], [[2, 2]], [[3, 3]]]
    assert taken[0].fields == {"origin": "10.0.0.1:10500", "epoch": 1, "seqs": [[1, 4]], "topics": ["t"], "qos": 1,
                               "retain": False, "bytes": 35, "filters": ["#", "t/#"]}
    assert [e.fields["mode"] for e in taken[2:]] == ["toward_core", "toward_core", "to_member"]


def test_runs_come_before_the_next_event_of_the_input() -> None:
    node = Node(ORIGIN, [OTHER], 1, random.Random(1))
    node.start(0.0)
    node.events_emitted()
    node.outbox.runs.delivered(1.0, OTHER, 3, 8, "a", "#", 1)
    node.emit(events.ORDER_GAP_SKIPPED, 1.0, pub="x", filter="#", reason="timeout", seconds=1.0)
    node.outbox.runs.delivered(1.0, OTHER, 3, 9, "a", "#", 1)
    assert [e.type for e in node.events_emitted()] == [events.PUBLICATIONS_DELIVERED, events.ORDER_GAP_SKIPPED,
                                                       events.PUBLICATIONS_DELIVERED]


def test_a_burst_of_plain_publications_is_one_line_at_each_stage() -> None:
    """What an event log gains: 64 QoS 0 publications read in one pass are three events, not 192."""
    from suites.bench.hotpath import STAGES, Pipeline

    pipeline = Pipeline(0, b"x" * 16)
    emitted: list[Event] = []
    pipeline.event_sink = emitted.extend  # type: ignore[assignment]
    try:
        pipeline.run_burst(64, {stage: 0.0 for stage in STAGES})
    finally:
        pipeline.close()
    kinds = [e.type for e in emitted if e.type in events.PER_PUBLICATION]
    assert sorted(kinds) == sorted([events.PUBLICATIONS_ORIGINATED, events.PUBLICATIONS_FORWARDED,
                                    events.PUBLICATIONS_DELIVERED])
    assert len(expand_all(e.to_json_dict() for e in emitted if e.type in events.PER_PUBLICATION)) == 3 * 64
