"""Replay across a restart of the receiver: every datagram names the receiver's epoch, so a capture of an
earlier life is refused although the new life's replay windows are empty.

Envelopes in memory, wired by hand; a restart is a new Envelope at the same address with a greater epoch
(as `envelope_epoch` gives), which is all the daemon's restart keeps of the envelope.
"""

from __future__ import annotations

import struct

import pytest

from federation.envelope.config import EnvelopeConfig, EnvelopeConfigError
from federation.envelope.datagrams import ITEM_PACKET, MAX_EPOCH, PACKET_ITEM, Envelope, envelope_epoch
from federation.protocol import wire
from federation.protocol.types import Address

A = Address("10.0.0.1", 10500)
B = Address("10.0.0.2", 10500)
C = Address("10.0.0.3", 10500)
KEY = bytes(range(32))
MODES = {"open": EnvelopeConfig(), "mac": EnvelopeConfig(keys=(KEY,)),
         "aead": EnvelopeConfig(keys=(KEY,), encryption="chacha20-poly1305")}


def send(sender: Envelope, to: Address, *packets: bytes) -> list[bytes]:
    for packet in packets:
        sender.send(packet, to)
    return [data for data, _ in sender.datagrams_to_send(0.0)]


def deliver(receiver: Envelope, source: Address, datagrams: list[bytes]) -> list[bytes]:
    return [packet for data in datagrams for packet in receiver.receive_datagram(data, source, 0.0)]


def exchange(first: Envelope, second: Envelope) -> None:
    """A hello, its answer and the next hello: after them each knows the other's epoch and has had a datagram
    stamped with its own from the other (which binds the address). The first hello, refused, goes again with
    the next one (the answer taught its epoch). The drop of the first hello is forgotten."""
    deliver(second, first.address, send(first, second.address, b"hello from first"))
    assert deliver(first, second.address, send(second, first.address, b"answer")) == [b"answer"]
    assert deliver(second, first.address, send(first, second.address, b"hello again")) == [
        b"hello from first", b"hello again"]
    first.drops.clear()
    second.drops.clear()


@pytest.mark.parametrize("mode", ["mac", "aead"])
def test_a_capture_is_refused_before_and_after_the_receiver_restarts(mode: str) -> None:
    config = MODES[mode]
    sender = Envelope(A, envelope_epoch(1000, 1000.2), config)
    receiver = Envelope(B, envelope_epoch(1000, 1000.1), config)
    exchange(sender, receiver)
    captured = send(sender, B, b"publication 1") + send(sender, B, b"publication 2", b"publication 3")
    assert deliver(receiver, A, captured) == [b"publication 1", b"publication 2", b"publication 3"]
    # Replayed to the same life: the replay window.
    assert deliver(receiver, A, captured) == []
    assert receiver.drops == {"replayed": 2}

    # The receiver restarts: a new envelope epoch, empty replay windows.
    restarted = Envelope(B, envelope_epoch(1001, 1030.0), config)
    assert restarted.epoch > receiver.epoch
    assert deliver(restarted, A, captured) == []
    assert restarted.drops == {"receiver_epoch": 2}
    assert deliver(restarted, A, captured) == []  # and again: the window remembers them now
    assert restarted.drops == {"receiver_epoch": 2, "replayed": 2}

    # The sender still stamps the old life until it hears the new one: refused too. The restarted
    # receiver's first datagram (its hello) teaches the sender its new epoch; it is even accepted, as the
    # replayed capture taught the receiver the sender's (current) epoch: all a replay can teach.
    assert deliver(restarted, A, send(sender, B, b"sent before it heard the restart")) == []
    assert deliver(sender, B, send(restarted, A, b"hello from the new life")) == [b"hello from the new life"]
    assert deliver(restarted, A, send(sender, B, b"after")) == [b"after"]
    assert deliver(sender, B, send(restarted, A, b"answer")) == [b"answer"]
    assert deliver(restarted, A, captured) == []  # the capture never comes back


