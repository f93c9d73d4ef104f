"""The overlay at scale's rules on small networks: anti-entropy repair, no periodic re-flooding,
debounced route computation and paced flooding (docs/protocol.md, "The federation table")."""

from __future__ import annotations

import random

from federation.protocol import wire
from federation.protocol.node import Node
from federation.protocol.settings import Settings
from federation.protocol.table import FederationTable, RouteChange
from federation.protocol.types import Address, BrokerId

from node_harness import Harness, address

FAST = Settings(hello_interval=0.2, announce_interval=1.0, stats_interval=60.0)


class LossyHarness(Harness):
    """Drops the link-state packets (`fd`, `tu`) sent to the nodes in `deaf` while it is non-empty."""

    deaf: set[int]

    def lose(self, data: bytes, source: Address, target: int) -> bool:
        return target in getattr(self, "deaf", ()) and wire.packet_type(data) in (wire.FEDERATE, wire.TOPOLOGY_UPDATE)


def members(h: Harness, index: int) -> set[int]:
    return {int(a.host.rsplit(".", 1)[1]) for a in h.nodes[index].view().members}


def test_a_lost_update_is_repaired_by_the_neighbours_digests() -> None:
    h = LossyHarness([(0, 1), (1, 2), (2, 3)], settings=FAST)
    h.deaf = set()
    h.run(1.0)
    assert all(members(h, i) == {0, 1, 2, 3} for i in h.nodes)
    h.deaf = {3}
    h.cut_link(0, 1)
    h.run(h.now + 1.5)  # 1 declares 0 dead after 0.6 s and floods; node 3 hears none of it
    assert members(h, 1) == {1, 2, 3}
    assert members(h, 3) == {0, 1, 2, 3}, "the loss did not happen: the test proves nothing"
    h.deaf = set()

    def summaries() -> int:
        return sum(n.sent_by_type[wire.DATABASE_SUMMARY] for n in h.nodes.values())

    before = summaries()
    h.run(h.now + 2.5)  # at most two announce intervals: a digest, a summary, a request or a push (`tu`)
    assert members(h, 3) == {1, 2, 3}
    assert summaries() > before
    assert h.nodes[2].counters["digest_mismatches"] > 0 and h.nodes[3].counters["digest_mismatches"] > 0


def test_quiet_overlay_sends_digests_and_no_records() -> None:
    ring = [(i, (i + 1) % 6) for i in range(6)]
    h = Harness(ring, settings=FAST)
    h.run(2.0)
    before = {i: (n.sent_by_type.copy()) for i, n in h.nodes.items()}
    h.run(12.0)
    for index, node in h.nodes.items():
        sent = node.sent_by_type
        assert sent[wire.FEDERATE] == before[index][wire.FEDERATE], index
        assert sent[wire.TOPOLOGY_UPDATE] == before[index][wire.TOPOLOGY_UPDATE], index
        digests = sent[wire.DATABASE_DIGEST] - before[index][wire.DATABASE_DIGEST]
        assert 2 * 9 <= digests <= 2 * 11, (index, digests)  # one per neighbour per announce interval
        assert sent[wire.DATABASE_SUMMARY] == before[index][wire.DATABASE_SUMMARY]  # digests agree


def test_route_computation_is_debounced_and_convergence_stays_fast() -> None:
    count = 30
    links = [(i, (i + 1) % count) for i in range(count)] + [(i, (i + 7) % count) for i in range(0, count, 3)]
    computations: dict[int, int] = {}
    original = FederationTable.recompute_routes

    def counting(self: FederationTable, now: float, pending: bool = False) -> RouteChange | None:
        change = original(self, now, pending)
        if change is not None:  # None: nothing was due, nothing computed
            index = int(self.lsdb.own.host.rsplit(".", 1)[1])
            computations[index] = computations.get(index, 0) + 1
        return change

    FederationTable.recompute_routes = counting  # type: ignore[method-assign]
    try:
        h = Harness(links, settings=Settings())
        converged_at = None
        while h.now < 1.0 and converged_at is None:
            h.run(h.now + 0.01)
            views = [n.view() for n in h.nodes.values()]
            if all(len(v.members) == count for v in views) and len({v.management_core for v in views}) == 1:
                converged_at = h.now
    finally:
        FederationTable.recompute_routes = original  # type: ignore[method-assign]
    assert converged_at is not None and converged_at < 0.3, converged_at
    records_received = sum(n.received_by_type[wire.FEDERATE] + n.received_by_type[wire.TOPOLOGY_UPDATE]
                           for n in h.nodes.values())
    assert records_received > 10 * count  # many table changes ...
    assert max(computations.values()) <= 6, computations  # ... few computations per node


