"""Hostile input for the node's own tables: a key holder sending well-formed packets with fake ids.

The envelope (tests/envelope/test_envelope_fuzz.py) stops strangers; a wrapper that
holds the federation key gets every packet it sends to the node. This test
is that wrapper gone bad: from two real, up neighbours (and from fake
source addresses) it sends well-formed packets of every type with random
origins, cores, filters, publication ids and announced ids, plus random
mutations of valid packets and arbitrary bytes. The node runs with small
bounds so that every table reaches its limit; after every batch
`check_bounds` verifies that nothing raised and every table is within its
bound (docs/security.md, "Bounds"), and the tables' eviction counters show
the limits were actually reached.

`make test` feeds NODE_FUZZ_PACKETS (default 30000) packets; the `slow` test
feeds a million (`pytest -m slow tests/protocol/test_node_fuzz.py -s` prints the
figures quoted in docs/security.md).
"""

from __future__ import annotations

import os
import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from federation.protocol import wire
from federation.protocol.node import Node
from federation.protocol.settings import Settings
from federation.protocol.types import Address, BrokerId

HOME = Address("10.0.0.2", 10500)
FRIENDS = (Address("10.0.0.1", 10500), Address("10.0.0.3", 10500))
SETTINGS = Settings(max_neighbours=8, max_nodes=64, max_topics=32, duplicate_cache_size=256, max_unacked=64,
                    max_held_publications=32, reorder_max=32, reorder_max_stream=8)
DEFAULT_COUNT = int(os.environ.get("NODE_FUZZ_PACKETS", "30000"))
WINDOW = 16
"""the rig's embedder reads QoS 1/2 publications from its broker only while fewer copies than this wait
(`Node.unacked_copies`), as the daemon does: what the node keeps of its own publications is bounded by it"""
FILTER_WORDS = ("a", "b", "c", "+", "#", "kitchen", "x1")


def random_address(rng: random.Random) -> Address:
    host = f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
    return Address(host, rng.choice((10500, 1, 65535)))


def random_id(rng: random.Random) -> BrokerId:
    if rng.random() < 0.1:
        return BrokerId(rng.randrange(2**31), HOME)
    return BrokerId(rng.randrange(2**31), rng.choice(FRIENDS) if rng.random() < 0.2 else random_address(rng))


def random_filter(rng: random.Random) -> str:
    levels = [rng.choice(FILTER_WORDS[:4] + FILTER_WORDS[5:]) for _ in range(rng.randint(1, 3))]
    levels = [level for level in levels if level != "#"]
    if not levels or rng.random() < 0.3:
        levels.append("#")
    return "/".join(levels)


def random_topic(rng: random.Random) -> str:
    return "/".join(rng.choice(("a", "b", "c", "kitchen", "x1")) for _ in range(rng.randint(1, 3)))


def random_record(rng: random.Random) -> wire.LinkStateRecord:
    neighbours = tuple(sorted({rng.choice((HOME, *FRIENDS)) if rng.random() < 0.5 else random_address(rng)
                               for _ in range(rng.randint(0, 5))}))
    return wire.LinkStateRecord(random_id(rng), rng.randrange(3), rng.randrange(1, 2**20), rng.randrange(5),
                                rng.choice((0, 0, 0, 1)), neighbours)


