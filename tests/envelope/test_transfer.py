"""Bulk transfers between envelopes in memory: loss, reordering, duplicates, memory caps, fairness.

A small network (`Link`) moves sealed datagrams between envelopes with a seeded RNG for loss, reordering and
duplication; time is virtual and jumps to the next timer when nothing moves.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import pytest

from federation.envelope.config import EnvelopeConfig
from federation.envelope.datagrams import MESSAGE_REASONS, Envelope
from federation.envelope.transfer import DATAGRAM_COST
from federation.protocol.types import Address

A = Address("10.0.0.1", 10500)
B = Address("10.0.0.2", 10500)
C = Address("10.0.0.3", 10500)
KEY = bytes(range(32))
MIB = 1024 * 1024


def config(**overrides: object) -> EnvelopeConfig:
    values: dict[str, object] = {"keys": (KEY,), "max_packet": 17 * MIB, "bulk_threshold": 65536,
                                 "transfer_memory": 40 * MIB, "receive_window": 256 * 1024}
    values.update(overrides)
    return EnvelopeConfig(**values)  # type: ignore[arg-type]


@dataclass
class Link:
    """Envelopes by address, and the datagrams in flight between them, lost, reordered and repeated by a seeded
    RNG; `buffer` bytes (with the kernel's cost per datagram) at most queued per receiver, the rest dropped."""

    envelopes: dict[Address, Envelope]
    rng: random.Random = field(default_factory=lambda: random.Random(1))
    loss: float = 0.0
    reorder: float = 0.0
    duplicate: float = 0.0
    buffer: int = 1 << 40
    now: float = 0.0
    delivered: dict[Address, list[bytes]] = field(default_factory=dict)
    overflowed: int = 0
    sent: int = 0

    def step(self) -> bool:
        """Every envelope sends what it has; each receiver reads its queue; True if anything moved."""
        queues: dict[Address, list[tuple[bytes, Address]]] = {address: [] for address in self.envelopes}
        for address in sorted(self.envelopes, key=str):
            for data, to in self.envelopes[address].datagrams_to_send(self.now):
                self.sent += 1
                if self.rng.random() < self.loss:
                    continue
                copies = 2 if self.rng.random() < self.duplicate else 1
                queues[to].extend([(data, address)] * copies)
        moved = False
        for to, queue in queues.items():
            if self.reorder:
                for i in range(len(queue) - 1):
                    if self.rng.random() < self.reorder:
                        queue[i], queue[i + 1] = queue[i + 1], queue[i]
            held = 0
            for data, source in queue:
                held += len(data) + DATAGRAM_COST
                if held > self.buffer:
                    self.overflowed += 1
                    continue
                moved = True
                self.delivered.setdefault(to, []).extend(self.envelopes[to].receive_datagram(data, source, self.now))
        return moved

    def run(self, until: float = 120.0, tick: float = 0.001) -> None:
        """Steps until quiet, then jumps to the next timer, until nothing is left or `until`. Transfer timers due
        while datagrams move fire too, as the daemon's do (a sender whose first datagrams were refused, while
        another sender keeps the link busy, recovers by its retransmission timer)."""
        while self.now < until:
            while self.now < until and self.step():
                self.now += tick
                for envelope in self.envelopes.values():
                    deadline = envelope.transfer_timer()
                    if deadline is not None and deadline <= self.now:
                        envelope.handle_timer(self.now)
            timers = [t for e in self.envelopes.values() for t in (e.transfer_timer(), e.get_timer()) if t is not None]
            if not timers:
                return
            if min(timers) >= until:  # the next timer is past the run: stop here, the time where it was asked
                self.now = max(self.now, until)
                return
            self.now = max(self.now + tick, min(timers))
            for envelope in self.envelopes.values():
                envelope.handle_timer(self.now)


def acquainted(link: Link, *addresses: Address) -> None:
    """Each envelope of `addresses` has heard the others' epochs, as neighbours' have (their hellos): no first
    datagram refused (`receiver_epoch`), no transfer waiting for its timer because of it."""
    for one in addresses:
        for other in addresses:
            if one != other:
                link.envelopes[one].send(b"hello", other)
    for _ in range(3):
        link.step()
        link.now += 0.001
    for address in addresses:
        link.delivered.pop(address, None)


def transfer_drops(envelope: Envelope) -> dict[str, int]:
    """The drops that give up a packet or a transfer (a first datagram to a peer may be refused for other reasons
    that the transfer's retransmission recovers from)."""
    return {reason: count for reason, count in envelope.drops.items() if reason in MESSAGE_REASONS}


def envelopes(*addresses: Address, **overrides: object) -> dict[Address, Envelope]:
    return {address: Envelope(address, 1, config(**overrides)) for address in addresses}


@pytest.mark.parametrize("size", [65537, MIB, 16 * MIB])
def test_a_large_packet_crosses_whole_without_loss(size: int) -> None:
    link = Link(envelopes(A, B))
    packet = os.urandom(size)
    link.envelopes[A].send(packet, B)
    link.run()
    assert link.delivered[B] == [packet]
    receiver = link.envelopes[B]
    assert transfer_drops(receiver) == {} and transfer_drops(link.envelopes[A]) == {}
    assert receiver.counters["packets_reassembled"] == 1
    assert receiver.transfers is not None and receiver.transfers.used == 0
    sender = link.envelopes[A].transfers
    assert sender is not None and sender.queued_bytes == 0 and not sender.outgoing


@pytest.mark.parametrize("seed", range(4))
def test_loss_reordering_and_duplicates_resend_only_what_was_lost(seed: int) -> None:
    link = Link(envelopes(A, B), random.Random(seed), loss=0.1, reorder=0.2, duplicate=0.05)
    packets = [os.urandom(MIB), os.urandom(300_000), b"small"]
    for packet in packets:
        link.envelopes[A].send(packet, B)
    link.run()
    assert sorted(link.delivered[B]) == sorted(packets)
    transfers = link.envelopes[A].transfers
    assert transfers is not None
    fragments = transfers.counters["transfer_fragments_sent"]
    needed = sum(-(-len(p) // transfers.fragment_size) for p in packets[:2])
    assert fragments < needed * 1.6, f"{fragments} fragments sent for {needed}: more than the losses explain"
    assert transfers.counters["transfer_fragments_resent"] > 0


@pytest.mark.parametrize("mode", ["open", "aead"])
def test_transfers_work_in_every_envelope_mode(mode: str) -> None:
    keys = {"open": {"keys": ()}, "aead": {"encryption": "chacha20-poly1305"}}[mode]
    link = Link(envelopes(A, B, **keys), random.Random(5), loss=0.05)
    packet = os.urandom(MIB)
    link.envelopes[A].send(packet, B)
    link.run()
    assert link.delivered[B] == [packet]
    assert link.envelopes[B].mode == mode


def test_the_window_keeps_bursts_within_the_receivers_buffer() -> None:
    """A receiver whose buffer holds 256 KiB: the sender never overflows it (the window is the pacing)."""
    link = Link(envelopes(A, B), buffer=300 * 1024)
    packet = os.urandom(4 * MIB)
    link.envelopes[A].send(packet, B)
    link.run()
    assert link.delivered[B] == [packet]
    assert link.overflowed == 0


def test_a_sender_repeating_a_packet_joins_the_transfer_or_skips_a_delivered_one() -> None:
    link = Link(envelopes(A, B))
    packet = os.urandom(MIB)
    sender = link.envelopes[A]
    sender.send(packet, B)
    link.step()
    sender.send(packet, B)  # the node's retransmission while the transfer runs
    link.run()
    sender.send(packet, B, link.now)  # and after it was delivered
    link.run()
    assert link.delivered[B] == [packet]
    assert sender.transfers is not None
    assert sender.transfers.counters["transfers_joined"] == 1
    assert sender.transfers.counters["transfers_repeat_skipped"] == 1
    link.now += 31.0
    sender.send(packet, B, link.now)  # after repeat_hold: whole again (the acknowledgement may have been lost)
    link.run(until=link.now + 60)
    assert link.delivered[B] == [packet, packet]


def test_memory_is_capped_and_a_deferred_transfer_goes_when_there_is_room() -> None:
    link = Link({**envelopes(A, B), **envelopes(C, transfer_memory=12 * MIB, max_packet=9 * MIB)})
    first, second = os.urandom(8 * MIB), os.urandom(8 * MIB + 1)
    third = os.urandom(8 * MIB + 2)
    link.envelopes[A].send(first, C)
    link.envelopes[B].send(second, C)
    link.envelopes[A].send(third, C)
    peak = 0
    while link.now < 60 and len(link.delivered.get(C, [])) < 3:
        link.step()
        transfers = link.envelopes[C].transfers
        assert transfers is not None
        peak = max(peak, transfers.used)
        assert transfers.used <= transfers.config.memory
        link.now += 0.001
        for envelope in link.envelopes.values():
            envelope.handle_timer(link.now)
    assert sorted(link.delivered[C]) == sorted([first, second, third])
    assert 8 * MIB < peak <= 12 * MIB  # one at a time: the other waits (a window of 0) and goes after it
    assert link.envelopes[C].transfers is not None and link.envelopes[C].transfers.counters["transfers_deferred"]


def test_a_flooding_sender_does_not_starve_another() -> None:
    """A sends four transfers at once; B's one is admitted beside them (fair share), not after all of A's. B and C
    know each other's epochs first, as neighbours do (their hellos): a first datagram to a peer not heard yet is
    refused (`receiver_epoch`) and its transfer waits for its retransmission timer."""
    link = Link({**envelopes(A, B), **envelopes(C, transfer_memory=12 * MIB, max_packet=5 * MIB)})
    for one, other_one in ((B, C), (C, B), (A, C), (C, A)):
        link.envelopes[one].send(b"hello", other_one)
    link.run(until=0.005)
    flood = [os.urandom(4 * MIB + i) for i in range(4)]
    for packet in flood:
        link.envelopes[A].send(packet, C)
    link.run(until=0.01)
    other = os.urandom(4 * MIB + 99)
    link.envelopes[B].send(other, C)
    link.run()
    received = [packet for packet in link.delivered[C] if packet != b"hello"]
    assert sorted(received) == sorted([*flood, other])
    assert received.index(other) < 3, "B's transfer waited for all of A's"


def test_a_receiver_that_restarts_mid_transfer_gets_it_whole_from_its_new_life() -> None:
    link = Link(envelopes(A, B))
    packet = os.urandom(2 * MIB)
    link.envelopes[A].send(packet, B)
    for _ in range(5):
        link.step()
        link.now += 0.001
    link.envelopes[B] = Envelope(B, 2, config())
    link.run()
    assert link.delivered[B] == [packet]


def test_a_sender_gives_up_a_transfer_nobody_answers() -> None:
    sender = Envelope(A, 1, config(transfer_timeout=5.0))
    sender.send(os.urandom(MIB), B)
    now = 0.0
    while now < 10.0:
        sender.datagrams_to_send(now)
        deadline = sender.transfer_timer()
        if deadline is None:
            break
        now = deadline
        sender.handle_timer(now)
    assert transfer_drops(sender) == {"transfer_failed": 1}
    assert sender.transfers is not None and sender.transfers.queued_bytes == 0


def test_a_fragment_above_max_packet_is_refused_and_its_sender_told() -> None:
    link = Link({A: Envelope(A, 1, config()), B: Envelope(B, 1, config(max_packet=MIB))})
    link.envelopes[A].send(os.urandom(2 * MIB), B)
    link.run()
    assert link.envelopes[B].drops["transfer_invalid"] >= 1
    assert transfer_drops(link.envelopes[A]) == {"transfer_failed": 1}
    assert B not in link.delivered or link.delivered[B] == []


def test_the_receiver_charges_the_memory_it_really_holds() -> None:
    import tracemalloc

    receiver = Envelope(B, 1, config())
    sender = Envelope(A, 1, config())
    sender.set_peer_epoch(B, receiver.epoch)
    sender.send(os.urandom(4 * MIB), B)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for data, _ in sender.datagrams_to_send(0.0)[:3]:
        receiver.receive_datagram(data, A, 0.0)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert receiver.transfers is not None
    charged = receiver.transfers.used
    assert charged > 4 * MIB and abs(charged - held) < 64 * 1024, (charged, held)


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_two_nodes_federate_16_mib_through_lossy_envelopes(qos: int) -> None:
    """Two protocol nodes behind envelopes built from the default settings (bulk transfers above 64 KiB, 1400-byte
    datagrams), every datagram lost with probability 5%: the 16 MiB publication is injected once, whole, and the
    node's retransmissions of the QoS 1/2 copy join or skip the transfer instead of starting it again."""
    from federation.protocol.node import Node
    from federation.protocol.settings import Settings

    settings = Settings(hello_interval=0.2, dead_intervals=10)
    nodes = {address: Node(address, [other], 1, random.Random(str(address)), settings, vid=index)
             for index, (address, other) in enumerate(((A, B), (B, A)), start=1)}
    pair = {address: Envelope(address, 1, EnvelopeConfig.from_settings(node.settings, (KEY,)))
            for address, node in nodes.items()}
    rng = random.Random(qos)
    injected: list[tuple[str, bytes]] = []

    def pump(now: float) -> None:
        for _ in range(50):
            moved = False
            for address, node in nodes.items():
                for data, to in node.packets_to_send():
                    pair[address].send(data, to, now)
                for datagram, to in pair[address].datagrams_to_send(now):
                    moved = True
                    if rng.random() < 0.05:
                        continue
                    for packet in pair[to].receive_datagram(datagram, address, now):
                        nodes[to].receive_packet(packet, address, now)
            for injection in nodes[B].injections_to_make():
                injected.append((injection.topic, injection.payload))
                if injection.qos:
                    nodes[B].injection_done(injection.publication, now)
            if not moved:
                return

    now = 0.0
    for node in nodes.values():
        node.start(now)
    nodes[B].local_subscribe("client", "big/#", 2, now)
    while now < 5.0:
        now += 0.01
        for node in nodes.values():
            node.handle_timer(now)
        pump(now)
    payload = os.urandom(16 * MIB)
    nodes[A].local_publish("big/blob", payload, qos, False, None, now)
    deadline = now + 60.0
    while now < deadline and not injected:
        now += 0.01
        for address, node in nodes.items():
            node.handle_timer(now)
            pair[address].handle_timer(now)
        pump(now)
    assert injected == [("big/blob", payload)]
    sender = pair[A].transfers
    assert sender is not None
    assert sender.counters["transfers_started"] == 1, sender.counters
    assert sender.counters["transfer_fragments_resent"] > 0


def test_a_packet_that_fits_one_datagram_is_never_a_transfer() -> None:
    """bulk_threshold below a datagram's size: what fits one datagram still goes whole, in one step."""
    sender, receiver = Envelope(A, 1, config(max_datagram=65507, bulk_threshold=1000)), Envelope(B, 1, config())
    sender.set_peer_epoch(B, receiver.epoch)
    packet = os.urandom(5000)
    sender.send(packet, B)
    datagrams = sender.datagrams_to_send(0.0)
    assert len(datagrams) == 1
    assert receiver.receive_datagram(datagrams[0][0], A, 0.0) == [packet]
    assert sender.transfers is not None and not sender.transfers.outgoing


def test_transfers_to_one_neighbour_follow_each_other_without_a_timeout() -> None:
    """The receiver's DONE goes out as the last fragment arrives (issue 37: it went only when the sender's timer
    sent that fragment again, so every transfer of a flood waited a retransmission timeout: 25 of 100 kB a second
    on loopback)."""
    link = Link(envelopes(A, B))
    acquainted(link, A, B)
    packets = [os.urandom(100_000 + i) for i in range(20)]
    for packet in packets:
        link.envelopes[A].send(packet, B)
    link.run()
    assert link.delivered[B] == packets
    sender = link.envelopes[A].transfers
    assert sender is not None and sender.counters.get("transfer_timeouts", 0) == 0
    assert sender.counters.get("transfer_fragments_resent", 0) == 0


def test_a_transfer_queued_longer_than_the_timeout_is_not_given_up_when_its_turn_comes() -> None:
    """Its wait behind the others is no lack of progress of its own (issue 37: a backlog's transfers were given up
    one after the other the moment each started, `no progress for 30 s`)."""
    link = Link(envelopes(A, B, transfer_timeout=1.0))
    acquainted(link, A, B)
    packets = [os.urandom(MIB + i) for i in range(3)]
    for packet in packets:
        link.envelopes[A].send(packet, B)
    link.buffer = 0  # nothing gets through for 0.9 s: the head waits, the others queue
    link.run(until=0.9)
    link.buffer = 1 << 40
    link.run()
    assert link.delivered[B] == packets
    assert transfer_drops(link.envelopes[A]) == {}
