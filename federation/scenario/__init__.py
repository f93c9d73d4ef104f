"""Scenarios: backend-neutral scripts of subscriptions, publications and faults.

`model` holds the dataclasses every backend executes, `loader` turns a YAML
file into them (or a `ScenarioError` naming file, entry and fix), and `cli`
(`python -m federation.scenario`) checks files and runs them on a backend.
"""

from __future__ import annotations

from federation.scenario.loader import ScenarioError, load_scenario, parse_scenario
from federation.scenario.model import (
    Cut,
    Disconnect,
    Heal,
    Kill,
    LinkDefaults,
    Loss,
    NodeSpec,
    Publish,
    Restart,
    Scenario,
    ScenarioEvent,
    Subscribe,
    Unsubscribe,
)

__all__ = [
    "Cut",
    "Disconnect",
    "Heal",
    "Kill",
    "LinkDefaults",
    "Loss",
    "NodeSpec",
    "Publish",
    "Restart",
    "Scenario",
    "ScenarioError",
    "ScenarioEvent",
    "Subscribe",
    "Unsubscribe",
    "load_scenario",
    "parse_scenario",
]
