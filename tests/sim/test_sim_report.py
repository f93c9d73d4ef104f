"""The report from hand-made plain records (no simulator involved)."""

from __future__ import annotations

import json

from federation.scenario.report import (
    DeliveryRecord,
    NodeRecord,
    PhaseRecord,
    PublicationRecord,
    TrafficRecord,
    build_report,
    classify,
    percentile,
)

TRAFFIC = TrafficRecord({"hl": (100, 3000), "fd": (20, 1400)}, data_packets=12, data_bytes=1200, node_seconds=40.0)


def report(publications: list[PublicationRecord], deliveries: list[DeliveryRecord],
           **extra: object) -> dict[str, object]:
    arguments: dict[str, object] = {
        "scenario": "hand", "seed": 3, "backend": "test", "duration": 20.0, "publications": publications,
        "deliveries": deliveries, "phases": [], "nodes": [], "traffic": TRAFFIC, "violations": [],
        "wall_seconds": 1.23456,
    }
    arguments.update(extra)
    return build_report(**arguments)  # type: ignore[arg-type]


def test_every_category_is_counted() -> None:
    publications = [
        PublicationRecord("p1", "a", "t/1", 10.0, True, frozenset({"b", "c", "d"})),
        PublicationRecord("p2", "a", "t/2", 11.0, False, frozenset()),
    ]
    deliveries = [
        DeliveryRecord("p1", "b", 10.010, True),
        DeliveryRecord("p1", "b", 10.020, True),   # duplicate
        DeliveryRecord("p1", "c", 10.030, True),
        # d: lost
        DeliveryRecord("p1", "e", 10.040, False),  # unexpected: not subscribed
        DeliveryRecord("p1", "f", 10.050, True),   # subscribed, not expected (young subscription)
        DeliveryRecord("p2", "b", 11.5, True),     # outside the bound
        DeliveryRecord("p2", "a", 11.5, True),     # back to its origin: unexpected
    ]
    outcome = classify(publications, deliveries)
    assert (outcome.sent, outcome.expected_deliveries, outcome.delivered, outcome.lost) == (2, 3, 2, 1)
    assert (outcome.duplicates, outcome.unexpected, outcome.delivered_outside_bound) == (1, 2, 2)
    assert [round(value, 6) for value in sorted(outcome.latencies)] == [0.01, 0.03]
    text = "\n".join(outcome.violations)
    assert "not delivered to d" in text
    assert "2 times to b" in text
    assert "to e, which had no matching subscription" in text
    assert "p2" not in text, "publications outside the bound never raise violations"
    assert len(outcome.violations) == 3


def test_report_schema_and_values() -> None:
    publications = [PublicationRecord(f"p{n}", "a", "t", float(n), True, frozenset({"b"})) for n in range(10)]
    deliveries = [DeliveryRecord(f"p{n}", "b", n + (n + 1) / 100, True) for n in range(10)]
    phases = [PhaseRecord("start", 0.0, 1.5), PhaseRecord("cut a-b @5.0s", 5.0, None)]
    nodes = [NodeRecord("b", True, "2@10.0.0.2:10500", "1@10.0.0.1:10500", {"t": "1@10.0.0.1:10500"}, 2),
             NodeRecord("a", False)]
    result = report(publications, deliveries, phases=phases, nodes=nodes, violations=["loop!"])
    assert list(result) == ["scenario", "seed", "backend", "duration", "publications", "convergence", "final",
                            "control", "data", "invariants", "wall_seconds"]
    assert result["publications"] == {
        "sent": 10, "expected_deliveries": 10, "delivered": 10, "lost": 0, "duplicates": 0, "unexpected": 0,
        "delivered_outside_bound": 0, "latency": {"p50": 0.05, "p90": 0.09, "p99": 0.1, "max": 0.1},
    }
    assert result["convergence"] == [
        {"phase": "start", "at": 0.0, "seconds": 1.5, "settled_at": 1.5, "resolution": 0.0},
        {"phase": "cut a-b @5.0s", "at": 5.0, "seconds": None, "settled_at": None, "resolution": 0.0},
    ]
    final = result["final"]
    assert isinstance(final, dict) and list(final) == ["a", "b"]
    assert final["a"] == {"alive": False, "broker_id": None, "management_core": None, "topic_cores": {},
                          "members": 0}
    assert final["b"]["members"] == 2
    assert result["control"] == {
        "packets": 120, "bytes": 4400,
        "by_type": {"fd": {"packets": 20, "bytes": 1400}, "hl": {"packets": 100, "bytes": 3000}},
        "per_node_per_second": {"packets": 3.0, "bytes": 110.0},
    }
    assert result["data"] == {"packets": 12, "bytes": 1200, "copies_per_publication": 1.2}
    assert result["invariants"] == {"ok": False, "violations": ["loop!"]}
    assert result["wall_seconds"] == 1.235
    json.dumps(result)  # JSON-ready


def test_empty_run() -> None:
    result = report([], [])
    publications = result["publications"]
    assert isinstance(publications, dict)
    assert publications["sent"] == 0 and publications["latency"] == {"p50": None, "p90": None, "p99": None,
                                                                      "max": None}
    assert result["invariants"] == {"ok": True, "violations": []}
    assert result["data"] == {"packets": 12, "bytes": 1200, "copies_per_publication": 0.0}


def test_unknown_publication_is_unexpected() -> None:
    outcome = classify([], [DeliveryRecord("ghost", "b", 1.0, True)])
    assert outcome.unexpected == 1
    assert "never sent" in outcome.violations[0]


def test_long_violation_lists_are_summarised() -> None:
    publications = [PublicationRecord(f"p{n}", "a", "t", 1.0, True, frozenset({"b"})) for n in range(50)]
    outcome = classify(publications, [])
    assert outcome.lost == 50
    assert len(outcome.violations) == 21
    assert outcome.violations[-1] == "... and 30 more lost"


def test_percentile_nearest_rank() -> None:
    values = [float(n) for n in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([4.0], 90) == 4.0
    assert percentile([], 50) is None
