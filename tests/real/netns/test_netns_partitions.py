"""The partition suite on the netns backend: real brokers, wrappers and clients, one namespace per node.

Each scenario of configs/topologies/partition-*.yaml (docs/partitions.md)
runs on network namespaces and must hold the simulator's invariants: every
in-bound publication delivered exactly once, no unexpected delivery, every
convergence phase settled, the same phases and the same expected deliveries
as the simulator's run of the same file. Each scenario then has its own
check of *how* the federation got there, read from the wrappers' event logs
and the subscribers' output. Nothing of a run may remain afterwards.

A run that failed while the machine was so overloaded that wrappers froze
for longer than the dead-neighbour time (neighbours declared down with no
disruption in the 3 s before) is run once more, and the output says so.

About 35-45 s of wall time per scenario (the scenario's 23-31 s, plus starting
six Python wrappers on a busy 2-CPU machine).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from federation.netns import run_scenario, system
from federation.scenario.loader import load_scenario
from federation.scenario.model import DISRUPTIONS, Scenario
from federation.sim import run_scenario as run_on_simulator

REASON = system.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

TOPOLOGIES = Path(__file__).resolve().parents[3] / "configs" / "topologies"
CORE = "0@10.77.0.1:10500"
"""n0's id: virtual id 0 at node 0's address"""


def events_of(events: Path, name: str, kind: str) -> list[dict[str, Any]]:
    """The node's event log entries of one type (the copy the run left in the events directory)."""
    found = []
    for raw in (events / "nodes" / name / "events.jsonl").read_text().splitlines():
        event = json.loads(raw)
        if event.get("type") == kind:
            found.append(event)
    return found


def run_start(events: Path) -> float:
    """Unix time of run time 0."""
    first = json.loads((events / "run.jsonl").read_text().splitlines()[0])
    assert first["type"] == "run_start"
    return float(first["t0_unix"])


def between(events: list[dict[str, Any]], t0: float, start: float, end: float) -> list[dict[str, Any]]:
    return [event for event in events if start <= event["t"] - t0 < end]


def check_core_side(report: dict[str, Any], events: Path) -> None:
    t0 = run_start(events)
    # The coreless side {n3, n4, n5} elected n3 during the partition; n0 never lost its own view.
    elected = between(events_of(events, "n4", "management_core_changed"), t0, 7, 15)
    assert any(event["core"] == "3@10.77.0.4:10500" for event in elected), elected
    assert all(event["core"] == CORE for event in events_of(events, "n0", "management_core_changed"))


def check_core_isolated(report: dict[str, Any], events: Path) -> None:
    t0 = run_start(events)
    elected = between(events_of(events, "n3", "management_core_changed"), t0, 7, 15)
    assert any(event["core"] == "1@10.77.0.2:10500" for event in elected), elected
    lost = between(events_of(events, "n2", "neighbour_down"), t0, 7, 15)
    assert [event["neighbour"] for event in lost] == ["10.77.0.1:10500"]


def check_oneway(report: dict[str, Any], events: Path) -> None:
    t0 = run_start(events)
    # n4 no longer hears n1; n1 hears n4 but gets no hello back: both take the link down, and up after the heal.
    for name, peer in (("n4", "10.77.0.2:10500"), ("n1", "10.77.0.5:10500")):
        down = between(events_of(events, name, "neighbour_down"), t0, 7, 15)
        assert [event["neighbour"] for event in down] == [peer], (name, down)
        up = between(events_of(events, name, "neighbour_up"), t0, 15, 23)
        assert [event["neighbour"] for event in up] == [peer], (name, up)


def check_crash(report: dict[str, Any], events: Path) -> None:
    epochs = [event["epoch"] for event in events_of(events, "n1", "node_started")]
    assert len(epochs) == 2 and epochs[1] > epochs[0], epochs  # restarted with a new epoch
    assert len(events_of(events, "n5", "node_started")) == 2
    # The broker of n5 forgot its clients; the subscriber was started again and got what came after.
    outputs = sorted((events / "clients").glob("n5.sub5.*.out"), key=lambda path: int(path.suffixes[-2][1:]))
    assert len(outputs) == 2, outputs
    after = [line for line in outputs[-1].read_text().splitlines() if line.endswith(" crash/after")]
    assert len(after) == 20, after


