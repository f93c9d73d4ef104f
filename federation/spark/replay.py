"""Replay the nodes' view changes against the ground truth: convergence per phase and component.

Theory of operation
-------------------
A node's *view* is what the convergence rule compares: its members, its
management core and its topic cores (`federation.protocol.node_status.NodeView`). Every
change of it is an event (`table_changed`, `management_core_changed`,
`topic_core_changed`, `id_changed`; `node_started` resets it), so replaying
those events in order rebuilds every view at every instant. Two changes are
silent in the engine and are re-derived here: a node that changes its vid
(`id_changed`) also renames its own topic cores and takes
`min(management core, new id)` as management core (`FederationTable.change_vid`).

The rule is the simulator's (docs/simulator.md, "Convergence";
`federation.scenario.truth.ConvergenceTracker`): a component has converged when
all its nodes have the same view, whose members are the component's
addresses, whose management core is the lowest current BrokerId among them
and whose topic cores cover every federated filter subscribed in the
component, each held by a node of the component. A phase has converged at
the first instant (after all that instant's events) at which every
component has; if the next phase starts first, it never did. The job
evaluates it only at instants where something changed, as the simulator
does, with cheap counters (nodes with the wrong member count or management
core per component) rejecting most checks before views are compared.

This pass also yields what is sequential by nature and small: the
subscription intervals that the expected-delivery rule needs, mesh sizes
over time, core changes, and a snapshot of every phase's end for the
overlay picture. A node's subscriptions survive a restart only if the
restarted node re-adds them at its start instant (the daemon replays its
persisted table then, the simulator does the same); the others end there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from federation.protocol.aggregation import ServingCores
from federation.spark.timeline import Phase

BrokerKey = tuple[int, str, int]
"""(vid, host, port): ordered as federation.protocol.types.BrokerId"""

VIEW_EVENT_TYPES = (
    "node_started", "node_stopped", "table_changed", "management_core_changed", "topic_core_changed",
    "id_changed", "subscription_added", "subscription_removed", "mesh_joined", "mesh_left",
    "neighbour_up", "neighbour_down",
)
"""The event types this pass reads (a small share of a log: no publications, no counters)."""


def parse_broker_id(text: str | None) -> BrokerKey | None:
    """"vid@host:port" -> (vid, host, port); None for null or malformed text."""
    if not text or "@" not in text:
        return None
    vid, _, address = text.partition("@")
    host, _, port = address.rpartition(":")
    try:
        return (int(vid), host, int(port))
    except ValueError:
        return None


def broker_text(key: BrokerKey | None) -> str | None:
    return None if key is None else f"{key[0]}@{key[1]}:{key[2]}"


def address_of(key: BrokerKey) -> str:
    return f"{key[1]}:{key[2]}"


@dataclass
class NodeState:
    address: str
    broker_id: BrokerKey | None = None
    has_view: bool = False
    members: set[str] = field(default_factory=set)
    management_core: BrokerKey | None = None
    topic_cores: dict[str, BrokerKey] = field(default_factory=dict)
    subscriptions: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)
    """(client, raw filter) -> (federated filter, since)"""
    meshes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """filter -> parents when it joined"""
    up: set[str] = field(default_factory=set)
    """neighbour transport addresses that are up"""
    _digest: tuple[Any, ...] | None = None

    def digest(self) -> tuple[Any, ...]:
        if self._digest is None:
            self._digest = (frozenset(self.members), self.management_core, tuple(sorted(self.topic_cores.items())))
        return self._digest

    def changed(self) -> None:
        self._digest = None


@dataclass(frozen=True)
class SubscriptionInterval:
    node: str
    """address"""
    federated: str
    client: str
    filter: str
    since: float
    until: float | None
    """None: still active at the end of the log"""


@dataclass
class ComponentResult:
    names: tuple[str, ...]
    settled_at: float | None = None
    problem: str | None = None
    """why it had not converged when the phase ended (None if it had then)"""


@dataclass
class PhaseResult:
    phase: Phase
    settled_at: float | None = None
    components: list[ComponentResult] = field(default_factory=list)
    snapshot: dict[str, Any] = field(default_factory=dict)
    """the overlay at the phase's end (see `Replay._snapshot`)"""

    @property
    def seconds(self) -> float | None:
        return None if self.settled_at is None else self.settled_at - self.phase.at


@dataclass
class ReplayResult:
    phases: list[PhaseResult]
    subscriptions: list[SubscriptionInterval]
    mesh_sizes: list[tuple[float, str, int]]
    """(t, filter, members) at every change"""
    core_changes: list[dict[str, Any]]
    series: list[tuple[float, int, int, int]]
    """(t, nodes with wrong members, nodes with wrong management core, components not converged)"""
    events_read: int = 0
    unknown_nodes: list[str] = field(default_factory=list)
    """addresses with events that the timeline does not name"""


