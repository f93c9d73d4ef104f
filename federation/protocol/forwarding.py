"""Where a publication goes next on one topic's mesh: the decision, a cache of it per topic, and the
publications held while their topic has no core (`PublicationRouting`, the part of `MeshEngine` that
moves publications; the rest of `federation.protocol.mesh` builds the cores and meshes they move on).

Theory of operation: `MeshEngine.route` runs once per publication and hop.
What it decides (spread over the mesh to these neighbours, climb toward the
core through one of these parents, hold, or drop for want of a route)
depends only on the topic's core, membership, parents and children, on the
node's routes and id, and on which neighbours are up. Those change with
control traffic, a few times a second at most; publications arrive by the
thousand. So the decision is computed once per topic and per neighbour the
publication came from, and kept with the inputs it was made from; it is
used again only while every input is the very same object (or, for the
children, the same set of keys), so a change anywhere makes the next
publication compute it afresh. The random choice among parents is still
made per publication, with the node's RNG, exactly as before, so the
simulator's runs do not change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from federation.protocol import events
from federation.protocol.events import publication_text
from federation.protocol.wire import (
    MODE_IN_MESH,
    MODE_TOWARD_CORE,
    TOPIC_BATCH,
    TOPIC_MESSAGE,
    TopicBatch,
    TopicMessage,
)

if TYPE_CHECKING:
    from federation.protocol.mesh import TopicState
    from federation.protocol.modes import ModePolicy
    from federation.protocol.node import Node
    from federation.protocol.types import Address


@dataclass
class HeldPublication:
    deadline: float
    message: TopicMessage


@dataclass(slots=True)
class Forward:
    """Send to `transports` (mode in-mesh), or to one of `candidates` (mode toward the core)."""

    mode: int
    transports: list[Address]
    """in-mesh: the up mesh neighbours' transports, sorted by announced address"""
    texts: list[str]
    """`str` of each transport, for the `publication_forwarded` event"""
    lost: int = 0
    """in-mesh: mesh neighbours already down (their copies are counted as lost)"""
    candidates: list[Address] | None = None
    """toward the core: the up parents (announced addresses), one chosen per publication"""
    by_candidate: dict[Address, tuple[Address, str]] | None = None
    """candidate -> (its transport, its text)"""


LEAF = "leaf"
"""a mesh member with nobody else to send to: the publication ends here"""
HOLD = "hold"
"""no route toward the core yet: hold the publication"""
NO_ROUTE = "no_route"
"""parents exist but none is up: drop and report"""

Decision = Forward | str


def decide(engine: PublicationRouting, state: TopicState, from_announced: Address | None) -> Decision:
    """The decision for a publication on `state` (whose core is known) that came from `from_announced`."""
    node = engine.node
    transport_for = node.neighbours.transport_for
    if state.member:
        targets = set(state.parents) | set(state.children)
        targets.discard(from_announced)  # type: ignore[arg-type]
        if not targets:
            return LEAF
        transports = [t for t in (transport_for(a) for a in sorted(targets)) if t is not None]
        if not transports:
            return Forward(MODE_IN_MESH, [], [], lost=len(targets))
        return Forward(MODE_IN_MESH, transports, [str(t) for t in transports], lost=len(targets) - len(transports))
    parents = engine._parents(state)
    if not (parents or state.parents or engine.is_own_core(state)):
        return HOLD
    by_candidate = {}
    for candidate in sorted(set(parents) - {from_announced} if from_announced else set(parents)):
        transport = transport_for(candidate)
        if transport is not None:  # a parent just gone is no route
            by_candidate[candidate] = (transport, str(transport))
    if not by_candidate:
        return NO_ROUTE
    return Forward(MODE_TOWARD_CORE, [], [], candidates=list(by_candidate), by_candidate=by_candidate)


class ForwardingCache:
    """The decisions of one topic, valid while their inputs are unchanged."""

    __slots__ = ("inputs", "children", "decisions")

    def __init__(self) -> None:
        self.inputs: tuple[object, ...] = ()
        self.children: frozenset[Address] = frozenset()
        self.decisions: dict[Address | None, Decision] = {}

    def lookup(self, engine: PublicationRouting, state: TopicState, from_announced: Address | None) -> Decision:
        node = engine.node
        routes = node.routes
        core = state.core
        assert core is not None
        inputs = self.inputs
        # Identity, not equality: a new object means something was recomputed; compare cheaply and start over.
        if (not inputs or inputs[0] is not core or inputs[1] is not state.parents or inputs[2] is not routes
                or inputs[3] is not node.neighbours.up_index or inputs[4] is not node.broker_id
                or inputs[5] is not state.member or state.children.keys() != self.children):
            self.inputs = (core, state.parents, routes, node.neighbours.up_index, node.broker_id, state.member)
            self.children = frozenset(state.children)
            self.decisions = {}
        else:
            decision = self.decisions.get(from_announced)
            if decision is not None:
                return decision
        decision = decide(engine, state, from_announced)
        if state.member or routes.next_hops.get(core.address):
            # Not kept when the parents came from the `tc` senders (`state.via`), which are no input here.
            self.decisions[from_announced] = decision
        return decision


