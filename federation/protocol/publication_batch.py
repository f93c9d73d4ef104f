"""QoS 0 publications a run at a time: a burst read from the broker goes out as `tb` packets, and a `tb`
received is handled as one packet (docs/protocol.md rule 7c).

Theory of operation: under load the wrapper reads publications from its
broker in bursts, and each `tm` then costs a whole packet's work for one
publication: its header encoded and decoded, its sender noted, its route
looked up, the node settled. A `tb` carries a run of QoS 0 publications
of one origin on one filter (not retained, no properties: what such a
publication's `tm` would carry beyond its seq, topic and payload is the
same for the whole run), so that work is done once per run and only the
duplicate check, the local match and the injection remain per
publication. The outcome is the `tm` rules' exactly: the same duplicate
cache entries, deliveries, drops, counters and per-publication events;
where a run cannot be forwarded whole (no core yet, no route) each
publication takes the `tm` path alone. What changes is the grain of
forwarding: one parent is drawn per run, not per publication, toward the
core.

A run of one publication goes out as a plain `tm`, so traffic at a low
rate looks as before. Runs are cut to fit one datagram (`max_datagram`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from federation.protocol import events
from federation.protocol.events import publication_text
from federation.protocol.topic_filter import is_system
from federation.protocol.types import Injection, PublicationId
from federation.protocol.wire import MODE_TOWARD_CORE, TOPIC_BATCH, Sender, TopicBatch, TopicMessage, encode

if TYPE_CHECKING:
    from federation.protocol.node import Node
    from federation.protocol.types import Address

ITEM_OVERHEAD = 17
"""bytes msgpack adds to a run entry at most beyond its topic and payload: seq (9), topic and payload headers"""


def originate(node: Node, run: list[tuple[str, bytes]], now: float) -> list[PublicationId | None]:
    """QoS 0 publications made on the local broker, neither retained nor with properties, in the order read;
    returns their ids (None for a `$` topic), as `Node.local_publish` does for one."""
    if node.stopped:
        return [None] * len(run)
    if len(run) == 1:
        topic, payload = run[0]
        return [node.local_publish(topic, payload, 0, False, None, now)]
    mesh = node.mesh
    address, epoch = node.address, node.epoch
    streams = node.streams  # the cache keys are `dedup.seen_key` and `injected_key`, made a run at a time
    injected_base = streams.base(address.host, address.port, epoch, None)
    seen_bases: dict[str, int] = {}
    injected_add, seen_add = node.injected.add, node.seen.add
    matching, publication_filters = mesh.matching, mesh.publication_filters
    events_on = node.publication_events
    seq = node.publication_seq
    runs: dict[str, list[tuple[int, str, bytes]]] = {}
    made: list[PublicationId | None] = []
    for topic, payload in run:
        if is_system(topic):
            made.append(None)
            continue
        seq += 1
        publication: PublicationId = (address, epoch, seq)
        made.append(publication)
        injected_add(injected_base | seq)  # the local broker has it already
        filters = matching(topic)
        if events_on:
            node.emit(events.PUBLICATION_ORIGINATED, now, pub=publication_text(publication), topic=topic, qos=0,
                      retain=False, size=len(payload), filters=filters)
        for filter_ in publication_filters(filters):
            base = seen_bases.get(filter_)
            if base is None:
                base = seen_bases[filter_] = streams.base(address.host, address.port, epoch, filter_)
            seen_add(base | seq)
            items = runs.get(filter_)
            if items is None:
                items = runs[filter_] = []
            items.append((seq, topic, payload))
    node.counters["publications_originated"] += seq - node.publication_seq
    node.publication_seq = seq
    for filter_, items in runs.items():
        state = mesh.topics[filter_]
        if len(items) == 1:  # alone on its filter: a plain `tm`
            seq, topic, payload = items[0]
            message = TopicMessage(filter_, address, epoch, seq, MODE_TOWARD_CORE, 0, topic, payload, 0, False, None)
            mesh.route(state, message, None, now)
            continue
        header = len(encode(TOPIC_BATCH, Sender(node.broker_id, epoch),
                            TopicBatch(filter_, address, epoch, MODE_TOWARD_CORE, 255, [])))
        for part in node.split(items, _item_size, header):
            flat = [field for item in part for field in item]
            mesh.route_batch(state, TopicBatch(filter_, address, epoch, MODE_TOWARD_CORE, 0, flat), None, now)
    node._settle(now)
    return made


def _item_size(item: tuple[int, str, bytes]) -> int:
    """Bytes one publication adds to a `tb`, at most (for `Node.split`)."""
    _seq, topic, payload = item
    return ITEM_OVERHEAD + len(payload) + (len(topic) if topic.isascii() else len(topic.encode()))


def receive(node: Node, batch: TopicBatch, from_announced: Address, now: float) -> None:
    """A `tb` from a neighbour: each publication as `Node._on_topic_message` would handle its `tm`."""
    filter_, origin, epoch = batch.filter, batch.origin, batch.epoch
    streams = node.streams  # the cache keys are `dedup.seen_key` and `injected_key`, made a run at a time
    seen_base = streams.base(origin.host, origin.port, epoch, filter_)
    injected_base = streams.base(origin.host, origin.port, epoch, None)
    seen_add, injected_add = node.seen.add, node.injected.add
    local_matching = node.local_index.matching
    injections = node._injections
    events_on = node.publication_events
    delivered = duplicates = 0
    kept: list[Any] = []
    items = iter(batch.items)
    for seq, topic, payload in zip(items, items, items, strict=True):
        if not seen_add(seen_base | seq):
            duplicates += 1
            if events_on:
                publication: PublicationId = (origin, epoch, seq)
                node.emit(events.DUPLICATE_DROPPED, now, pub=publication_text(publication), filter=filter_,
                          source=str(from_announced))
            continue
        if is_system(topic):
            node._drop_packet("system_topic", topic[:64], from_announced, 0, now)
            continue
        if local_matching(topic) and injected_add(injected_base | seq):
            publication = (origin, epoch, seq)
            injections.append(Injection(topic, payload, 0, False, None, publication))
            delivered += 1
            if events_on:
                node.emit(events.PUBLICATION_DELIVERED, now, pub=publication_text(publication), topic=topic,
                          filter=filter_, hops=batch.hops + 1)
        kept.append(seq)
        kept.append(topic)
        kept.append(payload)
    counters = node.counters
    if duplicates:
        counters["duplicates_dropped"] += duplicates
    if delivered:
        counters["publications_delivered"] += delivered
    if not kept:
        return
    if batch.hops + 1 >= node.settings.max_hops:
        node.drops["max_hops"] += len(kept) // 3
        return
    state = node.mesh.state(filter_)
    if state is None:
        node.drops["topics_full"] += len(kept) // 3
        return
    if len(kept) != len(batch.items):
        batch = TopicBatch(filter_, origin, epoch, batch.mode, batch.hops, kept)
    node.mesh.route_batch(state, batch, from_announced, now)
