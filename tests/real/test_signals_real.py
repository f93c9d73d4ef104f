"""SIGHUP on real wrapper processes (issue 21, item 4): the shipped logrotate file rotates a live event log, and a
key rotation by SIGHUP keeps a federation of two wrappers working.

Nothing sleeps blindly: every wait polls a condition (the event log is flushed every second).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from federation.daemon.keys import generate_key
from federation.daemon.status import StatusError, query
from federation.tools.launch import LocalFederation, line

from broker_util import Processes, free_port, requires_mosquitto, wait_for
from federation_util import FAST_SETTINGS, Clients, clients_fixture, next_first_address  # noqa: F401 - the fixture
from service_util import LOG_DIR, LOGROTATE, SERVICE_USER, installed_under

REPO = Path(__file__).resolve().parents[2]
LOGROTATE_TOOL = shutil.which("logrotate") or ("/usr/sbin/logrotate" if os.path.exists("/usr/sbin/logrotate") else None)


def udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def lines_of(path: Path) -> list[dict[str, Any]]:
    """Every line of an event log, parsed: a torn or interleaved line fails here."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    assert not text or text.endswith("\n"), f"{path} ends inside a line"
    return [json.loads(raw) for raw in text.splitlines()]


@pytest.mark.skipif(LOGROTATE_TOOL is None, reason="needs logrotate: apt-get install logrotate (install-deps.sh)")
def test_the_shipped_logrotate_file_rotates_a_live_wrapper_by_sighup(tmp_path: Path) -> None:
    """logrotate renames the event log, creates a new one and its postrotate sends SIGHUP: the wrapper keeps
    running and writes on in the new file at the path; the old lines are whole in the renamed file."""
    assert LOGROTATE_TOOL is not None
    log_path = Path(installed_under(tmp_path, f"{LOG_DIR}/events.jsonl"))
    port = udp_port()
    config = tmp_path / "wrapper.yaml"
    config.write_text("settings:\n  stats_interval: 0.2\n", encoding="utf-8")  # a `counters` line 5 times a second
    stderr_path = tmp_path / "wrapper.stderr"
    with open(stderr_path, "wb") as stderr:
        wrapper = subprocess.Popen([sys.executable, str(REPO / "wrapper.py"), "--config", str(config),
                                    "--bind", f"127.0.0.1:{port}", "--broker", f"127.0.0.1:{free_port()}",
                                    "--event-log", str(log_path)],
                                   cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        def alive() -> None:
            assert wrapper.poll() is None, f"the wrapper exited with {wrapper.returncode}:\n{stderr_path.read_text()}"

        def written(path: Path, count: int) -> bool:
            alive()
            return len(lines_of(path)) >= count

        wait_for(lambda: written(log_path, 3), timeout=15, message="event log lines before the rotation")
        # The shipped file, its paths moved here, run as whoever runs the test (the service user does not exist
        # here), its postrotate signalling this wrapper instead of the systemd service.
        shipped = LOGROTATE.read_text(encoding="utf-8")
        postrotate = "systemctl kill --kill-whom=main --signal=HUP mqtt-federation.service"
        assert postrotate in shipped
        owner = "root root" if os.geteuid() == 0 else ""
        rotation = (shipped.replace(f"{LOG_DIR}/", f"{log_path.parent}/")
                    .replace(postrotate, f"kill -HUP {wrapper.pid}")
                    .replace(f"su {SERVICE_USER} {SERVICE_USER}", f"su {owner}" if owner else "")
                    .replace(f"create 0640 {SERVICE_USER} {SERVICE_USER}", f"create 0640 {owner}".rstrip()))
        (tmp_path / "logrotate.conf").write_text(rotation, encoding="utf-8")
        result = subprocess.run([LOGROTATE_TOOL, "--force", "--state", str(tmp_path / "logrotate.state"),
                                 str(tmp_path / "logrotate.conf")], capture_output=True, text=True, timeout=60,
                                check=False)
        assert result.returncode == 0 and not result.stderr.strip(), result.stderr
        rotated = log_path.with_name("events.jsonl.1")
        wait_for(lambda: "event log reopened" in stderr_path.read_text(), timeout=10,
                 message=lambda: f"the SIGHUP to be handled:\n{stderr_path.read_text()}")
        wait_for(lambda: written(log_path, 3), timeout=15, message="new lines in the new file at the path")
        document = query("127.0.0.1", port)
        assert document["daemon"]["reloads"]["signals"] == 1 and document["daemon"]["reloads"]["failures"] == 0
    finally:
        status = Processes.end(wrapper, timeout=10)
    assert status == 0, stderr_path.read_text()
    old, new = lines_of(rotated), lines_of(log_path)
    assert old[0]["type"] == "node_started" and all(entry["type"] != "node_stopped" for entry in old)
    assert new[-1]["type"] == "node_stopped" and all(entry["type"] != "node_started" for entry in new)
    assert oct(log_path.stat().st_mode & 0o777) == "0o640"  # made by logrotate's `create`, kept by the wrapper


# ------------------------------------------------------------------ key rotation


def key_ids(federation: LocalFederation, name: str) -> list[str] | None:
    try:
        return list(federation.status(name)["envelope"]["key_ids"])
    except StatusError:
        return None


def sighup_all(federation: LocalFederation) -> None:
    for node in federation.nodes.values():
        assert node.wrapper_process is not None and node.wrapper_process.poll() is None
        node.wrapper_process.send_signal(signal.SIGHUP)


@requires_mosquitto
def test_key_rotation_by_sighup_keeps_two_wrappers_federated(tmp_path: Path, clients: Clients) -> None:
    """The rotation of docs/security.md, every step a SIGHUP to both wrappers: add the new key (accepted, not
    signing), let it sign, retire the old one; a bad key file in between changes nothing. A publication crosses
    after every step, and no datagram is refused for its key."""
    key_file = tmp_path / "federation.key"
    old_key, new_key = generate_key(), generate_key()
    key_file.write_text(old_key + "\n", encoding="utf-8")
    key_file.chmod(0o600)
    federation = LocalFederation(["n0", "n1"], line(["n0", "n1"]), tmp_path / "federation", FAST_SETTINGS,
                                 first_address=next_first_address(), key_file=key_file)
    federation.start_brokers()
    try:
        federation.start_wrappers()
        federation.wait_converged(timeout=20)
        subscriber = clients.subscribe(federation, "n1", "rotate/#", qos=1)
        federation.wait_mesh("rotate/#")
        (first_ids,) = {tuple(key_ids(federation, name) or ()) for name in federation.nodes}
        sent = 0

        def crosses() -> None:
            nonlocal sent
            sent += 1
            clients.publish(federation, "n0", f"rotate/{sent}", f"after step {sent}".encode(), qos=1)
            subscriber.wait_for_message(f"rotate/{sent}", f"after step {sent}".encode(), timeout=15)

        crosses()
        steps = [
            (f"{old_key}\n{new_key}\n", 2),   # both accepted, the old one still signs
            (f"{new_key}\n{old_key}\n", 2),   # the new one signs
            ("this is not a key\n", None),    # a mistake: the keys in use are kept
            (f"{new_key}\n", 1),              # the old one retired
        ]
        for text, count in steps:
            before = {name: key_ids(federation, name) for name in federation.nodes}
            reloads = {name: federation.status(name)["daemon"]["reloads"]["signals"] for name in federation.nodes}
            key_file.write_text(text, encoding="utf-8")
            sighup_all(federation)
            for name in federation.nodes:
                def handled(name: str = name, seen: int = reloads[name]) -> bool:
                    return bool(federation.status(name)["daemon"]["reloads"]["signals"] > seen)

                wait_for(handled, timeout=10, message=f"{name} to handle the SIGHUP")
                ids = key_ids(federation, name)
                if count is None:
                    assert ids == before[name]
                    # The whole file is refused as a start would refuse it (issue 38): nothing changes.
                    assert "refused; kept the running configuration" in federation.node(name).wrapper_log.read_text()
                else:
                    assert ids is not None and len(ids) == count and ids != before[name]
            crosses()
        final = {tuple(key_ids(federation, name) or ()) for name in federation.nodes}
        assert len(final) == 1 and final != {first_ids}
        for name in federation.nodes:
            drops = federation.status(name)["envelope"]["drops"]
            assert not {"bad_mac", "unknown_key"} & set(drops), (name, drops)
            assert federation.node(name).wrapper_running
    finally:
        federation.stop()
    assert all(exits == [0] for exits in (node.wrapper_exits for node in federation.nodes.values()))
