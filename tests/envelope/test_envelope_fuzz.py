"""Hostile input for the envelope and the node behind it: Hypothesis, and random mutations of valid datagrams.

Three receivers (open, keyed, keyed with encryption) each feed what they
accept to a started protocol node. Inputs come from three sources:
arbitrary bytes; valid datagrams of every kind, mutated (flipped bits,
inserted, deleted, truncated, spliced, replayed); and mutated item bodies
sealed with the real key, i.e. a key holder sending well-signed garbage,
which is the only way to reach the item parser and the reassembly buffers
of a keyed wrapper. After every batch the invariants must hold: nothing
raised, every datagram accepted or dropped for exactly one reason, the
reassembly memory and the sender table within their caps.

`make test` feeds FUZZ_DATAGRAMS (default 30000) datagrams; the `slow` test
feeds a million (`pytest -m slow tests/envelope/test_envelope_fuzz.py -s` prints the
counts reported in docs/security.md).
"""

from __future__ import annotations

import os
import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from federation.envelope.config import EnvelopeConfig
from federation.envelope.datagrams import (
    DATAGRAM_REASONS,
    FRAGMENT_ITEM,
    ITEM_FRAGMENT,
    ITEM_PACKET,
    PACKET_ITEM,
    Envelope,
)
from federation.envelope.replay import SenderTable
from federation.envelope.transfer import TRANSFER_INVALID, TRANSFER_TIMEOUT
from federation.protocol import wire
from federation.protocol.node import Node
from federation.protocol.settings import Settings
from federation.protocol.types import Address, BrokerId

SENDER = Address("10.0.0.1", 10500)
RECEIVER = Address("10.0.0.2", 10500)
KEY = bytes(range(32))
SETTINGS = Settings(max_packet=100_000, max_publication_bytes=60_000, reassembly_memory=400_000,
                    reassembly_timeout=0.5).with_datagram_for([SENDER.host, RECEIVER.host])  # 1400: not loopback
CONFIGS = {
    "open": EnvelopeConfig.from_settings(SETTINGS),
    "mac": EnvelopeConfig.from_settings(SETTINGS, (KEY,)),
    "aead": EnvelopeConfig.from_settings(SETTINGS, (KEY,), "chacha20-poly1305"),
}
DEFAULT_COUNT = int(os.environ.get("FUZZ_DATAGRAMS", "30000"))


def sample_packets() -> list[bytes]:
    sender = wire.Sender(BrokerId(1, SENDER), 1)
    record = wire.LinkStateRecord(BrokerId(1, SENDER), 1, 3, 0, 0, (RECEIVER,))
    bodies: list[tuple[str, wire.Body]] = [
        (wire.HELLO, wire.Hello(1, 0.5)),
        (wire.HELLO_BACK, wire.HelloBack(1, 0.5, 0.6)),
        (wire.FEDERATE, wire.Federate(record)),
        (wire.TOPOLOGY_UPDATE, wire.TopologyUpdate((record, record))),
        (wire.TOPIC_CORE, wire.TopicCore("a/#", BrokerId(1, SENDER), 1, 1, 0, 0)),
        (wire.TOPIC_SUBSCRIBE, wire.TopicSubscribe("a/#", BrokerId(1, SENDER), 0)),
        (wire.TOPIC_MESSAGE, wire.TopicMessage("a/#", SENDER, 1, 1, 1, 0, "a/b", b"x" * 40, 0, False, None)),
        (wire.TOPIC_MESSAGE, wire.TopicMessage("a/#", SENDER, 1, 2, 1, 0, "a/c", os.urandom(5000), 1, False, None)),
    ]
    return [wire.encode(kind, sender, body) for kind, body in bodies]


