"""The Spark job end to end: simulator logs against the simulator's report, damaged input, the netns harness.

One local[2] Spark session serves every test of the run (`spark` fixture, tests/spark/conftest.py).
The simulator's report is an independent computation (ground truth kept by the simulator itself); the
job sees only the event log.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed: pip install -e '.[spark]'")

from federation.netns import run_scenario as run_on_netns  # noqa: E402
from federation.netns import system as netns_system  # noqa: E402
from federation.scenario.loader import load_scenario  # noqa: E402
from federation.sim import run_scenario  # noqa: E402
from federation.sim.runner import Simulation  # noqa: E402
from federation.spark.convergence import main as job  # noqa: E402

NETNS_UNAVAILABLE = netns_system.unavailable_reason()

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = ROOT / "configs" / "topologies"
TIME_TOLERANCE = 1e-5
"""seconds: event times are written rounded to the microsecond"""


def simulate(tmp_path: Path, scenario: str, seed: int = 1) -> tuple[Path, dict[str, Any]]:
    events = tmp_path / f"{scenario}.jsonl"
    report = run_scenario(load_scenario(str(TOPOLOGIES / f"{scenario}.yaml")), seed=seed, events_path=str(events))
    return events, report


def run_job(spark: Any, out: Path, *arguments: str) -> dict[str, Any]:
    assert job([*arguments, "--out", str(out), "--no-plots"], spark=spark) == 0
    return json.loads((out / "report.json").read_text())


def assert_matches_simulator(mine: dict[str, Any], truth: dict[str, Any]) -> None:
    for key in ("sent", "expected_deliveries", "delivered", "lost", "duplicates", "unexpected",
                "delivered_outside_bound"):
        assert mine["publications"][key] == truth["publications"][key], key
    for key in ("p50", "p90", "p99", "max"):
        expected, got = truth["publications"]["latency"][key], mine["publications"]["latency"][key]
        assert (got is None) == (expected is None), key
        if expected is not None:
            assert got == pytest.approx(expected, abs=TIME_TOLERANCE), key
    assert [(p["phase"], p["at"]) for p in mine["convergence"]] == \
        [(p["phase"], p["at"]) for p in truth["convergence"]]
    for got, expected in zip(mine["convergence"], truth["convergence"], strict=True):
        if expected["seconds"] is None:
            assert got["seconds"] is None, got["phase"]
        else:
            assert got["seconds"] == pytest.approx(expected["seconds"], abs=TIME_TOLERANCE), got["phase"]


# ---------------------------------------------------------------- against the simulator

@pytest.mark.parametrize("scenario", [
    pytest.param("seed-partition", marks=pytest.mark.slow),  # cut and heal; by default through the packaging test
    "wildcards",           # several matching filters, unsubscribe, disconnect
    pytest.param("ring6", marks=pytest.mark.slow),  # kill and restart: by default through the scenario file below
    pytest.param("lossy", marks=pytest.mark.slow),
    pytest.param("oneway-cut", marks=pytest.mark.slow),
    pytest.param("id-collision", marks=pytest.mark.slow),
    pytest.param("seed-partition-core-isolated", marks=pytest.mark.slow),
])
def test_convergence_and_deliveries_equal_the_simulators_report(spark: Any, tmp_path: Path, scenario: str) -> None:
    events, truth = simulate(tmp_path, scenario)
    mine = run_job(spark, tmp_path / "out", "--events", str(events))
    assert mine["job"]["timeline"] == "simulator records (sim_*)"
    assert_matches_simulator(mine, truth)
    assert mine["input"]["corrupt"] == 0 and mine["warnings"] == []
    assert all(c["settled_at"] is not None for p in mine["convergence"] for c in p["components"])


SAME_INSTANT = """\
name: same-instant
description: publications at the very instants of a cut and a heal (the simulator runs them first)
duration: 25
nodes: {n0: {id: 0}, n1: {id: 1}, n2: {id: 2}, n3: {id: 3}}
links: [[n0, n1], [n1, n2], [n2, n3], [n3, n0]]
events:
  - {at: 0.5, subscribe: {node: n0, client: s0, filter: "x/#"}}
  - {at: 0.5, subscribe: {node: n2, client: s2, filter: "x/+"}}
  - {at: 6, publish: {node: n1, topic: x/y, count: 60, interval: 0.25}}
  - {at: 11, cut: [n0, n1]}
  - {at: 18.5, heal: [n0, n1]}
