"""Randomised fault schedules on small federations, run on the simulator with the real Node.

Each case is one seed. A seeded generator builds a topology of 4-10 nodes (a
random spanning tree plus random extra links), random subscriptions and
publications, and a fault phase of random cuts (one- and two-way), heals,
kills, restarts and loss. At FAULT_END every link heals, loss stops and dead
nodes restart; after `settle` quiet seconds a burst of publications must
reach every matching subscriber broker exactly once, no publication may
loop at any time, and every component must agree on one management core
(its lowest id) and one core per subscribed filter at the end.

Replay a failing seed with its events file:

    python tests/sim/test_sim_random_faults.py 17 [events.jsonl]
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from federation.sim.random_faults import Timeline, random_scenario
from federation.sim.runner import Simulation

DEFAULT_CASES = 200
SLOW_CASES = 2000


def run_case(seed: int, events_path: str | None = None, **shape: Any) -> tuple[Simulation, dict[str, Any]]:
    scenario = random_scenario(seed, **shape)
    simulation = Simulation(scenario, seed=seed, events_path=events_path)
    report = simulation.run()
    return simulation, report


def check_case(seed: int, **shape: Any) -> None:
    simulation, report = run_case(seed, **shape)
    replay = f"replay: python tests/sim/test_sim_random_faults.py {seed}"
    quiet_from = Timeline().quiet_from
    quiet = [record for record in simulation.publications if record.sent_at >= quiet_from]
    violations = report["invariants"]["violations"]
    assert simulation.aborted is None, f"seed {seed} ({replay}):\n" + "\n".join(violations)
    assert quiet, f"seed {seed}: no publication in the quiet phase ({replay})"
    assert all(record.in_bound for record in quiet), f"seed {seed}: quiet-phase publication out of bound ({replay})"
    quiet_ids = {record.publication for record in quiet}
    received: dict[tuple[str, str], int] = {}
    for delivery in simulation.deliveries:
        if delivery.publication in quiet_ids:
            key = (delivery.publication, delivery.node)
            received[key] = received.get(key, 0) + 1
    problems = [f"{record.publication} {record.topic!r} from {record.origin}: {name} got "
                f"{received.get((record.publication, name), 0)} copies"
                for record in quiet for name in sorted(record.expected)
                if received.get((record.publication, name), 0) != 1]
    problems += [f"{publication} delivered {copies} times to {name}" for (publication, name), copies
                 in sorted(received.items()) if copies > 1]
    problems += violations
    assert not problems, f"seed {seed} ({replay}):\n" + "\n".join(problems)


@pytest.mark.parametrize("seed", range(DEFAULT_CASES), ids=lambda seed: f"seed{seed}")
def test_random_fault_schedule(seed: int) -> None:
    check_case(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(DEFAULT_CASES, DEFAULT_CASES + SLOW_CASES), ids=lambda seed: f"seed{seed}")
def test_random_fault_schedule_slow(seed: int) -> None:
    check_case(seed, min_nodes=4, max_nodes=20)


def test_generator_is_deterministic() -> None:
    assert random_scenario(5) == random_scenario(5)
    assert random_scenario(5) != random_scenario(6)


def test_same_seed_same_run() -> None:
    _, first = run_case(3)
    _, second = run_case(3)
    first.pop("wall_seconds")
    second.pop("wall_seconds")
    assert first == second


if __name__ == "__main__":
    case_seed = int(sys.argv[1])
    path = sys.argv[2] if len(sys.argv) > 2 else f"random-faults-{case_seed}.jsonl"
    _, case_report = run_case(case_seed, events_path=path)
    print(json.dumps(case_report, indent=2))
    print(f"events: {path}", file=sys.stderr)