class Rig:
    """The three receivers, each with a node behind it, and the invariant checks."""

    def __init__(self) -> None:
        self.receivers = {mode: Envelope(RECEIVER, 5, config) for mode, config in CONFIGS.items()}
        self.nodes = {mode: Node(RECEIVER, [SENDER], 5, random.Random(mode), SETTINGS, vid=2) for mode in CONFIGS}
        for node in self.nodes.values():
            node.start(0.0)
        self.senders = {mode: Envelope(SENDER, 1, config) for mode, config in CONFIGS.items()}
        for sender in self.senders.values():
            sender.set_peer_epoch(RECEIVER, 5)  # as the receiver's own datagrams would teach it
        self.fed = 0
        self.packets_to_nodes = 0

    def feed(self, mode: str, data: bytes, now: float) -> None:
        envelope, node = self.receivers[mode], self.nodes[mode]
        packets = envelope.receive_datagram(data, SENDER, now)
        assert isinstance(packets, list) and all(type(p) is bytes for p in packets)
        for packet in packets:
            node.receive_packet(packet, SENDER, now)
        self.fed += 1
        self.packets_to_nodes += len(packets)

    def tick(self, now: float) -> None:
        # A mutated open frame with a huge epoch locks its sender out for good (anyone may forge open
        # frames: that is what open means); forgetting the senders now and then keeps the rest of the
        # run exercising the open receiver's item parser instead of that one refusal.
        open_receiver = self.receivers["open"]
        open_receiver.senders = SenderTable(open_receiver.config.max_senders, open_receiver.config.replay_window)
        for mode, envelope in self.receivers.items():
            envelope.handle_timer(now)
            envelope.events_emitted()
            node = self.nodes[mode]
            node.handle_timer(now)
            node.packets_to_send()
            node.events_emitted()
            node.injections_to_make()

    def check(self) -> None:
        for envelope in self.receivers.values():
            counters, drops = envelope.counters, envelope.drops
            refused = sum(drops[reason] for reason in DATAGRAM_REASONS)
            assert counters["datagrams_received"] == counters["datagrams_accepted"] + refused, (counters, drops)
            # Besides whole datagrams refused: items refused inside an accepted one (a fragment, or a bulk
            # transfer item that contradicts its transfer or comes to a receiver that takes none).
            assert set(drops) <= set(DATAGRAM_REASONS) | {"fragment_invalid", "reassembly_timeout",
                                                          "reassembly_evicted", TRANSFER_INVALID, TRANSFER_TIMEOUT}
            assert 0 <= envelope.reassembler.used <= envelope.config.reassembly_memory
            assert len(envelope.senders) <= envelope.config.max_senders

    def valid_datagrams(self, mode: str, packets: list[bytes]) -> list[bytes]:
        sender = self.senders[mode]
        for packet in packets:
            sender.send(packet, RECEIVER)
        return [data for data, _ in sender.datagrams_to_send()]


def mutate(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    out = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3, 8))):
        action = rng.random()
        position = rng.randrange(len(out)) if out else 0
        if action < 0.35 and out:
            out[position] ^= 1 << rng.randrange(8)
        elif action < 0.5 and out:
            out[position] = rng.choice((0, 1, 2, 0x7F, 0x80, 0xFE, 0xFF, rng.randrange(256)))
        elif action < 0.65:
            del out[position:position + rng.randint(1, 16)]
        elif action < 0.75:
            out[position:position] = rng.randbytes(rng.randint(1, 16))
        elif action < 0.85:
            del out[rng.randrange(len(out) + 1):]
        else:
            other = rng.choice(corpus)
            cut = rng.randrange(len(other) + 1)
            out = out[:position] + bytearray(other[cut:])
    return bytes(out)


def item_bodies(rng: random.Random, packets: list[bytes]) -> bytes:
    """A plausible-then-mutated item body, as a key holder could sign it."""
    items = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.5:
            packet = rng.choice(packets)
            items.append(PACKET_ITEM.pack(ITEM_PACKET, len(packet)) + packet)
        else:
            total = rng.choice((rng.randint(1, 3000), rng.randint(1, 200_000), 2**32 - 1))
            count = rng.choice((0, 1, 2, 3, rng.randint(2, 80), 65535))
            piece = rng.randbytes(rng.randint(0, 1300))
            items.append(FRAGMENT_ITEM.pack(ITEM_FRAGMENT, rng.randrange(8), rng.randrange(max(count, 1) + 1),
                                            count, total, len(piece)) + piece)
    body = b"".join(items)
    return mutate(rng, body, packets) if rng.random() < 0.5 else body