"""


def test_publications_at_the_instant_of_a_disruption(spark: Any, tmp_path: Path) -> None:
    """6 + 20 x 0.25 = 11.0 and 6 + 50 x 0.25 = 18.5: a publication shares the instant of the cut and of the heal."""
    scenario = tmp_path / "same-instant.yaml"
    scenario.write_text(SAME_INSTANT)
    events = tmp_path / "events.jsonl"
    truth = run_scenario(load_scenario(str(scenario)), seed=1, events_path=str(events))
    assert_matches_simulator(run_job(spark, tmp_path / "out", "--events", str(events)), truth)


def test_the_scenario_file_gives_the_same_answer_as_the_simulator_records(spark: Any, tmp_path: Path) -> None:
    """ring6: a kill (no event from the dead node: only the scenario says so) and a restart."""
    events, truth = simulate(tmp_path, "ring6")
    without_sim = tmp_path / "nodes-only.jsonl"
    with events.open() as source, without_sim.open("w") as sink:
        sink.writelines(line for line in source if '"type":"sim_' not in line)
    out = tmp_path / "out"
    assert job(["--events", str(without_sim), "--timeline", str(TOPOLOGIES / "ring6.yaml"),
                "--out", str(out)], spark=spark) == 0
    mine = json.loads((out / "report.json").read_text())
    assert mine["job"]["timeline"].startswith("scenario file")
    assert_matches_simulator(mine, truth)
    # What a person opens: the page, the tables and the pictures.
    for name in ("report.html", "convergence.csv", "components.csv", "deliveries.csv", "latency_cdf.csv",
                 "overhead.csv", "core_changes.csv", "mesh_sizes.csv", "clock_offsets.csv", "convergence.png",
                 "overlay.png", "latency_cdf.png", "overhead.png", "cores_meshes.png"):
        assert (out / name).stat().st_size > 0, name
    page = (out / "report.html").read_text()
    assert "kill n1 @12.0s" in page and "restart n1 @24.0s" in page and "overlay.png" in page
    control = mine["control"]
    assert control["by_type"]["hl"]["packets"] > 0 and control["per_node_per_second"]["packets"] > 0


# ---------------------------------------------------------------- damaged input and skewed clocks

def _skew(line: str, node: str, shift: float) -> str:
    """The line as node `node` would have written it with its clock `shift` seconds ahead."""
    record = json.loads(line)
    if record["type"].startswith("sim_"):
        return line  # the simulator's own records: its clock
    mine = record.get("node") == node
    if mine:
        record["t"] = round(record["t"] + shift, 6)
    if record["type"] == "neighbour_up" and (mine or record.get("neighbour") == node):
        record["clock_offset"] = round(record["clock_offset"] + (-shift if mine else shift), 6)
    for neighbour, clock in (record.get("clocks") or {}).items():  # counters: the best recent samples
        if mine or neighbour == node:
            clock["offset"] = round(clock["offset"] + (-shift if mine else shift), 6)
    return json.dumps(record, separators=(",", ":")) + "\n"


def test_corrupt_lines_other_versions_and_a_skewed_clock(spark: Any, tmp_path: Path) -> None:
    events, truth = simulate(tmp_path, "seed-partition")
    skewed_node = "10.0.0.5:10500"  # n4
    damaged = tmp_path / "damaged.jsonl"
    lines = events.read_text().splitlines(keepends=True)
    with damaged.open("w") as sink:
        for number, line in enumerate(lines):
            sink.write(_skew(line, skewed_node, 0.25))
            if number == 10:
                sink.write('{"v":1,"t":3.0,"node":"10.0.0.1:10500","type":"counters","sent":"oops"}\n')
                sink.write("this is not json\n")
                sink.write('{"v":3,"t":4.0,"node":"10.0.0.1:10500","type":"future_event"}\n')
        sink.write('{"v":1,"t":5.0,"node":"10.0.0.1:10500","type":"counters"')  # cut short, no newline
    mine = run_job(spark, tmp_path / "out", "--events", str(damaged))
    assert mine["input"]["corrupt"] == 3
    assert mine["input"]["unknown_version"] == {"3": 1}
    assert any("3 of" in w and "corrupt" in w and "oops" in w for w in mine["warnings"])
    assert any("v=3: 1" in w for w in mine["warnings"])
    clocks = mine["clocks"]["nodes"]
    assert clocks["n4"]["offset"] - clocks["n0"]["offset"] == \
        pytest.approx(0.25, abs=(clocks["n4"]["error"] or 0) + (clocks["n0"]["error"] or 0) + 1e-6)
    assert {name for name, clock in clocks.items() if clock["applied"]} in ({"n4"}, set(clocks) - {"n4"})
    # Corrected, the skewed node's events line up again: the same counts, times within the error bound.
    bound = mine["clocks"]["max_error"] + TIME_TOLERANCE
    for key in ("sent", "expected_deliveries", "delivered", "lost", "duplicates", "unexpected"):
        assert mine["publications"][key] == truth["publications"][key], key
    for got, expected in zip(mine["convergence"], truth["convergence"], strict=True):
        assert got["seconds"] == pytest.approx(expected["seconds"], abs=bound), got["phase"]
    assert mine["publications"]["latency"]["max"] == pytest.approx(truth["publications"]["latency"]["max"],
                                                                   abs=bound)


def test_bad_input_gets_a_clear_message(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "out")
    assert job(["--events", str(tmp_path / "missing-*.jsonl"), "--out", out], spark=spark) == 2
    assert "no event file matches" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert job(["--events", str(empty), "--out", out], spark=spark) == 2
    assert "empty" in capsys.readouterr().err
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n{also not\n")
    assert job(["--events", str(garbage), "--out", out], spark=spark) == 2
    message = capsys.readouterr().err
    assert "no usable event" in message and "2 of 2 lines are corrupt" in message
    future = tmp_path / "future.jsonl"
    future.write_text('{"v":9,"t":1.0,"node":"a:1","type":"node_started"}\n')
    assert job(["--events", str(future), "--out", out], spark=spark) == 2
    message = capsys.readouterr().err
    assert "schema version" in message and "v=9: 1" in message
    assert not (tmp_path / "out" / "report.json").exists()


# ---------------------------------------------------------------- the netns harness

@pytest.mark.netns
@pytest.mark.slow  # about a minute: the Spark job on a real netns run (`pytest -m slow`)
@pytest.mark.skipif(NETNS_UNAVAILABLE is not None, reason=NETNS_UNAVAILABLE or "")
def test_netns_run_counts_match_what_the_subscribers_printed(spark: Any, tmp_path: Path) -> None:
    """Real brokers, wrappers and mosquitto clients in network namespaces; the job reads their event logs."""
    scenario = load_scenario(str(TOPOLOGIES / "seed-partition.yaml"))
    run = tmp_path / "run"
    harness = run_on_netns(scenario, seed=1, events_path=str(run))
    printed = sum(len(path.read_text().splitlines()) for path in (run / "clients").glob("*.out")
                  if path.name != "publishers.out")
    mine = run_job(spark, tmp_path / "out", "--events", str(run / "nodes" / "*" / "events.jsonl"),
                   "--events", str(run / "run.jsonl"))
    assert mine["job"]["timeline"] == "harness records (run_*)"
    assert mine["input"]["corrupt"] == 0
    ours = mine["publications"]
    assert ours["delivered"] + ours["delivered_outside_bound"] == printed == harness["publications"]["delivered"]
    for key in ("sent", "expected_deliveries", "lost", "duplicates", "unexpected"):
        assert ours[key] == harness["publications"][key], key
    # The same phases (the harness applies one instant's cuts one after the other: they share a phase).
    # The job reads event times; the harness sees the views only when it polls, so its figure is good to
    # its `resolution` (two rounds of status queries, which grow long on a loaded machine).
    assert len(mine["convergence"]) == len(harness["convergence"])
    for got, expected in zip(mine["convergence"], harness["convergence"], strict=True):
        assert got["phase"].split(" @")[0] == expected["phase"].split(" @")[0]
        assert got["seconds"] is not None
        assert abs(got["seconds"] - expected["seconds"]) < expected["resolution"] + 0.25, (got, expected)
    # One machine, one clock: no offset beyond its error bound.
    assert not mine["clocks"]["applied"], mine["clocks"]["nodes"]


# ---------------------------------------------------------------- spark-submit and the benchmark

@pytest.mark.slow
def test_spark_submit_runs_the_script_unchanged(tmp_path: Path) -> None:
    submit = shutil.which("spark-submit") or str(Path(pyspark.__file__).parent / "bin" / "spark-submit")
    events, truth = simulate(tmp_path, "seed-partition")
    out = tmp_path / "out"
    environment = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    result = subprocess.run([submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                             "--conf", "spark.driver.host=127.0.0.1", str(ROOT / "spark" / "convergence.py"),
                             "--events", str(events), "--out", str(out), "--no-plots"],
                            capture_output=True, text=True, timeout=600, env=environment, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_matches_simulator(json.loads((out / "report.json").read_text()), truth)


BENCH_SCENARIO = """\
name: spark-bench
description: a long steady run with many publications, for the Spark job's benchmark (tests/spark/test_spark_job.py)
duration: {duration}
settle: 5
settings: {{stats_interval: 5.0}}
nodes: {{n0: {{id: 0}}, n1: {{id: 1}}, n2: {{id: 2}}, n3: {{id: 3}}, n4: {{id: 4}}, n5: {{id: 5}}}}
links: [[n0, n1], [n0, n2], [n1, n4], [n1, n5], [n2, n5], [n4, n5], [n4, n3], [n5, n3]]
events:
  - {{at: 0.5, subscribe: {{node: n0, client: s0, filter: "bench/#"}}}}
  - {{at: 0.5, subscribe: {{node: n3, client: s3, filter: "bench/+/x"}}}}
  - {{at: 0.5, subscribe: {{node: n4, client: s4, filter: "bench/a/x"}}}}
  - {{at: 6, publish: {{node: n5, topic: bench/a/x, count: {count}, interval: {interval}}}}}
  - {{at: 6, publish: {{node: n2, topic: bench/b/x, count: {count}, interval: {interval}}}}}
  - {{at: {cut}, cut: [n1, n4]}}
  - {{at: {heal}, heal: [n1, n4]}}
