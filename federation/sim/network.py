"""A deterministic virtual network that drives sans-I/O protocol nodes.

Theory of operation
-------------------
Everything that happens is an entry in one priority queue keyed by
(virtual time, insertion counter): a datagram arriving at a host, a host's
timer, or an action of the driver (a scenario event). The counter makes ties
deterministic: entries for the same instant run in the order they were
queued. Time jumps from entry to entry; nothing sleeps.

One `random.Random(seed)` owns all chaos: loss, duplication and jitter draws
come from it in queue order, and each node incarnation gets its own RNG
derived from the seed, its name and its epoch. The same seed therefore
replays the same run, datagram for datagram.

Links are the scenario's pairs. Each direction has its own state (cut, loss
override), so one-way partitions are possible. A datagram to an address that
is not a link neighbour of the sender is dropped (`no_route`); a datagram to
a dead host is dropped on arrival (`dead`). Killing a host discards its node
object (a crash: no shutdown, in-flight datagrams it sent still arrive);
starting it again builds a new node with the next epoch.

Each host's broker is modelled as taking every injection at once: the
network reports each QoS 1/2 injection done (`injection_done`) before it
sends what the node produced, as a wrapper whose broker acknowledged it.

After every input to a node the network drains its outputs (datagrams,
injections, events), re-reads `get_timer()` and queues the timer if it moved.
A stale timer entry is recognised by a per-host generation counter and
skipped. The driver observes outputs through an `Observer`.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from federation.protocol.settings import Settings
from federation.protocol.types import Address, Event, Injection, PublicationId
from federation.protocol.wire import DATA_TYPES, packet_type, publication_ids_of

DEFAULT_PORT = 10500
UNKNOWN_TYPE = "??"
"""Counter key for datagrams whose type `packet_type` cannot read."""

TIMER_STORM_LIMIT = 100
"""Timer firings of one host at one instant before the network calls it a storm."""
TIMER_STORM_BACKOFF = 0.01
"""Seconds a storming timer is pushed into the future (each time, once the host has stormed)."""


class NetworkOverload(RuntimeError):
    """More datagrams in flight than any sane protocol sends: a packet storm; the run cannot go on."""


def default_max_in_flight(hosts: int) -> int:
    """The in-flight bound: generous for floods of a healthy protocol, small enough to stop a storm early."""
    return 50_000 + 1_000 * hosts


class SimNode(Protocol):
    """The part of the node API the network drives."""

    def start(self, now: float) -> None: ...

    def receive_packet(self, data: bytes, source: Address, now: float) -> None: ...

    def handle_timer(self, now: float) -> None: ...

    def get_timer(self) -> float | None: ...

    def packets_to_send(self) -> list[tuple[bytes, Address]]: ...

    def injections_to_make(self) -> list[Injection]: ...

    def injection_done(self, publication: PublicationId, now: float) -> None: ...

    def custody_released(self) -> list[PublicationId]: ...

    def events_emitted(self) -> list[Event]: ...


NodeT = TypeVar("NodeT", bound=SimNode)


@dataclass(frozen=True)
class NodeSetup:
    """Everything a node factory needs to build one incarnation of a host."""

    name: str
    address: Address
    neighbours: tuple[Address, ...]
    epoch: int
    rng: random.Random
    settings: Settings
    vid: int | None


def node_address(index: int) -> Address:
    """The stable, unique address of the host with this index (10.0.0.1 for index 0)."""
    number = index + 1
    return Address(f"10.{number // 65536}.{(number // 256) % 256}.{number % 256}", DEFAULT_PORT)


def node_rng(seed: int, name: str, epoch: int) -> random.Random:
    """The RNG of one node incarnation; string seeds hash with SHA-512, so this is stable across runs."""
    return random.Random(f"{seed}:{name}:{epoch}")


@dataclass
class Host(Generic[NodeT]):
    """A place in the network: a name, an address, and the node living there (None while dead)."""

    index: int
    name: str
    address: Address
    settings: Settings
    vid: int | None
    neighbours: frozenset[int]
    node: NodeT | None = None
    epoch: int = 0
    timer_generation: int = 0
    timer_at: float | None = None
    storm_at: float = -1.0
    storm_count: int = 0
    stormed: bool = False
    """this incarnation's timer stormed once (reported); later storms back off at once"""
    started_at: float | None = None
    alive_seconds: float = 0.0

    @property
    def alive(self) -> bool:
        return self.node is not None


@dataclass
class Direction:
    """The state of one direction of a link."""

    cut: bool = False
    loss: float | None = None
    """percent; None: the network-wide loss applies"""


