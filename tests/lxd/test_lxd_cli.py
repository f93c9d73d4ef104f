"""`lxc/provision.py` argument and input errors, and `up --dry-run`, without touching LXD.

The host and LXD steps are replaced by functions that fail the test if
called: every error here must be reported before anything is installed,
started or created.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from federation.harness.nodeconfig import REPO_ROOT
from federation.lxd import cli, host
from federation.lxd.plan import Machine

GiB = 2**30
LINE3 = """\
name: line3
duration: 10
nodes: [n0, n1, n2]
links: [[n0, n1], [n1, n2]]
"""


def forbidden(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the command touched the host or LXD before reporting the error")


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No LXD running, a big machine, and any host step fails the test."""
    monkeypatch.setattr(cli, "connect", lambda endpoint, required=True: None)
    monkeypatch.setattr(host, "measure_machine", lambda running=0: Machine(
        memory_available=24 * GiB, disk_free=80 * GiB, disk_path="/var/lib/lxd", inotify_instances=128))
    monkeypatch.setattr(host, "prepare_host", forbidden)
    monkeypatch.setattr(host, "stop_daemon", forbidden)


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = cli.main(list(argv), stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def write(tmp_path: Path, text: str, name: str = "topology.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_dry_run_prints_the_plan_and_creates_nothing(tmp_path: Path, offline: None) -> None:
    status, out, err = run("up", write(tmp_path, LINE3), "--dry-run")
    assert status == 0, err
    assert "3 containers, 2 links" in out
    assert "mqf-line3-n1  node n1, id 2, neighbours n0, n2" in out
    assert "image to be built" in out and "nothing was created" in out


def test_prefix_reaches_the_container_names(tmp_path: Path, offline: None) -> None:
    status, out, _ = run("up", write(tmp_path, LINE3), "--dry-run", "--prefix", "lab")
    assert status == 0
    assert "lab-line3-n0" in out


@pytest.mark.parametrize(("argv", "message"), [
    ((), "the following arguments are required: COMMAND"),
    (("up",), "the following arguments are required: FILE"),
    (("sideways", "x.yaml"), "invalid choice: 'sideways'"),
    (("up", "x.yaml", "--log-level", "LOUD"), "invalid choice: 'LOUD'"),
    (("down",), "give a topology FILE, or --all"),
    (("down", "x.yaml", "--all"), "give a topology FILE, or --all"),
])
def test_argument_errors_exit_2_with_usage(argv: tuple[str, ...], message: str, offline: None) -> None:
    status, _, err = run(*argv)
    assert status == 2
    assert message in err
    assert err.startswith("federation-provision: error: ")


def test_missing_file(tmp_path: Path, offline: None) -> None:
    status, _, err = run("up", str(tmp_path / "nope.yaml"))
    assert status == 2
    assert "nope.yaml: cannot read the scenario file" in err


def test_unknown_node_in_an_event_is_refused_before_anything(tmp_path: Path, offline: None) -> None:
    text = LINE3 + "events:\n  - {at: 1, subscribe: {node: n7, client: c, filter: a}}\n"
    status, _, err = run("up", write(tmp_path, text))
    assert status == 2
    assert "unknown node 'n7'" in err and "nodes are: n0, n1, n2" in err


def test_cut_between_unlinked_nodes_is_refused_before_anything(tmp_path: Path, offline: None) -> None:
    text = LINE3 + "events:\n  - {at: 1, cut: [n0, n2]}\n"
    status, _, err = run("up", write(tmp_path, text))
    assert status == 2
    assert "n0 and n2 are not neighbours; links are: n0-n1, n1-n2" in err


def test_colliding_container_names_are_refused(tmp_path: Path, offline: None) -> None:
    text = "name: t\nduration: 5\nnodes: [a_1, a.1]\nlinks: [[a_1, a.1]]\n"
    status, _, err = run("up", write(tmp_path, text))
    assert status == 2
    assert "would both become container 'mqf-t-a-1'" in err


def test_a_topology_too_large_for_the_machine_is_refused_before_anything(
        tmp_path: Path, offline: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "measure_machine", lambda running=0: Machine(
        memory_available=GiB + 200 * 2**20, disk_free=80 * GiB, disk_path="/var/lib/lxd", inotify_instances=4096))
    nodes = [f"n{index}" for index in range(12)]
    text = f"name: big\nduration: 5\nnodes: [{', '.join(nodes)}]\n"
    status, out, err = run("up", write(tmp_path, text))
    assert status == 2
    assert "the topology does not fit on this machine" in err
    assert "not enough memory: 12 containers" in err and "at most 1 containers fit" in err
    assert out == ""


def test_status_and_down_without_a_running_lxd(tmp_path: Path, offline: None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_stored_containers", lambda prefix: [])
    path = write(tmp_path, LINE3)
    status, out, _ = run("status", path)
    assert status == 1 and "topology line3 is down" in out
    status, out, _ = run("down", path)
    assert status == 0 and "nothing to remove" in out


def test_the_script_runs_from_a_checkout() -> None:
    result = subprocess.run([sys.executable, str(REPO_ROOT / "lxc" / "provision.py"), "up", "--help"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "--dry-run" in result.stdout and "--endpoint" in result.stdout


# ---------------------------------------------------------------- the scenario backend's checks


def test_backend_refuses_a_scenario_too_large_before_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    from federation.harness.driver import node_plans
    from federation.harness.platform import PlatformUnavailable
    from federation.lxd.backend import LxdPlatform
    from federation.scenario.loader import parse_scenario

    monkeypatch.setattr(host, "daemon_answers", lambda socket_path=None: False)
    monkeypatch.setattr(host, "prepare_host", forbidden)
    monkeypatch.setattr(host, "measure_machine", lambda running=0: Machine(
        memory_available=GiB, disk_free=80 * GiB, disk_path="/var/lib/lxd", inotify_instances=128))
    monkeypatch.setattr("os.geteuid", lambda: 0)
    scenario = parse_scenario({"name": "a-rather-long-scenario-name-indeed", "duration": 5,
                               "nodes": [f"n{index}" for index in range(30)]}, "big.yaml")
    platform = LxdPlatform(scenario)
    with pytest.raises(PlatformUnavailable) as refused:
        platform.preflight(node_plans(scenario, 1), scenario.links)
    text = str(refused.value)
    assert "does not fit on this machine" in text and "not enough memory" in text and "inotify" in text
    # The run's container names carry a per-run token, the cut scenario name, and fit LXD's limit.
    assert platform.plan is not None
    names = platform.plan.containers()
    assert all(name.startswith(f"mqf-{platform.topology}-") and len(name) <= 63 for name in names), names
    assert platform.topology.startswith("run") and "a-rather-long-scena" in platform.topology
    platform.destroy()  # nothing was made: nothing to do, and no error


def test_backend_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    from federation.harness.driver import node_plans
    from federation.harness.platform import PlatformUnavailable
    from federation.lxd.backend import LxdPlatform
    from federation.scenario.loader import parse_scenario

    monkeypatch.setattr("os.geteuid", lambda: 1000)
    scenario = parse_scenario({"name": "s", "duration": 5, "nodes": ["a", "b"], "links": [["a", "b"]]}, "s.yaml")
    with pytest.raises(PlatformUnavailable, match="needs root"):
        LxdPlatform(scenario).preflight(node_plans(scenario, 1), scenario.links)
