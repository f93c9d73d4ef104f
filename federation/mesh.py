"""Topic cores, topic meshes and the routing of publications.

Theory of operation
-------------------
A *federated topic* is a subscription filter. The first node with a local
subscriber for filter F that knows no live core for F claims it and floods
`tc` announcements (refreshed every announce interval). Competing claims are
settled by the lowest BrokerId: a node that hears an inferior claim while it
knows a live superior core answers with `rt` (the superior announcement), so
the inferior claimant learns and stands down within one round trip. A core is
*lost* when the federation table shows it unreachable, restarted (newer epoch)
or renamed, or when its announcements stop for the announcement lifetime;
nodes with local subscribers then claim again. A core whose mesh becomes
empty withdraws (a `tc` with the withdrawn flag).

Members of F's mesh are the core, the nodes with local subscribers and every
node that has a child in the mesh. A member that is not the core sends `ts`
to up to `redundancy` parents: neighbours on shortest paths to the core
(lowest ids first); a node that receives `ts` records a child and becomes a
member itself. Soft state: children expire after the announcement lifetime;
a member whose last subscriber and child leave prunes itself at once.

A publication on topic T goes to every mesh whose filter matches T. Outside
the mesh it climbs toward the core through one parent (chosen with the
node's RNG, as in the seed); the first member it reaches spreads it to all
its mesh neighbours (parents and children) except the one it came from. Each
node handles a (publication, filter) pair once, so copies are bounded by the
mesh's links; the local broker gets it once per publication, whatever the
number of matching filters. A publication for a filter whose core is being
(re)elected is held for `publication_hold` seconds, then dropped and counted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from federation import events
from federation.events import id_text, publication_text
from federation.topic_filter import FilterIndex
from federation.types import Address, BrokerId
from federation.wire import (
    FLAG_PRUNE,
    FLAG_WITHDRAWN,
    MODE_IN_MESH,
    MODE_TOWARD_CORE,
    RECONSIDER_TOPIC_CORE,
    TOPIC_CORE,
    TOPIC_MESSAGE,
    TOPIC_SUBSCRIBE,
    TopicCore,
    TopicMessage,
    TopicSubscribe,
)

if TYPE_CHECKING:
    from federation.node import Node


@dataclass
class HeldPublication:
    deadline: float
    message: TopicMessage


@dataclass
class TopicState:
    filter: str
    core: BrokerId | None = None
    core_epoch: int = 0
    core_seq: int = 0
    core_distance: int = 0
    heard_at: float = float("-inf")
    via: set[Address] = field(default_factory=set)
    """announced addresses of the neighbours that delivered the freshest `tc` at the shortest distance"""
    own_seq: int = 0
    children: dict[Address, float] = field(default_factory=dict)
    """child (announced address) -> time its membership expires"""
    parents: tuple[Address, ...] = ()
    member: bool = False
    withdrawn: tuple[BrokerId, int, int] | None = None
    """the last withdrawal heard (core, epoch, seq): older claims of that core are ignored"""
    held: deque[HeldPublication] = field(default_factory=deque)
    pending: dict[BrokerId, tuple[TopicCore, Address, Address, float]] = field(default_factory=dict)
    """claims of cores the table does not show reachable yet: retried when routes change"""

    @property
    def freshness(self) -> tuple[int, int]:
        return (self.core_epoch, self.core_seq)


class MeshEngine:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.topics: dict[str, TopicState] = {}
        self.index = FilterIndex()
        self.dirty: set[str] = set()
        self.claim_allowed_at = float("inf")
        self.held_count = 0
        self.refused_topics = 0

    # ------------------------------------------------------------ state helpers

    def state(self, filter_: str, create: bool = True) -> TopicState | None:
        state = self.topics.get(filter_)
        if state is None and create:
            if len(self.topics) >= self.node.settings.max_topics:
                self.refused_topics += 1
                return None
            state = TopicState(filter_)
            self.topics[filter_] = state
            self.index.add(filter_)
        return state

    def is_own_core(self, state: TopicState) -> bool:
        return state.core is not None and state.core == self.node.broker_id

    def core_alive(self, state: TopicState, now: float) -> bool:
        core = state.core
        if core is None:
            return False
        if core.address == self.node.address:
            return core == self.node.broker_id
        if now - state.heard_at > self.node.settings.announcement_lifetime:
            return False
        return self.plausible(core, state.core_epoch)

    def plausible(self, core: BrokerId, epoch: int) -> bool:
        """Could `core` (claiming in `epoch`) be alive, as far as the federation table tells?
        Copies of a dead core's claims still wander after it died; they must not be adopted."""
        stored = self.node.lsdb.records.get(core.address)
        if stored is None or stored.record.epoch < epoch:
            return True  # announcements can arrive before the table has caught up
        if stored.record.epoch > epoch or core.address not in self.node.routes.members:
            return False
        return stored.record.origin.vid == core.vid

    def cores(self) -> dict[str, BrokerId]:
        return {f: s.core for f, s in sorted(self.topics.items()) if s.core is not None}

    def mark_all_dirty(self) -> None:
        self.dirty.update(self.topics)

    # ------------------------------------------------------------ announcements

    def announce(self, state: TopicState, now: float, withdrawn: bool = False) -> None:
        """Flood our own claim (or withdrawal) for a filter."""
        state.own_seq += 1
        message = TopicCore(state.filter, self.node.broker_id, self.node.epoch, state.own_seq, 0,
                            FLAG_WITHDRAWN if withdrawn else 0)
        self.node.send_up(TOPIC_CORE, message, exclude=None)

    def current_announcement(self, state: TopicState) -> TopicCore | None:
        if state.core is None:
            return None
        if self.is_own_core(state):
            return TopicCore(state.filter, state.core, self.node.epoch, state.own_seq, 0, 0)
        return TopicCore(state.filter, state.core, state.core_epoch, state.core_seq, state.core_distance, 0)

    def on_topic_core(self, kind: str, message: TopicCore, from_transport: Address, from_announced: Address,
                      now: float) -> None:
        state = self.state(message.filter)
        if state is None:
            return
        core = message.core
        if core.address == self.node.address:
            if core != self.node.broker_id or not self.is_own_core(state):
                # A claim of ours from an earlier id or life: answer with what we know now.
                self._answer_with_current(state, from_transport)
            return
        if message.flags & FLAG_WITHDRAWN:
            self._on_withdrawal(state, message, from_transport, now)
            return
        if state.withdrawn is not None and state.withdrawn[0] == core and \
                message.freshness <= state.withdrawn[1:]:
            return  # an announcement older than that core's withdrawal
        if not self.plausible(core, message.epoch):
            # Not adopted nor forwarded (copies of a dead core's claims would flap forever), but
            # kept: the table may simply not have caught up yet (a link that just came up).
            held = state.pending.get(core)
            if held is None or held[0].freshness <= message.freshness:
                if held is None and len(state.pending) >= 4:
                    del state.pending[min(state.pending, key=lambda c: state.pending[c][3])]
                state.pending[core] = (message, from_transport, from_announced, now)
            self.node.count_drop("tc_core_unreachable")
            return
        distance = message.distance + 1
        if state.core == core:
            if message.freshness > state.freshness:
                state.core_epoch, state.core_seq = message.freshness
                state.core_distance, state.via, state.heard_at = distance, {from_announced}, now
                self._forward_core(state, from_transport)
            elif message.freshness == state.freshness:
                state.heard_at = max(state.heard_at, now)
                if distance < state.core_distance:
                    state.core_distance, state.via = distance, {from_announced}
                    self._forward_core(state, from_transport)
                elif distance == state.core_distance:
                    state.via.add(from_announced)
            self.dirty.add(state.filter)
            return
        current_alive = self.core_alive(state, now)
        if state.core is not None and current_alive and state.core < core:
            # An inferior claim: tell the claimant's side who the core is.
            self._answer_with_current(state, from_transport)
            return
        previous = state.core
        was_own = self.is_own_core(state)
        state.core = core
        state.core_epoch, state.core_seq = message.freshness
        state.core_distance, state.via, state.heard_at = distance, {from_announced}, now
        state.children.clear()
        self.node.bump_version()
        self.node.emit(events.TOPIC_CORE_CHANGED, now, filter=state.filter, core=id_text(core),
                       previous=id_text(previous), reason="stood_down" if was_own else "announced")
        self._forward_core(state, from_transport)
        self.dirty.add(state.filter)

    def _answer_with_current(self, state: TopicState, to_transport: Address) -> None:
        announcement = self.current_announcement(state)
        if announcement is not None:
            self.node.send(RECONSIDER_TOPIC_CORE, announcement, [to_transport])

    def _forward_core(self, state: TopicState, from_transport: Address | None) -> None:
        announcement = self.current_announcement(state)
        if announcement is not None:
            self.node.send_up(TOPIC_CORE, announcement, exclude=from_transport)

    def _on_withdrawal(self, state: TopicState, message: TopicCore, from_transport: Address, now: float) -> None:
        marker = (message.core, message.epoch, message.seq)
        if state.withdrawn is not None and state.withdrawn[0] == message.core and \
                message.freshness <= state.withdrawn[1:]:
            return  # seen already
        state.withdrawn = marker
        self.node.send_up(TOPIC_CORE, TopicCore(message.filter, message.core, message.epoch, message.seq,
                                                message.distance + 1, FLAG_WITHDRAWN), exclude=from_transport)
        if state.core == message.core and message.freshness >= state.freshness:
            self._lose_core(state, now, reason="withdrawn")
        self.dirty.add(state.filter)

    def _lose_core(self, state: TopicState, now: float, reason: str) -> None:
        previous = state.core
        state.core = None
        state.children.clear()
        state.via.clear()
        self.node.bump_version()
        self.node.emit(events.TOPIC_CORE_CHANGED, now, filter=state.filter, core=None,
                       previous=id_text(previous), reason=reason)

    def _claim(self, state: TopicState, now: float) -> None:
        previous = state.core
        state.core = self.node.broker_id
        state.core_epoch, state.core_distance, state.heard_at = self.node.epoch, 0, now
        state.via.clear()
        state.withdrawn = None
        self.node.bump_version()
        self.node.emit(events.TOPIC_CORE_CHANGED, now, filter=state.filter, core=id_text(state.core),
                       previous=id_text(previous), reason="claimed")
        self.announce(state, now)
        state.core_seq = state.own_seq

    # ------------------------------------------------------------ mesh membership

    def on_topic_subscribe(self, message: TopicSubscribe, from_announced: Address, now: float) -> None:
        state = self.topics.get(message.filter)
        if state is None or state.core != message.core:
            self.node.count_drop("ts_core_mismatch")
            return
        if message.flags & FLAG_PRUNE:
            if state.children.pop(from_announced, None) is not None:
                self.dirty.add(state.filter)
            return
        is_new = from_announced not in state.children
        state.children[from_announced] = now + self.node.settings.announcement_lifetime
        if is_new:
            self.dirty.add(state.filter)

    def on_local_change(self, filter_: str) -> None:
        if self.state(filter_) is not None:
            self.dirty.add(filter_)

    def reconcile(self, now: float) -> None:
        """Bring every changed topic to its consistent state: cores, membership, parents, held publications."""
        while self.dirty:
            for filter_ in sorted(self.dirty):
                self.dirty.discard(filter_)
                state = self.topics.get(filter_)
                if state is not None:
                    self._reconcile_one(state, now)

    def _reconcile_one(self, state: TopicState, now: float) -> None:
        node = self.node
        for core, (message, transport, announced, received_at) in sorted(state.pending.items()):
            if now - received_at > node.settings.announcement_lifetime:
                del state.pending[core]
            elif self.plausible(core, message.epoch):
                del state.pending[core]
                self.on_topic_core(TOPIC_CORE, message, transport, announced, now)
        local = node.local_count(state.filter)
        if state.core is not None and not self.core_alive(state, now):
            self._lose_core(state, now, reason="lost")
        if state.core is None and local > 0 and now >= self.claim_allowed_at:
            self._claim(state, now)
        if self.is_own_core(state) and local == 0 and not state.children:
            self.announce(state, now, withdrawn=True)
            state.withdrawn = (node.broker_id, node.epoch, state.own_seq)
            self._lose_core(state, now, reason="withdrawn")
        own_core = self.is_own_core(state)
        member = state.core is not None and (own_core or local > 0 or bool(state.children))
        parents = self._parents(state) if member and not own_core else ()
        if parents != state.parents or member != state.member:
            for parent in sorted(set(state.parents) - set(parents)):
                self._send_subscribe(state, parent, prune=True)
            for parent in sorted(set(parents) - set(state.parents)):
                self._send_subscribe(state, parent, prune=False)
            if member and not state.member:
                node.emit(events.MESH_JOINED, now, filter=state.filter, core=id_text(state.core),
                          parents=[str(p) for p in parents])
            elif state.member and not member:
                node.emit(events.MESH_LEFT, now, filter=state.filter)
            state.parents, state.member = parents, member
        if state.held and self._routable(state):
            held, state.held = state.held, deque()
            self.held_count -= len(held)
            for item in held:
                self.route(state, item.message, None, now)
        if state.core is None and local == 0 and not state.children and not state.held and not state.pending and \
                (state.withdrawn is None or now - state.heard_at > node.settings.announcement_lifetime):
            del self.topics[state.filter]
            self.index.discard(state.filter)

    def _parents(self, state: TopicState) -> tuple[Address, ...]:
        assert state.core is not None
        routes = self.node.routes
        hops = routes.next_hops.get(state.core.address)
        if not hops:
            hops = frozenset(a for a in state.via if self.node.neighbours.transport_for(a) is not None)
        ranked = sorted(hops, key=lambda a: routes.ids.get(a, BrokerId(2**64, a)))
        return tuple(ranked[: self.node.settings.redundancy])

    def _send_subscribe(self, state: TopicState, parent: Address, prune: bool) -> None:
        transport = self.node.neighbours.transport_for(parent)
        if transport is None or state.core is None:
            return
        self.node.send(TOPIC_SUBSCRIBE, TopicSubscribe(state.filter, state.core, FLAG_PRUNE if prune else 0),
                       [transport])

    def periodic(self, now: float) -> None:
        """Every announce interval: refresh own claims and memberships, expire children."""
        for filter_, state in sorted(self.topics.items()):
            expired = [child for child, until in state.children.items() if until < now]
            for child in expired:
                del state.children[child]
            if self.is_own_core(state):
                self.announce(state, now)
                state.core_seq, state.heard_at = state.own_seq, now
            elif state.member:
                for parent in state.parents:
                    self._send_subscribe(state, parent, prune=False)
            self.dirty.add(filter_)

    def prune_all(self) -> None:
        """On a clean shutdown: leave every mesh at once."""
        for state in self.topics.values():
            for parent in state.parents:
                self._send_subscribe(state, parent, prune=True)
            if self.is_own_core(state):
                self.announce(state, 0.0, withdrawn=True)

    # ------------------------------------------------------------ publications

    def _routable(self, state: TopicState) -> bool:
        if state.core is None:
            return False
        return self.is_own_core(state) or state.member or bool(state.parents) or bool(self._parents(state))

    def route(self, state: TopicState, message: TopicMessage, from_announced: Address | None, now: float) -> None:
        node = self.node
        publication = message.publication
        if state.core is None or not self._routable(state):
            self._hold(state, message, now)
            return
        if state.member:
            targets = set(state.parents) | set(state.children)
            mode = MODE_IN_MESH
        else:
            candidates = sorted(set(self._parents(state)) - {from_announced} if from_announced else
                                set(self._parents(state)))
            if not candidates:
                node.emit(events.PUBLICATION_DROPPED, now, pub=publication_text(publication),
                          filter=state.filter, reason="no_route")
                node.count_drop("publication_no_route")
                return
            targets = {node.rng.choice(candidates)}
            mode = MODE_TOWARD_CORE
        if from_announced is not None:
            targets.discard(from_announced)
        transports = [t for t in (node.neighbours.transport_for(a) for a in sorted(targets)) if t is not None]
        if not transports:
            return
        outgoing = TopicMessage(message.filter, message.origin, message.epoch, message.seq, mode,
                                message.hops + 1 if from_announced is not None else message.hops,
                                message.topic, message.payload, message.qos, message.retain, message.properties)
        node.send(TOPIC_MESSAGE, outgoing, transports)
        node.counters["publications_forwarded"] += 1
        node.emit(events.PUBLICATION_FORWARDED, now, pub=publication_text(publication), filter=state.filter,
                  to=[str(t) for t in transports], mode="mesh" if mode == MODE_IN_MESH else "toward_core")

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

    def next_deadline(self) -> float | None:
        deadlines = [s.held[0].deadline for s in self.topics.values() if s.held]
        if self.claim_allowed_at > self.node.last_input_at and self._waiting_to_claim():
            deadlines.append(self.claim_allowed_at)
        return min(deadlines) if deadlines else None

    def _waiting_to_claim(self) -> list[str]:
        return [f for f, s in self.topics.items() if s.core is None and self.node.local_count(f) > 0]

    def on_timer(self, now: float) -> None:
        if now >= self.claim_allowed_at:
            self.dirty.update(self._waiting_to_claim())
        self.expire_held(now)

    def matching(self, topic: str) -> list[str]:
        return self.index.matching(topic)

    def describe(self, now: float) -> list[dict[str, Any]]:
        """Status rows: one per federated filter."""
        rows = []
        for filter_, state in sorted(self.topics.items()):
            rows.append({
                "filter": filter_, "core": id_text(state.core), "own_core": self.is_own_core(state),
                "distance": state.core_distance if state.core else None, "member": state.member,
                "parents": [str(p) for p in state.parents], "children": [str(c) for c in sorted(state.children)],
                "local_subscribers": self.node.local_count(filter_), "held": len(state.held),
            })
        return rows

