"""Randomised fault schedules on small federations, run on the simulator with the real Node.

Each case is one seed. A seeded generator builds a topology of 4-10 nodes (a
random spanning tree plus random extra links), random subscriptions and
publications, and a fault phase of random cuts (one- and two-way), heals,
kills, restarts and loss. At FAULT_END every link heals, loss stops and dead
nodes restart; after `settle` quiet seconds a burst of publications must
reach every matching subscriber broker exactly once, no publication may
loop at any time, and every component must agree on one management core
(its lowest id) and one core per subscribed filter at the end.

About half the publications are QoS 1, during the faults too. Across the
whole run (faults included) no QoS 1 publication may be injected twice at
one node (restarted nodes get their journal back, as the daemon's), every
node must inject one origin's QoS 1 publications on one topic in the order
they were made, and by the end nothing may be left in custody anywhere:
every QoS 1 publication was delivered everywhere its mesh reached, or ended
with a reported reason (docs/protocol.md rules 7a, 7d). Which subscribers
a publication made during a partition must reach has no oracle here (a
subscriber cut off with its own core, or whose wrapper was dead, is not in
the mesh the publication crossed); tests/sim/test_custody_sim.py checks
delivery under the issue's faults one by one.

Replay a failing seed with its events file:

    python tests/sim/test_sim_random_faults.py 17 [events.jsonl]
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

import pytest

from federation.protocol.events import publication_text
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
    problems += reliable_problems(simulation)
    problems += violations
    assert not problems, f"seed {seed} ({replay}):\n" + "\n".join(problems)


def reliable_problems(simulation: Simulation) -> list[str]:
    """QoS 1 across the whole run: injected once per node, in order per (origin, topic), and custody settled."""
    qos1 = {publication_text(publication) for publication in simulation.retried}
    topics = {record.publication: record.topic for record in simulation.publications}
    problems = []
    injected: Counter[tuple[str, str]] = Counter()
    last: dict[tuple[str, str, str], tuple[int, int]] = {}
    for delivery in simulation.deliveries:
        if delivery.publication not in qos1:
            continue
        injected[(delivery.publication, delivery.node)] += 1
        origin, epoch, seq = delivery.publication.rsplit("/", 2)
        position = (int(epoch), int(seq))
        key = (delivery.node, origin, topics[delivery.publication])
        if key in last and position < last[key]:
            problems.append(f"QoS 1 {delivery.publication} injected at {delivery.node} after {last[key]} of its "
                            f"origin on {key[2]!r}")
        last[key] = max(last.get(key, position), position)
    problems += [f"QoS 1 {publication} injected {count} times at {node}"
                 for (publication, node), count in sorted(injected.items()) if count > 1]
    for host in simulation.network.hosts:
        node = host.node
        if node is not None and (node.custody.entries or node.mesh.held_reliable_count):
            problems.append(f"{host.name} still holds QoS 1 publications in custody at the end: "
                            f"{sorted(publication_text(p) for p, _ in node.custody.entries)[:5]}")
    return problems


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
