"""Where a publication goes next on one topic's mesh: the decision, and a cache of it per topic.

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

from federation.wire import MODE_IN_MESH, MODE_TOWARD_CORE

if TYPE_CHECKING:
    from federation.mesh import MeshEngine, TopicState
    from federation.types import Address


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


def decide(engine: MeshEngine, state: TopicState, from_announced: Address | None) -> Decision:
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
    candidates = [c for c in sorted(set(parents) - {from_announced} if from_announced else set(parents))
                  if transport_for(c) is not None]  # a parent just gone is no route
    if not candidates:
        return NO_ROUTE
    by_candidate = {}
    for candidate in candidates:
        transport = transport_for(candidate)
        assert transport is not None
        by_candidate[candidate] = (transport, str(transport))
    return Forward(MODE_TOWARD_CORE, [], [], candidates=candidates, by_candidate=by_candidate)


class ForwardingCache:
    """The decisions of one topic, valid while their inputs are unchanged."""

    __slots__ = ("inputs", "children", "decisions")

    def __init__(self) -> None:
        self.inputs: tuple[object, ...] = ()
        self.children: frozenset[Address] = frozenset()
        self.decisions: dict[Address | None, Decision] = {}

    def lookup(self, engine: MeshEngine, state: TopicState, from_announced: Address | None) -> Decision:
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
