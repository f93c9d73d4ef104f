"""The shipped Grafana dashboard and Prometheus alert rules (packaging/grafana, packaging/prometheus): the rules pass
`promtool check rules`, every metric either of them uses is in docs/metrics.md's table (which
tests/real/test_metrics_real.py checks against what a wrapper serves), the label values they name are the
wrapper's, and the publication-loss alert covers every reason that loses a publication. A real Prometheus
scraping live wrappers checks every selector in tests/real/test_monitoring_real.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from functools import cache

import pytest

from federation.daemon.metrics import DROP_REASONS, INJECTION_RESULTS

from monitoring_util import DASHBOARD, REPO, RULES, dashboard_expressions, rule_expressions, selectors

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


LOSS_ALERT = "MqttFedPublicationsLost"
NOT_A_LOSS = {"retained_stale"}
"""reported as publication_dropped, yet nothing is lost: the broker keeps the newer retained value"""
LOSSES_COUNTED_ONLY = {"qos0_late", "max_hops", "mesh_copy_neighbour_down"}
"""counted only (no publication_dropped event), yet a publication or a copy of it does not arrive"""


def named_values(expressions: list[tuple[str, str]], metric: str, label: str) -> dict[str, set[str]]:
    """where -> the values of `label` that the selectors of `metric` name (a `a|b` regex names a and b)."""
    found: dict[str, set[str]] = {}
    for where, expression in expressions:
        for selector in selectors(expression):
            if selector.metric != metric:
                continue
            for name, operator, value in selector.matchers:
                if name == label and operator in ("=", "=~"):
                    assert operator == "=" or re.fullmatch(r"[a-z0-9_]+(\|[a-z0-9_]+)*", value), \
                        f"{where}: {label}=~{value!r} is a pattern; name the values, so a test can check each"
                    found.setdefault(where, set()).update(value.split("|"))
    return found


def test_every_label_value_named_is_one_the_wrapper_exports() -> None:
    expressions = rule_expressions() + dashboard_expressions()
    for where, reasons in named_values(expressions, "mqttfed_drops_total", "reason").items():
        assert reasons <= set(DROP_REASONS), f"{where}: {sorted(reasons - set(DROP_REASONS))} is never exported"
    results = named_values(expressions, "mqttfed_injections_total", "result")
    assert results, "the dashboard no longer shows injections"
    for where, values in results.items():
        assert values <= set(INJECTION_RESULTS), f"{where}: {sorted(values - set(INJECTION_RESULTS))} never exported"


def documented_losses() -> set[str]:
    """drop reasons docs/drops.md reports as `publication_dropped` (a publication that will not arrive)"""
    reasons = set()
    for line in (REPO / "docs" / "drops.md").read_text(encoding="utf-8").splitlines():
        match = re.match(r"\| `([a-z0-9_]+)` \| [a-z]+ \| .* \| `publication_dropped`", line)
        if match:
            reasons.add(match.group(1))
    assert len(reasons) > 10, "docs/drops.md: the table was not found"
    return reasons


def test_the_loss_alert_covers_every_reason_that_loses_a_publication() -> None:
    (alerted,) = named_values([item for item in rule_expressions() if item[0] == LOSS_ALERT], "mqttfed_drops_total",
                              "reason").values()
    wanted = (documented_losses() - NOT_A_LOSS) | LOSSES_COUNTED_ONLY
    assert wanted <= alerted, f"{LOSS_ALERT} misses {sorted(wanted - alerted)}"
    # the five issue 40 found missing
    assert {"no_subscriber_after_broker_restart", "spool_expired", "spool_age", "message_expired", "qos0_late"} <= \
        alerted
    assert not NOT_A_LOSS & alerted