def up_node(neighbours: int, settings: Settings) -> tuple[Node, list[Address]]:
    """A node at address(0) whose neighbours address(1..n) are up (hello backs fed by hand)."""
    peers = [address(i) for i in range(1, neighbours + 1)]
    node = Node(address(0), peers, 1, random.Random(1), settings, vid=0)
    node.start(0.0)
    hellos = [wire.decode(data) for data, _ in node.packets_to_send() if wire.packet_type(data) == wire.HELLO]
    for packet, peer in zip(hellos, peers, strict=True):
        assert isinstance(packet.body, wire.Hello)
        sender = wire.Sender(BrokerId(peers.index(peer) + 1, peer), 1)
        back = wire.HelloBack(packet.body.seq, packet.body.sent_at, 0.001)
        node.receive_packet(wire.encode(wire.HELLO_BACK, sender, back), peer, 0.002)
    node.handle_timer(1.0)  # the rate-limited origination
    node.packets_to_send()
    return node, peers


def test_records_wait_flood_delay_and_skip_neighbours_that_sent_them() -> None:
    settings = Settings(flood_delay=0.005)
    node, peers = up_node(3, settings)
    far = BrokerId(9, address(9))
    record = wire.LinkStateRecord(far, 1, 1, 0, 0, (peers[0], peers[1]))
    for number, peer in enumerate(peers[:2]):  # the same record from two neighbours, 1 ms apart
        sender = wire.Sender(BrokerId(number + 1, peer), 1)
        node.receive_packet(wire.encode(wire.FEDERATE, sender, wire.Federate(record)), peer, 1.0 + 0.001 * number)
        assert not [d for d, _ in node.packets_to_send() if wire.packet_type(d) == wire.FEDERATE]
    assert node.get_timer() is not None and node.get_timer() <= 1.0 + 0.005
    node.handle_timer(1.005)
    forwarded = [(wire.decode(d).body, target) for d, target in node.packets_to_send()
                 if wire.packet_type(d) == wire.FEDERATE]
    assert [target for _, target in forwarded] == [peers[2]]
    body = forwarded[0][0]
    assert isinstance(body, wire.Federate) and body.record.origin == far and body.record.distance == 1


def test_without_flood_delay_records_are_forwarded_at_once() -> None:
    node, peers = up_node(3, Settings(flood_delay=0.0))
    record = wire.LinkStateRecord(BrokerId(9, address(9)), 1, 1, 0, 0, (peers[0],))
    sender = wire.Sender(BrokerId(1, peers[0]), 1)
    node.receive_packet(wire.encode(wire.FEDERATE, sender, wire.Federate(record)), peers[0], 1.0)
    targets = sorted(t for d, t in node.packets_to_send() if wire.packet_type(d) == wire.FEDERATE)
    assert targets == peers[1:]