def test_two_fresh_wrappers_anchor_after_one_datagram_each_way() -> None:
    first, second = Envelope(A, 11, MODES["mac"]), Envelope(B, 22, MODES["mac"])
    assert deliver(second, A, send(first, B, b"hello 1")) == []  # stamped 0: A has not heard B yet
    assert second.drops == {"receiver_epoch": 1}
    assert deliver(first, B, send(second, A, b"hello back")) == [b"hello back"]  # B learnt A's epoch from it
    assert deliver(second, A, send(first, B, b"hello 2")) == [b"hello 1", b"hello 2"]  # the refused one again
    assert second.status()["peers"] == 1 and first.status()["peers"] == 1


def test_a_restarted_sender_is_followed_at_once_by_its_bound_address() -> None:
    receiver = Envelope(B, 5, MODES["mac"])
    sender = Envelope(A, 100, MODES["mac"])
    exchange(sender, receiver)
    reborn = Envelope(A, 200, MODES["mac"])  # the sender restarted: it knows nothing of B
    assert deliver(receiver, A, send(reborn, B, b"first of the new life")) == []  # teaches epoch 200
    assert deliver(reborn, B, send(receiver, A, b"to the new life")) == [b"to the new life"]
    assert deliver(sender, B, send(receiver, A, b"to the old life")) == []  # the old life is not addressed
    assert sender.drops == {"receiver_epoch": 1}


def test_a_datagram_meant_for_one_wrapper_is_refused_by_another() -> None:
    sender = Envelope(A, 1, MODES["mac"])
    first, second = Envelope(B, 2, MODES["mac"]), Envelope(C, 3, MODES["mac"])
    exchange(sender, first)
    exchange(sender, second)
    meant_for_first = send(sender, B, b"for B only")
    assert deliver(second, A, meant_for_first) == []
    assert second.drops == {"receiver_epoch": 1}
    assert deliver(first, A, meant_for_first) == [b"for B only"]


def test_an_authentic_datagram_resent_from_another_address_does_not_move_a_bound_stamp() -> None:
    """X's datagram to a third wrapper, re-sent to us with Y's source address: we learn nothing about Y."""
    us, x, y, third = (Envelope(Address(f"10.0.1.{i}", 10500), 10 + i, MODES["mac"]) for i in range(4))
    for peer in (x, y, third):
        exchange(peer, us)
    exchange(x, third)
    meant_for_third = send(x, third.address, b"x to third")
    assert deliver(us, y.address, meant_for_third) == []  # refused: it names the third's epoch
    assert deliver(y, us.address, send(us, y.address, b"still stamped with y's epoch")) == [
        b"still stamped with y's epoch"]


def test_a_replayed_hello_of_an_earlier_life_of_the_sender_is_harmless() -> None:
    """After the receiver restarted, a capture of the sender's earlier life teaches an older epoch at most:
    nothing is delivered, and the sender's next datagram puts the stamp right for good."""
    receiver = Envelope(B, 5, MODES["mac"])
    old_life = Envelope(A, 100, MODES["mac"])
    exchange(old_life, receiver)
    old_hello = send(old_life, B, b"hello of the old life")
    current = Envelope(A, 200, MODES["mac"])
    exchange(current, receiver)
    restarted = Envelope(B, 6, MODES["mac"])
    assert deliver(restarted, A, old_hello) == []
    assert restarted.drops == {"receiver_epoch": 1}
    # The restarted receiver stamps the old life's epoch on what it sends to A: refused there, but it
    # teaches A the receiver's new epoch, so A's next datagram is accepted and teaches the current life.
    assert deliver(current, B, send(restarted, A, b"stamped with the old life")) == []
    assert deliver(restarted, A, send(current, B, b"hello of the current life")) == [b"hello of the current life"]
    assert deliver(current, B, send(restarted, A, b"right again")) == [b"right again"]
    assert deliver(restarted, A, old_hello) == []
    assert restarted.drops["stale_epoch"] == 1  # the older life is refused by the window from now on


def test_open_frames_carry_the_stamp_too_but_anyone_can_write_it() -> None:
    receiver = Envelope(B, 9, MODES["open"])
    forger = Envelope(A, 1, MODES["open"])
    forger.set_peer_epoch(B, 9)  # read off any of the receiver's datagrams
    assert deliver(receiver, A, send(forger, B, b"forged")) == [b"forged"]