class Replay:
    """Feed `run` the view events sorted by time (file order within an instant)."""

    def __init__(self, phases: list[Phase], names: Mapping[str, str]) -> None:
        self.phases = phases
        self.name_to_address = dict(names)
        self.address_to_name = {address: name for name, address in names.items()}
        self.nodes: dict[str, NodeState] = {}
        self.results = [PhaseResult(phase, components=[ComponentResult(c) for c in phase.components])
                        for phase in phases]
        self.current: PhaseResult | None = None
        self.component_of: dict[str, int] = {}
        """address -> index of its component in the current phase"""
        self.component_addresses: list[frozenset[str]] = []
        self.converged_now: list[bool] = []
        self.wrong_members: set[str] = set()
        self.wrong_core: set[str] = set()
        self.lowest: list[BrokerKey | None] = []
        self.dirty_nodes: set[str] = set()
        self.dirty_all = True
        self.restarting: dict[str, set[tuple[str, str]]] = {}
        self.subscription_intervals: list[SubscriptionInterval] = []
        self.mesh_counts: Counter[str] = Counter()
        self.mesh_sizes: list[tuple[float, str, int]] = []
        self.mesh_touched: set[str] = set()
        self.core_changes: list[dict[str, Any]] = []
        self.series: list[tuple[float, int, int, int]] = []
        self.events_read = 0
        self.unknown: set[str] = set()

    # ------------------------------------------------------------ driving

    def run(self, records: Iterable[Any]) -> ReplayResult:
        phase_index = 0
        pending: list[Any] = []
        instant: float | None = None
        iterator: Iterator[Any] = iter(records)
        for record in iterator:
            self.events_read += 1
            t = float(record.t)
            if instant is not None and t != instant:
                phase_index = self._instant(instant, pending, phase_index)
                pending = []
            instant = t
            pending.append(record)
        if instant is not None:
            phase_index = self._instant(instant, pending, phase_index)
        while phase_index < len(self.phases):  # phases after the last event
            phase_index = self._instant(self.phases[phase_index].at, [], phase_index)
        if self.current is not None:
            self._close_phase(self.current)
        for state in self.nodes.values():
            for (client, filter_), (federated, since) in sorted(state.subscriptions.items()):
                self.subscription_intervals.append(
                    SubscriptionInterval(state.address, federated, client, filter_, since, None))
        return ReplayResult(self.results, sorted(self.subscription_intervals, key=lambda s: (s.since, s.node)),
                            self.mesh_sizes, self.core_changes, self.series, self.events_read,
                            sorted(self.unknown))

    def _instant(self, t: float, records: list[Any], phase_index: int) -> int:
        """Process phases that start before t, then the records at t, then check at the end of t."""
        while phase_index < len(self.phases) and self.phases[phase_index].at < t:
            # A phase that starts between two event instants: its own instant, with no events.
            self._finish_instant(self.phases[phase_index].at, [], phase_index)
            phase_index += 1
        starts_now = phase_index < len(self.phases) and self.phases[phase_index].at == t
        self._finish_instant(t, records, phase_index if starts_now else None)
        return phase_index + 1 if starts_now else phase_index

    def _finish_instant(self, t: float, records: list[Any], phase_index: int | None) -> None:
        if phase_index is not None and self.current is not None:
            # The phase ends where the next begins: before this instant's events (the simulator never
            # settles a phase at the instant the next one starts).
            self._close_phase(self.current)
            self.current = None
        for record in records:
            self._apply(record, t)
        for address, pending in self.restarting.items():
            state = self.nodes[address]
            for key in sorted(pending):  # not re-added by the restarted node: gone
                federated, since = state.subscriptions.pop(key)
                self.subscription_intervals.append(SubscriptionInterval(address, federated, key[0], key[1], since, t))
                self.dirty_nodes.add(address)
        self.restarting.clear()
        if phase_index is not None:
            self._begin_phase(self.results[phase_index], t)
        self._record_meshes(t)
        self._check(t)

    # ------------------------------------------------------------ events

    def _node(self, address: str) -> NodeState:
        state = self.nodes.get(address)
        if state is None:
            state = self.nodes[address] = NodeState(address)
            if address not in self.address_to_name:
                self.unknown.add(address)
        return state

    def _apply(self, record: Any, t: float) -> None:
        kind = record.type
        state = self._node(record.node)
        if kind == "node_started":
            broker_id = parse_broker_id(record.broker_id)
            restarted = state.broker_id is not None
            self._drop_meshes(state)
            state.broker_id = broker_id
            state.has_view = True
            state.members = {state.address}
            state.management_core = broker_id
            state.topic_cores = {}
            state.up = set()
            if restarted and state.subscriptions:
                self.restarting[state.address] = set(state.subscriptions)
            self.dirty_all = True  # a new incarnation may draw a new vid: lowest ids change
        elif kind == "node_stopped":
            self._drop_view(state)
        elif kind == "table_changed":
            state.members.difference_update(record.removed or ())
            state.members.update(record.added or ())
        elif kind == "management_core_changed":
            state.management_core = parse_broker_id(record.core)
            self._core_change(t, state, "management", None, record)
        elif kind == "topic_core_changed":
            core = parse_broker_id(record.core)
            if core is None:
                state.topic_cores.pop(record.filter, None)
            else:
                state.topic_cores[record.filter] = core
            self._core_change(t, state, "topic", record.filter, record)
        elif kind == "id_changed":
            old = state.broker_id
            if old is not None and record.vid is not None:
                new: BrokerKey = (int(record.vid), old[1], old[2])
                state.broker_id = new
                for filter_, core in list(state.topic_cores.items()):
                    if core == old:
                        state.topic_cores[filter_] = new
                if state.management_core is None or new < state.management_core:
                    state.management_core = new
                self.dirty_all = True  # the lowest id of its component may change
        elif kind == "subscription_added":
            key = (record.client, record.filter)
            pending = self.restarting.get(state.address)
            if pending is not None and key in pending:
                pending.discard(key)  # replayed at the restart: the subscription goes on
            elif key not in state.subscriptions and record.federated:
                state.subscriptions[key] = (record.federated, t)
        elif kind == "subscription_removed":
            key = (record.client, record.filter)
            held = state.subscriptions.pop(key, None)
            if held is not None:
                self.subscription_intervals.append(
                    SubscriptionInterval(state.address, held[0], key[0], key[1], held[1], t))
        elif kind == "mesh_joined":
            if record.filter not in state.meshes:
                self.mesh_counts[record.filter] += 1
                self.mesh_touched.add(record.filter)
            state.meshes[record.filter] = tuple(record.parents or ())
        elif kind == "mesh_left":
            if state.meshes.pop(record.filter, None) is not None:
                self.mesh_counts[record.filter] -= 1
                self.mesh_touched.add(record.filter)
        elif kind == "neighbour_up":
            state.up.add(record.neighbour)
            return
        elif kind == "neighbour_down":
            state.up.discard(record.neighbour)
            return
        else:
            return
        state.changed()
        self.dirty_nodes.add(state.address)

    def _core_change(self, t: float, state: NodeState, kind: str, filter_: str | None, record: Any) -> None:
        self.core_changes.append({
            "t": t, "node": self.address_to_name.get(state.address, state.address), "kind": kind,
            "filter": filter_, "core": record.core, "previous": record.previous,
            "reason": getattr(record, "reason", None) if kind == "topic" else None,
        })

    def _drop_meshes(self, state: NodeState) -> None:
        for filter_ in state.meshes:
            self.mesh_counts[filter_] -= 1
            self.mesh_touched.add(filter_)
        state.meshes = {}

    def _drop_view(self, state: NodeState) -> None:
        self._drop_meshes(state)
        state.has_view = False
        state.up = set()
        state.changed()
        self.dirty_all = True

    def _record_meshes(self, t: float) -> None:
        for filter_ in sorted(self.mesh_touched):
            self.mesh_sizes.append((t, filter_, self.mesh_counts[filter_]))
        self.mesh_touched.clear()

    # ------------------------------------------------------------ phases

    def _begin_phase(self, result: PhaseResult, t: float) -> None:
        self.current = result
        for disruption in result.phase.disruptions:
            if disruption.kind in ("kill", "stop") and disruption.node is not None:
                address = self.name_to_address.get(disruption.node)
                if address is not None and address in self.nodes:
                    self._drop_view(self.nodes[address])
        self.component_of = {}
        self.component_addresses = []
        for index, component in enumerate(result.phase.components):
            addresses = frozenset(self.name_to_address[name] for name in component)
            self.component_addresses.append(addresses)
            for address in addresses:
                self.component_of[address] = index
        self.converged_now = [False] * len(self.component_addresses)
        self.dirty_all = True

    def _close_phase(self, result: PhaseResult) -> None:
        for index, component in enumerate(result.components):
            component.problem = self._problem(index) if index < len(self.component_addresses) else None
        result.snapshot = self._snapshot()

    # ------------------------------------------------------------ checks

    def _lowest(self, index: int) -> BrokerKey | None:
        ids = [self.nodes[a].broker_id for a in self.component_addresses[index]
               if a in self.nodes and self.nodes[a].has_view and self.nodes[a].broker_id is not None]
        return min(ids) if ids else None  # type: ignore[type-var]

    def _flags(self, address: str) -> None:
        index = self.component_of.get(address)
        state = self.nodes.get(address)
        self.wrong_members.discard(address)
        self.wrong_core.discard(address)
        if index is None:
            return
        if state is None or not state.has_view:
            self.wrong_members.add(address)
            self.wrong_core.add(address)
            return
        expected = self.component_addresses[index]
        if len(state.members) != len(expected) or state.members != expected:
            self.wrong_members.add(address)
        if state.management_core != self.lowest[index]:
            self.wrong_core.add(address)

    def _check(self, t: float) -> None:
        if self.current is None:
            self.dirty_nodes.clear()
            return
        if self.dirty_all:
            self.lowest = [self._lowest(i) for i in range(len(self.component_addresses))]
            self.wrong_members.clear()
            self.wrong_core.clear()
            for address in self.component_of:
                self._flags(address)
            touched = set(range(len(self.component_addresses)))
        else:
            touched = set()
            for address in self.dirty_nodes:
                self._flags(address)
                index = self.component_of.get(address)
                if index is not None:
                    touched.add(index)
        if not self.dirty_all and not self.dirty_nodes:
            return
        self.dirty_all = False
        self.dirty_nodes.clear()
        wrong_by_component: Counter[int] = Counter()
        for address in self.wrong_members | self.wrong_core:
            wrong_by_component[self.component_of[address]] += 1
        for index in touched:
            self.converged_now[index] = wrong_by_component[index] == 0 and self._problem(index) is None
            component = self.current.components[index]
            if self.converged_now[index] and component.settled_at is None:
                component.settled_at = t
        if self.current.settled_at is None and all(self.converged_now):
            self.current.settled_at = t
        point = (t, len(self.wrong_members), len(self.wrong_core), self.converged_now.count(False))
        if not self.series or self.series[-1][1:] != point[1:]:
            self.series.append(point)

    def _problem(self, index: int) -> str | None:
        """Why component `index` has not converged (the simulator's wording), or None."""
        addresses = sorted(self.component_addresses[index], key=lambda a: self.address_to_name.get(a, a))
        name = self.address_to_name.get
        missing = [name(a, a) for a in addresses if a not in self.nodes or not self.nodes[a].has_view]
        if missing:
            return f"no view yet from {', '.join(missing)}"
        states = [self.nodes[a] for a in addresses]
        digests = {state.digest() for state in states}
        if len(digests) != 1:
            groups: dict[tuple[Any, ...], list[str]] = {}
            for state in states:
                groups.setdefault(state.digest(), []).append(name(state.address, state.address))
            listing = "; ".join(", ".join(group) for group in sorted(groups.values()))
            return f"views differ between groups: {listing}"
        members, management_core, cores = next(iter(digests))
        expected = self.component_addresses[index]
        if members != expected:
            return (f"members differ from the component: extra {sorted(members - expected)}, "
                    f"missing {sorted(expected - members)}")
        ids = {state.broker_id for state in states}
        lowest = min(ids)  # type: ignore[type-var]
        if management_core != lowest:
            return (f"management core is {broker_text(management_core)}, "
                    f"expected the lowest id {broker_text(lowest)}")
        serving = ServingCores(dict(cores))
        needed = sorted({federated for state in states for federated, _ in state.subscriptions.values()})
        for federated in needed:
            core = serving(federated)
            if core is None:
                return f"no topic core for subscribed filter {federated!r}"
            if core not in ids:
                return f"topic core {broker_text(core)} for {federated!r} is not a current node of the component"
        return None

    # ------------------------------------------------------------ pictures

    def _snapshot(self) -> dict[str, Any]:
        """Every live node's view at this moment: what the overlay picture draws."""
        nodes = {}
        for address, state in sorted(self.nodes.items()):
            if not state.has_view:
                continue
            nodes[self.address_to_name.get(address, address)] = {
                "address": address,
                "broker_id": broker_text(state.broker_id),
                "management_core": broker_text(state.management_core),
                "topic_cores": {f: broker_text(c) for f, c in sorted(state.topic_cores.items())},
                "meshes": {f: list(parents) for f, parents in sorted(state.meshes.items())},
                "up": sorted(self.address_to_name.get(a, a) for a in state.up),
                "members": len(state.members),
            }
        return nodes
