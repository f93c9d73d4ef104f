"""Wire format: every datagram is one msgpack array.

    [type, version, sender, body...]

`type` is the two-letter message type, `version` the protocol version
(PROTOCOL_VERSION), `sender` the sending node as [vid, host, port, epoch].
The body fields per type are listed in docs/protocol.md (and in `encode`);
the packets as values are `federation.protocol.wire_types`, importable from here.
Decoding is strict: anything that is not exactly one array of the
documented shape raises DecodeError with a short machine-readable reason
(`DecodeError.reason`) that the node counts and records as a
`packet_dropped` event. Encoding trusts its inputs (they come from the node).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import msgpack

from federation.protocol.topic_filter import SHARE_PREFIX, federated_filter, validate_filter, validate_topic
from federation.protocol.types import Address, BrokerId, PublicationId
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
    TopicMessage,
    TopicReliableBatch,
    TopicSubscribe,
    TopologyUpdate,
)

PROTOCOL_VERSION = 3
"""3: runs of QoS 1/2 publications (`tq`) and their acknowledgements (`tk`), docs/protocol.md rule 7e; 2: `tm`
carries `prev` (rule 7d). Nodes of different versions refuse each other's packets (`version`), so their link never
comes up: a version 2 node would drop every `tq` and its sender would retransmit it for ever"""

HELLO = "hl"
HELLO_BACK = "hb"
FEDERATE = "fd"
RECONSIDER = "rc"
CORE_ANNOUNCEMENT = "ca"
TOPIC_CORE = "tc"
RECONSIDER_TOPIC_CORE = "rt"
TOPIC_SUBSCRIBE = "ts"
TOPIC_MESSAGE = "tm"
TOPOLOGY_UPDATE = "tu"
DATABASE_DIGEST = "dd"
DATABASE_SUMMARY = "ds"
DATABASE_REQUEST = "dr"
TOPIC_ACK = "ta"
RECEIVER_BUSY = "rb"
TOPIC_BATCH = "tb"
SHARED_GROUPS = "sg"
RETAINED_DIGEST = "rd"
RETAINED_SUMMARY = "rs"
RETAINED_REQUEST = "rr"
RETAINED_VALUES = "rv"
TOPIC_RELIABLE_BATCH = "tq"
TOPIC_ACKS = "tk"

MESSAGE_TYPES = (HELLO, HELLO_BACK, FEDERATE, RECONSIDER, CORE_ANNOUNCEMENT, TOPIC_CORE,
                 RECONSIDER_TOPIC_CORE, TOPIC_SUBSCRIBE, TOPIC_MESSAGE, TOPOLOGY_UPDATE,
                 DATABASE_DIGEST, DATABASE_SUMMARY, DATABASE_REQUEST, TOPIC_ACK, RECEIVER_BUSY, TOPIC_BATCH,
                 SHARED_GROUPS, RETAINED_DIGEST, RETAINED_SUMMARY, RETAINED_REQUEST, RETAINED_VALUES,
                 TOPIC_RELIABLE_BATCH, TOPIC_ACKS)
DATA_TYPES = frozenset((TOPIC_MESSAGE, TOPIC_BATCH, TOPIC_RELIABLE_BATCH))
"""the packets that carry publications (data traffic); every other type is control traffic"""

# One packer for every `encode`: `msgpack.packb` builds a new Packer per call, a third of its cost.
# Safe to share: packing plain values runs in C without releasing the GIL or calling back into Python.
_pack = msgpack.Packer(use_bin_type=True).pack

DIGEST_BUCKETS = 16   # dd, rd: bucket hashes per digest

# Flag bits.
FLAG_LEAVING = 1      # fd: the origin is shutting down cleanly
FLAG_WITHDRAWN = 1    # tc/rt: the core withdraws (no subscribers left anywhere)
FLAG_OWNER = 2        # tc: not a claim: `core` announces that it owns the subtree `filter` (docs/modes.md)
FLAG_PRUNE = 1        # ts: the sender leaves the mesh
FLAG_STANDBY = 2      # ts: a standby parent: keep the sender as a child, send it no publications (rule 6)

MODE_TOWARD_CORE = 0  # tm: still climbing toward the topic core
MODE_IN_MESH = 1      # tm: spreading through the mesh
MODE_TO_MEMBER = 2    # tm: on its way to the member broker `target` of the shared group `filter` (rule 9)

# The ranges of the numbers a packet carries (docs/protocol.md, "Ranges"). A number outside its range is refused
# at decode (`out_of_range`), before it touches any state: a node must never adopt a number it cannot go past,
# such as an epoch of 2^64-1 naming itself, which it would jump past into what msgpack cannot encode.
MAX_U64 = 2**64 - 1   # ids (vid), `tc.rank`, digest buckets (hashes)
MAX_EPOCH = 2**40 - 1
"""node epochs (sender, records, `ca`, `tc`, publication ids, `tm.prev`): 0 to this, about 1.1 × 10^12 (unix seconds
reach it in the year 36,812); below 2^64 / 10^6, so the envelope epoch made of it never saturates"""
EPOCHS_FOR_RESTARTS = 2**20
"""the top of the epoch range only restarts reach: a node jumps past a newer life of itself only up to
MAX_EPOCH - EPOCHS_FOR_RESTARTS (`MAX_JUMP_EPOCH`), so its own restarts always find a next epoch"""
MAX_JUMP_EPOCH = MAX_EPOCH - EPOCHS_FOR_RESTARTS
MAX_SEQ = 2**63 - 1
"""sequence numbers (records, hellos, publications, `ca`, `tc`, summaries): 0 to this; a node's own counters
stay below it (it jumps to its next epoch rather than take a seq it cannot count past)"""
MAX_TIME = 2.0**40
"""times (`hl.sent_at`, `hb.echo_sent_at`, `hb.replied_at`): finite seconds, 0 to this"""
MAX_COUNT = 2**32 - 1  # dd.count, rd.count: records in a table, topics in a retained store
MAX_DISTANCE = 65535
"""hop distances (records, `ca`, `tc`): 0 to this; a node adding its hop saturates there (`further`)"""
MAX_HOLD = 3600.0     # rb: a longer hold is no pacing but an error (a receiver cuts it further)
MAX_TEXT = 65535


class DecodeError(ValueError):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


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
             body.filter, [origin.host, origin.port], body.epoch, body.seqs])
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
        fields = [body.filter, [body.origin.host, body.origin.port], body.epoch, body.seq]
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


# ---------------------------------------------------------------- decoding

def further(distance: int) -> int:
    """A distance one hop further, within its range (a record that travelled 65,535 hops stays there)."""
    return distance + 1 if distance < MAX_DISTANCE else MAX_DISTANCE


def _int(value: Any, what: str, low: int = 0, high: int = MAX_U64) -> int:
    if type(value) is not int:
        raise DecodeError("wrong_type", f"{what}: expected an integer in [{low}, {high}]")
    if not low <= value <= high:
        raise DecodeError("out_of_range", f"{what}: {value} is not in [{low}, {high}]")
    return value


def _epoch(value: Any, what: str) -> int:
    return _int(value, what, 0, MAX_EPOCH)


def _seq(value: Any, what: str) -> int:
    return _int(value, what, 0, MAX_SEQ)


def _float(value: Any, what: str, high: float) -> float:
    """A number in [0, high]: finite (no NaN, no infinity)."""
    if type(value) not in (int, float) or math.isnan(value):  # NaN is not a time
        raise DecodeError("wrong_type", f"{what}: expected a number")
    if not 0 <= value <= high:
        raise DecodeError("out_of_range", f"{what}: {value} is not in [0, {high:g}]")
    return float(value)


def _text(value: Any, what: str, limit: int = MAX_TEXT) -> str:
    if type(value) is not str or len(value) > limit:
        raise DecodeError("wrong_type", f"{what}: expected a string of at most {limit} characters")
    return value


def _list(value: Any, what: str, length: int | None = None) -> list[Any]:
    if type(value) is not list or (length is not None and len(value) != length):
        expected = f"an array of {length}" if length is not None else "an array"
        raise DecodeError("wrong_type", f"{what}: expected {expected}")
    return value


_VALID_CACHE_SIZE = 4096
_valid_filters: dict[str, None] = {}
"""filters that passed `_filter` lately: every `tm` and `ta` carries one, and they repeat (a pure memo)"""
_valid_topics: dict[str, None] = {}
"""topics that passed `_topic` lately"""
_valid_shared: dict[str, None] = {}
"""shared filters (`$share/<group>/<filter>`) that passed `_shared_filter` lately"""


def _remember(cache: dict[str, None], text: str) -> None:
    if len(cache) >= _VALID_CACHE_SIZE:
        cache.clear()
    cache[text] = None


def _filter(value: Any, what: str) -> str:
    if type(value) is str and value in _valid_filters:
        return value
    text = _text(value, what)
    problem = validate_filter(text)
    if problem is not None or federated_filter(text) != text:
        raise DecodeError("bad_filter", f"{what}: {problem or 'not a federated filter'}")
    _remember(_valid_filters, text)
    return text


def _shared_filter(value: Any, what: str) -> str:
    """`$share/<group>/<filter>` whose filter is a federated one: what a mode 2 `tm` and its `ta` carry."""
    if type(value) is str and value in _valid_shared:
        return value
    text = _text(value, what)
    if validate_filter(text) is not None or not text.startswith(SHARE_PREFIX) \
            or federated_filter(text) is None:
        raise DecodeError("bad_filter", f"{what}: not a shared subscription of a federated filter")
    _remember(_valid_shared, text)
    return text


def _filter_or_shared(value: Any, what: str) -> str:
    if type(value) is str and value.startswith(SHARE_PREFIX):
        return _shared_filter(value, what)
    return _filter(value, what)


def _topic(value: Any, what: str) -> str:
    if type(value) is str and value in _valid_topics:
        return value
    text = _text(value, what)
    problem = validate_topic(text)
    if problem is not None:
        raise DecodeError("bad_topic", f"{what}: {problem}")
    _remember(_valid_topics, text)
    return text


def _address(value: Any, what: str) -> Address:
    host, port = _list(value, what, 2)
    return Address(_text(host, f"{what}.host", 255), _int(port, f"{what}.port", 0, 65535))


def _broker_id(value: Any, what: str) -> BrokerId:
    vid, host, port = _list(value, what, 3)
    return BrokerId(_int(vid, f"{what}.vid"),
                    Address(_text(host, f"{what}.host", 255), _int(port, f"{what}.port", 0, 65535)))


_tuple_new = tuple.__new__


def _port_ok(value: Any) -> bool:
    return type(value) is int and 0 <= value <= 65535


def _host_ok(value: Any) -> bool:
    return type(value) is str and len(value) <= 255


def _u64_ok(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_U64


def _epoch_ok(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_EPOCH


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
    fields = _list(value, what, 8)
    neighbours = _list(fields[7], f"{what}.neighbours")
    if len(neighbours) > max_neighbours:
        raise DecodeError("too_many_neighbours", f"{what}: {len(neighbours)} > {max_neighbours}")
    return LinkStateRecord(
        origin=_broker_id(fields[0:3], f"{what}.origin"),
        epoch=_epoch(fields[3], f"{what}.epoch"),
        seq=_seq(fields[4], f"{what}.seq"),
        distance=_int(fields[5], f"{what}.distance", 0, MAX_DISTANCE),
        flags=_int(fields[6], f"{what}.flags", 0, 255),
        neighbours=tuple(_address(n, f"{what}.neighbours[{i}]") for i, n in enumerate(neighbours)),
    )


def record_of(value: Any, max_neighbours: int) -> LinkStateRecord:
    """One record as msgpack gave it (a list), checked as a packet's record is; DecodeError if not valid (the
    simulator's decode cache decodes each distinct record's bytes once with it)."""
    return _record_of(value, "record", max_neighbours)


def _summary_entry_of(value: Any, what: str) -> SummaryEntry:
    host, port, epoch, seq = _list(value, what, 4)
    return SummaryEntry(Address(_text(host, f"{what}.host", 255), _int(port, f"{what}.port", 0, 65535)),
                        _epoch(epoch, f"{what}.epoch"), _seq(seq, f"{what}.seq"))


def _retained_version(fields: list[Any], what: str) -> RetainedVersion:
    origin_ms, epoch, seq, host, port = fields
    return (_int(origin_ms, f"{what}.origin_ms", 0, MAX_SEQ), _epoch(epoch, f"{what}.epoch"),
            _seq(seq, f"{what}.seq"), _text(host, f"{what}.host", 255), _int(port, f"{what}.port", 0, 65535))


def _retained_entry_of(value: Any, what: str) -> RetainedEntry:
    fields = _list(value, what, 6)
    return RetainedEntry(_topic(fields[0], f"{what}.topic"), _retained_version(fields[1:6], what))


def _retained_value_of(value: Any, what: str) -> RetainedCopy:
    fields = _list(value, what, 9)
    payload = fields[7]
    if type(payload) is not bytes:
        raise DecodeError("wrong_type", f"{what}.payload: expected bytes")
    return RetainedCopy(_topic(fields[0], f"{what}.topic"), _retained_version(fields[1:6], what),
                        _int(fields[6], f"{what}.qos", 0, 2), payload, _properties(fields[8], f"{what}.properties"))


_PROPERTY_SCALARS = (str, int, bytes)


def _properties(value: Any, what: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if type(value) is not dict or len(value) > 32:
        raise DecodeError("wrong_type", f"{what}: expected a map of at most 32 properties or nil")
    for key, item in value.items():
        _text(key, f"{what} key", 64)
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
        prev = (epoch, _seq(value, what))
    else:
        prev_epoch, prev_seq = _list(value, what, 2)
        prev = (_epoch(prev_epoch, f"{what}.epoch"), _seq(prev_seq, f"{what}.seq"))
    if prev >= (epoch, seq):
        raise DecodeError("wrong_type", f"{what}: must name a publication before this one")
    return prev


def _decode_body(kind: str, fields: list[Any], max_neighbours: int) -> Body:
    def need(count: int) -> None:
        if len(fields) != count:
            raise DecodeError("wrong_length", f"{kind}: expected {count} body fields, got {len(fields)}")

    if kind == HELLO:
        need(2)
        return Hello(_seq(fields[0], "hl.seq"), _float(fields[1], "hl.sent_at", MAX_TIME))
    if kind == HELLO_BACK:
        need(3)
        return HelloBack(_seq(fields[0], "hb.echo_seq"), _float(fields[1], "hb.echo_sent_at", MAX_TIME),
                         _float(fields[2], "hb.replied_at", MAX_TIME))
    if kind == FEDERATE:
        need(1)
        return Federate(_record_of(fields[0], "fd.record", max_neighbours))
    if kind == TOPOLOGY_UPDATE:
        need(1)
        items = _list(fields[0], "tu.records")
        records = []
        for index, item in enumerate(items):
            record = _fast_record(item, max_neighbours)
            records.append(record if record is not None else _record_of(item, f"tu.records[{index}]", max_neighbours))
        return TopologyUpdate(tuple(records))
    if kind == RECONSIDER:
        need(2)
        return Reconsider(_broker_id(fields[0], "rc.target"), _broker_id(fields[1], "rc.holder"))
    if kind == CORE_ANNOUNCEMENT:
        need(4)
        return CoreAnnouncement(_broker_id(fields[0], "ca.core"), _epoch(fields[1], "ca.epoch"),
                                _seq(fields[2], "ca.seq"), _int(fields[3], "ca.distance", 0, MAX_DISTANCE))
    if kind in (TOPIC_CORE, RECONSIDER_TOPIC_CORE):
        if len(fields) != 7:
            need(6)  # `rank` is an optional seventh field
        return TopicCore(_filter(fields[0], f"{kind}.filter"), _broker_id(fields[1], f"{kind}.core"),
                         _epoch(fields[2], f"{kind}.epoch"), _seq(fields[3], f"{kind}.seq"),
                         _int(fields[4], f"{kind}.distance", 0, MAX_DISTANCE), _int(fields[5], f"{kind}.flags", 0, 255),
                         _int(fields[6], f"{kind}.rank") if len(fields) == 7 else 0)
    if kind == TOPIC_SUBSCRIBE:
        need(3)
        return TopicSubscribe(_filter(fields[0], "ts.filter"), _broker_id(fields[1], "ts.core"),
                              _int(fields[2], "ts.flags", 0, 255))
    if kind == TOPIC_MESSAGE:
        if len(fields) != 13 or type(fields[4]) is not int or fields[4] != MODE_TO_MEMBER:
            need(12)  # a mode 2 `tm` has a thirteenth field, its target
        payload = fields[8]
        if type(payload) is not bytes:
            raise DecodeError("wrong_type", "tm.payload: expected bytes")
        retain = fields[10]
        if type(retain) is not bool:
            raise DecodeError("wrong_type", "tm.retain: expected a boolean")
        epoch, seq = _epoch(fields[2], "tm.epoch"), _seq(fields[3], "tm.seq")
        mode = _int(fields[4], "tm.mode", 0, MODE_TO_MEMBER)
        if mode == MODE_TO_MEMBER and len(fields) != 13:
            raise DecodeError("wrong_length", f"tm: expected 13 body fields with mode 2, got {len(fields)}")
        to_member = mode == MODE_TO_MEMBER
        return TopicMessage(
            filter=_shared_filter(fields[0], "tm.filter") if to_member else _filter(fields[0], "tm.filter"),
            origin=_address(fields[1], "tm.origin"),
            epoch=epoch, seq=seq, mode=mode, hops=_int(fields[5], "tm.hops", 0, 255),
            topic=_topic(fields[7], "tm.topic"), payload=payload, qos=_int(fields[9], "tm.qos", 0, 2),
            retain=retain, properties=_properties(fields[11], "tm.properties"), prev=_prev_of(fields[6], epoch, seq),
            target=_address(fields[12], "tm.target") if to_member else None,
        )
    if kind in (DATABASE_DIGEST, RETAINED_DIGEST):
        need(2)
        buckets = _list(fields[1], f"{kind}.buckets", DIGEST_BUCKETS)
        if not all(_u64_ok(b) for b in buckets):
            for i, b in enumerate(buckets):
                _int(b, f"{kind}.buckets[{i}]")
        count = _int(fields[0], f"{kind}.count", 0, MAX_COUNT)
        return DatabaseDigest(count, tuple(buckets)) if kind == DATABASE_DIGEST else RetainedDigest(count,
                                                                                                   tuple(buckets))
    if kind == RETAINED_SUMMARY:
        need(1)
        items = _list(fields[0], "rs.entries")
        return RetainedSummary(tuple(_retained_entry_of(e, f"rs.entries[{i}]") for i, e in enumerate(items)))
    if kind == RETAINED_REQUEST:
        need(1)
        items = _list(fields[0], "rr.topics")
        return RetainedRequest(tuple(_topic(t, f"rr.topics[{i}]") for i, t in enumerate(items)))
    if kind == RETAINED_VALUES:
        need(1)
        items = _list(fields[0], "rv.values")
        return RetainedValues(tuple(_retained_value_of(v, f"rv.values[{i}]") for i, v in enumerate(items)))
    if kind == DATABASE_SUMMARY:
        need(1)
        items = _list(fields[0], "ds.entries")
        return DatabaseSummary(tuple(_summary_entry_of(e, f"ds.entries[{i}]") for i, e in enumerate(items)))
    if kind == DATABASE_REQUEST:
        need(1)
        items = _list(fields[0], "dr.origins")
        return DatabaseRequest(tuple(_address(a, f"dr.origins[{i}]") for i, a in enumerate(items)))
    if kind == TOPIC_ACK:
        need(4)
        return TopicAck(_filter_or_shared(fields[0], "ta.filter"), _address(fields[1], "ta.origin"),
                        _epoch(fields[2], "ta.epoch"), _seq(fields[3], "ta.seq"))
    if kind == TOPIC_BATCH:
        need(6)
        items = _list(fields[5], "tb.items")
        if not items or len(items) % 3:
            raise DecodeError("wrong_length", "tb.items: expected seq, topic, payload for each of 1 or more")
        for index in range(0, len(items), 3):
            what = f"tb.items[{index // 3}]"
            _seq(items[index], f"{what}.seq")
            _topic(items[index + 1], f"{what}.topic")
            if type(items[index + 2]) is not bytes:
                raise DecodeError("wrong_type", f"{what}.payload: expected bytes")
        return TopicBatch(_filter(fields[0], "tb.filter"), _address(fields[1], "tb.origin"),
                          _epoch(fields[2], "tb.epoch"), _int(fields[3], "tb.mode", 0, 1),
                          _int(fields[4], "tb.hops", 0, 255), items)
    if kind == TOPIC_RELIABLE_BATCH:
        need(7)
        items = _list(fields[6], "tq.items")
        if not items or len(items) % 4:
            raise DecodeError("wrong_length", "tq.items: expected seq, prev, topic, payload for each of 1 or more")
        epoch = _epoch(fields[2], "tq.epoch")
        for index in range(0, len(items), 4):
            what = f"tq.items[{index // 4}]"
            seq = _seq(items[index], f"{what}.seq")
            _prev_of(items[index + 1], epoch, seq, f"{what}.prev")
            _topic(items[index + 2], f"{what}.topic")
            if type(items[index + 3]) is not bytes:
                raise DecodeError("wrong_type", f"{what}.payload: expected bytes")
        return TopicReliableBatch(_filter(fields[0], "tq.filter"), _address(fields[1], "tq.origin"), epoch,
                                  _int(fields[3], "tq.mode", 0, 1), _int(fields[4], "tq.hops", 0, 255),
                                  _int(fields[5], "tq.qos", 1, 2), items)
    if kind == TOPIC_ACKS:
        need(4)
        seqs = _list(fields[3], "tk.seqs")
        if not seqs:
            raise DecodeError("wrong_length", "tk.seqs: expected 1 or more")
        for index, seq in enumerate(seqs):
            _seq(seq, f"tk.seqs[{index}]")
        return TopicAcks(_filter_or_shared(fields[0], "tk.filter"), _address(fields[1], "tk.origin"),
                         _epoch(fields[2], "tk.epoch"), seqs)
    if kind == RECEIVER_BUSY:
        need(1)
        return ReceiverBusy(_float(fields[0], "rb.hold", MAX_HOLD))
    if kind == SHARED_GROUPS:
        need(4)
        groups = []
        for index, item in enumerate(_list(fields[3], "sg.groups")):
            group, filter_ = _list(item, f"sg.groups[{index}]", 2)
            if type(group) is not str or "/" in group:
                raise DecodeError("bad_filter", f"sg.groups[{index}]: a group name is a string without '/'")
            _shared_filter(f"{SHARE_PREFIX}{_text(group, 'sg.group')}/{_text(filter_, 'sg.filter')}",
                           f"sg.groups[{index}]")
            groups.append((group, filter_))
        return SharedGroups(_address(fields[0], "sg.origin"), _epoch(fields[1], "sg.epoch"), _seq(fields[2], "sg.seq"),
                            tuple(groups))
    raise DecodeError("unknown_type", repr(kind)[:40])


def _fast_topic_message(value: list[Any]) -> Packet | None:
    """The packet if `value` is a valid `tm` whose filter and topic were validated lately and that has no
    properties, else None (then the general path decodes it and names any fault). A `tm` is the packet
    every publication costs; this accepts a subset of what that path accepts and builds the same packet,
    without a field name per check (tests/protocol/test_hotpath_node.py compares the two)."""
    (_kind, version, sender, filter_, origin, epoch, seq, mode, hops, prev, topic, payload, qos, retain,
     properties) = value
    if not (properties is None and type(version) is int and version == PROTOCOL_VERSION
            and type(sender) is list and len(sender) == 4
            and type(filter_) is str and filter_ in _valid_filters and type(topic) is str and topic in _valid_topics
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
    else None. `_u64_ok`, `_host_ok` and `_port_ok`, written out: eight calls fewer per packet."""
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
            and type(filter_) is str and filter_ in _valid_filters and type(origin) is list and len(origin) == 2
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
            and set(map(type, topics)) == _STR and _valid_topics.keys() >= set(topics)
            and set(map(type, items[2::3])) == _BYTES):
        return None
    return Packet(TOPIC_BATCH, checked[0], TopicBatch(filter_, checked[1], epoch, mode, hops, items))


