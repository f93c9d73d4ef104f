"""The protocol node: one wrapper's brain, with no I/O of its own.

Inputs: protocol packets (`receive_packet`; the envelope, federation.envelope,
makes and opens the datagrams that carry them), timer ticks (`handle_timer`),
local client activity (`local_subscribe`, `local_unsubscribe`,
`local_disconnect`) and local publications (`local_publish`). Outputs are
drained by the caller: `packets_to_send`, `injections_to_make`,
`events_emitted`. Time is always passed in and randomness comes from the
RNG given at construction, so a run replays exactly (the simulator relies
on it).

This module is the node's boundary and its small parts: decoding and
dispatching packets, neighbour liveness (hellos), node identity, local
clients and publications, counters and status. The rest hangs off the node,
one concern each, sharing its state (`lsdb`, `routes`, `management_core`):
`table` (`federation.protocol.table`) keeps the federation table current (records,
flooding, debounced route computation, management core, id collisions);
`sync` (`federation.protocol.database_sync`) brings neighbours' copies up to date
(sync when a link comes up, anti-entropy digests); `mesh`
(`federation.protocol.mesh`) runs topic cores, meshes and publication routing;
`reliable` (`federation.protocol.reliable`) retransmits QoS 1/2 copies. After every
input, `_settle` runs what the input made due and reconciles the topics it
affected.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from federation.protocol import events, publication_batch, wire
from federation.protocol.database_sync import DatabaseSync
from federation.protocol.dedup import SeenCache, StreamNumbers, injected_key, seen_key
from federation.protocol.events import addresses_text, id_text, publication_text
from federation.protocol.linkstate import LinkStateDatabase, Routes, StoredRecord
from federation.protocol.mesh import MeshEngine
from federation.protocol.neighbours import Neighbour, NeighbourTable
from federation.protocol.pacing import Pacing
from federation.protocol.reliable import ReliableForwarding
from federation.protocol.settings import Settings
from federation.protocol.table import VID_RANGE, FederationTable
from federation.protocol.topic_filter import FilterIndex, federated_filter, is_system
from federation.protocol.types import Address, BrokerId, Event, Injection, PublicationId
from federation.protocol.wire import (
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
    ReceiverBusy,
    Reconsider,
    Sender,
    TopicAck,
    TopicBatch,
    TopicCore,
    TopicMessage,
    TopicSubscribe,
    TopologyUpdate,
)


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
        neighbours = [a for a in neighbours if a != address]
        settings = (settings if settings is not None else Settings()).with_datagram_for(
            [address.host, *(a.host for a in neighbours)])
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
        self.publication_events = True
        """emit the events made per publication and hop (`events.PER_PUBLICATION`); the daemon turns them off
        when its event log would not keep them, as they cost 25-30% of the data path's CPU"""
        self._broker_id: BrokerId | None = None
        self._sender: wire.Sender | None = None
        """the header of the packets we send, rebuilt when the id or the epoch changes"""
        self.neighbours = NeighbourTable(neighbours, settings.max_neighbours)
        self.lsdb = LinkStateDatabase(address, settings.max_nodes)
        self.routes = Routes(frozenset([address]), {address: 0}, {}, {})
        self.management_core = self.broker_id
        self.mesh = MeshEngine(self)
        self.table = FederationTable(self)
        """origination and flooding of records, route computation, management core, id collisions"""
        self.sync = DatabaseSync(self)
        """the database exchange with neighbours: sync when a link comes up, anti-entropy digests"""
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
        self.streams = StreamNumbers(settings.duplicate_cache_size)
        """the numbers that make the keys of `seen` and `injected` ints (dedup.seen_key, dedup.injected_key)"""
        self.seen = SeenCache(settings.duplicate_cache_size)
        self.reliable = ReliableForwarding(self)
        """unacknowledged QoS 1/2 `tm` copies and their retransmission timers"""
        self.injected = SeenCache(settings.duplicate_cache_size)
        self.delivery_backlogged = False
        """set by the embedder while the publications waiting for the local broker are nearly too many to
        keep: new QoS 1/2 copies are then left unacknowledged (their senders send them again) instead of
        being acknowledged and then dropped on the way into the broker"""
        self.pacing = Pacing(self._send_receiver_busy)
        """QoS 0 pacing with the neighbours (`rb`): the embedder reports its receive backlog to it and reads
        no publications from its broker while `pacing.paced(now)`"""
        self._datagrams: list[tuple[bytes, Address]] = []
        self._injections: list[Injection] = []
        self._events: list[Event] = []
        self._version = 0
        self.publication_seq = 0
        self.hello_seq = 0
        self.last_input_at = 0.0
        self.started_at: float | None = None
        self.stopped = False
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

    def packets_to_send(self) -> list[tuple[bytes, Address]]:
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
        paced_until = self.pacing.paced_until
        if paced_until and kind in wire.DATA_TYPES and not paced_until.keys().isdisjoint(transports):
            self.pacing.forwarded_to_paced = True  # `_dispatch` relays the pace to where the copy came from
        self.sent_by_type[kind] += len(transports)
        self.sent_bytes_by_type[kind] += len(data) * len(transports)

    def _send_receiver_busy(self, neighbour: Address, hold: float) -> None:
        self.send(wire.RECEIVER_BUSY, ReceiverBusy(hold), [neighbour])

    def send_up(self, kind: str, body: Body, exclude: Address | None) -> None:
        """Send to every up neighbour except `exclude` (a transport address)."""
        self.send(kind, body, [n.transport for n in self.neighbours.up() if n.transport != exclude])

    def send_records(self, records: list[StoredRecord], transports: list[Address]) -> None:
        """Send records as `tu` bundles that each fit in one datagram."""
        for bundle in self.split(records, _stored_size):
            self.send(wire.TOPOLOGY_UPDATE, TopologyUpdate(tuple(stored.record for stored in bundle)), transports)

    def split(self, items: list[Any], size_of: Any, header: int = 0) -> list[list[Any]]:
        """Cut `items` into runs whose encoded sizes fit one datagram (with room for the envelope's framing and
        `header` more bytes); an item larger than that alone in its run."""
        budget = self.settings.max_datagram - 64 - header
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

    # ------------------------------------------------------------ lifecycle

    def start(self, now: float) -> None:
        self.started_at = now
        self.mesh.claim_allowed_at = now + 2 * self.settings.hello_interval
        self.emit(events.NODE_STARTED, now, broker_id=id_text(self.broker_id), epoch=self.epoch, name=self.name,
                  neighbours=addresses_text([n.transport for n in self.neighbours.all()]))
        self.table.originate(now)
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
        self.table.own_seq += 1
        record = LinkStateRecord(self.broker_id, self.epoch, self.table.own_seq, 0, FLAG_LEAVING, ())
        self.send_up(wire.FEDERATE, Federate(record), exclude=None)
        self.emit(events.NODE_STOPPED, now, counters=self._counter_snapshot())
        self.stopped = True

    def get_timer(self) -> float | None:
        if self.started_at is None or self.stopped:
            return None
        candidates = [self.next_hello, self.next_announce, self.next_stats, *self.table.next_deadlines()]
        dead = self.neighbours.next_deadline(self.settings.neighbour_dead_after)
        if dead is not None:
            candidates.append(dead)
        held = self.mesh.next_deadline()
        if held is not None:
            candidates.append(held)
        retransmit = self.reliable.next_deadline()
        if retransmit is not None:
            candidates.append(retransmit)
        resync = self.sync.next_deadline()
        if resync is not None:
            candidates.append(resync)
        return min(candidates)

    def handle_timer(self, now: float) -> None:
        if self.started_at is None or self.stopped:
            return
        for neighbour in self.neighbours.expire(self.settings.neighbour_dead_after, now):
            self._neighbour_down(neighbour, now)
        self.sync.due_resyncs(now)
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
        self.injected.add(injected_key(self.streams, *publication))  # the local broker has it already
        filters = self.mesh.matching(topic)
        self.counters["publications_originated"] += 1
        pub_text = None
        if self.publication_events:
            pub_text = publication_text(publication)
            self.emit(events.PUBLICATION_ORIGINATED, now, pub=pub_text, topic=topic, qos=qos,
                      retain=retain, size=len(payload), filters=filters)
        for filter_ in self.mesh.publication_filters(filters):
            state = self.mesh.topics[filter_]
            self.seen.add(seen_key(self.streams, *publication, filter_))
            message = TopicMessage(filter_, self.address, self.epoch, self.publication_seq, MODE_TOWARD_CORE, 0,
                                   topic, payload, qos, retain, properties)
            self.mesh.route(state, message, None, now, pub_text)
        self._settle(now)
        return publication

    def local_publish_run(self, run: list[tuple[str, bytes]], now: float) -> list[PublicationId | None]:
        """QoS 0 publications (topic, payload) read together from the local broker, neither retained nor with
        properties: each as `local_publish` would handle it, sent as `tb` runs
        (federation.protocol.publication_batch)."""
        return publication_batch.originate(self, run, now)

    # ------------------------------------------------------------ packets

    def receive_packet(self, data: bytes, source: Address, now: float) -> None:
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
            self.sync.resync(neighbour, now)
            self.table.trigger_origination(now)

    def _dispatch(self, packet: Packet, neighbour: Neighbour, now: float) -> None:
        body = packet.body
        sender = neighbour.transport
        announced = packet.sender.broker_id.address
        if isinstance(body, TopicMessage):  # first: one per publication, the most frequent packet
            if body.qos:
                refusal = self.reliable.refusal(body)
                if refusal is not None:
                    self.drops[refusal] += 1  # unacknowledged: its sender sends it again
                    return
                self.reliable.on_message(body, sender, now)  # acknowledged hop by hop, duplicates too
            pacing = self.pacing
            pacing.forwarded_to_paced = False  # set by `send` (a local publication may have left it set)
            self._on_topic_message(body, announced, now)
            if pacing.forwarded_to_paced:
                pacing.relay(sender, now)
        elif isinstance(body, TopicBatch):
            pacing = self.pacing
            pacing.forwarded_to_paced = False
            publication_batch.receive(self, body, announced, now)
            if pacing.forwarded_to_paced:
                pacing.relay(sender, now)
        elif isinstance(body, Hello):
            self.send(wire.HELLO_BACK, HelloBack(body.seq, body.sent_at, now), [sender])
            if not neighbour.up:
                self._send_hello(neighbour, now)  # answer at once: the link comes up in one round trip
        elif isinstance(body, HelloBack):
            self._on_hello_back(neighbour, body, now)
        elif isinstance(body, Federate):
            self.table.on_records([body.record], neighbour, bundle=False, now=now)
        elif isinstance(body, TopologyUpdate):
            self.table.on_records(list(body.records), neighbour, bundle=True, now=now)
        elif isinstance(body, CoreAnnouncement):
            self.table.on_core_announcement(body, sender, now)
        elif isinstance(body, Reconsider):
            self.table.on_reconsider(body, now)
        elif isinstance(body, ReceiverBusy):
            self.pacing.on_receiver_busy(sender, body.hold, now)
        elif isinstance(body, TopicCore):
            # Whether a core is alive (reachable) decides adoption: judge claims on current routes.
            self.table.compute_pending_routes(now)
            self.mesh.on_topic_core(packet.type, body, sender, announced, now)
        elif isinstance(body, TopicSubscribe):
            self.mesh.on_topic_subscribe(body, announced, now)
        elif isinstance(body, TopicAck):
            acks = self.counters["acks"]
            self.reliable.on_ack(body, sender)
            if self.counters["acks"] > acks:  # it echoes a `tm` we sent: both directions work (rule 1)
                self.neighbours.record_echo(neighbour, now)
        elif isinstance(body, DatabaseDigest):
            self.sync.on_digest(body, neighbour)
        elif isinstance(body, DatabaseSummary):
            self.sync.on_summary(body, neighbour)
        elif isinstance(body, DatabaseRequest):
            self.sync.on_request(body, neighbour)

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
            self.table.trigger_origination(now)
            if self.table.origination_due is not None and self.table.origination_due <= now:
                self.table.originate(now)
            self.sync.sync(neighbour, now)
            if all(n.up for n in self.neighbours.all() if n.configured):
                # Everything we can hear is syncing: claims need wait only for that exchange.
                self.mesh.claim_allowed_at = min(self.mesh.claim_allowed_at, now + max(4 * rtt, 0.01))

    def _neighbour_down(self, neighbour: Neighbour, now: float) -> None:
        self.emit(events.NEIGHBOUR_DOWN, now, neighbour=str(neighbour.transport),
                  neighbour_id=id_text(neighbour.announced))
        if not neighbour.configured:
            self.neighbours.remove(neighbour.transport)
        self.reliable.neighbour_down(neighbour.transport, now)
        self.sync.neighbour_down(neighbour.transport)
        self.pacing.forget(neighbour.transport)
        self.table.trigger_origination(now)

    # ------------------------------------------------------------ settling after an input

    def _settle(self, now: float) -> None:
        """Run after every input: pending origination, routes, management core, topics."""
        self.last_input_at = now
        self.table.settle(now, self._about_to_claim)
        self.mesh.reconcile(now)
        self.reliable.arm(now)  # the QoS 1/2 copies sent by this input get their retransmission deadline

    def _about_to_claim(self, now: float) -> bool:
        """Would the mesh claim a topic core now (a subscribed filter without a core, claims allowed)?"""
        return now >= self.mesh.claim_allowed_at and any(
            state.core is None and self.mesh.wants(filter_) for filter_, state in self.mesh.topics.items())

    def _periodic(self, now: float) -> None:
        """Every announce interval: anti-entropy digests, management-core refresh, expiry, topics.
        Our own record is not re-flooded: it is originated only when our neighbours change."""
        self.sync.send_digests()
        self.table.periodic(now)
        self.sync.expire_left_out(now)
        self.mesh.periodic(now)
        self.next_announce = now + self.settings.announce_interval

    # ------------------------------------------------------------ publications

    def _on_topic_message(self, message: TopicMessage, from_announced: Address, now: float) -> None:
        publication = message.publication
        if not self.seen.add(seen_key(self.streams, *publication, message.filter)):
            self.counters["duplicates_dropped"] += 1
            if self.publication_events:
                self.emit(events.DUPLICATE_DROPPED, now, pub=publication_text(publication), filter=message.filter,
                          source=str(from_announced))
            return
        if is_system(message.topic):
            self._drop_packet("system_topic", message.topic[:64], from_announced, 0, now)
            return
        pub_text = None
        if self.local_index.matching(message.topic) and self.injected.add(injected_key(self.streams, *publication)):
            self._injections.append(Injection(message.topic, message.payload, message.qos, message.retain,
                                              message.properties, publication))
            self.counters["publications_delivered"] += 1
            if self.publication_events:
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
            "pacing": {"busy": self.pacing.busy, "paced_by": sorted(str(n) for n in self.pacing.paced_until),
                       "told": sorted(str(n) for n in self.pacing.told), "sent": self.pacing.sent,
                       "received": self.pacing.received},
            "local_subscriptions": {client: dict(sorted(filters.items()))
                                    for client, filters in sorted(self.clients.items())},
            **self._counter_snapshot(),
        }
