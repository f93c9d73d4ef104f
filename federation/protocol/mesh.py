"""Topic meshes: who is a member, parents and children (`ts`), and the mesh engine that composes its layers.

The mesh engine (`MeshEngine`) is the node's part for topics: its layers
are `federation.protocol.cores` (who is the core of each topic),
`federation.protocol.forwarding` (where publications go next) and this
module, which keeps the meshes themselves and reconciles each changed
topic after every input; `federation.protocol.topics` holds the topic
state and the engine's context.

Theory of operation
-------------------
Members of F's mesh are the core, the nodes with local subscribers and every
node that has a child in the mesh. A member that is not the core sends `ts`
to up to `redundancy` parents: neighbours on shortest paths to the core
(lowest ids first); a node that receives `ts` records a child and becomes a
member itself. Soft state: children expire after the announcement lifetime;
a member whose last subscriber and child leave prunes itself at once.

Publications cross only the links to the *data parents*: the first
`data_parents` parents that are up (one by default, so the links they cross
make a tree rooted at the core: a copy per member). The other parents are
*standby*: their `ts` carries the standby flag, so they keep the child apart
(`standby_children`), send it nothing and do not become members for it.
Failure is noticed before the neighbour is declared down: when the hello
back of the last hello sent to a data parent is late (a quarter of the
hello interval, or 4 round trips), the first standby parent that is up
becomes a data parent beside it (a plain `ts`: it joins the mesh if it was
not a member, and both sides replay the recent QoS 1/2 publications to each
other), until the late one answers (back to standby) or goes down (it stays).
What a failure costs is the time until the next hello goes unanswered:
QoS 0 published meanwhile is lost below the lost parent, QoS 1/2 arrives
by the replay. `data_parents: redundancy` restores publications over every
parent link (no loss on a single parent's failure, a copy from each).
Every node is a member of a replicated filter's mesh (docs/modes.md), which
has one parent per member, so it is a tree rooted at the core and a
publication matching it reaches every broker once; the origin then sends it
over that tree only.

A new mesh neighbour (a new child's `ts`, a new parent) is told at once to
reliable forwarding (`new_mesh_neighbour`), which sends it the recent QoS
1/2 publications of the filter: a mesh that changes while a publication
crosses it must not leave a part of it behind.
"""

from __future__ import annotations

import heapq
from typing import Any

from federation.protocol import events
from federation.protocol.cores import CoreElection
from federation.protocol.digest_tree import DigestTree, entry_hash
from federation.protocol.events import id_text
from federation.protocol.forwarding import PublicationRouting
from federation.protocol.modes import RETAINED_FILTER
from federation.protocol.topics import INFINITY, NO_ENTRIES, TopicState
from federation.protocol.types import Address
from federation.protocol.wire import FLAG_PRUNE, FLAG_STANDBY, TOPIC_CORE, TOPIC_SUBSCRIBE
from federation.protocol.wire_types import TopicCore, TopicSubscribe


def claim_hash(claim: TopicCore) -> int:
    """A claim's entry in the claims' digest: the same on every node that holds that claim (distance left out)."""
    core = claim.core
    return entry_hash(f"c|{claim.filter}|{core.vid}|{core.address.host}|{core.address.port}|{claim.epoch}|"
                      f"{claim.seq}")


def membership_hash(entry: TopicSubscribe) -> int:
    """A membership's entry in the digests of a child's memberships and of its parent's record of them."""
    core = entry.core
    return entry_hash(f"m|{entry.filter}|{core.vid}|{core.address.host}|{core.address.port}|{entry.flags}")


