"""Wire format: every datagram is one msgpack array.

    [type, version, sender, body...]

`type` is the two-letter message type, `version` the protocol version
(PROTOCOL_VERSION), `sender` the sending node as [vid, host, port, epoch].
The body fields per type are listed in MESSAGE_FIELDS and in
docs/protocol.md. Decoding is strict: anything that is not exactly one array
of the documented shape raises DecodeError with a short machine-readable
reason (`DecodeError.reason`) that the node counts and records as a
`packet_dropped` event. Encoding trusts its inputs (they come from the node).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from federation.topic_filter import federated_filter, validate_filter, validate_topic
from federation.types import Address, BrokerId, PublicationId

PROTOCOL_VERSION = 1

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

MESSAGE_TYPES = (HELLO, HELLO_BACK, FEDERATE, RECONSIDER, CORE_ANNOUNCEMENT, TOPIC_CORE,
                 RECONSIDER_TOPIC_CORE, TOPIC_SUBSCRIBE, TOPIC_MESSAGE, TOPOLOGY_UPDATE)

# Flag bits.
FLAG_LEAVING = 1      # fd: the origin is shutting down cleanly
FLAG_WITHDRAWN = 1    # tc/rt: the core withdraws (no subscribers left anywhere)
FLAG_PRUNE = 1        # ts: the sender leaves the mesh

MODE_TOWARD_CORE = 0  # tm: still climbing toward the topic core
MODE_IN_MESH = 1      # tm: spreading through the mesh

MAX_U64 = 2**64 - 1
MAX_TEXT = 65535


class DecodeError(ValueError):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Sender:
    broker_id: BrokerId
    epoch: int


@dataclass(frozen=True)
class LinkStateRecord:
    """One node's announcement: who it is, how fresh, and which neighbours it hears."""

    origin: BrokerId
    epoch: int
    seq: int
    distance: int
    flags: int
    neighbours: tuple[Address, ...]

    @property
    def freshness(self) -> tuple[int, int]:
        return (self.epoch, self.seq)


@dataclass(frozen=True)
class Hello:
    seq: int
    sent_at: float


@dataclass(frozen=True)
class HelloBack:
    echo_seq: int
    echo_sent_at: float
    replied_at: float


@dataclass(frozen=True)
class Federate:
    record: LinkStateRecord


@dataclass(frozen=True)
class TopologyUpdate:
    records: tuple[LinkStateRecord, ...]


@dataclass(frozen=True)
class Reconsider:
    target: BrokerId
    holder: BrokerId


@dataclass(frozen=True)
class CoreAnnouncement:
    core: BrokerId
    epoch: int
    seq: int
    distance: int


@dataclass(frozen=True)
class TopicCore:
    """`tc`, and `rt` when sent back to the announcer of an inferior core."""

    filter: str
    core: BrokerId
    epoch: int
    seq: int
    distance: int
    flags: int

    @property
    def freshness(self) -> tuple[int, int]:
        return (self.epoch, self.seq)


@dataclass(frozen=True)
class TopicSubscribe:
    filter: str
    core: BrokerId
    flags: int


@dataclass(frozen=True)
class TopicMessage:
    filter: str
    origin: Address
    epoch: int
    seq: int
    mode: int
    hops: int
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict[str, Any] | None

    @property
    def publication(self) -> PublicationId:
        return (self.origin, self.epoch, self.seq)


Body = Hello | HelloBack | Federate | TopologyUpdate | Reconsider | CoreAnnouncement | TopicCore | TopicSubscribe | TopicMessage


@dataclass(frozen=True)
class Packet:
    type: str
    sender: Sender
    body: Body


# ---------------------------------------------------------------- encoding

def _bid(broker_id: BrokerId) -> list[Any]:
    return [broker_id.vid, broker_id.address.host, broker_id.address.port]


def _record(record: LinkStateRecord) -> list[Any]:
    return [*_bid(record.origin), record.epoch, record.seq, record.distance, record.flags,
            [[a.host, a.port] for a in record.neighbours]]


