"""The shipped Grafana dashboard and Prometheus alert rules (packaging/grafana, packaging/prometheus): the rules pass
`promtool check rules`, and every metric either of them uses is in docs/metrics.md's table (which
tests/real/test_metrics_real.py checks against what a wrapper serves)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "packaging" / "prometheus" / "mqtt-federation-rules.yml"
DASHBOARD = REPO / "packaging" / "grafana" / "mqtt-federation.json"
METRICS_DOC = REPO / "docs" / "metrics.md"
PROMTOOL = shutil.which("promtool")
PROMETHEUS_OWN = {"up"}
"""series Prometheus itself adds per scrape target (docs/metrics.md says so), allowed besides the table"""
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
METRIC_NAME = re.compile(r"\b((?:mqttfed|process)_[a-z0-9_]+|up)\b(?=\s*[{\[)\s/*+<>=!,-]|\s*$)")


@cache
def documented() -> dict[str, str]:
    """metric -> type, from the table of docs/metrics.md"""
    found = {}
    for line in METRICS_DOC.read_text(encoding="utf-8").splitlines():
        match = re.match(r"\| `((?:mqttfed|process)_[a-z0-9_]+)` \| (counter|gauge|histogram) \|", line)
        if match:
            found[match.group(1)] = match.group(2)
    assert len(found) > 30, "docs/metrics.md: the metrics table was not found"
    return found


def used_metrics(expression: str) -> set[str]:
    names = set()
    for name in METRIC_NAME.findall(expression):
        for suffix in HISTOGRAM_SUFFIXES:
            base = name.removesuffix(suffix)
            if base != name and documented().get(base) == "histogram":
                name = base
        names.add(name)
    return names


def rule_expressions() -> list[tuple[str, str]]:
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [(rule["alert"], rule["expr"]) for group in document["groups"] for rule in group["rules"]]


def dashboard_expressions() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    found = [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            found.append((f"variable {variable['name']}", query["query"]))
    return found


@pytest.mark.skipif(PROMTOOL is None, reason="needs promtool: apt-get install --no-install-recommends prometheus "
                                             "(scripts/install-deps.sh)")
def test_promtool_accepts_the_alert_rules() -> None:
    assert PROMTOOL is not None
    result = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rule_expressions())} rules found" in result.stdout


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_used_is_documented(source: str) -> None:
    expressions = rule_expressions() if source == "rules" else dashboard_expressions()
    assert expressions
    for where, expression in expressions:
        names = used_metrics(expression)
        assert names, f"{source}, {where}: no metric found in {expression!r}"
        unknown = names - set(documented()) - PROMETHEUS_OWN
        assert not unknown, f"{source}, {where}: {sorted(unknown)} not in docs/metrics.md"


def test_the_metric_finder_sees_what_promql_names() -> None:
    assert used_metrics('histogram_quantile(0.9, sum by (le) (rate(mqttfed_hop_rtt_seconds_bucket[5m])))') == {
        "mqttfed_hop_rtt_seconds"}
    assert used_metrics('process_open_fds{job="x"} / process_max_fds > 0.8') == {"process_open_fds",
                                                                                 "process_max_fds"}
    assert used_metrics('up{job="mqtt-federation"} == 0') == {"up"}
    assert used_metrics("mqttfed_nonexistent_total") == {"mqttfed_nonexistent_total"}


def test_the_dashboard_is_importable_and_uses_its_data_source_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["uid"] == "mqtt-federation" and dashboard["title"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and all(target["datasource"]["uid"] == "${datasource}" for target in panel["targets"])
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24, panel["title"]


def test_docs_list_every_alert() -> None:
    text = METRICS_DOC.read_text(encoding="utf-8")
    for alert, _expression in rule_expressions():
        assert f"`{alert}`" in text, f"docs/metrics.md does not describe {alert}"
