"""What the node gives each of its parts: an outbox, who the node is, and read-only views.

Theory of operation
-------------------
The node (`federation.protocol.node`) is composed of parts, one concern
each: the federation table (`table`), the database exchange with
neighbours (`database_sync`), the topic meshes (`mesh`, with `cores` and
`forwarding`), reliable forwarding (`reliable`), the publication path
(`publications`) and pacing (`pacing`). No part sees the node. As h11's
state machine is handed events and answers with states, and aioquic's loss
recovery is handed one `send_probe` callback and a few numbers, each part
is given what it needs and no more:

- an `Outbox`: the packets it sends, the events it emits, its counters and
  its drops (`Outbox.drop` is the one way a drop is counted, by the node's
  parts and by the daemon alike), and the version of the node's view;
- read-only views of what it reads: who the node is (`IdentityView`), its
  neighbours and which are up (`NeighboursView`), the federation table and
  its routes (`TableView`);
- where its work means something to another part, it returns an outcome
  (the table's `RouteChange`, whether an ack acknowledged a copy, whether a
  publication was sent), or, where the other part must act at once, in the
  middle of the work, it calls the one function the node handed it for that
  (the mesh's `track`, reliable forwarding's `route_again`).

Only the node composes the parts and tells one what another's change means.
The types two parts share live here or below, so a part never imports
another part's module for a type, and nothing imports the node.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate, repeat
from operator import add
from typing import Any, Protocol, TypeVar

from federation.protocol.linkstate import LinkStateDatabase, Routes
from federation.protocol.neighbours import Neighbour
from federation.protocol.publication_events import PublicationRuns
from federation.protocol.settings import Settings
from federation.protocol.stored_records import StoredRecord
from federation.protocol.types import Address, BrokerId, Event, Injection, InjectionRun, expand_runs
from federation.protocol.wire import (
    TOPIC_ACK,
    TOPIC_ACKS,
    TOPIC_MESSAGE,
    TOPIC_RELIABLE_BATCH,
    TOPOLOGY_UPDATE,
    encode,
    reliable_item_size,
    reliable_items,
)
from federation.protocol.wire_types import (
    Body,
    Sender,
    TopicAck,
    TopicAcks,
    TopicMessage,
    TopicReliableBatch,
    TopologyUpdate,
)

Item = TypeVar("Item")

ENVELOPE_ROOM = 64
"""bytes of a datagram left for the envelope's framing (federation.envelope) when packets are cut to fit one"""


class Identity:
    """Who the node is: its address, virtual id and boot epoch, and how far it has numbered its publications.

    Changed by the node, by the federation table (a new vid after an id collision, a newer epoch when an
    older life of ours announced one: `renumber`, `jump_epoch`) and by the publication path
    (`publication_seq`); every other part reads it through `IdentityView`."""

    __slots__ = ("address", "settings", "name", "vid", "epoch", "broker_id", "publication_seq")

    def __init__(self, address: Address, vid: int, epoch: int, settings: Settings, name: str | None) -> None:
        self.address = address
        self.settings = settings
        self.name = name
        self.vid = vid
        self.epoch = epoch
        self.broker_id = BrokerId(vid, address)
        """read for every packet sent and many received: rebuilt only when the vid changes"""
        self.publication_seq = 0
        """the sequence number of our latest publication in this epoch"""

    def renumber(self, vid: int) -> None:
        self.vid = vid
        self.broker_id = BrokerId(vid, self.address)

    def jump_epoch(self, epoch: int) -> None:
        """A new boot epoch: publication numbers start again."""
        self.epoch = epoch
        self.publication_seq = 0


class IdentityView(Protocol):
    """Who the node is, as the parts read it (`Identity`)."""

    @property
    def address(self) -> Address: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def vid(self) -> int: ...

    @property
    def epoch(self) -> int: ...

    @property
    def broker_id(self) -> BrokerId: ...


class NeighboursView(Protocol):
    """The node's neighbours and their liveness, as the parts read them (`NeighbourTable`)."""

    def get(self, transport: Address) -> Neighbour | None: ...

    def all(self) -> list[Neighbour]: ...

    def up(self) -> list[Neighbour]: ...

    def transport_for(self, announced: Address) -> Address | None: ...

    def is_overdue(self, announced: Address) -> bool: ...

    @property
    def up_index(self) -> Mapping[Address, Address]: ...


class TableView(Protocol):
    """The federation table as the other parts read it (`federation.protocol.table.FederationTable`)."""

    @property
    def lsdb(self) -> LinkStateDatabase: ...

    @property
    def routes(self) -> Routes: ...

    @property
    def changes(self) -> int: ...

    @property
    def origination_due(self) -> float | None: ...


