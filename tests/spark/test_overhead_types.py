"""Data and control traffic in the Spark report: the packet types come from the protocol (issue 40, item 4).

The job once kept its own copy of the data packet types, without `tq` (runs of QoS 1/2 publications), and
counted every QoS 1/2 run as control overhead. Now the list is the protocol's; a QoS 1/2 simulator run
(configs/topologies/reliable-bursts.yaml) checks the figures against the simulator's own report: every data
packet and byte, no `tq` among control.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from federation.protocol import wire_constants
from federation.spark import DATA_TYPES

REPO = Path(__file__).resolve().parents[2]


def test_the_jobs_data_types_are_the_protocols() -> None:
    assert set(DATA_TYPES) == set(wire_constants.DATA_TYPES)
    assert set(DATA_TYPES) <= set(wire_constants.MESSAGE_TYPES)
    assert wire_constants.TOPIC_RELIABLE_BATCH in DATA_TYPES


def test_a_qos12_runs_data_and_control_against_the_simulators_report(spark: Any, tmp_path: Path) -> None:
    pytest.importorskip("pyspark", reason="the spark extra is not installed: pip install -e '.[spark]'")
    from federation.scenario.loader import load_scenario
    from federation.sim import run_scenario
    from federation.spark.convergence import main as job

    events = tmp_path / "events.jsonl"
    truth = run_scenario(load_scenario(str(REPO / "configs" / "topologies" / "reliable-bursts.yaml")), seed=1,
                         events_path=str(events))
    out = tmp_path / "out"
    assert job(["--events", str(events), "--out", str(out), "--no-plots", "--partitions", "1"], spark=spark) == 0
    mine = json.loads((out / "report.json").read_text())
    assert truth["data"]["packets"] > 0 and "tq" in events.read_text(), "the scenario sent no QoS 1/2 run"
    # Data happens mid-run, between counters snapshots: the job sees every packet the simulator counted.
    assert mine["data"] == {"packets": truth["data"]["packets"], "bytes": truth["data"]["bytes"]}
    control = mine["control"]["by_type"]
    assert not set(control) & set(wire_constants.DATA_TYPES), sorted(control)
    assert set(control) <= set(truth["control"]["by_type"])
    # Control goes on to the end of the run; the job's totals stop at each node's last counters snapshot.
    for kind, figures in control.items():
        assert 0 < figures["packets"] <= truth["control"]["by_type"][kind]["packets"], kind
    assert mine["control"]["packets"] == sum(figures["packets"] for figures in control.values())
