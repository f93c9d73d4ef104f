"""Ground truth: what the federation should believe, computed without asking any node.

Theory of operation
-------------------
The simulator knows the real state of the world: which nodes are alive,
which links carry traffic both ways, which clients subscribed where and
when. `GroundTruth` keeps that state and answers the two questions the report
needs: which brokers *must* receive a publication (the expected-delivery rule
below, documented in docs/simulator.md), and what every node's view should
be once the federation has converged. `ConvergenceTracker` compares the
nodes' views with it.

Expected-delivery rule. A publication P made at time t by origin O on topic T
is *in bound* when the whole network had no disruption (start, cut, heal,
kill, restart, loss change) in [t - settle, t] and no loss is active at t.
For an in-bound P, the expected subscriber nodes are the nodes N != O that at
time t are alive, in O's connected component, and hold an active
subscription whose filter (with any `$share/<group>/` prefix stripped)
matches T and was made at or before t - settle. A shared subscription
(`$share/<group>/F`) expects no node by itself: a group is served once, by
one member broker of the federation's choosing (docs/protocol.md rule 9),
so its deliveries count as `delivered_outside_bound`, never as lost or
unexpected. A publication that is not in bound expects nobody: deliveries
still count, as `delivered_outside_bound`.
A retained publication is expected at every other node of O's component
(docs/protocol.md rule 10: every broker stores the current retained value).

Convergence. A component has converged when every node in it reports the
same view, the view's members are exactly the component's addresses, its
management core is the lowest BrokerId among the component's nodes, and its
topic cores include every federated filter subscribed in the component (shared
subscriptions federate no filter: rule 9), each
mapped to the current BrokerId of a node of the component. Views are interned
so a check costs O(nodes) and a cheap count rejects most checks at once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from federation.protocol.aggregation import ServingCores
from federation.protocol.topic_filter import SHARE_PREFIX, federated_filter, matches
from federation.protocol.types import Address, BrokerId

ViewDigest = tuple[frozenset[Address], BrokerId, tuple[tuple[str, BrokerId], ...] | tuple[tuple[str, int]]]
"""(members, management core, topic cores: sorted (filter, core) pairs, or ("fingerprint", n) for a view whose
cores are told apart by a number and read from their source when views agree)"""
"""(members, management core, sorted topic cores): what must agree across a component."""


def matching_filter(filter_: str) -> str | None:
    """The filter a subscription is matched with (`$share/<group>/` stripped); None if it never federates."""
    return federated_filter(filter_)


class GroundTruth:
    def __init__(self, names: Sequence[str], addresses: Mapping[str, Address], settle: float) -> None:
        self.names = list(names)
        self.addresses = dict(addresses)
        self.settle = settle
        self.alive: set[str] = set()
        self.components: list[frozenset[str]] = []
        self.component_of: dict[str, int] = {}
        self.component_addresses: list[frozenset[Address]] = []
        self.subscriptions: dict[str, dict[tuple[str, str], float]] = {name: {} for name in self.names}
        """node -> (client, raw filter) -> time the subscription was made"""
        self.filters_ever: set[str] = set()
        self.last_disruption = 0.0
        """the start at t=0 counts as a disruption"""
        self.disturbed_at: dict[str, float] = {name: 0.0 for name in self.names}
        self.loss_active = False

    # ------------------------------------------------------------ topology

    def set_topology(self, alive: Iterable[str], links: Iterable[tuple[str, str]]) -> None:
        """Recompute the connected components from the alive nodes and the links uncut both ways."""
        self.alive = set(alive)
        adjacency: dict[str, list[str]] = {name: [] for name in self.alive}
        for a, b in links:
            if a in self.alive and b in self.alive:
                adjacency[a].append(b)
                adjacency[b].append(a)
        seen: set[str] = set()
        components: list[frozenset[str]] = []
        for name in self.names:
            if name not in self.alive or name in seen:
                continue
            stack = [name]
            seen.add(name)
            members = []
            while stack:
                current = stack.pop()
                members.append(current)
                for other in adjacency[current]:
                    if other not in seen:
                        seen.add(other)
                        stack.append(other)
            components.append(frozenset(members))
        self.components = components
        self.component_of = {name: index for index, component in enumerate(components) for name in component}
        self.component_addresses = [frozenset(self.addresses[name] for name in component)
                                    for component in components]

    def disrupt(self, now: float, touched: Iterable[str]) -> None:
        """Note a disruption at `now` that touched these nodes' components (call before and after the change)."""
        self.last_disruption = now
        components: set[int] = set()
        for name in touched:
            index = self.component_of.get(name)
            if index is None:
                self.disturbed_at[name] = now
            else:
                components.add(index)
        for index in components:  # each component once, however many of its nodes were touched
            for member in self.components[index]:
                self.disturbed_at[member] = now

    def quiet_components(self, now: float) -> list[int]:
        """Indexes of the components none of whose nodes was disturbed in the last `settle` seconds."""
        return [index for index, component in enumerate(self.components)
                if all(self.disturbed_at[name] <= now - self.settle for name in component)]

    # ------------------------------------------------------------ subscriptions

    def subscribe(self, name: str, client: str, filter_: str, now: float) -> None:
        self.subscriptions[name].setdefault((client, filter_), now)
        federated = matching_filter(filter_)
        if federated is not None:
            self.filters_ever.add(federated)

    def unsubscribe(self, name: str, client: str, filter_: str) -> None:
        self.subscriptions[name].pop((client, filter_), None)

    def disconnect(self, name: str, client: str) -> None:
        table = self.subscriptions[name]
        for key in [key for key in table if key[0] == client]:
            del table[key]

    def active(self, name: str) -> list[tuple[str, str, float]]:
        """(client, filter, since) of the node's active subscriptions, sorted."""
        return sorted((client, filter_, since) for (client, filter_), since in self.subscriptions[name].items())

    def matching_since(self, name: str, topic: str, shared: bool = True) -> float | None:
        """When the node's oldest active subscription matching `topic` was made; None if none matches.
        `shared`: count shared subscriptions too."""
        best: float | None = None
        for (_, filter_), since in self.subscriptions[name].items():
            if not shared and filter_.startswith(SHARE_PREFIX):
                continue
            federated = matching_filter(filter_)
            if federated is not None and matches(federated, topic) and (best is None or since < best):
                best = since
        return best

    def subscribed(self, name: str, topic: str) -> bool:
        return self.matching_since(name, topic) is not None

    def filters_matching(self, topic: str) -> int:
        """How many distinct federated filters subscribed at any time in the run match `topic`."""
        return sum(1 for federated in self.filters_ever if matches(federated, topic))

    def needed_filters(self, component: Iterable[str]) -> set[str]:
        """Federated filters with an active subscriber in the component."""
        needed: set[str] = set()
        for name in component:
            for (_, filter_) in self.subscriptions[name]:
                federated = matching_filter(filter_)
                if federated is not None and not filter_.startswith(SHARE_PREFIX):
                    needed.add(federated)
        return needed

    # ------------------------------------------------------------ the expected-delivery rule

    def in_bound(self, now: float) -> bool:
        return not self.loss_active and self.last_disruption <= now - self.settle

    def expected(self, origin: str, topic: str, now: float, retain: bool = False) -> tuple[bool, frozenset[str]]:
        """(in bound, expected subscriber nodes) for a publication made now; see the module docstring. A retained
        one is expected at every other node of the component, subscribed or not (each broker stores it)."""
        if not self.in_bound(now) or origin not in self.component_of:
            return False, frozenset()
        component = self.components[self.component_of[origin]]
        if retain:
            return True, frozenset(name for name in component if name != origin)
        expected = set()
        for name in component:
            if name == origin:
                continue
            since = self.matching_since(name, topic, shared=False)
            if since is not None and since <= now - self.settle:
                expected.add(name)
        return True, frozenset(expected)