def _stored_size(stored: StoredRecord) -> int:
    return stored.size


def _seq_size(seq: int) -> int:
    """Bytes msgpack uses for one seq of a `tk`."""
    return 1 if seq < 128 else 3 if seq < 65536 else 5 if seq < 2**32 else 9


AckKey = tuple[Address, str, Address, int, frozenset[Address]]
"""(transport of the neighbour acknowledged, filter, origin, epoch, reach): the acknowledgements one `tk` can carry"""
NO_REACH: frozenset[Address] = frozenset()
"""the reach of an acknowledgement that names no subscribing broker (docs/protocol.md rule 7f)"""


class Outbox:
    """What the node's parts send, emit and count, drained by the embedder through the node.

    `packets`, `events` and `injections` are replaced (not emptied) when drained: a part reads them from
    here each time, never keeps them."""

    __slots__ = ("packets", "events", "injections", "counters", "drops", "sent_by_type", "sent_bytes_by_type",
                 "publication_events", "closed", "version", "_identity", "_neighbours", "_address_text",
                 "_sender", "_acks", "runs")

    def __init__(self, identity: IdentityView, neighbours: NeighboursView, publication_events: bool) -> None:
        self._identity = identity
        self._neighbours = neighbours
        self._address_text = str(identity.address)
        """`str(address)`, which every event carries"""
        self._sender: Sender | None = None
        """the header of the packets we send, rebuilt when the id or the epoch changes"""
        self.packets: list[tuple[bytes, Address]] = []
        self._acks: dict[AckKey, list[int]] = {}
        """acknowledgements owed, gathered until the packets are taken (`acknowledge`)"""
        self.events: list[Event] = []
        self.injections: list[Injection | InjectionRun] = []
        """remote publications for the local broker, each once (QoS 0 ones of a `tb` taken whole: a run)"""
        self.counters: Counter[str] = Counter()
        self.drops: Counter[str] = Counter()
        """drops by reason (docs/protocol.md lists them), counted by `drop` only"""
        self.sent_by_type: Counter[str] = Counter()
        self.sent_bytes_by_type: Counter[str] = Counter()
        self.publication_events = publication_events
        """make the events of what happens to each publication at each hop (`events.PER_PUBLICATION`, one per
        run: `runs`); off when the embedder's event log would not keep them"""
        self.runs = PublicationRuns(self._address_text)
        """the publication events of this input, gathered into runs (checked `publication_events` first); they
        become events before any other event is emitted, and when the events are taken"""
        self.closed = False
        """the node has stopped: nothing more is sent"""
        self.version = 0
        """changes whenever the node's view (`Node.view`) may have changed"""

    # ------------------------------------------------------------ packets

    def _header(self) -> Sender:
        """The `sender` of the packets we send now (rebuilt only when our id or epoch changed)."""
        identity = self._identity
        sender = self._sender
        broker_id = identity.broker_id
        if sender is None or sender.broker_id is not broker_id or sender.epoch != identity.epoch:
            sender = self._sender = Sender(broker_id, identity.epoch)
        return sender

    def send(self, kind: str, body: Body, transports: list[Address]) -> None:
        """Encode one packet and queue a copy for each transport address."""
        if not transports or self.closed:
            return
        data = encode(kind, self._header(), body)
        packets = self.packets
        for transport in transports:
            packets.append((data, transport))
        self.sent_by_type[kind] += len(transports)
        self.sent_bytes_by_type[kind] += len(data) * len(transports)

    def acknowledge(self, transport: Address, filter_: str, origin: Address, epoch: int, seq: int,
                    reach: frozenset[Address] = NO_REACH) -> None:
        """Owe `transport` the acknowledgement of a QoS 1/2 (publication, filter) (docs/protocol.md rule 7a), naming
        the subscribing brokers that have it (`reach`, rule 7f). The acknowledgements owed to one neighbour for one
        (filter, origin, epoch) with one reach leave together when the packets are taken: one `ta`, or a `tk` for
        several (rule 7e), so a run of publications costs a packet, not one each."""
        key = (transport, filter_, origin, epoch, reach)
        seqs = self._acks.get(key)
        if seqs is None:
            self._acks[key] = [seq]
        else:
            seqs.append(seq)

    def _send_acks(self) -> None:
        acks, self._acks = self._acks, {}
        sorted_reach: dict[frozenset[Address], tuple[Address, ...]] = {}
        for (transport, filter_, origin, epoch, reach), seqs in acks.items():  # in the order they were first owed
            listed = sorted_reach.get(reach)
            if listed is None:
                listed = sorted_reach[reach] = tuple(sorted(reach))
            if len(seqs) == 1:
                self.send(TOPIC_ACK, TopicAck(filter_, origin, epoch, seqs[0], listed), [transport])
                continue
            empty = TopicAcks(filter_, origin, epoch, [], listed)
            header = len(encode(TOPIC_ACKS, self._header(), empty)) + 2  # + the seqs array's header growing
            for part in self.split(seqs, _seq_size, header):
                self.send(TOPIC_ACKS, TopicAcks(filter_, origin, epoch, part, listed), [transport])

    def send_run(self, messages: list[TopicMessage], transports: list[Address]) -> None:
        """Copies of QoS 1/2 publications that share their origin, epoch, filter, mode, hops and QoS, none retained
        or with properties, in seq order: a `tm` for one, else `tq` runs that each fit a datagram (rule 7e)."""
        if len(messages) == 1:
            self.send(TOPIC_MESSAGE, messages[0], transports)
            return
        first = messages[0]
        empty = TopicReliableBatch(first.filter, first.origin, first.epoch, first.mode, first.hops, first.qos, [])
        header = len(encode(TOPIC_RELIABLE_BATCH, self._header(), empty)) + 4  # + the items array's header growing
        for part in self.split(messages, reliable_item_size, header):
            self.send(TOPIC_RELIABLE_BATCH, TopicReliableBatch(first.filter, first.origin, first.epoch, first.mode,
                                                               first.hops, first.qos, reliable_items(part)),
                      transports)

    def send_up(self, kind: str, body: Body, exclude: Address | None) -> None:
        """Send to every up neighbour except `exclude` (a transport address)."""
        self.send(kind, body, [n.transport for n in self._neighbours.up() if n.transport != exclude])

    def send_records(self, records: list[StoredRecord], transports: list[Address]) -> None:
        """Send records as `tu` bundles that each fit in one datagram."""
        for bundle in self.split(records, _stored_size):
            self.send(TOPOLOGY_UPDATE, TopologyUpdate(tuple(stored.record for stored in bundle)), transports)

    def split(self, items: Sequence[Item], size_of: Callable[[Item], int], header: int = 0) -> list[list[Item]]:
        """Cut `items` into runs whose encoded sizes fit one datagram (with room for the envelope's framing and
        `header` more bytes); an item larger than that alone in its run."""
        budget = self._identity.settings.max_datagram - ENVELOPE_ROOM - header
        runs: list[list[Item]] = []
        run: list[Item] = []
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

    def cut(self, sizes: list[int], header: int = 0, each: int = 0) -> list[tuple[int, int]]:
        """`split` for items whose sizes are known (`sizes`, each `each` bytes more): the (start, stop) index ranges
        of the same runs, found with one running sum and a binary search per run instead of a call per item."""
        budget = self._identity.settings.max_datagram - ENVELOPE_ROOM - header
        totals = list(accumulate(map(add, sizes, repeat(each)) if each else sizes))
        ranges: list[tuple[int, int]] = []
        start, before = 0, 0
        while start < len(totals):
            stop = bisect_right(totals, before + budget, start)
            if stop == start:  # larger than a datagram: alone in its run
                stop = start + 1
            ranges.append((start, stop))
            before, start = totals[stop - 1], stop
        return ranges

    # ------------------------------------------------------------ events, drops, the view

    def emit(self, kind: str, now: float, **fields: Any) -> None:
        if self.runs:
            self.events += self.runs.take()  # what happened before this event, first
        self.events.append(Event(now, self._address_text, kind, fields))

    def drop(self, reason: str, /, count: int = 1, *, event: str | None = None, now: float = 0.0,
             **fields: Any) -> None:
        """Count `count` drops of `reason`; with `event`, also emit that event at `now` with `fields` (in
        their order: a `packet_dropped` repeats the reason among them, a `publication_dropped` gives its own)."""
        self.drops[reason] += count
        if event is not None:
            if self.runs:
                self.events += self.runs.take()
            self.events.append(Event(now, self._address_text, event, fields))

    def view_changed(self) -> None:
        self.version += 1

    # ------------------------------------------------------------ draining (by the node, for the embedder)

    def take_packets(self) -> list[tuple[bytes, Address]]:
        if self._acks:
            self._send_acks()
        out, self.packets = self.packets, []
        return out

    def take_injections(self) -> list[Injection]:
        out, self.injections = self.injections, []
        return expand_runs(out)

    def take_injections_and_runs(self) -> list[Injection | InjectionRun]:
        out, self.injections = self.injections, []
        return out

    def take_events(self) -> list[Event]:
        if self.runs:
            self.events += self.runs.take()
        out, self.events = self.events, []
        return out
