"""Where a publication goes next on one topic's mesh: the decision, a cache of it per topic, and the
publications held while their topic has no core.

The mesh engine's layer that moves publications (`federation.protocol.topics`
says how its three layers fit together; `federation.protocol.cores` decides
the cores, `federation.protocol.mesh` builds the meshes).

Theory of operation
-------------------
A publication on topic T goes to every mesh whose filter matches T. Outside
the mesh it climbs toward the core through one parent (chosen with the
node's RNG, as in the seed); the first member it reaches spreads it to all
its mesh neighbours (parents and children) except the one it came from. Each
node handles a (publication, filter) pair once, so copies are bounded by the
mesh's links. A publication for a filter whose core is being (re)elected is
held for `publication_hold` seconds, then dropped and counted.

`route` runs once per publication and hop. What it decides (spread over the
mesh to these neighbours, climb toward the core through one of these
parents, hold, or drop for want of a route) depends only on the topic's
core, membership, parents and children, on the node's routes and id, and on
which neighbours are up. Those change with control traffic, a few times a
second at most; publications arrive by the thousand. So the decision is
computed once per topic and per neighbour the publication came from, and
kept with the inputs it was made from (`topics.ForwardingCache`); it is
used again only while every input is the very same object (or, for the
children, the same set of keys), so a change anywhere makes the next
publication compute it afresh. The random choice among parents is still
made per publication, with the node's RNG.

`route` says where the publication went (`Routed`): the node paces the
neighbour it came from when it went to a neighbour pacing us
(`federation.protocol.pacing`), and reliable forwarding counts a reroute
when it went anywhere. A QoS 1/2 copy it sends is tracked by reliable
forwarding (`track`), as a step of sending it.
"""

from __future__ import annotations

from enum import IntEnum

from federation.protocol import events
from federation.protocol.events import publication_text
from federation.protocol.topics import (
    HOLD,
    LEAF,
    NO_ROUTE,
    Decision,
    Forward,
    HeldPublication,
    TopicState,
    TopicTable,
)
from federation.protocol.types import Address
from federation.protocol.wire import MODE_IN_MESH, MODE_TOWARD_CORE, TOPIC_BATCH, TOPIC_MESSAGE
from federation.protocol.wire_types import TopicBatch, TopicMessage


class Routed(IntEnum):
    """Where `PublicationRouting.route` sent a publication (the larger, the further)."""

    NOT_SENT = 0
    """it ends here: at the edge of its mesh, or dropped for want of a route (reported)"""
    HELD = 1
    """held until its topic has a core (`publication_hold`)"""
    SENT = 2
    SENT_TO_PACED = 3
    """sent, and to a neighbour that paces us"""


NOT_SENT, HELD, SENT, SENT_TO_PACED = Routed.NOT_SENT, Routed.HELD, Routed.SENT, Routed.SENT_TO_PACED


