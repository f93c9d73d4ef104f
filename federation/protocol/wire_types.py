"""The protocol's packets as values: what `federation.protocol.wire` encodes and decodes (docs/protocol.md lists the
fields of each type). Plain data, no behaviour beyond a few derived properties."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from federation.protocol.types import Address, BrokerId, PublicationId


# Hot value types (Sender, TopicMessage, TopicAck, Packet) are made for every `tm` and `ta`, so they are
# not `frozen`: a frozen dataclass sets each field through `object.__setattr__`, which made building a
# `tm` six times slower (4.8 µs against 0.8 here). They are values all the same: nothing assigns their
# fields after construction, and `unsafe_hash` keeps the hash they had.
@dataclass(slots=True, unsafe_hash=True)
class Sender:
    broker_id: BrokerId
    epoch: int


class LinkStateRecord(NamedTuple):
    """One node's announcement: who it is, how fresh, and which neighbours it hears.
    A named tuple, as Address and BrokerId: records are the bulk of the control traffic and a tuple
    is built several times faster than a frozen dataclass."""

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
class SummaryEntry:
    """One record version in a `ds` summary."""

    origin: Address
    epoch: int
    seq: int

    @property
    def freshness(self) -> tuple[int, int]:
        return (self.epoch, self.seq)


@dataclass(frozen=True)
class DatabaseDigest:
    """`dd`: how many records the sender's digest covers and the XOR of their hashes per bucket."""

    count: int
    buckets: tuple[int, ...]


@dataclass(frozen=True)
class DatabaseSummary:
    """`ds`: the (origin, epoch, seq) of the sender's records in the buckets that differed."""

    entries: tuple[SummaryEntry, ...]


@dataclass(frozen=True)
class DatabaseRequest:
    """`dr`: the origins whose records the sender wants (answered with `tu`)."""

    origins: tuple[Address, ...]


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
    rank: int = 0
    """the claimant's capability, for cores ranked by capability; 0 (left off the wire) otherwise"""

    @property
    def freshness(self) -> tuple[int, int]:
        return (self.epoch, self.seq)


@dataclass(frozen=True)
class TopicSubscribe:
    filter: str
    core: BrokerId
    flags: int


@dataclass(frozen=True)
class TopicDigest:
    """`td`: one bucket of a topic set (`set`: SET_CLAIMS, SET_MEMBERSHIPS or SET_RECORDED) in brief: the entry
    count and hash XOR of the bucket itself (one of each: the periodic round's root), or of its 16 children
    (docs/protocol.md rule 5a)."""

    set: int
    depth: int
    path: int
    counts: tuple[int, ...]
    hashes: tuple[int, ...]


@dataclass(frozen=True)
class TopicRequest:
    """`tr`: "send me your entries of this bucket": claims as `tc`, memberships as `tz` (rule 5a)."""

    set: int
    depth: int
    path: int


@dataclass(frozen=True)
class TopicSubscriptions:
    """`tz`: the sender's memberships toward the receiver in one bucket, each as a `ts` would carry it; `complete`:
    all of them (the receiver forgets the ones it records there and this does not list), else some (rule 5a)."""

    depth: int
    path: int
    complete: bool
    entries: tuple[TopicSubscribe, ...]


@dataclass(slots=True, unsafe_hash=True)  # a hot value type: see Sender
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
    prev: tuple[int, int] | None = None
    """(epoch, seq) of the publication the origin sent before this one on the same reliable stream (its origin,
    this filter, QoS 1/2): what a receiver must have passed before it injects this one (docs/protocol.md rule 7d).
    None: QoS 0, or the first of its stream the origin knows of"""
    target: Address | None = None
    """mode 2 (to a member broker) only: the broker chosen to serve the shared group `filter` names
    (`$share/<group>/<filter>`, docs/protocol.md rule 9); mode 3 (a repair) only: the broker it repairs, which its
    `filter` (`$repair/<host>/<port>/<filter>`, rule 7f) names too; None in modes 0 and 1"""

    @property
    def publication(self) -> PublicationId:
        return (self.origin, self.epoch, self.seq)


@dataclass(frozen=True)
class SharedGroups:
    """`sg`: the shared subscription groups (group, filter) that `origin`'s broker has members of, all of them
    (an empty tuple: none any more), flooded as a link-state record is (docs/protocol.md rule 9)."""

    origin: Address
    epoch: int
    seq: int
    groups: tuple[tuple[str, str], ...]

    @property
    def freshness(self) -> tuple[int, int]:
        return (self.epoch, self.seq)


@dataclass(slots=True, unsafe_hash=True)  # a hot value type: see Sender
class TopicAck:
    """`ta`: the receiver of a QoS 1 or 2 `tm` has it (federation.protocol.reliable: hop-by-hop acknowledgement), and
    so have the subscribing brokers of `reach` (rule 7f: what the origin's custody waits for)."""

    filter: str
    origin: Address
    epoch: int
    seq: int
    reach: tuple[Address, ...] = ()
    """the brokers with a subscription to `filter` that have the publication, the sender and beyond it, sorted"""

    @property
    def publication(self) -> PublicationId:
        return (self.origin, self.epoch, self.seq)