def random_body(rng: random.Random, node: Node) -> tuple[str, wire.Body]:
    choice = rng.randrange(14)
    if choice == 0:
        return wire.FEDERATE, wire.Federate(random_record(rng))
    if choice == 1:
        return wire.TOPOLOGY_UPDATE, wire.TopologyUpdate(tuple(random_record(rng) for _ in range(rng.randint(1, 6))))
    if choice in (2, 3):
        kind = wire.TOPIC_CORE if choice == 2 else wire.RECONSIDER_TOPIC_CORE
        return kind, wire.TopicCore(random_filter(rng), random_id(rng), rng.randrange(3), rng.randrange(1, 100),
                                    rng.randrange(4), rng.choice((0, 0, 1, 2, 3)), rng.choice((0, 0, 5)))
    if choice == 4:
        state = node.mesh.topics.get(rng.choice(sorted(node.mesh.topics))) if node.mesh.topics else None
        core = state.core if state is not None and state.core is not None and rng.random() < 0.7 else random_id(rng)
        filter_ = state.filter if state is not None and rng.random() < 0.7 else random_filter(rng)
        return wire.TOPIC_SUBSCRIBE, wire.TopicSubscribe(filter_, core, rng.choice((0, 0, 1)))
    if choice in (5, 6):
        filter_ = random_filter(rng)
        return wire.TOPIC_MESSAGE, wire.TopicMessage(
            filter_, random_address(rng) if rng.random() < 0.8 else HOME, rng.randrange(3), rng.randrange(1, 2**20),
            rng.randrange(2), rng.randrange(70), random_topic(rng), os.urandom(rng.randrange(40)), rng.randrange(3),
            rng.random() < 0.1, None)
    if choice == 7:
        return wire.TOPIC_ACK, wire.TopicAck(random_filter(rng), random_address(rng), rng.randrange(3),
                                             rng.randrange(2**20))
    if choice == 8:
        return wire.CORE_ANNOUNCEMENT, wire.CoreAnnouncement(random_id(rng), rng.randrange(3), rng.randrange(100),
                                                             rng.randrange(5))
    if choice == 9:
        return wire.RECONSIDER, wire.Reconsider(random_id(rng), random_id(rng))
    if choice == 10:
        return wire.DATABASE_SUMMARY, wire.DatabaseSummary(tuple(
            wire.SummaryEntry(random_address(rng), rng.randrange(3), rng.randrange(100)) for _ in range(5)))
    if choice == 13:
        items: list[object] = []
        for _ in range(rng.randint(1, 8)):
            items += [rng.randrange(1, 2**20), random_topic(rng), os.urandom(rng.randrange(40))]
        origin = random_address(rng) if rng.random() < 0.8 else HOME
        return wire.TOPIC_BATCH, wire.TopicBatch(random_filter(rng), origin, rng.randrange(3), rng.randrange(2),
                                                 rng.randrange(70), items)
    if choice == 12:
        return wire.RECEIVER_BUSY, wire.ReceiverBusy(rng.choice((0.0, 0.2, rng.uniform(0, wire.MAX_HOLD))))
    return wire.DATABASE_REQUEST, wire.DatabaseRequest(tuple(random_address(rng) for _ in range(3)))


def mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 4))):
        if not out:
            break
        position = rng.randrange(len(out))
        action = rng.random()
        if action < 0.5:
            out[position] ^= 1 << rng.randrange(8)
        elif action < 0.7:
            del out[position:position + rng.randint(1, 8)]
        elif action < 0.85:
            out[position:position] = os.urandom(rng.randint(1, 8))
        else:
            del out[position:]
    return bytes(out)


class Rig:
    """One node with two up neighbours, fed by an attacker that holds the key."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.node = Node(HOME, FRIENDS, 5, random.Random(seed), SETTINGS, vid=7)
        self.now = 0.0
        self.fed = 0
        self.node.start(self.now)
        self.answer_hellos()
        assert len(self.node.neighbours.up()) == 2

    def answer_hellos(self) -> None:
        """Play the two friends' part of the hello exchange (they stay up for the whole run)."""
        for data, target in self.node.packets_to_send():
            if target in FRIENDS and wire.packet_type(data) == wire.HELLO:
                hello = wire.decode(data).body
                assert isinstance(hello, wire.Hello)
                back = wire.encode(wire.HELLO_BACK, wire.Sender(BrokerId(1 + FRIENDS.index(target), target), 1),
                                   wire.HelloBack(hello.seq, hello.sent_at, self.now))
                self.node.receive_packet(back, target, self.now)
        for injection in self.node.injections_to_make():  # the broker takes them at once
            if injection.qos:
                self.node.injection_done(injection.publication, self.now)
        self.node.custody_released()
        self.node.events_emitted()

    def feed_one(self) -> None:
        rng, node = self.rng, self.node
        self.now += 0.0005
        source = rng.choice(FRIENDS) if rng.random() < 0.9 else random_address(rng)
        # A changed announced id (or epoch) makes the node resend its whole database to that neighbour
        # (rule 1); rarer here than the rest, or that one path would take all the run's time.
        fake_id = rng.random() < 0.02
        announced = random_address(rng) if fake_id else source
        kind, body = random_body(rng, node)
        if rng.random() < 0.03:
            kind, body = wire.HELLO, wire.Hello(rng.randrange(100), self.now)
        vid = rng.randrange(2**31) if fake_id else 1 + 2 * FRIENDS.index(source) if source in FRIENDS else 9
        sender = wire.Sender(BrokerId(vid, announced), rng.choice((1, 2)) if fake_id else 1)
        data = wire.encode(kind, sender, body)
        roll = rng.random()
        if roll < 0.1:
            data = mutate(rng, data)
        elif roll < 0.12:
            data = os.urandom(rng.randrange(60))
        node.receive_packet(data, source, self.now)
        if rng.random() < 0.02:  # local activity too: subscriptions and QoS 1 publications
            node.local_subscribe(f"c{rng.randrange(50)}", random_filter(rng), 1, self.now)
        if rng.random() < 0.02:
            qos = rng.randrange(3)
            if not qos or node.unacked_copies + node.held_publications < WINDOW:
                node.local_publish(random_topic(rng), b"p", qos, False, None, self.now)
        self.fed += 1

    def tick(self) -> None:
        node = self.node
        timer = node.get_timer()
        if timer is not None and timer <= self.now:
            node.handle_timer(self.now)
        self.answer_hellos()

    def run(self, count: int) -> None:
        for index in range(count):
            self.feed_one()
            if index % 50 == 0:
                self.tick()
            if index % 1000 == 0:
                check_bounds(self.node)
        self.tick()
        check_bounds(self.node)


