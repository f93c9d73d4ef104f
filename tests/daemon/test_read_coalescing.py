"""When the broker adapter lets packets gather between read passes (federation.daemon.read_coalescing)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from federation.daemon.broker import BrokerAdapter
from federation.daemon.broker_items import BrokerItem
from federation.daemon.read_coalescing import MIN_PACKETS, MIN_RATE, ReadCoalescing
from suites.bench.hotpath import publish_packet

from mqtt_bytes import adapter_on_socketpair, one_per_publication


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


# ------------------------------------------------------------ the adapter's waits, on a running loop


def _flood(peer: socket.socket, start: int, count: int = 100) -> None:
    peer.sendall(b"".join(publish_packet(f"w/{index}", b"p", 0, 0) for index in range(start, start + count)))


def _run(adapter: BrokerAdapter, seconds: float) -> None:
    loop = adapter._loop
    assert loop is not None
    loop.run_until_complete(asyncio.sleep(seconds))


@pytest.fixture
def watched() -> Iterator[tuple[BrokerAdapter, socket.socket, list[BrokerItem]]]:
    """An adapter on a socket pair, its socket watched by its (never connected) loop as after a connection, with
    waits of 0.5 s from 100 packets a second on: long enough that no loop pass of 0 s ends one, even on a loaded
    machine, and two passes close together are always that fast."""
    items: list[BrokerItem] = []
    with adapter_on_socketpair("coalescing-test", one_per_publication(items)) as (adapter, peer):
        adapter.reading.coalescing = ReadCoalescing(0.5, min_rate=100)
        sock = adapter._watched
        assert sock is not None
        adapter._watch(sock)
        yield adapter, peer, items


def _start_a_wait(adapter: BrokerAdapter, peer: socket.socket, items: list[BrokerItem]) -> None:
    """Two floods read in two passes close together: the second is followed by a wait."""
    for start in (0, 100):
        _flood(peer, start)
        _run(adapter, 0)
        assert len(items) == start + 100
    assert adapter.reading._read_wait is not None and adapter.reading.coalescing.waits == 1


def test_during_a_wait_nothing_is_read_and_after_it_everything(watched) -> None:  # type: ignore[no-untyped-def]
    adapter, peer, items = watched
    _start_a_wait(adapter, peer, items)
    _flood(peer, 200)
    _run(adapter, 0)
    assert len(items) == 200  # the socket is not watched meanwhile
    _run(adapter, 0.6)
    assert [item.topic for item in items] == [f"w/{index}" for index in range(300)]  # type: ignore[attr-defined]
    assert adapter.reading.coalescing.waits >= 2  # the pass after the wait read 100 in 0.5 s: 200 a second


def test_a_pause_ends_the_wait_and_a_resume_reads_at_once(watched) -> None:  # type: ignore[no-untyped-def]
    adapter, peer, items = watched
    _start_a_wait(adapter, peer, items)
    adapter.pause_reading()
    assert adapter.reading._read_wait is None
    _flood(peer, 200)
    _run(adapter, 0.6)
    assert len(items) == 200  # paused: nothing read, and the wait's end did not watch the socket again
    adapter.resume_reading()
    _run(adapter, 0)
    assert len(items) == 300


def test_the_socket_closing_ends_the_wait(watched) -> None:  # type: ignore[no-untyped-def]
    adapter, peer, items = watched
    _start_a_wait(adapter, peer, items)
    sock = adapter._watched
    adapter._on_socket_close(adapter.client, None, sock)
    assert adapter.reading._read_wait is None and adapter._watched is None
    _flood(peer, 200)
    _run(adapter, 0.6)
    assert len(items) == 200


def test_off_no_pass_waits(watched) -> None:  # type: ignore[no-untyped-def]
    adapter, peer, items = watched
    adapter.reading.coalescing = ReadCoalescing(0.0)
    for start in range(0, 500, 100):
        _flood(peer, start)
        _run(adapter, 0)
        assert len(items) == start + 100
    assert adapter.reading._read_wait is None and adapter.reading.coalescing.waits == 0
