"""The protocol node: one wrapper's brain, with no I/O of its own.

Inputs: protocol packets (`receive_packet`; the envelope, federation.envelope,
makes and opens the datagrams that carry them), timer ticks (`handle_timer`),
local client activity (`local_subscribe`, `local_unsubscribe`,
`local_disconnect`) and local publications (`local_publish`,
`local_publish_run`, with their earlier ids when the embedder replays its
spool). Outputs are drained by the caller: `packets_to_send`,
`injections_to_make`, `custody_released` (our QoS 1/2 publications
delivered everywhere: the spool may forget them), `events_emitted`. Time is
always passed in and randomness comes from the RNG given at construction,
so a run replays exactly (the simulator relies on it). The embedder tells
the node about its broker and its own queues through explicit methods
(`injection_done`, `injection_failed`, `report_delivery_backlog`,
`on_receive_backlog`, `restore` after a restart, `set_configured_neighbours`
when its configuration is reloaded) and reads what it needs from read-only
properties and snapshots (`unacked_copies`,
`held_publications`, `receive_busy`, `paced_until`, `stream_positions`,
`known_filters`); it never writes the node's counters or flags.

This module is the node's boundary and what no part owns: decoding and
dispatching packets and the counters. The rest is parts with narrow
contexts (federation.protocol.context says what each is given): `liveness`
runs the hellos that tell which neighbours are up; `table` keeps the federation table current
(records, flooding, route computation, management core, id collisions);
`local` counts the local broker's subscriptions (federation.protocol.local_subscriptions);
`sync` brings neighbours' copies up to date (sync when a link comes up,
anti-entropy digests); `mesh` runs topic cores, meshes and the routing of
publications; `reliable` retransmits QoS 1/2 copies; `custody` holds each
QoS 1/2 publication until what it owes is done; `publications` numbers,
deduplicates, orders and delivers publications; `pacing` paces QoS 0 between
neighbours; `retained_sync` compares the embedder's retained store with the
neighbours' (`attach_retained`) and brings the newest values. Only the node
composes them and tells one what another's change means: a route change goes
to the mesh and the database exchange (`_update_routes`), a neighbour up or down to every part that sends to
it (`_on_hello_back`, `_neighbour_down`), a local subscription's change to the mesh or the
shared groups (`_apply`), a new vid to the mesh, an acknowledgement to neighbour
liveness, a publication forwarded to a neighbour pacing us to pacing, and
what QoS 1/2 work means across the parts to `delivery`
(federation.protocol.delivery, the node's composition for custody). After
every input, `_settle` runs what the input made due and reconciles the
topics it affected.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from federation.protocol import events, wire
from federation.protocol.context import Identity, Outbox
from federation.protocol.custody import Custody
from federation.protocol.database_sync import DatabaseSync
from federation.protocol.delivery import ReliableDelivery
from federation.protocol.events import addresses_text, id_text
from federation.protocol.forwarding import SENT_TO_PACED
from federation.protocol.linkstate import Routes
from federation.protocol.liveness import Liveness
from federation.protocol.local_subscriptions import COVER_ALL, Change, LocalSubscriptions
from federation.protocol.mesh import MeshEngine
from federation.protocol.neighbours import Neighbour, NeighbourTable
from federation.protocol.node_status import NodeView, counter_snapshot, status_document
from federation.protocol.ordering import Ordering, Position, StreamKey
from federation.protocol.pacing import Pacing
from federation.protocol.publications import Publications
from federation.protocol.receivers import Receivers
from federation.protocol.reliable import ReliableForwarding
from federation.protocol.retained_sync import RetainedIndex, RetainedSync
from federation.protocol.settings import Settings
from federation.protocol.shared import SharedGroups, split_shared
from federation.protocol.stored_records import MakeStored, stored_record
from federation.protocol.table import VID_RANGE, FederationTable
from federation.protocol.topic_sync import TopicSync
from federation.protocol.types import Address, BrokerId, Event, Injection, InjectionRun, PublicationId
from federation.protocol.wire import DecodeError
from federation.protocol.wire_types import (
    CoreAnnouncement,
    DatabaseDigest,
    DatabaseRequest,
    DatabaseSummary,
    Federate,
    Hello,
    HelloBack,
    Packet,
    ReceiverBusy,
    Reconsider,
    RetainedDigest,
    RetainedRequest,
    RetainedSummary,
    RetainedValues,
    Sender,
    TopicAck,
    TopicAcks,
    TopicBatch,
    TopicCore,
    TopicDigest,
    TopicMessage,
    TopicReliableBatch,
    TopicRequest,
    TopicSubscribe,
    TopicSubscriptions,
    TopologyUpdate,
)
from federation.protocol.wire_types import (
    SharedGroups as SharedGroupsAnnouncement,
)


class Node:
    def __init__(self, address: Address, neighbours: Iterable[Address], epoch: int, rng: random.Random,
                 settings: Settings | None = None, vid: int | None = None, name: str | None = None,
                 decode: wire.DecodeFunction = wire.decode, publication_events: bool = True,
                 make_stored: MakeStored = stored_record) -> None:
        if not 0 <= epoch <= wire.MAX_EPOCH:
            raise ValueError(f"epoch must be 0 to {wire.MAX_EPOCH} (docs/protocol.md, \"Ranges\"), got {epoch}")
        neighbours = [a for a in neighbours if a != address]
        settings = (settings if settings is not None else Settings()).with_datagram_for(
            [address.host, *(a.host for a in neighbours)])
        self._decode = decode
        """`wire.decode`; the simulator passes a cache that decodes each distinct packet once"""
        self.address = address
        self.settings = settings
        self.rng = rng
        self.name = name
        self.identity = Identity(address, vid if vid is not None else rng.randrange(VID_RANGE), epoch, settings,
                                 name)
        self.neighbours = NeighbourTable(neighbours, settings.max_neighbours)
        self.outbox = Outbox(self.identity, self.neighbours, publication_events)
        """what the parts send, emit and count (`packets_to_send`, `events_emitted`, `injections_to_make`)"""
        self.drop = self.outbox.drop
        """count a drop by reason, optionally with its event (`Outbox.drop`: the one way drops are counted)"""
        self.emit = self.outbox.emit
        self.table = FederationTable(self.identity, self.neighbours, self.outbox, rng, make_stored)
        """origination and flooding of records, route computation, management core, id collisions; `make_stored`:
        what it stores a record as (the simulator passes a `stored_records.RecordPool` its nodes share)"""
        self.pacing = Pacing(self._send_receiver_busy)
        """QoS 0 pacing with the neighbours (`rb`): see `on_receive_backlog` and `paced_until`"""
        self.custody = Custody(self.outbox, address, lambda filter_: self.mesh.wants(filter_))
        """the QoS 1/2 (publication, filter) pairs taken and not yet acknowledged, and what each waits for"""
        self.delivery = ReliableDelivery(settings, self.outbox, self.neighbours, self.custody)
        """what QoS 1/2 work means across the parts (custody): bound to them below"""
        delivery = self.delivery
        self.liveness = Liveness(settings, self.neighbours, self.outbox, rng)
        """the hellos and their answers: which neighbours are up (rule 1)"""
        self.reliable = ReliableForwarding(settings, self.neighbours, self.outbox, rng, delivery.route_again,
                                           delivery.track)
        """unacknowledged QoS 1/2 `tm` copies and their retransmission timers"""
        self.local = LocalSubscriptions(self.emit, settings.aggregate_fanout, settings.aggregate_linger,
                                        settings.aggregate_delay)
        """the local broker's subscriptions: per client, per federated filter, since when"""
        local = self.local
        self.mesh = MeshEngine(self.identity, self.table, self.neighbours, self.outbox, rng, local.wanted,
                               self.pacing.paced_until, delivery.track, self.reliable.mesh_neighbour_added,
                               self.custody.held, self.custody.unheld, delivery.give_back)
        """topic cores, meshes and the routing of publications"""
        self.sync = DatabaseSync(self.identity, self.table, self.neighbours, self.outbox,
                                 self._topic_announcements)
        """the database exchange with neighbours: sync when a link comes up, anti-entropy digests"""
        self.topic_sync = TopicSync(self.neighbours, self.outbox, self.mesh)
        """the digests of the topic cores' claims and of the mesh memberships with each neighbour (rule 5a)"""
        self.shared = SharedGroups(self.identity, self.table, self.neighbours, self.outbox, delivery.track)
        """the shared subscription groups with members federation-wide (`sg`, mode 2 copies: rule 9)"""
        self.publications = Publications(self.identity, self.outbox, self.mesh, local.aggregation.matching,
                                         self.custody, Ordering(settings, self.outbox, local.interest_since,
                                                                self.custody.held, self.custody.unheld,
                                                                self._in_reach),
                                         self.shared)
        """our publications and the ones received: numbering, duplicate caches, order, local delivery"""
        self.receivers = Receivers(self.identity, self.table, self.neighbours, self.outbox, self.custody,
                                   delivery.track, self.reliable.cancel)
        """our publications' receivers, what awaits those it did not reach, and its repair (rule 7f)"""
        custody = self.custody
        custody.targets, custody.own_closed = self.receivers.targets, self.receivers.own_closed
        custody.repair_closed = self.receivers.repair_closed
        delivery.bind(self.reliable, self.mesh, self.publications, self.receivers)
        self.retained_sync = RetainedSync(self.outbox, self.publications.mark_injected)
        """the anti-entropy of the embedder's retained store with the neighbours' (`attach_retained`)"""
        self._restored_filters: list[str] = []
        self._restored = False
        self.received_by_type: Counter[str] = Counter()
        self.received_bytes_by_type: Counter[str] = Counter()
        self.last_input_at = 0.0
        self.started_at: float | None = None
        self.stopped = False
        self.next_announce = float("inf")
        self.next_stats = float("inf")
        self._refused_reported = 0
        """`mesh.refused_topics` when the last `topic_table_full` event was made"""
        self._refused_at = float("-inf")
        self._next_limits_event = float("-inf")

    # ------------------------------------------------------------ identity, view, counters (read-only)

    @property
    def broker_id(self) -> BrokerId:
        return self.identity.broker_id

    @property
    def vid(self) -> int:
        return self.identity.vid

    @property
    def epoch(self) -> int:
        return self.identity.epoch

    @property
    def routes(self) -> Routes:
        return self.table.routes

    @property
    def management_core(self) -> BrokerId:
        return self.table.management_core

    @property
    def version(self) -> int:
        """Changes whenever `view()` may have changed (cheaper than building the view)."""
        return self.outbox.version

    def view(self) -> NodeView:
        return NodeView(self.broker_id, self.routes.members, self.management_core, self.mesh.cores, self.version,
                        self.mesh.cores_fingerprint)

    def local_count(self, filter_: str) -> int:
        return self.local.filter_refs.get(filter_, 0)

    @property
    def counters(self) -> Mapping[str, int]:
        return self.outbox.counters

    @property
    def drops(self) -> Mapping[str, int]:
        return self.outbox.drops

    @property
    def sent_by_type(self) -> Mapping[str, int]:
        return self.outbox.sent_by_type

    @property
    def sent_bytes_by_type(self) -> Mapping[str, int]:
        return self.outbox.sent_bytes_by_type

    @property
    def publication_events(self) -> bool:
        """Whether the node makes the events made per publication and hop (`events.PER_PUBLICATION`); the
        daemon leaves them out (constructor argument) when its event log would not keep them, as they cost
        25-30% of the data path's CPU."""
        return self.outbox.publication_events

    # ------------------------------------------------------------ outputs

    def packets_to_send(self) -> list[tuple[bytes, Address]]:
        return self.outbox.take_packets()

    def injections_to_make(self) -> list[Injection]:
        """Remote publications for the local broker, in the order to inject them; report each QoS 1/2 one with
        `injection_done` once the broker has it (or `injection_failed`)."""
        return self.outbox.take_injections()

    def injections_and_runs_to_make(self) -> list[Injection | InjectionRun]:
        """`injections_to_make`, with the QoS 0 runs of `tb`s taken whole as they are (`InjectionRun`, which
        `expand_runs` turns into the `Injection`s `injections_to_make` gives)."""
        return self.outbox.take_injections_and_runs()

    def custody_released(self) -> list[PublicationId]:
        """Our own QoS 1/2 publications delivered everywhere since the last call: the embedder's spool may
        forget them. Drain it as the other outputs (it grows until drained)."""
        return self.custody.take_released()

    def events_emitted(self) -> list[Event]:
        return self.outbox.take_events()

    # ------------------------------------------------------------ the embedder's queues

    def report_delivery_backlog(self, backlogged: bool) -> None:
        """The embedder says whether the publications waiting for the local broker are nearly too many to
        keep: while they are, new QoS 1/2 copies are left unacknowledged (their senders send them again)
        instead of being acknowledged and then dropped on the way into the broker."""
        self.reliable.delivery_backlogged = backlogged

    @property
    def delivery_backlogged(self) -> bool:
        return self.reliable.delivery_backlogged

    def report_storage(self, writable: bool) -> None:
        """The embedder says whether it can write what a restart needs (its injection journal: a full disk): while
        it cannot, new QoS 1/2 copies are left unacknowledged (drop `storage_unavailable`; their senders keep them
        and send them again) rather than taken without a record that would keep a QoS 2 one from being injected
        twice after a restart."""
        self.reliable.storage_unavailable = not writable

    def next_publication_ids(self, topics: list[str]) -> list[PublicationId | None]:
        """The ids `local_publish` and `local_publish_run` will give the next local publications on `topics`, in
        order (None for a `$` topic), without giving them: the embedder writes its spool before it hands them over
        (a full disk then keeps them at its broker, never half-taken)."""
        return self.publications.next_ids(topics)

    @property
    def unacked_copies(self) -> int:
        """QoS 1/2 copies sent and not yet acknowledged by the next hop (with custody: not yet delivered everywhere
        beyond it): the embedder's backpressure window (it stops reading its broker while many). The orphans (copies
        nobody waits for: replays, copies kept for a mesh neighbour that is down, rule 7f) are left out."""
        return self.reliable.owned_copies

    @property
    def unacked_bytes(self) -> int:
        """The payload bytes of those copies: the embedder's backpressure window in bytes (large publications fill
        it long before the count)."""
        return self.reliable.owned_bytes

    @property
    def held_publications(self) -> int:
        """QoS 1/2 publications held for want of a core or a route (our own, and neighbours'): not counted in
        `unacked_copies`, so a filter whose subscribers are cut off does not stop the others; the embedder's
        spool bounds our own (and `reliable_hold`)."""
        return self.mesh.held_reliable_count

    def injection_done(self, publication: PublicationId, now: float) -> None:
        """The local broker has this injected QoS 1/2 publication (PUBACK, or PUBREC for QoS 2): the node's
        custody of it may be complete, and the copy it came in acknowledged. Unknown ids (QoS 0) are ignored."""
        self.receivers.now = now
        self.delivery.injection_done(publication)

    def injection_failed(self, publication: PublicationId, now: float) -> None:
        """This injection will not happen (the embedder dropped it): the copy it came in is given back
        unacknowledged, so its sender's next retransmission is taken and injected again."""
        self.receivers.now = now
        self.delivery.injection_failed(publication)

    def hold_unmatched(self) -> None:
        """From now on, a publication that comes on a filter the local broker federates and matches no local
        subscription the node knows is handed over all the same, marked (`Injection.unmatched_hops`), and counted
        `publications_unmatched`: the embedder learns its broker's subscriptions some time after the broker took
        them (a log it reads), so a subscriber may be there already. It holds the publication until it has read its
        broker up to a point after the publication arrived, then settles it (`settle_unmatched`)."""
        wanted = self.local.wanted
        self.publications.unmatched_filter = wanted.__contains__  # the mesh's local interest: never replaced

    def settle_unmatched(self, injection: Injection, now: float, confirmed: bool = True) -> bool:
        """A marked injection (`hold_unmatched`), once the embedder has read its broker's subscriptions up to a
        point after it arrived (`confirmed`), or gave up waiting. True: a local subscription matches it now; it is
        delivered (counted, evented) and the embedder injects it as any other. False: it is not injected; a QoS
        1/2 one's copy is acknowledged (nobody here wants it); `confirmed`, it is counted
        `publications_not_subscribed` (the broker has no subscriber for it: what a covering filter brings,
        docs/protocol.md "Aggregation"), else the embedder counts it as the drop it is."""
        origin, epoch, seq = injection.publication
        outbox = self.outbox
        if self.local.aggregation.matching(injection.topic):
            outbox.counters["publications_delivered"] += 1
            if outbox.publication_events:
                outbox.runs.delivered(now, origin, epoch, seq, injection.topic, injection.filter,
                                      injection.unmatched_hops or 0)
            return True
        if confirmed:
            outbox.counters["publications_not_subscribed"] += 1
        if injection.qos:
            self.injection_done(injection.publication, now)
        return False

    def restore(self, injected: Iterable[PublicationId] = (),
                streams: Mapping[StreamKey, Position] | None = None, filters: Iterable[str] = (),
                receivers: Mapping[str, Iterable[str]] | None = None) -> None:
        """After a restart, before `start`: what the embedder's journal says the local broker already has
        (`injected`: those ids are never injected again), how far each QoS 1/2 stream had passed
        (`streams`: (origin, filter) -> (epoch, seq), the latest `Injection.publication` of each
        `Injection.filter` journaled, or `stream_positions()` saved), so order goes on where it was, and the
        filters the earlier life knew (`filters`, `known_filters()` saved): QoS 1/2 publications on them are
        held until their core is heard of, even if that takes a partition's healing; and the receivers of our
        filters it knew (`receivers`, `receivers_known()` saved), so that what it replays from its spool still
        awaits the brokers behind a partition (rule 7f)."""
        self.publications.mark_injected(list(injected))
        if receivers:
            self.receivers.restore(receivers, 0.0)
        if streams:
            self.publications.ordering.restore(dict(streams))
        self._restored_filters = sorted(set(filters))
        self._restored = True

    def attach_retained(self, index: RetainedIndex) -> None:
        """The embedder's retained store (federation.protocol.retained_sync.RetainedIndex; give it before `start`),
        which the node reads to compare with its neighbours' and bring over the newest values (docs/protocol.md
        rule 10); the values it brings come out of `injections_to_make` with retain, and the embedder stores them
        (newest wins) as any other. Without one the node takes no part in that exchange."""
        self.retained_sync.index = index

    def known_filters(self) -> list[str]:
        """The federated filters this node knows (a core, or one lost lately), for the embedder to save and give
        back to `restore`."""
        return self.mesh.known_filters()

    @property
    def receivers_changes(self) -> int:
        """Moves whenever `receivers_known` changed (the embedder saves it then)."""
        return self.receivers.changes

    def receivers_known(self) -> dict[str, list[str]]:
        """The brokers known to subscribe to each filter we publish on ("host:port"), for the embedder to save and
        give back to `restore` (rule 7f)."""
        return self.receivers.snapshot()

    def stream_positions(self) -> dict[StreamKey, Position]:
        """How far each QoS 1/2 stream has passed here, for the embedder to save and give back to `restore`."""
        return self.publications.ordering.positions()

    def on_receive_backlog(self, length: int, sources: Iterable[Address], now: float) -> None:
        """The embedder's receive backlog holds `length` packets after a read that queued `tm` from `sources`
        (transport addresses; empty after a pass that only handled some). Only neighbours are told to pace
        (`rb`): a datagram's source address may be forged."""
        neighbours = self.neighbours
        self.pacing.on_receive_backlog(length, (source for source in sources if neighbours.get(source)), now)

    @property
    def receive_busy(self) -> bool:
        """Our receive backlog went over the pacing mark and has not fallen back yet (`Pacing.busy`)."""
        return self.pacing.busy

    def paced_until(self, now: float) -> float | None:
        """The end of the longest hold a neighbour put on us (`rb`), or None when none paces us: the embedder
        reads no publications from its broker meanwhile. Asked first when draining the outputs: a hold that
        ended makes the ready we owe the neighbours we paced."""
        return self.pacing.paced(now)

    # ------------------------------------------------------------ lifecycle

    def start(self, now: float) -> None:
        self.started_at = now
        self.receivers.now = now
        self.mesh.allow_claims_at(now + 2 * self.settings.hello_interval)
        self.mesh.remember_filters(self._restored_filters, now)
        self.emit(events.NODE_STARTED, now, broker_id=id_text(self.broker_id), epoch=self.epoch, name=self.name,
                  neighbours=addresses_text([n.transport for n in self.neighbours.all()]))
        self.table.originate(now)
        self.liveness.send_all(now)
        self.next_announce = now + self.settings.announce_interval * (1 + 0.1 * self.rng.random())
        self.next_stats = now + self.settings.stats_interval
        self.outbox.view_changed()
        self._settle(now)

    def shutdown(self, now: float) -> None:
        """Leave cleanly: withdraw claims, prune meshes, announce the departure."""
        if self.stopped:
            return
        self.mesh.prune_all()
        self.shared.leave()
        self.table.announce_leaving()
        self.emit(events.NODE_STOPPED, now, counters=self._counter_snapshot())
        self.stopped = self.outbox.closed = True

    def get_timer(self) -> float | None:
        if self.started_at is None or self.stopped:
            return None
        candidates = [self.liveness.next_hello, self.next_announce, self.next_stats, *self.table.next_deadlines()]
        if self.publications.parked:
            candidates.append(self.publications.unpark_at(self.mesh.claim_allowed_at))
        for deadline in (*self.liveness.deadlines(self.mesh.watched_parents(), self.last_input_at),
                         self.mesh.next_deadline(self.last_input_at), self.reliable.next_deadline(),
                         self.sync.next_deadline(), self.publications.ordering.next_deadline(),
                         self.receivers.next_deadline(),
                         self.local.next_release(), self.local.next_flush(), self.topic_sync.next_deadline()):
            if deadline is not None:
                candidates.append(deadline)
        return min(candidates)

    def handle_timer(self, now: float) -> None:
        if self.started_at is None or self.stopped:
            return
        self.receivers.now = now
        for neighbour in self.neighbours.expire(self.settings.neighbour_dead_after, now):
            self._neighbour_down(neighbour, now)
        if self.liveness.probe_late(now, self.mesh.watched_parents()):
            self.mesh.watched_late()  # a data parent late twice: a standby one carries beside it (rule 6)
        self.sync.due_resyncs(now)
        if now >= self.liveness.next_hello:
            self.liveness.send_all(now)
        if now >= self.next_announce:
            self._periodic(now)
        if now >= self.next_stats:
            self.emit(events.COUNTERS, now, **self._counter_snapshot(), clocks=self.neighbours.clock_report())
            self.next_stats = now + self.settings.stats_interval
        self.reliable.on_timer(now)
        self.receivers.on_timer(now)
        flush = self.local.next_flush()
        if flush is not None and now >= flush:
            self._apply(self.local.flush(now))
        paced = self.topic_sync.next_deadline()
        if paced is not None and now >= paced:
            self.topic_sync.on_timer(now)
        self.mesh.on_timer(now)
        publications = self.publications
        for message in publications.ordering.expire(now):  # gaps waited for long enough
            publications.inject(message, now)
        self._settle(now)
        if publications.parked and now >= publications.unpark_at(self.mesh.claim_allowed_at):
            publications.unpark(now)
            self._settle(now)

    # ------------------------------------------------------------ local clients

    @property
    def clients(self) -> dict[str, dict[str, int]]:
        """client -> raw filter -> QoS, of the local broker's subscriptions (read-only)"""
        return self.local.clients

    def local_subscribe(self, client: str, filter_: str, qos: int, now: float) -> None:
        self.receivers.now = now
        # A restored node's subscriptions, replayed as it starts, are the earlier life's (rule 7d).
        changes = self.local.subscribe(client, filter_, qos, now, self._restored and now <= self.mesh.claim_allowed_at)
        if changes is not None:
            self._apply(changes)
            self._settle(now)

    def local_unsubscribe(self, client: str, filter_: str, now: float) -> None:
        self.receivers.now = now
        changes = self.local.unsubscribe(client, filter_, now)
        if changes is not None:
            self._apply(changes)
            self._settle(now)

    def local_disconnect(self, client: str, now: float) -> None:
        self.receivers.now = now
        self._apply(self.local.disconnect(client, now))
        self._settle(now)

    def _apply(self, changes: list[Change]) -> None:
        """What a change of the local subscriptions means: a group membership (rule 9), or a filter's mesh (one the
        topic table has no room for is served by `#` instead: `LocalSubscriptions.cover_refused`)."""
        refused = []
        for change in changes:
            if change.shared:
                if change.added:
                    self.shared.local_add(split_shared(change.filter))
                else:
                    self.shared.local_remove(split_shared(change.filter))
            elif not self.mesh.on_local_change(change.filter, beyond_limit=change.filter == COVER_ALL) and \
                    change.added:
                refused.append(change.filter)
        for change in self.local.cover_refused(refused):
            self.mesh.on_local_change(change.filter, beyond_limit=True)

    def local_interest(self) -> dict[str, Any]:
        """What the node federates for its local subscriptions (status): how many raw filters, the filters it
        federates for them (`aggregation`: covering ones, `dev/+/cmd` for a fleet), those being replaced, and
        the ones the table had no room for."""
        local = self.local
        return {**local.aggregation.describe(), "federated_filters": sorted(local.wanted)[:100],
                "replaced": sorted(local.replaced), "refused": sorted(local.refused)[:100]}

    def limits_problem(self, now: float) -> str | None:
        """Why the node does not serve every filter as it should, when its topic table is full (`max_topics`):
        for the status, the readiness and the log. None when it is not (and has not been for an announcement
        lifetime)."""
        limit = self.settings.max_topics
        if self.local.refused:
            return (f"the topic table is full (max_topics {limit}): {len(self.local.refused)} of this broker's "
                    f"federated filters are served by '#' (every publication comes here); raise max_topics")
        if now - self._refused_at <= self.settings.announcement_lifetime:
            return (f"the topic table is full (max_topics {limit}): {self.mesh.refused_topics} filters refused, "
                    f"the latest {self.mesh.last_refused!r}; publications from this broker do not reach their "
                    f"subscribers elsewhere; raise max_topics")
        return None

    def _report_limits(self, now: float) -> None:
        """A filter refused since the last look: an event (at most one per `stats_interval`) and the time."""
        refused = self.mesh.refused_topics
        if refused == self._refused_reported:
            return
        self._refused_at = now
        if now < self._next_limits_event:
            return
        self._refused_reported = refused
        self._next_limits_event = now + self.settings.stats_interval
        self.emit(events.TOPIC_TABLE_FULL, now, limit=self.settings.max_topics, refused=refused,
                  latest=self.mesh.last_refused, covered_by=COVER_ALL if self.local.refused else None)

    # ------------------------------------------------------------ local publications

    def local_publish(self, topic: str, payload: bytes, qos: int, retain: bool,
                      properties: dict[str, Any] | None, now: float, *,
                      publication_id: PublicationId | None = None) -> PublicationId | None:
        """A publication made on the local broker; returns its id, or None for `$` topics. A QoS 1/2 one is in
        custody until `custody_released` names it. `publication_id`: the id it got before a restart (the
        embedder replays its spool, in the original order, before it reads anything new)."""
        if self.stopped:
            return None
        self.receivers.now = now
        if publication_id is not None and publication_id[0] != self.address:
            raise ValueError(f"publication {publication_id!r} is not this node's ({self.address}): a node replays "
                             f"only its own publications")
        publication = self.publications.local_publish(topic, payload, qos, retain, properties, now, publication_id)
        if publication is not None:
            self._settle(now)
        return publication

    def local_publish_run(self, run: list[tuple[str, bytes]], now: float, *, qos: int = 0,
                          publication_ids: list[PublicationId | None] | None = None) -> list[PublicationId | None]:
        """Publications (topic, payload) of one QoS read together from the local broker, neither retained nor with
        properties: each as `local_publish` would handle it, sent as runs (federation.protocol.publications): `tb`
        for QoS 0 (docs/protocol.md rule 7c), `tq` for QoS 1/2 (rule 7e; in custody, as each would be).
        `publication_ids`: their earlier ids, one per publication (None for a new one), as `local_publish` takes
        them; such a run goes one `tm` each."""
        if self.stopped:
            return [None] * len(run)
        self.receivers.now = now
        if publication_ids is not None:
            return [self.local_publish(topic, payload, qos, False, None, now, publication_id=publication_id)
                    for (topic, payload), publication_id in zip(run, publication_ids, strict=True)]
        if len(run) == 1 or (qos and not self._reliable_run_ready(now)):
            return [self.local_publish(topic, payload, qos, False, None, now) for topic, payload in run]
        publications = self.publications
        made = publications.originate_reliable_run(run, qos, now) if qos else publications.originate_run(run, now)
        self._settle(now)
        return made

    def _reliable_run_ready(self, now: float) -> bool:
        """Can a run of QoS 1/2 publications go as one (rule 7e)? Not while some of ours are parked or the node is
        still learning the filters (the run's publications may have to wait, in order), nor while shared groups are
        known (each publication goes to a member broker of its own): then each goes as `local_publish` takes it."""
        return not self.publications.parked and not self.mesh.learning(now) and not self.shared.active

    # ------------------------------------------------------------ packets

    def receive_packet(self, data: bytes, source: Address, now: float) -> None:
        """One protocol packet from the transport address `source` (opened by the envelope)."""
        if self.started_at is None or self.stopped:
            return
        self.receivers.now = now
        try:
            packet = self._decode(data, self.settings.max_packet, self.settings.max_neighbours)
        except DecodeError as error:
            self._drop_packet(error.reason, error.detail, source, len(data), now)
            return
        self.received_by_type[packet.type] += 1
        self.received_bytes_by_type[packet.type] += len(data)
        neighbour = self.neighbours.get(source)
        if neighbour is None and packet.type == wire.HELLO:
            neighbour = self.neighbours.add_dynamic(source, now)
        if neighbour is None:
            self._drop_packet("unknown_neighbour", packet.type, source, len(data), now)
            return
        if packet.sender.broker_id.address == self.address:
            self._drop_packet("own_address", packet.type, source, len(data), now)
            return
        self._note_sender(neighbour, packet.sender, now)
        self._dispatch(packet, neighbour, now)
        self._settle(now)

    def _drop_packet(self, reason: str, detail: str, source: Address, size: int, now: float) -> None:
        self.drop(reason, event=events.PACKET_DROPPED, now=now, reason=reason, detail=detail, source=str(source),
                  size=size)

    def _note_sender(self, neighbour: Neighbour, sender: Sender, now: float) -> None:
        previous_epoch = neighbour.extra.get("epoch")
        changed = self.neighbours.set_announced(neighbour, sender.broker_id)
        neighbour.extra["epoch"] = float(sender.epoch)
        if neighbour.up and (changed or (previous_epoch is not None and sender.epoch > previous_epoch)):
            # The neighbour restarted or renamed itself: it has lost what we taught it, and what we sent it.
            self.sync.resync(neighbour, now)
            self.topic_sync.send_digests_to(neighbour)
            self.table.trigger_origination(now)
            self.reliable.neighbour_up(neighbour.transport, now)

    def _dispatch(self, packet: Packet, neighbour: Neighbour, now: float) -> None:
        body = packet.body
        sender = neighbour.transport
        announced = packet.sender.broker_id.address
        if isinstance(body, TopicMessage):  # first: one per publication, the most frequent packet
            if body.epoch == self.identity.epoch and self._forged_own(body, [body], body.seq, sender, now):
                return
            if body.qos:
                routed = self.delivery.receive(body, sender, announced, now)
            else:
                routed = self.publications.on_message(body, announced, now)
            if routed is SENT_TO_PACED:
                self.pacing.relay(sender, now)  # the pace reaches back to where the copy came from
        elif isinstance(body, TopicBatch):
            if body.epoch == self.identity.epoch and self._forged_own(body, [], max(body.items[0::3]), sender, now):
                return
            if self.publications.on_batch(body, announced, now) is SENT_TO_PACED:
                self.pacing.relay(sender, now)
        elif isinstance(body, TopicReliableBatch):
            if body.epoch == self.identity.epoch and \
                    self._forged_own(body, body.messages(), max(body.items[0::4]), sender, now):
                return
            if self.delivery.receive_run(body, sender, announced, now) is SENT_TO_PACED:
                self.pacing.relay(sender, now)
        elif isinstance(body, TopicAcks):
            if self.delivery.on_acks(body, sender):  # it echoes copies we sent: both directions work (rule 1)
                self.neighbours.record_echo(neighbour, now)
        elif isinstance(body, Hello):
            self.liveness.answer(body, neighbour, now)
        elif isinstance(body, HelloBack):
            self._on_hello_back(neighbour, body, now)
        elif isinstance(body, Federate):
            self.table.on_records([body.record], neighbour, bundle=False, now=now)
        elif isinstance(body, TopologyUpdate):
            self.table.on_records(list(body.records), neighbour, bundle=True, now=now)
        elif isinstance(body, CoreAnnouncement):
            self.table.on_core_announcement(body, sender, now)
        elif isinstance(body, Reconsider):
            if self.table.on_reconsider(body, now):
                self.mesh.renumbered(now)
        elif isinstance(body, ReceiverBusy):
            self.pacing.on_receiver_busy(sender, body.hold, now)
        elif isinstance(body, TopicCore):
            # Whether a core is alive (reachable) decides adoption: judge claims on current routes.
            self._update_routes(now, pending=True)
            self.mesh.on_topic_core(packet.type, body, sender, announced, now)
        elif isinstance(body, TopicSubscribe):
            self.mesh.on_topic_subscribe(body, announced, now)
        elif isinstance(body, TopicAck):
            if self.delivery.on_ack(body, sender):  # it echoes a `tm` we sent: both directions work (rule 1)
                self.neighbours.record_echo(neighbour, now)
        elif isinstance(body, DatabaseDigest):
            self.sync.on_digest(body, neighbour)
        elif isinstance(body, DatabaseSummary):
            self.sync.on_summary(body, neighbour)
        elif isinstance(body, DatabaseRequest):
            self.sync.on_request(body, neighbour)
        elif isinstance(body, SharedGroupsAnnouncement):
            self.shared.on_announcement(body, sender, now)
        elif isinstance(body, RetainedDigest):
            self.retained_sync.on_digest(body, neighbour)
        elif isinstance(body, RetainedSummary):
            self.retained_sync.on_summary(body, neighbour)
        elif isinstance(body, RetainedRequest):
            self.retained_sync.on_request(body, neighbour)
        elif isinstance(body, RetainedValues):
            self.retained_sync.on_values(body, neighbour)
        elif isinstance(body, TopicDigest):
            self._update_routes(now, pending=True)  # claims pushed in answer are judged on current routes
            self.topic_sync.on_digest(body, neighbour, now)
        elif isinstance(body, TopicRequest):
            self.topic_sync.on_request(body, neighbour, now)
        elif isinstance(body, TopicSubscriptions):
            self.topic_sync.on_subscriptions(body, neighbour, now)

    def _send_receiver_busy(self, neighbour: Address, hold: float) -> None:
        self.outbox.send(wire.RECEIVER_BUSY, ReceiverBusy(hold), [neighbour])

    def _forged_own(self, body: TopicMessage | TopicBatch | TopicReliableBatch, reliable: list[TopicMessage],
                    last_seq: int, sender: Address, now: float) -> bool:
        """Is this publication packet (of our epoch) one claiming to be ours, numbered past the last we made? Then
        someone else made it: anyone in open mode, a key holder, or a bit flip in an origin address. It is dropped
        before the duplicate cache takes it, where it would hide our real publication of that number from every
        node it reached. Its QoS 1/2 copies (`reliable`) are acknowledged, so a neighbour that relayed one stops
        sending it again. An echo of one we did make (a seq we used) goes on, to be dropped as a duplicate."""
        if body.origin != self.identity.address or last_seq <= self.identity.publication_seq:
            return False
        for message in reliable:
            if message.qos:
                self.reliable.acknowledge(message, sender)
        self._drop_packet("forged_own", f"{body.origin}/{body.epoch}/{last_seq}", sender, 0, now)
        return True

    # ------------------------------------------------------------ neighbours up and down

    def _on_hello_back(self, neighbour: Neighbour, body: HelloBack, now: float) -> None:
        answered = self.liveness.answered(neighbour, body, now)
        if answered is None:
            return
        if answered.was_overdue and neighbour.announced is not None:
            # Answered after all: a standby parent beside it goes back to standby.
            self.mesh.neighbour_changed(neighbour.announced.address)
        if answered.came_up:
            # Announce the new link (rate-limited: neighbours that come up together share one
            # origination); when allowed at once, first, so the bundle we send carries it.
            self.table.trigger_origination(now)
            self.table.originate_if_due(now)
            self.sync.sync(neighbour, now)
            self.topic_sync.send_digests_to(neighbour)  # the claims and memberships it lacks (rule 5a)
            self.shared.neighbour_up(neighbour.transport)
            self.retained_sync.neighbour_up(neighbour)
            self.reliable.neighbour_up(neighbour.transport, now)  # what waits for it goes now
            if all(n.up for n in self.neighbours.all() if n.configured):
                # Everything we can hear is syncing: claims need wait only for that exchange.
                self.mesh.allow_claims_by(now + max(4 * answered.rtt, 0.01))

    def set_configured_neighbours(self, addresses: Iterable[Address],
                                  now: float) -> tuple[list[Address], list[Address]]:
        """The embedder's list of neighbours changed (it reloaded its configuration): new ones get a hello at once
        (the link comes up in one round trip if the peer answers); ones no longer listed are taken down now, as
        after their silence (QoS 1/2 copies in flight to them go another way or wait: rule 7a), and forgotten. A
        peer that still lists this node says hello again and is accepted as any unlisted one is (up to
        `max_neighbours`): a link ends when neither side lists the other. Returns (added, removed)."""
        if self.stopped:
            return [], []
        self.receivers.now = now
        added, unlisted = self.neighbours.set_configured(a for a in addresses if a != self.address)
        if self.started_at is not None:
            for neighbour in added:
                self.liveness.send(neighbour, now)
        for neighbour in unlisted:
            if neighbour.up:
                self.neighbours.take_down(neighbour)
                self._neighbour_down(neighbour, now)  # emits neighbour_down, forgets it (no longer configured)
            else:
                self.neighbours.remove(neighbour.transport)
        if self.started_at is not None:
            self._settle(now)
        return [n.transport for n in added], [n.transport for n in unlisted]

    def _neighbour_down(self, neighbour: Neighbour, now: float) -> None:
        self.liveness.down(neighbour, now)
        self.reliable.neighbour_down(neighbour.transport, now)
        self.sync.neighbour_down(neighbour.transport)
        self.topic_sync.neighbour_down(neighbour.transport)
        self.retained_sync.neighbour_down(neighbour.transport)
        self.pacing.forget(neighbour.transport)
        self.table.trigger_origination(now)
        if neighbour.announced is not None:
            self.mesh.neighbour_down(neighbour.announced.address, now)
            # A data parent down: a standby one takes over now, not after the routes.
            self.mesh.neighbour_changed(neighbour.announced.address)

    # ------------------------------------------------------------ composing the parts

    def _settle(self, now: float) -> None:
        """Run after every input: pending origination, floods, routes, then the topics the input affected."""
        self.last_input_at = now
        table = self.table
        if table.stale and self.mesh.about_to_claim(now):
            # Never claim a topic core on a stale table: the live core we have just been told about
            # may become reachable once our own record lists our new neighbours and routes are computed.
            table.originate_pending(now)
            self._update_routes(now, pending=True)
        table.run_due(now)
        self._update_routes(now)
        if table.stored_origins:
            origins = table.take_stored_origins()
            self._take_down_leaving(origins, now)
            self.mesh.records_changed(origins)
        self.mesh.reconcile(now)
        if self.mesh.cores_lost:
            self.mesh.cores_lost = False
            self.topic_sync.ask_claims()
        if self.local.replaced:
            released = self.local.release_replaced(now, lambda filter_: self.mesh.joined(filter_, now))
            if released:
                self._apply(released)
                self.mesh.reconcile(now)
        self.reliable.arm(now)  # the QoS 1/2 copies sent by this input get their retransmission deadline
        if self.mesh.refused_topics != self._refused_reported:
            self._report_limits(now)

    def _in_reach(self, origin: Address) -> bool:
        """Does the table reach this origin now (its streams' gaps wait while it does not: rule 7d)?"""
        return origin in self.table.routes.members

    def _take_down_leaving(self, origins: set[Address], now: float) -> None:
        """A neighbour whose record of its current life says it leaves (a clean shutdown) is down now, not after
        `neighbour_dead_after` of silence: what we sent it that it did not acknowledge goes another way at once
        (rule 7a), instead of waiting three hello intervals while its receivers wait for it (rule 7d)."""
        records = self.table.lsdb.records
        for neighbour in self.neighbours.up():
            announced = neighbour.announced
            if announced is None or announced.address not in origins:
                continue
            stored = records.get(announced.address)
            if stored is not None and stored.record.flags & wire.FLAG_LEAVING \
                    and stored.record.epoch == neighbour.extra.get("epoch"):
                self.neighbours.take_down(neighbour)
                self._neighbour_down(neighbour, now)

    def _update_routes(self, now: float, pending: bool = False) -> None:
        """Compute the routes when due (`pending`: whenever a computation is pending), and tell the parts
        what the change means: the topics' parents may have moved (mesh), records a neighbour was not sent
        may be reachable now (sync), our vid may collide (table, then the mesh announces the new one), the
        management core may change (table)."""
        change = self.table.recompute_routes(now, pending)
        if change is None:
            return
        self.receivers.routes_changed()  # brokers back in reach get their repairs (rule 7f)
        self.publications.ordering.routes_changed(now)  # streams whose origin is back wait for what it kept
        if change.moved:
            self.mesh.routes_changed(change.changed)
        self.sync.members_added(change.added)
        if self.table.resolve_collisions(now):
            self.mesh.renumbered(now)
        self.table.elect_management_core(change, now)

    def _topic_announcements(self) -> list[TopicCore]:
        """What a neighbour that just came up must learn of the topic cores (for the database exchange).
        Judged at the time of the previous input (`last_input_at`), as the sync has always done."""
        return self.mesh.announcements_for_sync(self.last_input_at)

    def _periodic(self, now: float) -> None:
        """Every announce interval: anti-entropy digests, management-core refresh, expiry, topics.
        Our own record is not re-flooded: it is originated only when our neighbours change."""
        self.sync.send_digests()
        self.topic_sync.send_digests()
        self.retained_sync.send_digests()
        self.table.periodic(now)
        self.sync.expire_left_out(now)
        self.mesh.periodic(now)
        self.receivers.expire(now)
        if self.local.refused:  # filters the table had no room for: it may have some now
            self._apply(self.local.retry_refused(now, self.mesh.on_local_change))
        self.shared.periodic(now)
        self.next_announce = now + self.settings.announce_interval

    # ------------------------------------------------------------ status

    def _counter_snapshot(self) -> dict[str, Any]:
        return counter_snapshot(self.outbox, self.received_by_type, self.received_bytes_by_type)

    def status(self, now: float, brief: bool = False) -> dict[str, Any]:
        """Everything a person asks a running wrapper (`wrapper.py status`): federation.protocol.node_status
        (`brief`: without the lists that grow with the filters, subscriptions and members)."""
        return status_document(self, now, brief)
