"""/healthz, /readyz and `wrapper.py status`'s exit status on a real wrapper whose real broker dies and comes back
(issue 21, item 5)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from federation.daemon.runtime import Runtime
from federation.protocol.types import Address

from broker_util import free_port, requires_mosquitto, start_broker, wait_for
from runtime_util import RuntimeThread, runtime_config

pytestmark = requires_mosquitto

REPO = Path(__file__).resolve().parents[2]


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def status_command(address: Address) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "wrapper.py"), "status", "--node", str(address)],
                          capture_output=True, text=True, timeout=20, cwd=REPO)


def test_readyz_follows_the_broker_and_status_exits_1_when_not_ready(tmp_path: Path) -> None:
    broker = start_broker(tmp_path, name="broker")
    metrics_port = free_port()
    config = runtime_config(broker.port, metrics_port=metrics_port, metrics_bind="127.0.0.1")
    thread = RuntimeThread(Runtime(config))
    base = f"http://127.0.0.1:{metrics_port}"
    try:
        wait_for(lambda: get(f"{base}/readyz")[0] == 200, timeout=15,
                 message=lambda: f"/readyz to say ready: {get(f'{base}/readyz')}")
        assert get(f"{base}/readyz") == (200, {"ready": True, "reasons": []})
        assert get(f"{base}/healthz") == (200, {"alive": True})
        ready = status_command(config.bind)
        assert ready.returncode == 0 and "\nready\n" in ready.stdout, ready.stdout + ready.stderr

        broker.kill()
        wait_for(lambda: get(f"{base}/readyz")[0] == 503, timeout=15, message="/readyz to say 503")
        status, answer = get(f"{base}/readyz")
        assert answer["ready"] is False
        assert answer["reasons"][0].startswith(f"not connected to broker 127.0.0.1:{broker.port}"), answer
        assert get(f"{base}/healthz") == (200, {"alive": True})  # alive: the loop answers, the overlay runs
        not_ready = status_command(config.bind)
        assert not_ready.returncode == 1, not_ready.stdout + not_ready.stderr
        assert f"NOT READY: not connected to broker 127.0.0.1:{broker.port}" in not_ready.stdout
        as_json = subprocess.run([sys.executable, str(REPO / "wrapper.py"), "status", "--node", str(config.bind),
                                  "--json"], capture_output=True, text=True, timeout=20, cwd=REPO)
        assert as_json.returncode == 1 and json.loads(as_json.stdout)["daemon"]["ready"]["ready"] is False

        broker.start()
        wait_for(lambda: get(f"{base}/readyz")[0] == 200, timeout=20, message="/readyz ready again")
    finally:
        assert thread.stop() == 0
        broker.stop()


def test_readyz_waits_for_a_configured_neighbour(tmp_path: Path) -> None:
    with start_broker(tmp_path, name="broker") as broker:
        metrics_port = free_port()
        config = runtime_config(broker.port, metrics_port=metrics_port, metrics_bind="127.0.0.1",
                                neighbours=(Address("127.0.0.1", free_port()),))  # nobody answers there
        thread = RuntimeThread(Runtime(config))
        try:
            health = thread.wrapper.broker_health
            wait_for(lambda: health.log_flowing, timeout=15, message="the broker's log")
            status, answer = get(f"http://127.0.0.1:{metrics_port}/readyz")
            assert (status, answer["reasons"]) == (503, ["none of the 1 configured neighbours is up"])
        finally:
            assert thread.stop() == 0
