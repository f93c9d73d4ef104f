"""`python -m suites.bench.sim_modes`: the federation modes side by side on one simulated workload.

Theory of operation
-------------------
One seeded random overlay (`suites.bench.sim_scale.build_overlay`) with many
topics: each filter `mb/<k>/#` has subscribers on a few random nodes, and
publications on random topics come from random nodes. The same workload
runs once per mode, each time from the same seed:

* `interest`: the default, cores elected (lowest-id subscriber), meshes of
  interested brokers only;
* `full`: `replication: full`, one tree reaching every broker (MQTT-ST);
* `hash`: `core_placement: hash`, cores placed by rendezvous hashing.

After the subscriptions have converged, the publications are made and the
bench reports, per mode: `tm` copies per publication; the load per broker,
as `tm` packets each broker received (publications it handled) during the
publication window, with its mean, maximum and the busiest brokers' share;
how many cores the busiest broker holds (of the meshes that carried the
data: in `full` mode the replicated tree's, whose root is the one core), and
the publications each core handled as core (a mesh spreads a publication to
all its members, the core included); and
the deliveries (expected, delivered, lost, duplicated), which must be clean
in every mode.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from federation.protocol.events import publication_text
from federation.protocol.settings import Settings
from federation.protocol.wire import DATA_TYPES
from federation.scenario.model import NodeSpec, Publish, Scenario, Subscribe
from federation.scenario.report import classify
from federation.sim.network import default_max_in_flight
from federation.sim.runner import Simulation
from suites.bench.sim_scale import build_overlay

MODES: dict[str, dict[str, Any]] = {
    "interest": {},
    "full": {"replication": "full"},
    "hash": {"core_placement": "hash"},
}


@dataclass(frozen=True)
class ModesBenchOptions:
    nodes: int = 100
    degree: float = 4.0
    seed: int = 1
    topics: int = 200
    subscribers: int = 3
    """subscriber nodes per topic filter"""
    publications: int = 400
    gap: float = 0.02
    """virtual seconds between publications"""
    limit: float = 60.0
    """virtual seconds allowed for the subscriptions to converge"""


def name_of(index: int) -> str:
    return f"m{index:04d}"


class Workload:
    """The overlay, the subscriptions and the publication plan, the same for every mode."""

    def __init__(self, options: ModesBenchOptions) -> None:
        rng = random.Random(f"modes-bench:{options.seed}")
        self.edges = build_overlay(options.nodes, options.degree, rng)
        self.subscribers = {f"mb/{k}/#": sorted(rng.sample(range(options.nodes), options.subscribers))
                            for k in range(options.topics)}
        self.plan = [(rng.randrange(options.nodes), f"mb/{rng.randrange(options.topics)}/x")
                     for _ in range(options.publications)]


def run_mode(mode: str, workload: Workload, options: ModesBenchOptions) -> dict[str, Any]:
    started = time.perf_counter()
    scenario = Scenario(
        name=f"modes-{mode}", source="suites.bench.sim_modes",
        nodes=tuple(NodeSpec(name_of(index), vid=index) for index in range(options.nodes)),
        links=tuple((name_of(a), name_of(b)) for a, b in workload.edges),
        settings=Settings.from_mapping(MODES[mode]), duration=float("inf"), events=(), settle=5.0)
    in_flight = max(default_max_in_flight(options.nodes), 2 * options.nodes * len(workload.edges))
    simulation = Simulation(scenario, seed=options.seed, max_in_flight=in_flight)
    simulation.start()
    simulation.run_until(1.0)
    for filter_, chosen in sorted(workload.subscribers.items()):
        for index in chosen:
            simulation.apply(Subscribe(simulation.now, name_of(index), f"c{index}", filter_))
    simulation.tracker.begin_phase("subscriptions", simulation.now)
    phase = simulation.tracker.phases[-1]
    simulation.network.run_while(lambda: phase.settled_at is None, simulation.now + options.limit)
    converged = None if phase.settled_at is None else round(phase.settled_at - phase.at, 3)
    simulation.run_until(simulation.now + 6.0)  # past the settle bound: every publication is in bound

    nodes = [host.node for host in simulation.network.hosts]
    received_before = [node.received_by_type["tm"] if node else 0 for node in nodes]
    traffic = simulation.network.traffic
    control_before = sum(count for kind, count in traffic.packets_by_type.items() if kind not in DATA_TYPES)
    window_start = simulation.now
    first = len(simulation.publications)
    for number, (publisher, topic) in enumerate(workload.plan):
        simulation.run_until(simulation.now + (options.gap if number else 0.0))
        simulation.publish(Publish(simulation.now, name_of(publisher), topic), 0)
    simulation.run_until(simulation.now + 3.0)
    window = simulation.now - window_start
    control = sum(count for kind, count in traffic.packets_by_type.items() if kind not in DATA_TYPES) - control_before

    records = simulation.publications[first:]
    wanted = {record.publication for record in records}
    copies = [count for publication, count in traffic.copies.items() if publication_text(publication) in wanted]
    outcome = classify(records, [d for d in simulation.deliveries if d.publication in wanted])
    load = sorted(((node.received_by_type["tm"] if node else 0) - before for node, before
                   in zip(nodes, received_before, strict=True)), reverse=True)
    busiest = max(1, len(load) // 20)
    # The cores of the meshes that carried the data (the replicated tree's root in `full` mode), and the
    # publications each core handled as core: a mesh spreads a publication to every member, its core too.
    cores: Counter[str] = Counter()
    core_load: Counter[str] = Counter()
    first_node = nodes[0]
    if first_node is not None:
        replicated = first_node.mesh.policy.replicated
        core_of = first_node.mesh.cores()
        for filter_, core in core_of.items():
            if filter_ in (replicated or workload.subscribers):
                cores[str(core)] += 1
        for record in records:
            carrier = replicated[0] if replicated else record.topic.rsplit("/", 1)[0] + "/#"
            if carrier in core_of:
                core_load[str(core_of[carrier])] += 1
    simulation.close()
    total = sum(load)
    return {
        "mode": mode,
        "subscriptions_converged_seconds": converged,
        "publications": len(records),
        "copies_per_publication": round(sum(copies) / max(1, len(records)), 2),
        "load_mean": round(total / max(1, len(load)), 1),
        "load_max": load[0] if load else 0,
        "load_busiest_5pct_share": round(sum(load[:busiest]) / max(1, total), 3),
        "brokers_handling_nothing": sum(1 for value in load if value == 0),
        "cores_max_per_broker": max(cores.values()) if cores else 0,
        "brokers_holding_cores": len(cores),
        "core_load_max": max(core_load.values()) if core_load else 0,
        "core_load_mean": round(sum(core_load.values()) / max(1, len(core_load)), 1),
        "control_packets_per_node_per_second": round(control / max(1e-9, window) / options.nodes, 2),
        "deliveries": {"expected": outcome.expected_deliveries, "delivered": outcome.delivered,
                       "lost": outcome.lost, "duplicates": outcome.duplicates, "unexpected": outcome.unexpected},
        "violations": len(simulation.violations),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


ROWS = (
    ("subscriptions converged (virtual s)", "subscriptions_converged_seconds"),
    ("tm copies / publication", "copies_per_publication"),
    ("publications handled / broker: mean", "load_mean"),
    ("publications handled / broker: max", "load_max"),
    ("  share of the busiest 5% of brokers", "load_busiest_5pct_share"),
    ("  brokers handling none", "brokers_handling_nothing"),
    ("cores held by the busiest broker", "cores_max_per_broker"),
    ("brokers holding a core", "brokers_holding_cores"),
    ("publications handled as core: max", "core_load_max"),
    ("  mean over the brokers holding a core", "core_load_mean"),
    ("control packets / node / s (window)", "control_packets_per_node_per_second"),
    ("deliveries expected", ("deliveries", "expected")),
    ("  delivered / lost / duplicates", None),
    ("invariant violations", "violations"),
    ("wall-clock seconds", "wall_seconds"),
)


def format_table(options: ModesBenchOptions, results: list[dict[str, Any]]) -> str:
    header = (f"{options.nodes} nodes, average degree {options.degree}, seed {options.seed}; "
              f"{options.topics} filters x {options.subscribers} subscriber nodes; "
              f"{options.publications} publications from random nodes on random filters")
    lines = [header, ""]
    width = max(len(label) for label, _ in ROWS)
    lines.append(" " * width + "".join(f"  {r['mode']:>10}" for r in results))
    for label, key in ROWS:
        cells = []
        for result in results:
            if key is None:
                d = result["deliveries"]
                value: Any = f"{d['delivered']}/{d['lost']}/{d['duplicates']}"
            elif isinstance(key, tuple):
                value = result[key[0]][key[1]]
            else:
                value = result[key]
            cells.append(f"  {value if value is not None else '-':>10}")
        lines.append(label.ljust(width) + "".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suites.bench.sim_modes",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    defaults = ModesBenchOptions()
    parser.add_argument("--nodes", type=int, default=defaults.nodes, help="nodes (default %(default)s)")
    parser.add_argument("--degree", type=float, default=defaults.degree, help="average degree (default %(default)s)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the workload and the runs")
    parser.add_argument("--topics", type=int, default=defaults.topics, help="topic filters (default %(default)s)")
    parser.add_argument("--subscribers", type=int, default=defaults.subscribers,
                        help="subscriber nodes per filter (default %(default)s)")
    parser.add_argument("--publications", type=int, default=defaults.publications,
                        help="publications measured (default %(default)s)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: " + ", ".join(MODES))
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown or not modes:
        parser.error(f"--modes: unknown {unknown or 'empty'}; choose from {', '.join(MODES)}")
    if args.nodes < 2 or args.subscribers < 1 or args.subscribers > args.nodes or args.topics < 1:
        parser.error("need --nodes >= 2, 1 <= --subscribers <= --nodes and --topics >= 1")
    options = ModesBenchOptions(nodes=args.nodes, degree=args.degree, seed=args.seed, topics=args.topics,
                                subscribers=args.subscribers, publications=max(1, args.publications))
    workload = Workload(options)
    results = []
    for mode in modes:
        print(f"running {mode} ...", file=sys.stderr, flush=True)
        results.append(run_mode(mode, workload, options))
    print(json.dumps(results, indent=2) if args.json else format_table(options, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