"""


def bench_events(directory: Path) -> tuple[Path, dict[str, Any]]:
    """The benchmark log (>= 10 M events) and the simulator's report, made once per directory."""
    events = directory / "bench-events.jsonl"
    report = directory / "bench-report.json"
    if not report.exists():
        count, interval = 500_000, 0.002  # two publishers, about 10 events per publication
        duration = 6 + count * interval + 10
        scenario = directory / "spark-bench.yaml"
        scenario.write_text(BENCH_SCENARIO.format(duration=duration, count=count, interval=interval,
                                                  cut=round(duration / 2), heal=round(duration / 2) + 20))
        # A million publications are queued at the start: lift the simulator's packet-storm guard.
        truth = Simulation(load_scenario(str(scenario)), seed=1, events_path=str(events),
                           max_in_flight=4_000_000).run()
        report.write_text(json.dumps(truth))
    return events, json.loads(report.read_text())


def _time_job(spark: Any, events: Path, out: Path, truth: dict[str, Any]) -> None:
    with events.open("rb") as handle:
        lines = sum(1 for _ in handle)
    started = time.perf_counter()
    assert job(["--events", str(events), "--out", str(out)], spark=spark) == 0
    wall = time.perf_counter() - started
    mine = json.loads((out / "report.json").read_text())
    for key in ("sent", "expected_deliveries", "delivered", "lost", "duplicates"):
        assert mine["publications"][key] == truth["publications"][key], key
    sent = mine["publications"]["sent"]
    print(f"\nspark job on {spark.sparkContext.master}: {events.name}, {lines:,} events, "
          f"{events.stat().st_size / 1e9:.2f} GB, {wall:.0f} s wall, {lines / wall:,.0f} events/s, "
          f"{sent / wall:,.0f} publications/s; steps {mine['job']['steps']}")