class MeshEngine(CoreElection, PublicationRouting):
    """Topic cores, meshes and the routing of publications: one part of the node (see the module docstring;
    it is built with `TopicTable`'s context)."""

    # ------------------------------------------------------------ mesh membership

    def on_topic_subscribe(self, message: TopicSubscribe, from_announced: Address, now: float) -> None:
        state = self.topics.get(message.filter)
        if state is None or state.core != message.core:
            state = None if message.flags & FLAG_PRUNE else self._placed_subscribe(message, now)
            if state is None:
                self._outbox.drop("ts_core_mismatch")
                return
        self.dirty.add(state.filter)  # what the digests record of the child changes (rule 5a)
        if message.flags & (FLAG_PRUNE | FLAG_STANDBY):
            # A data child no more (it left, or keeps us as a standby parent).
            state.children.pop(from_announced, None)
            if message.flags & FLAG_PRUNE:
                state.standby_children.pop(from_announced, None)
            else:
                self._add_child(state.own_children(standby=True), from_announced, INFINITY)
            return
        state.standby_children.pop(from_announced, None)
        is_new = from_announced not in state.children
        self._add_child(state.own_children(), from_announced, INFINITY)  # until it goes down: no refresh (rule 5a)
        if is_new:
            self._new_mesh_neighbour(state.filter, from_announced, now)  # QoS 1/2 repair

    def _add_child(self, children: dict[Address, float], child: Address, expires: float) -> None:
        if child not in children and len(children) >= self._settings.max_neighbours:
            # Children are neighbours: more means ids that changed (or were faked); the stalest goes.
            del children[min(children, key=children.__getitem__)]
            self._outbox.drop("children_evicted")
        children[child] = expires

    def _placed_subscribe(self, message: TopicSubscribe, now: float) -> TopicState | None:
        """A `ts` naming a core we do not hold: under placement, the core it names may be the one we would
        place (then we take it, or claim when it names us). Returns the state now matching, or None."""
        state = self.topics.get(message.filter)
        if state is not None and state.core is not None and self.core_alive(state, now):
            return None
        rightful = self.rightful_core(message.filter)
        if rightful is None:
            return None
        me = self._identity.broker_id
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

    def joined(self, filter_: str, now: float) -> bool:
        """Do publications matching the filter reach this node now: a member of its mesh with a live core that
        is this node or that a data parent leads to?"""
        state = self.topics.get(filter_)
        if state is None or not state.member or not self.core_alive(state, now):
            return False
        return self.is_own_core(state) or bool(state.data_parents)

    def on_local_change(self, filter_: str, beyond_limit: bool = False) -> bool:
        """A filter the local subscriptions started or stopped wanting; False when the table has no room for it
        (`max_topics`: the node covers it by `#`, `LocalSubscriptions.cover_refused`)."""
        if self.state(filter_, beyond_limit=beyond_limit) is None:
            return False
        self.dirty.add(filter_)
        return True

    def reconcile(self, now: float) -> None:
        """Bring every changed topic to its consistent state: cores, membership, parents, held publications."""
        while self.dirty:
            for filter_ in sorted(self.dirty):
                self.dirty.discard(filter_)
                state = self.topics.get(filter_)
                if state is not None:
                    self._reconcile_one(state, now)

    def _reconcile_one(self, state: TopicState, now: float) -> None:
        lifetime = self._settings.announcement_lifetime
        for core, (message, transport, announced, received_at) in sorted(state.pending.items()):
            if now - received_at > lifetime:
                del state.pending[core]
            elif self.plausible(core, message.epoch):
                del state.pending[core]
                self.on_topic_core(TOPIC_CORE, message, transport, announced, now, kept=True)
        wants = self.wants(state.filter)
        if state.core is not None and not self.core_alive(state, now):
            self._keep_unreachable_claim(state, now)
            self._lose_core(state, now, reason="lost")
        if now >= self.claim_allowed_at:
            self._place(state, wants, now)
        if self.is_own_core(state) and not wants and not state.children and self._may_withdraw(state, now):
            self.announce(state, now, withdrawn=True)
            state.withdrawn = (self._identity.broker_id, self._identity.epoch, state.own_seq)
            self._lose_core(state, now, reason="withdrawn")
        own_core = self.is_own_core(state)
        member = state.core is not None and (own_core or wants or bool(state.children))
        parents = self.parents_for(state) if member and not own_core else ()
        data = self._data_parents(parents)
        if parents != state.parents or data != state.data_parents or member != state.member:
            for parent in sorted(set(state.parents) - set(parents)):
                self._send_subscribe(state, parent, prune=True)
            for parent in sorted(parents):
                carries = parent in data
                if parent in state.parents and carries == (parent in state.data_parents):
                    continue  # nothing changed for it
                self._send_subscribe(state, parent, prune=False, standby=not carries)
                if carries and parent not in state.parents:
                    # QoS 1/2 repair toward a parent we choose (a standby one taking over has them, or has them
                    # from us by custody: what we sent the parent it replaces is routed again)
                    self._new_mesh_neighbour(state.filter, parent, now)
            if member and not state.member:
                self._outbox.emit(events.MESH_JOINED, now, filter=state.filter, core=id_text(state.core),
                                  parents=[str(p) for p in parents])
            elif state.member and not member:
                self._outbox.emit(events.MESH_LEFT, now, filter=state.filter)
            state.parents, state.data_parents, state.member = parents, data, member
            self._watch(state)
        if (state.held or state.held_reliable) and self._routable(state):
            self.release_held(state, now)
        elif state.held_reliable and state.core is None and state.withdrawn_at > state.lost_at:
            self.end_withdrawn(state, now)
        out_of_reach = state.core is None and state.lost_core is not None and state.lost_at > state.withdrawn_at \
            and now - state.lost_at <= self._settings.reliable_hold \
            and state.lost_core not in self._table.routes.members
        if out_of_reach or state.out_of_reach:
            # Its core is out of reach (a partition: its subscribers may be behind it): kept, so that a publication
            # read meanwhile is held (QoS 1/2 up to `reliable_hold`), never matched by nothing and released; then
            # kept a lifetime more from when it was last out of reach.
            state.out_of_reach_at = now
            state.out_of_reach = out_of_reach
        if state.core is None and not wants and not state.children and not state.standby_children \
                and not state.held and not state.held_reliable and not state.pending and not state.out_of_reach \
                and (state.withdrawn is None or now - state.heard_at > lifetime) and \
                now - max(state.lost_at, state.out_of_reach_at) > lifetime:
            del self.topics[state.filter]
            self.index.discard(state.filter)
            self._watching.pop(state.filter, None)
            self._watched = None
            state.core, state.member, state.parents = None, False, ()
            self._digest(state)
            self._index(state)
            return
        self._digest(state)
        self._index(state)
        self._schedule(state, now)

    def _index(self, state: TopicState) -> None:
        """Keep `by_core` current for the topic: the nodes whose records and routes decide whether its claims are
        alive and where its parents are (its core, its kept claims' cores, the lost core it waits for)."""
        wanted: tuple[Address, ...] = tuple(sorted({core.address for core in state.pending})) if state.pending else ()
        core = state.core
        watched = core.address if core is not None else state.lost_core if state.out_of_reach else None
        if watched is not None and watched != self._identity.address and state.filter in self.topics \
                and watched not in wanted:
            wanted = (*wanted, watched)
        if wanted == state.indexed:
            return
        by_core = self.by_core
        filter_ = state.filter
        for address in state.indexed:
            if address in wanted:
                continue
            held = by_core.get(address)
            if held == filter_:
                del by_core[address]
            elif isinstance(held, set):
                held.discard(filter_)
                if len(held) == 1:
                    by_core[address] = next(iter(held))
        for address in wanted:
            if address in state.indexed:
                continue
            held = by_core.get(address)
            if held is None:
                by_core[address] = filter_
            elif isinstance(held, str):
                if held != filter_:
                    by_core[address] = {held, filter_}
            else:
                held.add(filter_)
        state.indexed = wanted

    def routes_changed(self, changed: frozenset[Address]) -> None:
        """Routes moved: the topics whose cores (kept claims', lost cores') are at addresses whose next hops,
        reachability or id changed are judged again. Under placement, ownership or replication every topic is
        (who is the rightful core, or the best root, depends on the members)."""
        policy = self.policy
        if policy.any_hash or self.ownership.covers_anything():
            self.mark_all_dirty()
            return
        self.records_changed(changed)
        # A replicated filter's root is the component's best node: it may change with any member.
        self.dirty.update(filter_ for filter_ in (*policy.replicated, RETAINED_FILTER) if filter_ in self.topics)

    def neighbour_changed(self, announced: Address) -> None:
        """A neighbour went down, came back late or was late twice: the topics where it is our parent or child
        are judged again (a standby parent takes over, or goes back to standby)."""
        for trees in (self.memberships, self.recorded):
            tree = trees.get(announced)
            if tree is not None:
                self.dirty.update(tree.entries)
        self.dirty.update(filter_ for filter_, parents in self._watching.items() if announced in parents)

    def watched_late(self) -> None:
        """A watched data parent was late twice: the topics with a standby parent beside one are judged again."""
        self.dirty.update(self._watching)

    def records_changed(self, origins: set[Address] | frozenset[Address]) -> None:
        """New records of these nodes were stored: the topics whose cores they are are judged again (a claim the
        table now contradicts, or no longer does)."""
        for origin in origins:
            held = self.by_core.get(origin)
            if isinstance(held, str):
                self.dirty.add(held)
            elif held:
                self.dirty.update(held)

    # ------------------------------------------------------------ what the digests hold (rule 5a)

    def _digest(self, state: TopicState) -> None:
        """Bring the digests up to date with the topic's state: its claim, our memberships, our children's."""
        claim, parents, children = state.digested
        filter_ = state.filter
        viewed = hash((filter_, state.core)) or 1 if state.core is not None and filter_ != RETAINED_FILTER else 0
        if viewed != state.viewed:
            self.cores_fingerprint ^= state.viewed ^ viewed
            state.viewed = viewed
        announcement = self.current_announcement(state) if state.core is not None else None
        new_claim = claim_hash(announcement) if announcement is not None else None
        if new_claim != claim:
            self.claims.set(filter_, new_claim)
        new_parents: dict[Address, int] = NO_ENTRIES  # most topics of a node: none (a dict each cost 64 bytes)
        if state.member and state.core is not None and state.parents:
            new_parents = {parent: membership_hash(TopicSubscribe(filter_, state.core, 0 if parent in state.data_parents
                                                                  else FLAG_STANDBY))
                           for parent in state.parents}
        new_children: dict[Address, int] = NO_ENTRIES
        if state.core is not None and (state.children or state.standby_children):
            new_children = {}
            for kids, flags in ((state.children, 0), (state.standby_children, FLAG_STANDBY)):
                for child in kids:
                    new_children[child] = membership_hash(TopicSubscribe(filter_, state.core, flags))
        if new_parents != parents:
            self._move(self.memberships, filter_, parents, new_parents)
        if new_children != children:
            self._move(self.recorded, filter_, children, new_children)
        if new_claim != claim or new_parents != parents or new_children != children:
            state.digested = (new_claim, new_parents, new_children)

    @staticmethod
    def _move(trees: dict[Address, DigestTree[str]], filter_: str, old: dict[Address, int],
              new: dict[Address, int]) -> None:
        for neighbour in old.keys() - new.keys():
            tree = trees.get(neighbour)
            if tree is not None:
                tree.set(filter_, None)
                if not tree:
                    del trees[neighbour]
        for neighbour, value in new.items():
            if old.get(neighbour) != value:
                trees.setdefault(neighbour, DigestTree()).set(filter_, value)

    def _schedule(self, state: TopicState, now: float) -> None:
        """When the topic's state would change with time alone, reconcile it again then (nothing refreshes it)."""
        settings = self._settings
        lifetime = settings.announcement_lifetime
        times = [received_at + lifetime for _, _, _, received_at in state.pending.values()]
        core = state.core
        if core is not None:
            if core.address != self._identity.address:
                stored = self._table.lsdb.records.get(core.address)
                if state.provisional or stored is None or stored.record.epoch < state.core_epoch:
                    times.append(state.heard_at + lifetime)  # believed that long unconfirmed (`core_alive`)
            elif not self.wants(state.filter) and not state.children:
                times.append(state.claimed_at + settings.announce_interval)  # a placed core's wait to withdraw
        else:
            if state.out_of_reach:
                times.append(state.lost_at + settings.reliable_hold)
            if state.withdrawn is not None:
                times.append(state.heard_at + lifetime)
            times.append(max(state.lost_at, state.out_of_reach_at) + lifetime)
        due = min((t for t in times if t > now), default=INFINITY)
        if due < INFINITY:
            heapq.heappush(self._rechecks, (due + 1e-6, state.filter))

    # ------------------------------------------------------------ the digests' other side (rule 5a)

    def claim_of(self, filter_: str) -> TopicCore | None:
        """The claim we hold for a filter, as we would announce it (None: none)."""
        state = self.topics.get(filter_)
        return self.current_announcement(state) if state is not None and state.core is not None else None

    def membership_of(self, filter_: str, parent: Address) -> TopicSubscribe | None:
        """Our membership toward a parent for a filter, as a `ts` carries it (None: it is not our parent)."""
        state = self.topics.get(filter_)
        if state is None or state.core is None or not state.member or parent not in state.parents:
            return None
        return TopicSubscribe(filter_, state.core, 0 if parent in state.data_parents else FLAG_STANDBY)

    def replace_recorded(self, child: Address, filters: list[str], entries: tuple[TopicSubscribe, ...],
                         now: float) -> None:
        """A child's complete memberships toward us among `filters` (the ones we record in that bucket) are
        `entries`: the ones it does not list are gone (their `ts` prune was lost), the ones it lists are taken as
        `ts` (a `ts` lost, or our record lost in a restart)."""
        listed = {entry.filter for entry in entries}
        for filter_ in filters:
            state = self.topics.get(filter_)
            if filter_ in listed or state is None:
                continue
            if state.children.pop(child, None) is not None or state.standby_children.pop(child, None) is not None:
                self._outbox.counters["memberships_repaired"] += 1
                self.dirty.add(filter_)
        for entry in entries:
            self._outbox.counters["memberships_repaired"] += 1
            self.on_topic_subscribe(entry, child, now)

    def _watch(self, state: TopicState) -> None:
        """Keep `watched_parents` current: the data parents that have a standby beside them."""
        watching = self._watching
        watched = state.data_parents if len(state.parents) > len(state.data_parents) else ()
        if watching.get(state.filter, ()) != watched:
            if watched:
                watching[state.filter] = watched
            else:
                watching.pop(state.filter, None)
            self._watched = None

    def watched_parents(self) -> frozenset[Address]:
        """The data parents (announced addresses) with a standby parent beside them, in any mesh: the node
        watches their hello backs (`NeighbourTable.next_overdue`) so a standby one can take over early."""
        watched = self._watched
        if watched is None:
            watched = self._watched = frozenset(a for parents in self._watching.values() for a in parents)
        return watched

    def _data_parents(self, parents: tuple[Address, ...]) -> tuple[Address, ...]:
        """The parents publications cross: the first `data_parents` of them that are up and answer their
        hellos (lowest ids first), and before them those that are up but late to answer (they may be alive:
        kept until they answer or go down, the next one carrying beside them); while too few are up, the first
        ones (a copy for one that is down is kept or counted as lost)."""
        wanted = self._settings.data_parents
        if len(parents) <= wanted:
            return parents
        neighbours = self._neighbours
        chosen = []
        healthy = 0
        for parent in parents:
            if healthy == wanted:
                break
            if neighbours.transport_for(parent) is not None:
                chosen.append(parent)
                if not neighbours.is_overdue(parent):
                    healthy += 1
        if len(chosen) < wanted:
            chosen += [parent for parent in parents if parent not in chosen][: wanted - len(chosen)]
        return tuple(parent for parent in parents if parent in chosen)

    def _send_subscribe(self, state: TopicState, parent: Address, prune: bool, standby: bool = False) -> None:
        transport = self._neighbours.transport_for(parent)
        if transport is None or state.core is None:
            return
        flags = FLAG_PRUNE if prune else FLAG_STANDBY if standby else 0
        self._outbox.send(TOPIC_SUBSCRIBE, TopicSubscribe(state.filter, state.core, flags), [transport])

    def periodic(self, now: float) -> None:
        """Every announce interval: refresh ownerships, expire the children of neighbours that went down. Claims
        and memberships are not refreshed: the digests keep them (rule 5a), so this costs nothing per filter."""
        self.announce_ownership()
        if self.ownership.expire(self._settings.announcement_lifetime, now):
            self.mark_all_dirty()
        for filter_ in sorted(self._expiring):
            state = self.topics.get(filter_)
            if state is None:
                self._expiring.discard(filter_)
                continue
            finite = False
            for children in (state.children, state.standby_children):
                for child, until in list(children.items()):
                    if until < now:
                        del children[child]
                        self.dirty.add(filter_)
                    elif until < INFINITY:
                        finite = True
            if not finite:
                self._expiring.discard(filter_)

    def neighbour_down(self, announced: Address, now: float) -> None:
        """A neighbour went down: its memberships expire an announcement lifetime from now unless it comes back
        (its `ts`, or the digests, renew them) — until then a QoS 1/2 copy for it is kept (rule 7a)."""
        expires = now + self._settings.announcement_lifetime
        for filter_, state in self.topics.items():
            for children in (state.children, state.standby_children):
                if children.get(announced) == INFINITY:
                    children[announced] = expires
                    self._expiring.add(filter_)

    def prune_all(self) -> None:
        """On a clean shutdown: leave every mesh at once."""
        for state in self.topics.values():
            for parent in state.parents:
                self._send_subscribe(state, parent, prune=True)
            if self.is_own_core(state):
                self.announce(state, 0.0, withdrawn=True)
        self.announce_ownership(withdrawn=True)

    # ------------------------------------------------------------ timers and claims

    def allow_claims_at(self, when: float) -> None:
        """No claims before `when` (the node, at its start: neighbours first tell it of the live cores)."""
        self.claim_allowed_at = when
        self._claims_open = False

    def allow_claims_by(self, when: float) -> None:
        """Claims are allowed at `when` at the latest (the node, when every neighbour it hears is syncing)."""
        self.claim_allowed_at = min(self.claim_allowed_at, when)

    def about_to_claim(self, now: float) -> bool:
        """Would the mesh claim a topic core now (a subscribed filter without a core, claims allowed)?"""
        if now < self.claim_allowed_at:
            return False
        # The wanted filters are few beside the topics (every core the federation knows): look at those only, as
        # this is asked after every input while the table is stale.
        topics = self.topics
        wanted = (*(filter_ for filter_, count in self._local_interest.items() if count > 0),
                  *self.policy.replicated, RETAINED_FILTER)
        return any((state := topics.get(filter_)) is not None and state.core is None for filter_ in wanted)

    def next_deadline(self, last_input_at: float) -> float | None:
        """The earliest held publication's deadline, topic reconsidered with time (`_schedule`), or when claims
        become allowed if a filter waits for them (and that is after `last_input_at`, the time of the node's
        latest input)."""
        held = self.next_held_deadline()
        deadlines = [held] if held is not None else []
        if self._rechecks:
            deadlines.append(self._rechecks[0][0])
        if not self._claims_open and self.claim_allowed_at > last_input_at:
            deadlines.append(self.claim_allowed_at)
        return min(deadlines) if deadlines else None

    def on_timer(self, now: float) -> None:
        if not self._claims_open and now >= self.claim_allowed_at:
            # Claims are allowed from now: every topic is judged once (a subscribed filter without a core claims,
            # a better root takes a replicated filter over); after that, a topic is judged when it changes.
            self._claims_open = True
            self.mark_all_dirty()
        rechecks = self._rechecks
        while rechecks and rechecks[0][0] <= now:
            self.dirty.add(heapq.heappop(rechecks)[1])
        self.expire_held(now)

    # ------------------------------------------------------------ status

    def describe(self, now: float) -> list[dict[str, Any]]:
        """Status rows: one per federated filter."""
        rows = []
        for filter_, state in sorted(self.topics.items()):
            rows.append({
                "filter": filter_, "core": id_text(state.core), "own_core": self.is_own_core(state),
                "distance": state.core_distance if state.core else None, "member": state.member,
                "parents": [str(p) for p in state.parents], "children": [str(c) for c in sorted(state.children)],
                "standby_parents": [str(p) for p in state.parents if p not in state.data_parents],
                "standby_children": [str(c) for c in sorted(state.standby_children)],
                "local_subscribers": self._local_interest.get(filter_, 0),
                "held": len(state.held) + len(state.held_reliable),
                "mode": self.policy.mode_name(filter_), "placed": state.provisional,
            })
        return rows
