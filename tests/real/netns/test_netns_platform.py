"""The netns platform itself: links, faults, and that nothing is left behind however a run ends.

Needs root, `ip netns` and nftables (marker `netns`); skipped with the reason
otherwise. Traffic goes only between namespaces these tests create.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from federation.harness.driver import run_on_platform
from federation.harness.nodeconfig import REPO_ROOT, WRAPPER_PORT
from federation.harness.platform import InboundFilter, NodePlan, PlatformError
from federation.harness.processes import poll
from federation.netns import system
from federation.netns.platform import NetnsPlatform
from federation.scenario.loader import load_scenario

REASON = system.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

SHORT = """\
name: netns-short
duration: @DURATION@
settle: 1
settings: {hello_interval: 0.2, dead_intervals: 5, announce_interval: 1.0, stats_interval: 0.5}
nodes: {n0: {id: 0}, n1: {id: 1}, n2: {id: 2}}
links: [[n0, n1], [n1, n2]]
events:
  - {at: 0.2, subscribe: {node: n0, client: s0, filter: "t/#"}}
  - {at: 1, publish: {node: n2, topic: t/x, count: @COUNT@, interval: 0.1}}
  - {at: 2, cut: [n1, n2]}
"""


def short_scenario(tmp_path: Path, duration: float, count: int) -> Path:
    path = tmp_path / "short.yaml"
    path.write_text(SHORT.replace("@DURATION@", str(duration)).replace("@COUNT@", str(count)))
    return path


@pytest.fixture
def host_unchanged() -> Iterator[None]:
    """The test must leave no namespace, host interface, nft table or directory of the prefix scheme
    (of runs owned by this process: another test session may run its own meanwhile)."""
    before = system.host_snapshot(owner=os.getpid())
    yield
    assert system.host_snapshot(owner=os.getpid()) == before


def processes_mentioning(text: str) -> list[str]:
    """Command lines of running processes that contain `text` (a run's directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in command:
            found.append(command)
    return found


# ------------------------------------------------------------ links and faults


def datagrams_through(platform: NetnsPlatform, source: str, target: str, count: int) -> int:
    """Send `count` datagrams from `source`'s namespace to `target`'s address; how many arrived."""
    receiver = system.socket_in_namespace(platform.nodes[target].namespace)
    sender = system.socket_in_namespace(platform.nodes[source].namespace)
    try:
        receiver.bind((platform.address(target), WRAPPER_PORT))
        receiver.setblocking(False)
        for number in range(count):
            sender.sendto(str(number).encode(), (platform.address(target), WRAPPER_PORT))
        received = 0
        while select.select([receiver], [], [], 0.3)[0]:
            while True:
                try:
                    receiver.recv(100)
                except BlockingIOError:
                    break
                received += 1
        return received
    finally:
        receiver.close()
        sender.close()


def test_point_to_point_links_cuts_and_loss(host_unchanged):
    platform = NetnsPlatform()
    plans = [NodePlan("a", 0, 1, ("b",)), NodePlan("b", 1, 2, ("a", "c")), NodePlan("c", 2, 3, ("b",))]
    links = [("a", "b"), ("b", "c")]
    platform.preflight(plans, links)
    try:
        platform.create(plans, links)
        snapshot = system.host_snapshot(owner=os.getpid())
        assert sorted(snapshot["namespaces"]) == sorted(platform.namespaces)
        assert snapshot["links"] == [] and snapshot["nft_tables"] == []  # nothing of the run on the host
        assert datagrams_through(platform, "a", "b", 50) == 50
        assert datagrams_through(platform, "b", "c", 50) == 50
        with pytest.raises(OSError):  # no route to a non-neighbour, as in the simulator
            datagrams_through(platform, "a", "c", 1)
        platform.set_inbound("b", {"a": InboundFilter(cut=True)})  # cut a -> b only
        assert datagrams_through(platform, "a", "b", 50) == 0
        assert datagrams_through(platform, "b", "a", 50) == 50
        assert datagrams_through(platform, "c", "b", 50) == 50
        platform.set_inbound("b", {})  # heal
        assert datagrams_through(platform, "a", "b", 50) == 50
        platform.set_inbound("b", {"a": InboundFilter(loss=50)})
        arrived = datagrams_through(platform, "a", "b", 400)
        assert 120 < arrived < 280, f"{arrived} of 400 datagrams arrived through 50% loss"
        assert datagrams_through(platform, "c", "b", 100) == 100  # loss is per neighbour
        rules = system.run(["nft", "list", "ruleset"], namespace=platform.nodes["b"].namespace).stdout
        assert f"table inet {platform.names.table}" in rules and "numgen random mod 10000 < 5000" in rules
    finally:
        platform.destroy()
    assert not Path(platform.workdir).exists()


# ------------------------------------------------------------ cleanup


class FailingPlatform(NetnsPlatform):
    """Fails when the scenario's cut is applied: mid-run, with brokers, wrappers and clients running."""

    def set_inbound_many(self, filters: object) -> None:  # type: ignore[override]
        raise PlatformError("injected failure")


def test_an_injected_failure_mid_run_leaves_nothing(tmp_path, host_unchanged):
    scenario = load_scenario(short_scenario(tmp_path, duration=8, count=5))
    platform = FailingPlatform()
    with pytest.raises(PlatformError, match="injected failure"):
        run_on_platform(scenario, platform, seed=1, events_path=str(tmp_path / "events"))
    assert platform.processes, "the run should have started processes before the cut"
    assert all(process.poll() is not None for process in platform.processes)
    assert processes_mentioning(str(platform.workdir)) == []
    assert not platform.workdir.exists()
    # a failed run still leaves its diagnostics in the events directory
    assert (tmp_path / "events" / "nodes" / "n0" / "wrapper.log").exists()


def start_cli_run(tmp_path: Path, duration: float) -> tuple[subprocess.Popen[bytes], Path]:
    scenario = short_scenario(tmp_path, duration=duration, count=int(duration * 10) - 20)
    events = tmp_path / "events"
    process = subprocess.Popen(
        [sys.executable, "-m", "federation.scenario", "run", str(scenario), "--backend", "netns",
         "--events", str(events), "--quiet"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint)
    return process, events


def default_sigint() -> None:
    """In the child: SIGINT as a terminal delivers it. A test session started in the background by a
    non-interactive shell (`cmd &`) ignores SIGINT, the child would inherit that, and Python keeps an
    ignored SIGINT ignored, so the Ctrl-C test would see a run that never stops."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_cut(process: subprocess.Popen[bytes], events: Path) -> None:
    """Wait until the run is in its timeline with the cut applied (rules, clients, wrappers all there)."""
    def cut_applied() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the run ended early: {process.communicate()}")
        log = events / "run.jsonl"
        return log.exists() and '"run_cut"' in log.read_text()

    poll(cut_applied, 90, "the run to apply its cut", interval=0.1)


def run_artifacts(pid: int) -> tuple[list[str], list[str]]:
    """(namespaces, directories) of the runs owned by `pid`."""
    snapshot = system.host_snapshot(owner=pid)
    return snapshot["namespaces"], snapshot["directories"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_run_cleans_up(tmp_path, host_unchanged, signum):
    process, events = start_cli_run(tmp_path, duration=30)
    try:
        wait_for_cut(process, events)
        namespaces, directories = run_artifacts(process.pid)
        assert len(namespaces) == 3 and len(directories) == 1
        process.send_signal(signum)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode in (-signum, 128 + signum, 1), process.communicate()
    assert run_artifacts(process.pid) == ([], [])
    assert processes_mentioning(directories[0]) == []


def test_after_sigkill_the_children_die_and_cleanup_removes_the_leftovers(tmp_path, host_unchanged):
    process, events = start_cli_run(tmp_path, duration=30)
    try:
        wait_for_cut(process, events)
    finally:
        process.kill()
        process.wait()
    namespaces, directories = run_artifacts(process.pid)
    assert len(namespaces) == 3 and len(directories) == 1, "SIGKILL leaves the namespaces behind"
    ip = system.find_tool("ip") or "ip"
    # PR_SET_PDEATHSIG: brokers, wrappers and clients got SIGTERM when their parent died.
    poll(lambda: not any(system.namespace_pids(ip, name) for name in namespaces), 20,
         "the processes of the killed run to exit")
    assert set(namespaces) <= set(system.leftovers(ip)[0])
    result = subprocess.run([sys.executable, "-m", "federation.netns", "cleanup"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    for name in namespaces:
        assert f"removed namespace {name}" in result.stdout
    assert f"removed directory {directories[0]}" in result.stdout
    assert run_artifacts(process.pid) == ([], [])


def test_cleanup_never_touches_a_live_run(tmp_path):
    platform = NetnsPlatform()
    plans: Sequence[NodePlan] = [NodePlan("a", 0, 1, ())]
    platform.preflight(plans, [])
    try:
        platform.create(plans, [])
        ip = system.find_tool("ip") or "ip"
        namespaces, directories = system.leftovers(ip)
        assert platform.namespaces[0] not in namespaces
        assert platform.workdir not in directories
        started = time.monotonic()
        system.cleanup_leftovers(ip)
        assert (system.NETNS_DIR / platform.namespaces[0]).exists()
        assert time.monotonic() - started < 30
    finally:
        platform.destroy()
    assert not (system.NETNS_DIR / platform.namespaces[0]).exists()
