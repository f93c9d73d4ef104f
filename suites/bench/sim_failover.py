"""`python -m suites.bench.sim_failover`: what a mesh member's failing data parent costs, on the simulator.

Theory of operation
-------------------
Issue 23 asked for fewer copies per publication without losing the failover
that `redundancy` parents buy. This bench measures both sides of that trade
on the same overlays, with the two ways a mesh can carry publications:

- `data_parents: 2` (the design before issue 23): publications cross every
  link to every parent, so a member with two parents gets a copy from each;
- `data_parents: 1` (issue 23): publications cross a tree of first parents;
  the second parent is standby (`ts` with the standby flag) and is promoted
  when the first goes down (docs/protocol.md rule 6).

Each trial builds a random overlay (the `sim_scale` generator), subscribes
`--subscribers` nodes to `fo/#`, and once the mesh is built picks a subscriber
S that has two parents, whose first (data) parent P is neither the core nor
the publisher, a random other node. The publisher sends `--rate`
publications a second, QoS 0 and QoS 1 in turn; `--before` seconds in, the
failure happens: the link S-P is cut (`link`) or P crashes (`node`); the
stream goes on for `--after` seconds, then the run waits `--drain` seconds for
QoS 1 retransmissions. The same trial (overlay, seeds, S, P, failure) runs
once per design.

Measured per trial, over every subscriber other than the publisher that is
alive and connected to it after the failure:

- copies per publication before the failure (`tm` datagrams sent);
- QoS 0 after the failure: expected (publication, subscriber) pairs lost, and
  the outage: from the failure to the publication time of the last one lost
  (0 when none was);
- QoS 1 after the failure: pairs lost (delivered by the end of the drain, or
  not), duplicates, and the longest delivery latency (delivery minus
  publication time): how long the failover kept a publication waiting.

Everything is virtual time, deterministic for a seed; the wall-clock time is
printed only to know what a run costs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

from federation.protocol.events import publication_text
from federation.protocol.settings import Settings
from federation.scenario.model import Cut, Kill, NodeSpec, Publish, Scenario, Subscribe
from federation.sim.collector import collector_paused
from federation.sim.runner import Simulation
from suites.bench.sim_scale import adjacency, build_overlay, name_of

FILTER = "fo/#"
DESIGNS = {"every parent link (data_parents 2)": 2, "tree + standby (data_parents 1)": 1}


@dataclass(frozen=True)
class FailoverOptions:
    nodes: int = 100
    degree: float = 4.0
    seed: int = 1
    trials: int = 10
    subscribers: int = 8
    rate: float = 20.0
    """publications a second, QoS 0 and QoS 1 in turn"""
    before: float = 2.0
    after: float = 8.0
    drain: float = 15.0
    failure: str = "link"
    """`link`: the subscriber's data-parent link is cut; `node`: its data parent crashes"""


@dataclass(frozen=True)
class Target:
    subscriber: int
    parent: int
    publisher: int