@dataclass
class Link:
    low: int
    high: int
    up: Direction = field(default_factory=Direction)
    """low -> high"""
    down: Direction = field(default_factory=Direction)
    """high -> low"""

    def direction(self, source: int) -> Direction:
        return self.up if source == self.low else self.down

    @property
    def connected(self) -> bool:
        """Both directions uncut (loss does not cut)."""
        return not self.up.cut and not self.down.cut


@dataclass
class Traffic:
    """Counters of every datagram the nodes sent and what became of it."""

    packets_by_type: Counter[str] = field(default_factory=Counter)
    bytes_by_type: Counter[str] = field(default_factory=Counter)
    control_packets_by_host: Counter[int] = field(default_factory=Counter)
    control_bytes_by_host: Counter[int] = field(default_factory=Counter)
    data_packets_by_host: Counter[int] = field(default_factory=Counter)
    data_bytes_by_host: Counter[int] = field(default_factory=Counter)
    copies: Counter[PublicationId] = field(default_factory=Counter)
    """copies sent per publication (in `tm` or `tb` packets)"""
    drops: Counter[str] = field(default_factory=Counter)
    """no_route, cut, loss, dead"""
    duplicated: int = 0
    delivered: int = 0

    def control_totals(self) -> tuple[int, int]:
        packets = sum(count for kind, count in self.packets_by_type.items() if kind not in DATA_TYPES)
        size = sum(count for kind, count in self.bytes_by_type.items() if kind not in DATA_TYPES)
        return packets, size

    def data_totals(self) -> tuple[int, int]:
        return (sum(self.packets_by_type[kind] for kind in DATA_TYPES),
                sum(self.bytes_by_type[kind] for kind in DATA_TYPES))


class Observer(Generic[NodeT]):
    """What the driver hears from the network; every method is a no-op here."""

    def node_output(self, host: Host[NodeT], injections: list[Injection], events: list[Event], now: float) -> None:
        """A node produced injections or events (called only when one of them is non-empty)."""

    def custody_released(self, host: Host[NodeT], publications: list[PublicationId], now: float) -> None:
        """A node's own QoS 1/2 publications were delivered everywhere (called only when there are some)."""

    def node_touched(self, host: Host[NodeT]) -> None:
        """A node received an input (its view may have changed)."""

    def data_sent(self, host: Host[NodeT], publication: PublicationId, copies: int, now: float) -> None:
        """A `tm` datagram left `host`; `copies` is the running total for the publication."""

    def anomaly(self, text: str, now: float) -> None:
        """Something the network saw a node do wrong (e.g. a timer storm)."""

    def timestamp_done(self, now: float) -> None:
        """Every queued entry for instant `now` has run (the clock is about to move on or stop)."""


@dataclass(slots=True)
class _Arrival:
    target: int
    source: Address
    data: bytes


@dataclass(slots=True)
class _Timer:
    target: int
    generation: int


@dataclass(slots=True)
class _Action:
    callback: Callable[[], None]


_Entry = _Arrival | _Timer | _Action


@dataclass(frozen=True)
class LinkModel:
    """Network-wide link parameters (the scenario's `LinkDefaults`)."""

    latency: float = 0.001
    jitter: float = 0.0
    loss: float = 0.0
    duplicate: float = 0.0