def _header(kind: str, sender: Sender) -> list[Any]:
    return [kind, PROTOCOL_VERSION, [*_bid(sender.broker_id), sender.epoch]]


def encode(kind: str, sender: Sender, body: Body) -> bytes:
    fields: list[Any]
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
    elif isinstance(body, TopicSubscribe):
        fields = [body.filter, _bid(body.core), body.flags]
    elif isinstance(body, TopicMessage):
        fields = [body.filter, [body.origin.host, body.origin.port], body.epoch, body.seq, body.mode,
                  body.hops, body.topic, body.payload, body.qos, body.retain, body.properties]
    else:  # pragma: no cover - a programming error, not a peer's
        raise TypeError(f"cannot encode {body!r}")
    packed: bytes = msgpack.packb(_header(kind, sender) + fields, use_bin_type=True)
    return packed


def record_size(record: LinkStateRecord) -> int:
    """Encoded size of one record inside a `tu` bundle (for splitting bundles)."""
    return len(msgpack.packb(_record(record), use_bin_type=True))


# ---------------------------------------------------------------- decoding

def _int(value: Any, what: str, low: int = 0, high: int = MAX_U64) -> int:
    if type(value) is not int or not low <= value <= high:
        raise DecodeError("wrong_type", f"{what}: expected an integer in [{low}, {high}]")
    return value


def _float(value: Any, what: str) -> float:
    if type(value) not in (int, float) or math.isnan(value):  # NaN is not a time
        raise DecodeError("wrong_type", f"{what}: expected a number")
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


def _filter(value: Any, what: str) -> str:
    text = _text(value, what)
    problem = validate_filter(text)
    if problem is not None or federated_filter(text) != text:
        raise DecodeError("bad_filter", f"{what}: {problem or 'not a federated filter'}")
    return text


def _topic(value: Any, what: str) -> str:
    text = _text(value, what)
    problem = validate_topic(text)
    if problem is not None:
        raise DecodeError("bad_topic", f"{what}: {problem}")
    return text


def _address(value: Any, what: str) -> Address:
    host, port = _list(value, what, 2)
    return Address(_text(host, f"{what}.host", 255), _int(port, f"{what}.port", 0, 65535))


def _broker_id(value: Any, what: str) -> BrokerId:
    vid, host, port = _list(value, what, 3)
    return BrokerId(_int(vid, f"{what}.vid"),
                    Address(_text(host, f"{what}.host", 255), _int(port, f"{what}.port", 0, 65535)))


def _record_of(value: Any, what: str, max_neighbours: int) -> LinkStateRecord:
    fields = _list(value, what, 8)
    neighbours = _list(fields[7], f"{what}.neighbours")
    if len(neighbours) > max_neighbours:
        raise DecodeError("too_many_neighbours", f"{what}: {len(neighbours)} > {max_neighbours}")
    return LinkStateRecord(
        origin=_broker_id(fields[0:3], f"{what}.origin"),
        epoch=_int(fields[3], f"{what}.epoch"),
        seq=_int(fields[4], f"{what}.seq"),
        distance=_int(fields[5], f"{what}.distance", 0, 65535),
        flags=_int(fields[6], f"{what}.flags", 0, 255),
        neighbours=tuple(_address(n, f"{what}.neighbours[{i}]") for i, n in enumerate(neighbours)),
    )


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