class Trial:
    """One overlay, one failure, run once per design."""

    def __init__(self, options: FailoverOptions, number: int) -> None:
        self.options = options
        rng = random.Random(f"failover:{options.seed}:{number}")
        self.seed = options.seed * 1000 + number
        self.edges = build_overlay(options.nodes, options.degree, rng)
        self.table = adjacency(options.nodes, self.edges)
        self.subscribers = sorted(rng.sample(range(options.nodes), min(options.subscribers, options.nodes)))
        self.rng = rng

    def simulation(self, data_parents: int) -> Simulation:
        scenario = Scenario(
            name=f"failover-{self.options.nodes}", source="suites.bench.sim_failover",
            nodes=tuple(NodeSpec(name_of(index)) for index in range(self.options.nodes)),
            links=tuple((name_of(a), name_of(b)) for a, b in self.edges),
            settings=replace(Settings(), data_parents=data_parents), duration=float("inf"), events=(), settle=5.0)
        simulation = Simulation(scenario, seed=self.seed)
        simulation.start()
        for index in self.subscribers:
            simulation.apply(Subscribe(0.0, name_of(index), f"client-{index}", FILTER, 1))
        simulation.run_until(10.0)  # built, and quiet
        return simulation

    def pick(self, simulation: Simulation) -> Target | None:
        """A subscriber with two parents whose data parent is neither the core nor the publisher."""
        candidates = []
        for index in self.subscribers:
            node = simulation.network.host(name_of(index)).node
            assert node is not None
            state = node.mesh.topics.get(FILTER)
            if state is None or state.core is None or len(state.parents) < 2:
                continue
            parent = simulation.network.index_of_address.get(state.parents[0])
            if parent is None or state.parents[0] == state.core.address:
                continue
            candidates.append((index, parent))
        if not candidates:
            return None
        subscriber, parent = self.rng.choice(candidates)
        others = [i for i in range(self.options.nodes) if i not in (subscriber, parent)]
        return Target(subscriber, parent, self.rng.choice(others))

    def run(self, data_parents: int, target: Target) -> dict[str, Any]:
        options = self.options
        simulation = self.simulation(data_parents)
        gap = 1.0 / options.rate
        start = simulation.now
        failed_at = start + options.before
        end = failed_at + options.after
        first = len(simulation.publications)
        copies_before: dict[str, int] = {}
        number = 0
        failed = False
        while simulation.now + gap <= end + 1e-9 or number == 0:
            if not failed and simulation.now >= failed_at - 1e-9:
                copies_before = {text: count for text, count in self._copies(simulation).items()}
                self._fail(simulation, target)
                failed = True
            qos = number % 2
            simulation.publish(Publish(simulation.now, name_of(target.publisher), f"fo/q{qos}", qos=qos), 0)
            number += 1
            simulation.run_until(simulation.now + gap)
        simulation.run_until(end + options.drain)
        records = simulation.publications[first:]
        by_text = {record.publication: record for record in records}
        receivers = self._receivers(target)
        delivered: dict[tuple[str, str], list[float]] = {}
        for delivery in simulation.deliveries:
            if delivery.publication in by_text:
                delivered.setdefault((delivery.publication, delivery.node), []).append(delivery.at)
        before = [r for r in records if r.sent_at < failed_at]
        after = [r for r in records if r.sent_at >= failed_at]
        result: dict[str, Any] = {
            "copies_per_publication_before": round(sum(copies_before.get(r.publication, 0) for r in before)
                                                   / max(1, len(before)), 3),
        }
        for qos in (0, 1):
            chosen = [r for r in after if r.topic == f"fo/q{qos}"]
            expected = [(r, name) for r in chosen for name in receivers]
            lost = [(r, name) for r, name in expected if (r.publication, name) not in delivered]
            duplicates = sum(len(delivered.get((r.publication, name), [])) - 1 for r, name in expected
                             if (r.publication, name) in delivered)
            latencies = [min(delivered[(r.publication, name)]) - r.sent_at for r, name in expected
                         if (r.publication, name) in delivered]
            result[f"qos{qos}"] = {
                "expected": len(expected), "lost": len(lost), "duplicates": duplicates,
                "outage_seconds": round(max((r.sent_at - failed_at for r, _ in lost), default=0.0), 3),
                "max_latency_seconds": round(max(latencies, default=0.0), 3),
                "subscribers_losing": len({name for _, name in lost}),
            }
        result["violations"] = len(simulation.violations)
        return result

    def _copies(self, simulation: Simulation) -> dict[str, int]:
        return {publication_text(publication): count
                for publication, count in simulation.network.traffic.copies.items()}

    def _fail(self, simulation: Simulation, target: Target) -> None:
        if self.options.failure == "node":
            simulation.apply(Kill(simulation.now, name_of(target.parent)))
        else:
            simulation.apply(Cut(simulation.now, name_of(target.subscriber), name_of(target.parent)))

    def _receivers(self, target: Target) -> list[str]:
        """Subscribers other than the publisher, alive and connected to it after the failure."""
        dead = {target.parent} if self.options.failure == "node" else set()
        cut = {(target.subscriber, target.parent), (target.parent, target.subscriber)} \
            if self.options.failure == "link" else set()
        seen = {target.publisher}
        stack = [target.publisher]
        while stack:
            current = stack.pop()
            for other in self.table[current]:
                if other not in seen and other not in dead and (current, other) not in cut:
                    seen.add(other)
                    stack.append(other)
        return [name_of(index) for index in self.subscribers if index in seen and index != target.publisher]


