"""Readiness (health.py) and the metrics port's paths (metrics_server.py), with a scripted probe instead of a
wrapper; tests/real/test_health_real.py watches a real wrapper's /readyz while its broker dies."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from federation.daemon.health import Readiness, readiness
from federation.daemon.metrics import Snapshot
from federation.daemon.metrics_server import start_metrics_server
from federation.protocol.types import Address

BROKER = Address("127.0.0.1", 1883)


def test_ready_needs_the_broker_its_log_and_a_neighbour_if_any_are_configured() -> None:
    assert readiness(BROKER, True, True, None, 0, 0) == Readiness(True)
    assert readiness(BROKER, True, True, None, 2, 1) == Readiness(True)
    down = readiness(BROKER, False, False, "broker 127.0.0.1:1883 refused the login", 2, 0)
    assert not down.ready and down.reasons == (
        "not connected to broker 127.0.0.1:1883: broker 127.0.0.1:1883 refused the login",
        "none of the 2 configured neighbours is up")
    (silent,) = readiness(BROKER, True, False, None, 0, 0).reasons
    assert "sends no log lines" in silent and "log_dest topic" in silent
    assert readiness(BROKER, False, False, None, 0, 0).as_dict() == {
        "ready": False, "reasons": ["not connected to broker 127.0.0.1:1883"]}


class ScriptedProbe:
    def __init__(self) -> None:
        self.alive = True
        self.ready: Readiness | None = None
        self.snapshot: Snapshot | None = None

    def metrics_snapshot(self) -> Snapshot | None:
        return self.snapshot

    def loop_answers(self) -> bool:
        return self.alive

    def readiness(self) -> Readiness | None:
        return self.ready


@pytest.fixture
def served() -> Iterator[tuple[ScriptedProbe, str]]:
    probe = ScriptedProbe()
    server = start_metrics_server("127.0.0.1", 0, probe)
    try:
        yield probe, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def get(url: str, method: str = "GET") -> tuple[int, str, str]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def body(answer: tuple[int, str, str]) -> tuple[int, Any]:
    status, content_type, text = answer
    assert content_type == "application/json"
    return status, json.loads(text)


def test_the_paths_answer_what_the_probe_says(served: tuple[ScriptedProbe, str]) -> None:
    probe, base = served
    assert body(get(f"{base}/healthz")) == (200, {"alive": True})
    assert body(get(f"{base}/readyz")) == (503, {"ready": False, "reasons": [
        "the wrapper is starting, or its event loop does not answer"]})
    probe.ready = Readiness(True)
    assert body(get(f"{base}/readyz")) == (200, {"ready": True, "reasons": []})
    probe.ready = Readiness(False, ("not connected to broker 127.0.0.1:1883",))
    assert body(get(f"{base}/readyz?verbose=1")) == (503, {"ready": False,
                                                           "reasons": ["not connected to broker 127.0.0.1:1883"]})
    probe.alive = False
    status, answer = body(get(f"{base}/healthz"))
    assert status == 503 and answer["alive"] is False and "did not answer" in answer["reason"]
    for path in ("/", "/metricsx", "/healthz/more", "/favicon.ico"):
        status, answer = body(get(f"{base}{path}"))
        assert status == 404 and answer["paths"] == ["/metrics", "/healthz", "/readyz"], path
    assert get(f"{base}/readyz", method="POST")[0] == 405
    assert get(f"{base}/healthz", method="HEAD")[:2] == (503, "application/json")


def test_metrics_while_starting_hold_the_process_collector_only(served: tuple[ScriptedProbe, str]) -> None:
    _probe, base = served
    status, content_type, text = get(f"{base}/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    assert "process_resident_memory_bytes" in text and "mqttfed_" not in text
