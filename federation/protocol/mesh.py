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
nodes with local subscribers then claim again. A claim the table contradicts
(it may only be behind: claims are forwarded at once, records after
`flood_delay`) is kept pending, as is the claim of a core lost for being
unreachable, and adopted when the routes show its core reachable. A core whose mesh becomes
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

Federation modes (`federation.protocol.modes`, docs/modes.md) change three things and
nothing else. *Who may be core*: claims are ranked by `claim_key`: the owner
of a subtree covering the filter first (`federation.protocol.ownership`), then, by the
filter's placement, the highest capability (replicated filters with
`replication_root: capability`), the highest rendezvous weight (`hash`) or
the lowest id (`election`, the seed's rule). *Who claims*: with election, the
subscribers (every node, for a replicated filter, and a better node takes
over a live root, as in a spanning tree protocol); with an owner or hash
placement, the *rightful core* (the live
owner, else the rendezvous winner over the members of our table) claims as
soon as it learns the filter is in use, even without subscribers, and the
others take it as their core at once (a *placed*, provisional core) and send
`ts` toward it; a node named as core in a `ts` claims. *Who is a member*:
every node is a member of a replicated filter's mesh, which has one parent
per member, so it is a tree rooted at the core and a publication matching it
reaches every broker once; the origin then sends it over that tree only.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from federation.protocol import events
from federation.protocol.events import id_text
from federation.protocol.forwarding import ForwardingCache, HeldPublication, PublicationRouting
from federation.protocol.modes import HASH, ModePolicy
from federation.protocol.ownership import OwnerEntry, OwnershipTable
from federation.protocol.placement import rendezvous_weight, rendezvous_winner
from federation.protocol.topic_filter import FilterIndex
from federation.protocol.types import Address, BrokerId
from federation.protocol.wire import (
    FLAG_OWNER,
    FLAG_PRUNE,
    FLAG_WITHDRAWN,
    RECONSIDER_TOPIC_CORE,
    TOPIC_CORE,
    TOPIC_SUBSCRIBE,
    TopicCore,
    TopicSubscribe,
)

if TYPE_CHECKING:
    from federation.protocol.linkstate import Routes
    from federation.protocol.node import Node

ClaimKey = tuple[int, int, BrokerId]
"""(0 for the owner else 1, -capability or -rendezvous weight or 0, id): the lowest key is the best claim"""


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
    core_rank: int = 0
    """the rank (capability) carried by the core's claim"""
    provisional: bool = False
    """the core was taken from placement (owner or rendezvous winner) and has not announced itself yet"""
    adopted_at: float = float("-inf")
    """when the current core was adopted from its announcement (a claim of another core than before)"""
    claimed_at: float = float("-inf")
    """when we last claimed this filter (a placed core waits an announce interval for children)"""
    lost_at: float = float("-inf")
    """when its core was last lost (unreachable or silent): the filter is kept an announcement lifetime,
    so publications matching it are held and reported (`no_core`), not silently unmatched"""
    forwarding: ForwardingCache = field(default_factory=ForwardingCache, repr=False, compare=False)
    """where publications go next, kept while nothing it depends on changes (`federation.protocol.forwarding`)"""

    @property
    def freshness(self) -> tuple[int, int]:
        return (self.core_epoch, self.core_seq)


class MeshEngine(PublicationRouting):
    def __init__(self, node: Node) -> None:
        self.node = node
        self.topics: dict[str, TopicState] = {}
        self.index = FilterIndex()
        self.dirty: set[str] = set()
        self.claim_allowed_at = float("inf")
        self.held_count = 0
        self.refused_topics = 0
        self.policy = ModePolicy.from_settings(node.settings)
        self.ownership = OwnershipTable(node.settings.owned, node.settings.max_topics)
        self._winners: dict[str, BrokerId | None] = {}
        self._winners_for: tuple[Routes, int] | None = None
        for filter_ in self.policy.replicated:
            if self.state(filter_) is not None:  # every node is a member of a replicated filter's mesh
                self.dirty.add(filter_)

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
        if state.provisional and core.address not in self.node.routes.members:
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

    # ------------------------------------------------------------ modes: who may be core

    def wants(self, filter_: str) -> bool:
        """Does this node need the filter's mesh (local subscribers, or a replicated filter)?"""
        return self.node.local_count(filter_) > 0 or self.policy.is_replicated(filter_)

    def owner_of(self, filter_: str) -> BrokerId | None:
        """The live owner of a subtree covering `filter_` (ourselves included), or None."""
        if not self.ownership.covers_anything():
            return None
        return self.ownership.owner_of(filter_, self.node.broker_id, self._live_owner)

    def _live_owner(self, entry: OwnerEntry) -> BrokerId | None:
        """The owner's current id if the table shows it reachable in the life it announced, else None."""
        address = entry.owner.address
        if address not in self.node.routes.members:
            return None
        stored = self.node.lsdb.records.get(address)
        if stored is None or stored.record.epoch != entry.epoch:
            return None
        return stored.record.origin

    def rightful_core(self, filter_: str) -> BrokerId | None:
        """The core placement gives the filter (its owner, else the rendezvous winner); None under election."""
        owner = self.owner_of(filter_)
        if owner is not None:
            return owner
        if self.policy.placement(filter_) != HASH:
            return None
        node = self.node
        key = (node.routes, node.vid)
        if self._winners_for is None or self._winners_for[0] is not key[0] or self._winners_for[1] != key[1]:
            self._winners.clear()
            self._winners_for = key
        if filter_ not in self._winners:
            routes = node.routes
            members = [node.broker_id] + [routes.ids[a] for a in sorted(routes.members)
                                          if a != node.address and a in routes.ids]
            self._winners[filter_] = rendezvous_winner(filter_, members)
        return self._winners[filter_]

    def claim_key(self, filter_: str, core: BrokerId, rank: int) -> ClaimKey:
        """How good a claim of `core` for `filter_` is: the lowest key wins (see the module docstring)."""
        owner = self.owner_of(filter_)
        if owner is not None and owner == core:
            return (0, 0, core)
        if self.policy.ranked_by_capability(filter_):
            return (1, -rank, core)
        if self.policy.placement(filter_) == HASH:
            return (1, -rendezvous_weight(filter_, core.address), core)
        return (1, 0, core)

    def superior(self, filter_: str, first: BrokerId, first_rank: int, second: BrokerId, second_rank: int) -> bool:
        """Is the claim of `first` better than the claim of `second`?"""
        return self.claim_key(filter_, first, first_rank) < self.claim_key(filter_, second, second_rank)

    # ------------------------------------------------------------ announcements

    def announce(self, state: TopicState, now: float, withdrawn: bool = False) -> None:
        """Flood our own claim (or withdrawal) for a filter."""
        state.own_seq += 1
        message = TopicCore(state.filter, self.node.broker_id, self.node.epoch, state.own_seq, 0,
                            FLAG_WITHDRAWN if withdrawn else 0, 0 if withdrawn else state.core_rank)
        self.node.send_up(TOPIC_CORE, message, exclude=None)

    def current_announcement(self, state: TopicState) -> TopicCore | None:
        """The claim we relay for the filter's core (None without one, or for a core not yet announced)."""
        if state.core is None or state.provisional:
            return None
        if self.is_own_core(state):
            return TopicCore(state.filter, state.core, self.node.epoch, state.own_seq, 0, 0, state.core_rank)
        return TopicCore(state.filter, state.core, state.core_epoch, state.core_seq, state.core_distance, 0,
                         state.core_rank)

    def announcements_for_sync(self, now: float) -> list[TopicCore]:
        """What a neighbour that just came up must learn: every live core's claim and every ownership."""
        found = []
        for _, state in sorted(self.topics.items()):
            announcement = self.current_announcement(state)
            if announcement is not None and self.core_alive(state, now):
                found.append(announcement)
        ownership = self.ownership
        if ownership.own:
            ownership.seq = max(ownership.seq, 1)
            found += [TopicCore(subtree, self.node.broker_id, self.node.epoch, ownership.seq, 0, FLAG_OWNER)
                      for subtree in ownership.own]
        for _, entry in sorted(ownership.entries.items()):
            found.append(TopicCore(entry.subtree, entry.owner, entry.epoch, entry.seq, entry.distance, FLAG_OWNER))
        return found

    def on_topic_core(self, kind: str, message: TopicCore, from_transport: Address, from_announced: Address,
                      now: float) -> None:
        if message.flags & FLAG_OWNER:
            self._on_ownership(message, from_transport, now)
            return
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
            self._keep_pending(state, message, from_transport, from_announced, now)
            self.node.count_drop("tc_core_unreachable")
            return
        distance = message.distance + 1
        if state.core == core:
            if message.freshness > state.freshness:
                state.core_epoch, state.core_seq = message.freshness
                state.core_distance, state.via, state.heard_at = distance, {from_announced}, now
                state.core_rank, state.provisional = message.rank, False
                self._forward_core(state, from_transport)
            elif message.freshness == state.freshness:
                state.heard_at = max(state.heard_at, now)
                if distance < state.core_distance:
                    state.core_distance, state.via = distance, {from_announced}
                    self._forward_core(state, from_transport)
                elif distance == state.core_distance and len(state.via) < self.node.settings.max_neighbours:
                    state.via.add(from_announced)  # bounded: only neighbours deliver it (fake ids cannot grow it)
            self.dirty.add(state.filter)
            return
        current_alive = self.core_alive(state, now)
        if state.core is not None and current_alive and \
                self.superior(state.filter, state.core, state.core_rank, core, message.rank):
            # An inferior claim: tell the claimant's side who the core is.
            self._answer_with_current(state, from_transport)
            return
        previous = state.core
        was_own = self.is_own_core(state)
        state.core = core
        state.core_rank, state.provisional = message.rank, False
        state.core_epoch, state.core_seq = message.freshness
        state.core_distance, state.via, state.heard_at = distance, {from_announced}, now
        state.adopted_at = now
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

    def _keep_unreachable_claim(self, state: TopicState, now: float) -> None:
        """Before losing a core only because the table does not show it reachable, keep its claim pending.

        A `tc` is forwarded at once while records wait `flood_delay` at every hop, so a claim can
        overtake the records that make its core reachable: adopted while the table has no record of
        the core, then lost when the core's record arrives before the record of the node linking it
        to us. Kept like a claim that arrives in that state (`on_topic_core`), it is adopted again
        when routes change and show the core reachable, not only at the core's next refresh an
        `announce_interval` later; a dead core's claim just expires with its announcement lifetime.
        """
        core = state.core
        if core is None or state.provisional or self.is_own_core(state) or \
                now - state.heard_at > self.node.settings.announcement_lifetime:
            return
        if now - state.adopted_at > self.node.settings.hello_interval:
            # Only the race above: the loss follows the adoption within a few flood delays. A core held
            # longer and then cut off may withdraw while we cannot hear it; its old claim, taken again
            # at the heal, would bring a withdrawn core back (seen as an `rt` storm in owned mode).
            return
        stored = self.node.lsdb.records.get(core.address)
        if stored is None or stored.record.epoch != state.core_epoch or stored.record.origin.vid != core.vid:
            return  # restarted or renamed: that claim is of a life that is over
        neighbours = self.node.neighbours
        via = next(((transport, announced) for announced in sorted(state.via)
                    if (transport := neighbours.transport_for(announced)) is not None), None)
        if via is None:
            return
        message = TopicCore(state.filter, core, state.core_epoch, state.core_seq, state.core_distance - 1, 0,
                            state.core_rank)
        self._keep_pending(state, message, via[0], via[1], state.heard_at)

    @staticmethod
    def _keep_pending(state: TopicState, message: TopicCore, from_transport: Address, from_announced: Address,
                      received_at: float) -> None:
        """Remember a claim whose core the table does not show reachable (at most 4 cores per filter)."""
        held = state.pending.get(message.core)
        if held is None or held[0].freshness <= message.freshness:
            if held is None and len(state.pending) >= 4:
                del state.pending[min(state.pending, key=lambda c: state.pending[c][3])]
            state.pending[message.core] = (message, from_transport, from_announced, received_at)

    def _lose_core(self, state: TopicState, now: float, reason: str) -> None:
        previous = state.core
        state.core = None
        state.children.clear()
        state.via.clear()
        if reason == "lost":
            state.lost_at = now
        self.node.bump_version()
        self.node.emit(events.TOPIC_CORE_CHANGED, now, filter=state.filter, core=None,
                       previous=id_text(previous), reason=reason)

    def _claim(self, state: TopicState, now: float) -> None:
        previous = state.core
        if previous is not None and previous != self.node.broker_id:
            state.children.clear()  # taking over: the children joined the previous core's mesh
        state.core = self.node.broker_id
        state.core_epoch, state.core_distance, state.heard_at = self.node.epoch, 0, now
        state.core_rank, state.provisional, state.claimed_at = self.policy.rank(state.filter), False, now
        state.via.clear()
        state.withdrawn = None
        self.node.bump_version()
        self.node.emit(events.TOPIC_CORE_CHANGED, now, filter=state.filter, core=id_text(state.core),
                       previous=id_text(previous), reason="claimed")
        self.announce(state, now)
        state.core_seq = state.own_seq

    def _adopt_placed(self, state: TopicState, core: BrokerId, now: float) -> None:
        """Take the core placement gives (not announced yet) and join its mesh; its claim confirms it."""
        node = self.node
        previous = state.core
        stored = node.lsdb.records.get(core.address)
        state.core = core
        state.core_epoch, state.core_seq, state.core_rank = (stored.record.epoch if stored else 0), 0, 0
        state.core_distance = node.routes.distance.get(core.address, 0)
        state.heard_at, state.provisional = now, True
        state.via.clear()
        state.children.clear()
        node.bump_version()
        node.emit(events.TOPIC_CORE_CHANGED, now, filter=state.filter, core=id_text(core),
                  previous=id_text(previous), reason="placed")

    def _place(self, state: TopicState, wants: bool, now: float) -> None:
        """Claim, take over or adopt the filter's core, as its placement says (claims are allowed)."""
        rightful = self.rightful_core(state.filter)
        me = self.node.broker_id
        if rightful is None:  # election: subscribers claim when nobody does
            if state.core is None and wants:
                self._claim(state, now)
            elif state.core is not None and self.policy.is_replicated(state.filter) and \
                    not self.is_own_core(state) and \
                    self.superior(state.filter, me, self.policy.rank(state.filter), state.core, state.core_rank):
                # A replicated filter's root is the best node of the component, as in a spanning tree
                # protocol: every node wants the mesh, so the best one takes it over when it learns of it.
                self._claim(state, now)
            return
        if rightful == me:
            if self.is_own_core(state):
                return
            if state.core is None:
                if wants or state.children:
                    self._claim(state, now)
            elif self.superior(state.filter, me, self.policy.rank(state.filter), state.core, state.core_rank):
                self._claim(state, now)  # the filter is in use and we are its rightful core: take it over
            return
        if state.core is None and wants:
            self._adopt_placed(state, rightful, now)

    def _may_withdraw(self, state: TopicState, now: float) -> bool:
        """An empty elected core withdraws at once; a placed one first waits an announce interval for
        the members that learn of it to join."""
        if self.rightful_core(state.filter) is None:
            return True
        return now - state.claimed_at >= self.node.settings.announce_interval

    # ------------------------------------------------------------ ownership announcements

    def _on_ownership(self, message: TopicCore, from_transport: Address, now: float) -> None:
        core = message.core
        if core.address == self.node.address:
            return  # our own, echoed back or from an earlier life: we announce what we own now
        withdrawn = bool(message.flags & FLAG_WITHDRAWN)
        stored = self.node.lsdb.records.get(core.address)
        if stored is not None and stored.record.epoch > message.epoch:
            self.node.count_drop("ownership_stale")  # from an earlier life of the owner
            return
        outcome = self.ownership.receive(message.filter, core, message.epoch, message.seq, message.distance + 1,
                                         withdrawn, now)
        if outcome == "old":
            return
        self.node.send_up(TOPIC_CORE, TopicCore(message.filter, core, message.epoch, message.seq,
                                                message.distance + 1, message.flags), exclude=from_transport)
        if outcome == "refresh":
            return
        if withdrawn:
            self.ownership.forget_conflicts()
        for conflict in self.ownership.new_conflicts():
            self.node.counters["ownership_conflicts"] += 1
            self.node.emit(events.OWNERSHIP_CONFLICT, now, subtree=conflict.own, other=id_text(conflict.other),
                           other_subtree=conflict.other_subtree)
        self.mark_all_dirty()

    def announce_ownership(self, withdrawn: bool = False) -> None:
        """Flood an announcement of every subtree we own (or their withdrawal, on a clean shutdown)."""
        ownership = self.ownership
        if not ownership.own:
            return
        ownership.seq += 1
        flags = FLAG_OWNER | (FLAG_WITHDRAWN if withdrawn else 0)
        for subtree in ownership.own:
            self.node.send_up(TOPIC_CORE, TopicCore(subtree, self.node.broker_id, self.node.epoch, ownership.seq,
                                                    0, flags), exclude=None)

    # ------------------------------------------------------------ mesh membership

    def on_topic_subscribe(self, message: TopicSubscribe, from_announced: Address, now: float) -> None:
        state = self.topics.get(message.filter)
        if state is None or state.core != message.core:
            state = None if message.flags & FLAG_PRUNE else self._placed_subscribe(message, now)
            if state is None:
                self.node.count_drop("ts_core_mismatch")
                return
        if message.flags & FLAG_PRUNE:
            if state.children.pop(from_announced, None) is not None:
                self.dirty.add(state.filter)
            return
        is_new = from_announced not in state.children
        if is_new and len(state.children) >= self.node.settings.max_neighbours:
            # Children are neighbours: more means ids that changed (or were faked); the stalest goes.
            del state.children[min(state.children, key=state.children.__getitem__)]
            self.node.count_drop("children_evicted")
        state.children[from_announced] = now + self.node.settings.announcement_lifetime
        if is_new:
            self.dirty.add(state.filter)
            self.node.reliable.mesh_neighbour_added(state.filter, from_announced, now)  # QoS 1/2 repair

    def _placed_subscribe(self, message: TopicSubscribe, now: float) -> TopicState | None:
        """A `ts` naming a core we do not hold: under placement, the core it names may be the one we would
        place (then we take it, or claim when it names us). Returns the state now matching, or None."""
        state = self.topics.get(message.filter)
        if state is not None and state.core is not None and self.core_alive(state, now):
            return None
        rightful = self.rightful_core(message.filter)
        if rightful is None:
            return None
        me = self.node.broker_id
        if message.core != me and message.core != rightful:
            return None
        state = self.state(message.filter)
        if state is None:
            return None
        if state.core is not None:
            self._lose_core(state, now, reason="lost")
        if message.core == me:
            self._claim(state, now)
        else:
            self._adopt_placed(state, rightful, now)
        self.dirty.add(state.filter)
        return state

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
        wants = self.wants(state.filter)
        if state.core is not None and not self.core_alive(state, now):
            self._keep_unreachable_claim(state, now)
            self._lose_core(state, now, reason="lost")
        if now >= self.claim_allowed_at:
            self._place(state, wants, now)
        if self.is_own_core(state) and not wants and not state.children and self._may_withdraw(state, now):
            self.announce(state, now, withdrawn=True)
            state.withdrawn = (node.broker_id, node.epoch, state.own_seq)
            self._lose_core(state, now, reason="withdrawn")
        own_core = self.is_own_core(state)
        member = state.core is not None and (own_core or wants or bool(state.children))
        parents = self._parents(state) if member and not own_core else ()
        if parents != state.parents or member != state.member:
            for parent in sorted(set(state.parents) - set(parents)):
                self._send_subscribe(state, parent, prune=True)
            for parent in sorted(set(parents) - set(state.parents)):
                self._send_subscribe(state, parent, prune=False)
                node.reliable.mesh_neighbour_added(state.filter, parent, now)  # QoS 1/2 repair
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
        if state.core is None and not wants and not state.children and not state.held and not state.pending and \
                (state.withdrawn is None or now - state.heard_at > node.settings.announcement_lifetime) and \
                now - state.lost_at > node.settings.announcement_lifetime:
            del self.topics[state.filter]
            self.index.discard(state.filter)

    def _parents(self, state: TopicState) -> tuple[Address, ...]:
        assert state.core is not None
        routes = self.node.routes
        hops = routes.next_hops.get(state.core.address)
        if not hops:
            hops = frozenset(a for a in state.via if self.node.neighbours.transport_for(a) is not None)
        if len(hops) == 1:  # the common case, on every publication routed toward the core: nothing to rank
            return tuple(hops)[: self.policy.parents(state.filter, self.node.settings.redundancy)]
        ranked = sorted(hops, key=lambda a: routes.ids.get(a, BrokerId(2**64, a)))
        return tuple(ranked[: self.policy.parents(state.filter, self.node.settings.redundancy)])

    def _send_subscribe(self, state: TopicState, parent: Address, prune: bool) -> None:
        transport = self.node.neighbours.transport_for(parent)
        if transport is None or state.core is None:
            return
        self.node.send(TOPIC_SUBSCRIBE, TopicSubscribe(state.filter, state.core, FLAG_PRUNE if prune else 0),
                       [transport])

    def periodic(self, now: float) -> None:
        """Every announce interval: refresh own claims, ownerships and memberships, expire children."""
        self.announce_ownership()
        if self.ownership.expire(self.node.settings.announcement_lifetime, now):
            self.mark_all_dirty()
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
        self.announce_ownership(withdrawn=True)

    def next_deadline(self) -> float | None:
        # Asked after every input: walk the topics only when something is held.
        deadlines = [s.held[0].deadline for s in self.topics.values() if s.held] if self.held_count else []
        if self.claim_allowed_at > self.node.last_input_at and self._waiting_to_claim():
            deadlines.append(self.claim_allowed_at)
        return min(deadlines) if deadlines else None

    def _waiting_to_claim(self) -> list[str]:
        return [f for f, s in self.topics.items() if s.core is None and self.wants(f)]

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
                "mode": self.policy.mode_name(filter_), "placed": state.provisional,
            })
        return rows