def run_mutations(count: int, seed: int) -> dict[str, Counter[str]]:
    rng = random.Random(seed)
    rig = Rig()
    packets = sample_packets()
    corpus = {mode: rig.valid_datagrams(mode, packets) for mode in CONFIGS}
    every = [data for datagrams in corpus.values() for data in datagrams]
    now = 0.0
    fed = 0
    while fed < count:
        now += 0.001
        mode = rng.choice(("open", "mac", "aead"))
        kind = rng.random()
        if kind < 0.45:
            data = mutate(rng, rng.choice(corpus[mode]), every)
        elif kind < 0.75:  # a key holder signing garbage (open mode: anyone)
            data = rig.senders[mode].seal_body(item_bodies(rng, packets), RECEIVER)
        elif kind < 0.85:
            data = rng.randbytes(rng.randint(0, 200))
        elif kind < 0.95:  # fresh valid traffic, sometimes replayed
            fresh = rig.valid_datagrams(mode, [rng.choice(packets)])
            corpus[mode] = (corpus[mode] + fresh)[-200:]
            data = fresh[0] if rng.random() < 0.7 else rng.choice(corpus[mode])
        else:
            data = rng.choice(every)
        rig.feed(mode, data, now)
        fed += 1
        if fed % 500 == 0:
            rig.tick(now)
            rig.check()
    rig.tick(now + 10)
    rig.check()
    for envelope in rig.receivers.values():
        assert envelope.reassembler.used == 0, "every partial message expired after the timeout"
    summary = {mode: envelope.drops + Counter({"accepted": envelope.counters["datagrams_accepted"]})
               for mode, envelope in rig.receivers.items()}
    summary["all"] = Counter({"datagrams": rig.fed, "packets_to_nodes": rig.packets_to_nodes})
    return summary


def test_mutated_datagrams_never_raise_and_keep_the_invariants() -> None:
    summary = run_mutations(DEFAULT_COUNT, seed=1)
    assert summary["all"]["datagrams"] == DEFAULT_COUNT
    # The fuzzer reached every stage: forgeries refused, replays refused, garbage refused, valid accepted.
    for reason in ("bad_mac", "replayed", "not_envelope", "envelope_malformed", "fragment_invalid"):
        assert summary["mac"][reason] > 0, (reason, summary["mac"])
    assert summary["aead"]["bad_mac"] > 0 and summary["open"]["accepted"] > 0
    assert summary["all"]["packets_to_nodes"] > DEFAULT_COUNT // 10


@pytest.mark.slow
def test_a_million_mutated_datagrams() -> None:
    summary = run_mutations(1_000_000, seed=2)
    for mode, counts in sorted(summary.items()):
        print(f"\n{mode}: " + ", ".join(f"{key}={value}" for key, value in sorted(counts.items())))
    assert summary["all"]["datagrams"] == 1_000_000


RIG = Rig()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=1500), mode=st.sampled_from(sorted(CONFIGS)))
def test_arbitrary_bytes(data: bytes, mode: str) -> None:
    RIG.feed(mode, data, 1.0)
    RIG.check()


fragment_items = st.builds(
    lambda message, index, count, total, piece: FRAGMENT_ITEM.pack(ITEM_FRAGMENT, message, index, count, total,
                                                                   len(piece)) + piece,
    st.integers(0, 3), st.integers(0, 70), st.sampled_from([0, 1, 2, 3, 64, 65535]),
    st.one_of(st.integers(0, 5000), st.integers(0, 2**32 - 1)), st.binary(max_size=1300))
packet_items = st.builds(lambda packet: PACKET_ITEM.pack(ITEM_PACKET, len(packet)) + packet,
                         st.one_of(st.binary(max_size=300), st.sampled_from(sample_packets())))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(st.one_of(fragment_items, packet_items, st.binary(max_size=20)), min_size=1, max_size=5),
       mode=st.sampled_from(["mac", "aead"]), now=st.floats(0, 100))
def test_well_signed_garbage_from_a_key_holder(items: list[bytes], mode: str, now: float) -> None:
    RIG.feed(mode, RIG.senders[mode].seal_body(b"".join(items), RECEIVER), now)
    RIG.check()