@dataclass(slots=True)  # a hot value type: see Sender (no hash: `items` is a list, as msgpack gives it)
class TopicBatch:
    """`tb`: a run of QoS 0 publications from one origin on one filter, neither retained nor with properties,
    in one packet: what as many `tm` would carry, with the fields they share written once. `items` is flat,
    three entries per publication: seq, topic, payload (docs/protocol.md rule 7c). Nothing mutates it."""

    filter: str
    origin: Address
    epoch: int
    mode: int
    hops: int
    items: list[Any]

    def __len__(self) -> int:
        return len(self.items) // 3

    def messages(self) -> list[TopicMessage]:
        """The same publications as `tm` bodies (for the rare paths that handle one publication at a time)."""
        items = iter(self.items)
        return [TopicMessage(self.filter, self.origin, self.epoch, seq, self.mode, self.hops, topic, payload, 0,
                             False, None) for seq, topic, payload in zip(items, items, items, strict=True)]


@dataclass(slots=True)  # a hot value type: see Sender (no hash: `items` is a list, as msgpack gives it)
class TopicReliableBatch:
    """`tq`: a run of QoS 1 or 2 publications from one origin on one filter, neither retained nor with properties,
    in one packet (docs/protocol.md rule 7e). `items` is flat, four entries per publication: seq, prev (as `tm`
    writes it: nil, a seq of `epoch`, or [epoch, seq]), topic, payload. Each publication is the `tm` it would be
    alone: acknowledged, retransmitted and ordered one by one. Nothing mutates it."""

    filter: str
    origin: Address
    epoch: int
    mode: int
    hops: int
    qos: int
    items: list[Any]

    def __len__(self) -> int:
        return len(self.items) // 4

    def messages(self) -> list[TopicMessage]:
        """The same publications as `tm` bodies."""
        filter_, origin, epoch, mode, hops, qos = self.filter, self.origin, self.epoch, self.mode, self.hops, self.qos
        items = iter(self.items)
        return [TopicMessage(filter_, origin, epoch, seq, mode, hops, topic, payload, qos, False, None,
                             None if prev is None else (epoch, prev) if type(prev) is int else (prev[0], prev[1]))
                for seq, prev, topic, payload in zip(items, items, items, items, strict=True)]


@dataclass(slots=True)  # a hot value type: see Sender
class TopicAcks:
    """`tk`: several `ta` of one (filter, origin, epoch) in one packet: the sender has each (publication, filter)
    named by a seq of `seqs` (federation.protocol.reliable; docs/protocol.md rule 7e)."""

    filter: str
    origin: Address
    epoch: int
    seqs: list[int]
    reach: tuple[Address, ...] = ()
    """as `TopicAck.reach`, the same for every seq"""


@dataclass(frozen=True)
class ReceiverBusy:
    """`rb`: the sender's receive backlog is long; read no publications from your broker for `hold`
    seconds (0: ready again). Pacing for QoS 0, which has no acknowledgement (federation.protocol.pacing)."""

    hold: float


RetainedVersion = tuple[int, int, int, str, int]
"""a retained value's version: (origin time in ms, origin epoch, origin seq, origin host, origin port), the newest
the largest (docs/protocol.md rule 10)"""


@dataclass(frozen=True)
class RetainedDigest:
    """`rd`: how many retained topics the sender's store holds and the XOR of their entry hashes per bucket."""

    count: int
    buckets: tuple[int, ...]


@dataclass(frozen=True)
class RetainedEntry:
    """One topic's version in an `rs` summary."""

    topic: str
    version: RetainedVersion


@dataclass(frozen=True)
class RetainedSummary:
    """`rs`: the versions of the sender's retained topics in the buckets that differed."""

    entries: tuple[RetainedEntry, ...]


@dataclass(frozen=True)
class RetainedRequest:
    """`rr`: the topics whose retained values the sender wants (answered with `rv`)."""

    topics: tuple[str, ...]


@dataclass(frozen=True)
class RetainedCopy:
    """One stored retained value as it travels in `rv`, with its original version (an empty payload: a
    deletion, kept as a tombstone)."""

    topic: str
    version: RetainedVersion
    qos: int
    payload: bytes
    properties: dict[str, Any] | None


@dataclass(frozen=True)
class RetainedValues:
    """`rv`: retained values the receiver asked for or holds older."""

    values: tuple[RetainedCopy, ...]


Body = (Hello | HelloBack | Federate | TopologyUpdate | Reconsider | CoreAnnouncement | TopicCore | TopicSubscribe
        | TopicMessage | DatabaseDigest | DatabaseSummary | DatabaseRequest | TopicAck | ReceiverBusy | TopicBatch
        | SharedGroups | RetainedDigest | RetainedSummary | RetainedRequest | RetainedValues | TopicReliableBatch
        | TopicAcks | TopicDigest | TopicRequest | TopicSubscriptions)


@dataclass(slots=True, unsafe_hash=True)  # a hot value type: see Sender
class Packet:
    type: str
    sender: Sender
    body: Body
