"""The ground truth of a run: which nodes were alive and connected, and when it changed.

Theory of operation
-------------------
Convergence and expected deliveries are judged against what the network
really was, not against what the nodes believed. That truth is a list of
*disruptions* (start, cut, heal, kill, restart, loss) on a known topology,
taken from the best source available, in this order:

1. `--timeline FILE`, the scenario file the run executed (its times are
   seconds from the run's start, anchored at the first `node_started`);
2. the simulator's own `sim_*` records in the event log (exact times), or
   the netns/lxd harness's `run_*` records (`run.jsonl`: times from the
   run's start, anchored at `run_start.t0_unix`);
3. the node events themselves: a `node_started` of a new address is a
   start, of a known one a restart, `node_stopped` a kill, a
   `neighbour_down` between two live nodes a cut (at the moment it was
   *detected*, up to `dead_intervals` hellos after the real cut) and the
   next `neighbour_up` on that link a heal. The links are the configured
   neighbours of `node_started`. A crash without `node_stopped` is not
   visible this way: give the scenario file.

Disruptions at the same instant (or within `phase_gap` seconds of the
first, for detected disruptions) form one *phase*, labelled like the
simulator's (`cut n1-n4, cut n2-n5 @12.0s`). `World` replays the
disruptions and answers, after each phase, the connected components of the
live nodes over links uncut in both directions, and whether loss is active:
the same rules as `federation.scenario.truth.GroundTruth`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

HARNESS_PHASE_GAP = 1.0
"""seconds: the harness applies the changes of one scheduled instant one after the other"""
DETECTED_PHASE_GAP = 3.0
"""seconds: a cut is detected at both ends at different times, a federation starts node by node"""


class TimelineError(ValueError):
    """The timeline cannot be built from what was given (a message a person can act on)."""


@dataclass(frozen=True)
class Disruption:
    at: float
    kind: str
    """start, cut, heal, kill, restart, stop, loss"""
    label: str
    """as the simulator labels it: "cut n1-n4", "cut n1->n4", "kill n3", "loss 10% all links" """
    node: str | None = None
    a: str | None = None
    b: str | None = None
    oneway: bool = False
    percent: float = 0.0
    link: tuple[str, str] | None = None
    order: tuple[str, int] | None = None
    """(file, position) of the record that announced it: events of the same instant written before it
    happened before it (the simulator writes in execution order)"""


@dataclass
class Phase:
    index: int
    at: float
    disruptions: list[Disruption]
    end: float = float("inf")
    """when the next phase starts (the run's end for the last one)"""
    components: list[tuple[str, ...]] = field(default_factory=list)
    """connected components of live nodes after the phase's disruptions (sorted names)"""
    loss_active: bool = False
    origin: float = 0.0
    """the run's t=0 in event time: labels give times from it, as the scenario file does"""

    @property
    def order(self) -> tuple[str, int] | None:
        return self.disruptions[0].order

    @property
    def label(self) -> str:
        """"start", or "cut n1-n4, kill n7 @12.0s" (the simulator's phase label)."""
        parts = [d.label for d in self.disruptions]
        if parts == ["start"]:
            return "start"
        return f"{', '.join(parts)} @{round(self.at - self.origin, 6)}s"


@dataclass
class Timeline:
    names: dict[str, str]
    """node name -> address (host:port)"""
    links: list[tuple[str, str]]
    disruptions: list[Disruption]
    settle: float
    base_loss: float = 0.0
    """network-wide loss percent from t=0 (the scenario's link model)"""
    source: str = ""
    detected: bool = False
    """disruptions were inferred from what nodes detected, not scheduled"""
    origin: float = 0.0
    """the run's t=0 in event time"""
    phase_gap: float = 0.0
    """default gap for `phases`: disruptions applied one after the other still form one phase"""

    def phases(self, phase_gap: float = 0.0, end: float | None = None) -> list[Phase]:
        """Group disruptions into phases and compute each phase's components (see the module docstring)."""
        if not self.disruptions:
            return []
        ordered = sorted(self.disruptions, key=lambda d: d.at)  # stable: same-instant order kept
        phases: list[Phase] = []
        for disruption in ordered:
            current = phases[-1] if phases else None
            if current is not None and disruption.at - current.at <= phase_gap:
                current.disruptions.append(disruption)
            else:
                phases.append(Phase(len(phases), disruption.at, [disruption], origin=self.origin))
        world = World(self.names, self.links, self.base_loss)
        for position, phase in enumerate(phases):
            for disruption in phase.disruptions:
                world.apply(disruption)
            phase.components = world.components()
            phase.loss_active = world.loss_active()
            phase.end = phases[position + 1].at if position + 1 < len(phases) else (
                end if end is not None else float("inf"))
        return phases


class World:
    """Live nodes, cut directions and loss: the simulator's ground-truth topology rules."""

    def __init__(self, names: Mapping[str, str], links: Iterable[tuple[str, str]], base_loss: float = 0.0) -> None:
        self.names = sorted(names)
        self.links = sorted({tuple(sorted(link)) for link in links})  # type: ignore[misc]
        self.alive: set[str] = set()
        self.cut: set[tuple[str, str]] = set()
        self.loss = base_loss
        self.link_loss: dict[tuple[str, str], float] = {}

    def apply(self, disruption: Disruption) -> None:
        kind = disruption.kind
        if kind == "start":
            if disruption.node is None:
                self.alive = set(self.names)
            else:
                self.alive.add(disruption.node)
        elif kind in ("kill", "stop"):
            self.alive.discard(disruption.node or "")
        elif kind == "restart":
            self.alive.add(disruption.node or "")
        elif kind == "cut":
            assert disruption.a is not None and disruption.b is not None
            self.cut.add((disruption.a, disruption.b))
            if not disruption.oneway:
                self.cut.add((disruption.b, disruption.a))
        elif kind == "heal":
            assert disruption.a is not None and disruption.b is not None
            self.cut.discard((disruption.a, disruption.b))
            self.cut.discard((disruption.b, disruption.a))
        elif kind == "loss":
            if disruption.link is None:
                self.loss = disruption.percent
                self.link_loss.clear()
            else:
                key: tuple[str, str] = tuple(sorted(disruption.link))  # type: ignore[assignment]
                self.link_loss[key] = disruption.percent
        else:
            raise TimelineError(f"unknown disruption kind {kind!r}")

    def loss_active(self) -> bool:
        return self.loss > 0 or any(percent > 0 for percent in self.link_loss.values())

    def components(self) -> list[tuple[str, ...]]:
        """Connected components of live nodes over links uncut both ways, in name order."""
        adjacency: dict[str, list[str]] = {name: [] for name in self.alive}
        for a, b in self.links:
            if a in self.alive and b in self.alive and (a, b) not in self.cut and (b, a) not in self.cut:
                adjacency[a].append(b)
                adjacency[b].append(a)
        seen: set[str] = set()
        result: list[tuple[str, ...]] = []
        for name in self.names:
            if name not in self.alive or name in seen:
                continue
            stack, members = [name], []
            seen.add(name)
            while stack:
                current = stack.pop()
                members.append(current)
                for other in adjacency[current]:
                    if other not in seen:
                        seen.add(other)
                        stack.append(other)
            result.append(tuple(sorted(members)))
        return result


# ---------------------------------------------------------------- labels (as federation.sim.runner writes them)

def _cut(at: float, a: str, b: str, oneway: bool) -> Disruption:
    return Disruption(at, "cut", f"cut {a}->{b}" if oneway else f"cut {a}-{b}", a=a, b=b, oneway=oneway)


def _heal(at: float, a: str, b: str) -> Disruption:
    return Disruption(at, "heal", f"heal {a}-{b}", a=a, b=b)


def _loss(at: float, percent: float, link: Sequence[str] | None) -> Disruption:
    pair = (str(link[0]), str(link[1])) if link else None
    where = f"{pair[0]}-{pair[1]}" if pair else "all links"
    return Disruption(at, "loss", f"loss {percent:g}% {where}", percent=percent, link=pair)


# ---------------------------------------------------------------- sources

def from_sim_events(records: Iterable[Mapping[str, Any]], settle: float) -> Timeline | None:
    """The timeline from the simulator's `sim_*` records (sorted by time); None if there is no `sim_start`."""
    names: dict[str, str] = {}
    links: list[tuple[str, str]] = []
    disruptions: list[Disruption] = []
    started = False
    for record in records:
        kind = record["type"]
        at = float(record["t"])
        order = (str(record["file"]), int(record["seq"])) if record.get("file") is not None else None
        if kind == "sim_start":
            started = True
            names = {str(k): str(v) for k, v in sorted((record.get("nodes") or {}).items())}
            links = [(str(a), str(b)) for a, b in (record.get("links") or [])]
            disruptions.append(Disruption(at, "start", "start", order=order))
        elif kind == "sim_cut":
            disruptions.append(replace(_cut(at, record["a"], record["b"], bool(record.get("oneway"))), order=order))
        elif kind == "sim_heal":
            disruptions.append(replace(_heal(at, record["a"], record["b"]), order=order))
        elif kind == "sim_kill":
            disruptions.append(Disruption(at, "kill", f"kill {record['name']}", node=record["name"], order=order))
        elif kind == "sim_restart":
            disruptions.append(Disruption(at, "restart", f"restart {record['name']}", node=record["name"],
                                          order=order))
        elif kind == "sim_loss":
            disruptions.append(replace(_loss(at, float(record.get("percent") or 0.0), record.get("link")),
                                       order=order))
    if not started:
        return None
    return Timeline(names, links, disruptions, settle, source="simulator records (sim_*)")


def from_harness_events(records: Iterable[Mapping[str, Any]], names: Mapping[str, str],
                        settle: float) -> Timeline | None:
    """The timeline from the netns/lxd harness's `run_*` records; None if there is no `run_start`.

    Their times are seconds since the run started (every wrapper ready), `run_start.t0_unix` in
    unix time: the nodes' clock when they run on the harness's machine.
    """
    t0: float | None = None
    links: list[tuple[str, str]] = []
    disruptions: list[Disruption] = []
    for record in records:
        kind = record["type"]
        if kind == "run_start":
            t0 = float(record.get("t0_unix") or 0.0)
            links = [(str(a), str(b)) for a, b in (record.get("links") or [])]
            disruptions.append(Disruption(t0, "start", "start"))
            continue
        if t0 is None:
            continue
        at = t0 + float(record["t"])
        if kind == "run_cut":
            disruptions.append(_cut(at, record["a"], record["b"], bool(record.get("oneway"))))
        elif kind == "run_heal":
            disruptions.append(_heal(at, record["a"], record["b"]))
        elif kind == "run_kill":
            disruptions.append(Disruption(at, "kill", f"kill {record['name']}", node=record["name"]))
        elif kind == "run_restart":
            disruptions.append(Disruption(at, "restart", f"restart {record['name']}", node=record["name"]))
        elif kind == "run_loss":
            disruptions.append(_loss(at, float(record.get("percent") or 0.0), record.get("link")))
    if t0 is None:
        return None
    start = next(r for r in records if r["type"] == "run_start")
    harness_names = {str(k): str(v) for k, v in sorted((start.get("nodes") or {}).items())}
    known = {name: names.get(name, address if ":" in address else f"{address}:10500")
             for name, address in harness_names.items()}
    return Timeline(known, links, disruptions, settle, source="harness records (run_*)", origin=t0,
                    phase_gap=HARNESS_PHASE_GAP)


def from_scenario(path: str, names: Mapping[str, str], start: float) -> Timeline:
    """The timeline of a scenario file; `names` maps scenario names to addresses (from `node_started`)."""
    from federation.scenario.loader import ScenarioError, load_scenario
    from federation.scenario.model import Cut, Heal, Kill, Loss, Restart

    try:
        scenario = load_scenario(path)
    except ScenarioError as error:
        raise TimelineError(f"--timeline {path}: {error}") from None
    except OSError as error:
        raise TimelineError(f"--timeline {path}: cannot read it: {error.strerror}") from None
    scenario_names = scenario.node_names()
    missing = [name for name in scenario_names if name not in names]
    if missing:
        known = ", ".join(sorted(names)) or "none"
        raise TimelineError(
            f"--timeline {path}: the scenario's nodes {', '.join(missing)} never appear as `name` in a "
            f"node_started event (names in the events: {known}); give the event logs of the run of this scenario")
    disruptions = [Disruption(start, "start", "start")]
    for event in scenario.events:
        at = start + event.at
        if isinstance(event, Cut):
            disruptions.append(_cut(at, event.a, event.b, event.oneway))
        elif isinstance(event, Heal):
            disruptions.append(_heal(at, event.a, event.b))
        elif isinstance(event, Kill):
            disruptions.append(Disruption(at, "kill", f"kill {event.node}", node=event.node))
        elif isinstance(event, Restart):
            disruptions.append(Disruption(at, "restart", f"restart {event.node}", node=event.node))
        elif isinstance(event, Loss):
            disruptions.append(_loss(at, event.percent, event.link))
    return Timeline({name: names[name] for name in scenario_names}, list(scenario.links), disruptions,
                    scenario.settle, base_loss=scenario.link_model.loss, source=f"scenario file {path}",
                    origin=start)


def inferred(records: Iterable[Any], settle: float) -> Timeline:
    """The timeline detected by the nodes (see the module docstring); `records` are node events sorted by time.

    Each record needs `t`, `node`, `type`, `name`, `neighbours` (node_started) and `neighbour`
    (neighbour_up / neighbour_down).
    """
    names: dict[str, str] = {}
    by_address: dict[str, str] = {}
    links: set[tuple[str, str]] = set()
    configured: list[tuple[str, str]] = []
    disruptions: list[Disruption] = []
    alive: set[str] = set()
    cut: set[tuple[str, str]] = set()
    for record in records:
        kind = record.type
        address = record.node
        if kind == "node_started":
            name = record.name or address
            known = address in by_address
            by_address[address] = name
            names[name] = address
            for neighbour in record.neighbours or []:
                configured.append((address, neighbour))
            if known:
                disruptions.append(Disruption(record.t, "restart", f"restart {name}", node=name))
            else:
                disruptions.append(Disruption(record.t, "start", f"start {name}", node=name))
            alive.add(address)
        elif kind == "node_stopped":
            name = by_address.get(address, address)
            alive.discard(address)
            disruptions.append(Disruption(record.t, "stop", f"stop {name}", node=name))
        elif kind in ("neighbour_down", "neighbour_up"):
            other = record.neighbour
            if address not in alive or other not in alive:
                continue
            pair: tuple[str, str] = tuple(sorted((address, other)))  # type: ignore[assignment]
            a, b = by_address.get(pair[0], pair[0]), by_address.get(pair[1], pair[1])
            if kind == "neighbour_down" and pair not in cut:
                cut.add(pair)
                disruptions.append(_cut(record.t, a, b, oneway=False))
            elif kind == "neighbour_up" and pair in cut:
                cut.discard(pair)
                disruptions.append(_heal(record.t, a, b))
    if not names:
        raise TimelineError("no node_started event in the logs: cannot tell which nodes ran "
                            "(give the complete event logs, or the scenario file with --timeline)")
    for address, neighbour in configured:
        if neighbour in by_address:
            links.add(tuple(sorted((by_address[address], by_address[neighbour]))))  # type: ignore[arg-type]
    return Timeline(names, sorted(links), disruptions, settle, source="detected from node events",
                    detected=True, origin=min(d.at for d in disruptions), phase_gap=DETECTED_PHASE_GAP)
