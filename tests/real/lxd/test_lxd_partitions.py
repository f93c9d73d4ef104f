"""The partition suite on the lxd backend: the scenarios of configs/topologies/partition-*.yaml on containers.

Each scenario runs with `--backend lxd` (`federation.lxd.backend`): one LXD
container per node with its broker and wrapper, real mosquitto_sub /
mosquitto_pub through `lxc exec`, cuts and losses as nftables rules inside
the containers. The run must hold the simulator's invariants and match the
simulator's run of the same file (sent, expected deliveries, convergence
phases), and the faults must show in the wrappers' own event logs. Nothing
of a run may remain afterwards: no container, and the LXD daemon stopped if
it was not running before.

Opt-in (`python3 -m pytest -m lxd`, as root): about 100 s per scenario on a
busy 2-CPU machine with the image cached (six containers are made, started
and deleted per scenario); on a fresh machine the first run also installs
LXD and builds the image.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from federation.lxd import host
from federation.lxd.backend import run_scenario
from federation.lxd.cli import connect
from federation.lxd.cluster import ours
from federation.scenario.loader import load_scenario
from federation.scenario.model import Cut, Heal
from federation.sim import run_scenario as run_on_simulator

TOPOLOGIES = Path(__file__).resolve().parents[3] / "configs" / "topologies"
SUITE = sorted(path.stem for path in TOPOLOGIES.glob("partition-*.yaml"))


def run_start(events: Path) -> dict[str, Any]:
    first = json.loads((events / "run.jsonl").read_text().splitlines()[0])
    assert first["type"] == "run_start"
    return first


def events_of(events: Path, name: str, kind: str, t0: float, start: float, end: float) -> list[dict[str, Any]]:
    """The node's event log entries of one type between run times start and end."""
    found = []
    for raw in (events / "nodes" / name / "events.jsonl").read_text().splitlines():
        event = json.loads(raw)
        if event.get("type") == kind and start <= event["t"] - t0 < end:
            found.append(event)
    return found


def cut_and_healed_links(scenario_file: Path) -> list[tuple[str, str, float, float]]:
    """(a, b, cut at, healed at) of every two-way cut of the file that is healed later."""
    scenario = load_scenario(scenario_file)
    cuts: dict[frozenset[str], tuple[str, str, float]] = {}
    result = []
    for event in scenario.events:
        if isinstance(event, Cut) and not event.oneway:
            cuts[frozenset((event.a, event.b))] = (event.a, event.b, event.at)
        elif isinstance(event, Heal):
            key = frozenset((event.a, event.b))
            if key in cuts:
                a, b, at = cuts.pop(key)
                result.append((a, b, at, event.at))
    return result


@pytest.fixture(scope="module")
def daemon_was_running() -> Any:
    if os.geteuid() != 0:
        pytest.fail("the lxd tests need root (apt-get, the lxd daemon, nftables)")
    was_running = host.daemon_answers()
    yield was_running
    if not was_running and host.daemon_answers():
        client = connect(None)
        leftovers = [instance.name for instance in client.instances.all()]
        if not leftovers:
            host.stop_daemon(lambda message: None)
        assert not leftovers, f"containers left behind: {leftovers}"


def test_the_suite_is_not_empty() -> None:
    assert len(SUITE) >= 3, SUITE


@pytest.mark.parametrize("name", SUITE)
def test_partition_scenario_on_lxd(name: str, tmp_path: Path, daemon_was_running: bool) -> None:
    scenario_file = TOPOLOGIES / f"{name}.yaml"
    scenario = load_scenario(scenario_file)
    simulated = run_on_simulator(scenario, seed=1)
    events = tmp_path / "events"
    report = run_scenario(scenario, seed=1, events_path=str(events))

    # Nothing of the run is left; the daemon is stopped again if the run started it.
    if host.daemon_answers():
        assert ours(connect(None), "mqf-run") == [], "the run left containers"
    assert daemon_was_running or not host.daemon_answers(), "the run left the LXD daemon it started running"

    assert report["backend"] == "lxd" and report["scenario"] == name
    assert report["invariants"]["ok"], report["invariants"]["violations"]
    publications = report["publications"]
    assert publications["sent"] == simulated["publications"]["sent"]
    assert publications["expected_deliveries"] == simulated["publications"]["expected_deliveries"] > 0
    assert publications["delivered"] == publications["expected_deliveries"]
    assert (publications["lost"], publications["duplicates"], publications["unexpected"]) == (0, 0, 0)
    phases = report["convergence"]
    assert [phase["phase"] for phase in phases] == [phase["phase"] for phase in simulated["convergence"]]
    assert all(phase["seconds"] is not None for phase in phases), phases

    start = run_start(events)
    addresses = start["nodes"]
    core = f"{min(start['vids'].values())}@{addresses[min(start['vids'], key=start['vids'].get)]}"
    assert all(node["alive"] and node["management_core"] == core for node in report["final"].values()), \
        report["final"]
    assert report["control"]["packets"] > 0 and report["data"]["packets"] > 0
    # Every two-way cut was real inside the containers: both ends logged the neighbour down, then up again.
    t0 = float(start["t0_unix"])
    for a, b, cut_at, healed_at in cut_and_healed_links(scenario_file):
        for name_, peer in ((a, b), (b, a)):
            down = events_of(events, name_, "neighbour_down", t0, cut_at, healed_at)
            assert addresses[peer] in [event["neighbour"] for event in down], (name_, peer, down)
            up = events_of(events, name_, "neighbour_up", t0, healed_at, scenario.duration + 5)
            assert addresses[peer] in [event["neighbour"] for event in up], (name_, peer, up)
