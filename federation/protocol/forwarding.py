"""Where a publication goes next on one topic's mesh: the decision, a cache of it per topic, and the
publications held while their topic has no core.

The mesh engine's layer that moves publications (`federation.protocol.topics`
says how its three layers fit together; `federation.protocol.cores` decides
the cores, `federation.protocol.mesh` builds the meshes).

Theory of operation
-------------------
A publication on topic T goes to every mesh whose filter matches T. Outside
the mesh it climbs toward the core through one parent: the first up one in
id order, so that one origin's publications on one filter take one path
while the parents do not change (docs/protocol.md rule 7d: a path per
stream keeps them in order; the other parents are the failover); the first
member it reaches spreads it to all its mesh neighbours (its data parents
and its children, not the standby parents: `federation.protocol.mesh`)
except the one it came from. Each node handles a (publication,
filter) pair once, so copies are bounded by the mesh's links.

A publication for a filter whose core is being (re)elected, or whose
parents are all down, is held. QoS 0 is held for `publication_hold`
seconds, then dropped and counted; QoS 1/2 is held until it can go on
(custody, federation.protocol.custody, waits for it meanwhile). The hold is
bounded (`max_held_publications`, `max_held_bytes`): beyond it the oldest
QoS 0 publication goes first, then the oldest QoS 1/2 one held for a
neighbour (given back unacknowledged: that neighbour still has it and
sends it again); the node's own QoS 1/2 publications are never dropped
(the embedder stops reading its broker instead, `Node.unacked_copies`).

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
publication compute it afresh.

`route` says where the publication went (`Routed`): the node paces the
neighbour it came from when it went to a neighbour pacing us
(`federation.protocol.pacing`). A QoS 1/2 copy it sends is tracked (`track`:
reliable forwarding and custody), as a step of sending it, and so is a copy
for a mesh neighbour that is down (kept for it: it may come back; where the
origin's end-to-end custody covers the filter, rule 7f, that copy holds no
custody: `ReliableDelivery.track`); a QoS 1/2 publication it holds is told
to custody (`held`, `unheld`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from enum import IntEnum

from federation.protocol import events
from federation.protocol.events import publication_text
from federation.protocol.modes import RETAINED_FILTER
from federation.protocol.topics import (
    HOLD,
    INFINITY,
    LEAF,
    NO_ROUTE,
    NOTHING_HELD,
    Decision,
    Forward,
    ForwardingCache,
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
    """held until its topic has a core or a route (QoS 0: `publication_hold` at most)"""
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
            targets = set(state.data_parents) | set(state.children)  # standby parents carry nothing
            targets.discard(from_announced)
            if not targets:
                return LEAF
            transports = []
            missing = []
            for target in sorted(targets):
                transport = transport_for(target)
                if transport is not None:
                    transports.append(transport)
                else:
                    missing.append(target)
            down = None
            if missing:  # mesh neighbours down: QoS 1/2 copies are kept for them (they may come back)
                by_announced = {n.announced.address: n.transport for n in self._neighbours.all()
                                if n.announced is not None}
                down = [by_announced[target] for target in missing if target in by_announced]
            return Forward(MODE_IN_MESH, transports, [str(t) for t in transports], lost=len(missing), down=down)
        parents = self.parents_for(state)
        if not (parents or state.parents or self.is_own_core(state)):
            return HOLD
        for parent in parents:  # lowest id first: one path per stream while the parents stay
            if parent != from_announced:
                transport = transport_for(parent)
                if transport is not None:  # a parent just gone is no route
                    return Forward(MODE_TOWARD_CORE, [transport], [str(transport)])
        return NO_ROUTE

    def _decision(self, state: TopicState, from_announced: Address | None) -> Decision:
        """`_decide`, taken from the topic's cache while its inputs are unchanged."""
        cache = state.forwarding
        if cache is None:  # made on the first publication: most topics a node knows never see one
            cache = state.forwarding = ForwardingCache()
        routes = self._table.routes
        core = state.core
        assert core is not None
        inputs = cache.inputs
        # Identity, not equality: a new object means something was recomputed; compare cheaply and start over.
        if (not inputs or inputs[0] is not core or inputs[1] is not state.parents or inputs[2] is not routes
                or inputs[3] is not self._neighbours.up_index or inputs[4] is not self._identity.broker_id
                or inputs[5] is not state.member or inputs[6] is not state.data_parents
                or state.children.keys() != cache.children):
            cache.inputs = (core, state.parents, routes, self._neighbours.up_index, self._identity.broker_id,
                            state.member, state.data_parents)
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
        so when one matches and can route, it alone carries the publication; else every matching filter.
        A retained publication's list starts with `RETAINED_FILTER` (`Publications.local_publish`)."""
        if matching and matching[0] == RETAINED_FILTER:
            state = self.topics.get(RETAINED_FILTER)
            if state is not None and self._routable(state):
                return [RETAINED_FILTER]
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

    def route(self, state: TopicState, message: TopicMessage, from_announced: Address | None,
              now: float) -> Routed:
        """Send a publication on (`from_announced`: where it came from, None for a local one or one routed again)
        and say where it went."""
        if state.core is None:
            if message.qos and state.withdrawn_at > state.lost_at:
                return NOT_SENT  # its core withdrew (nobody subscribes): nothing to wait for
            return self._hold(state, message, from_announced, now)
        if message.mode == MODE_IN_MESH and from_announced is not None and not state.member:
            return NOT_SENT  # a mesh neighbour's copy that reached us after we left its mesh: nobody beyond us wants it
        decision = self._decision(state, from_announced)
        if type(decision) is not Forward:
            if decision is HOLD or (decision is NO_ROUTE and message.qos):
                return self._hold(state, message, from_announced, now)
            if decision is NO_ROUTE:
                self._report_no_route(state, message, now)
            return NOT_SENT  # LEAF: the publication ends here
        mode = decision.mode
        transports, texts = decision.transports, decision.texts
        hops = message.hops + 1 if from_announced is not None else message.hops
        if mode == message.mode and hops == message.hops:
            outgoing = message  # a new local publication goes out as made
        else:
            outgoing = TopicMessage(message.filter, message.origin, message.epoch, message.seq, mode, hops,
                                    message.topic, message.payload, message.qos, message.retain, message.properties,
                                    message.prev)
        outbox = self._outbox
        if outgoing.qos:
            down = decision.down
            if down:  # kept for mesh neighbours that are down: sent when they come back
                self._track([outgoing], down)
            if not transports:
                return HELD if down else self._hold(state, message, None, now)
            self._track([outgoing], transports)  # retransmitted until the next hop acknowledges it
        else:
            if decision.lost:  # QoS 0 copies for mesh neighbours that went down before the routes were recomputed
                outbox.drop("mesh_copy_neighbour_down", decision.lost)
            if not transports:
                self._report_no_route(state, message, now)
                return NOT_SENT
        outbox.send(TOPIC_MESSAGE, outgoing, transports)
        outbox.counters["publications_forwarded"] += 1
        if outbox.publication_events:
            outbox.runs.forwarded(now, message.origin, message.epoch, message.seq, state.filter, texts, mode)
        paced_by = self._paced_by
        if paced_by and not paced_by.keys().isdisjoint(transports):
            return SENT_TO_PACED
        return SENT

    def route_batch(self, state: TopicState, batch: TopicBatch, from_announced: Address | None,
                    now: float) -> Routed:
        """`route` for a run of publications (federation.protocol.publications): one decision and one `tb` for
        the run; where the run cannot go on whole (no core, no route), each publication is routed alone."""
        if batch.mode == MODE_IN_MESH and from_announced is not None and not state.member and state.core is not None:
            return NOT_SENT  # as `route`: we left the mesh this run was spreading through
        decision = self._decision(state, from_announced) if state.core is not None else HOLD
        if decision is LEAF:
            return NOT_SENT
        if type(decision) is not Forward or not decision.transports:
            furthest = NOT_SENT
            for message in batch.messages():
                furthest = max(furthest, self.route(state, message, from_announced, now))
            return furthest
        count = len(batch)
        mode = decision.mode
        transports, texts = decision.transports, decision.texts
        if decision.lost:
            # Mesh neighbours that went down before the routes were recomputed: those copies are lost.
            self._outbox.drop("mesh_copy_neighbour_down", decision.lost * count)
        hops = batch.hops + 1 if from_announced is not None else batch.hops
        if mode != batch.mode or hops != batch.hops:
            batch = TopicBatch(batch.filter, batch.origin, batch.epoch, mode, hops, batch.items)
        outbox = self._outbox
        outbox.send(TOPIC_BATCH, batch, transports)
        outbox.counters["publications_forwarded"] += count
        if outbox.publication_events:
            outbox.runs.forwarded_run(now, batch.origin, batch.epoch, batch.items[::3], state.filter, texts, mode)
        paced_by = self._paced_by
        if paced_by and not paced_by.keys().isdisjoint(transports):
            return SENT_TO_PACED
        return SENT

    def route_run(self, state: TopicState, messages: list[TopicMessage], from_announced: Address | None,
                  now: float) -> Routed:
        """`route` for a run of QoS 1/2 publications of one origin, epoch and filter, in seq order, none retained or
        with properties (docs/protocol.md rule 7e): one decision and `tq` runs, each copy tracked as `route` tracks
        it; where the run cannot go on whole (no core, no route, every mesh neighbour down) each goes alone."""
        if messages[0].mode == MODE_IN_MESH and from_announced is not None and not state.member \
                and state.core is not None:
            return NOT_SENT  # as `route`: we left the mesh this run was spreading through
        decision = self._decision(state, from_announced) if state.core is not None else HOLD
        if decision is LEAF:
            return NOT_SENT
        if type(decision) is not Forward or not decision.transports:
            furthest = NOT_SENT
            for message in messages:
                furthest = max(furthest, self.route(state, message, from_announced, now))
            return furthest
        mode = decision.mode
        transports = decision.transports
        first = messages[0]
        hops = first.hops + 1 if from_announced is not None else first.hops
        if mode != first.mode or hops != first.hops:
            messages = [TopicMessage(m.filter, m.origin, m.epoch, m.seq, mode, hops, m.topic, m.payload, m.qos,
                                     False, None, m.prev) for m in messages]
        # Each copy retransmitted until its next hop acknowledges it; those for mesh neighbours that are down kept
        # for them, sent when they come back (each publication's copies tracked together, as `route` does).
        self._track(messages, [*decision.down, *transports] if decision.down else transports)
        outbox = self._outbox
        outbox.send_run(messages, transports)
        outbox.counters["publications_forwarded"] += len(messages)
        if outbox.publication_events:
            outbox.runs.forwarded_run(now, first.origin, first.epoch, [message.seq for message in messages],
                                      state.filter, decision.texts, mode)
        paced_by = self._paced_by
        if paced_by and not paced_by.keys().isdisjoint(transports):
            return SENT_TO_PACED
        return SENT

    def route_again(self, message: TopicMessage, now: float, exclude: Address | None = None) -> Routed:
        """Route a QoS 1/2 publication again from here (reliable forwarding's reroute, when a next hop went down;
        a copy rerouted toward the core through us, `exclude` being its sender): as a new one, or held when
        the mesh has no way for it yet. NOT_SENT when it ends here (or its filter cannot be kept)."""
        state = self.state(message.filter)
        if state is None:
            self._outbox.drop("reroute_topics_full")
            return NOT_SENT
        return self.route(state, message, exclude, now)

    def is_mesh_neighbour(self, filter_: str, announced: Address) -> bool:
        """Are we in `filter_`'s mesh with `announced` as a parent or child publications cross (not a standby)?"""
        state = self.topics.get(filter_)
        return state is not None and state.member and (announced in state.children
                                                       or announced in state.data_parents)

    def is_member(self, filter_: str) -> bool:
        state = self.topics.get(filter_)
        return state is not None and state.member

    def _report_no_route(self, state: TopicState, message: TopicMessage, now: float) -> None:
        self._outbox.drop("publication_no_route", event=events.PUBLICATION_DROPPED, now=now,
                          pub=publication_text(message.publication), filter=state.filter,
                          reason="no_route")

    # ------------------------------------------------------------ held publications

    def _hold(self, state: TopicState, message: TopicMessage, source: Address | None, now: float) -> Routed:
        settings = self._settings
        size = len(message.payload) + len(message.topic)
        while (self.held_count >= settings.max_held_publications
               or self.held_bytes + size > settings.max_held_bytes) and self._drop_oldest_held(now):
            pass
        if message.qos:
            if not state.held_reliable:
                state.held_reliable = deque()  # a topic holds nothing most of its life: made when needed
            state.held_reliable.append(HeldPublication(now + settings.reliable_hold, message, source, size,
                                                       self._table.routes))
            self.held_reliable_count += 1
            self._held(message)
        else:
            if not state.held:
                state.held = deque()
            state.held.append(HeldPublication(now + settings.publication_hold, message, source, size))
        self.held_count += 1
        self.held_bytes += size
        return HELD

    def _drop_oldest_held(self, now: float) -> bool:
        """Make room in the hold: the oldest QoS 0 publication, else the oldest QoS 1/2 one a neighbour gave us
        (given back unacknowledged: it still has it). False when only our own QoS 1/2 ones are held (kept)."""
        oldest: TopicState | None = None
        for state in self.topics.values():
            if state.held and (oldest is None or state.held[0].deadline < oldest.held[0].deadline):
                oldest = state
        if oldest is not None:
            item = oldest.held.popleft()
            self._unhold(item)
            self._report_held_drop(oldest, item.message, now, "hold_overflow")
            return True
        own = self._identity.address
        for state in self.topics.values():
            for item in state.held_reliable:  # oldest first in each topic
                if item.message.origin != own:
                    state.held_reliable.remove(item)
                    self._unhold(item)
                    self._outbox.drop("held_overflow")
                    self._give_back(item.message)
                    return True
        return False

    def _unhold(self, item: HeldPublication) -> None:
        self.held_count -= 1
        self.held_bytes -= item.size
        if item.message.qos:
            self.held_reliable_count -= 1

    def end_withdrawn(self, state: TopicState, now: float) -> None:
        """The filter's core withdrew (nobody subscribes any more) while QoS 1/2 publications waited for it: they
        end here, as a publication matching no filter does (custody ends; not a loss)."""
        held, state.held_reliable = state.held_reliable, NOTHING_HELD
        for item in held:
            self._unhold(item)
            self._unheld(item.message)
        self._outbox.counters["held_ended_no_subscriber"] += len(held)

    def release_held(self, state: TopicState, now: float) -> None:
        """The topic can route again: its held publications go on, QoS 1/2 first, each in the order held."""
        reliable, state.held_reliable = state.held_reliable, NOTHING_HELD
        routes = self._table.routes
        for item in reliable:
            self._unhold(item)
            message, source = item.message, item.source
            if source is not None and item.routes is not routes and state.core is not None \
                    and self._decision(state, source) is NO_ROUTE:
                # Routes changed and the only way is back where it came from: it goes back (rule 7a).
                message, source = replace(message, hops=message.hops + 1), None
            self.route(state, message, source, now)  # its copies tracked, or held again
            self._unheld(item.message)
        held, state.held = state.held, NOTHING_HELD
        for item in held:
            self._unhold(item)
            self.route(state, item.message, item.source, now)

    def _report_held_drop(self, state: TopicState, message: TopicMessage, now: float, reason: str) -> None:
        self._outbox.drop(f"publication_{reason}", event=events.PUBLICATION_DROPPED, now=now,
                          pub=publication_text(message.publication), filter=state.filter, reason=reason)

    def expire_held(self, now: float) -> None:
        """Drop the publications held past `publication_hold` (QoS 0) or `reliable_hold` (QoS 1/2: custody ends
        with this reported drop, the origin's spool lets it go)."""
        if not self.held_count:  # counts both kinds: nothing to walk the topics for (every timer asks)
            return
        for state in list(self.topics.values()):
            if not state.held and not state.held_reliable:
                continue
            dropped = False
            while state.held and state.held[0].deadline <= now:
                item = state.held.popleft()
                self._unhold(item)
                self._report_held_drop(state, item.message, now, "no_core")
                dropped = True
            while state.held_reliable and state.held_reliable[0].deadline <= now:
                item = state.held_reliable.popleft()
                self._unhold(item)
                self._report_held_drop(state, item.message, now, "no_core")
                self._unheld(item.message)
                dropped = True
            if dropped:
                self.dirty.add(state.filter)

    def next_held_deadline(self) -> float | None:
        """When the first held publication expires (asked after every input: walks the topics only when some are
        held)."""
        if not self.held_count:
            return None
        deadlines = [held[0].deadline for state in self.topics.values() for held in (state.held, state.held_reliable)
                     if held]
        return min(deadlines) if deadlines else None

    def learning(self, now: float) -> bool:
        """The node has just started and not yet heard from its neighbours which filters exist: a publication
        matching none may match one it is about to learn."""
        return now < self.claim_allowed_at

    def remember_filters(self, filters: list[str], now: float) -> None:
        """Filters an earlier life of this node knew (`Node.restore`): kept as filters whose core is lost, so
        QoS 1/2 publications on them are held until a core is heard of (or `reliable_hold`)."""
        for filter_ in filters:
            state = self.state(filter_)
            if state is not None and state.core is None:
                state.lost_at = now

    def known_filters(self) -> list[str]:
        """The filters this node knows with a core, or lost lately (for the embedder to keep across a restart)."""
        return sorted(f for f, state in self.topics.items() if state.core is not None or state.lost_at > -INFINITY)
