"""QoS 0 pacing between neighbours, the `rb` packet (federation.protocol.pacing): busy and ready with hysteresis,
holds that expire, relaying upstream, and the node wiring (in memory, tests/node_harness.py)."""

from __future__ import annotations

import pytest

from federation.protocol import wire
from federation.protocol.pacing import MAX_PACE_HOLD, Pacing
from federation.protocol.types import Address

from node_harness import Harness, address

A, B = Address("10.0.0.1", 10500), Address("10.0.0.2", 10500)


def recorder() -> tuple[Pacing, list[tuple[Address, float]]]:
    sent: list[tuple[Address, float]] = []
    return Pacing(lambda neighbour, hold: sent.append((neighbour, hold)), high=100, low=10, hold=0.2), sent


def test_busy_from_high_until_low_tells_each_source_once_per_half_hold_then_ready() -> None:
    pacing, sent = recorder()
    pacing.on_receive_backlog(99, [A], 0.0)
    assert not pacing.busy and sent == []
    pacing.on_receive_backlog(100, [A, B], 0.0)
    assert pacing.busy and sent == [(A, 0.2), (B, 0.2)]
    pacing.on_receive_backlog(150, [A], 0.05)  # told 0.05 s ago: not again yet
    pacing.on_receive_backlog(50, [A], 0.11)  # under high but not yet low: still busy, told again
    assert sent[2:] == [(A, 0.2)]
    pacing.on_receive_backlog(11, (), 0.12)
    assert pacing.busy
    pacing.on_receive_backlog(10, (), 0.13)
    assert not pacing.busy and sorted(sent[3:]) == [(A, 0.0), (B, 0.0)] and not pacing.told
    assert pacing.sent == 5
    pacing.on_receive_backlog(50, [A], 0.2)  # below high again: nothing to say
    assert len(sent) == 5


def test_a_hold_paces_until_it_ends_or_the_neighbour_is_ready() -> None:
    pacing, _ = recorder()
    assert pacing.paced(0.0) is None
    pacing.on_receiver_busy(A, 0.2, 1.0)
    pacing.on_receiver_busy(B, 0.5, 1.1)
    assert pacing.paced(1.15) == pytest.approx(1.6)
    pacing.on_receiver_busy(B, 0.0, 1.19)  # ready
    assert pacing.paced(1.19) == pytest.approx(1.2)
    assert pacing.paced(1.2001) is None and not pacing.paced_until  # A's hold ended
    pacing.on_receiver_busy(A, 1e9, 2.0)
    assert pacing.paced(2.0) == pytest.approx(2.0 + MAX_PACE_HOLD)  # a peer cannot hold us for long
    pacing.forget(A)
    assert pacing.paced(2.0) is None
    assert pacing.received == 4


def test_relayed_pace_is_released_with_a_ready_when_the_last_hold_ends() -> None:
    pacing, sent = recorder()
    pacing.on_receiver_busy(B, 0.2, 0.0)
    pacing.relay(A, 0.0)
    assert sent == [(A, 0.2)]
    pacing.relay(A, 0.05)
    assert len(sent) == 1
    assert pacing.paced(0.3) is None  # B's hold is over: A hears at once that it may read again
    assert sent[1:] == [(A, 0.0)]


def test_the_pacing_neighbour_going_down_releases_those_we_relayed_to() -> None:
    pacing, sent = recorder()
    pacing.on_receiver_busy(B, 0.2, 0.0)
    pacing.relay(A, 0.0)
    pacing.forget(B)
    assert sent == [(A, 0.2), (A, 0.0)] and pacing.paced(0.0) is None


def test_not_ready_while_still_busy_or_paced() -> None:
    pacing, sent = recorder()
    pacing.on_receive_backlog(100, [A], 0.0)
    pacing.on_receiver_busy(B, 0.2, 0.0)
    pacing.on_receiver_busy(B, 0.0, 0.1)  # B is ready, but we are still busy
    assert sent == [(A, 0.2)]
    pacing.on_receiver_busy(B, 0.2, 0.1)
    pacing.on_receive_backlog(0, (), 0.15)  # no longer busy, but B still paces us (we relay to A)
    assert sent == [(A, 0.2)]
    pacing.on_receiver_busy(B, 0.0, 0.16)
    assert sent == [(A, 0.2), (A, 0.0)]


