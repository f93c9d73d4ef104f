"""The virtual network on its own, driven by a toy flooding node (no protocol logic)."""

from __future__ import annotations

from federation.protocol.settings import Settings
from federation.protocol.types import Address, Event, Injection, PublicationId
from federation.sim.network import (
    TIMER_STORM_LIMIT,
    Host,
    LinkModel,
    Network,
    NodeSetup,
    Observer,
    node_address,
    node_rng,
)


def packet(kind: str, body: str) -> bytes:
    """Bytes `wire.packet_type` reads as `kind` (fixarray, then a two-letter fixstr)."""
    return bytes([0x92, 0xA2]) + kind.encode() + body.encode()


def body_of(data: bytes) -> str:
    return data[4:].decode()


class FakeNode:
    """Floods `fd` packets once to every neighbour; ticks a timer; records what it received."""

    def __init__(self, setup: NodeSetup, tick: float | None = None) -> None:
        self.setup = setup
        self.tick = tick
        self.timer: float | None = None
        self.ticks: list[float] = []
        self.received: list[tuple[float, Address, bytes]] = []
        self.seen: set[str] = set()
        self.outbox: list[tuple[bytes, Address]] = []
        self.injections: list[Injection] = []
        self.events: list[Event] = []
        self.started_at: float | None = None
        self.draw = setup.rng.random()

    def start(self, now: float) -> None:
        self.started_at = now
        self.events.append(Event(now, str(self.setup.address), "node_started", {"epoch": self.setup.epoch}))
        if self.tick is not None:
            self.timer = now + self.tick

    def send(self, data: bytes, target: Address) -> None:
        self.outbox.append((data, target))

    def flood(self, message: str, exclude: Address | None = None) -> None:
        self.seen.add(message)
        for neighbour in self.setup.neighbours:
            if neighbour != exclude:
                self.send(packet("fd", message), neighbour)

    def receive_packet(self, data: bytes, source: Address, now: float) -> None:
        self.received.append((now, source, data))
        message = body_of(data)
        if data[2:4] == b"fd" and message not in self.seen:
            publication: PublicationId = (source, 1, len(self.seen))
            self.injections.append(Injection("flood", data, 0, False, None, publication))
            self.flood(message, exclude=source)

    def handle_timer(self, now: float) -> None:
        self.ticks.append(now)
        if self.tick is not None:
            self.timer = now + self.tick

    def get_timer(self) -> float | None:
        return self.timer

    def packets_to_send(self) -> list[tuple[bytes, Address]]:
        out, self.outbox = self.outbox, []
        return out

    def injections_to_make(self) -> list[Injection]:
        out, self.injections = self.injections, []
        return out

    def injection_done(self, publication: PublicationId, now: float) -> None:
        pass

    def custody_released(self) -> list[PublicationId]:
        return []

    def events_emitted(self) -> list[Event]:
        out, self.events = self.events, []
        return out


class Recorder(Observer[FakeNode]):
    def __init__(self) -> None:
        self.injections: list[tuple[str, float]] = []
        self.events: list[tuple[str, str]] = []
        self.anomalies: list[str] = []
        self.instants: list[float] = []

    def node_output(self, host: Host[FakeNode], injections: list[Injection], events: list[Event],
                    now: float) -> None:
        self.injections.extend((host.name, now) for _ in injections)
        self.events.extend((host.name, event.type) for event in events)

    def anomaly(self, text: str, now: float) -> None:
        self.anomalies.append(text)

    def timestamp_done(self, now: float) -> None:
        self.instants.append(now)


def make(links: list[tuple[str, str]], seed: int = 1, model: LinkModel | None = None, tick: float | None = None,
         names: list[str] | None = None) -> tuple[Network[FakeNode], Recorder]:
    recorder = Recorder()
    model = model if model is not None else LinkModel()
    if names is None:
        names = sorted({name for link in links for name in link})
    network: Network[FakeNode] = Network(lambda setup: FakeNode(setup, tick), names, links, seed=seed,
                                         model=model, observer=recorder)
    for name in names:
        network.start(name)
    return network, recorder


def send(network: Network[FakeNode], source: str, target: str, body: str, kind: str = "hl") -> None:
    host = network.host(source)
    assert host.node is not None
    host.node.send(packet(kind, body), network.host(target).address)
    network.after_input(host)


