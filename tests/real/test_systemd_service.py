"""The systemd unit's own command line, run as systemd would run it, against a real Mosquitto on loopback.

ExecStart is read from packaging/systemd/mqtt-federation.service and every
path in it is moved under a temporary root (`/etc/mqtt-federation/...` becomes
`ROOT/etc/mqtt-federation/...`); the executable there is a console-script
stand-in for this checkout's `federation-wrapper`. The process gets what
systemd gives a Type=notify service: a clean environment with NOTIFY_SOCKET
(here a datagram socket of the test) and WATCHDOG_USEC, `/` as working
directory, its state and log directories created beforehand. It must say
READY=1 once it runs, ping the watchdog, and on SIGTERM say STOPPING=1 and
exit 0.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from federation.daemon.keys import generate_key
from federation.daemon.status import StatusError, query

from broker_util import requires_mosquitto, start_broker, wait_for
from service_util import CONFIG_DIR, INSTALL_DIR, LOG_DIR, REPO, STATE_DIR, exec_start, installed_under, read_unit

pytestmark = requires_mosquitto

WATCHDOG_USEC = 1_000_000
"""the test's watchdog (a ping every 0.5 s); the unit's own WatchdogSec is checked in tests/packaging"""


def udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class NotifySocket:
    """What systemd listens on for a Type=notify service: every datagram received, in order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)
        self.messages: list[str] = []

    def received(self) -> list[str]:
        try:
            while True:
                self.messages.append(self.sock.recv(4096).decode())
        except BlockingIOError:
            return self.messages

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[NotifySocket]:
    notify = NotifySocket(tmp_path / "notify")
    try:
        yield notify
    finally:
        notify.close()


def install_layout(root: Path, broker_port: int, wrapper_port: int) -> None:
    """What docs/install.md puts on a host, under `root`: the console script, wrapper.yaml, the key."""
    program = Path(installed_under(root, f"{INSTALL_DIR}/bin/federation-wrapper"))
    program.parent.mkdir(parents=True)
    # What pip writes for the console script, plus this checkout on the path (the test runs the checkout).
    program.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO)!r})\n"
                       "from federation.daemon.cli import main\nsys.exit(main())\n", encoding="utf-8")
    program.chmod(0o755)
    config_dir = Path(installed_under(root, CONFIG_DIR))
    config_dir.mkdir(parents=True)
    key = config_dir / "federation.key"
    key.write_text(generate_key() + "\n", encoding="utf-8")
    key.chmod(0o600)
    (config_dir / "wrapper.yaml").write_text(
        f"bind: 127.0.0.1:{wrapper_port}\nbroker: 127.0.0.1:{broker_port}\nname: service-test\n"
        f"key_file: {key}\n", encoding="utf-8")
    for directory in (STATE_DIR, LOG_DIR):  # StateDirectory= and LogsDirectory= create them before ExecStart
        Path(installed_under(root, directory)).mkdir(parents=True, mode=0o750)


def test_exec_start_gets_ready_pings_the_watchdog_and_stops_cleanly_on_sigterm(
        tmp_path: Path, notify_socket: NotifySocket) -> None:
    broker = start_broker(tmp_path / "broker")
    root = tmp_path / "root"
    wrapper_port = udp_port()
    install_layout(root, broker.port, wrapper_port)
    command = [installed_under(root, argument) for argument in exec_start(read_unit())]
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
                   "NOTIFY_SOCKET": str(notify_socket.path), "WATCHDOG_USEC": str(WATCHDOG_USEC)}
    stderr_path = tmp_path / "wrapper.stderr"
    with open(stderr_path, "wb") as stderr:
        wrapper = subprocess.Popen(command, cwd="/", env=environment, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        def said(message: str) -> bool:
            if wrapper.poll() is not None:
                raise AssertionError(f"the wrapper exited with {wrapper.returncode}:\n{stderr_path.read_text()}")
            return message in notify_socket.received()

        wait_for(lambda: said("READY=1"), timeout=30, message=lambda: f"READY=1 (stderr:\n{stderr_path.read_text()})")

        def broker_connected() -> bool:
            try:
                broker_status = query("127.0.0.1", wrapper_port)["daemon"]["broker"]
            except StatusError:
                return False
            return bool(broker_status["connected"] and broker_status["log_lines"] > 0)

        wait_for(broker_connected, timeout=30, message="the wrapper to connect to its broker and read its log")
        wait_for(lambda: said("WATCHDOG=1"), timeout=10, message="a watchdog ping")
        wrapper.send_signal(signal.SIGTERM)
        assert wrapper.wait(timeout=20) == 0, stderr_path.read_text()
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()
        broker.stop()
    messages = notify_socket.received()
    assert messages[0] == "READY=1" and messages[-1] == "STOPPING=1", messages
    events = [json.loads(line) for line in
              Path(installed_under(root, f"{LOG_DIR}/events.jsonl")).read_text(encoding="utf-8").splitlines()]
    assert [entry["type"] for entry in events if entry["type"] in ("node_started", "node_stopped")] == [
        "node_started", "node_stopped"]
    assert any(Path(installed_under(root, STATE_DIR)).iterdir()), "nothing persisted in the state directory"
