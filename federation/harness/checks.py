"""Checks made before anything real is created, and the plan of every node.

Theory of operation: a real run costs seconds to set up and must never half
start, so everything that can be known from the scenario alone is checked
first. `load_scenario` already rejects bad files; `check_scenario` repeats
the checks a real backend depends on for Scenario objects built in Python.
`node_plans` fixes each node's id (drawn from the run's seed where the
scenario gives none), neighbours and protocol settings.
"""

from __future__ import annotations

import random

from federation.harness.platform import NodePlan
from federation.scenario.loader import ScenarioError
from federation.scenario.model import (
    Cut,
    Disconnect,
    Heal,
    Kill,
    Loss,
    Publish,
    Restart,
    Scenario,
    ScenarioEvent,
    Subscribe,
    Unsubscribe,
)

VID_LIMIT = 2**31
"""virtual ids drawn for nodes without an `id` are below this (the wrapper's --id range)"""


def check_scenario(scenario: Scenario) -> None:
    """ScenarioError for what a real backend cannot do and the loader may not have caught.

    `load_scenario` already rejects these in files; a Scenario built in Python
    gets the same checks here, before anything is created.
    """
    names = scenario.node_names()
    known = set(names)
    where = scenario.source
    if len(known) != len(names):
        raise ScenarioError(f"{where}: node names must be unique, got {', '.join(names)}")
    listing = ", ".join(names)
    linked: set[frozenset[str]] = set()
    for a, b in scenario.links:
        for end in (a, b):
            if end not in known:
                raise ScenarioError(f"{where}: links: unknown node {end!r}; nodes are: {listing}")
        if a == b:
            raise ScenarioError(f"{where}: links: {a}-{b} joins a node to itself")
        linked.add(frozenset((a, b)))
    links_text = ", ".join(f"{a}-{b}" for a, b in scenario.links) or "none"
    for event in scenario.events:
        kind = type(event).__name__.lower()
        label = f"{where}: event at {event.at:g}s ({kind})"
        for node in _event_nodes(event):
            if node not in known:
                raise ScenarioError(f"{label}: unknown node {node!r}; nodes are: {listing}")
        pair = _event_link(event)
        if pair is not None and frozenset(pair) not in linked:
            raise ScenarioError(f"{label}: {pair[0]} and {pair[1]} are not neighbours; links are: {links_text}")
        if event.at > scenario.duration:
            raise ScenarioError(f"{label}: at {event.at:g}s is after the duration {scenario.duration:g}s")


def _event_nodes(event: ScenarioEvent) -> list[str]:
    if isinstance(event, (Subscribe, Unsubscribe, Disconnect, Publish, Kill, Restart)):
        return [event.node]
    if isinstance(event, (Cut, Heal)):
        return [event.a, event.b]
    if isinstance(event, Loss) and event.link is not None:
        return list(event.link)
    return []


def _event_link(event: ScenarioEvent) -> tuple[str, str] | None:
    if isinstance(event, (Cut, Heal)):
        return (event.a, event.b)
    if isinstance(event, Loss):
        return event.link
    return None


def node_plans(scenario: Scenario, seed: int) -> list[NodePlan]:
    """Every node's plan: vids from the scenario, or drawn from the run's seeded generator."""
    generator = random.Random(seed)
    plans = []
    for index, spec in enumerate(scenario.nodes):
        vid = spec.vid if spec.vid is not None else generator.randrange(VID_LIMIT)
        settings = scenario.settings_for(spec.name)
        values = {name: getattr(settings, name) for name in sorted(settings.__dataclass_fields__)}
        plans.append(NodePlan(spec.name, index, vid, tuple(scenario.neighbours_of(spec.name)), values))
    return plans