def check_bounds(node: Node) -> None:
    """Every table within its bound (the rows of docs/security.md, "Bounds")."""
    s = node.settings
    assert len(node.neighbours.all()) <= s.max_neighbours
    assert len(node.pacing.paced_until) <= s.max_neighbours and len(node.pacing.told) <= s.max_neighbours
    assert len(node.table.lsdb.records) <= s.max_nodes
    assert node.table.lsdb.vid_index_size() <= len(node.table.lsdb.records) == len(node.table.lsdb.received_at)
    assert len(node.table.flood_queue) <= s.max_nodes
    assert len(node.table.core_announcements) <= s.max_nodes
    assert len(node.mesh.topics) <= s.max_topics + 1  # and the `#` that serves local filters it had no room for
    held = 0
    for state in node.mesh.topics.values():
        assert len(state.children) <= s.max_neighbours and len(state.standby_children) <= s.max_neighbours
        assert len(state.via) <= s.max_neighbours
        assert len(state.pending) <= 4
        held += len(state.held) + len(state.held_reliable)
    assert held == node.mesh.held_count <= s.max_held_publications + WINDOW  # beyond it: our own, paced
    assert sum(len(state.held_reliable) for state in node.mesh.topics.values()) == node.mesh.held_reliable_count
    assert len(node.mesh.ownership.entries) <= s.max_topics
    assert len(node.mesh.ownership.withdrawn) <= s.max_topics
    publications = node.publications
    assert len(publications.seen) <= s.duplicate_cache_size and len(publications.injected) <= s.duplicate_cache_size
    assert len(node.table.reconsiders_seen) <= 1024
    reliable = node.reliable
    # Beyond the bound only copies in custody: the fan-out of the last copy taken, and our own, paced.
    assert len(reliable.unacked) <= s.max_unacked + WINDOW * s.max_neighbours and len(reliable.recent) <= s.max_unacked
    assert len(reliable._heap) <= 4 * len(reliable.unacked) + 65
    assert len(node.custody.entries) <= len(reliable.unacked) + node.mesh.held_count + len(node.custody.injecting)
    order = node.publications.ordering
    assert order.waiting <= s.reorder_max and len(order) <= s.max_streams
    assert len(node.packets_to_send()) < 100_000  # the caller drains outputs; nothing piles up unseen


def run_fuzz(count: int, seed: int) -> Counter[str]:
    rig = Rig(seed)
    rig.run(count)
    node = rig.node
    figures = Counter({
        "packets": rig.fed, "records": len(node.table.lsdb.records), "topics": len(node.mesh.topics),
        "neighbours": len(node.neighbours.all()), "unacked": len(node.reliable.unacked),
        "seen": len(node.publications.seen), "neighbours_refused": node.neighbours.refused,
        "neighbours_forgotten": node.neighbours.forgotten, "topics_refused": node.mesh.refused_topics,
        "seen_evictions": node.publications.seen.evictions,
    })
    figures.update({f"drop:{reason}": count for reason, count in node.drops.items()})
    return figures


def test_fake_ids_from_a_key_holder_cannot_grow_the_tables() -> None:
    figures = run_fuzz(DEFAULT_COUNT, seed=1)
    assert figures["packets"] == DEFAULT_COUNT
    # The limits were reached, and held: every bounded table says so.
    assert figures["records"] == SETTINGS.max_nodes
    assert figures["topics_refused"] > 0 and figures["neighbours_refused"] > 0
    assert figures["neighbours_forgotten"] > 0 and figures["seen_evictions"] > 0
    assert figures["drop:reliable_table_full"] > 0
    for reason in ("malformed", "unknown_neighbour", "bad_filter"):
        assert figures[f"drop:{reason}"] > 0, reason


@pytest.mark.slow
def test_a_million_hostile_packets() -> None:
    figures = run_fuzz(1_000_000, seed=2)
    print("\n" + ", ".join(f"{key}={value}" for key, value in sorted(figures.items())))
    assert figures["packets"] == 1_000_000


RIG = Rig(3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=600), source=st.sampled_from(FRIENDS))
def test_arbitrary_bytes_from_a_neighbour(data: bytes, source: Address) -> None:
    RIG.now += 0.01
    RIG.node.receive_packet(data, source, RIG.now)
    RIG.tick()
    check_bounds(RIG.node)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), count=st.integers(1, 40))
def test_generated_packet_sequences(seed: int, count: int) -> None:
    RIG.rng = random.Random(seed)
    RIG.run(count)
