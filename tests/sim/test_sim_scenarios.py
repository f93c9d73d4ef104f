"""Every shipped scenario (configs/topologies/*.yaml) on the simulator with the real Node, seed 1.

Each must keep its invariants, lose, duplicate and misdeliver nothing,
converge after every phase, and replay byte for byte. Replay one by hand:

    python -m federation.scenario run configs/topologies/NAME.yaml --backend sim --seed 1
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from federation.sim import run_scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIO_FILES = sorted((ROOT / "configs" / "topologies").glob("*.yaml"))
HAVE_LOADER = importlib.util.find_spec("federation.scenario.loader") is not None
SEED = 1

INLINE_RING = {
    "name": "inline-ring",
    "duration": 30,
    "settle": 5,
    "settings": {"hello_interval": 0.5, "announce_interval": 2.0},
    "nodes": ["n1", "n2", "n3", "n4", "n5"],
    "links": [["n1", "n2"], ["n2", "n3"], ["n3", "n4"], ["n4", "n5"], ["n5", "n1"]],
    "events": [
        {"at": 0, "subscribe": {"node": "n3", "client": "c3", "filter": "a/#"}},
        {"at": 0, "subscribe": {"node": "n5", "client": "c5", "filter": "a/+"}},
        {"at": 8, "publish": {"node": "n1", "topic": "a/b", "count": 5, "interval": 0.2}},
        {"at": 10, "cut": ["n2", "n3"]},
        {"at": 16, "publish": {"node": "n1", "topic": "a/b", "count": 5, "interval": 0.2}},
        {"at": 18, "kill": "n4"},
        {"at": 20, "restart": "n4"},
        {"at": 27, "publish": {"node": "n2", "topic": "a/c", "count": 3, "interval": 0.2}},
    ],
}


def without_wall(report: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in report.items() if key != "wall_seconds"}


def check(report: dict[str, Any], label: str) -> None:
    replay = f"{label}, seed {SEED}"
    publications = report["publications"]
    problems = list(report["invariants"]["violations"])
    for key in ("lost", "duplicates", "unexpected"):
        if publications[key]:
            problems.append(f"{key}: {publications[key]}")
    for phase in report["convergence"]:
        if phase["seconds"] is None:
            problems.append(f"phase {phase['phase']!r} never converged")
    assert not problems, f"{replay}:\n" + "\n".join(problems)
    assert report["invariants"]["ok"]


def run_twice_and_check(scenario: Any, label: str, tmp_path: Path) -> None:
    first_events, second_events = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first = run_scenario(scenario, seed=SEED, events_path=str(first_events))
    second = run_scenario(scenario, seed=SEED, events_path=str(second_events))
    assert without_wall(first) == without_wall(second), f"{label}: two runs with seed {SEED} differ"
    assert first_events.read_bytes() == second_events.read_bytes(), f"{label}: events files differ"
    check(first, label)


@pytest.mark.skipif(not HAVE_LOADER, reason="federation.scenario.loader is not there yet")
@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda path: path.stem)
def test_shipped_scenario(path: Path, tmp_path: Path) -> None:
    from federation.scenario.loader import load_scenario

    run_twice_and_check(load_scenario(path), str(path.relative_to(ROOT)), tmp_path)


@pytest.mark.skipif(not HAVE_LOADER, reason="federation.scenario.loader is not there yet")
def test_inline_ring(tmp_path: Path) -> None:
    from federation.scenario.loader import parse_scenario

    run_twice_and_check(parse_scenario(INLINE_RING, "inline-ring"), "inline-ring", tmp_path)


def test_some_scenarios_are_shipped() -> None:
    if not SCENARIO_FILES:
        pytest.skip("configs/topologies/ has no scenario files yet")
    assert all(path.stat().st_size > 0 for path in SCENARIO_FILES)


def test_bench_runs_small() -> None:
    from suites.bench.sim_scale import Bench, BenchOptions, format_table, shortest_path_tree_edges

    results = Bench(BenchOptions(nodes=12, degree=3, window=2.0, publications=4, limit=30.0)).run()
    assert results["aborted"] is None, results["aborted"]
    assert results["nodes"] == 12 and results["links"] == 18
    assert results["cold_start_seconds"] is not None
    assert results["deliveries"]["lost"] == 0
    assert results["flooding_copies_per_publication"] == 11
    assert "wall-clock seconds" in format_table(results)
    # A ring 0-1-2-3-0: from 0, nodes 1 and 2 share the path 0-1-2; 3 needs its own edge.
    table = [[1, 3], [0, 2], [1, 3], [0, 2]]
    assert shortest_path_tree_edges(table, 0, {1, 2}) == 2
    assert shortest_path_tree_edges(table, 0, {1, 2, 3}) == 3


def test_replay_does_not_depend_on_the_hash_seed(tmp_path: Path) -> None:
    """Set and dict order must never reach the output: two processes with different hash seeds agree."""
    import os
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "from federation.scenario.loader import parse_scenario\n"
        "from federation.sim import run_scenario\n"
        "from test_sim_scenarios import INLINE_RING\n"
        "report = run_scenario(parse_scenario(INLINE_RING, 'inline-ring'), seed=1, events_path=sys.argv[1])\n"
        "report.pop('wall_seconds')\n"
        "print(json.dumps(report, sort_keys=True))\n"
    )
    outputs = []
    for hash_seed in ("1", "2"):
        events = tmp_path / f"events-{hash_seed}.jsonl"
        search_path = os.pathsep.join([str(ROOT), str(Path(__file__).resolve().parent)])
        environment = dict(os.environ, PYTHONHASHSEED=hash_seed, PYTHONPATH=search_path)
        result = subprocess.run([sys.executable, "-c", script, str(events)], cwd=ROOT, env=environment,
                                capture_output=True, text=True, check=True, timeout=120)
        outputs.append((result.stdout, events.read_bytes()))
    assert outputs[0] == outputs[1]
