"""One topic's state, and what the three parts of the mesh engine share.

Theory of operation
-------------------
A federated topic is a subscription filter; `TopicState` is everything a
node knows of one: its core and how fresh that core's claim is, whether we
are a member of its mesh, our parents and children in it, the publications
held while it has no core, and the cached forwarding decisions
(`ForwardingCache`) that spare each publication the routing work.

The mesh engine (`federation.protocol.mesh.MeshEngine`) is one part of the
node, written in three modules by concern, each a layer of one class over
`TopicTable`, which holds the topics and the part's narrow context:
`federation.protocol.cores` decides who is the core of each topic,
`federation.protocol.forwarding` moves publications over the meshes, and
`federation.protocol.mesh` keeps the meshes themselves (who is a member,
parents and children) and composes the three. The engine never sees the
node: it is given an outbox, read-only views of who the node is, of the
federation table and of the neighbours, the node's local interest (filter ->
local subscriptions), which neighbours pace us, and the node's functions
for the QoS 1/2 copies it sends and holds (`track`, `held`, `unheld`,
`give_back`: reliable forwarding and custody) and the mesh neighbours it
gains (`new_mesh_neighbour`).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from federation.protocol.context import IdentityView, NeighboursView, Outbox, TableView
from federation.protocol.digest_tree import DigestTree
from federation.protocol.modes import RETAINED_FILTER, ModePolicy
from federation.protocol.ownership import OwnershipTable
from federation.protocol.topic_filter import FilterIndex
from federation.protocol.types import Address, BrokerId
from federation.protocol.wire_types import TopicCore, TopicMessage

ClaimKey = tuple[int, int, BrokerId]
"""(0 for the owner else 1, -capability or -rendezvous weight or 0, id): the lowest key is the best claim"""

Track = Callable[[list[TopicMessage], list[Address]], None]
"""the node's `track`: called with every QoS 1/2 copy the mesh sends, and where it went (reliable forwarding
retransmits it, custody waits for it)"""
HoldChange = Callable[[TopicMessage], None]
"""the node's `held` (a QoS 1/2 publication is held: custody waits for it), `unheld` (it left the hold: routed
on, its copies tracked first) and `give_back` (a neighbour's QoS 1/2 publication pushed out of a full hold:
left unacknowledged, its sender still has it)"""
NewMeshNeighbour = Callable[[str, Address, float], None]
"""reliable forwarding's `mesh_neighbour_added`: called at once for each new mesh neighbour (filter, announced
address, now), which is sent the recent QoS 1/2 publications of the filter"""


INFINITY = float("inf")


class _NothingHeld(deque["HeldPublication"]):
    """What a topic that never held a publication holds: shared by all of them (a deque is 600 bytes, a topic holds
    nothing most of its life), so nothing may be added to it; `_hold` gives the topic a deque of its own first."""

    def append(self, item: HeldPublication) -> None:
        raise TypeError("the shared empty hold: give the topic a deque of its own first")

    appendleft = extend = extendleft = insert = append  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]  # shared and never changing: a default must hash
        return id(self)


NOTHING_HELD: deque[HeldPublication] = _NothingHeld()


class _NoEntries(dict[Any, Any]):
    """The children, standby children and pending claims of a topic that has none: one table shared by all of them
    (three empty dicts cost 192 bytes a topic, and most of a node's topics have none: every node of a 1,000-broker
    simulation knows 1,000 topics whose meshes it is not in), so nothing may be written to it;
    `TopicState.own_children` and its siblings give the topic a dict of its own first."""

    __slots__ = ()

    def __setitem__(self, key: Any, value: Any) -> None:
        raise TypeError("the shared empty table: give the topic a dict of its own first")

    def setdefault(self, key: Any, default: Any = None) -> Any:
        raise TypeError("the shared empty table: give the topic a dict of its own first")

    def update(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("the shared empty table: give the topic a dict of its own first")

    def __ior__(self, other: Any) -> Any:  # type: ignore[misc]
        raise TypeError("the shared empty table: give the topic a dict of its own first")

    def __hash__(self) -> int:  # type: ignore[override]  # shared and never changing: a default must hash
        return id(self)


NO_ENTRIES: dict[Any, Any] = _NoEntries()


@dataclass(slots=True)
class HeldPublication:
    deadline: float
    """when it is dropped (`publication_hold` for QoS 0, `reliable_hold` for QoS 1/2)"""
    message: TopicMessage
    source: Address | None
    """the neighbour (announced address) it came from, which routing excludes; None: ours, or routed again"""
    size: int
    routes: object = None
    """the routes it was held with: once they changed, a QoS 1/2 one whose only way is back to `source` goes
    back there (the source may have become a mesh member, or found another way)"""


# ---------------------------------------------------------------- the forwarding decision and its cache

@dataclass(slots=True)
class Forward:
    """Send to `transports`: every up mesh neighbour (mode in-mesh), or one parent (mode toward the core)."""

    mode: int
    transports: list[Address]
    """in-mesh: the up mesh neighbours' transports, sorted by announced address; toward the core: the first up
    parent in id order (not the neighbour it came from)"""
    texts: list[str]
    """`str` of each transport, for the `publications_forwarded` event"""
    lost: int = 0
    """in-mesh: mesh neighbours already down (their copies are counted as lost)"""
    down: list[Address] | None = None
    """in-mesh: the transports of mesh neighbours that are down, for QoS 1/2 copies kept for them"""


LEAF = "leaf"
"""a mesh member with nobody else to send to: the publication ends here"""
HOLD = "hold"
"""no route toward the core yet: hold the publication"""
NO_ROUTE = "no_route"
"""parents exist but none is up (or the only one is where it came from): QoS 0 dropped and reported, QoS 1/2
held"""

Decision = Forward | str


class ForwardingCache:
    """The forwarding decisions of one topic (`federation.protocol.forwarding`), valid while their inputs are
    unchanged."""

    __slots__ = ("inputs", "children", "decisions")

    def __init__(self) -> None:
        self.inputs: tuple[object, ...] = ()
        self.children: frozenset[Address] = frozenset()
        self.decisions: dict[Address | None, Decision] = {}


# ---------------------------------------------------------------- one topic

@dataclass(slots=True)
class TopicState:
    filter: str
    core: BrokerId | None = None
    core_epoch: int = 0
    core_seq: int = 0
    core_distance: int = 0
    heard_at: float = float("-inf")
    via: tuple[Address, ...] = ()
    """announced addresses of the neighbours that delivered the freshest `tc` at the shortest distance (a tuple: one
    or two, a set cost 200 bytes a topic)"""
    own_seq: int = 0
    children: dict[Address, float] = NO_ENTRIES
    """child (announced address) -> when its membership expires (infinity while it is up: a membership is kept
    by digests, not refreshed, rule 5a): the children we send publications to"""
    standby_children: dict[Address, float] = NO_ENTRIES
    """children that keep us as a standby parent (`ts` with the standby flag) -> expiry: sent no publications
    until one subscribes without the flag (its data parent went down); they do not make us a member"""
    parents: tuple[Address, ...] = ()
    data_parents: tuple[Address, ...] = ()
    """the parents publications cross (the first `data_parents` of `parents` that are up); the others are
    standby"""
    member: bool = False
    withdrawn: tuple[BrokerId, int, int] | None = None
    """the last withdrawal heard (core, epoch, seq): older claims of that core are ignored"""
    held: deque[HeldPublication] = NOTHING_HELD
    """QoS 0 publications held, oldest first (each until its deadline); NOTHING_HELD while it held none"""
    held_reliable: deque[HeldPublication] = NOTHING_HELD
    """QoS 1/2 publications held, oldest first (until they can go on); NOTHING_HELD while it held none"""
    pending: dict[BrokerId, tuple[TopicCore, Address, Address, float]] = NO_ENTRIES
    """claims of cores the table does not show reachable yet: retried when routes change"""
    core_rank: int = 0
    """the rank (capability) carried by the core's claim"""
    provisional: bool = False
    """the core was taken from placement (owner or rendezvous winner) and has not announced itself yet"""
    adopted_at: float = float("-inf")
    """when the current core was adopted from its announcement (a claim of another core than before)"""
    claimed_at: float = float("-inf")
    """when we last claimed this filter (a placed core waits an announce interval for children)"""
    withdrawn_at: float = float("-inf")
    """when its core last withdrew (its mesh was empty: nobody subscribes); QoS 1/2 publications are held for
    a filter whose core was lost after that, not for one withdrawn since"""
    lost_at: float = float("-inf")
    """when its core was last lost (unreachable or silent): the filter is kept an announcement lifetime,
    so publications matching it are held and reported (`no_core`), not silently unmatched"""
    lost_core: Address | None = None
    """the address of the core last lost (None: not known, as for a filter an earlier life knew)"""
    out_of_reach_at: float = float("-inf")
    """when the lost core was last seen out of the table's reach: the filter is kept an announcement lifetime
    after that too, so a partition longer than the lifetime does not make the origin forget it"""
    out_of_reach: bool = False
    """the lost core was out of the table's reach at the last reconciliation (within `reliable_hold` of the loss)"""
    viewed: int = 0
    """its (filter, core) pair's part of `TopicTable.cores_fingerprint` (0: none)"""
    indexed: tuple[Address, ...] = ()
    """the addresses of its core and pending claims' cores as `TopicTable.by_core` holds them"""
    digested: tuple[int | None, dict[Address, int], dict[Address, int]] = (None, NO_ENTRIES, NO_ENTRIES)
    """what the digests hold for this filter (rule 5a): the claim's hash, our membership's toward each parent and
    each child's as we record it"""
    forwarding: ForwardingCache | None = field(default=None, repr=False, compare=False)
    """where publications go next, kept while nothing it depends on changes (`federation.protocol.forwarding`)"""

    @property
    def freshness(self) -> tuple[int, int]:
        return (self.core_epoch, self.core_seq)

    def forget_children(self) -> None:
        """The core changed or went: the children, data and standby, joined another mesh."""
        self.children = self.standby_children = NO_ENTRIES

    def own_children(self, standby: bool = False) -> dict[Address, float]:
        """The data (or standby) children's table, made the topic's own if it was the shared empty one."""
        if standby:
            if self.standby_children is NO_ENTRIES:
                self.standby_children = {}
            return self.standby_children
        if self.children is NO_ENTRIES:
            self.children = {}
        return self.children

    def own_pending(self) -> dict[BrokerId, tuple[TopicCore, Address, Address, float]]:
        """The pending claims' table, made the topic's own if it was the shared empty one."""
        if self.pending is NO_ENTRIES:
            self.pending = {}
        return self.pending


