"""The shipped dashboard and alert rules against a real Prometheus scraping live wrappers (issue 40, item 5).

Two wrapper processes, each beside its own Mosquitto and each the other's neighbour, serve their metrics; a
Prometheus server (Debian's, the package scripts/install-deps.sh installs for promtool) scrapes both in the job
the rules name, with the shipped rule file loaded. Then every selector of every alert rule and dashboard query
must find series, once per label value it names (`reason=~"a|b"` is `reason="a"` and `reason="b"`), every
rule must evaluate without error, and every dashboard query, with Grafana's variables filled in, must run.
Everything listens on 127.0.0.1 and goes with the test.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker_util import Broker, free_port, requires_mosquitto, start_broker, wait_for
from monitoring_util import JOB, RULES, dashboard_expressions, rule_expressions, selectors, with_variables

PROMETHEUS = shutil.which("prometheus") or shutil.which("prometheus", path="/usr/bin:/usr/sbin")
pytestmark = [requires_mosquitto,
              pytest.mark.skipif(PROMETHEUS is None, reason="needs the prometheus server: apt-get install "
                                                            "--no-install-recommends prometheus (install-deps.sh)")]
START_TIMEOUT = 30.0
LOOKBACK = 300
"""seconds of history a series query looks at"""


def udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


class Prometheus:
    """A Prometheus server on 127.0.0.1 with its data in the test's directory."""

    def __init__(self, directory: Path, targets: list[str]) -> None:
        directory.mkdir()
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "rule_files": [str(RULES)],
                  "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": targets}]}]}
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = directory / "prometheus.log"
        assert PROMETHEUS is not None
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [PROMETHEUS, f"--config.file={directory / 'prometheus.yml'}",
                 f"--storage.tsdb.path={directory / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
                 "--log.level=warn"], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def api(self, path: str, **parameters: str) -> Any:
        answer = get(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(parameters)}")
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expression: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=expression)["result"]
        return result

    def series(self, selector: str) -> list[dict[str, str]]:
        now = time.time()
        found: list[dict[str, str]] = self.api("series", **{"match[]": selector, "start": str(now - LOOKBACK),
                                                            "end": str(now)})
        return found

    def diagnostics(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Wrapper:
    """`python -m federation.daemon.cli` beside one broker, with a metrics port."""

    def __init__(self, directory: Path, broker: Broker, bind: int, neighbour: int) -> None:
        directory.mkdir()
        self.metrics_port = free_port()
        self.stderr = directory / "wrapper.log"
        with self.stderr.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "federation.daemon.cli", "--bind", f"127.0.0.1:{bind}",
                 "--broker", f"127.0.0.1:{broker.port}", "--neighbors", f"127.0.0.1:{neighbour}",
                 "--metrics-port", str(self.metrics_port), "--state-dir", str(directory / "state")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        assert self.process.poll() is None, self.stderr.read_text()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/readyz", timeout=2):
                return True
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def scraped(tmp_path: Path) -> Iterator[Prometheus]:
    """Two ready wrappers, neighbours of each other, and a Prometheus that has scraped both and run the rules."""
    started: list[Broker | Wrapper | Prometheus] = []
    try:
        brokers = [start_broker(tmp_path, name=f"broker-{index}") for index in range(2)]
        started += brokers
        ports = [udp_port(), udp_port()]
        wrappers = [Wrapper(tmp_path / f"wrapper-{index}", brokers[index], ports[index], ports[1 - index])
                    for index in range(2)]
        started += wrappers
        wait_for(lambda: all(wrapper.ready() for wrapper in wrappers), START_TIMEOUT, 0.2,
                 lambda: "both wrappers ready:\n" + "\n".join(w.stderr.read_text()[-1500:] for w in wrappers))
        prometheus = Prometheus(tmp_path / "prometheus", [f"127.0.0.1:{w.metrics_port}" for w in wrappers])
        started.append(prometheus)

        def settled() -> bool:
            try:
                if len(prometheus.query(f'up{{job="{JOB}"}} == 1')) != 2:
                    return False
                # two scrapes of a hello round trip each way: rate() and histogram_quantile() have data
                if len(prometheus.query("increase(mqttfed_hop_rtt_seconds_count[1m]) > 0")) != 2:
                    return False
                groups = prometheus.api("rules")["groups"]
            except (urllib.error.URLError, OSError):
                return False
            return all(not rule["lastEvaluation"].startswith("0001") for group in groups for rule in group["rules"])

        wait_for(settled, START_TIMEOUT, 0.25, lambda: f"Prometheus to scrape both wrappers and run the rules:\n"
                                                       f"{prometheus.diagnostics()}")
        yield prometheus
    finally:
        for part in reversed(started):
            part.stop()


def test_every_selector_of_the_rules_and_the_dashboard_finds_the_series_it_names(scraped: Prometheus) -> None:
    missing = []
    checked = 0
    for where, expression in rule_expressions() + dashboard_expressions():
        for selector in selectors(with_variables(expression)):
            for variant in selector.each_value():
                checked += 1
                if not scraped.series(variant):
                    missing.append(f"{where}: {variant}")
    assert checked > 60, f"only {checked} selectors found: is the parser still reading the files?"
    assert not missing, "selectors that find no series on live wrappers:\n" + "\n".join(missing)


def test_every_rule_evaluates_and_every_dashboard_query_runs(scraped: Prometheus) -> None:
    rules = {rule["name"]: rule for group in scraped.api("rules")["groups"] for rule in group["rules"]}
    assert set(rules) == {alert for alert, _ in rule_expressions()}
    for name, rule in rules.items():
        assert rule["health"] == "ok", f"{name}: {rule.get('lastError')}"
    for where, expression in dashboard_expressions():
        if where.startswith("variable "):
            continue  # Grafana's label_values(), no PromQL: below
        assert scraped.query(with_variables(expression)) is not None, where
    instances = scraped.api("label/instance/values", **{"match[]": "mqttfed_info"})
    assert len(instances) == 2, instances
    # Healthy wrappers: the alerts that watch health stay quiet.
    firing = [alert["labels"]["alertname"] for alert in scraped.api("alerts")["alerts"]]
    for quiet in ("MqttFedWrapperDown", "MqttFedNotReady", "MqttFedBrokerDisconnected", "MqttFedIsolated"):
        assert quiet not in firing, firing