def run(options: FailoverOptions, progress: Any = None) -> dict[str, Any]:
    started, cpu_started = time.perf_counter(), time.process_time()
    results: dict[str, list[dict[str, Any]]] = {design: [] for design in DESIGNS}
    targets: list[dict[str, Any]] = []
    number = 0
    with collector_paused(collect=False):
        while len(targets) < options.trials and number < 10 * options.trials:
            trial = Trial(options, number)
            number += 1
            target = trial.pick(trial.simulation(DESIGNS[next(iter(DESIGNS))]))
            if target is None:
                continue
            targets.append({"trial": number - 1, "subscriber": name_of(target.subscriber),
                            "parent": name_of(target.parent), "publisher": name_of(target.publisher)})
            for design, data_parents in DESIGNS.items():
                results[design].append(trial.run(data_parents, target))
            if progress:
                progress(f"trial {number - 1}: {targets[-1]} done (wall {time.perf_counter() - started:.1f} s)")
    summary: dict[str, Any] = {}
    for design, runs in results.items():
        summary[design] = {
            "copies_per_publication_before": _stats([r["copies_per_publication_before"] for r in runs]),
            **{f"qos{qos}_{key}": _stats([r[f"qos{qos}"][key] for r in runs])
               for qos in (0, 1) for key in ("lost", "outage_seconds", "max_latency_seconds", "duplicates")},
            "qos0_lost_total": sum(r["qos0"]["lost"] for r in runs),
            "qos1_lost_total": sum(r["qos1"]["lost"] for r in runs),
            "expected_pairs_per_qos": sum(r["qos0"]["expected"] for r in runs),
            "violations": sum(r["violations"] for r in runs),
        }
    return {"options": options.__dict__, "trials": targets, "runs": results, "summary": summary,
            "wall_seconds": round(time.perf_counter() - started, 3),
            "cpu_seconds": round(time.process_time() - cpu_started, 3)}


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"mean": round(statistics.fmean(values), 3), "median": round(statistics.median(values), 3),
            "max": round(max(values), 3)}


def format_table(results: dict[str, Any]) -> str:
    lines = [f"{len(results['trials'])} trials, failure: {results['options']['failure']}, "
             f"{results['options']['nodes']} nodes, {results['options']['rate']} publications/s (QoS 0 and 1 in turn)"]
    rows = [("copies / publication (mean)", lambda s: s["copies_per_publication_before"]["mean"]),
            ("QoS 0 pairs lost after the failure (total)", lambda s: s["qos0_lost_total"]),
            ("QoS 0 outage s: mean / max", lambda s: f"{s['qos0_outage_seconds']['mean']} / "
                                                     f"{s['qos0_outage_seconds']['max']}"),
            ("QoS 1 pairs lost (total)", lambda s: s["qos1_lost_total"]),
            ("QoS 1 longest latency s: mean / max", lambda s: f"{s['qos1_max_latency_seconds']['mean']} / "
                                                              f"{s['qos1_max_latency_seconds']['max']}"),
            ("QoS 1 duplicates (max per trial)", lambda s: s["qos1_duplicates"]["max"]),
            ("expected pairs per QoS", lambda s: s["expected_pairs_per_qos"]),
            ("invariant violations", lambda s: s["violations"])]
    designs = list(results["summary"])
    width = max(len(label) for label, _ in rows)
    lines.append(" " * width + "  " + "  |  ".join(designs))
    for label, value in rows:
        lines.append(label.ljust(width) + "  " + "  |  ".join(str(value(results["summary"][d])).ljust(len(d))
                                                             for d in designs))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suites.bench.sim_failover",
                                     description=__doc__.split("\n\n")[0])
    defaults = FailoverOptions()
    parser.add_argument("--nodes", type=int, default=defaults.nodes)
    parser.add_argument("--degree", type=float, default=defaults.degree)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--trials", type=int, default=defaults.trials)
    parser.add_argument("--subscribers", type=int, default=defaults.subscribers)
    parser.add_argument("--rate", type=float, default=defaults.rate, help="publications a second (QoS 0, 1 in turn)")
    parser.add_argument("--failure", choices=("link", "node"), default=defaults.failure)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    options = FailoverOptions(nodes=args.nodes, degree=args.degree, seed=args.seed, trials=args.trials,
                              subscribers=args.subscribers, rate=args.rate, failure=args.failure)
    results = run(options, None if args.quiet else lambda text: print(text, file=sys.stderr, flush=True))
    print(json.dumps(results, indent=2) if args.json else format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
