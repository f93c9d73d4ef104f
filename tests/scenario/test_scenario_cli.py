"""`python -m federation.scenario`: check, run, exit codes and the shipped scenarios."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from federation.scenario import cli
from federation.scenario.model import Scenario

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = ROOT / "configs" / "topologies"
SHIPPED = sorted(TOPOLOGIES.glob("*.yaml"))
SIM_AVAILABLE = importlib.util.find_spec("federation.sim") is not None

GOOD = """\
duration: 10
nodes: {a: {id: 0}, b: {id: 1}}
links: [[a, b]]
events:
  - {at: 1, subscribe: {node: a, client: s, filter: "t/#"}}
  - {at: 7, publish: {node: b, topic: t/x, count: 3, interval: 0.1}}
"""


def run_module(*arguments: str) -> subprocess.CompletedProcess[str]:
    environment = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "federation.scenario", *arguments], cwd=ROOT,
                          env=environment, capture_output=True, text=True, timeout=600, check=False)


def run_main(*arguments: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(arguments), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def write(tmp_path: Path, text: str, name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- check


def test_shipped_scenarios_exist() -> None:
    names = {path.stem for path in SHIPPED}
    assert {"seed-validation", "seed-core-contention", "seed-partition", "seed-partition-core-isolated", "line5",
            "ring6", "id-collision", "oneway-cut", "lossy", "wildcards"} <= names


def test_check_passes_on_every_shipped_scenario() -> None:
    result = run_module("check", *(str(path) for path in SHIPPED))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(SHIPPED)
    for path, line in zip(SHIPPED, lines, strict=True):
        assert line.startswith(f"ok: {path} (") and line.endswith(" events)"), line


@pytest.mark.parametrize("path", SHIPPED, ids=[path.stem for path in SHIPPED])
def test_shipped_scenario_has_a_comment_header(path: Path) -> None:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith(f"# {path.stem}:"), first


def test_check_output_counts(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    assert run_main("check", str(path)) == (0, f"ok: {path} (2 nodes, 1 link, 2 events)\n", "")


def test_check_reports_every_bad_file_and_exits_2(tmp_path: Path) -> None:
    good = write(tmp_path, GOOD, "good.yaml")
    bad = write(tmp_path, "duration: 5\nnodes: [a]\nlinks: [[a, z]]\n", "bad.yaml")
    broken = write(tmp_path, "duration: [5\n", "broken.yaml")
    code, out, err = run_main("check", str(bad), str(good), str(broken))
    assert code == 2
    assert out == f"ok: {good} (2 nodes, 1 link, 2 events)\n"
    assert f"error: {bad}: links[0]: unknown node 'z'; nodes are: a\n" in err
    assert f"error: {broken}:2:1: YAML syntax error" in err


def test_invalid_scenario_exits_2_in_a_subprocess(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("node: b, topic", "node: n9, topic"), "typo.yaml")
    result = run_module("check", str(path))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f"error: {path}: events[1] (publish): unknown node 'n9'; nodes are: a, b\n"


def test_run_with_invalid_scenario_exits_2_before_any_backend(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + "  - {at: 3, cut: [a, c]}\n", "cut.yaml")
    result = run_module("run", str(path), "--backend", "netns")
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {path}: events[2] (cut): unknown node 'c'; nodes are: a, b")


def test_usage_errors_exit_2_with_error_prefix() -> None:
    result = run_module("frobnicate")
    assert result.returncode == 2
    assert result.stderr.startswith("error: argument COMMAND: invalid choice: 'frobnicate'")
    code, _, err = run_main("run", "x.yaml", "--backend", "cloud")
    assert code == 2 and err.startswith("error: argument --backend: invalid choice: 'cloud'")
    code, _, err = run_main("run", "x.yaml", "--seed", "many")
    assert code == 2 and err.startswith("error: argument --seed: invalid int value: 'many'")


# ---------------------------------------------------------------- run (with stand-in backends)


def install_backend(monkeypatch: pytest.MonkeyPatch, report: dict[str, Any] | Exception) -> list[dict[str, Any]]:
    """Register backend 'sim' as an in-memory module returning `report`; returns the recorded calls."""
    calls: list[dict[str, Any]] = []

    def run_scenario(scenario: Scenario, *, seed: int, events_path: str | None) -> dict[str, Any]:
        calls.append({"scenario": scenario, "seed": seed, "events_path": events_path})
        if isinstance(report, Exception):
            raise report
        return report

    module = types.ModuleType("fake_scenario_backend")
    module.run_scenario = run_scenario  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_scenario_backend", module)
    monkeypatch.setitem(cli.BACKENDS, "sim", "fake_scenario_backend:run_scenario")
    return calls


def make_report(ok: bool, violations: list[str] | None = None) -> dict[str, Any]:
    return {
        "scenario": "scenario",
        "publications": {"sent": 3, "expected_deliveries": 3, "delivered": 3 if ok else 2, "lost": 0 if ok else 1,
                         "duplicates": 0, "unexpected": 0, "delivered_outside_bound": 0,
                         "latency": {"p50": 0.001, "p90": 0.002, "p99": 0.002, "max": 0.002}},
        "convergence": [{"phase": "start", "at": 0.0, "seconds": 0.5, "settled_at": 0.5},
                        {"phase": "cut a-b @3.0s", "at": 3.0, "seconds": None, "settled_at": None}],
        "invariants": {"ok": ok, "violations": violations or []},
    }


def test_run_passes_arguments_writes_report_and_summarises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = install_backend(monkeypatch, make_report(True))
    path = write(tmp_path, GOOD)
    report_path = tmp_path / "out" / "report.json"
    code, out, err = run_main("run", str(path), "--seed", "7", "--report", str(report_path),
                              "--events", str(tmp_path / "events.jsonl"))
    assert (code, err) == (0, "")
    assert len(calls) == 1
    assert calls[0]["seed"] == 7
    assert calls[0]["events_path"] == str(tmp_path / "events.jsonl")
    assert calls[0]["scenario"].name == "scenario"
    assert json.loads(report_path.read_text(encoding="utf-8")) == make_report(True)
    assert report_path.read_text(encoding="utf-8").startswith('{\n  "scenario"')
    assert out.splitlines() == [
        f"scenario scenario ({path}) on sim, seed 7",
        "publications: sent 3, expected 3, delivered 3, lost 0, duplicates 0, unexpected 0, outside bound 0",
        "latency: p50 0.001s, p90 0.002s, p99 0.002s, max 0.002s",
        "convergence: start (at 0.000s): converged in 0.500s",
        "convergence: cut a-b @3.0s (at 3.000s): did NOT converge",
        "invariants: ok",
    ]


def test_run_exits_1_when_invariants_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    violations = [f"violation {index}" for index in range(8)]
    install_backend(monkeypatch, make_report(False, violations))
    code, out, _ = run_main("run", str(write(tmp_path, GOOD)))
    assert code == 1
    assert "invariants: FAILED (8 violations)" in out
    assert "  violation 0" in out and "  violation 4" in out and "  violation 5" not in out
    assert "  ... 3 more in the report" in out


def test_run_quiet_prints_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_backend(monkeypatch, make_report(False, ["x"]))
    assert run_main("run", str(write(tmp_path, GOOD)), "--quiet") == (1, "", "")


def test_backend_crash_exits_3_with_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_backend(monkeypatch, RuntimeError("boom"))
    code, _, err = run_main("run", str(write(tmp_path, GOOD)), "--seed", "4")
    assert code == 3
    assert "Traceback" in err
    assert "error: backend 'sim' failed on" in err and "with seed 4: RuntimeError: boom" in err


def test_report_without_invariants_exits_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_backend(monkeypatch, {"publications": {}})
    code, _, err = run_main("run", str(write(tmp_path, GOOD)))
    assert code == 3
    assert "without a boolean invariants.ok" in err


def test_unavailable_backend_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(cli.BACKENDS, "lxd", "federation.no_such_backend_module:run_scenario")
    code, out, err = run_main("run", str(write(tmp_path, GOOD)), "--backend", "lxd")
    assert (code, out) == (2, "")
    assert err.startswith("error: backend 'lxd' is not available: No module named 'federation.no_such_backend_module'")


def test_backends_are_registered_lazily() -> None:
    assert cli.BACKENDS == {
        "sim": "federation.sim:run_scenario",
        "netns": "federation.netns:run_scenario",
        "lxd": "federation.lxd.backend:run_scenario",
    }


# ---------------------------------------------------------------- run on the simulator


@pytest.mark.skipif(not SIM_AVAILABLE, reason="federation.sim is not importable yet")
def test_run_seed_validation_on_the_simulator_is_deterministic(tmp_path: Path) -> None:
    scenario = str(TOPOLOGIES / "seed-validation.yaml")
    reports = []
    for attempt in range(2):
        report_path = tmp_path / f"report{attempt}.json"
        events_path = tmp_path / f"events{attempt}.jsonl"
        result = run_module("run", scenario, "--backend", "sim", "--seed", "3", "--report", str(report_path),
                            "--events", str(events_path))
        assert result.returncode == 0, result.stdout + result.stderr
        assert "invariants: ok" in result.stdout
        assert events_path.stat().st_size > 0
        report = json.loads(report_path.read_text(encoding="utf-8"))
        report.pop("wall_seconds", None)
        reports.append(report)
    assert reports[0] == reports[1]
    assert reports[0]["invariants"]["ok"] is True
    assert reports[0]["publications"]["lost"] == 0