def test_a_claim_that_overtakes_the_records_of_its_core_is_kept_until_the_core_is_reachable() -> None:
    """A `tc` is forwarded at once, records wait `flood_delay` per hop: a claim can arrive before the
    records that make its core reachable. Its core, adopted (no record yet), then shown unreachable by
    its first record, is lost; the claim must be kept and adopted again once the core is reachable,
    not only at the core's periodic refresh (`announce_interval` later: the cold-start delay)."""
    node, peers = up_node(2, Settings())
    sender = wire.Sender(BrokerId(1, peers[0]), 1)
    middle, core = BrokerId(8, address(8)), BrokerId(9, address(9))

    def receive(kind: str, body: wire.Body, at: float) -> None:
        node.receive_packet(wire.encode(kind, sender, body), peers[0], at)
        node.handle_timer(at + 0.1)  # the debounced route computation

    receive(wire.FEDERATE, wire.Federate(wire.LinkStateRecord(sender.broker_id, 1, 5, 0, 0,
                                                              (node.address,))), 1.0)
    assert node.view().members == {node.address, peers[0]}
    receive(wire.TOPIC_CORE, wire.TopicCore("a/+/c", core, 1, 1, 2, 0), 1.2)  # no record of the core yet
    assert node.view().topic_cores == {"a/+/c": core}
    receive(wire.FEDERATE, wire.Federate(wire.LinkStateRecord(core, 1, 2, 1, 0, (middle.address,))), 1.4)
    assert node.view().topic_cores == {}  # its record shows it unreachable (the middle's is still on its way)
    receive(wire.FEDERATE, wire.Federate(wire.LinkStateRecord(middle, 1, 2, 1, 0,
                                                              (peers[0], core.address))), 1.6)
    receive(wire.FEDERATE, wire.Federate(wire.LinkStateRecord(sender.broker_id, 1, 6, 0, 0,
                                                              (node.address, middle.address))), 1.8)
    assert node.view().members == {node.address, peers[0], middle.address, core.address}
    assert node.view().topic_cores == {"a/+/c": core}  # without a new claim: the kept one
    node.events_emitted()
    node.packets_to_send()
    publication = node.local_publish("a/b/c", b"probe", 0, False, None, 2.0)
    sent = [(wire.decode(d).body, target) for d, target in node.packets_to_send()
            if wire.packet_type(d) == wire.TOPIC_MESSAGE]
    assert [target for _, target in sent] == [peers[0]], publication


def test_a_record_left_out_of_a_database_exchange_as_unreachable_follows_when_it_is_reachable() -> None:
    """A neighbour that comes up gets our reachable records only. A record we hold that is not
    reachable *yet* (the record linking it to us is on its way) was flooded before that neighbour was
    up; once reachable it must be sent to it, not left to the next digest an announce interval later
    (the cold start where the far half of a line stayed out of the near half's tables for 5 s)."""
    near, far_side = address(1), address(2)
    node = Node(address(0), [near, far_side], 1, random.Random(1), Settings(), vid=5)  # not the management core
    node.start(0.0)
    hellos = {target: wire.decode(data).body for data, target in node.packets_to_send()
              if wire.packet_type(data) == wire.HELLO}
    senders = {near: wire.Sender(BrokerId(1, near), 1), far_side: wire.Sender(BrokerId(2, far_side), 1)}

    def receive(peer: Address, kind: str, body: wire.Body, at: float) -> list[tuple[wire.Packet, Address]]:
        node.receive_packet(wire.encode(kind, senders[peer], body), peer, at)
        node.handle_timer(at + 0.1)  # the origination and route computation
        return [(wire.decode(d), t) for d, t in node.packets_to_send()]

    def hello_back(peer: Address, at: float) -> list[tuple[wire.Packet, Address]]:
        hello = hellos[peer]
        assert isinstance(hello, wire.Hello)
        return receive(peer, wire.HELLO_BACK, wire.HelloBack(hello.seq, hello.sent_at, at), at)

    def records_to(sent: list[tuple[wire.Packet, Address]], peer: Address) -> set[Address]:
        found = set()
        for packet, target in sent:
            if target == peer and isinstance(packet.body, wire.TopologyUpdate):
                found |= {record.origin.address for record in packet.body.records}
            elif target == peer and isinstance(packet.body, wire.Federate):
                found.add(packet.body.record.origin.address)
        return found

    far = BrokerId(9, address(9))
    hello_back(far_side, 0.01)
    receive(far_side, wire.FEDERATE, wire.Federate(wire.LinkStateRecord(senders[far_side].broker_id, 1, 1, 0, 0,
                                                                        (node.address,))), 0.2)
    receive(far_side, wire.FEDERATE, wire.Federate(wire.LinkStateRecord(far, 1, 1, 1, 0, (far_side,))), 0.4)
    assert far.address not in node.view().members  # held, not reachable yet
    synced = hello_back(near, 0.6)
    assert far.address not in records_to(synced, near)  # the database exchange leaves it out
    later = receive(far_side, wire.FEDERATE, wire.Federate(wire.LinkStateRecord(
        senders[far_side].broker_id, 1, 2, 0, 0, (node.address, far.address))), 0.8)
    assert far.address in node.view().members
    assert {far_side, far.address} <= records_to(later, near)  # the new link, and the record it makes reachable