class PublicationRouting:
    """`MeshEngine`'s part that moves publications: which filters carry a new one, where each goes next,
    and the publications held while their topic has no core (`publication_hold`, `max_held_publications`)."""

    node: Node
    topics: dict[str, TopicState]
    dirty: set[str]
    policy: ModePolicy
    held_count: int

    if TYPE_CHECKING:
        def is_own_core(self, state: TopicState) -> bool: ...
        def _parents(self, state: TopicState) -> tuple[Address, ...]: ...

    def publication_filters(self, matching: list[str]) -> list[str]:
        """The filters a new local publication is sent on: a replicated filter's tree reaches every broker,
        so when one matches and can route, it alone carries the publication; else every matching filter."""
        if self.policy.replicated:
            for filter_ in matching:
                state = self.topics.get(filter_)
                if state is not None and self.policy.is_replicated(filter_) and self._routable(state):
                    return [filter_]
        return matching

    def _routable(self, state: TopicState) -> bool:
        if state.core is None:
            return False
        return self.is_own_core(state) or state.member or bool(state.parents) or bool(self._parents(state))

    def route(self, state: TopicState, message: TopicMessage, from_announced: Address | None, now: float,
              pub_text: str | None = None) -> None:
        """Send a publication on (`from_announced`: where it came from, None for a local one or a held one).
        `pub_text` is its `publication_text`, when the caller has made it already."""
        node = self.node
        if state.core is None:
            self._hold(state, message, now)
            return
        decision = state.forwarding.lookup(self, state, from_announced)
        if type(decision) is not Forward:
            if decision is HOLD:
                self._hold(state, message, now)
            elif decision is NO_ROUTE:
                self._report_no_route(state, message, now, pub_text)
            return  # LEAF: the publication ends here
        mode = decision.mode
        transports, texts = self._next_hops(decision, 1)
        if not transports:
            self._report_no_route(state, message, now, pub_text)
            return
        hops = message.hops + 1 if from_announced is not None else message.hops
        if mode == message.mode and hops == message.hops:
            outgoing = message  # a new local publication goes out as made
        else:
            outgoing = TopicMessage(message.filter, message.origin, message.epoch, message.seq, mode, hops,
                                    message.topic, message.payload, message.qos, message.retain, message.properties)
        node.send(TOPIC_MESSAGE, outgoing, transports)
        node.counters["publications_forwarded"] += 1
        if node.publication_events:
            node.emit(events.PUBLICATION_FORWARDED, now, pub=pub_text or publication_text(message.publication),
                      filter=state.filter, to=texts, mode="mesh" if mode == MODE_IN_MESH else "toward_core")

    def route_batch(self, state: TopicState, batch: TopicBatch, from_announced: Address | None, now: float) -> None:
        """`route` for a run of publications (federation.protocol.publication_batch): one decision and one `tb` for the
        run; where the run cannot go on whole (no core, no route), each publication is routed alone."""
        node = self.node
        decision = state.forwarding.lookup(self, state, from_announced) if state.core is not None else HOLD
        if decision is LEAF:
            return
        if type(decision) is not Forward or (decision.mode == MODE_IN_MESH and not decision.transports):
            for message in batch.messages():
                self.route(state, message, from_announced, now)
            return
        count = len(batch)
        mode = decision.mode
        transports, texts = self._next_hops(decision, count)
        hops = batch.hops + 1 if from_announced is not None else batch.hops
        if mode != batch.mode or hops != batch.hops:
            batch = TopicBatch(batch.filter, batch.origin, batch.epoch, mode, hops, batch.items)
        node.send(TOPIC_BATCH, batch, transports)
        node.counters["publications_forwarded"] += count
        if node.publication_events:
            origin, epoch = batch.origin, batch.epoch
            mode_text = "mesh" if mode == MODE_IN_MESH else "toward_core"
            for seq in batch.items[::3]:
                node.emit(events.PUBLICATION_FORWARDED, now, pub=publication_text((origin, epoch, seq)),
                          filter=state.filter, to=texts, mode=mode_text)

    def _next_hops(self, decision: Forward, publications: int) -> tuple[list[Address], list[str]]:
        """The transports (and their texts) `decision` sends `publications` to now: one parent drawn with the
        node's RNG toward the core, or every up mesh neighbour; empty when every mesh neighbour is down."""
        if decision.mode == MODE_TOWARD_CORE:
            assert decision.candidates is not None and decision.by_candidate is not None
            transport, text = decision.by_candidate[self.node.rng.choice(decision.candidates)]
            return [transport], [text]
        if decision.lost:
            # Mesh neighbours that went down before the routes were recomputed: those copies are lost.
            self.node.drops["mesh_copy_neighbour_down"] += decision.lost * publications
        return decision.transports, decision.texts

    def _report_no_route(self, state: TopicState, message: TopicMessage, now: float, pub_text: str | None) -> None:
        self.node.emit(events.PUBLICATION_DROPPED, now, pub=pub_text or publication_text(message.publication),
                       filter=state.filter, reason="no_route")
        self.node.count_drop("publication_no_route")

    def _hold(self, state: TopicState, message: TopicMessage, now: float) -> None:
        node = self.node
        if self.held_count >= node.settings.max_held_publications:
            self._drop_oldest_held(now)
        state.held.append(HeldPublication(now + node.settings.publication_hold, message))
        self.held_count += 1

    def _drop_oldest_held(self, now: float) -> None:
        oldest: TopicState | None = None
        for state in self.topics.values():
            if state.held and (oldest is None or state.held[0].deadline < oldest.held[0].deadline):
                oldest = state
        if oldest is not None:
            item = oldest.held.popleft()
            self.held_count -= 1
            self._report_held_drop(oldest, item.message, now, "hold_overflow")

    def _report_held_drop(self, state: TopicState, message: TopicMessage, now: float, reason: str) -> None:
        self.node.count_drop(f"publication_{reason}")
        self.node.emit(events.PUBLICATION_DROPPED, now, pub=publication_text(message.publication),
                       filter=state.filter, reason=reason)

    def expire_held(self, now: float) -> None:
        for state in list(self.topics.values()):
            while state.held and state.held[0].deadline <= now:
                item = state.held.popleft()
                self.held_count -= 1
                self._report_held_drop(state, item.message, now, "no_core")
            if not state.held:
                self.dirty.add(state.filter)
