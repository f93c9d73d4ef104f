"""Event schema version 2 (run events): the converter, and the job's report for v1, v2 and mixed logs.

The converter (federation/spark/convert.py) is checked line by line without Spark; the job then reads a
simulator log as the simulator writes it (v2), the same log as a v1 writer wrote it, that v1 log converted
back to v2, and a log whose nodes wrote both versions, and must give the same report for the same
publications.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from federation.protocol.publication_events import expand
from federation.spark.convert import to_v2

# ---------------------------------------------------------------- the converter


def _line(t: float, node: str, kind: str, **fields: Any) -> str:
    return json.dumps({"v": 1, "t": t, "node": node, "type": kind, **fields}, separators=(",", ":"))


A, B = "10.0.0.1:10500", "10.0.0.2:10500"


def _originated(t: float, seq: int, topic: str = "a/b", size: int = 10, filters: tuple[str, ...] = ("a/#",)) -> str:
    return _line(t, A, "publication_originated", pub=f"{A}/7/{seq}", topic=topic, qos=0, retain=False, size=size,
                 filters=list(filters), name="n0")


def _converted(*lines: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in to_v2(lines)]


def test_a_burst_becomes_one_run_with_its_topics_bytes_and_filters() -> None:
    out = _converted(_originated(1.0, 5, size=10), _originated(1.0, 6, size=20, filters=("a/+",)),
                     _originated(1.0, 7, size=30))
    assert out == [{"v": 2, "t": 1.0, "node": A, "type": "publications_originated", "origin": A, "epoch": 7,
                    "seqs": [[5, 7]], "topics": ["a/b"], "qos": 0, "retain": False, "bytes": 60,
                    "filters": ["a/#", "a/+"], "name": "n0"}]


def test_topics_per_publication_gaps_and_a_repeat() -> None:
    out = _converted(_originated(1.0, 1, topic="a/x"), _originated(1.0, 2, topic="a/y"), _originated(1.0, 4),
                     _originated(1.0, 4))
    assert [(o["seqs"], o["topics"]) for o in out] == [([[1, 2], [4, 4]], ["a/x", "a/y", "a/b"]),
                                                       ([[4, 4]], ["a/b"])]  # a repeated id starts a new run


def test_stage_fields_split_runs_and_the_simulators_lines_stay_in_place() -> None:
    def forwarded(seq: int, filter_: str) -> str:
        return _line(1.0, A, "publication_forwarded", pub=f"{A}/7/{seq}", filter=filter_, to=[B], mode="mesh")

    publish = _line(1.0, A, "sim_publish", pub=f"{A}/7/1")
    out = _converted(publish, forwarded(1, "a/#"), forwarded(1, "a/+"), publish, forwarded(2, "a/#"))
    assert [(o["type"], o.get("filter"), o.get("seqs")) for o in out] == [
        ("sim_publish", None, None), ("publications_forwarded", "a/#", [[1, 2]]),
        ("publications_forwarded", "a/+", [[1, 1]]), ("sim_publish", None, None)]
    assert all(o["v"] == 2 for o in out) and out[1]["to"] == [B] and out[1]["mode"] == "mesh"


def test_a_run_never_crosses_another_record_or_instant() -> None:
    cut = _line(2.0, "sim", "sim_cut", a="n0", b="n1", oneway=False)
    out = _converted(_originated(2.0, 1), cut, _originated(2.0, 2), _originated(2.5, 3))
    assert [(o["type"], o.get("seqs")) for o in out] == [
        ("publications_originated", [[1, 1]]), ("sim_cut", None), ("publications_originated", [[2, 2]]),
        ("publications_originated", [[3, 3]])]


def test_deliveries_and_duplicate_drops_keep_their_stage_fields() -> None:
    delivered = [_line(3.0, B, "publication_delivered", pub=f"{A}/7/{seq}", topic="a/b", filter="a/#", hops=2)
                 for seq in (1, 2)]
    dropped = _line(3.0, B, "duplicate_dropped", pub=f"{A}/7/1", filter="a/#", source=A)
    out = _converted(*delivered, dropped)
    assert out == [
        {"v": 2, "t": 3.0, "node": B, "type": "publications_delivered", "origin": A, "epoch": 7, "seqs": [[1, 2]],
         "topics": ["a/b"], "filter": "a/#", "hops": 2},
        {"v": 2, "t": 3.0, "node": B, "type": "duplicates_dropped", "origin": A, "epoch": 7, "seqs": [[1, 1]],
         "filter": "a/#", "source": A}]


# ---------------------------------------------------------------- the job on v1, v2 and mixed logs

BURSTS = """\
name: bursts
description: publications in bursts (one instant each, as a tb run), one at the instant of a cut
duration: 30
nodes: {n0: {id: 0}, n1: {id: 1}, n2: {id: 2}, n3: {id: 3}}
links: [[n0, n1], [n1, n2], [n2, n3], [n3, n0]]
events:
  - {at: 0.5, subscribe: {node: n0, client: s0, filter: "x/#"}}
  - {at: 0.5, subscribe: {node: n2, client: s2, filter: "x/+"}}
  - {at: 6, publish: {node: n1, topic: x/y, count: 20, interval: 0}}
  - {at: 7, publish: {node: n1, topic: x/z, count: 15, interval: 0}}
  - {at: 7, publish: {node: n1, topic: x/z/deep, count: 5, interval: 0}}
  - {at: 7, publish: {node: n3, topic: x/y, count: 20, interval: 0}}
  - {at: 11, cut: [n0, n1]}
  - {at: 11, publish: {node: n1, topic: x/y, count: 20, interval: 0}}
  - {at: 18.5, heal: [n0, n1]}
  - {at: 19, publish: {node: n1, topic: x/q, count: 20, interval: 0.1}}