def bodies(network: Network[FakeNode], name: str) -> list[str]:
    node = network.host(name).node
    assert node is not None
    return [body_of(data) for _, _, data in node.received]


def test_addresses_are_unique_and_stable() -> None:
    addresses = [node_address(index) for index in range(70000)]
    assert len(set(addresses)) == len(addresses)
    assert node_address(0) == Address("10.0.0.1", 10500)
    assert node_address(255) == Address("10.0.1.0", 10500)


def test_latency_orders_arrivals_and_ties_keep_send_order() -> None:
    network, _ = make([("a", "b")], model=LinkModel(latency=0.01))
    for number in range(5):
        send(network, "a", "b", f"m{number}")
    network.run_until(0.0099)
    assert bodies(network, "b") == []
    network.run_until(0.01)
    b = network.host("b").node
    assert b is not None
    assert [body_of(data) for _, _, data in b.received] == ["m0", "m1", "m2", "m3", "m4"]
    assert {when for when, _, _ in b.received} == {0.01}
    assert {source for _, source, _ in b.received} == {network.host("a").address}
    assert network.now == 0.01


def test_jitter_reorders_deterministically() -> None:
    def arrival_order(seed: int) -> list[str]:
        network, _ = make([("a", "b")], seed=seed, model=LinkModel(latency=0.01, jitter=0.05))
        for number in range(50):
            send(network, "a", "b", f"m{number:02d}")
        network.run_until(1.0)
        return bodies(network, "b")

    first = arrival_order(7)
    assert first == arrival_order(7)
    assert sorted(first) == [f"m{number:02d}" for number in range(50)]
    assert first != sorted(first), "jitter much larger than the send gap should reorder"
    assert first != arrival_order(8)


def test_loss_is_seeded_and_roughly_the_configured_rate() -> None:
    def survivors(seed: int) -> list[str]:
        network, _ = make([("a", "b")], seed=seed, model=LinkModel(loss=30.0))
        for number in range(2000):
            send(network, "a", "b", str(number))
        network.run_until(1.0)
        assert network.traffic.drops["loss"] == 2000 - len(bodies(network, "b"))
        return bodies(network, "b")

    first = survivors(3)
    assert first == survivors(3)
    assert 1250 < len(first) < 1550
    assert first != survivors(4)


def test_duplicates_arrive_twice() -> None:
    network, _ = make([("a", "b")], model=LinkModel(duplicate=100.0))
    send(network, "a", "b", "x")
    network.run_until(1.0)
    assert bodies(network, "b") == ["x", "x"]
    assert network.traffic.duplicated == 1
    assert network.traffic.packets_by_type["hl"] == 1, "sent counters count what the node sent, once"


def test_oneway_cut_and_heal() -> None:
    network, _ = make([("a", "b")])
    network.set_cut("a", "b", True)
    assert not network.links[(0, 1)].connected
    assert network.connected_links() == []
    send(network, "a", "b", "lost")
    send(network, "b", "a", "kept")
    network.run_until(1.0)
    assert bodies(network, "b") == []
    assert bodies(network, "a") == ["kept"]
    assert network.traffic.drops["cut"] == 1
    network.set_cut("a", "b", False)
    assert network.connected_links() == [("a", "b")]
    send(network, "a", "b", "again")
    network.run_until(2.0)
    assert bodies(network, "b") == ["again"]


def test_loss_override_per_link_and_global_reset() -> None:
    network, _ = make([("a", "b"), ("b", "c")])
    network.set_loss(100.0, ("a", "b"))
    assert network.loss_active()
    send(network, "a", "b", "dropped")
    send(network, "c", "b", "fine")
    network.run_until(1.0)
    assert bodies(network, "b") == ["fine"]
    network.set_loss(0.0)
    assert not network.loss_active()
    send(network, "a", "b", "through")
    network.run_until(2.0)
    assert bodies(network, "b") == ["fine", "through"]


def test_datagram_to_a_non_neighbour_has_no_route() -> None:
    network, _ = make([("a", "b"), ("b", "c")])
    send(network, "a", "c", "x")
    host = network.host("a")
    assert host.node is not None
    host.node.send(packet("hl", "y"), Address("192.0.2.1", 10500))
    network.after_input(host)
    network.run_until(1.0)
    assert bodies(network, "c") == []
    assert network.traffic.drops["no_route"] == 2
    assert network.traffic.control_packets_by_host[0] == 2


