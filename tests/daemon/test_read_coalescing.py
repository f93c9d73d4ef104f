"""When the broker adapter lets packets gather between read passes (federation.daemon.read_coalescing)."""

from __future__ import annotations

from federation.daemon.read_coalescing import MIN_PACKETS, MIN_RATE, ReadCoalescing


def passes(coalescing: ReadCoalescing, rate: float, size: int, count: int, start: float = 0.0) -> list[float]:
    """The waits chosen for `count` passes of `size` packets each, one every `size / rate` seconds (the time the
    broker takes to send them) or when the wait chosen after the previous one ends, whichever is later."""
    waits, now = [], start
    for _ in range(count):
        wait = coalescing.after_pass(now, size, emptied=True)
        waits.append(wait)
        now += max(wait, size / rate)
    return waits


def test_a_fast_broker_gets_a_wait_after_every_pass() -> None:
    coalescing = ReadCoalescing(0.002)
    waits = passes(coalescing, rate=50_000, size=45, count=10)
    assert waits[0] == 0.0  # the first pass has no rate yet
    assert waits[1:] == [0.002] * 9
    assert coalescing.waits == 9


def test_at_full_rate_the_passes_grow_and_keep_waiting() -> None:
    """Each pass reads what came since the previous one began (it takes 0.5 ms): 25 packets, then what the
    first wait gathered, 125, and so on."""
    coalescing, now, last, sizes = ReadCoalescing(0.002), 0.0, -0.0005, []
    for _ in range(6):
        sizes.append(round(50_000 * (now - last)))
        last = now
        now += 0.0005 + coalescing.after_pass(last, sizes[-1], emptied=True)
    assert sizes == [25, 25, 125, 125, 125, 125]
    assert coalescing.waits == 5


def test_the_wait_does_not_feed_itself_below_the_rate() -> None:
    """After a wait a pass is large, but the time it covers is too: at 15,000 a second a pass of 30 packets
    (what 2 ms gather) is not followed by another wait."""
    coalescing = ReadCoalescing(0.002)
    assert coalescing.after_pass(0.0, 40, emptied=True) == 0.0
    assert coalescing.after_pass(0.001, 40, emptied=True) == 0.002  # a burst of 40 in 1 ms: 40,000 a second
    assert coalescing.after_pass(0.003, 30, emptied=True) == 0.0  # 30 in the 2 ms waited: 15,000 a second
    assert coalescing.waits == 1


def test_slow_or_small_passes_never_wait() -> None:
    coalescing = ReadCoalescing(0.002)
    assert passes(coalescing, rate=1_000, size=1, count=50) == [0.0] * 50  # the latency benchmark's rate
    assert passes(coalescing, rate=10_000, size=3, count=50, start=1.0) == [0.0] * 50
    assert passes(coalescing, rate=MIN_RATE * 10, size=MIN_PACKETS - 1, count=50, start=2.0) == [0.0] * 50
    assert coalescing.waits == 0


def test_a_pass_that_stopped_at_its_budget_reads_again_at_once() -> None:
    """More is waiting already: a wait would gather nothing that is not there."""
    coalescing = ReadCoalescing(0.002)
    coalescing.after_pass(0.0, 256, emptied=True)
    assert coalescing.after_pass(0.001, 256, emptied=False) == 0.0
    assert coalescing.after_pass(0.002, 256, emptied=True) == 0.002


def test_zero_seconds_turns_it_off() -> None:
    coalescing = ReadCoalescing(0.0)
    assert passes(coalescing, rate=100_000, size=200, count=20) == [0.0] * 20
    assert coalescing.waits == 0
