"""The network-namespace backend: scenarios on real brokers and wrappers, one namespace per node.

    python -m federation.scenario run FILE --backend netns --report OUT.json --events DIR

`run_scenario` is what `federation.scenario.cli` calls. The backend-neutral
work (timeline, ground truth, convergence, report) is
`federation.harness.driver`; this package is the platform it drives
(`platform.NetnsPlatform`: namespaces, point-to-point veth links, nftables
faults, processes) and the names and leftovers of runs (`system`).
`python -m federation.netns cleanup` removes what crashed runs left behind.
Needs root; docs/partitions.md has the details and the measured figures.
"""

from __future__ import annotations

from typing import Any

from federation.harness.driver import run_on_platform
from federation.netns.platform import NetnsPlatform
from federation.scenario.model import Scenario

__all__ = ["NetnsPlatform", "run_scenario"]


def run_scenario(scenario: Scenario, *, seed: int, events_path: str | None = None) -> dict[str, Any]:
    """Run `scenario` on network namespaces; the report dict (same schema as the simulator's).

    `seed` draws the ids of nodes without an `id` (the wall clock decides the
    rest: a real run does not replay exactly). `events_path` is a directory:
    run.jsonl, nodes/<name>/ (event log, broker and wrapper logs, configs),
    clients/ (what every subscriber printed). Raises ScenarioError (CLI exit
    2) for a bad scenario and when the run cannot happen here (not root,
    tools missing, too many nodes), before anything is created.
    """
    return run_on_platform(scenario, NetnsPlatform(), seed=seed, events_path=events_path)