def test_flooding_reaches_everyone_once_and_counts_by_type() -> None:
    ring = [("n0", "n1"), ("n1", "n2"), ("n2", "n3"), ("n3", "n0"), ("n0", "n2")]
    network, recorder = make(ring, model=LinkModel(latency=0.002, jitter=0.001))
    host = network.host("n0")
    assert host.node is not None
    host.node.flood("hello-world")
    network.after_input(host)
    network.run_until(1.0)
    assert sorted(name for name, _ in recorder.injections) == ["n1", "n2", "n3"]
    assert network.traffic.packets_by_type["fd"] == sum(network.traffic.control_packets_by_host.values())
    assert network.traffic.control_totals()[0] == network.traffic.packets_by_type["fd"]
    size = len(packet("fd", "hello-world"))
    assert network.traffic.bytes_by_type["fd"] == network.traffic.packets_by_type["fd"] * size
    assert ("n0", "node_started") in recorder.events


def test_timers_fire_on_time_and_stale_entries_are_skipped() -> None:
    network, recorder = make([("a", "b")], tick=0.5)
    network.run_until(1.6)
    a = network.host("a").node
    assert a is not None
    assert a.ticks == [0.5, 1.0, 1.5]
    # Moving the timer earlier leaves a stale entry at 2.0 that must not fire.
    a.timer = 1.7
    network.after_input(network.host("a"))
    network.run_until(2.05)
    assert a.ticks == [0.5, 1.0, 1.5, 1.7]
    network.run_until(2.25)
    assert a.ticks == [0.5, 1.0, 1.5, 1.7, 2.2]
    assert recorder.instants == sorted(recorder.instants)


def test_kill_drops_packets_to_the_dead_and_delivers_its_in_flight_ones() -> None:
    network, _ = make([("a", "b")], model=LinkModel(latency=0.1), tick=0.05)
    send(network, "a", "b", "from-a")
    send(network, "b", "a", "to-a")
    network.kill("a")
    assert not network.host("a").alive
    network.run_until(1.0)
    assert bodies(network, "b") == ["from-a"]
    assert network.traffic.drops["dead"] == 1
    assert network.alive_seconds() == 1.0  # a died at 0, b lived 1 second


def test_restart_builds_a_new_node_with_the_next_epoch_and_its_own_rng() -> None:
    network, _ = make([("a", "b")], seed=5, tick=1.0)
    first = network.host("a").node
    assert first is not None and first.setup.epoch == 1
    network.run_until(0.5)
    network.kill("a")
    network.run_until(1.5)
    assert first.ticks == []  # the dead node's timer never fires
    second = network.start("a")
    assert second is not first
    assert second.setup.epoch == 2
    assert second.setup.address == first.setup.address
    assert second.draw == node_rng(5, "a", 2).random()
    assert first.draw == node_rng(5, "a", 1).random()
    network.run_until(2.6)
    assert second.ticks == [2.5]


class StormNode(FakeNode):
    def handle_timer(self, now: float) -> None:
        self.ticks.append(now)  # never moves its timer: a protocol bug


def test_timer_storm_is_reported_and_does_not_hang() -> None:
    recorder = Recorder()
    network: Network[FakeNode] = Network(lambda setup: StormNode(setup, 0.1), ["a"], [], seed=1,
                                         observer=recorder)
    network.start("a")
    network.run_until(0.2)
    node = network.host("a").node
    assert node is not None
    assert len(recorder.anomalies) >= 1 and "timer storm" in recorder.anomalies[0]
    assert len(node.ticks) >= TIMER_STORM_LIMIT


def test_settings_and_vids_reach_the_factory() -> None:
    setups: list[NodeSetup] = []

    def factory(setup: NodeSetup) -> FakeNode:
        setups.append(setup)
        return FakeNode(setup)

    fast = Settings(hello_interval=0.2)
    network: Network[FakeNode] = Network(factory, ["x", "y"], [("x", "y")], seed=1,
                                         settings=lambda name: fast if name == "x" else Settings(),
                                         vids=lambda name: 7 if name == "y" else None)
    network.start("x")
    network.start("y")
    assert setups[0].settings.hello_interval == 0.2 and setups[0].vid is None
    assert setups[1].settings.hello_interval == Settings().hello_interval and setups[1].vid == 7
    assert setups[0].neighbours == (network.host("y").address,)
