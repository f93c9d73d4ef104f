"""The benchmark's payload format, output parsing and statistics (no brokers: the default test run)."""

from __future__ import annotations

import math

import pytest

from suites.bench.stats import (
    HEADER_SIZE,
    ParseError,
    Received,
    RunSummary,
    added_per_hop,
    combine_rounds,
    median,
    output_line_size,
    parse_output,
    parse_output_line,
    payload_line,
    percentile,
    probe_line,
    ratio,
    summarize,
)

SENT_NS = 1_795_290_114_799_767_239


def subscriber_line(received_ns: int, payload: bytes) -> bytes:
    """What `mosquitto_sub -F '%U %p'` prints for a payload line (without its own newline)."""
    return b"%d.%09d " % divmod(received_ns, 1_000_000_000) + payload.rstrip(b"\n")


@pytest.mark.parametrize("size", [64, 1024, HEADER_SIZE])
def test_payload_line_has_the_exact_size_and_round_trips(size: int) -> None:
    line = payload_line(42, SENT_NS, size)
    assert len(line) == size + 1 and line.endswith(b"\n") and b"\n" not in line[:-1]
    output = subscriber_line(SENT_NS + 1_500_000, line)
    assert len(output) + 1 == output_line_size(size)
    assert parse_output_line(output) == Received(42, SENT_NS, SENT_NS + 1_500_000)


def test_payload_too_small_is_refused_with_the_minimum() -> None:
    with pytest.raises(ValueError, match=f"at least {HEADER_SIZE} bytes"):
        payload_line(1, SENT_NS, HEADER_SIZE - 1)


def test_probe_lines_have_the_payload_size_and_are_not_measured() -> None:
    line = probe_line(7, 64)
    assert len(line) == 65
    assert parse_output_line(subscriber_line(SENT_NS, line)) is None


@pytest.mark.parametrize("bad", [b"hello world", b"1795290114 0000000001 1 x", b"1795290114.123 00001 2",
                                 b"1795290114.799767239 abc def"])
def test_parse_output_line_rejects_what_is_not_ours(bad: bytes) -> None:
    with pytest.raises(ParseError):
        parse_output_line(bad)


def test_parse_output_counts_bad_lines_and_skips_probes() -> None:
    lines = [subscriber_line(SENT_NS + 10, probe_line(0, 64)),
             subscriber_line(SENT_NS + 20, payload_line(0, SENT_NS, 64)),
             b"1795290114.79976",  # a line cut by the subscriber's exit
             b"",
             subscriber_line(SENT_NS + 30, payload_line(1, SENT_NS, 64)) + b"\n"]
    received, bad = parse_output(lines)
    assert [r.seq for r in received] == [0, 1] and bad == 1


def test_percentile_is_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.9) == 90
    assert percentile(values, 0.99) == 99
    assert percentile(values, 1.0) == 100
    assert percentile(values, 0.0) == 1
    assert percentile([5.0], 0.99) == 5.0
    assert math.isnan(percentile([], 0.5))
    with pytest.raises(ValueError):
        percentile(values, 1.5)


def test_summarize_counts_loss_duplicates_and_strays() -> None:
    ms = 1_000_000
    received = [Received(0, SENT_NS, SENT_NS + 1 * ms), Received(1, SENT_NS, SENT_NS + 2 * ms),
                Received(1, SENT_NS, SENT_NS + 9 * ms),  # a duplicate: latency of the first copy counts
                Received(3, SENT_NS, SENT_NS + 4 * ms),
                Received(99, SENT_NS, SENT_NS + 5 * ms)]  # never sent in this run
    summary = summarize(received, sent=5, first_send_ns=SENT_NS, publish_seconds=0.001)
    assert (summary.delivered, summary.lost, summary.duplicates, summary.unexpected) == (3, 2, 1, 1)
    assert (summary.p50_ms, summary.p99_ms, summary.max_ms) == (2.0, 4.0, 4.0)
    assert summary.rate == pytest.approx(3 / 0.004)  # 3 delivered between the first send and the last arrival
    assert summary.offered_rate == pytest.approx(5000)


def test_summarize_with_nothing_delivered() -> None:
    summary = summarize([], sent=10)
    assert summary.lost == 10 and summary.rate == 0.0 and math.isnan(summary.p50_ms)
    assert math.isnan(summary.wrapper_cpu_per_1000)


def test_cpu_per_thousand_messages() -> None:
    received = [Received(seq, SENT_NS, SENT_NS + 1000) for seq in range(2000)]
    summary = summarize(received, sent=2000, cpu_wrappers_s=0.5, cpu_brokers_s=0.1, cpu_clients_s=0.3,
                        idle_fraction=0.04)
    assert summary.wrapper_cpu_per_1000 == pytest.approx(0.25)
    assert summary.broker_cpu_per_1000 == pytest.approx(0.05)
    assert summary.client_cpu_per_1000 == pytest.approx(0.15)
    assert summary.idle_fraction == 0.04
    assert math.isnan(summarize(received, sent=2000).idle_fraction)  # not measured


def _summary(rate: float, p50: float, lost: int = 0) -> RunSummary:
    return RunSummary(sent=100, delivered=100 - lost, lost=lost, duplicates=0, unexpected=0, rate=rate,
                      p50_ms=p50, p90_ms=p50, p99_ms=p50, max_ms=p50)


def test_combine_rounds_takes_medians_and_sums_counts() -> None:
    combined = combine_rounds([_summary(1000, 1.0), _summary(3000, 9.0, lost=2), _summary(2000, 2.0)])
    assert combined["rounds"] == 3
    assert combined["rate"] == 2000 and combined["p50_ms"] == 2.0
    assert combined["lost"] == 2 and combined["sent"] == 300


def test_median_ignores_nan_and_ratio_guards() -> None:
    assert median([1.0, math.nan, 3.0]) == 2.0
    assert math.isnan(median([math.nan]))
    assert ratio(50.0, 100.0) == 0.5
    assert math.isnan(ratio(1.0, 0.0)) and math.isnan(ratio(math.nan, 1.0))


def test_added_latency_per_hop() -> None:
    assert added_per_hop(0.9, 0.3, 3) == pytest.approx(0.3)
    assert math.isnan(added_per_hop(math.nan, 0.3, 2))
    with pytest.raises(ValueError):
        added_per_hop(1.0, 0.5, 1)


def test_wrapper_drops_sum_every_wrappers_counters_and_the_kernels() -> None:
    """Where a federation run lost messages: each wrapper's drop counters and its kernel receive drops,
    summed by reason from the status documents; a wrapper that did not answer is left out."""
    from types import SimpleNamespace

    from suites.bench.setups import Setup, SetupSpec

    statuses = {
        "n0": {"drops": {"send_backlog_qos0": 2}, "daemon": {"overload": {"kernel_receive_drops": 0}}},
        "n1": {"drops": {"receive_backlog_qos0": 5, "send_backlog_qos0": 1},
               "daemon": {"overload": {"kernel_receive_drops": 7}}},
        "n2": None,
    }
    setup = Setup.__new__(Setup)
    setup.spec = SetupSpec.parse("federation-3")
    setup.brokers = SimpleNamespace(statuses=lambda: statuses)  # type: ignore[assignment]
    assert setup.wrapper_drops() == {"send_backlog_qos0": 3, "receive_backlog_qos0": 5, "kernel_receive": 7}
    setup.spec = SetupSpec.parse("bridge-3")
    assert setup.wrapper_drops() == {}
