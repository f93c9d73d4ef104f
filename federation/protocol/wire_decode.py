"""Strict decoding of a datagram into a packet (federation.protocol.wire_types).

Theory of operation: a datagram must be exactly one msgpack array of the
shape docs/protocol.md lists for its type, every number within its range
(federation.protocol.wire_constants) and every topic and filter valid;
anything else raises DecodeError with a short machine-readable reason,
which the node counts and records as a `packet_dropped` event. The data
packets (`tm`, `tb`, `tq`, `tk`) and link-state records, which a node
decodes by the thousand, have fast paths that check the common shape in
a few comparisons and fall back to the slow path, which names the fault.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack

from federation.protocol.topic_filter import REPAIR_PREFIX, SHARE_PREFIX
from federation.protocol.types import Address, BrokerId
from federation.protocol.wire_constants import (
    CORE_ANNOUNCEMENT,
    DATABASE_DIGEST,
    DATABASE_REQUEST,
    DATABASE_SUMMARY,
    DIGEST_BUCKETS,
    FEDERATE,
    HELLO,
    HELLO_BACK,
    MAX_COUNT,
    MAX_DISTANCE,
    MAX_EPOCH,
    MAX_HOLD,
    MAX_REACH,
    MAX_SEQ,
    MAX_TIME,
    MAX_TOPIC_DEPTH,
    MAX_U64,
    MESSAGE_TYPES,
    MODE_REPAIR,
    MODE_TO_MEMBER,
    PROTOCOL_VERSION,
    RECEIVER_BUSY,
    RECONSIDER,
    RECONSIDER_TOPIC_CORE,
    RETAINED_DIGEST,
    RETAINED_REQUEST,
    RETAINED_SUMMARY,
    RETAINED_VALUES,
    SET_MEMBERSHIPS,
    SET_RECORDED,
    SHARED_GROUPS,
    TOPIC_ACK,
    TOPIC_ACKS,
    TOPIC_BATCH,
    TOPIC_CORE,
    TOPIC_DIGEST,
    TOPIC_MESSAGE,
    TOPIC_RELIABLE_BATCH,
    TOPIC_REQUEST,
    TOPIC_SUBSCRIBE,
    TOPIC_SUBSCRIPTIONS,
    TOPOLOGY_UPDATE,
    DecodeError,
)
from federation.protocol.wire_fields import (
    checked_address,
    checked_broker_id,
    checked_epoch,
    checked_filter,
    checked_filter_or_shared,
    checked_float,
    checked_int,
    checked_list,
    checked_reach,
    checked_repair_filter,
    checked_seq,
    checked_shared_filter,
    checked_text,
    checked_topic,
    epoch_ok,
    host_ok,
    port_ok,
    u64_ok,
    valid_filters,
    valid_topics,
)
from federation.protocol.wire_types import (
    Body,
    CoreAnnouncement,
    DatabaseDigest,
    DatabaseRequest,
    DatabaseSummary,
    Federate,
    Hello,
    HelloBack,
    LinkStateRecord,
    Packet,
    ReceiverBusy,
    Reconsider,
    RetainedCopy,
    RetainedDigest,
    RetainedEntry,
    RetainedRequest,
    RetainedSummary,
    RetainedValues,
    RetainedVersion,
    Sender,
    SharedGroups,
    SummaryEntry,
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

_tuple_new = tuple.__new__


def _fast_record(value: Any, max_neighbours: int) -> LinkStateRecord | None:
    """The record if `value` is a valid one, else None (then `_record_of` finds and names the fault).
    Records are most of the control traffic; this accepts exactly what `_record_of` accepts, without
    building a field name per check."""
    if type(value) is not list or len(value) != 8:
        return None
    vid, host, port, epoch, seq, distance, flags, neighbours = value
    if not (type(vid) is int and type(host) is str and type(port) is int and type(epoch) is int
            and type(seq) is int and type(distance) is int and type(flags) is int and type(neighbours) is list
            and 0 <= vid <= MAX_U64 and len(host) <= 255 and 0 <= port <= 65535 and 0 <= epoch <= MAX_EPOCH
            and 0 <= seq <= MAX_SEQ and 0 <= distance <= MAX_DISTANCE and 0 <= flags <= 255
            and len(neighbours) <= max_neighbours):
        return None
    addresses = []
    for item in neighbours:
        if type(item) is not list or len(item) != 2:
            return None
        neighbour_host, neighbour_port = item
        if (type(neighbour_host) is not str or len(neighbour_host) > 255 or type(neighbour_port) is not int
                or not 0 <= neighbour_port <= 65535):
            return None
        addresses.append(_tuple_new(Address, (neighbour_host, neighbour_port)))  # Address(), one call less
    return _tuple_new(LinkStateRecord, (_tuple_new(BrokerId, (vid, _tuple_new(Address, (host, port)))), epoch, seq,
                                        distance, flags, tuple(addresses)))


def _record_of(value: Any, what: str, max_neighbours: int) -> LinkStateRecord:
    fast = _fast_record(value, max_neighbours)
    if fast is not None:
        return fast
    fields = checked_list(value, what, 8)
    neighbours = checked_list(fields[7], f"{what}.neighbours")
    if len(neighbours) > max_neighbours:
        raise DecodeError("too_many_neighbours", f"{what}: {len(neighbours)} > {max_neighbours}")
    return LinkStateRecord(
        origin=checked_broker_id(fields[0:3], f"{what}.origin"),
        epoch=checked_epoch(fields[3], f"{what}.epoch"),
        seq=checked_seq(fields[4], f"{what}.seq"),
        distance=checked_int(fields[5], f"{what}.distance", 0, MAX_DISTANCE),
        flags=checked_int(fields[6], f"{what}.flags", 0, 255),
        neighbours=tuple(checked_address(n, f"{what}.neighbours[{i}]") for i, n in enumerate(neighbours)),
    )


def record_of(value: Any, max_neighbours: int) -> LinkStateRecord:
    """One record as msgpack gave it (a list), checked as a packet's record is; DecodeError if not valid (the
    simulator's decode cache decodes each distinct record's bytes once with it)."""
    return _record_of(value, "record", max_neighbours)


def _summary_entry_of(value: Any, what: str) -> SummaryEntry:
    host, port, epoch, seq = checked_list(value, what, 4)
    return SummaryEntry(Address(checked_text(host, f"{what}.host", 255), checked_int(port, f"{what}.port", 0, 65535)),
                        checked_epoch(epoch, f"{what}.epoch"), checked_seq(seq, f"{what}.seq"))


def _retained_version(fields: list[Any], what: str) -> RetainedVersion:
    origin_ms, epoch, seq, host, port = fields
    return (checked_int(origin_ms, f"{what}.origin_ms", 0, MAX_SEQ), checked_epoch(epoch, f"{what}.epoch"),
            checked_seq(seq, f"{what}.seq"), checked_text(host, f"{what}.host", 255),
            checked_int(port, f"{what}.port", 0, 65535))


def _retained_entry_of(value: Any, what: str) -> RetainedEntry:
    fields = checked_list(value, what, 6)
    return RetainedEntry(checked_topic(fields[0], f"{what}.topic"), _retained_version(fields[1:6], what))


def _retained_value_of(value: Any, what: str) -> RetainedCopy:
    fields = checked_list(value, what, 9)
    payload = fields[7]
    if type(payload) is not bytes:
        raise DecodeError("wrong_type", f"{what}.payload: expected bytes")
    return RetainedCopy(checked_topic(fields[0], f"{what}.topic"), _retained_version(fields[1:6], what),
                        checked_int(fields[6], f"{what}.qos", 0, 2), payload,
                        _properties(fields[8], f"{what}.properties"))


_PROPERTY_SCALARS = (str, int, bytes)


def _properties(value: Any, what: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if type(value) is not dict or len(value) > 32:
        raise DecodeError("wrong_type", f"{what}: expected a map of at most 32 properties or nil")
    for key, item in value.items():
        checked_text(key, f"{what} key", 64)
        if isinstance(item, list):
            for pair in item:
                if not (type(pair) is list and len(pair) == 2 and all(type(x) is str for x in pair)):
                    raise DecodeError("wrong_type", f"{what}.{key}: expected [name, value] string pairs")
        elif type(item) not in _PROPERTY_SCALARS:
            raise DecodeError("wrong_type", f"{what}.{key}: expected a string, integer, bytes or pairs")
    return value


def _prev_of(value: Any, epoch: int, seq: int, what: str = "tm.prev") -> tuple[int, int] | None:
    """`tm.prev` (and a `tq` item's): nil, a seq of the publication's epoch, or [epoch, seq]; always before the
    publication itself."""
    if value is None:
        return None
    if type(value) is int:
        prev = (epoch, checked_seq(value, what))
    else:
        prev_epoch, prev_seq = checked_list(value, what, 2)
        prev = (checked_epoch(prev_epoch, f"{what}.epoch"), checked_seq(prev_seq, f"{what}.seq"))
    if prev >= (epoch, seq):
        raise DecodeError("wrong_type", f"{what}: must name a publication before this one")
    return prev


def _decode_body(kind: str, fields: list[Any], max_neighbours: int) -> Body:
    def need(count: int) -> None:
        if len(fields) != count:
            raise DecodeError("wrong_length", f"{kind}: expected {count} body fields, got {len(fields)}")

    if kind == HELLO:
        need(2)
        return Hello(checked_seq(fields[0], "hl.seq"), checked_float(fields[1], "hl.sent_at", MAX_TIME))
    if kind == HELLO_BACK:
        need(3)
        return HelloBack(checked_seq(fields[0], "hb.echo_seq"), checked_float(fields[1], "hb.echo_sent_at", MAX_TIME),
                         checked_float(fields[2], "hb.replied_at", MAX_TIME))
    if kind == FEDERATE:
        need(1)
        return Federate(_record_of(fields[0], "fd.record", max_neighbours))
    if kind == TOPOLOGY_UPDATE:
        need(1)
        items = checked_list(fields[0], "tu.records")
        records = []
        for index, item in enumerate(items):
            record = _fast_record(item, max_neighbours)
            records.append(record if record is not None else _record_of(item, f"tu.records[{index}]", max_neighbours))
        return TopologyUpdate(tuple(records))
    if kind == RECONSIDER:
        need(2)
        return Reconsider(checked_broker_id(fields[0], "rc.target"), checked_broker_id(fields[1], "rc.holder"))
    if kind == CORE_ANNOUNCEMENT:
        need(4)
        return CoreAnnouncement(checked_broker_id(fields[0], "ca.core"), checked_epoch(fields[1], "ca.epoch"),
                                checked_seq(fields[2], "ca.seq"),
                                checked_int(fields[3], "ca.distance", 0, MAX_DISTANCE))
    if kind in (TOPIC_CORE, RECONSIDER_TOPIC_CORE):
        if len(fields) != 7:
            need(6)  # `rank` is an optional seventh field
        return TopicCore(checked_filter(fields[0], f"{kind}.filter"), checked_broker_id(fields[1], f"{kind}.core"),
                         checked_epoch(fields[2], f"{kind}.epoch"), checked_seq(fields[3], f"{kind}.seq"),
                         checked_int(fields[4], f"{kind}.distance", 0, MAX_DISTANCE),
                         checked_int(fields[5], f"{kind}.flags", 0, 255),
                         checked_int(fields[6], f"{kind}.rank") if len(fields) == 7 else 0)
    if kind == TOPIC_SUBSCRIBE:
        need(3)
        return TopicSubscribe(checked_filter(fields[0], "ts.filter"), checked_broker_id(fields[1], "ts.core"),
                              checked_int(fields[2], "ts.flags", 0, 255))
    if kind == TOPIC_MESSAGE:
        if len(fields) != 13 or type(fields[4]) is not int or fields[4] not in (MODE_TO_MEMBER, MODE_REPAIR):
            need(12)  # a mode 2 or 3 `tm` has a thirteenth field, its target
        payload = fields[8]
        if type(payload) is not bytes:
            raise DecodeError("wrong_type", "tm.payload: expected bytes")
        retain = fields[10]
        if type(retain) is not bool:
            raise DecodeError("wrong_type", "tm.retain: expected a boolean")
        epoch, seq = checked_epoch(fields[2], "tm.epoch"), checked_seq(fields[3], "tm.seq")
        mode = checked_int(fields[4], "tm.mode", 0, MODE_REPAIR)
        to_member = mode in (MODE_TO_MEMBER, MODE_REPAIR)
        if to_member and len(fields) != 13:
            raise DecodeError("wrong_length", f"tm: expected 13 body fields with mode {mode}, got {len(fields)}")
        if mode == MODE_REPAIR:
            filter_ = checked_repair_filter(fields[0], "tm.filter")
            target = checked_address(fields[12], "tm.target")
            if not filter_.startswith(f"{REPAIR_PREFIX}{target.host}/{target.port}/"):
                raise DecodeError("bad_filter", "tm.filter: a repair filter must name the target")
        else:
            filter_ = (checked_shared_filter(fields[0], "tm.filter") if to_member
                       else checked_filter(fields[0], "tm.filter"))
        return TopicMessage(
            filter=filter_,
            origin=checked_address(fields[1], "tm.origin"),
            epoch=epoch, seq=seq, mode=mode, hops=checked_int(fields[5], "tm.hops", 0, 255),
            topic=checked_topic(fields[7], "tm.topic"), payload=payload, qos=checked_int(fields[9], "tm.qos", 0, 2),
            retain=retain, properties=_properties(fields[11], "tm.properties"), prev=_prev_of(fields[6], epoch, seq),
            target=checked_address(fields[12], "tm.target") if to_member else None,
        )
    if kind in (DATABASE_DIGEST, RETAINED_DIGEST):
        need(2)
        buckets = checked_list(fields[1], f"{kind}.buckets", DIGEST_BUCKETS)
        if not all(u64_ok(b) for b in buckets):
            for i, b in enumerate(buckets):
                checked_int(b, f"{kind}.buckets[{i}]")
        count = checked_int(fields[0], f"{kind}.count", 0, MAX_COUNT)
        return DatabaseDigest(count, tuple(buckets)) if kind == DATABASE_DIGEST else RetainedDigest(count,
                                                                                                   tuple(buckets))
    if kind == RETAINED_SUMMARY:
        need(1)
        items = checked_list(fields[0], "rs.entries")
        return RetainedSummary(tuple(_retained_entry_of(e, f"rs.entries[{i}]") for i, e in enumerate(items)))
    if kind == RETAINED_REQUEST:
        need(1)
        items = checked_list(fields[0], "rr.topics")
        return RetainedRequest(tuple(checked_topic(t, f"rr.topics[{i}]") for i, t in enumerate(items)))
    if kind == RETAINED_VALUES:
        need(1)
        items = checked_list(fields[0], "rv.values")
        return RetainedValues(tuple(_retained_value_of(v, f"rv.values[{i}]") for i, v in enumerate(items)))
    if kind == DATABASE_SUMMARY:
        need(1)
        items = checked_list(fields[0], "ds.entries")
        return DatabaseSummary(tuple(_summary_entry_of(e, f"ds.entries[{i}]") for i, e in enumerate(items)))
    if kind == DATABASE_REQUEST:
        need(1)
        items = checked_list(fields[0], "dr.origins")
        return DatabaseRequest(tuple(checked_address(a, f"dr.origins[{i}]") for i, a in enumerate(items)))
    if kind == TOPIC_ACK:
        need(5)
        return TopicAck(checked_filter_or_shared(fields[0], "ta.filter"), checked_address(fields[1], "ta.origin"),
                        checked_epoch(fields[2], "ta.epoch"), checked_seq(fields[3], "ta.seq"),
                        checked_reach(fields[4], "ta.reach", MAX_REACH))
    if kind == TOPIC_BATCH:
        need(6)
        items = checked_list(fields[5], "tb.items")
        if not items or len(items) % 3:
            raise DecodeError("wrong_length", "tb.items: expected seq, topic, payload for each of 1 or more")
        for index in range(0, len(items), 3):
            what = f"tb.items[{index // 3}]"
            checked_seq(items[index], f"{what}.seq")
            checked_topic(items[index + 1], f"{what}.topic")
            if type(items[index + 2]) is not bytes:
                raise DecodeError("wrong_type", f"{what}.payload: expected bytes")
        return TopicBatch(checked_filter(fields[0], "tb.filter"), checked_address(fields[1], "tb.origin"),
                          checked_epoch(fields[2], "tb.epoch"), checked_int(fields[3], "tb.mode", 0, 1),
                          checked_int(fields[4], "tb.hops", 0, 255), items)
    if kind == TOPIC_RELIABLE_BATCH:
        need(7)
        items = checked_list(fields[6], "tq.items")
        if not items or len(items) % 4:
            raise DecodeError("wrong_length", "tq.items: expected seq, prev, topic, payload for each of 1 or more")
        epoch = checked_epoch(fields[2], "tq.epoch")
        for index in range(0, len(items), 4):
            what = f"tq.items[{index // 4}]"
            seq = checked_seq(items[index], f"{what}.seq")
            _prev_of(items[index + 1], epoch, seq, f"{what}.prev")
            checked_topic(items[index + 2], f"{what}.topic")
            if type(items[index + 3]) is not bytes:
                raise DecodeError("wrong_type", f"{what}.payload: expected bytes")
        return TopicReliableBatch(checked_filter(fields[0], "tq.filter"), checked_address(fields[1], "tq.origin"),
                                  epoch,
                                  checked_int(fields[3], "tq.mode", 0, 1), checked_int(fields[4], "tq.hops", 0, 255),
                                  checked_int(fields[5], "tq.qos", 1, 2), items)
    if kind == TOPIC_ACKS:
        need(5)
        seqs = checked_list(fields[3], "tk.seqs")
        if not seqs:
            raise DecodeError("wrong_length", "tk.seqs: expected 1 or more")
        for index, seq in enumerate(seqs):
            checked_seq(seq, f"tk.seqs[{index}]")
        return TopicAcks(checked_filter_or_shared(fields[0], "tk.filter"), checked_address(fields[1], "tk.origin"),
                         checked_epoch(fields[2], "tk.epoch"), seqs, checked_reach(fields[4], "tk.reach", MAX_REACH))
    if kind in (TOPIC_DIGEST, TOPIC_REQUEST):
        need(5 if kind == TOPIC_DIGEST else 3)
        set_ = checked_int(fields[0], f"{kind}.set", 0, SET_RECORDED if kind == TOPIC_DIGEST else SET_MEMBERSHIPS)
        depth, path = _bucket_of(fields[1], fields[2], kind)
        if kind == TOPIC_REQUEST:
            return TopicRequest(set_, depth, path)
        if depth >= MAX_TOPIC_DEPTH:
            raise DecodeError("out_of_range", f"td.depth: a digest's children lie at most {MAX_TOPIC_DEPTH} deep")
        counts = checked_list(fields[3], "td.counts")
        hashes = checked_list(fields[4], "td.hashes")
        if len(counts) not in (1, DIGEST_BUCKETS) or len(hashes) != len(counts):
            raise DecodeError("wrong_type", f"td: expected 1 count and hash (the bucket's) or {DIGEST_BUCKETS} "
                                            f"(its children's), got {len(counts)} and {len(hashes)}")
        for index in range(len(counts)):
            checked_int(counts[index], f"td.counts[{index}]", 0, MAX_COUNT)
            checked_int(hashes[index], f"td.hashes[{index}]")
        return TopicDigest(set_, depth, path, tuple(counts), tuple(hashes))
    if kind == TOPIC_SUBSCRIPTIONS:
        need(4)
        depth, path = _bucket_of(fields[0], fields[1], kind)
        if type(fields[2]) is not bool:
            raise DecodeError("wrong_type", "tz.complete: expected a boolean")
        entries = []
        for index, item in enumerate(checked_list(fields[3], "tz.entries")):
            entry = checked_list(item, f"tz.entries[{index}]", 3)
            entries.append(TopicSubscribe(checked_filter(entry[0], f"tz.entries[{index}].filter"),
                                          checked_broker_id(entry[1], f"tz.entries[{index}].core"),
                                          checked_int(entry[2], f"tz.entries[{index}].flags", 0, 255)))
        return TopicSubscriptions(depth, path, fields[2], tuple(entries))
    if kind == RECEIVER_BUSY:
        need(1)
        return ReceiverBusy(checked_float(fields[0], "rb.hold", MAX_HOLD))
    if kind == SHARED_GROUPS:
        need(4)
        groups = []
        for index, item in enumerate(checked_list(fields[3], "sg.groups")):
            group, filter_ = checked_list(item, f"sg.groups[{index}]", 2)
            if type(group) is not str or "/" in group:
                raise DecodeError("bad_filter", f"sg.groups[{index}]: a group name is a string without '/'")
            shared = f"{SHARE_PREFIX}{checked_text(group, 'sg.group')}/{checked_text(filter_, 'sg.filter')}"
            checked_shared_filter(shared, f"sg.groups[{index}]")
            groups.append((group, filter_))
        return SharedGroups(checked_address(fields[0], "sg.origin"), checked_epoch(fields[1], "sg.epoch"),
                            checked_seq(fields[2], "sg.seq"), tuple(groups))
    raise DecodeError("unknown_type", repr(kind)[:40])


def _bucket_of(depth_value: Any, path_value: Any, kind: str) -> tuple[int, int]:
    """A bucket's (depth, path), checked: `path` has `depth` nibbles."""
    depth = checked_int(depth_value, f"{kind}.depth", 0, MAX_TOPIC_DEPTH)
    return depth, checked_int(path_value, f"{kind}.path", 0, 16**depth - 1)


def _fast_topic_message(value: list[Any]) -> Packet | None:
    """The packet if `value` is a valid `tm` whose filter and topic were validated lately and that has no
    properties, else None (then the general path decodes it and names any fault). A `tm` is the packet
    every publication costs; this accepts a subset of what that path accepts and builds the same packet,
    without a field name per check (tests/protocol/test_hotpath_node.py compares the two)."""
    (_kind, version, sender, filter_, origin, epoch, seq, mode, hops, prev, topic, payload, qos, retain,
     properties) = value
    if not (properties is None and type(version) is int and version == PROTOCOL_VERSION
            and type(sender) is list and len(sender) == 4
            and type(filter_) is str and filter_ in valid_filters and type(topic) is str and topic in valid_topics
            and type(origin) is list and len(origin) == 2
            and type(mode) is int and 0 <= mode <= 1 and type(hops) is int and 0 <= hops <= 255
            and type(payload) is bytes and type(qos) is int and 0 <= qos <= 2 and type(retain) is bool):
        return None
    if not (type(epoch) is int and 0 <= epoch <= MAX_EPOCH and type(seq) is int and 0 <= seq <= MAX_SEQ
            and (prev is None or (type(prev) is int and 0 <= prev < seq))):
        return None
    checked = _fast_sender_and_origin(sender, origin)
    if checked is None:
        return None
    return Packet(TOPIC_MESSAGE, checked[0],
                  TopicMessage(filter_, checked[1], epoch, seq, mode, hops, topic, payload, qos, retain, None,
                               None if prev is None else (epoch, prev)))


def _fast_sender_and_origin(sender: list[Any], origin: list[Any]) -> tuple[Sender, Address] | None:
    """A data packet's sender [vid, host, port, epoch] and origin [host, port] (arrays of those lengths), if valid,
    else None. `u64_ok`, `host_ok` and `port_ok`, written out: eight calls fewer per packet."""
    vid, host, port, sender_epoch = sender
    origin_host, origin_port = origin
    if not (type(vid) is int and 0 <= vid <= MAX_U64 and type(host) is str and len(host) <= 255
            and type(port) is int and 0 <= port <= 65535 and type(sender_epoch) is int
            and 0 <= sender_epoch <= MAX_EPOCH
            and type(origin_host) is str and len(origin_host) <= 255 and type(origin_port) is int
            and 0 <= origin_port <= 65535):
        return None
    return (Sender(_tuple_new(BrokerId, (vid, _tuple_new(Address, (host, port)))), sender_epoch),
            _tuple_new(Address, (origin_host, origin_port)))


_INT, _STR, _BYTES = {int}, {str}, {bytes}


def _fast_topic_batch(value: list[Any]) -> Packet | None:
    """The packet if `value` is a valid `tb` whose filter and every topic were validated lately, else None
    (then the general path decodes it and names any fault); as `_fast_topic_message`, for a whole run."""
    _kind, version, sender, filter_, origin, epoch, mode, hops, items = value
    if not (type(version) is int and version == PROTOCOL_VERSION and type(sender) is list and len(sender) == 4
            and type(filter_) is str and filter_ in valid_filters and type(origin) is list and len(origin) == 2
            and type(epoch) is int and 0 <= epoch <= MAX_EPOCH and type(mode) is int and 0 <= mode <= 1
            and type(hops) is int and 0 <= hops <= 255 and type(items) is list and items and not len(items) % 3):
        return None
    checked = _fast_sender_and_origin(sender, origin)
    if checked is None:
        return None
    # Each seq an int in range, each topic a str validated lately, each payload bytes: checked a field at a
    # time over the run (`type(x) is int` is false for a bool, and so is `{int}` with a bool among them).
    seqs, topics = items[0::3], items[1::3]
    if not (set(map(type, seqs)) == _INT and min(seqs) >= 0 and max(seqs) <= MAX_SEQ
            and set(map(type, topics)) == _STR and valid_topics.keys() >= set(topics)
            and set(map(type, items[2::3])) == _BYTES):
        return None
    return Packet(TOPIC_BATCH, checked[0], TopicBatch(filter_, checked[1], epoch, mode, hops, items))


def _fast_reliable_batch(value: list[Any]) -> Packet | None:
    """The packet if `value` is a valid `tq` whose filter and every topic were validated lately and whose items
    name `prev` as nil or a seq of the run's epoch, else None (the general path decodes it and names any fault)."""
    _kind, version, sender, filter_, origin, epoch, mode, hops, qos, items = value
    if not (type(version) is int and version == PROTOCOL_VERSION and type(sender) is list and len(sender) == 4
            and type(filter_) is str and filter_ in valid_filters and type(origin) is list and len(origin) == 2
            and type(epoch) is int and 0 <= epoch <= MAX_EPOCH and type(mode) is int and 0 <= mode <= 1
            and type(hops) is int and 0 <= hops <= 255 and type(qos) is int and 1 <= qos <= 2
            and type(items) is list and items and not len(items) % 4):
        return None
    checked = _fast_sender_and_origin(sender, origin)
    if checked is None:
        return None
    topics = valid_topics
    fields = iter(items)
    for seq, prev, topic, payload in zip(fields, fields, fields, fields, strict=True):
        if not (type(seq) is int and 0 <= seq <= MAX_SEQ and (prev is None or (type(prev) is int and 0 <= prev < seq))
                and type(topic) is str and topic in topics and type(payload) is bytes):
            return None
    return Packet(TOPIC_RELIABLE_BATCH, checked[0],
                  TopicReliableBatch(filter_, checked[1], epoch, mode, hops, qos, items))


def _fast_topic_acks(value: list[Any]) -> Packet | None:
    """The packet if `value` is a valid `tk` whose filter was validated lately, else None."""
    _kind, version, sender, filter_, origin, epoch, seqs, reach = value
    if not (type(version) is int and version == PROTOCOL_VERSION and type(sender) is list and len(sender) == 4
            and type(filter_) is str and filter_ in valid_filters and type(origin) is list and len(origin) == 2
            and type(epoch) is int and 0 <= epoch <= MAX_EPOCH and type(seqs) is list and seqs
            and type(reach) is list and len(reach) <= MAX_REACH):
        return None
    for seq in seqs:
        if not (type(seq) is int and 0 <= seq <= MAX_SEQ):
            return None
    checked = _fast_sender_and_origin(sender, origin)
    if checked is None:
        return None
    reached = _fast_reach(reach)
    if reached is None:
        return None
    return Packet(TOPIC_ACKS, checked[0], TopicAcks(filter_, checked[1], epoch, seqs, reached))


def _fast_reach(reach: list[Any]) -> tuple[Address, ...] | None:
    """`tk.reach` if every item is a valid [host, port], else None (the general path names the fault). The same
    reach comes back in every acknowledgement of a run, so the last one is kept (a pure memo)."""
    global _last_reach
    last = _last_reach
    if reach == last[0]:
        return last[1]
    addresses = []
    for item in reach:
        if not (type(item) is list and len(item) == 2 and host_ok(item[0]) and port_ok(item[1])):
            return None
        addresses.append(_tuple_new(Address, (item[0], item[1])))
    reached = tuple(addresses)
    _last_reach = (reach, reached)
    return reached


_last_reach: tuple[list[Any], tuple[Address, ...]] = ([], ())


_FAST_PATHS: dict[str, tuple[int, Callable[[list[Any]], Packet | None]]] = {
    TOPIC_MESSAGE: (15, _fast_topic_message),
    TOPIC_BATCH: (9, _fast_topic_batch),
    TOPIC_RELIABLE_BATCH: (10, _fast_reliable_batch),
    TOPIC_ACKS: (8, _fast_topic_acks),
}
"""the data packets' fast decoders, by type, with the array length they take; None from one: the full path"""


def decode(data: bytes, max_packet: int = 65507, max_neighbours: int = 1024) -> Packet:
    """Decode one datagram or raise DecodeError; never raises anything else."""
    if len(data) > max_packet:
        raise DecodeError("oversized", f"{len(data)} bytes > {max_packet}")
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except DecodeError:
        raise
    except Exception as error:  # noqa: BLE001 - msgpack raises many types; all mean "not one valid value"
        raise DecodeError("malformed", type(error).__name__) from None
    if type(value) is not list or len(value) < 3:
        raise DecodeError("malformed", "not an array of at least 3 elements")
    kind = value[0]
    fast = _FAST_PATHS.get(kind) if type(kind) is str else None
    if fast is not None and len(value) == fast[0]:
        packet = fast[1](value)
        if packet is not None:
            return packet
    if type(kind) is not str or kind not in MESSAGE_TYPES:
        raise DecodeError("unknown_type", repr(kind)[:40])
    if type(value[1]) is not int or value[1] != PROTOCOL_VERSION:
        raise DecodeError("version", f"protocol version {value[1]!r}, this node speaks {PROTOCOL_VERSION}")
    sender_fields = value[2]
    if (type(sender_fields) is list and len(sender_fields) == 4 and u64_ok(sender_fields[0])
            and host_ok(sender_fields[1]) and port_ok(sender_fields[2]) and epoch_ok(sender_fields[3])):
        sender = Sender(BrokerId(sender_fields[0], Address(sender_fields[1], sender_fields[2])), sender_fields[3])
    else:  # the slow path names the fault
        sender_fields = checked_list(sender_fields, "sender", 4)
        sender = Sender(checked_broker_id(sender_fields[0:3], "sender"),
                        checked_epoch(sender_fields[3], "sender.epoch"))
    try:
        body = _decode_body(kind, value[3:], max_neighbours)
    except DecodeError:
        raise
    except Exception as error:  # noqa: BLE001 - a shape we did not foresee is still the peer's fault
        raise DecodeError("malformed", f"{kind}: {type(error).__name__}") from None
    return Packet(kind, sender, body)


Decoder = Callable[[bytes], Packet]
DecodeFunction = Callable[[bytes, int, int], Packet]
"""`decode`'s shape (data, max_packet, max_neighbours): a node may be given another, e.g. the simulator's cache"""
