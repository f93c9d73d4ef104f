"""Who is the core of each topic: claims, announcements (`tc`, `rt`), placement and ownership.

The mesh engine's first layer (`federation.protocol.topics` says how its
three layers fit together); `federation.protocol.mesh` builds the meshes
on the cores decided here, `federation.protocol.forwarding` moves
publications over them.

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
unreachable, and adopted when the routes show its core reachable. A core
whose mesh becomes empty withdraws (a `tc` with the withdrawn flag).

Federation modes (`federation.protocol.modes`, docs/modes.md) change who may
be core and who claims. *Who may be core*: claims are ranked by
`claim_key`: the owner of a subtree covering the filter first
(`federation.protocol.ownership`), then, by the filter's placement, the
highest capability (replicated filters with `replication_root:
capability`), the highest rendezvous weight (`hash`) or the lowest id
(`election`, the seed's rule). *Who claims*: with election, the subscribers
(every node, for a replicated filter, and a better node takes over a live
root, as in a spanning tree protocol); with an owner or hash placement, the
*rightful core* (the live owner, else the rendezvous winner over the members
of our table) claims as soon as it learns the filter is in use, even without
subscribers, and the others take it as their core at once (a *placed*,
provisional core) and send `ts` toward it; a node named as core in a `ts`
claims. (The third thing modes change, who is a member, is in
`federation.protocol.mesh`.)
"""

from __future__ import annotations

from federation.protocol import events
from federation.protocol.events import id_text
from federation.protocol.linkstate import Routes
from federation.protocol.modes import HASH, RETAINED_FILTER
from federation.protocol.ownership import OwnerEntry
from federation.protocol.placement import rendezvous_weight, rendezvous_winner
from federation.protocol.topics import ClaimKey, TopicState, TopicTable
from federation.protocol.types import Address, BrokerId
from federation.protocol.wire import (
    FLAG_OWNER,
    FLAG_WITHDRAWN,
    MAX_SEQ,
    RECONSIDER_TOPIC_CORE,
    TOPIC_CORE,
    further,
)
from federation.protocol.wire_types import TopicCore


