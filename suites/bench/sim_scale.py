"""`python -m suites.bench.sim_scale`: how the protocol scales, measured on the simulator.

Theory of operation
-------------------
A seeded random overlay (a random spanning tree plus random extra links up
to the requested average degree) gets default settings and a few federated
filters with subscribers on random nodes. The bench then measures, in
virtual time:

1. cold start: seconds until every node's view agrees with the ground truth
   (the convergence definition of docs/simulator.md);
2. partition: the links between the first half of the nodes in BFS order and
   the rest are cut; seconds until each side has converged; then, after a
   short wait, the links heal; seconds until the whole has converged again;
3. steady state: control packets and bytes per node per second over a quiet
   window, which starts `steady_delay` seconds after the heal converged (the
   views agree before every healed link is back up: links keep coming up
   for about a hello interval);
4. data: `tm` copies per publication, against the optimum for a tree of
   shortest paths (the edges of the union of BFS paths from the publisher to
   the subscriber nodes) and against flooding to every broker (N-1 copies,
   what a spanning tree that replicates everything, MQTT-ST style, sends).

With `--node-filters K` every broker also subscribes K filters of its own
(`site<k>/dev/<i>/cmd`, a site's devices) right after the cold start, one
broker a millisecond after the other, and the bench measures how long after
the last one every node agrees on a core serving each of them, then delivers
a publication to a random device of random sites.

Wall-clock and CPU seconds are printed too; they measure the simulator and
the node code together (CPU seconds are the fairer figure on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from federation.protocol.events import publication_text
from federation.protocol.settings import Settings
from federation.protocol.wire import DATA_TYPES
from federation.scenario.model import Cut, Heal, NodeSpec, Publish, Scenario, Subscribe
from federation.scenario.report import classify
from federation.sim.collector import collector_paused
from federation.sim.network import NetworkOverload, default_max_in_flight
from federation.sim.runner import Simulation


@dataclass(frozen=True)
class BenchOptions:
    nodes: int = 1000
    degree: float = 4.0
    seed: int = 1
    filters: int = 3
    subscribers: int = 5
    """subscriber nodes per filter"""
    publications: int = 20
    limit: float = 120.0
    """virtual seconds allowed for each convergence measurement"""
    partition_hold: float = 5.0
    """virtual seconds the partition stays after both sides converged (or gave up)"""
    window: float = 20.0
    """virtual seconds of the steady-state traffic window"""
    steady_delay: float = 5.0
    """virtual seconds between the heal's convergence and the start of the steady-state window"""
    latency: float = 0.001
    subscribe_at_start: bool = False
    """True: every subscriber subscribes at t=0 (cores contend during the cold start); False: one by one
    after the cold start, `subscribe_gap` apart, measured as its own convergence phase"""
    subscribe_gap: float = 0.2
    node_filters: int = 0
    """per-device filters every broker subscribes after the cold start (`site<k>/dev/<i>/cmd`, i < node_filters),
    each broker at once, measured as their own convergence phase ("the brokers' own filters")"""


