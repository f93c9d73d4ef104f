"""Real LXD containers: provision three, federate, cut and heal a link, tear everything down.

Run with `python3 -m pytest -m lxd` as root on Debian 12. On a fresh machine
`lxc/provision.py up` installs LXD, starts and initialises the daemon and
builds the image (a few minutes); with the daemon and image cached the
module takes well under a minute.

The topology is a line n0 - n1 - n2, brought up with the real command
(`python lxc/provision.py up FILE`, as a person would) and torn down with
`down`. The checks use real clients inside the containers: mosquitto_sub in
n2 and mosquitto_pub in n0, so every publication crosses n1. The cut is
nftables rules inside n1 and n2 (`LxdCluster.cut`); while it holds, the
wrappers must see each other down and no publication may reach n2; after
the heal both come back. The module's fixture runs `down` whatever
happened, and stops the LXD daemon if it was not running before the tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from federation.harness.nodeconfig import REPO_ROOT
from federation.harness.processes import poll
from federation.lxd import host
from federation.lxd.cli import connect, load_plan
from federation.lxd.cluster import LxdCluster, delete_containers, ours

PROVISION = [sys.executable, str(REPO_ROOT / "lxc" / "provision.py")]
PREFIX = "mqftest"
TOPOLOGY = """\
name: line3
duration: 30
settings: {hello_interval: 0.5, dead_intervals: 3}
nodes: [n0, n1, n2]
links: [[n0, n1], [n1, n2]]
"""
UP_TIMEOUT = 1800
"""seconds: on a fresh machine `up` installs packages and builds the image"""


def provision(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PROVISION, *argv], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def topology_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lxd") / "line3.yaml"
    path.write_text(TOPOLOGY)
    return path


@pytest.fixture(scope="module")
def cluster(topology_file: Path) -> Iterator[LxdCluster]:
    if os.geteuid() != 0:
        pytest.fail("the lxd tests need root (apt-get, the lxd daemon, nftables)")
    daemon_was_running = host.daemon_answers()
    try:
        result = provision("up", str(topology_file), "--prefix", PREFIX, timeout=UP_TIMEOUT)
        assert result.returncode == 0, f"up failed:\n{result.stderr[-4000:]}"
        for line in ("[3/3] n2: container mqftest-line3-n2 created and started", "federation converged"):
            assert line in result.stderr  # progress is shown node by node
        plan = load_plan(str(topology_file), prefix=PREFIX)
        lxd = LxdCluster(connect(None), plan)
        lxd.load_addresses()
        assert sorted(lxd.addresses) == ["n0", "n1", "n2"]
        yield lxd
    finally:
        _teardown(topology_file, daemon_was_running)


def _teardown(topology_file: Path, daemon_was_running: bool) -> None:
    """`down`, then make sure: no container of ours left, daemon stopped if we started it."""
    keep = ["--keep-daemon"] if daemon_was_running else []
    result = provision("down", str(topology_file), "--prefix", PREFIX, *keep)
    if host.daemon_answers():
        client = connect(None)
        leftovers = [instance.name for instance in ours(client, f"{PREFIX}-")]
        if leftovers:
            delete_containers(client, f"{PREFIX}-", lambda message: None)
        if not daemon_was_running and not client.instances.all():
            host.stop_daemon(lambda message: None)
        assert not leftovers, f"`down` left containers {leftovers}:\n{result.stderr}"
    assert result.returncode == 0, result.stderr
    if not daemon_was_running:
        assert not host.daemon_answers(), "the LXD daemon started for the tests is still running"


def subscribe(cluster: LxdCluster, node: str, topic: str) -> str:
    """Start mosquitto_sub in the node's container; the file it prints to."""
    output = f"/tmp/sub-{uuid.uuid4().hex[:8]}.out"
    cluster.spawn(node, ["mosquitto_sub", "-h", "127.0.0.1", "-i", f"sub-{uuid.uuid4().hex[:6]}", "-t", topic, "-v"],
                  output)
    return output


