"""Wire format: every datagram is one msgpack array.

    [type, version, sender, body...]

`type` is the two-letter message type, `version` the protocol version
(PROTOCOL_VERSION), `sender` the sending node as [vid, host, port, epoch].
The body fields per type are listed in docs/protocol.md (and in `encode`).
This module is the format's face: it encodes (trusting its inputs, which
come from the node) and sizes packets, and reads a packet's type without
decoding it; the rest is importable from here as before:

- the vocabulary, `federation.protocol.wire_constants`: message types,
  flags, modes, the ranges of numbers, DecodeError;
- the packets as values, `federation.protocol.wire_types`;
- strict decoding, `federation.protocol.wire_decode` (with the checked
  readers of one field in `federation.protocol.wire_fields`): anything that
  is not exactly one array of the documented shape raises DecodeError with
  a short machine-readable reason (`DecodeError.reason`) that the node
  counts and records as a `packet_dropped` event.
"""

from __future__ import annotations

from typing import Any

import msgpack

from federation.protocol.types import Address, BrokerId, PublicationId
from federation.protocol.wire_constants import (
    CORE_ANNOUNCEMENT,
    DATA_TYPES,
    DATABASE_DIGEST,
    DATABASE_REQUEST,
    DATABASE_SUMMARY,
    DIGEST_BUCKETS,
    EPOCHS_FOR_RESTARTS,
    FEDERATE,
    FLAG_LEAVING,
    FLAG_OWNER,
    FLAG_PRUNE,
    FLAG_STANDBY,
    FLAG_WITHDRAWN,
    HELLO,
    HELLO_BACK,
    MAX_COUNT,
    MAX_DISTANCE,
    MAX_EPOCH,
    MAX_HOLD,
    MAX_JUMP_EPOCH,
    MAX_REACH,
    MAX_SEQ,
    MAX_TEXT,
    MAX_TIME,
    MAX_TOPIC_DEPTH,
    MAX_U64,
    MESSAGE_TYPES,
    MODE_IN_MESH,
    MODE_REPAIR,
    MODE_TO_MEMBER,
    MODE_TOWARD_CORE,
    PROTOCOL_VERSION,
    RECEIVER_BUSY,
    RECONSIDER,
    RECONSIDER_TOPIC_CORE,
    RETAINED_DIGEST,
    RETAINED_REQUEST,
    RETAINED_SUMMARY,
    RETAINED_VALUES,
    SET_CLAIMS,
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
    further,
)
from federation.protocol.wire_decode import DecodeFunction, Decoder, decode, record_of
from federation.protocol.wire_types import (  # the packet values, importable from here as before
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

__all__ = [  # the wire format's face: its vocabulary, the packet values, encoding and decoding
    "CORE_ANNOUNCEMENT", "DATABASE_DIGEST", "DATABASE_REQUEST", "DATABASE_SUMMARY", "DATA_TYPES", "DIGEST_BUCKETS",
    "EPOCHS_FOR_RESTARTS", "FEDERATE", "FLAG_LEAVING", "FLAG_OWNER", "FLAG_PRUNE", "FLAG_STANDBY", "FLAG_WITHDRAWN",
    "HELLO", "HELLO_BACK", "MAX_COUNT", "MAX_DISTANCE", "MAX_EPOCH", "MAX_HOLD", "MAX_JUMP_EPOCH", "MAX_SEQ",
    "MAX_TEXT", "MAX_TIME", "MAX_U64", "MESSAGE_TYPES", "MODE_IN_MESH", "MODE_TOWARD_CORE", "MODE_TO_MEMBER",
    "MODE_REPAIR", "MAX_REACH",
    "PROTOCOL_VERSION", "RECEIVER_BUSY", "RECONSIDER", "RECONSIDER_TOPIC_CORE", "RETAINED_DIGEST", "RETAINED_REQUEST",
    "RETAINED_SUMMARY", "RETAINED_VALUES", "SHARED_GROUPS", "TOPIC_ACK", "TOPIC_ACKS", "TOPIC_BATCH", "TOPIC_CORE",
    "TOPIC_MESSAGE", "TOPIC_RELIABLE_BATCH", "TOPIC_SUBSCRIBE", "TOPOLOGY_UPDATE", "DecodeError", "further", "Body",
    "CoreAnnouncement", "DatabaseDigest", "DatabaseRequest", "DatabaseSummary", "Federate", "Hello", "HelloBack",
    "LinkStateRecord", "Packet", "ReceiverBusy", "Reconsider", "RetainedCopy", "RetainedDigest", "RetainedEntry",
    "RetainedRequest", "RetainedSummary", "RetainedValues", "RetainedVersion", "Sender", "SharedGroups",
    "SummaryEntry", "TopicAck", "TopicAcks", "TopicBatch", "TopicCore", "TopicMessage", "TopicReliableBatch",
    "TopicSubscribe", "TopologyUpdate", "TOPIC_DIGEST", "TOPIC_REQUEST", "TOPIC_SUBSCRIPTIONS", "SET_CLAIMS",
    "SET_MEMBERSHIPS", "SET_RECORDED", "MAX_TOPIC_DEPTH", "TopicDigest", "TopicRequest", "TopicSubscriptions",
    "subscription_entry_size", "encode", "record_size", "reliable_item_size", "reliable_items",
    "summary_entry_size", "address_size", "retained_entry_size", "retained_topic_size", "retained_value_size",
    "decode", "record_of", "Decoder", "DecodeFunction", "packet_type", "plain_topic_message_qos",
    "publication_ids_of",
]

# One packer for every `encode`: `msgpack.packb` builds a new Packer per call, a third of its cost.
# Safe to share: packing plain values runs in C without releasing the GIL or calling back into Python.
_pack = msgpack.Packer(use_bin_type=True).pack


# ---------------------------------------------------------------- encoding

def _bid(broker_id: BrokerId) -> list[Any]:
    return [broker_id.vid, broker_id.address.host, broker_id.address.port]


def _record(record: LinkStateRecord) -> list[Any]:
    origin = record.origin
    # Addresses are tuples: msgpack writes the neighbour tuple as [[host, port], ...] as it is.
    return [origin.vid, origin.address.host, origin.address.port, record.epoch, record.seq, record.distance,
            record.flags, record.neighbours]


def _summary_entry(entry: SummaryEntry) -> list[Any]:
    return [entry.origin.host, entry.origin.port, entry.epoch, entry.seq]


def _retained_entry(topic: str, version: RetainedVersion) -> list[Any]:
    return [topic, *version]


def _retained_value(copy: RetainedCopy) -> list[Any]:
    return [copy.topic, *copy.version, copy.qos, copy.payload, copy.properties]


def _header(kind: str, sender: Sender) -> list[Any]:
    return [kind, PROTOCOL_VERSION, [*_bid(sender.broker_id), sender.epoch]]


def _prev(body: TopicMessage) -> int | list[int] | None:
    """`tm.prev` as written: nil, the seq alone when it is of the publication's own epoch, else [epoch, seq]."""
    prev = body.prev
    if prev is None:
        return None
    return prev[1] if prev[0] == body.epoch else [prev[0], prev[1]]


def _reach(reach: tuple[Address, ...]) -> list[list[Any]]:
    """`ta.reach`, `tk.reach` as written: the addresses as [host, port], in the order given (sorted by the node)."""
    return [[address.host, address.port] for address in reach]


def encode(kind: str, sender: Sender, body: Body) -> bytes:
    fields: list[Any]
    if type(body) is TopicMessage:  # one per publication and hop: first, and built in one list
        broker_id, origin = sender.broker_id, body.origin
        packed_tm: bytes = _pack(
            [kind, PROTOCOL_VERSION, [broker_id.vid, broker_id.address.host, broker_id.address.port, sender.epoch],
             body.filter, [origin.host, origin.port], body.epoch, body.seq, body.mode, body.hops,
             None if body.prev is None else _prev(body), body.topic, body.payload, body.qos, body.retain,
             body.properties] if body.target is None else
            [kind, PROTOCOL_VERSION, [broker_id.vid, broker_id.address.host, broker_id.address.port, sender.epoch],
             body.filter, [origin.host, origin.port], body.epoch, body.seq, body.mode, body.hops,
             None if body.prev is None else _prev(body), body.topic, body.payload, body.qos, body.retain,
             body.properties, [body.target.host, body.target.port]])
        return packed_tm
    if type(body) is TopicBatch:
        broker_id, origin = sender.broker_id, body.origin
        packed_tb: bytes = _pack(
            [kind, PROTOCOL_VERSION, [broker_id.vid, broker_id.address.host, broker_id.address.port, sender.epoch],
             body.filter, [origin.host, origin.port], body.epoch, body.mode, body.hops, body.items])
        return packed_tb
    if type(body) is TopicReliableBatch:
        broker_id, origin = sender.broker_id, body.origin
        packed_tq: bytes = _pack(
            [kind, PROTOCOL_VERSION, [broker_id.vid, broker_id.address.host, broker_id.address.port, sender.epoch],
             body.filter, [origin.host, origin.port], body.epoch, body.mode, body.hops, body.qos, body.items])
        return packed_tq
    if type(body) is TopicAcks:
        broker_id, origin = sender.broker_id, body.origin
        packed_tk: bytes = _pack(
            [kind, PROTOCOL_VERSION, [broker_id.vid, broker_id.address.host, broker_id.address.port, sender.epoch],
             body.filter, [origin.host, origin.port], body.epoch, body.seqs, _reach(body.reach)])
        return packed_tk
    if isinstance(body, Hello):
        fields = [body.seq, body.sent_at]
    elif isinstance(body, HelloBack):
        fields = [body.echo_seq, body.echo_sent_at, body.replied_at]
    elif isinstance(body, Federate):
        fields = [_record(body.record)]
    elif isinstance(body, TopologyUpdate):
        fields = [[_record(r) for r in body.records]]
    elif isinstance(body, Reconsider):
        fields = [_bid(body.target), _bid(body.holder)]
    elif isinstance(body, CoreAnnouncement):
        fields = [_bid(body.core), body.epoch, body.seq, body.distance]
    elif isinstance(body, TopicCore):
        fields = [body.filter, _bid(body.core), body.epoch, body.seq, body.distance, body.flags]
        if body.rank:
            fields.append(body.rank)  # optional trailing field: absent means 0
    elif isinstance(body, TopicSubscribe):
        fields = [body.filter, _bid(body.core), body.flags]
    elif isinstance(body, TopicDigest):
        fields = [body.set, body.depth, body.path, list(body.counts), list(body.hashes)]
    elif isinstance(body, TopicRequest):
        fields = [body.set, body.depth, body.path]
    elif isinstance(body, TopicSubscriptions):
        fields = [body.depth, body.path, body.complete, [[e.filter, _bid(e.core), e.flags] for e in body.entries]]
    elif isinstance(body, TopicMessage):
        fields = [body.filter, [body.origin.host, body.origin.port], body.epoch, body.seq, body.mode,
                  body.hops, _prev(body), body.topic, body.payload, body.qos, body.retain, body.properties]
    elif isinstance(body, DatabaseDigest):
        fields = [body.count, list(body.buckets)]
    elif isinstance(body, DatabaseSummary):
        fields = [[_summary_entry(e) for e in body.entries]]
    elif isinstance(body, DatabaseRequest):
        fields = [[[a.host, a.port] for a in body.origins]]
    elif isinstance(body, TopicAck):
        fields = [body.filter, [body.origin.host, body.origin.port], body.epoch, body.seq, _reach(body.reach)]
    elif isinstance(body, ReceiverBusy):
        fields = [body.hold]
    elif isinstance(body, SharedGroups):
        fields = [[body.origin.host, body.origin.port], body.epoch, body.seq, [list(g) for g in body.groups]]
    elif isinstance(body, RetainedDigest):
        fields = [body.count, list(body.buckets)]
    elif isinstance(body, RetainedSummary):
        fields = [[_retained_entry(e.topic, e.version) for e in body.entries]]
    elif isinstance(body, RetainedRequest):
        fields = [list(body.topics)]
    elif isinstance(body, RetainedValues):
        fields = [[_retained_value(v) for v in body.values]]
    else:  # pragma: no cover - a programming error, not a peer's
        raise TypeError(f"cannot encode {body!r}")
    packed: bytes = _pack(_header(kind, sender) + fields)
    return packed


def subscription_entry_size(entry: TopicSubscribe) -> int:
    """Bytes one `tz` entry takes at most (for cutting a bucket's entries to fit datagrams)."""
    core = entry.core
    return 4 + _str_size(entry.filter) + 9 + _str_size(core.address.host) + 3 + 2


def _uint_size(value: int) -> int:
    """Bytes msgpack uses for a non-negative integer."""
    return 1 if value < 128 else 2 if value < 256 else 3 if value < 65536 else 5 if value < 2**32 else 9


def _str_size(text: str) -> int:
    """Bytes msgpack uses for a string."""
    length = len(text) if text.isascii() else len(text.encode())
    return length + (1 if length < 32 else 2 if length < 256 else 3 if length < 65536 else 5)


def record_size(record: LinkStateRecord) -> int:
    """Encoded size of one record inside a `tu` bundle (for splitting bundles), computed, not encoded."""
    origin = record.origin
    neighbours = record.neighbours
    size = (1 + _uint_size(origin.vid) + _str_size(origin.address.host) + _uint_size(origin.address.port)
            + _uint_size(record.epoch) + _uint_size(record.seq) + _uint_size(record.distance)
            + _uint_size(record.flags) + (1 if len(neighbours) < 16 else 3 if len(neighbours) < 65536 else 5))
    for host, port in neighbours:  # [host, port]: the helpers inlined, this runs for every record sent
        length = len(host) if host.isascii() else len(host.encode())
        size += (2 + length + (1 if length < 32 else 2 if length < 256 else 3 if length < 65536 else 5)
                 + (0 if port < 128 else 1 if port < 256 else 2 if port < 65536 else _uint_size(port) - 1))
    return size


def reliable_item_size(message: TopicMessage) -> int:
    """Bytes one publication adds to a `tq` at most: seq (9), prev (nil, a seq, or [epoch, seq]), topic, payload."""
    prev = message.prev
    topic = message.topic
    return (9 + (1 if prev is None else 9 if prev[0] == message.epoch else 19) + len(message.payload) + 5
            + (len(topic) if topic.isascii() else len(topic.encode())) + 3)


def reliable_items(messages: list[TopicMessage]) -> list[Any]:
    """The flat `tq.items` of these publications (one origin and epoch): seq, prev as `tm` writes it, topic,
    payload."""
    items: list[Any] = []
    append = items.append
    for message in messages:
        prev = message.prev
        append(message.seq)
        append(None if prev is None else prev[1] if prev[0] == message.epoch else [prev[0], prev[1]])
        append(message.topic)
        append(message.payload)
    return items


def summary_entry_size(entry: SummaryEntry) -> int:
    """Encoded size of one entry inside a `ds` summary (for splitting summaries)."""
    return len(msgpack.packb(_summary_entry(entry), use_bin_type=True))


def address_size(address: Address) -> int:
    """Encoded size of one address inside a `dr` request (for splitting requests)."""
    return len(msgpack.packb([address.host, address.port], use_bin_type=True))


def retained_entry_size(entry: RetainedEntry) -> int:
    """Encoded size of one entry inside an `rs` summary (for splitting summaries)."""
    return len(msgpack.packb(_retained_entry(entry.topic, entry.version), use_bin_type=True))


def retained_topic_size(topic: str) -> int:
    """Encoded size of one topic inside an `rr` request."""
    return _str_size(topic)


def retained_value_size(copy: RetainedCopy) -> int:
    """Encoded size of one value inside an `rv` packet."""
    return len(msgpack.packb(_retained_value(copy), use_bin_type=True))


# ---------------------------------------------------------------- reading a packet without decoding it

def packet_type(data: bytes) -> str | None:
    """The two-letter type of an encoded packet, cheaply (for counters and the simulator)."""
    # fixarray marker (or array16's three bytes), then a fixstr of length 2: the type.
    if len(data) >= 4 and 0x90 <= data[0] <= 0x9F and data[1] == 0xA2:
        kind = data[2:4].decode("ascii", "replace")
        return kind if kind in MESSAGE_TYPES else None
    if len(data) >= 6 and data[0] == 0xDC and data[3] == 0xA2:  # array16: a mode 2 `tm` has 16 elements
        kind = data[4:6].decode("ascii", "replace")
        return kind if kind in MESSAGE_TYPES else None
    return None


_TM_HEAD = bytes([0x9F, 0xA2]) + TOPIC_MESSAGE.encode("ascii")
"""how every `tm` starts: an array of 15, then its type as a 2-character string"""
_TB_HEAD = bytes([0x99, 0xA2]) + TOPIC_BATCH.encode("ascii")
"""how every `tb` starts: an array of 9, then its type"""


def plain_topic_message_qos(data: bytes) -> int | None:
    """The QoS of an encoded `tm` read from its last three bytes, without decoding it: a `tm` ends with
    its QoS, retain flag and properties, which `encode` writes as 0-2, false/true and nil when it has no
    properties. None for anything else (not a `tm`, properties, another encoding): decode to know. A `tb`
    is QoS 0 by definition: 0. For shedding under overload, where decoding what is about to be dropped
    costs as much as handling it."""
    if data.startswith(_TB_HEAD):
        return 0
    if len(data) > 6 and data[-1] == 0xC0 and data[-3] <= 2 and (data[-2] == 0xC2 or data[-2] == 0xC3) \
            and data.startswith(_TM_HEAD):
        return data[-3]
    return None


def publication_ids_of(data: bytes, max_packet: int = 65507) -> list[PublicationId]:
    """The publication ids an encoded `tm`, `tb` or `tq` packet carries (none for any other packet)."""
    if packet_type(data) not in DATA_TYPES:
        return []
    try:
        body = decode(data, max(max_packet, len(data))).body
    except DecodeError:
        return []
    if isinstance(body, TopicMessage):
        return [body.publication]
    if isinstance(body, TopicReliableBatch):
        return [(body.origin, body.epoch, seq) for seq in body.items[::4]]
    assert isinstance(body, TopicBatch)
    return [(body.origin, body.epoch, seq) for seq in body.items[::3]]