def test_marks_must_make_sense() -> None:
    with pytest.raises(ValueError, match="low 10, high 10"):
        Pacing(lambda neighbour, hold: None, high=10, low=10)


def tell(harness: Harness, source: int, target: int, hold: float) -> None:
    """`source` sends `rb` with `hold` to `target`, and the network delivers it"""
    harness.nodes[source].outbox.send(wire.RECEIVER_BUSY, wire.ReceiverBusy(hold), [address(target)])
    harness.flush(source)
    harness.run(harness.now + 0.01)


def test_a_node_paced_downstream_relays_the_pace_to_the_wrapper_the_copies_come_from() -> None:
    """Line 0 - 1 - 2, subscriber at 2, publisher at 0: when 2 says `rb` to 1, the next copy 1 forwards to 2
    makes 1 tell 0, which is then paced (its embedder stops reading its broker)."""
    harness = Harness([(0, 1), (1, 2)])
    harness.do(2, "local_subscribe", "sub", "a/#", 0)
    harness.run(8.0)
    harness.do(0, "local_publish", "a/b", b"x", 0, False, None)
    harness.run(harness.now + 0.5)
    assert [(i, injection.topic) for i, injection in harness.delivered] == [(2, "a/b")]
    middle, first = harness.nodes[1], harness.nodes[0]
    tell(harness, 2, 1, 0.2)
    assert middle.pacing.paced(harness.now) is not None and first.pacing.paced(harness.now) is None
    harness.do(0, "local_publish", "a/b", b"y", 0, False, None)
    harness.run(harness.now + 0.01)
    assert first.pacing.paced(harness.now) is not None
    assert middle.status(harness.now)["pacing"]["told"] == [str(address(0))]
    assert first.received_by_type[wire.RECEIVER_BUSY] == 1
    tell(harness, 2, 1, 0.0)  # 2 is ready: 1 tells 0 at once
    assert middle.pacing.paced(harness.now) is None and first.pacing.paced(harness.now) is None
    assert first.received_by_type[wire.RECEIVER_BUSY] == 2
    assert len(harness.delivered) == 2  # pacing never drops a copy


def test_a_copy_forwarded_elsewhere_does_not_relay_the_pace() -> None:
    """Star 1 - {0, 2, 3}: 3 paces 1, but 0's copies go to 2 only, so 0 is not paced."""
    harness = Harness([(0, 1), (1, 2), (1, 3)])
    harness.do(2, "local_subscribe", "sub", "a/#", 0)
    harness.run(8.0)
    tell(harness, 3, 1, 0.2)
    harness.do(0, "local_publish", "a/b", b"x", 0, False, None)
    harness.run(harness.now + 0.05)
    assert [(i, injection.topic) for i, injection in harness.delivered] == [(2, "a/b")]
    assert harness.nodes[1].pacing.paced(harness.now) is not None
    assert harness.nodes[0].pacing.paced(harness.now) is None and harness.nodes[0].pacing.received == 0


def test_a_local_publication_to_the_pacing_neighbour_does_not_make_the_next_transit_copy_relay() -> None:
    """Star 1 - {0, 2, 3}, `a/#` subscribed at 2, `b/#` at 3; 3 paces 1. 1's own publication on `b/x` goes
    to 3; the copy 1 then forwards from 0 goes to 2 only, so 0 is not paced."""
    harness = Harness([(0, 1), (1, 2), (1, 3)])
    harness.do(2, "local_subscribe", "sub", "a/#", 0)
    harness.do(3, "local_subscribe", "sub", "b/#", 0)
    harness.run(8.0)
    tell(harness, 3, 1, 0.2)
    harness.do(1, "local_publish", "b/x", b"own", 0, False, None)
    harness.do(0, "local_publish", "a/y", b"transit", 0, False, None)
    harness.run(harness.now + 0.05)
    assert sorted((i, injection.topic) for i, injection in harness.delivered) == [(2, "a/y"), (3, "b/x")]
    assert harness.nodes[0].pacing.received == 0