def test_epoch_zero_means_unknown_and_is_no_envelope_epoch() -> None:
    with pytest.raises(EnvelopeConfigError, match=f"1 to {MAX_EPOCH}"):
        Envelope(A, 0)
    with pytest.raises(EnvelopeConfigError, match=f"1 to {MAX_EPOCH}"):
        Envelope(A, MAX_EPOCH + 1)
    assert envelope_epoch(0, 0.0) == 1
    assert Envelope(A, MAX_EPOCH).epoch == MAX_EPOCH


def test_the_envelope_epoch_range_is_the_microseconds_of_the_node_epoch_range() -> None:
    """A node's epoch never passes wire.MAX_EPOCH, so its envelope epoch never saturates: it grows at every
    restart up to the last boot epoch of the range."""
    assert MAX_EPOCH == (wire.MAX_EPOCH + 1) * 1_000_000 - 1 < 2**64
    assert envelope_epoch(wire.MAX_EPOCH, 0.0) < MAX_EPOCH
    assert envelope_epoch(wire.MAX_EPOCH - 1, 0.0) < envelope_epoch(wire.MAX_EPOCH, 0.0)
    assert envelope_epoch(wire.MAX_EPOCH, 2.0**40 + 1) == MAX_EPOCH  # a clock past the year 36,812 saturates


@pytest.mark.parametrize(("epoch", "seq", "receiver_epoch", "accepted"), [
    (1, 1, 0, True), (MAX_EPOCH, 2**64 - 1, MAX_EPOCH, True),  # the edges of the ranges
    (0, 1, 0, False), (MAX_EPOCH + 1, 1, 0, False), (2**64 - 1, 1, 0, False),  # sender epoch
    (1, 0, 0, False),  # seq 0: sequence numbers start at 1
    (1, 1, MAX_EPOCH + 1, False), (1, 1, 2**64 - 1, False),  # receiver epoch
])
def test_every_header_number_is_range_checked(epoch: int, seq: int, receiver_epoch: int, accepted: bool) -> None:
    """Out of range: refused as `envelope_malformed` before the tag is checked or anything is learned."""
    receiver = Envelope(B, receiver_epoch if 0 < receiver_epoch <= MAX_EPOCH else 5, MODES["open"])
    sender = Envelope(A, 1, MODES["open"])
    data = bytearray(sender.seal_body(PACKET_ITEM.pack(ITEM_PACKET, 5) + b"hello"))
    struct.pack_into(">QQQ", data, 7, epoch, seq, receiver_epoch)  # after magic, version, kind and key id
    packets = receiver.receive_datagram(bytes(data), A, 0.0)
    if accepted:
        assert receiver.drops.get("envelope_malformed", 0) == 0 and len(receiver.peers) == 1
    else:
        assert packets == [] and receiver.drops == {"envelope_malformed": 1} and len(receiver.peers) == 0


def test_a_sender_named_as_the_destination_decides_the_stamp_whatever_else_comes_from_that_address() -> None:
    """A key holder sending from a neighbour's address under a name of its own (anchored: it knows our epoch)
    does not change what we stamp for the neighbour: the wrapper named after an address speaks for it."""
    us, neighbour = Envelope(B, 5, MODES["mac"]), Envelope(A, 50, MODES["mac"])
    exchange(neighbour, us)
    holder = Envelope(Address("holder.example", 10500), 1, MODES["mac"])
    holder.set_peer_epoch(B, us.epoch)
    assert deliver(us, A, send(holder, B, b"from the neighbour's address")) == [b"from the neighbour's address"]
    assert deliver(neighbour, B, send(us, A, b"still for the neighbour")) == [b"still for the neighbour"]


def test_behind_nat_the_stamp_follows_the_name_bound_to_the_address() -> None:
    """A wrapper that names itself otherwise than the address its datagrams come from (NAT)."""
    natted = Envelope(Address("10.9.9.9", 10500), 30, MODES["mac"])  # seen by us from A
    us = Envelope(B, 5, MODES["mac"])
    assert deliver(us, A, send(natted, B, b"hello")) == []  # not known yet: refused, but heard from A
    assert deliver(natted, B, send(us, A, b"answer")) == [b"answer"]
    assert deliver(us, A, send(natted, B, b"anchored")) == [b"hello", b"anchored"]  # binds A to 10.9.9.9:10500
    reborn = Envelope(Address("10.9.9.9", 10500), 31, MODES["mac"])  # it restarts
    assert deliver(us, A, send(reborn, B, b"first of the new life")) == []
    assert deliver(reborn, B, send(us, A, b"to the new life")) == [b"to the new life"]