class Network(Generic[NodeT]):
    def __init__(self, factory: Callable[[NodeSetup], NodeT], names: Iterable[str],
                 links: Iterable[tuple[str, str]], *, seed: int, model: LinkModel = LinkModel(),
                 settings: Callable[[str], Settings] | None = None,
                 vids: Callable[[str], int | None] | None = None,
                 observer: Observer[NodeT] | None = None, max_in_flight: int | None = None) -> None:
        self.factory = factory
        self.seed = seed
        self.rng = random.Random(seed)
        self.model = model
        self.loss = model.loss
        """network-wide loss percent (a link direction's override wins)"""
        self.observer: Observer[NodeT] = observer if observer is not None else Observer()
        self.now = 0.0
        self.queue: list[tuple[float, int, _Entry]] = []
        self.counter = 0
        self.traffic = Traffic()
        self.hosts: list[Host[NodeT]] = []
        self.index_of_name: dict[str, int] = {}
        self.index_of_address: dict[Address, int] = {}
        self.links: dict[tuple[int, int], Link] = {}
        name_list = list(names)
        for index, name in enumerate(name_list):
            if name in self.index_of_name:
                raise ValueError(f"node name {name!r} appears twice: names must be unique")
            self.index_of_name[name] = index
        neighbour_sets: list[set[int]] = [set() for _ in name_list]
        for a, b in links:
            low, high = sorted((self.index(a), self.index(b)))
            if low == high:
                raise ValueError(f"link {a}-{b} joins a node to itself")
            self.links.setdefault((low, high), Link(low, high))
            neighbour_sets[low].add(high)
            neighbour_sets[high].add(low)
        self.max_in_flight = max_in_flight if max_in_flight is not None else default_max_in_flight(len(name_list))
        """queued entries above this raise NetworkOverload"""
        for index, name in enumerate(name_list):
            address = node_address(index)
            self.index_of_address[address] = index
            self.hosts.append(Host(index, name, address, settings(name) if settings else Settings(),
                                   vids(name) if vids else None, frozenset(neighbour_sets[index])))

    # ------------------------------------------------------------ lookups

    def index(self, name: str) -> int:
        try:
            return self.index_of_name[name]
        except KeyError:
            raise ValueError(f"unknown node {name!r}; known nodes: {', '.join(sorted(self.index_of_name))}") from None

    def host(self, name: str) -> Host[NodeT]:
        return self.hosts[self.index(name)]

    def link(self, a: str, b: str) -> Link:
        low, high = sorted((self.index(a), self.index(b)))
        link = self.links.get((low, high))
        if link is None:
            raise ValueError(f"there is no link {a}-{b}; add it to `links` or cut an existing one")
        return link

    def alive_hosts(self) -> list[Host[NodeT]]:
        return [host for host in self.hosts if host.node is not None]

    # ------------------------------------------------------------ scheduling

    def _push(self, when: float, entry: _Entry) -> None:
        self.counter += 1
        heapq.heappush(self.queue, (when, self.counter, entry))
        if len(self.queue) > self.max_in_flight:
            busiest = ", ".join(f"{kind} {count}" for kind, count in self.traffic.packets_by_type.most_common(3))
            raise NetworkOverload(
                f"packet storm: more than {self.max_in_flight} datagrams and timers queued at t={self.now!r} "
                f"(datagrams sent so far, busiest types: {busiest}); the run stops here")

    def schedule(self, when: float, callback: Callable[[], None]) -> None:
        """Run `callback` at virtual time `when` (after entries already queued for that instant)."""
        self._push(max(when, self.now), _Action(callback))

    def next_time(self) -> float | None:
        return self.queue[0][0] if self.queue else None

    def run_until(self, until: float) -> None:
        """Run every entry due at or before `until`; the clock then reads `until`."""
        queue = self.queue
        observer = self.observer
        while queue and queue[0][0] <= until:
            when, _, entry = heapq.heappop(queue)
            if when > self.now:
                observer.timestamp_done(self.now)
                self.now = when
            if isinstance(entry, _Arrival):
                self._arrive(entry)
            elif isinstance(entry, _Timer):
                self._fire_timer(entry)
            else:
                entry.callback()
        observer.timestamp_done(self.now)
        self.now = max(self.now, until)

    def run_while(self, keep_going: Callable[[], bool], limit: float) -> None:
        """Run instant by instant while `keep_going()` holds and the clock is below `limit`."""
        while keep_going():
            next_time = self.next_time()
            if next_time is None or next_time > limit:
                self.run_until(limit)
                return
            self.run_until(next_time)

    # ------------------------------------------------------------ life and death

    def start(self, name: str) -> NodeT:
        """Start (or restart after a kill) the node at `name` with the next epoch."""
        host = self.host(name)
        if host.node is not None:
            raise ValueError(f"node {name!r} is already running; kill it first")
        host.epoch += 1
        setup = NodeSetup(host.name, host.address, tuple(sorted(self.hosts[i].address for i in host.neighbours)),
                          host.epoch, node_rng(self.seed, host.name, host.epoch), host.settings, host.vid)
        node = self.factory(setup)
        host.node = node
        host.started_at = self.now
        host.timer_at = None
        host.timer_generation += 1
        host.stormed = False
        node.start(self.now)
        self.after_input(host)
        return node

    def kill(self, name: str) -> None:
        """Crash the node at `name`: its object is discarded without shutdown."""
        host = self.host(name)
        if host.node is None:
            return
        host.node = None
        host.timer_generation += 1
        host.timer_at = None
        if host.started_at is not None:
            host.alive_seconds += self.now - host.started_at
        host.started_at = None

    def alive_seconds(self) -> float:
        """Node-seconds of life so far, summed over hosts."""
        return sum(host.alive_seconds + (self.now - host.started_at if host.started_at is not None else 0.0)
                   for host in self.hosts)

    # ------------------------------------------------------------ links

    def set_cut(self, source: str, target: str, cut: bool) -> None:
        """Cut or restore the direction source -> target."""
        link = self.link(source, target)
        link.direction(self.index(source)).cut = cut

    def set_loss(self, percent: float, link: tuple[str, str] | None = None) -> None:
        """Loss percent on one link (both directions), or on every link (clearing per-link overrides)."""
        if not 0 <= percent <= 100:
            raise ValueError(f"loss must be a percentage in [0, 100], got {percent!r}")
        if link is None:
            self.loss = percent
            for each in self.links.values():
                each.up.loss = None
                each.down.loss = None
            return
        chosen = self.link(*link)
        chosen.up.loss = percent
        chosen.down.loss = percent

    def loss_active(self) -> bool:
        if self.loss > 0:
            return True
        return any((d.loss or 0) > 0 for link in self.links.values() for d in (link.up, link.down))

    def connected_links(self) -> list[tuple[str, str]]:
        """Links with both directions uncut, as name pairs."""
        return [(self.hosts[low].name, self.hosts[high].name)
                for (low, high), link in sorted(self.links.items()) if link.connected]

    # ------------------------------------------------------------ node I/O

    def after_input(self, host: Host[NodeT]) -> None:
        """Drain a node's outputs and re-arm its timer; call after every input you give a node."""
        node = host.node
        if node is None:
            return
        injections = node.injections_to_make()
        for injection in injections:  # the simulated broker takes each at once
            if injection.qos:
                node.injection_done(injection.publication, self.now)
        for data, target in node.packets_to_send():
            self._transmit(host, data, target)
        released = node.custody_released()
        if released:
            self.observer.custody_released(host, released, self.now)
        events = node.events_emitted()
        if injections or events:
            self.observer.node_output(host, injections, events, self.now)
        self.observer.node_touched(host)
        if host.node is not node:
            return  # the observer killed it
        at = node.get_timer()
        if at == host.timer_at:
            return
        host.timer_generation += 1
        host.timer_at = at
        if at is not None:
            self._push(max(at, self.now), _Timer(host.index, host.timer_generation))

    def _fire_timer(self, entry: _Timer) -> None:
        host = self.hosts[entry.target]
        node = host.node
        if node is None or entry.generation != host.timer_generation:
            return
        if host.storm_at == self.now:
            host.storm_count += 1
        else:
            host.storm_at, host.storm_count = self.now, 1
        host.timer_at = None
        node.handle_timer(self.now)
        self.after_input(host)
        limit = 1 if host.stormed else TIMER_STORM_LIMIT
        if host.storm_count >= limit and host.timer_at is not None and host.timer_at <= self.now:
            if not host.stormed:
                host.stormed = True
                self.observer.anomaly(
                    f"{host.name} (epoch {host.epoch}): get_timer() still returns {host.timer_at!r} <= now "
                    f"after {TIMER_STORM_LIMIT} handle_timer calls at t={self.now!r} (timer storm; from now on "
                    f"its past timers are retried every {TIMER_STORM_BACKOFF}s)", self.now)
            host.timer_generation += 1
            self._push(self.now + TIMER_STORM_BACKOFF, _Timer(host.index, host.timer_generation))

    def _transmit(self, host: Host[NodeT], data: bytes, target: Address) -> None:
        traffic = self.traffic
        kind = packet_type(data) or UNKNOWN_TYPE
        size = len(data)
        traffic.packets_by_type[kind] += 1
        traffic.bytes_by_type[kind] += size
        if kind in DATA_TYPES:
            traffic.data_packets_by_host[host.index] += 1
            traffic.data_bytes_by_host[host.index] += size
            for publication in publication_ids_of(data, size):
                traffic.copies[publication] += 1
                self.observer.data_sent(host, publication, traffic.copies[publication], self.now)
        else:
            traffic.control_packets_by_host[host.index] += 1
            traffic.control_bytes_by_host[host.index] += size
        target_index = self.index_of_address.get(target)
        if target_index is None or target_index not in host.neighbours:
            traffic.drops["no_route"] += 1
            return
        low, high = (host.index, target_index) if host.index < target_index else (target_index, host.index)
        direction = self.links[(low, high)].direction(host.index)
        if direction.cut:
            traffic.drops["cut"] += 1
            return
        loss = direction.loss if direction.loss is not None else self.loss
        rng = self.rng
        if loss > 0 and rng.random() * 100 < loss:
            traffic.drops["loss"] += 1
            return
        copies = 1
        if self.model.duplicate > 0 and rng.random() * 100 < self.model.duplicate:
            copies = 2
            traffic.duplicated += 1
        for _ in range(copies):
            delay = self.model.latency
            if self.model.jitter > 0:
                delay += rng.uniform(0, self.model.jitter)
            self._push(self.now + delay, _Arrival(target_index, host.address, data))

    def _arrive(self, entry: _Arrival) -> None:
        host = self.hosts[entry.target]
        node = host.node
        if node is None:
            self.traffic.drops["dead"] += 1
            return
        self.traffic.delivered += 1
        node.receive_packet(entry.data, entry.source, self.now)
        self.after_input(host)