@pytest.mark.bench
def test_benchmark_ten_million_events(spark: Any, tmp_path: Path) -> None:
    """Time the job on local[2] over >= 10 million simulator events; prints the figures for docs/benchmarks.md.

    SPARK_BENCH_DIR=DIR keeps the generated log there for the next run (making it takes long).
    """
    directory = Path(os.environ.get("SPARK_BENCH_DIR", tmp_path))
    directory.mkdir(parents=True, exist_ok=True)
    events, truth = bench_events(directory)
    with events.open("rb") as handle:
        assert sum(1 for _ in handle) >= 10_000_000, "the benchmark log has fewer than 10 million events"
    _time_job(spark, events, directory / "out", truth)


BURST = 32
"""publications a wrapper reads from its broker in one pass, in the burst benchmark: one run event per stage"""


def burst_events(directory: Path) -> tuple[Path, dict[str, Any]]:
    """The benchmark's 1,000,000 publications sent in bursts of BURST (one instant each, every 64 ms per
    publisher): the simulator writes them as runs (schema version 2), about a third of the lines."""
    events = directory / "bench-bursts-events.jsonl"
    report = directory / "bench-bursts-report.json"
    if not report.exists():
        bursts, gap = 500_000 // BURST, 0.064
        duration = 6 + bursts * gap + 10
        head = BENCH_SCENARIO.split("  - {{at: 6,")[0].format(duration=duration)
        lines = [head.replace("name: spark-bench", "name: spark-bench-bursts").rstrip("\n")]
        for index in range(bursts):
            at = round(6 + index * gap, 6)
            for node, topic in (("n5", "bench/a/x"), ("n2", "bench/b/x")):
                publish = f"node: {node}, topic: {topic}, count: {BURST}, interval: 0"
                lines.append(f"  - {{at: {at}, publish: {{{publish}}}}}")
        lines.append(f"  - {{at: {round(duration / 2)}, cut: [n1, n4]}}")
        lines.append(f"  - {{at: {round(duration / 2) + 20}, heal: [n1, n4]}}")
        scenario = directory / "spark-bench-bursts.yaml"
        scenario.write_text("\n".join(lines) + "\n")
        truth = Simulation(load_scenario(str(scenario)), seed=1, events_path=str(events),
                           max_in_flight=4_000_000).run()
        report.write_text(json.dumps(truth))
    return events, json.loads(report.read_text())