def test_what_was_refused_for_want_of_the_epoch_goes_again_once_when_it_is_learnt() -> None:
    first = Envelope(A, 11, MODES["mac"])
    second = Envelope(B, 22, EnvelopeConfig(keys=(KEY,), resend_window=2.0))
    assert deliver(second, A, send(first, B, b"old hello")) == []  # at 0 s
    first.send(b"fresh hello", B, now=1.5)
    assert deliver(second, A, [d for d, _ in first.datagrams_to_send(1.5)]) == []
    answer = send(second, A, b"answer")
    packets = [p for d in answer for p in first.receive_datagram(d, B, 2.5)]
    assert packets == [b"answer"]
    resent = [d for d, _ in first.datagrams_to_send(2.5)]  # at 2.5 s: the one of 1.5 s, not the one of 0 s
    assert deliver(second, A, resent) == [b"fresh hello"]
    assert first.counters["packets_resent"] == 1
    assert deliver(first, B, send(second, A, b"again")) == [b"again"]
    assert first.datagrams_to_send(3.0) == []  # once only


def test_nothing_sent_with_a_stale_stamp_is_sent_again() -> None:
    """A peer that restarted: what went to its earlier life was maybe taken, so it is not repeated."""
    sender, receiver = Envelope(A, 1, MODES["mac"]), Envelope(B, 2, MODES["mac"])
    exchange(sender, receiver)
    resent = sender.counters["packets_resent"]  # the first hello of the exchange
    restarted = Envelope(B, 3, MODES["mac"])
    assert deliver(restarted, A, send(sender, B, b"to the old life")) == []
    assert deliver(sender, B, send(restarted, A, b"hello")) == [b"hello"]  # it learnt A from that refusal
    assert sender.datagrams_to_send(0.0) == [] and sender.counters["packets_resent"] == resent


def test_a_peer_that_only_answers_announces_its_epoch_so_the_first_hello_gets_through() -> None:
    """A wrapper whose neighbour is configured on one side only: the other side speaks only when spoken to (its
    node answers hellos), so it would never teach its epoch. Its envelope answers the refused hello with an epoch
    announcement; the hello goes again, stamped right, and is delivered."""
    initiator, answerer = Envelope(A, 11, MODES["mac"]), Envelope(B, 22, MODES["mac"])
    hello = send(initiator, B, b"hello")
    assert deliver(answerer, A, hello) == []  # refused: stamped 0
    (announcement,) = answerer.datagrams_to_send(0.0)  # nothing queued by its node: the envelope announces
    assert announcement[1] == A and answerer.counters["epoch_announcements_sent"] == 1
    assert initiator.receive_datagram(announcement[0], B, 0.0) == []  # carries no packet
    assert initiator.counters["epoch_announcements_received"] == 1
    assert deliver(answerer, A, [d for d, _ in initiator.datagrams_to_send(0.0)]) == [b"hello"]  # sent again


def test_epoch_announcements_are_a_trickle_whatever_is_replayed() -> None:
    """Replays of authentic datagrams from an earlier life, as fast as an attacker likes: one announcement per
    address and second, each smaller than what provoked it."""
    sender, receiver = Envelope(A, 1, MODES["mac"]), Envelope(B, 2, MODES["mac"])
    exchange(sender, receiver)
    captured = [d for _ in range(50) for d in send(sender, B, b"captured")]
    restarted = Envelope(B, 3, MODES["mac"])
    announcements = []
    for index, datagram in enumerate(captured):
        now = index * 0.05  # 50 replays in 2.5 s
        restarted.receive_datagram(datagram, A, now)
        announcements += restarted.datagrams_to_send(now)
    assert restarted.drops["receiver_epoch"] == 50
    assert len(announcements) == 3  # at 0, 1.0 and 2.0 s
    assert all(len(data) <= min(len(d) for d in captured) for data, _ in announcements)
