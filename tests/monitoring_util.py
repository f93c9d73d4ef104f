"""The shipped dashboard and alert rules as expressions, and the series selectors in them (PromQL, the part used).

    rule_expressions()        [(alert, expr)] of packaging/prometheus/mqtt-federation-rules.yml
    dashboard_expressions()   [(panel title or variable, expr)] of packaging/grafana/mqtt-federation.json
    selectors(expr)           [Selector(metric, matchers)]: every `metric{label="value", ...}` in it

tests/packaging/test_monitoring.py checks them offline; tests/real/test_monitoring_real.py asks a real
Prometheus, scraping live wrappers, whether each selector finds series.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "packaging" / "prometheus" / "mqtt-federation-rules.yml"
DASHBOARD = REPO / "packaging" / "grafana" / "mqtt-federation.json"
JOB = "mqtt-federation"
"""the scrape job the rules and the dashboard select (docs/metrics.md)"""
DASHBOARD_VARIABLES = {"$instance": ".*", "$job": JOB, "$__rate_interval": "1m"}
"""what Grafana puts in the dashboard's variables: every wrapper, the shipped job, a rate window"""
METRIC = re.compile(r"(?:mqttfed|process)_[a-z0-9_]+|up")
MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
PLAIN_ALTERNATIVES = re.compile(r"[a-zA-Z0-9_:.-]+(?:\|[a-zA-Z0-9_:.-]+)*")
"""a regex matcher that only lists label values (`refused|tls`): each value must exist"""


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


def with_variables(expression: str) -> str:
    """A dashboard expression as Grafana sends it (the longest variable names first)."""
    for name in sorted(DASHBOARD_VARIABLES, key=len, reverse=True):
        expression = expression.replace(name, DASHBOARD_VARIABLES[name])
    return expression


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[tuple[str, str, str], ...]
    """(label, operator, value) as written"""

    def text(self, matchers: tuple[tuple[str, str, str], ...] | None = None) -> str:
        chosen = self.matchers if matchers is None else matchers
        inside = ", ".join(f'{label}{operator}"{value}"' for label, operator, value in chosen)
        return f"{self.metric}{{{inside}}}" if chosen else self.metric

    def each_value(self) -> list[str]:
        """The selector once per label value it names: a regex matcher that lists values (`a|b`) becomes one
        `label="a"` selector per value (each must find series); other matchers stay as written."""
        variants: list[tuple[tuple[str, str, str], ...]] = [()]
        for label, operator, value in self.matchers:
            if operator == "=~" and PLAIN_ALTERNATIVES.fullmatch(value):
                options = [(label, "=", alternative) for alternative in value.split("|")]
            else:
                options = [(label, operator, value)]
            variants = [(*variant, option) for variant in variants for option in options]
        return [self.text(variant) for variant in variants]


def selectors(expression: str) -> list[Selector]:
    """Every series selector of a metric of ours (or `up`) in a PromQL expression, outside string literals."""
    found: list[Selector] = []
    position = 0
    while position < len(expression):
        char = expression[position]
        if char == '"':
            position = _string_end(expression, position)
            continue
        if char.isalpha() or char == "_":
            start = position
            while position < len(expression) and (expression[position].isalnum() or expression[position] in "_:"):
                position += 1
            name = expression[start:position]
            after = position
            while after < len(expression) and expression[after] == " ":
                after += 1
            if not METRIC.fullmatch(name) or (after < len(expression) and expression[after] == "("):
                continue  # a function, a keyword, a label name: no series of ours
            matchers: list[tuple[str, str, str]] = []
            if after < len(expression) and expression[after] == "{":
                end = after + 1
                while expression[end] != "}":
                    match = MATCHER.match(expression, end)
                    assert match is not None, f"cannot read the matchers of {expression[start:]!r}"
                    matchers.append((match.group(1), match.group(2), match.group(3)))
                    end = match.end()
                position = end + 1
            found.append(Selector(name, tuple(matchers)))
            continue
        position += 1
    return found


def _string_end(text: str, start: int) -> int:
    position = start + 1
    while text[position] != '"':
        position += 2 if text[position] == "\\" else 1
    return position + 1