class CoreElection(TopicTable):
    """Claims, adoption and loss of topic cores, and the ownership announcements they are ranked by."""

    _winners: dict[str, BrokerId | None]
    """filter -> its rendezvous winner among our table's members (`rightful_core`), for `_winners_for`"""
    _winners_for: tuple[Routes, int] | None = None
    """(routes, our vid) `_winners` was computed for"""

    def core_alive(self, state: TopicState, now: float) -> bool:
        """Is the filter's core alive? Ours while we hold it; another node's while the table shows it reachable in
        the life and with the id it claimed in (claims are not refreshed: rule 5a), or, while the table has no
        record of that life yet, for an announcement lifetime after its claim was heard."""
        core = state.core
        if core is None:
            return False
        if core.address == self._identity.address:
            return core == self._identity.broker_id
        if state.provisional and core.address not in self._table.routes.members:
            return False
        stored = self._table.lsdb.records.get(core.address)
        if state.provisional or stored is None or stored.record.epoch < state.core_epoch:
            # A placed core its claim has not confirmed yet, or a claim the table has not caught up with.
            return now - state.heard_at <= self._settings.announcement_lifetime
        return self.plausible(core, state.core_epoch)

    def plausible(self, core: BrokerId, epoch: int) -> bool:
        """Could `core` (claiming in `epoch`) be alive, as far as the federation table tells?
        Copies of a dead core's claims still wander after it died; they must not be adopted."""
        stored = self._table.lsdb.records.get(core.address)
        if stored is None or stored.record.epoch < epoch:
            return True  # announcements can arrive before the table has caught up
        if stored.record.epoch > epoch or core.address not in self._table.routes.members:
            return False
        return stored.record.origin.vid == core.vid

    # ------------------------------------------------------------ modes: who may be core

    def owner_of(self, filter_: str) -> BrokerId | None:
        """The live owner of a subtree covering `filter_` (ourselves included), or None."""
        if not self.ownership.covers_anything():
            return None
        return self.ownership.owner_of(filter_, self._identity.broker_id, self._live_owner)

    def _live_owner(self, entry: OwnerEntry) -> BrokerId | None:
        """The owner's current id if the table shows it reachable in the life it announced, else None."""
        address = entry.owner.address
        if address not in self._table.routes.members:
            return None
        stored = self._table.lsdb.records.get(address)
        if stored is None or stored.record.epoch != entry.epoch:
            return None
        return stored.record.origin

    def rightful_core(self, filter_: str) -> BrokerId | None:
        """The core placement gives the filter (its owner, else the rendezvous winner); None under election."""
        retained = filter_ == RETAINED_FILTER
        owner = None if retained else self.owner_of(filter_)
        if owner is not None:
            return owner
        if not retained and self.policy.placement(filter_) != HASH:
            return None
        identity = self._identity
        routes = self._table.routes
        cached_for = self._winners_for
        if cached_for is None or cached_for[0] is not routes or cached_for[1] != identity.vid:
            self._winners = {}
            self._winners_for = (routes, identity.vid)
        winners = self._winners
        if filter_ not in winners:
            members = [identity.broker_id] + [routes.ids[a] for a in sorted(routes.members)
                                              if a != identity.address and a in routes.ids]
            # The retained tree is placed on the lowest id of the component: every node has the filter from its
            # start, so an election would have every node claim at once.
            winners[filter_] = min(members) if retained else rendezvous_winner(filter_, members)
        return winners[filter_]

    def claim_key(self, filter_: str, core: BrokerId, rank: int) -> ClaimKey:
        """How good a claim of `core` for `filter_` is: the lowest key wins (see the module docstring)."""
        if filter_ == RETAINED_FILTER:
            return (1, 0, core)  # the lowest id (`rightful_core`)
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
        """Flood our own claim (or withdrawal) for a filter: when it changes, never again to refresh it (rule 5a)."""
        self.claim_seq += 1
        state.own_seq = self.claim_seq
        message = TopicCore(state.filter, self._identity.broker_id, self._identity.epoch, state.own_seq, 0,
                            FLAG_WITHDRAWN if withdrawn else 0, 0 if withdrawn else state.core_rank)
        self._outbox.send_up(TOPIC_CORE, message, exclude=None)

    def current_announcement(self, state: TopicState) -> TopicCore | None:
        """The claim we relay for the filter's core (None without one, or for a core not yet announced)."""
        if state.core is None or state.provisional:
            return None
        if self.is_own_core(state):
            return TopicCore(state.filter, state.core, self._identity.epoch, state.own_seq, 0, 0, state.core_rank)
        return TopicCore(state.filter, state.core, state.core_epoch, state.core_seq, state.core_distance, 0,
                         state.core_rank)

    def announcements_for_sync(self, now: float) -> list[TopicCore]:
        """What a neighbour that just came up must learn at once: every ownership (the cores' claims it learns by
        the digests of rule 5a, as fast and without a burst of every claim at once)."""
        found = []
        ownership = self.ownership
        if ownership.own:
            ownership.seq = max(ownership.seq, 1)
            found += [TopicCore(subtree, self._identity.broker_id, self._identity.epoch, ownership.seq, 0,
                                FLAG_OWNER) for subtree in ownership.own]
        for _, entry in sorted(ownership.entries.items()):
            found.append(TopicCore(entry.subtree, entry.owner, entry.epoch, entry.seq, entry.distance, FLAG_OWNER))
        return found

    def on_topic_core(self, kind: str, message: TopicCore, from_transport: Address, from_announced: Address,
                      now: float, kept: bool = False) -> None:
        """A claim (`tc`, or `rt` answering one of ours); `kept`: one kept pending since it arrived, now taken
        (forwarded to its sender too: that neighbour may have lost it meanwhile, and nothing refreshes it)."""
        forward_except = None if kept else from_transport
        if message.flags & FLAG_OWNER:
            self._on_ownership(message, from_transport, now)
            return
        state = self.state(message.filter)
        if state is None:
            return
        core = message.core
        if core.address == self._identity.address:
            if (core != self._identity.broker_id or not self.is_own_core(state)) and \
                    not message.flags & FLAG_WITHDRAWN:
                self._disown(state, message, from_transport, now)
            return
        if message.flags & FLAG_WITHDRAWN:
            self._on_withdrawal(state, message, from_transport, now)
            return
        if state.withdrawn is not None and state.withdrawn[0] == core and \
                message.freshness <= state.withdrawn[1:]:
            # An announcement older than that core's withdrawal: the sender missed the withdrawal (a digest
            # brought its stale claim here), so it gets the withdrawal back.
            withdrawn_core, epoch, seq = state.withdrawn
            self._outbox.send(RECONSIDER_TOPIC_CORE, TopicCore(state.filter, withdrawn_core, epoch, seq, 0,
                                                               FLAG_WITHDRAWN), [from_transport])
            return
        if not self.plausible(core, message.epoch):
            # Not adopted nor forwarded (copies of a dead core's claims would flap forever), but
            # kept: the table may simply not have caught up yet (a link that just came up).
            self._keep_pending(state, message, from_transport, from_announced, now)
            self._outbox.drop("tc_core_unreachable")
            self.dirty.add(state.filter)  # indexed by its core: a route or record change of it brings it back
            return
        distance = further(message.distance)
        if state.core == core:
            if message.freshness > state.freshness:
                state.core_epoch, state.core_seq = message.freshness
                state.core_distance, state.via, state.heard_at = distance, (from_announced,), now
                state.core_rank, state.provisional = message.rank, False
                self._forward_core(state, forward_except)
            elif message.freshness == state.freshness:
                state.heard_at = max(state.heard_at, now)
                if distance < state.core_distance:
                    state.core_distance, state.via = distance, (from_announced,)
                    self._forward_core(state, forward_except)
                elif distance == state.core_distance and len(state.via) < self._settings.max_neighbours and \
                        from_announced not in state.via:
                    state.via = (*state.via, from_announced)  # bounded: only neighbours deliver it
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
        state.core_distance, state.via, state.heard_at = distance, (from_announced,), now
        state.adopted_at = now
        state.forget_children()
        self._outbox.view_changed()
        self._outbox.emit(events.TOPIC_CORE_CHANGED, now, filter=state.filter, core=id_text(core),
                          previous=id_text(previous), reason="stood_down" if was_own else "announced")
        self._forward_core(state, forward_except)
        self.dirty.add(state.filter)

    def _disown(self, state: TopicState, message: TopicCore, from_transport: Address, now: float) -> None:
        """A claim of ours we do not hold (of an earlier id or life, or one we withdrew and forgot): the sender
        gets our current claim when we hold one, else the stale claim is withdrawn everywhere. We are the
        authority on our own claims: nothing else would end a stale one that the digests keep bringing back."""
        if self.is_own_core(state):
            self._answer_with_current(state, from_transport)
            return
        if message.seq >= MAX_SEQ:
            return
        withdrawal = TopicCore(state.filter, message.core, message.epoch, message.seq + 1, 0, FLAG_WITHDRAWN)
        if message.epoch == self._identity.epoch:
            self.claim_seq = max(self.claim_seq, withdrawal.seq)  # our next claim must be newer than this
        if state.withdrawn is not None and state.withdrawn[0] == message.core and \
                withdrawal.freshness <= state.withdrawn[1:]:
            withdrawal = TopicCore(state.filter, *state.withdrawn, 0, FLAG_WITHDRAWN)
        else:
            state.withdrawn = (message.core, withdrawal.epoch, withdrawal.seq)
        self._outbox.send_up(TOPIC_CORE, withdrawal, exclude=None)
        self._outbox.counters["stale_claims_withdrawn"] += 1

    def _answer_with_current(self, state: TopicState, to_transport: Address) -> None:
        announcement = self.current_announcement(state)
        if announcement is not None:
            self._outbox.send(RECONSIDER_TOPIC_CORE, announcement, [to_transport])

    def _forward_core(self, state: TopicState, from_transport: Address | None) -> None:
        announcement = self.current_announcement(state)
        if announcement is not None:
            self._outbox.send_up(TOPIC_CORE, announcement, exclude=from_transport)

    def _on_withdrawal(self, state: TopicState, message: TopicCore, from_transport: Address, now: float) -> None:
        marker = (message.core, message.epoch, message.seq)
        if state.withdrawn is not None and state.withdrawn[0] == message.core and \
                message.freshness <= state.withdrawn[1:]:
            return  # seen already
        state.withdrawn = marker
        state.heard_at = max(state.heard_at, now)  # the tombstone is kept a lifetime from now (deletion waits)
        self._outbox.send_up(TOPIC_CORE, TopicCore(message.filter, message.core, message.epoch, message.seq,
                                                   further(message.distance), FLAG_WITHDRAWN), exclude=from_transport)
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
                now - state.heard_at > self._settings.announcement_lifetime:
            return
        if now - state.adopted_at > self._settings.hello_interval:
            # Only the race above: the loss follows the adoption within a few flood delays. A core held
            # longer and then cut off may withdraw while we cannot hear it; its old claim, taken again
            # at the heal, would bring a withdrawn core back (seen as an `rt` storm in owned mode).
            return
        stored = self._table.lsdb.records.get(core.address)
        if stored is None or stored.record.epoch != state.core_epoch or stored.record.origin.vid != core.vid:
            return  # restarted or renamed: that claim is of a life that is over
        neighbours = self._neighbours
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
            pending = state.own_pending()
            if held is None and len(pending) >= 4:
                del pending[min(pending, key=lambda c: pending[c][3])]
            pending[message.core] = (message, from_transport, from_announced, received_at)

    def _lose_core(self, state: TopicState, now: float, reason: str) -> None:
        previous = state.core
        state.core = None
        state.forget_children()
        state.via = ()
        if reason == "lost":
            state.lost_at = now
            state.lost_core = previous.address if previous is not None else None
            # A claim this node turned down as inferior to the one lost may still live elsewhere: the neighbours'
            # claims are asked for at once (`TopicSync.ask_claims`), not at the next digest round.
            self.cores_lost = True
        elif reason == "withdrawn":
            state.withdrawn_at = now
        self._outbox.view_changed()
        self._outbox.emit(events.TOPIC_CORE_CHANGED, now, filter=state.filter, core=None,
                          previous=id_text(previous), reason=reason)

    def _claim(self, state: TopicState, now: float) -> None:
        previous = state.core
        if previous is not None and previous != self._identity.broker_id:
            state.forget_children()  # taking over: the children joined the previous core's mesh
        state.core = self._identity.broker_id
        state.core_epoch, state.core_distance, state.heard_at = self._identity.epoch, 0, now
        state.core_rank, state.provisional, state.claimed_at = self.policy.rank(state.filter), False, now
        state.via = ()
        state.withdrawn = None
        self._outbox.view_changed()
        self._outbox.emit(events.TOPIC_CORE_CHANGED, now, filter=state.filter, core=id_text(state.core),
                          previous=id_text(previous), reason="claimed")
        self.announce(state, now)
        state.core_seq = state.own_seq

    def _adopt_placed(self, state: TopicState, core: BrokerId, now: float) -> None:
        """Take the core placement gives (not announced yet) and join its mesh; its claim confirms it."""
        previous = state.core
        stored = self._table.lsdb.records.get(core.address)
        state.core = core
        state.core_epoch, state.core_seq, state.core_rank = (stored.record.epoch if stored else 0), 0, 0
        state.core_distance = self._table.routes.distance.get(core.address, 0)
        state.heard_at, state.provisional = now, True
        state.via = ()
        state.forget_children()
        self._outbox.view_changed()
        self._outbox.emit(events.TOPIC_CORE_CHANGED, now, filter=state.filter, core=id_text(core),
                          previous=id_text(previous), reason="placed")

    def _place(self, state: TopicState, wants: bool, now: float) -> None:
        """Claim, take over or adopt the filter's core, as its placement says (claims are allowed)."""
        rightful = self.rightful_core(state.filter)
        me = self._identity.broker_id
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
        return now - state.claimed_at >= self._settings.announce_interval

    # ------------------------------------------------------------ ownership announcements

    def _on_ownership(self, message: TopicCore, from_transport: Address, now: float) -> None:
        core = message.core
        if core.address == self._identity.address:
            return  # our own, echoed back or from an earlier life: we announce what we own now
        withdrawn = bool(message.flags & FLAG_WITHDRAWN)
        stored = self._table.lsdb.records.get(core.address)
        if stored is not None and stored.record.epoch > message.epoch:
            self._outbox.drop("ownership_stale")  # from an earlier life of the owner
            return
        outcome = self.ownership.receive(message.filter, core, message.epoch, message.seq, further(message.distance),
                                         withdrawn, now)
        if outcome == "old":
            return
        self._outbox.send_up(TOPIC_CORE, TopicCore(message.filter, core, message.epoch, message.seq,
                                                   further(message.distance), message.flags), exclude=from_transport)
        if outcome == "refresh":
            return
        if withdrawn:
            self.ownership.forget_conflicts()
        for conflict in self.ownership.new_conflicts():
            self._outbox.counters["ownership_conflicts"] += 1
            self._outbox.emit(events.OWNERSHIP_CONFLICT, now, subtree=conflict.own, other=id_text(conflict.other),
                              other_subtree=conflict.other_subtree)
        self.mark_all_dirty()

    def announce_ownership(self, withdrawn: bool = False) -> None:
        """Flood an announcement of every subtree we own (or their withdrawal, on a clean shutdown)."""
        ownership = self.ownership
        if not ownership.own:
            return
        ownership.seq += 1
        flags = FLAG_OWNER | (FLAG_WITHDRAWN if withdrawn else 0)
        identity = self._identity
        for subtree in ownership.own:
            self._outbox.send_up(TOPIC_CORE, TopicCore(subtree, identity.broker_id, identity.epoch, ownership.seq, 0,
                                                       flags), exclude=None)

    def renumbered(self, now: float) -> None:
        """Our vid changed (an id collision): our own cores take the new id and announce it."""
        for state in self.topics.values():
            if state.core is not None and state.core.address == self._identity.address:
                state.core = self._identity.broker_id
                self.announce(state, now)
                state.core_seq = state.own_seq
                self.dirty.add(state.filter)
