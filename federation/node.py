"""The protocol node: one wrapper's brain, with no I/O of its own.

Inputs: datagrams (`receive_datagram`), timer ticks (`handle_timer`), local
client activity (`local_subscribe`, `local_unsubscribe`, `local_disconnect`)
and local publications (`local_publish`). Outputs are drained by the caller:
`datagrams_to_send`, `injections_to_make`, `events_emitted`. Time is always
passed in and randomness comes from the RNG given at construction, so a run
replays exactly (the simulator relies on it).

This module holds neighbour liveness, the federation table (link state),
the management core and node identity; topic cores, meshes and publication
routing live in `federation.mesh`. After every input, `_settle` reconciles
the topics the input affected. Route computation is debounced, as OSPF's SPF
delay: a table change schedules one computation `spf_delay` later (and at
least `spf_hold` after the previous one), so a burst of records costs one
breadth-first search, not one per record.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from federation import events, wire
from federation.dedup import SeenCache
from federation.events import addresses_text, id_text, publication_text
from federation.linkstate import LinkStateDatabase, Routes, StoredRecord
from federation.mesh import MeshEngine
from federation.neighbours import Neighbour, NeighbourTable
from federation.reliable import ReliableForwarding
from federation.settings import Settings
from federation.topic_filter import FilterIndex, federated_filter, is_system
from federation.types import Address, BrokerId, Event, Injection, PublicationId
from federation.wire import (
    FLAG_LEAVING,
    MODE_TOWARD_CORE,
    Body,
    CoreAnnouncement,
    DatabaseDigest,
    DatabaseRequest,
    DatabaseSummary,
    DecodeError,
    Federate,
    Hello,
    HelloBack,
    LinkStateRecord,
    Packet,
    Reconsider,
    Sender,
    TopicAck,
    TopicCore,
    TopicMessage,
    TopicSubscribe,
    TopologyUpdate,
)

VID_RANGE = 2**31


def _stored_size(stored: StoredRecord) -> int:
    return stored.size


@dataclass(frozen=True)
class NodeView:
    """What the node currently believes, for status displays and convergence checks."""

    broker_id: BrokerId
    members: frozenset[Address]
    management_core: BrokerId
    topic_cores: Mapping[str, BrokerId]
    version: int


class Node:
    def __init__(self, address: Address, neighbours: Iterable[Address], epoch: int, rng: random.Random,
                 settings: Settings | None = None, vid: int | None = None, name: str | None = None,
                 decode: wire.DecodeFunction = wire.decode) -> None:
        settings = settings if settings is not None else Settings()
        self._decode = decode
        """`wire.decode`; the simulator passes a cache that decodes each distinct datagram once"""
        self.address = address
        self.settings = settings
        self.rng = rng
        self.epoch = epoch
        self.vid = vid if vid is not None else rng.randrange(VID_RANGE)
        self.name = name
        self._address_text = str(address)
        """`str(self.address)`, which every event carries"""
        self._broker_id: BrokerId | None = None
        self._sender: wire.Sender | None = None
        """the header of the packets we send, rebuilt when the id or the epoch changes"""
        self.neighbours = NeighbourTable([a for a in neighbours if a != address], settings.max_neighbours)
        self.lsdb = LinkStateDatabase(address, settings.max_nodes)
        self.routes = Routes(frozenset([address]), {address: 0}, {}, {})
        self.management_core = self.broker_id
        self.mesh = MeshEngine(self)
        self.counters: Counter[str] = Counter()
        self.sent_by_type: Counter[str] = Counter()
        self.sent_bytes_by_type: Counter[str] = Counter()
        self.received_by_type: Counter[str] = Counter()
        self.received_bytes_by_type: Counter[str] = Counter()
        self.drops: Counter[str] = Counter()
        # Local subscriptions: client -> raw filter -> qos; federated filter -> number of (client, filter) pairs.
        self.clients: dict[str, dict[str, int]] = {}
        self.filter_refs: Counter[str] = Counter()
        self.local_index = FilterIndex()
        self.seen = SeenCache(settings.duplicate_cache_size)
        self.reliable = ReliableForwarding(self)
        """unacknowledged QoS 1/2 `tm` copies and their retransmission timers"""
        self.injected = SeenCache(settings.duplicate_cache_size)
        self.reconsiders_seen = SeenCache(1024)
        self.core_announcements: dict[Address, tuple[int, int, int, float]] = {}
        self._datagrams: list[tuple[bytes, Address]] = []
        self._injections: list[Injection] = []
        self._events: list[Event] = []
        self._version = 0
        self._routes_dirty = False
        self.spf_due: float | None = None
        """when the pending route computation runs (None: routes are current)"""
        self.last_spf = float("-inf")
        self._flood_queue: dict[Address, tuple[StoredRecord, set[Address]]] = {}
        """origin -> (record to forward, transports of the neighbours that have it already)"""
        self._left_out: dict[Address, tuple[float, set[Address]]] = {}
        """neighbour transport -> (when synced, origins of the records we held but left out of that
        database exchange as unreachable): sent to it when routes show them reachable"""
        self.flood_due: float | None = None
        self._digest_cache: tuple[int, frozenset[Address], tuple[int, tuple[int, ...]]] | None = None
        self._table_version = 0
        self.own_seq = 0
        self.core_seq = 0
        self.publication_seq = 0
        self.hello_seq = 0
        self.last_input_at = 0.0
        self.started_at: float | None = None
        self.stopped = False
        self.last_origination = float("-inf")
        self.origination_due: float | None = None
        self.next_hello = float("inf")
        self.next_announce = float("inf")
        self.next_stats = float("inf")

    # ------------------------------------------------------------ identity and view

    @property
    def broker_id(self) -> BrokerId:
        # Read for every packet sent and many received: remembered until `vid` or `address` changes.
        broker_id = self._broker_id
        if broker_id is None or broker_id[0] != self.vid or broker_id[1] is not self.address:
            broker_id = self._broker_id = BrokerId(self.vid, self.address)
        return broker_id

    def bump_version(self) -> None:
        self._version += 1

    @property
    def version(self) -> int:
        """Changes whenever `view()` may have changed (cheaper than building the view)."""
        return self._version

    def view(self) -> NodeView:
        return NodeView(self.broker_id, self.routes.members, self.management_core, self.mesh.cores(), self._version)

    def local_count(self, filter_: str) -> int:
        return self.filter_refs.get(filter_, 0)

    # ------------------------------------------------------------ outputs

    def datagrams_to_send(self) -> list[tuple[bytes, Address]]:
        out, self._datagrams = self._datagrams, []
        return out

    def injections_to_make(self) -> list[Injection]:
        out, self._injections = self._injections, []
        return out

    def events_emitted(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    def emit(self, kind: str, now: float, **fields: Any) -> None:
        self._events.append(Event(now, self._address_text, kind, fields))

    def count_drop(self, reason: str) -> None:
        self.drops[reason] += 1

    def send(self, kind: str, body: Body, transports: list[Address], track: bool = True) -> None:
        if not transports or self.stopped:
            return
        if track and kind == wire.TOPIC_MESSAGE and isinstance(body, TopicMessage) and body.qos:
            self.reliable.track(body, transports)  # retransmitted until the next hop acknowledges it
        sender = self._sender
        broker_id = self.broker_id
        if sender is None or sender.broker_id is not broker_id or sender.epoch != self.epoch:
            sender = self._sender = wire.Sender(broker_id, self.epoch)
        data = wire.encode(kind, sender, body)
        for transport in transports:
            self._datagrams.append((data, transport))
        self.sent_by_type[kind] += len(transports)
        self.sent_bytes_by_type[kind] += len(data) * len(transports)

    def send_up(self, kind: str, body: Body, exclude: Address | None) -> None:
        """Send to every up neighbour except `exclude` (a transport address)."""
        self.send(kind, body, [n.transport for n in self.neighbours.up() if n.transport != exclude])

    # ------------------------------------------------------------ lifecycle

    def start(self, now: float) -> None:
        self.started_at = now
        self.mesh.claim_allowed_at = now + 2 * self.settings.hello_interval
        self.emit(events.NODE_STARTED, now, broker_id=id_text(self.broker_id), epoch=self.epoch, name=self.name,
                  neighbours=addresses_text([n.transport for n in self.neighbours.all()]))
        self._originate(now)
        self._send_hellos(now)
        self.next_announce = now + self.settings.announce_interval * (1 + 0.1 * self.rng.random())
        self.next_stats = now + self.settings.stats_interval
        self.bump_version()
        self._settle(now)

    def shutdown(self, now: float) -> None:
        """Leave cleanly: withdraw claims, prune meshes, announce the departure."""
        if self.stopped:
            return
        self.mesh.prune_all()
        self.own_seq += 1
        record = LinkStateRecord(self.broker_id, self.epoch, self.own_seq, 0, FLAG_LEAVING, ())
        self.send_up(wire.FEDERATE, Federate(record), exclude=None)
        self.emit(events.NODE_STOPPED, now, counters=self._counter_snapshot())
        self.stopped = True

    def get_timer(self) -> float | None:
        if self.started_at is None or self.stopped:
            return None
        candidates = [self.next_hello, self.next_announce, self.next_stats]
        if self.origination_due is not None:
            candidates.append(self.origination_due)
        if self.spf_due is not None:
            candidates.append(self.spf_due)
        if self.flood_due is not None:
            candidates.append(self.flood_due)
        dead = self.neighbours.next_deadline(self.settings.neighbour_dead_after)
        if dead is not None:
            candidates.append(dead)
        held = self.mesh.next_deadline()
        if held is not None:
            candidates.append(held)
        retransmit = self.reliable.next_deadline()
        if retransmit is not None:
            candidates.append(retransmit)
        candidates += [n.extra["sync_due"] for n in self.neighbours.all() if "sync_due" in n.extra]
        return min(candidates)

    def handle_timer(self, now: float) -> None:
        if self.started_at is None or self.stopped:
            return
        for neighbour in self.neighbours.expire(self.settings.neighbour_dead_after, now):
            self._neighbour_down(neighbour, now)
        self._due_resyncs(now)
        if now >= self.next_hello:
            self._send_hellos(now)
        if now >= self.next_announce:
            self._periodic(now)
        if now >= self.next_stats:
            self.emit(events.COUNTERS, now, **self._counter_snapshot(), clocks=self.neighbours.clock_report())
            self.next_stats = now + self.settings.stats_interval
        self.reliable.on_timer(now)
        self.mesh.on_timer(now)
        self._settle(now)

    # ------------------------------------------------------------ local clients

    def local_subscribe(self, client: str, filter_: str, qos: int, now: float) -> None:
        federated = federated_filter(filter_)
        if federated is None:
            return
        filters = self.clients.setdefault(client, {})
        if filter_ in filters:
            filters[filter_] = qos
            return
        filters[filter_] = qos
        self.emit(events.SUBSCRIPTION_ADDED, now, client=client, filter=filter_, federated=federated, qos=qos)
        self.filter_refs[federated] += 1
        if self.filter_refs[federated] == 1:
            self.local_index.add(federated)
            self.mesh.on_local_change(federated)
        self._settle(now)

    def local_unsubscribe(self, client: str, filter_: str, now: float) -> None:
        filters = self.clients.get(client)
        if filters is None or filter_ not in filters:
            return
        del filters[filter_]
        if not filters:
            del self.clients[client]
        self._release(client, filter_, now)
        self._settle(now)

    def local_disconnect(self, client: str, now: float) -> None:
        for filter_ in sorted(self.clients.pop(client, {})):
            self._release(client, filter_, now)
        self._settle(now)

    def _release(self, client: str, filter_: str, now: float) -> None:
        federated = federated_filter(filter_)
        if federated is None:
            return
        self.emit(events.SUBSCRIPTION_REMOVED, now, client=client, filter=filter_, federated=federated)
        self.filter_refs[federated] -= 1
        if self.filter_refs[federated] <= 0:
            del self.filter_refs[federated]
            self.local_index.discard(federated)
            self.mesh.on_local_change(federated)

    def local_publish(self, topic: str, payload: bytes, qos: int, retain: bool,
                      properties: dict[str, Any] | None, now: float) -> PublicationId | None:
        """A publication made on the local broker; returns its id, or None for `$` topics."""
        if is_system(topic) or self.stopped:
            return None
        self.publication_seq += 1
        publication: PublicationId = (self.address, self.epoch, self.publication_seq)
        self.injected.add(publication)  # the local broker has it already
        filters = self.mesh.matching(topic)
        self.counters["publications_originated"] += 1
        pub_text = publication_text(publication)
        self.emit(events.PUBLICATION_ORIGINATED, now, pub=pub_text, topic=topic, qos=qos,
                  retain=retain, size=len(payload), filters=filters)
        for filter_ in self.mesh.publication_filters(filters):
            state = self.mesh.topics[filter_]
            self.seen.add((publication, filter_))
            message = TopicMessage(filter_, self.address, self.epoch, self.publication_seq, MODE_TOWARD_CORE, 0,
                                   topic, payload, qos, retain, properties)
            self.mesh.route(state, message, None, now, pub_text)
        self._settle(now)
        return publication

    # ------------------------------------------------------------ datagrams

    def receive_datagram(self, data: bytes, source: Address, now: float) -> None:
        if self.started_at is None or self.stopped:
            return
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
        self.drops[reason] += 1
        self.emit(events.PACKET_DROPPED, now, reason=reason, detail=detail, source=str(source), size=size)

    def _note_sender(self, neighbour: Neighbour, sender: Sender, now: float) -> None:
        previous_epoch = neighbour.extra.get("epoch")
        changed = self.neighbours.set_announced(neighbour, sender.broker_id)
        neighbour.extra["epoch"] = float(sender.epoch)
        if neighbour.up and (changed or (previous_epoch is not None and sender.epoch > previous_epoch)):
            # The neighbour restarted or renamed itself: it has lost what we taught it.
            self._resync_neighbour(neighbour, now)
            self._trigger_origination(now)

    def _resync_neighbour(self, neighbour: Neighbour, now: float) -> None:
        """Send a neighbour the database again, at most once per `hello_interval`: a key holder that
        announced a new id on every packet would otherwise get the whole table for every packet it sends."""
        last = neighbour.extra.get("synced_at")
        if last is None or now - last >= self.settings.hello_interval:
            neighbour.extra.pop("sync_due", None)
            self._sync_neighbour(neighbour, now)
        elif "sync_due" not in neighbour.extra:
            neighbour.extra["sync_due"] = last + self.settings.hello_interval
            self.counters["resyncs_deferred"] += 1

    def _due_resyncs(self, now: float) -> None:
        for neighbour in self.neighbours.all():
            due = neighbour.extra.get("sync_due")
            if due is not None and now >= due:
                del neighbour.extra["sync_due"]
                if neighbour.up:
                    self._sync_neighbour(neighbour, now)

    def _dispatch(self, packet: Packet, neighbour: Neighbour, now: float) -> None:
        body = packet.body
        sender = neighbour.transport
        announced = packet.sender.broker_id.address
        if isinstance(body, TopicMessage):  # first: one per publication, the most frequent packet
            if body.qos:
                self.reliable.on_message(body, sender, now)  # acknowledged hop by hop, duplicates too
            self._on_topic_message(body, announced, now)
        elif isinstance(body, Hello):
            self.send(wire.HELLO_BACK, HelloBack(body.seq, body.sent_at, now), [sender])
            if not neighbour.up:
                self._send_hello(neighbour, now)  # answer at once: the link comes up in one round trip
        elif isinstance(body, HelloBack):
            self._on_hello_back(neighbour, body, now)
        elif isinstance(body, Federate):
            self._on_records([body.record], neighbour, bundle=False, now=now)
        elif isinstance(body, TopologyUpdate):
            self._on_records(list(body.records), neighbour, bundle=True, now=now)
        elif isinstance(body, CoreAnnouncement):
            self._on_core_announcement(body, sender, now)
        elif isinstance(body, Reconsider):
            self._on_reconsider(body, now)
        elif isinstance(body, TopicCore):
            if self._routes_dirty:
                # Whether a core is alive (reachable) decides adoption: judge claims on current routes.
                self._recompute_routes(now)
            self.mesh.on_topic_core(packet.type, body, sender, announced, now)
        elif isinstance(body, TopicSubscribe):
            self.mesh.on_topic_subscribe(body, announced, now)
        elif isinstance(body, TopicAck):
            acks = self.counters["acks"]
            self.reliable.on_ack(body, sender)
            if self.counters["acks"] > acks:  # it echoes a `tm` we sent: both directions work (rule 1)
                self.neighbours.record_echo(neighbour, now)
        elif isinstance(body, DatabaseDigest):
            self._on_digest(body, neighbour)
        elif isinstance(body, DatabaseSummary):
            self._on_summary(body, neighbour, now)
        elif isinstance(body, DatabaseRequest):
            self._on_request(body, neighbour)

    # ------------------------------------------------------------ hello

    def _send_hellos(self, now: float) -> None:
        for neighbour in self.neighbours.all():
            self._send_hello(neighbour, now)
        # A little jitter keeps neighbours from synchronising their hellos.
        self.next_hello = now + self.settings.hello_interval * (0.9 + 0.1 * self.rng.random())

    def _send_hello(self, neighbour: Neighbour, now: float) -> None:
        self.hello_seq += 1
        self.send(wire.HELLO, Hello(self.hello_seq, now), [neighbour.transport])

    def _on_hello_back(self, neighbour: Neighbour, body: HelloBack, now: float) -> None:
        rtt = now - body.echo_sent_at
        if not self.hello_seq - 64 < body.echo_seq <= self.hello_seq or rtt < 0:
            self.drops["stale_hello_back"] += 1
            return
        offset = body.replied_at - (body.echo_sent_at + rtt / 2)
        if self.neighbours.record_back(neighbour, rtt, offset, self.settings.rtt_smoothing, now):
            assert neighbour.announced is not None
            self.emit(events.NEIGHBOUR_UP, now, neighbour=str(neighbour.transport),
                      neighbour_id=id_text(neighbour.announced), rtt=round(rtt, 6), clock_offset=round(offset, 6),
                      clock_error=round(rtt / 2, 6))
            # Announce the new link (rate-limited: neighbours that come up together share one
            # origination); when allowed at once, first, so the bundle we send carries it.
            self._trigger_origination(now)
            if self.origination_due is not None and self.origination_due <= now:
                self._originate(now)
            self._sync_neighbour(neighbour, now)
            if all(n.up for n in self.neighbours.all() if n.configured):
                # Everything we can hear is syncing: claims need wait only for that exchange.
                self.mesh.claim_allowed_at = min(self.mesh.claim_allowed_at, now + max(4 * rtt, 0.01))

    def _neighbour_down(self, neighbour: Neighbour, now: float) -> None:
        self.emit(events.NEIGHBOUR_DOWN, now, neighbour=str(neighbour.transport),
                  neighbour_id=id_text(neighbour.announced))
        if not neighbour.configured:
            self.neighbours.remove(neighbour.transport)
        self.reliable.neighbour_down(neighbour.transport, now)
        self._left_out.pop(neighbour.transport, None)
        self._trigger_origination(now)

    def _sync_neighbour(self, neighbour: Neighbour, now: float) -> None:
        """Teach a neighbour that just came up what we know (the `tu` database exchange): the records
        of our reachable members. Unreachable ones stay behind: they are on their way to expiry (after
        a partition, the other side's stale records; the neighbour has the current ones)."""
        neighbour.extra["synced_at"] = now
        # Our own record goes too, unless a newer one is about to be originated (it will follow as `fd`):
        # the stale one would only flood everywhere for nothing.
        pending_own = self.origination_due is not None
        records = self.lsdb.records
        members = self.routes.members
        self._send_records([records[address] for address in sorted(members)
                            if address in records and not (pending_own and address == self.address)],
                           [neighbour.transport])
        # A record left out only because it is not reachable *yet* (the record linking it to us is
        # still on its way, or routes are about to be recomputed) follows when it is (rule 1):
        # it was flooded before this neighbour was up, so nothing else would bring it there
        # before the next anti-entropy round, an announce interval later.
        left_out = {address for address in records if address not in members and address != self.address}
        if left_out:
            self._left_out[neighbour.transport] = (now, left_out)
        else:
            self._left_out.pop(neighbour.transport, None)
        for announcement in self.mesh.announcements_for_sync(self.last_input_at):
            self.send(wire.TOPIC_CORE, announcement, [neighbour.transport])

    def _send_records(self, records: list[StoredRecord], transports: list[Address]) -> None:
        """Send records as `tu` bundles that each fit in one datagram."""
        for bundle in self._split(records, _stored_size):
            self.send(wire.TOPOLOGY_UPDATE, TopologyUpdate(tuple(stored.record for stored in bundle)), transports)

    def _split(self, items: list[Any], size_of: Any) -> list[list[Any]]:
        """Cut `items` into runs whose encoded sizes fit one datagram (with room for the header)."""
        budget = self.settings.max_datagram - 64
        runs: list[list[Any]] = []
        run: list[Any] = []
        size = 0
        for item in items:
            item_size = size_of(item)
            if run and size + item_size > budget:
                runs.append(run)
                run, size = [], 0
            run.append(item)
            size += item_size
        if run:
            runs.append(run)
        return runs

    # ------------------------------------------------------------ anti-entropy (`dd`, `ds`, `dr`)

    def _digest(self) -> tuple[int, tuple[int, ...]]:
        """The digest of our reachable members' records, cached until the table or the routes change."""
        cached = self._digest_cache
        members = self.routes.members
        if cached is not None and cached[0] == self._table_version and cached[1] is members:
            return cached[2]
        digest = self.lsdb.digest(members)
        self._digest_cache = (self._table_version, members, digest)
        return digest

    def _send_digests(self) -> None:
        count, buckets = self._digest()
        self.send_up(wire.DATABASE_DIGEST, DatabaseDigest(count, buckets), exclude=None)

    def _on_digest(self, digest: DatabaseDigest, neighbour: Neighbour) -> None:
        """A neighbour's periodic digest: where it differs from ours, send our summary of those buckets."""
        if not neighbour.up:
            self.drops["digest_not_up"] += 1
            return
        count, buckets = self._digest()
        if count == digest.count and buckets == digest.buckets:
            return
        differing = frozenset(i for i in range(wire.DIGEST_BUCKETS) if buckets[i] != digest.buckets[i])
        entries = self.lsdb.summary(self.routes.members, differing or frozenset(range(wire.DIGEST_BUCKETS)))
        self.counters["digest_mismatches"] += 1
        for run in self._split(entries, wire.summary_entry_size):
            self.send(wire.DATABASE_SUMMARY, DatabaseSummary(tuple(run)), [neighbour.transport])

    def _on_summary(self, summary: DatabaseSummary, neighbour: Neighbour, now: float) -> None:
        """Request what the neighbour has newer; send it what we have newer."""
        wanted: list[Address] = []
        push: list[StoredRecord] = []
        for entry in summary.entries:
            held = self.lsdb.records.get(entry.origin)
            if held is None or held.record.freshness < entry.freshness:
                wanted.append(entry.origin)
            elif held.record.freshness > entry.freshness:
                push.append(held)
        if push:
            self._send_records(push, [neighbour.transport])
        for run in self._split(sorted(set(wanted)), wire.address_size):
            self.send(wire.DATABASE_REQUEST, DatabaseRequest(tuple(run)), [neighbour.transport])

    def _on_request(self, request: DatabaseRequest, neighbour: Neighbour) -> None:
        records = self.lsdb.records
        self._send_records([records[a] for a in sorted(set(request.origins)) if a in records],
                           [neighbour.transport])

    # ------------------------------------------------------------ federation table

    def _trigger_origination(self, now: float) -> None:
        due = max(now, self.last_origination + self.settings.min_announce_gap)
        if self.origination_due is None or due < self.origination_due:
            self.origination_due = due

    def _originate(self, now: float) -> None:
        self.own_seq += 1
        neighbours = tuple(sorted(n.announced.address for n in self.neighbours.up() if n.announced is not None))
        record = LinkStateRecord(self.broker_id, self.epoch, self.own_seq, 0, 0, neighbours)
        self.lsdb.store_own(record, now)
        self.send_up(wire.FEDERATE, Federate(record), exclude=None)
        self.last_origination = now
        self.origination_due = None
        self._table_changed(now)

    def _table_changed(self, now: float) -> None:
        """The table changed: if that moves any route, schedule the route computation."""
        self._table_version += 1
        if not self._routes_dirty and self.lsdb.routes_affected(self.routes):
            self._routes_dirty = True
            self.spf_due = max(now + self.settings.spf_delay, self.last_spf + self.settings.spf_hold)

    def _on_records(self, records: list[LinkStateRecord], neighbour: Neighbour, bundle: bool, now: float) -> None:
        forward: list[StoredRecord] = []
        for record in records:
            if record.origin.address == self.address:
                self._on_own_record(record, now)
                continue
            outcome = self.lsdb.accept(record, 1, now)
            if outcome in ("old", "shorter"):
                # Only newer records are forwarded; a shorter path changes nothing we compute. A copy of
                # a record waiting to be forwarded tells us this neighbour needs no copy from us.
                queued = self._flood_queue.get(record.origin.address)
                if queued is not None and queued[0].record.freshness == record.freshness:
                    queued[1].add(neighbour.transport)
                continue
            self._table_changed(now)
            stored = self.lsdb.records[record.origin.address]
            if self.settings.flood_delay > 0:
                self._flood_queue[record.origin.address] = (stored, {neighbour.transport})
                if self.flood_due is None:
                    self.flood_due = now + self.settings.flood_delay
            else:
                forward.append(stored)
        if not forward:
            return
        others = [n.transport for n in self.neighbours.up() if n.transport != neighbour.transport]
        if bundle:
            self._send_records(forward, others)
        else:
            self.send(wire.FEDERATE, Federate(forward[0].record), others)

    def _flush_floods(self) -> None:
        """Forward the records that waited `flood_delay`: one `fd` or `tu` bundle per group of neighbours
        that need the same records (not to those that sent us a copy)."""
        queue, self._flood_queue = self._flood_queue, {}
        self.flood_due = None
        groups: dict[tuple[Address, ...], list[Address]] = {}
        for neighbour in self.neighbours.up():
            wanted = tuple(origin for origin, (_, have) in sorted(queue.items()) if neighbour.transport not in have)
            if wanted:
                groups.setdefault(wanted, []).append(neighbour.transport)
        for origins, transports in groups.items():
            records = [queue[origin][0] for origin in origins]
            if len(records) == 1:
                self.send(wire.FEDERATE, Federate(records[0].record), transports)
            else:
                self._send_records(records, transports)

    def _on_own_record(self, record: LinkStateRecord, now: float) -> None:
        """A record of ours from an earlier life that is newer than our counters: jump past it."""
        if record.freshness <= (self.epoch, self.own_seq):
            return
        if record.epoch > self.epoch:
            previous = self.epoch
            self.epoch = record.epoch + 1
            self.own_seq = 0
            self.publication_seq = 0
            self.emit(events.EPOCH_CHANGED, now, epoch=self.epoch, previous=previous,
                      reason="older life announced a newer epoch")
        else:
            self.own_seq = record.seq
        self._trigger_origination(now)

    def _settle(self, now: float) -> None:
        """Run after every input: pending origination, routes, management core, topics."""
        self.last_input_at = now
        pending = self.origination_due is not None or self._routes_dirty
        if pending and self._about_to_claim(now):
            # Never claim a topic core on a stale table: the live core we have just been told about
            # may become reachable once our own record lists our new neighbours and routes are computed.
            if self.origination_due is not None:
                self._originate(now)
            if self._routes_dirty:
                self._recompute_routes(now)
        if self.origination_due is not None and now >= self.origination_due:
            self._originate(now)
        if self.flood_due is not None and now >= self.flood_due:
            self._flush_floods()
        if self._routes_dirty and self.spf_due is not None and now >= self.spf_due:
            self._recompute_routes(now)
        self.mesh.reconcile(now)
        self.reliable.arm(now)  # the QoS 1/2 copies sent by this input get their retransmission deadline

    def _about_to_claim(self, now: float) -> bool:
        """Would the mesh claim a topic core now (a subscribed filter without a core, claims allowed)?"""
        return now >= self.mesh.claim_allowed_at and any(
            state.core is None and self.mesh.wants(filter_) for filter_, state in self.mesh.topics.items())

    def _recompute_routes(self, now: float) -> None:
        self._routes_dirty = False
        self.spf_due = None
        self.last_spf = now
        previous = self.routes
        self.routes = self.lsdb.compute_routes(previous)
        added = self.routes.members - previous.members
        removed = previous.members - self.routes.members
        if added or removed:
            self.bump_version()
            self.emit(events.TABLE_CHANGED, now, added=addresses_text(added), removed=addresses_text(removed),
                      size=len(self.routes.members))
        if previous.next_hops != self.routes.next_hops or added or removed or previous.ids != self.routes.ids:
            self.mesh.mark_all_dirty()
        if added and self._left_out:
            self._send_left_out(added)
        self._check_collisions(now)
        # Every member has a record (links exist only between stored records), hence an id.
        core = min(self.broker_id, min(map(self.routes.ids.__getitem__, self.routes.members - {self.address}),
                                       default=self.broker_id))
        if core != self.management_core:
            previous_core = self.management_core
            self.management_core = core
            self.bump_version()
            self.emit(events.MANAGEMENT_CORE_CHANGED, now, core=id_text(core), previous=id_text(previous_core))
            if core == self.broker_id:
                self._announce_management_core()
        if self.management_core == self.broker_id and (added or removed):
            self._flood_membership_change(added, removed, previous)

    def _send_left_out(self, added: frozenset[Address]) -> None:
        """Send the neighbours synced while these records were unreachable the ones now reachable."""
        for transport, (_, origins) in sorted(self._left_out.items()):
            now_reachable = origins & added
            if not now_reachable:
                continue
            origins -= now_reachable
            if not origins:
                del self._left_out[transport]
            records = self.lsdb.records
            self._send_records([records[a] for a in sorted(now_reachable) if a in records], [transport])

    def _flood_membership_change(self, added: frozenset[Address], removed: frozenset[Address],
                                 previous: Routes) -> None:
        """As management core, tell everyone at once which records changed membership."""
        touched = set(added)
        for gone in removed:
            stored = self.lsdb.records.get(gone)
            if stored is not None:
                touched.update(a for a in stored.record.neighbours if a in self.routes.members)
        touched.add(self.address)
        records = [self.lsdb.records[a] for a in sorted(touched) if a in self.lsdb.records]
        self._send_records(records, [n.transport for n in self.neighbours.up()])

    def _check_collisions(self, now: float) -> None:
        same = sorted(a for a in self.lsdb.by_vid.get(self.vid, ())
                      if a != self.address and a in self.routes.members and self.routes.ids.get(a, self.broker_id).vid
                      == self.vid)
        if not same:
            return
        if same[0] < self.address:
            self._change_vid(now, reason=f"collision with {same[0]}")
            return
        for other in same:
            self._send_reconsider(Reconsider(BrokerId(self.vid, other), self.broker_id))

    def _send_reconsider(self, message: Reconsider) -> None:
        hops = self.routes.next_hops.get(message.target.address)
        if not hops:
            return
        transport = self.neighbours.transport_for(min(hops))
        if transport is not None:
            self.send(wire.RECONSIDER, message, [transport])

    def _on_reconsider(self, message: Reconsider, now: float) -> None:
        if not self.reconsiders_seen.add((message.target, message.holder)):
            return
        if message.target.address != self.address:
            self._send_reconsider(message)
            return
        if message.target.vid == self.vid and message.holder.vid == self.vid and message.holder.address < self.address:
            self._change_vid(now, reason=f"reconsider from {message.holder.address}")

    def _change_vid(self, now: float, reason: str) -> None:
        taken = {broker_id.vid for broker_id in self.routes.ids.values()}
        previous = self.vid
        while self.vid in taken:
            self.vid = self.rng.randrange(VID_RANGE)
        self.emit(events.ID_CHANGED, now, vid=self.vid, previous=previous, reason=reason)
        self.bump_version()
        self._originate(now)
        for state in self.mesh.topics.values():
            if state.core is not None and state.core.address == self.address:
                state.core = self.broker_id
                self.mesh.announce(state, now)
                state.core_seq = state.own_seq
        self.management_core = min(self.management_core, self.broker_id)

    def _announce_management_core(self) -> None:
        self.core_seq += 1
        self.send_up(wire.CORE_ANNOUNCEMENT, CoreAnnouncement(self.broker_id, self.epoch, self.core_seq, 0),
                     exclude=None)

    def _on_core_announcement(self, message: CoreAnnouncement, sender: Address, now: float) -> None:
        """`ca` is advisory: everyone computes the core from the table; this confirms it is alive."""
        held = self.core_announcements.get(message.core.address)
        distance = message.distance + 1
        fresh = (message.epoch, message.seq)
        if held is not None and (fresh < held[:2] or (fresh == held[:2] and distance >= held[2])):
            return
        if held is None and len(self.core_announcements) >= self.settings.max_nodes:
            self.drops["core_announcements_full"] += 1
            return
        self.core_announcements[message.core.address] = (message.epoch, message.seq, distance, now)
        self.send_up(wire.CORE_ANNOUNCEMENT, CoreAnnouncement(message.core, message.epoch, message.seq, distance),
                     exclude=sender)

    def _periodic(self, now: float) -> None:
        """Every announce interval: anti-entropy digests, management-core refresh, expiry, topics.
        Our own record is not re-flooded: it is originated only when our neighbours change."""
        self._send_digests()
        if self.management_core == self.broker_id:
            self._announce_management_core()
        lifetime = self.settings.announcement_lifetime
        if self.lsdb.expire(lifetime, self.routes.members, now):
            self._table_changed(now)
        for address, held in list(self.core_announcements.items()):
            if now - held[3] > lifetime:
                del self.core_announcements[address]
        for transport, (synced_at, _) in list(self._left_out.items()):
            if now - synced_at > lifetime:  # still unreachable: on their way to expiry
                del self._left_out[transport]
        self.mesh.periodic(now)
        self.next_announce = now + self.settings.announce_interval

    # ------------------------------------------------------------ publications

    def _on_topic_message(self, message: TopicMessage, from_announced: Address, now: float) -> None:
        publication = message.publication
        if not self.seen.add((publication, message.filter)):
            self.counters["duplicates_dropped"] += 1
            self.emit(events.DUPLICATE_DROPPED, now, pub=publication_text(publication), filter=message.filter,
                      source=str(from_announced))
            return
        if is_system(message.topic):
            self._drop_packet("system_topic", message.topic[:64], from_announced, 0, now)
            return
        pub_text = None
        if self.local_index.matching(message.topic) and self.injected.add(publication):
            self._injections.append(Injection(message.topic, message.payload, message.qos, message.retain,
                                              message.properties, publication))
            self.counters["publications_delivered"] += 1
            pub_text = publication_text(publication)
            self.emit(events.PUBLICATION_DELIVERED, now, pub=pub_text, topic=message.topic,
                      filter=message.filter, hops=message.hops + 1)
        if message.hops + 1 >= self.settings.max_hops:
            self.count_drop("max_hops")
            return
        state = self.mesh.state(message.filter)
        if state is None:
            self.count_drop("topics_full")
            return
        self.mesh.route(state, message, from_announced, now, pub_text)

    # ------------------------------------------------------------ status

    def _counter_snapshot(self) -> dict[str, Any]:
        return {
            "sent": {k: [self.sent_by_type[k], self.sent_bytes_by_type[k]] for k in sorted(self.sent_by_type)},
            "received": {k: [self.received_by_type[k], self.received_bytes_by_type[k]]
                         for k in sorted(self.received_by_type)},
            "drops": dict(sorted(self.drops.items())),
            "counters": dict(sorted(self.counters.items())),
        }

    def status(self, now: float) -> dict[str, Any]:
        """Everything a person asks a running wrapper (`wrapper.py status`)."""
        routes = self.routes
        return {
            "node": str(self.address), "name": self.name, "broker_id": id_text(self.broker_id), "epoch": self.epoch,
            "management_core": id_text(self.management_core),
            "neighbours": [{
                "address": str(n.transport), "id": id_text(n.announced), "up": n.up, "configured": n.configured,
                "rtt_ms": None if n.rtt is None else round(n.rtt * 1000, 3),
                "clock_offset_ms": None if n.clock_offset is None else round(n.clock_offset * 1000, 3),
                "flaps": n.flaps,
            } for n in self.neighbours.all()],
            "federation": [{
                "address": str(a), "id": id_text(routes.ids.get(a)) if a != self.address else id_text(self.broker_id),
                "distance": routes.distance.get(a),
                "next_hops": [str(h) for h in sorted(routes.next_hops.get(a, ()))],
            } for a in sorted(routes.members)],
            "topics": self.mesh.describe(now),
            "ownership": self.mesh.ownership.status(),
            "reliable": self.reliable.status(),
            "local_subscriptions": {client: dict(sorted(filters.items()))
                                    for client, filters in sorted(self.clients.items())},
            **self._counter_snapshot(),
        }
