"""A short run of the real benchmark (`pytest -m bench`; minutes, not in the default run).

It starts every setup for real (one broker, bridge chains, federations on
127.0.<subnet>.x; $FEDERATION_BENCH_SUBNET, default 150) and checks what the
benchmark is for: every setup delivers every message of a slow paced run
exactly once (the relay floor's clients too), the tables, results and chart are written, and the figures
are printed. The full benchmark is `python -m suites.bench`
(docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from suites.bench.cli import main

from broker_util import requires_mosquitto

pytestmark = [pytest.mark.bench, requires_mosquitto]

SUBNET = os.environ.get("FEDERATION_BENCH_SUBNET", "150")


def test_short_benchmark_delivers_everything_once_and_reports(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    status = main(["--rounds", "1", "--setups", "single", "bridge-2", "relay-2", "federation-2", "--qos", "0", "1",
                   "--sizes", "64", "--rates", "200", "--seconds", "2", "--out", str(out), "--workdir", str(tmp_path),
                   "--subnet", SUBNET])
    printed = capsys.readouterr().out
    assert status == 0, printed
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert len(runs) == 8
    for run in runs:
        summary = run["summary"]
        assert summary is not None, run
        assert (summary["lost"], summary["duplicates"], summary["unexpected"]) == (0, 0, 0), run
        assert summary["p50_ms"] > 0
        assert summary["cpu_clients_s"] > 0 and 0.0 <= summary["idle_fraction"] <= 1.0, run
    added = [run["summary"] for run in runs if run["setup"] in ("federation-2", "relay-2")]
    assert len(added) == 4 and all(summary["cpu_wrappers_s"] > 0 for summary in added)
    assert "Ratios" in printed and (out / "tables.md").exists()
    if (out / "chart.png").exists():
        assert (out / "chart.png").read_bytes().startswith(b"\x89PNG")