def check_loss(report: dict[str, Any], events: Path) -> None:
    # Publications during the loss are not required, but most of them arrive.
    assert report["publications"]["delivered_outside_bound"] > 60
    labels = [phase["phase"] for phase in report["convergence"]]
    assert labels[1:] == ["loss 10% all links @7.0s", "loss 0% all links @15.0s"]


SUITE: dict[str, Callable[[dict[str, Any], Path], None]] = {
    "partition-core-side": check_core_side,
    "partition-core-isolated": check_core_isolated,
    "partition-oneway": check_oneway,
    "partition-crash": check_crash,
    "partition-loss": check_loss,
}


def test_every_partition_scenario_is_in_the_suite():
    assert sorted(path.stem for path in TOPOLOGIES.glob("partition-*.yaml")) == sorted(SUITE)


def stalls(scenario: Scenario, events: Path) -> list[str]:
    """Neighbours declared down although no disruption happened in the 3 s before: the machine stalled
    for longer than the dead-neighbour time (1 s), which no protocol can tell from a failure."""
    t0 = run_start(events)
    disruptions = [event.at for event in scenario.events if isinstance(event, DISRUPTIONS)]
    found = []
    for name in scenario.node_names():
        for event in events_of(events, name, "neighbour_down"):
            at = event["t"] - t0
            if not any(0 <= at - when <= 3.0 for when in disruptions):
                found.append(f"{name} declared {event['neighbour']} down at {at:.1f} s")
    return found


DEFAULT_RUN = "partition-crash"
"""the one case of the suite in `make test` (a cut, a crash and a heal); the others under `slow` (CI's budget)"""


@pytest.mark.parametrize("name", [pytest.param(name, marks=[] if name == DEFAULT_RUN else [pytest.mark.slow])
                                  for name in sorted(SUITE)])
def test_partition_scenario_on_netns(name, tmp_path):
    scenario = load_scenario(TOPOLOGIES / f"{name}.yaml")
    simulated = run_on_simulator(scenario, seed=1)
    before = system.host_snapshot(owner=os.getpid())
    events = tmp_path / "events"
    report = run_scenario(scenario, seed=1, events_path=str(events))
    assert system.host_snapshot(owner=os.getpid()) == before, "the run left namespaces, interfaces, tables or dirs"
    stalled = stalls(scenario, events)
    if not report["invariants"]["ok"] and stalled:
        # An overloaded machine froze the wrappers for over a second: run it once more, and say so.
        print(f"{name}: the machine stalled ({'; '.join(stalled[:3])}); violations "
              f"{report['invariants']['violations'][:3]}; running it again")
        events = tmp_path / "events-again"
        report = run_scenario(scenario, seed=1, events_path=str(events))
        stalled = stalls(scenario, events)

    assert report["backend"] == "netns" and report["scenario"] == name
    assert report["invariants"]["ok"], (report["invariants"]["violations"], "stalls:", stalled)
    publications = report["publications"]
    assert publications["expected_deliveries"] == simulated["publications"]["expected_deliveries"] > 0
    assert publications["delivered"] == publications["expected_deliveries"]
    assert publications["sent"] == simulated["publications"]["sent"]
    assert (publications["lost"], publications["duplicates"], publications["unexpected"]) == (0, 0, 0)
    phases = report["convergence"]
    assert [phase["phase"] for phase in phases] == [phase["phase"] for phase in simulated["convergence"]]
    assert all(phase["seconds"] is not None for phase in phases), phases
    assert all(node["alive"] and node["management_core"] == CORE for node in report["final"].values()), \
        report["final"]
    assert report["control"]["packets"] > 0 and report["data"]["packets"] > 0
    SUITE[name](report, events)