def _fast_reliable_batch(value: list[Any]) -> Packet | None:
    """The packet if `value` is a valid `tq` whose filter and every topic were validated lately and whose items
    name `prev` as nil or a seq of the run's epoch, else None (the general path decodes it and names any fault)."""
    _kind, version, sender, filter_, origin, epoch, mode, hops, qos, items = value
    if not (type(version) is int and version == PROTOCOL_VERSION and type(sender) is list and len(sender) == 4
            and type(filter_) is str and filter_ in _valid_filters and type(origin) is list and len(origin) == 2
            and type(epoch) is int and 0 <= epoch <= MAX_EPOCH and type(mode) is int and 0 <= mode <= 1
            and type(hops) is int and 0 <= hops <= 255 and type(qos) is int and 1 <= qos <= 2
            and type(items) is list and items and not len(items) % 4):
        return None
    checked = _fast_sender_and_origin(sender, origin)
    if checked is None:
        return None
    topics = _valid_topics
    fields = iter(items)
    for seq, prev, topic, payload in zip(fields, fields, fields, fields, strict=True):
        if not (type(seq) is int and 0 <= seq <= MAX_SEQ and (prev is None or (type(prev) is int and 0 <= prev < seq))
                and type(topic) is str and topic in topics and type(payload) is bytes):
            return None
    return Packet(TOPIC_RELIABLE_BATCH, checked[0],
                  TopicReliableBatch(filter_, checked[1], epoch, mode, hops, qos, items))