@pytest.mark.bench
def test_benchmark_the_same_publications_in_bursts(spark: Any, tmp_path: Path) -> None:
    """The benchmark's publications in bursts, as the simulator writes them (v2 runs), then the same log as a
    version 1 writer wrote it (one line per publication, federation.protocol.publication_events.expand)."""
    from federation.protocol.publication_events import expand

    directory = Path(os.environ.get("SPARK_BENCH_DIR", tmp_path))
    directory.mkdir(parents=True, exist_ok=True)
    events, truth = burst_events(directory)
    _time_job(spark, events, directory / "out-bursts", truth)
    v1 = directory / "bench-bursts-events-v1.jsonl"
    if not v1.exists():
        partial = directory / "bench-bursts-events-v1.jsonl.part"
        with events.open() as source, partial.open("w") as target:
            for line in source:
                for record in expand(json.loads(line)):
                    target.write(json.dumps({**record, "v": 1}, separators=(",", ":")) + "\n")
        partial.rename(v1)
    _time_job(spark, v1, directory / "out-bursts-v1", truth)


def test_latency_percentiles_are_percentile_disc(spark: Any) -> None:
    """The percentiles come from a histogram of distinct latencies (nearest rank): the same values as Spark's
    percentile_disc over the latencies themselves."""
    import random

    from pyspark.sql import functions as F

    from federation.spark.analysis import _ALL, PERCENTILES, _latency_figures

    generator = random.Random(7)
    values = [(phase, round(generator.choice([0.001, 0.002, 0.0035, 0.01, 0.25]) * generator.randint(1, 3), 6))
              for phase in range(3) for _ in range(generator.randint(1, 60))]
    raw = spark.createDataFrame(values, "phase INT, latency DOUBLE")
    figures = _latency_figures(raw.groupBy("phase", "latency").agg(F.count(F.lit(1)).alias("n")))
    spark_says = {row.phase: row for row in raw.groupBy("phase").agg(
        *[F.expr(f"percentile_disc({p}) WITHIN GROUP (ORDER BY latency)").alias(name) for name, p in PERCENTILES],
        F.max("latency").alias("max")).collect()}
    overall = raw.agg(*[F.expr(f"percentile_disc({p}) WITHIN GROUP (ORDER BY latency)").alias(name)
                        for name, p in PERCENTILES]).collect()[0]
    for phase, row in spark_says.items():
        assert {name: figures[phase][name] for name in ("p50", "p90", "p99", "max")} == \
            {name: row[name] for name in ("p50", "p90", "p99", "max")}, phase
    assert {name: figures[_ALL][name] for name, _ in PERCENTILES} == overall.asDict()
    ordered = sorted(latency for _, latency in values)
    assert figures[_ALL]["cdf"][-1] == ordered[-1] and figures[_ALL]["cdf"][0] == ordered[(len(ordered) - 1) // 200]