@dataclass
class Phase:
    parts: list[str]
    """what happened, e.g. ["cut n1-n4", "kill n7"]"""
    at: float
    settled_at: float | None = None

    @property
    def label(self) -> str:
        """"start", or e.g. "cut n1-n4, kill n7 @12.0s"."""
        if self.parts == ["start"]:
            return "start"
        return f"{', '.join(self.parts)} @{self.at}s"


class ConvergenceTracker:
    """Interned node views, compared with the ground truth at most once per instant."""

    def __init__(self, truth: GroundTruth) -> None:
        self.truth = truth
        self.phases: list[Phase] = []
        self.dirty = True
        self._ids: dict[ViewDigest, int] = {}
        self._digests: dict[int, ViewDigest] = {}
        self._refcount: Counter[int] = Counter()
        self._next_id = 0
        self._node_digest: dict[str, int] = {}
        self._broker_ids: dict[str, BrokerId] = {}
        self._sources: dict[int, Callable[[], Mapping[str, BrokerId]]] = {}
        """digest id -> where its cores come from, for views told apart by a fingerprint"""

    # ------------------------------------------------------------ views

    def update_view(self, name: str, broker_id: BrokerId, members: frozenset[Address], management_core: BrokerId,
                    topic_cores: Mapping[str, BrokerId] | Callable[[], Mapping[str, BrokerId]],
                    fingerprint: int | None = None) -> None:
        """A node's view. Its topic cores are a mapping, or (with `fingerprint`, the view's cores told apart by a
        number) a function that gives them when views agree: the simulator's nodes hold thousands of cores, and
        building and comparing every node's whole map at each of its changes dominated large runs."""
        if fingerprint is None:
            assert not callable(topic_cores)
            digest: ViewDigest = (members, management_core, tuple(sorted(topic_cores.items())))
        else:
            assert callable(topic_cores)
            digest = (members, management_core, (("fingerprint", fingerprint),))
        self._release(name)
        digest_id = self._ids.get(digest)
        if digest_id is None:
            self._next_id += 1
            digest_id = self._next_id
            self._ids[digest] = digest_id
            self._digests[digest_id] = digest
        if fingerprint is not None:
            assert callable(topic_cores)
            self._sources[digest_id] = topic_cores
        self._node_digest[name] = digest_id
        self._refcount[digest_id] += 1
        self._broker_ids[name] = broker_id
        self.dirty = True

    def remove_view(self, name: str) -> None:
        self._release(name)
        self._broker_ids.pop(name, None)
        self.dirty = True

    def _release(self, name: str) -> None:
        old = self._node_digest.pop(name, None)
        if old is None:
            return
        self._refcount[old] -= 1
        if self._refcount[old] == 0:
            del self._refcount[old]
            del self._ids[self._digests.pop(old)]
            self._sources.pop(old, None)

    def view_of(self, name: str) -> ViewDigest | None:
        digest_id = self._node_digest.get(name)
        return None if digest_id is None else self._digests[digest_id]

    # ------------------------------------------------------------ phases

    def begin_phase(self, what: str, at: float) -> None:
        """A disruption at `at` ("start" at t=0); disruptions at the same instant share one phase."""
        if self.phases and self.phases[-1].at == at and self.phases[-1].settled_at is None:
            self.phases[-1].parts.append(what)
        else:
            self.phases.append(Phase([what], at))
        self.dirty = True

    def check(self, now: float) -> None:
        """Record the current phase as settled if the views changed and now agree with the truth."""
        if not self.dirty:
            return
        self.dirty = False
        if not self.phases or self.phases[-1].settled_at is not None:
            return
        if self.converged():
            self.phases[-1].settled_at = now

    # ------------------------------------------------------------ agreement

    def converged(self) -> bool:
        components = self.truth.components
        if len(self._refcount) != len(components):
            return False
        return all(self.component_problem(index) is None for index in range(len(components)))

    def component_problem(self, index: int) -> str | None:
        """Why component `index` has not converged, or None if it has."""
        truth = self.truth
        component = truth.components[index]
        names = sorted(component)
        digest_ids = {self._node_digest.get(name) for name in names}
        if None in digest_ids:
            return f"no view yet from {', '.join(n for n in names if n not in self._node_digest)}"
        if len(digest_ids) != 1:
            groups: dict[int | None, list[str]] = {}
            for name in names:
                groups.setdefault(self._node_digest.get(name), []).append(name)
            listing = "; ".join(", ".join(group) for _, group in sorted(groups.items(), key=lambda g: g[1]))
            return f"views differ between groups: {listing}"
        digest_id = self._node_digest[names[0]]
        members, management_core, cores = self._digests[digest_id]
        source = self._sources.get(digest_id)
        if source is not None:
            cores = tuple(source().items())
        expected_members = truth.component_addresses[index]
        if members != expected_members:
            extra = sorted(str(a) for a in members - expected_members)
            missing = sorted(str(a) for a in expected_members - members)
            return f"members differ from the component: extra {extra}, missing {missing}"
        ids = {self._broker_ids[name] for name in names}
        lowest = min(ids)
        if management_core != lowest:
            return f"management core is {management_core}, expected the lowest id {lowest}"
        serving = ServingCores(dict(cores))
        for federated in sorted(truth.needed_filters(component)):
            core = serving(federated)
            if core is None:
                return f"no topic core for subscribed filter {federated!r}"
            if core not in ids:
                return f"topic core {core} for {federated!r} is not a current node of the component"
        return None