def received(cluster: LxdCluster, node: str, output: str) -> list[str]:
    result = cluster.exec(node, ["cat", output], check=False)
    return result.stdout.splitlines()


def publish(cluster: LxdCluster, node: str, topic: str, payload: str) -> None:
    cluster.exec(node, ["mosquitto_pub", "-h", "127.0.0.1", "-t", topic, "-m", payload])


def publish_until_received(cluster: LxdCluster, topic: str, output: str, label: str, timeout: float) -> str:
    """Publish distinct payloads from n0 until n2's subscriber prints one; that line."""
    sent: list[str] = []

    def arrived() -> str | None:
        payload = f"{label}-{len(sent)}"
        publish(cluster, "n0", topic, payload)
        sent.append(payload)
        lines = received(cluster, "n2", output)
        return next((line for line in lines if line.startswith(f"{topic} {label}-")), None)

    return poll(arrived, timeout, f"a publication of n0 on {topic} to reach n2's subscriber", interval=0.3)


def neighbour_up(cluster: LxdCluster, node: str, other: str) -> bool | None:
    document = cluster.status(node)
    if document is None:
        return None
    wanted = cluster.wrapper_address(other)
    for neighbour in document.get("neighbours", []):
        if neighbour.get("address") == wanted:
            return bool(neighbour.get("up"))
    return None


def test_status_shows_every_wrapper_running_and_connected(cluster: LxdCluster, topology_file: Path) -> None:
    result = provision("status", str(topology_file), "--prefix", PREFIX)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[1:]]
    assert [row[0] for row in rows] == ["n0", "n1", "n2"]
    for row in rows:
        assert row[2:3] == ["Running"] and "running" in row and "connected" in row, row
        assert row[-2] == "3"  # every wrapper's federation table holds the three nodes
    assert {row[-1] for row in rows} == {f"1@{cluster.wrapper_address('n0')}"}  # one management core: n0 (id 1)


def test_a_publication_crosses_the_containers(cluster: LxdCluster) -> None:
    topic = f"lxd/{uuid.uuid4().hex[:8]}"
    output = subscribe(cluster, "n2", topic)
    line = publish_until_received(cluster, topic, output, "hello", timeout=30)
    assert line.startswith(f"{topic} hello-")
    # The only path is n0 -> n1 -> n2: n1's wrapper forwarded it.
    relay = cluster.status("n1")
    assert relay is not None
    assert relay["daemon"]["events"].get("publications_forwarded", 0) >= 1, relay["daemon"]["events"]


def test_cut_and_heal_a_link(cluster: LxdCluster) -> None:
    topic = f"lxd/{uuid.uuid4().hex[:8]}"
    output = subscribe(cluster, "n2", topic)
    publish_until_received(cluster, topic, output, "before", timeout=30)

    cluster.cut("n1", "n2")
    try:
        poll(lambda: neighbour_up(cluster, "n1", "n2") is False and neighbour_up(cluster, "n2", "n1") is False,
             15, "n1 and n2 to see each other down after the cut")
        rules = cluster.exec("n2", ["nft", "list", "table", "inet", "mqtt_federation"]).stdout
        assert f"ip saddr {cluster.addresses['n1']} drop" in rules
        for index in range(10):
            publish(cluster, "n0", topic, f"during-{index}")
        # Nothing may arrive while the link is cut: watch n2's subscriber for a few seconds.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert not [line for line in received(cluster, "n2", output) if " during-" in line]
            time.sleep(0.3)
    finally:
        cluster.heal("n1", "n2")

    poll(lambda: neighbour_up(cluster, "n1", "n2") and neighbour_up(cluster, "n2", "n1"), 20,
         "n1 and n2 to see each other up after the heal")
    assert "ip saddr" not in cluster.exec("n2", ["nft", "list", "table", "inet", "mqtt_federation"]).stdout
    publish_until_received(cluster, topic, output, "after", timeout=30)
    assert not [line for line in received(cluster, "n2", output) if " during-" in line]