def build_overlay(count: int, degree: float, rng: random.Random) -> list[tuple[int, int]]:
    """A random spanning tree plus random extra edges up to `degree` on average; sorted (low, high) pairs."""
    edges: set[tuple[int, int]] = set()
    for index in range(1, count):
        edges.add((rng.randrange(index), index))
    wanted = max(count - 1, round(count * degree / 2))
    wanted = min(wanted, count * (count - 1) // 2)
    while len(edges) < wanted:
        a, b = rng.sample(range(count), 2)
        edges.add((min(a, b), max(a, b)))
    return sorted(edges)


def adjacency(count: int, edges: list[tuple[int, int]]) -> list[list[int]]:
    table: list[list[int]] = [[] for _ in range(count)]
    for a, b in edges:
        table[a].append(b)
        table[b].append(a)
    for neighbours in table:
        neighbours.sort()
    return table


def bfs_parents(table: list[list[int]], root: int) -> dict[int, int | None]:
    parents: dict[int, int | None] = {root: None}
    queue = deque([root])
    while queue:
        current = queue.popleft()
        for other in table[current]:
            if other not in parents:
                parents[other] = current
                queue.append(other)
    return parents


def shortest_path_tree_edges(table: list[list[int]], root: int, targets: set[int]) -> int:
    """Edges in the union of BFS (shortest) paths from `root` to every target."""
    parents = bfs_parents(table, root)
    used: set[tuple[int, int]] = set()
    for target in targets:
        current = target
        while current in parents and parents[current] is not None:
            parent = parents[current]
            assert parent is not None
            used.add((min(current, parent), max(current, parent)))
            current = parent
    return len(used)


def name_of(index: int) -> str:
    return f"b{index:05d}"


NODE_FILTERS_GAP = 0.001
"""virtual seconds between two brokers' subscribing their own filters (`--node-filters`)"""


def node_filter(index: int, device: int) -> str:
    """A per-device filter of broker `index` (`--node-filters`)."""
    return f"site{index}/dev/{device}/cmd"


class Bench:
    def __init__(self, options: BenchOptions, progress: Callable[[str], None] | None = None) -> None:
        self.options = options
        self._progress = progress or (lambda text: None)
        self.last_progress = time.perf_counter()
        rng = random.Random(f"bench:{options.seed}")
        self.rng = rng
        self.edges = build_overlay(options.nodes, options.degree, rng)
        self.table = adjacency(options.nodes, self.edges)
        self.subscribers: dict[str, set[int]] = {}
        for number in range(options.filters):
            chosen = rng.sample(range(options.nodes), min(options.subscribers, options.nodes))
            self.subscribers[f"bench/f{number}/#"] = set(chosen)
        scenario = Scenario(
            name=f"bench-{options.nodes}", source="suites.bench.sim_scale",
            nodes=tuple(NodeSpec(name_of(index)) for index in range(options.nodes)),
            links=tuple((name_of(a), name_of(b)) for a, b in self.edges), settings=Settings(),
            duration=float("inf"), events=(), settle=5.0,
        )
        # A cold start floods every node's record over every link at once: allow that much in flight.
        in_flight = max(default_max_in_flight(options.nodes), 2 * options.nodes * len(self.edges))
        self.simulation = Simulation(scenario, seed=options.seed, max_in_flight=in_flight)
        self.results: dict[str, Any] = {
            "nodes": options.nodes, "links": len(self.edges), "degree": round(2 * len(self.edges) / options.nodes, 3),
            "seed": options.seed, "filters": options.filters, "subscribers_per_filter": options.subscribers,
            "node_filters": options.node_filters,
        }

    def progress(self, text: str) -> None:
        self.last_progress = time.perf_counter()
        self._progress(text)

    def converge(self, label: str) -> float | None:
        """Run until the current phase converges (or the limit); its seconds, or None."""
        simulation = self.simulation
        phase = simulation.tracker.phases[-1]
        limit = simulation.now + self.options.limit
        step = 0.5
        while phase.settled_at is None and simulation.now < limit:
            # In slices of virtual time, with a sign of life for long runs.
            simulation.network.run_while(lambda: phase.settled_at is None, min(limit, simulation.now + step))
            if phase.settled_at is None and time.perf_counter() - self.last_progress > 60:
                self.progress(f"  {label}: still converging at virtual t={simulation.now:.3f} "
                              f"(wall {time.perf_counter() - self.started:.1f} s)")
        seconds = None if phase.settled_at is None else round(phase.settled_at - phase.at, 6)
        self.progress(f"{label}: {'not converged' if seconds is None else f'{seconds:.3f} s'} "
                      f"(virtual t={simulation.now:.3f}, wall {time.perf_counter() - self.started:.1f} s)")
        return seconds

    def run(self) -> dict[str, Any]:
        """Every measurement; after a packet storm the rest stays None and `aborted` says why."""
        self.started = time.perf_counter()
        cpu_started = time.process_time()
        results = self.results
        for key in ("cold_start_seconds", "node_filters_seconds", "subscriptions_seconds", "partition_cut_links",
                    "partition_seconds", "heal_seconds", "steady_window_seconds", "steady_delay_seconds",
                    "control_packets_per_node_per_second", "control_bytes_per_node_per_second", "publications",
                    "copies_per_publication", "optimum_copies_per_publication", "deliveries"):
            results[key] = None
        results["control_by_type_per_node_per_second"] = {}
        results["flooding_copies_per_publication"] = self.options.nodes - 1
        results["aborted"] = None
        try:
            with collector_paused(collect=False):
                self._measure()
        except NetworkOverload as overload:
            results["aborted"] = str(overload)
            self.progress(f"aborted: {overload}")
        results["violations"] = len(self.simulation.violations)
        results["virtual_seconds"] = round(self.simulation.now, 3)
        results["wall_seconds"] = round(time.perf_counter() - self.started, 3)
        results["cpu_seconds"] = round(time.process_time() - cpu_started, 3)
        return results

    def _measure(self) -> None:
        options = self.options
        simulation = self.simulation
        results = self.results
        simulation.start()
        subscriptions = [(federated, index) for federated, chosen in sorted(self.subscribers.items())
                         for index in sorted(chosen)]
        if options.subscribe_at_start:
            for federated, index in subscriptions:
                simulation.apply(Subscribe(0.0, name_of(index), f"client-{index}", federated))
        results["cold_start_seconds"] = self.converge("cold start")
        if options.node_filters:
            # Broker after broker, a millisecond apart (each broker's filters at once), as sites come up: a thousand
            # brokers' claims flooding in the same instant would only measure the simulator's queue.
            for index in range(options.nodes):
                with simulation.simultaneously():
                    for device in range(options.node_filters):
                        simulation.apply(Subscribe(simulation.now, name_of(index), f"devices-{index}",
                                                   node_filter(index, device)))
                simulation.run_until(simulation.now + NODE_FILTERS_GAP)
            simulation.tracker.begin_phase("the brokers' own filters", simulation.now)
            results["node_filters_seconds"] = self.converge(
                f"{options.nodes} x {options.node_filters} filters of the brokers' own")
        if not options.subscribe_at_start:
            # One subscription every `subscribe_gap` seconds, in random order; then the seconds from the
            # last one until every topic core is agreed.
            order = list(subscriptions)
            self.rng.shuffle(order)
            for number, (federated, index) in enumerate(order):
                simulation.run_until(simulation.now + (options.subscribe_gap if number else 0.0))
                simulation.apply(Subscribe(simulation.now, name_of(index), f"client-{index}", federated))
            simulation.tracker.begin_phase("subscriptions", simulation.now)
            results["subscriptions_seconds"] = self.converge("subscriptions (from the last one)")

        half = [index for index in bfs_parents(self.table, 0)][: options.nodes // 2]
        side = set(half)
        crossing = [(a, b) for a, b in self.edges if (a in side) != (b in side)]
        results["partition_cut_links"] = len(crossing)
        with simulation.simultaneously():
            for a, b in crossing:
                simulation.apply(Cut(simulation.now, name_of(a), name_of(b)))
        results["partition_seconds"] = self.converge("partition")
        simulation.run_until(simulation.now + options.partition_hold)
        with simulation.simultaneously():
            for a, b in crossing:
                simulation.apply(Heal(simulation.now, name_of(a), name_of(b)))
        results["heal_seconds"] = self.converge("heal")

        simulation.run_until(simulation.now + options.steady_delay)
        traffic = simulation.network.traffic
        before = dict(traffic.packets_by_type), dict(traffic.bytes_by_type)
        simulation.run_until(simulation.now + options.window)
        node_seconds = options.nodes * options.window
        by_type = {kind: {"packets": traffic.packets_by_type[kind] - before[0].get(kind, 0),
                          "bytes": traffic.bytes_by_type[kind] - before[1].get(kind, 0)}
                   for kind in sorted(traffic.packets_by_type) if kind not in DATA_TYPES}
        packets = sum(item["packets"] for item in by_type.values())
        size = sum(item["bytes"] for item in by_type.values())
        results["steady_window_seconds"] = options.window
        results["steady_delay_seconds"] = options.steady_delay
        results["control_packets_per_node_per_second"] = round(packets / node_seconds, 3)
        results["control_bytes_per_node_per_second"] = round(size / node_seconds, 3)
        results["control_by_type_per_node_per_second"] = {
            kind: {"packets": round(item["packets"] / node_seconds, 3),
                   "bytes": round(item["bytes"] / node_seconds, 3)} for kind, item in by_type.items()}
        self.progress(f"steady state: {results['control_packets_per_node_per_second']} control packets "
                      f"per node per second (wall {time.perf_counter() - self.started:.1f} s)")

        first_publication = len(simulation.publications)
        plan: list[tuple[int, str, str]] = []
        filters = sorted(self.subscribers)
        for number in range(options.publications):
            federated = filters[number % len(filters)]
            plan.append((self.rng.randrange(options.nodes), federated, federated.replace("#", f"m{number}")))
        if options.node_filters:
            for _ in range(options.publications):
                site = self.rng.randrange(options.nodes)
                topic = node_filter(site, self.rng.randrange(options.node_filters))
                self.subscribers[topic] = {site}
                plan.append((self.rng.randrange(options.nodes), topic, topic))
        for number, (publisher, _, topic) in enumerate(plan):
            simulation.run_until(simulation.now + (0.1 if number else 0.0))
            simulation.publish(Publish(simulation.now, name_of(publisher), topic), 0)
        simulation.run_until(simulation.now + 3.0)
        records = simulation.publications[first_publication:]
        copies = {record.publication: 0 for record in records}
        for publication, count in traffic.copies.items():
            text = publication_text(publication)
            if text in copies:
                copies[text] = count
        optimum = [shortest_path_tree_edges(self.table, publisher, self.subscribers[federated] - {publisher})
                   for publisher, federated, _ in plan]
        outcome = classify(records, [d for d in simulation.deliveries if d.publication in copies])
        sent = max(1, len(records))
        results["publications"] = len(records)
        results["copies_per_publication"] = round(sum(copies.values()) / sent, 3)
        results["optimum_copies_per_publication"] = round(sum(optimum) / max(1, len(optimum)), 3)
        results["deliveries"] = {"expected": outcome.expected_deliveries, "delivered": outcome.delivered,
                                 "lost": outcome.lost, "duplicates": outcome.duplicates,
                                 "unexpected": outcome.unexpected}


def format_table(results: dict[str, Any]) -> str:
    def show(value: Any) -> str:
        return "not converged" if value is None else str(value)

    def plain(value: Any) -> str:
        return "-" if value is None else str(value)

    deliveries = results["deliveries"] or {"expected": "-", "delivered": "-", "lost": "-"}

    rows = [
        ("nodes / links / average degree", f"{results['nodes']} / {results['links']} / {results['degree']}"),
        ("filters x subscriber nodes", f"{results['filters']} x {results['subscribers_per_filter']}"),
        ("cold-start convergence (virtual s)", show(results["cold_start_seconds"])),
        ("filters of the brokers' own, per broker", str(results["node_filters"])),
        ("  their convergence (virtual s)", plain(results["node_filters_seconds"])),
        ("last subscription: topic-core convergence (s)", plain(results["subscriptions_seconds"])),
        (f"partition of {plain(results['partition_cut_links'])} links: convergence (s)",
         show(results["partition_seconds"])),
        ("heal: convergence (s)", show(results["heal_seconds"])),
        ("control packets / node / s (steady)", plain(results["control_packets_per_node_per_second"])),
        ("control bytes / node / s (steady)", plain(results["control_bytes_per_node_per_second"])),
        ("data copies / publication", plain(results["copies_per_publication"])),
        ("  shortest-path-tree optimum", plain(results["optimum_copies_per_publication"])),
        ("  flooding to every broker (N-1)", str(results["flooding_copies_per_publication"])),
        ("deliveries expected / delivered / lost", "{expected} / {delivered} / {lost}".format(**deliveries)),
        ("invariant violations", str(results["violations"])),
        ("virtual seconds simulated", str(results["virtual_seconds"])),
        ("wall-clock seconds", str(results["wall_seconds"])),
        ("CPU seconds", str(results["cpu_seconds"])),
        ("peak memory of the process (MB)", plain(results.get("max_rss_mb"))),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [f"{label.ljust(width)}  {value}" for label, value in rows]
    if results["aborted"]:
        lines.append(f"ABORTED: {results['aborted']}")
    by_type = results["control_by_type_per_node_per_second"]
    lines.append("steady control by type (packets bytes / node / s): " + ", ".join(
        f"{kind} {item['packets']} {item['bytes']}" for kind, item in by_type.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suites.bench.sim_scale",
                                     description=__doc__.split("\n\n")[0])
    defaults = BenchOptions()
    parser.add_argument("--nodes", type=int, default=defaults.nodes, help="number of nodes (default %(default)s)")
    parser.add_argument("--degree", type=float, default=defaults.degree, help="average degree (default %(default)s)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the overlay and the run")
    parser.add_argument("--filters", type=int, default=defaults.filters, help="federated filters")
    parser.add_argument("--subscribers", type=int, default=defaults.subscribers, help="subscriber nodes per filter")
    parser.add_argument("--publications", type=int, default=defaults.publications, help="publications measured")
    parser.add_argument("--limit", type=float, default=defaults.limit,
                        help="virtual seconds allowed per convergence measurement (default %(default)s)")
    parser.add_argument("--window", type=float, default=defaults.window,
                        help="virtual seconds of the steady-state window (default %(default)s)")
    parser.add_argument("--steady-delay", type=float, default=defaults.steady_delay,
                        help="virtual seconds from the heal's convergence to the steady-state window "
                             "(default %(default)s)")
    parser.add_argument("--subscribe-at-start", action="store_true",
                        help="subscribe everyone at t=0 (topic cores contend) instead of one by one "
                             "after the cold start")
    parser.add_argument("--node-filters", type=int, default=defaults.node_filters,
                        help="per-device filters every broker subscribes after the cold start (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    if args.nodes < 2:
        parser.error("--nodes must be at least 2")
    if args.degree < 1:
        parser.error("--degree must be at least 1")
    options = BenchOptions(nodes=args.nodes, degree=args.degree, seed=args.seed, filters=max(1, args.filters),
                           subscribers=max(1, args.subscribers), publications=max(1, args.publications),
                           limit=args.limit, window=args.window, steady_delay=max(0.0, args.steady_delay),
                           subscribe_at_start=args.subscribe_at_start, node_filters=max(0, args.node_filters))

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    results = Bench(options, None if args.quiet else progress).run()
    results["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(results, indent=2) if args.json else format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
