"""What the netns backend refuses, with a clear message and exit status 2, before it creates anything.

None of these needs root: the refusals must come before the first namespace
exists, so `NetnsPlatform.create` is replaced by a function that fails the
test if it is ever called.
"""

from __future__ import annotations

import io
import os
from dataclasses import replace
from pathlib import Path

import pytest

from federation.netns import run_scenario, system
from federation.netns.platform import NetnsPlatform
from federation.scenario import cli
from federation.scenario.loader import ScenarioError, parse_scenario
from federation.scenario.model import Heal

SHORT = """\
duration: 5
nodes: [n0, n1, n2]
links: [[n0, n1], [n1, n2]]
events:
  - {at: 1, subscribe: {node: n0, client: s0, filter: "a/#"}}
"""


@pytest.fixture(autouse=True)
def nothing_is_created(monkeypatch: pytest.MonkeyPatch) -> None:
    def create(self: NetnsPlatform, *args: object) -> None:
        raise AssertionError("NetnsPlatform.create was called: the refusal came too late")

    monkeypatch.setattr(NetnsPlatform, "create", create)


def run_cli(path: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    status = cli.main(["run", str(path), "--backend", "netns", "--quiet"], stdout=out, stderr=err)
    return status, err.getvalue()


def test_without_root_the_command_says_so_and_exits_2(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    scenario = tmp_path / "short.yaml"
    scenario.write_text(SHORT)
    status, error = run_cli(scenario)
    assert status == 2
    assert error.startswith("error: the netns backend needs root"), error
    assert "--backend sim" in error


def test_a_missing_tool_is_named_with_its_package(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    real = system.find_tool
    monkeypatch.setattr(system, "find_tool", lambda name: None if name == "nft" else real(name))
    reason = system.unavailable_reason()
    assert reason is not None and "needs nft" in reason and "apt-get install -y nftables" in reason


def test_a_topology_too_large_for_the_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(system, "unavailable_reason", lambda: None)  # as if root with every tool
    monkeypatch.delenv("FEDERATION_NETNS_MAX_NODES", raising=False)
    names = [f"n{i}" for i in range(300)]
    lines = ["duration: 5", f"nodes: [{', '.join(names)}]", "links:"]
    lines += [f"  - [{a}, {b}]" for a, b in zip(names, names[1:], strict=False)]
    path = tmp_path / "huge.yaml"
    path.write_text("\n".join(lines) + "\n")
    status, error = run_cli(path)
    assert status == 2
    assert "the scenario has 300 nodes; this machine runs at most" in error, error
    assert "--backend sim" in error


def test_an_unknown_node_is_refused(tmp_path):
    path = tmp_path / "unknown.yaml"
    path.write_text(SHORT + "  - {at: 2, kill: n7}\n")
    status, error = run_cli(path)
    assert status == 2
    assert "unknown node 'n7'" in error and "n0, n1, n2" in error, error


def test_a_cut_between_nodes_that_are_not_linked_is_refused(tmp_path):
    path = tmp_path / "cut.yaml"
    path.write_text(SHORT + "  - {at: 2, cut: [n0, n2]}\n")
    status, error = run_cli(path)
    assert status == 2
    assert "n0 and n2 are not neighbours" in error and "n0-n1, n1-n2" in error, error


def test_a_hand_built_scenario_is_checked_too():
    scenario = parse_scenario({"duration": 5, "nodes": ["n0", "n1", "n2"], "links": [["n0", "n1"], ["n1", "n2"]]},
                              "built.yaml")
    with pytest.raises(ScenarioError, match="n0 and n2 are not neighbours"):
        run_scenario(replace(scenario, events=(Heal(1.0, "n0", "n2"),)), seed=1)


def test_events_path_that_is_a_file_is_refused(tmp_path):
    scenario = tmp_path / "short.yaml"
    scenario.write_text(SHORT)
    events = tmp_path / "events.jsonl"
    events.write_text("")
    out, err = io.StringIO(), io.StringIO()
    status = cli.main(["run", str(scenario), "--backend", "netns", "--events", str(events)], stdout=out, stderr=err)
    assert status == 2
    assert "a file of that name exists" in err.getvalue()