"""

DAMAGED_V2 = [
    # a range backwards, topics of the wrong length, no origin, a run far too long
    '{"v":2,"t":9.0,"node":"10.0.0.2:10500","type":"publications_delivered","origin":"10.0.0.9:1","epoch":1,'
    '"seqs":[[5,3]],"topics":["x/y"],"filter":"x/#","hops":1}',
    '{"v":2,"t":9.0,"node":"10.0.0.9:1","type":"publications_originated","origin":"10.0.0.9:1","epoch":1,'
    '"seqs":[[1,3]],"topics":["x/y","x/z"],"qos":0,"retain":false,"bytes":3,"filters":[]}',
    '{"v":2,"t":9.0,"node":"10.0.0.9:1","type":"publications_forwarded","epoch":1,"seqs":[[1,1]],'
    '"filter":"x/#","to":["10.0.0.1:10500"],"mode":"mesh"}',
    '{"v":2,"t":9.0,"node":"10.0.0.2:10500","type":"duplicates_dropped","origin":"10.0.0.9:1","epoch":1,'
    '"seqs":[[1,9000000000]],"filter":"x/#","source":"10.0.0.1:10500"}',
    # a simulator record cut short (parsed, so corrupt), and one with spaces (parsed, so counted)
    '{"v":1,"t":9.0,"node":"10.0.0.2:10500","type":"sim_inject","pub":"10.0.0.9:1/1/1"',
    '{"v": 1, "t": 9.0, "node": "10.0.0.2:10500", "type": "sim_inject", "pub": "10.0.0.9:1/1/1"}',
]


def _compact(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"))


def _as_v1(lines: list[str]) -> list[dict[str, Any]]:
    """A version 2 log as a version 1 writer wrote it: one line per publication, `"v": 1` throughout."""
    return [{**item, "v": 1} for line in lines for item in expand(json.loads(line))]


def _same_report(mine: dict[str, Any], other: dict[str, Any]) -> None:
    for key in sorted(set(mine) | set(other)):
        if key not in ("job", "input", "tables"):
            assert mine.get(key) == other.get(key), key


def test_a_v2_log_and_a_mixed_log_give_the_report_of_the_v1_log(spark: Any, tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    from test_spark_job import assert_matches_simulator, run_job

    from federation.scenario.loader import load_scenario
    from federation.sim import run_scenario

    scenario = tmp_path / "bursts.yaml"
    scenario.write_text(BURSTS)
    native = tmp_path / "native.jsonl"  # what the simulator writes: version 2, its own runs
    truth = run_scenario(load_scenario(str(scenario)), seed=1, events_path=str(native))
    native_lines = native.read_text().splitlines()
    lines = [_compact(record) for record in _as_v1(native_lines)]  # what a release before version 2 wrote
    v1 = tmp_path / "v1.jsonl"
    v1.write_text("".join(line + "\n" for line in lines))
    assert len(native_lines) < len(lines) * 0.6  # bursts are runs
    v2 = tmp_path / "v2.jsonl"  # the converter's runs (one per instant, not the simulator's)
    v2.write_text("".join(line + "\n" for line in to_v2(lines)))
    assert len(v2.read_text().splitlines()) < len(lines) * 0.6

    first = run_job(spark, tmp_path / "out-v1", "--events", str(v1))
    assert_matches_simulator(first, truth)
    for name, log in (("v2", v2), ("native", native)):
        second = run_job(spark, tmp_path / f"out-{name}", "--events", str(log))
        assert second["input"]["by_type"]["publications_originated"] < truth["publications"]["sent"], name
        assert second["input"]["per_publication"] == first["input"]["per_publication"], name
        assert second["input"]["first_t"] == first["input"]["first_t"], name
        assert second["input"]["last_t"] == first["input"]["last_t"], name
        _same_report(second, first)

    # Mixed: n1 (a publisher) and n2 (a subscriber) upgraded, n0 and n3 not; two deliveries written twice (at
    # a v1 node and at a v2 node: duplicates); and damaged or odd lines.
    upgraded = ('"node":"10.0.0.2:10500"', '"node":"10.0.0.3:10500"')
    mixed_lines: list[str] = []
    block: list[str] = []
    for line in lines + [""]:
        if line and any(node in line for node in upgraded):
            block.append(line)
            continue
        mixed_lines.extend(to_v2(block))
        block = []
        if line:
            mixed_lines.append(line)
    repeated = [next(line for line in mixed_lines if '"type":"publication_delivered"' in line),
                next(line for line in mixed_lines if '"type":"publications_delivered"' in line)]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(line + "\n" for line in mixed_lines + repeated + DAMAGED_V2))
    third = run_job(spark, tmp_path / "out-mixed", "--events", str(mixed))
    run_size = sum(last - first + 1 for first, last in json.loads(repeated[1])["seqs"])
    assert third["publications"]["duplicates"] == 1 + run_size
    assert third["input"]["corrupt"] == 5
    assert third["input"]["by_type"]["sim_inject"] == first["input"]["by_type"]["sim_inject"] + 1
    assert any("5 of" in warning and "corrupt" in warning for warning in third["warnings"])
    third["publications"]["duplicates"] = 0
    for row in third["publications_by_phase"]:
        row["duplicates"] = 0
    third["warnings"] = first["warnings"]
    _same_report(third, first)