# ---------------------------------------------------------------- the topics and the mesh engine's context

class TopicTable:
    """The topics of one node and the context the mesh engine is given (see the module docstring)."""

    _claims_open = False
    """claims have been allowed since `claim_allowed_at`, and every topic was judged then"""
    claim_allowed_at = float("inf")
    """no topic core is claimed before this (the node has just started: its neighbours first tell it the live
    ones); publications matching no filter before it may match one the node is about to learn"""

    def __init__(self, identity: IdentityView, table: TableView, neighbours: NeighboursView, outbox: Outbox,
                 rng: random.Random, local_interest: Mapping[str, int], paced_by: Mapping[Address, float],
                 track: Track, new_mesh_neighbour: NewMeshNeighbour, held: HoldChange, unheld: HoldChange,
                 give_back: HoldChange) -> None:
        settings = identity.settings
        self._identity = identity
        self._settings = settings
        self._table = table
        self._neighbours = neighbours
        self._outbox = outbox
        self._rng = rng
        self._local_interest = local_interest
        """federated filter -> local subscriptions to it (read only)"""
        self._paced_by = paced_by
        """transport of each neighbour pacing us -> end of its hold (`Pacing.paced_until`, read only)"""
        self._track = track
        self._new_mesh_neighbour = new_mesh_neighbour
        self._held = held
        self._unheld = unheld
        self._give_back = give_back
        self.topics: dict[str, TopicState] = {}
        self.index = FilterIndex()
        self.dirty: set[str] = set()
        """filters to reconcile (`MeshEngine.reconcile`) before the input is done"""
        self._watching: dict[str, tuple[Address, ...]] = {}
        """filter -> its data parents that have a standby beside them (`MeshEngine.watched_parents`)"""
        self._watched: frozenset[Address] | None = None
        """the union of `_watching` (None: to compute again)"""
        self.held_count = 0
        self.held_bytes = 0
        self.held_reliable_count = 0
        self.refused_topics = 0
        """filters refused for want of room (`max_topics`), since the start"""
        self.last_refused: str | None = None
        """the latest filter refused"""
        self.claims: DigestTree[str] = DigestTree()
        """filter -> the hash of the live core's claim we hold (rule 5a)"""
        self.memberships: dict[Address, DigestTree[str]] = {}
        """parent (announced address) -> filter -> the hash of our membership toward it"""
        self.recorded: dict[Address, DigestTree[str]] = {}
        """child (announced address) -> filter -> the hash of its membership as we record it"""
        self.claim_seq = 0
        """the sequence number of our latest claim or withdrawal, every filter together: a withdrawal made after
        the filter's state was forgotten is still newer than any claim of this life"""
        self._rechecks: list[tuple[float, str]] = []
        """(when, filter): a topic whose state changes with time alone, reconciled again then (a heap)"""
        self._expiring: set[str] = set()
        """filters with a child whose membership expires (it went down)"""
        self.cores_fingerprint = 0
        """the XOR of the hashes of every (filter, core) pair `cores` gives: the view's cores, told apart cheaply"""
        self.cores_lost = False
        """a core was lost since the node last looked (it asks the neighbours for their claims)"""
        self.by_core: dict[Address, str | set[str]] = {}
        """core address -> the filters whose core, or a pending claim's core, it is: what a new record of that
        node may change (`records_changed`); one filter held as itself (a set cost 200 bytes a core)"""
        self.policy = ModePolicy.from_settings(settings)
        self.ownership = OwnershipTable(settings.owned, settings.max_topics)
        for filter_ in self.policy.replicated:
            if self.state(filter_) is not None:  # every node is a member of a replicated filter's mesh
                self.dirty.add(filter_)

    def state(self, filter_: str, create: bool = True, beyond_limit: bool = False) -> TopicState | None:
        """The filter's state, made if `create`; None when `max_topics` filters are known (counted: drop
        `topic_table_full`, and `last_refused`), unless `beyond_limit` (the `#` that covers what was refused)."""
        state = self.topics.get(filter_)
        if state is None and create:
            if len(self.topics) >= self._settings.max_topics and not beyond_limit:
                self.refused_topics += 1
                self.last_refused = filter_
                self._outbox.drop("topic_table_full")
                return None
            state = TopicState(filter_)
            self.topics[filter_] = state
            if filter_ != RETAINED_FILTER:  # carries retained publications whatever their topic: never matched
                self.index.add(filter_)
        return state

    def is_own_core(self, state: TopicState) -> bool:
        return state.core is not None and state.core == self._identity.broker_id

    def cores(self) -> dict[str, BrokerId]:
        """The core of every filter that has one (the view's topic cores), the built-in retained tree's left out:
        every node has it, so it says nothing about subscriptions (its row is in `MeshEngine.describe`)."""
        return {f: s.core for f, s in sorted(self.topics.items()) if s.core is not None and f != RETAINED_FILTER}

    def mark_all_dirty(self) -> None:
        self.dirty.update(self.topics)

    def matching(self, topic: str) -> list[str]:
        return self.index.matching(topic)

    def wants(self, filter_: str) -> bool:
        """Does this node need the filter's mesh (local subscribers, or a replicated filter)?"""
        return self._local_interest.get(filter_, 0) > 0 or self.policy.is_replicated(filter_)

    def parents_for(self, state: TopicState) -> tuple[Address, ...]:
        """The neighbours (announced addresses) on shortest paths toward the filter's core that we take as
        parents: the lowest ids first, as many as the filter's redundancy."""
        assert state.core is not None
        routes = self._table.routes
        hops = routes.next_hops.get(state.core.address)
        if not hops:
            hops = frozenset(a for a in state.via if self._neighbours.transport_for(a) is not None)
        if len(hops) == 1:  # the common case, on every publication routed toward the core: nothing to rank
            return tuple(hops)[: self.policy.parents(state.filter, self._settings.redundancy)]
        ranked = sorted(hops, key=lambda a: routes.ids.get(a, BrokerId(2**64, a)))
        return tuple(ranked[: self.policy.parents(state.filter, self._settings.redundancy)])