class PublicationRouting(TopicTable):
    """The mesh engine's layer that moves publications: which filters carry a new one, where each goes next,
    and the publications held while their topic has no core (`publication_hold`, `max_held_publications`)."""

    # ------------------------------------------------------------ the decision

    def _decide(self, state: TopicState, from_announced: Address | None) -> Decision:
        """The decision for a publication on `state` (whose core is known) that came from `from_announced`."""
        transport_for = self._neighbours.transport_for
        if state.member:
            targets = set(state.parents) | set(state.children)
            targets.discard(from_announced)
            if not targets:
                return LEAF
            transports = [t for t in (transport_for(a) for a in sorted(targets)) if t is not None]
            if not transports:
                return Forward(MODE_IN_MESH, [], [], lost=len(targets))
            return Forward(MODE_IN_MESH, transports, [str(t) for t in transports],
                           lost=len(targets) - len(transports))
        parents = self.parents_for(state)
        if not (parents or state.parents or self.is_own_core(state)):
            return HOLD
        by_candidate = {}
        for candidate in sorted(set(parents) - {from_announced} if from_announced else set(parents)):
            transport = transport_for(candidate)
            if transport is not None:  # a parent just gone is no route
                by_candidate[candidate] = (transport, str(transport))
        if not by_candidate:
            return NO_ROUTE
        return Forward(MODE_TOWARD_CORE, [], [], candidates=list(by_candidate), by_candidate=by_candidate)

    def _decision(self, state: TopicState, from_announced: Address | None) -> Decision:
        """`_decide`, taken from the topic's cache while its inputs are unchanged."""
        cache = state.forwarding
        routes = self._table.routes
        core = state.core
        assert core is not None
        inputs = cache.inputs
        # Identity, not equality: a new object means something was recomputed; compare cheaply and start over.
        if (not inputs or inputs[0] is not core or inputs[1] is not state.parents or inputs[2] is not routes
                or inputs[3] is not self._neighbours.up_index or inputs[4] is not self._identity.broker_id
                or inputs[5] is not state.member or state.children.keys() != cache.children):
            cache.inputs = (core, state.parents, routes, self._neighbours.up_index, self._identity.broker_id,
                            state.member)
            cache.children = frozenset(state.children)
            cache.decisions = {}
        else:
            decision = cache.decisions.get(from_announced)
            if decision is not None:
                return decision
        decision = self._decide(state, from_announced)
        if state.member or routes.next_hops.get(core.address):
            # Not kept when the parents came from the `tc` senders (`state.via`), which are no input here.
            cache.decisions[from_announced] = decision
        return decision

    # ------------------------------------------------------------ moving publications

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
        return self.is_own_core(state) or state.member or bool(state.parents) or bool(self.parents_for(state))

    def route(self, state: TopicState, message: TopicMessage, from_announced: Address | None, now: float,
              pub_text: str | None = None) -> Routed:
        """Send a publication on (`from_announced`: where it came from, None for a local one or a held one)
        and say where it went. `pub_text` is its `publication_text`, when the caller has made it already."""
        if state.core is None:
            return self._hold(state, message, now)
        decision = self._decision(state, from_announced)
        if type(decision) is not Forward:
            if decision is HOLD:
                return self._hold(state, message, now)
            if decision is NO_ROUTE:
                self._report_no_route(state, message, now, pub_text)
            return NOT_SENT  # LEAF: the publication ends here
        mode = decision.mode
        transports, texts = self._next_hops(decision, 1)
        if not transports:
            self._report_no_route(state, message, now, pub_text)
            return NOT_SENT
        hops = message.hops + 1 if from_announced is not None else message.hops
        if mode == message.mode and hops == message.hops:
            outgoing = message  # a new local publication goes out as made
        else:
            outgoing = TopicMessage(message.filter, message.origin, message.epoch, message.seq, mode, hops,
                                    message.topic, message.payload, message.qos, message.retain, message.properties)
        if outgoing.qos:
            self._track(outgoing, transports)  # retransmitted until the next hop acknowledges it
        outbox = self._outbox
        outbox.send(TOPIC_MESSAGE, outgoing, transports)
        outbox.counters["publications_forwarded"] += 1
        if outbox.publication_events:
            outbox.emit(events.PUBLICATION_FORWARDED, now, pub=pub_text or publication_text(message.publication),
                        filter=state.filter, to=texts, mode="mesh" if mode == MODE_IN_MESH else "toward_core")
        paced_by = self._paced_by
        if paced_by and not paced_by.keys().isdisjoint(transports):
            return SENT_TO_PACED
        return SENT

    def route_batch(self, state: TopicState, batch: TopicBatch, from_announced: Address | None,
                    now: float) -> Routed:
        """`route` for a run of publications (federation.protocol.publications): one decision and one `tb` for
        the run; where the run cannot go on whole (no core, no route), each publication is routed alone."""
        decision = self._decision(state, from_announced) if state.core is not None else HOLD
        if decision is LEAF:
            return NOT_SENT
        if type(decision) is not Forward or (decision.mode == MODE_IN_MESH and not decision.transports):
            furthest = NOT_SENT
            for message in batch.messages():
                furthest = max(furthest, self.route(state, message, from_announced, now))
            return furthest
        count = len(batch)
        mode = decision.mode
        transports, texts = self._next_hops(decision, count)
        hops = batch.hops + 1 if from_announced is not None else batch.hops
        if mode != batch.mode or hops != batch.hops:
            batch = TopicBatch(batch.filter, batch.origin, batch.epoch, mode, hops, batch.items)
        outbox = self._outbox
        outbox.send(TOPIC_BATCH, batch, transports)
        outbox.counters["publications_forwarded"] += count
        if outbox.publication_events:
            origin, epoch = batch.origin, batch.epoch
            mode_text = "mesh" if mode == MODE_IN_MESH else "toward_core"
            for seq in batch.items[::3]:
                outbox.emit(events.PUBLICATION_FORWARDED, now, pub=publication_text((origin, epoch, seq)),
                            filter=state.filter, to=texts, mode=mode_text)
        paced_by = self._paced_by
        if paced_by and not paced_by.keys().isdisjoint(transports):
            return SENT_TO_PACED
        return SENT

    def route_again(self, message: TopicMessage, now: float) -> bool | None:
        """Route a publication again from here, as a new one (reliable forwarding's reroute, when a next hop
        went down): True when it was sent on or held, False when the mesh has no way for it yet, None when
        its filter has no topic any more."""
        state = self.topics.get(message.filter)
        if state is None:
            return None
        return self.route(state, message, None, now) is not NOT_SENT

    def _next_hops(self, decision: Forward, publications: int) -> tuple[list[Address], list[str]]:
        """The transports (and their texts) `decision` sends `publications` to now: one parent drawn with the
        node's RNG toward the core, or every up mesh neighbour; empty when every mesh neighbour is down."""
        if decision.mode == MODE_TOWARD_CORE:
            assert decision.candidates is not None and decision.by_candidate is not None
            transport, text = decision.by_candidate[self._rng.choice(decision.candidates)]
            return [transport], [text]
        if decision.lost:
            # Mesh neighbours that went down before the routes were recomputed: those copies are lost.
            self._outbox.drop("mesh_copy_neighbour_down", decision.lost * publications)
        return decision.transports, decision.texts

    def _report_no_route(self, state: TopicState, message: TopicMessage, now: float, pub_text: str | None) -> None:
        self._outbox.drop("publication_no_route", event=events.PUBLICATION_DROPPED, now=now,
                          pub=pub_text or publication_text(message.publication), filter=state.filter,
                          reason="no_route")

    # ------------------------------------------------------------ held publications

    def _hold(self, state: TopicState, message: TopicMessage, now: float) -> Routed:
        if self.held_count >= self._settings.max_held_publications:
            self._drop_oldest_held(now)
        state.held.append(HeldPublication(now + self._settings.publication_hold, message))
        self.held_count += 1
        return HELD

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
        self._outbox.drop(f"publication_{reason}", event=events.PUBLICATION_DROPPED, now=now,
                          pub=publication_text(message.publication), filter=state.filter, reason=reason)

    def expire_held(self, now: float) -> None:
        for state in list(self.topics.values()):
            while state.held and state.held[0].deadline <= now:
                item = state.held.popleft()
                self.held_count -= 1
                self._report_held_drop(state, item.message, now, "no_core")
            if not state.held:
                self.dirty.add(state.filter)
