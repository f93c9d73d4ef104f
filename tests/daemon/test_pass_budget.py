"""How many packets a read pass of the broker connection takes (federation/daemon/broker_reading.py `PassBudget`):
about `PASS_SECONDS` of work, so a burst of costly log lines does not hold the loop from its hellos."""

from __future__ import annotations

import time

from federation.daemon.broker_items import BrokerItem, LogLine
from federation.daemon.broker_reading import (
    BUDGET_GROWTH,
    MAX_PACKETS_PER_WAKEUP,
    MIN_PACKETS_PER_WAKEUP,
    PASS_SECONDS,
    PassBudget,
)
from suites.bench.hotpath import publish_packet

from mqtt_bytes import adapter_on_socketpair, read_all


def test_cheap_packets_keep_the_largest_budget() -> None:
    budget = PassBudget()
    budget.after_pass(256, 0.002)  # publications: 8 µs each
    assert budget.packets == MAX_PACKETS_PER_WAKEUP


def test_costly_packets_get_a_pass_of_about_pass_seconds_and_cheap_ones_win_it_back() -> None:
    budget = PassBudget()
    budget.after_pass(256, 0.256)  # 1 ms each: 256 held the loop a quarter of a second
    assert budget.packets == int(PASS_SECONDS / 0.001)
    budget.after_pass(20, 0.020)
    assert budget.packets == 20
    grown = []
    while budget.packets < MAX_PACKETS_PER_WAKEUP:  # cheap again: back to the largest over a few passes
        budget.after_pass(budget.packets, 0.001)
        grown.append(budget.packets)
    assert grown[0] == int(20 * BUDGET_GROWTH) + 1 and len(grown) < 15
    assert budget.smallest_seen == 20


def test_one_packet_a_pass_when_one_takes_the_whole_pass_and_quick_small_passes_say_nothing() -> None:
    budget = PassBudget()
    budget.after_pass(256, 10.0)  # 40 ms a subscription: a node whose cost grows with its table
    assert budget.packets == MIN_PACKETS_PER_WAKEUP == 1  # however slow: one a pass, hellos answered between
    budget.after_pass(1, 0.05)
    assert budget.packets == 1
    budget = PassBudget()
    budget.after_pass(3, 0.0001)  # a quick pass of a few packets is mostly the pass's fixed cost
    assert budget.packets == MAX_PACKETS_PER_WAKEUP
    budget.after_pass(3, 0.06)  # but three that took three passes' time do tell
    assert budget.packets == 1
    budget.after_pass(100, 0.0)
    assert budget.packets == 1


def test_a_burst_of_costly_log_lines_is_read_in_short_passes_every_line_in_order() -> None:
    """The adapter's read side with a consumer that spends 1 ms per log line (a loaded wrapper learning a
    subscription from each): after the first pass the passes stay near `PASS_SECONDS`, and nothing is lost."""
    items: list[BrokerItem] = []

    def slow(item: BrokerItem) -> None:
        items.append(item)
        until = time.perf_counter() + 0.001
        while time.perf_counter() < until:
            pass

    lines = [publish_packet("$SYS/broker/log/M/subscribe", f"1700000000: c 1 dev/{i}/cmd".encode(), 1, i + 1)
             for i in range(600)]
    with adapter_on_socketpair("budget-test", slow) as (adapter, peer):
        peer.sendall(b"".join(lines))
        reading = adapter.reading
        sizes = []
        while len(items) < len(lines):
            before = len(items)
            reading.on_readable()
            sizes.append(len(items) - before)
            assert sizes[-1] > 0, "a pass read nothing"
        read_all(peer)
    assert sizes[0] == MAX_PACKETS_PER_WAKEUP  # nothing known yet of their cost
    assert all(size <= PASS_SECONDS / 0.001 for size in sizes[1:]), sizes
    assert [item.payload for item in items if isinstance(item, LogLine)] == \
        [f"1700000000: c 1 dev/{i}/cmd".encode() for i in range(600)]