def _decode_body(kind: str, fields: list[Any], max_neighbours: int) -> Body:
    def need(count: int) -> None:
        if len(fields) != count:
            raise DecodeError("wrong_length", f"{kind}: expected {count} body fields, got {len(fields)}")

    if kind == HELLO:
        need(2)
        return Hello(_int(fields[0], "hl.seq"), _float(fields[1], "hl.sent_at"))
    if kind == HELLO_BACK:
        need(3)
        return HelloBack(_int(fields[0], "hb.echo_seq"), _float(fields[1], "hb.echo_sent_at"),
                         _float(fields[2], "hb.replied_at"))
    if kind == FEDERATE:
        need(1)
        return Federate(_record_of(fields[0], "fd.record", max_neighbours))
    if kind == TOPOLOGY_UPDATE:
        need(1)
        items = _list(fields[0], "tu.records")
        return TopologyUpdate(tuple(_record_of(r, f"tu.records[{i}]", max_neighbours) for i, r in enumerate(items)))
    if kind == RECONSIDER:
        need(2)
        return Reconsider(_broker_id(fields[0], "rc.target"), _broker_id(fields[1], "rc.holder"))
    if kind == CORE_ANNOUNCEMENT:
        need(4)
        return CoreAnnouncement(_broker_id(fields[0], "ca.core"), _int(fields[1], "ca.epoch"),
                                _int(fields[2], "ca.seq"), _int(fields[3], "ca.distance", 0, 65535))
    if kind in (TOPIC_CORE, RECONSIDER_TOPIC_CORE):
        need(6)
        return TopicCore(_filter(fields[0], f"{kind}.filter"), _broker_id(fields[1], f"{kind}.core"),
                         _int(fields[2], f"{kind}.epoch"), _int(fields[3], f"{kind}.seq"),
                         _int(fields[4], f"{kind}.distance", 0, 65535), _int(fields[5], f"{kind}.flags", 0, 255))
    if kind == TOPIC_SUBSCRIBE:
        need(3)
        return TopicSubscribe(_filter(fields[0], "ts.filter"), _broker_id(fields[1], "ts.core"),
                              _int(fields[2], "ts.flags", 0, 255))
    if kind == TOPIC_MESSAGE:
        need(11)
        payload = fields[7]
        if type(payload) is not bytes:
            raise DecodeError("wrong_type", "tm.payload: expected bytes")
        retain = fields[9]
        if type(retain) is not bool:
            raise DecodeError("wrong_type", "tm.retain: expected a boolean")
        return TopicMessage(
            filter=_filter(fields[0], "tm.filter"), origin=_address(fields[1], "tm.origin"),
            epoch=_int(fields[2], "tm.epoch"), seq=_int(fields[3], "tm.seq"),
            mode=_int(fields[4], "tm.mode", 0, 1), hops=_int(fields[5], "tm.hops", 0, 255),
            topic=_topic(fields[6], "tm.topic"), payload=payload, qos=_int(fields[8], "tm.qos", 0, 2),
            retain=retain, properties=_properties(fields[10], "tm.properties"),
        )
    raise DecodeError("unknown_type", repr(kind)[:40])


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
    if type(kind) is not str or kind not in MESSAGE_TYPES:
        raise DecodeError("unknown_type", repr(kind)[:40])
    if type(value[1]) is not int or value[1] != PROTOCOL_VERSION:
        raise DecodeError("version", f"protocol version {value[1]!r}, this node speaks {PROTOCOL_VERSION}")
    sender_fields = _list(value[2], "sender", 4)
    sender = Sender(_broker_id(sender_fields[0:3], "sender"), _int(sender_fields[3], "sender.epoch"))
    try:
        body = _decode_body(kind, value[3:], max_neighbours)
    except DecodeError:
        raise
    except Exception as error:  # noqa: BLE001 - a shape we did not foresee is still the peer's fault
        raise DecodeError("malformed", f"{kind}: {type(error).__name__}") from None
    return Packet(kind, sender, body)


def packet_type(data: bytes) -> str | None:
    """The two-letter type of an encoded packet, cheaply (for counters and the simulator)."""
    # fixarray marker, then a fixstr of length 2: bytes 2..3 are the type.
    if len(data) >= 4 and 0x90 <= data[0] <= 0x9F and data[1] == 0xA2:
        kind = data[2:4].decode("ascii", "replace")
        return kind if kind in MESSAGE_TYPES else None
    return None


def publication_id_of(data: bytes) -> PublicationId | None:
    """The publication id of an encoded `tm` packet, or None."""
    if packet_type(data) != TOPIC_MESSAGE:
        return None
    try:
        packet = decode(data)
    except DecodeError:
        return None
    assert isinstance(packet.body, TopicMessage)
    return packet.body.publication


Decoder = Callable[[bytes], Packet]