def _fast_topic_acks(value: list[Any]) -> Packet | None:
    """The packet if `value` is a valid `tk` whose filter was validated lately, else None."""
    _kind, version, sender, filter_, origin, epoch, seqs = value
    if not (type(version) is int and version == PROTOCOL_VERSION and type(sender) is list and len(sender) == 4
            and type(filter_) is str and filter_ in _valid_filters and type(origin) is list and len(origin) == 2
            and type(epoch) is int and 0 <= epoch <= MAX_EPOCH and type(seqs) is list and seqs):
        return None
    for seq in seqs:
        if not (type(seq) is int and 0 <= seq <= MAX_SEQ):
            return None
    checked = _fast_sender_and_origin(sender, origin)
    if checked is None:
        return None
    return Packet(TOPIC_ACKS, checked[0], TopicAcks(filter_, checked[1], epoch, seqs))


_FAST_PATHS: dict[str, tuple[int, Callable[[list[Any]], Packet | None]]] = {
    TOPIC_MESSAGE: (15, _fast_topic_message),
    TOPIC_BATCH: (9, _fast_topic_batch),
    TOPIC_RELIABLE_BATCH: (10, _fast_reliable_batch),
    TOPIC_ACKS: (7, _fast_topic_acks),
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
    if (type(sender_fields) is list and len(sender_fields) == 4 and _u64_ok(sender_fields[0])
            and _host_ok(sender_fields[1]) and _port_ok(sender_fields[2]) and _epoch_ok(sender_fields[3])):
        sender = Sender(BrokerId(sender_fields[0], Address(sender_fields[1], sender_fields[2])), sender_fields[3])
    else:  # the slow path names the fault
        sender_fields = _list(sender_fields, "sender", 4)
        sender = Sender(_broker_id(sender_fields[0:3], "sender"), _epoch(sender_fields[3], "sender.epoch"))
    try:
        body = _decode_body(kind, value[3:], max_neighbours)
    except DecodeError:
        raise
    except Exception as error:  # noqa: BLE001 - a shape we did not foresee is still the peer's fault
        raise DecodeError("malformed", f"{kind}: {type(error).__name__}") from None
    return Packet(kind, sender, body)


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


Decoder = Callable[[bytes], Packet]
DecodeFunction = Callable[[bytes, int, int], Packet]
"""`decode`'s shape (data, max_packet, max_neighbours): a node may be given another, e.g. the simulator's cache"""
