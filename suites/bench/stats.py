"""What one benchmark run measured, computed from what the subscriber printed; medians over rounds.

Theory of operation: the publisher writes one line per message into
`mosquitto_pub -l`, and the line is the payload: a sequence number, the
send time in unix nanoseconds and padding to the payload size
(`payload_line`). `mosquitto_sub -F '%U %p'` prints the receive time in unix
nanoseconds before each payload, so the subscriber's output file is the
whole record of a run: which messages arrived, how often, and how long each
took. Probe lines (sent until the path works, before the measured part) have
the same size but start with `PROBE_MARK` and are left out.

Everything here is pure: lines and numbers in, summaries out, so the
statistics are unit-tested without brokers (tests/tools/test_bench_stats.py).
Percentiles use the nearest-rank definition: p99 of 1,000 samples is the
990th smallest, a sample that really occurred.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

PROBE_MARK = b"probe"
"""first bytes of a probe payload"""
SEQ_DIGITS = 10
STAMP_DIGITS = 19
HEADER_SIZE = SEQ_DIGITS + 1 + STAMP_DIGITS + 1
"""bytes of sequence number, space, send time and space that open every measured payload"""
MIN_PAYLOAD = HEADER_SIZE
PAD = b"x"


class ParseError(ValueError):
    """A subscriber output line that is neither a measured message nor a probe."""


def payload_line(seq: int, sent_ns: int, size: int) -> bytes:
    """One measured payload of exactly `size` bytes, newline-terminated for `mosquitto_pub -l`."""
    if size < MIN_PAYLOAD:
        raise ValueError(f"payload size {size} is too small: at least {MIN_PAYLOAD} bytes hold the "
                         f"sequence number and the send time")
    head = b"%0*d %0*d " % (SEQ_DIGITS, seq, STAMP_DIGITS, sent_ns)
    return head + PAD * (size - HEADER_SIZE) + b"\n"


def probe_line(number: int, size: int) -> bytes:
    """A probe payload of `size` bytes (sent until the subscriber sees one; not measured)."""
    head = PROBE_MARK + b" %d " % number
    return head + PAD * max(0, size - len(head)) + b"\n"


def output_line_size(size: int) -> int:
    """Bytes of one `mosquitto_sub -F '%U %p'` line for a payload of `size` bytes (seconds.nanoseconds, space,
    payload, newline), while unix time has 10 digits of seconds."""
    return 10 + 1 + 9 + 1 + size + 1


@dataclass(frozen=True, slots=True)
class Received:
    seq: int
    sent_ns: int
    received_ns: int


def parse_output_line(line: bytes) -> Received | None:
    """One subscriber line: the measured message, or None for a probe. ParseError when it is neither."""
    stamp, _, payload = line.partition(b" ")
    seconds, dot, fraction = stamp.partition(b".")
    if not dot or len(fraction) != 9 or not seconds.isdigit() or not fraction.isdigit():
        raise ParseError(f"no %U receive time at the start of {line[:60]!r}")
    if payload.startswith(PROBE_MARK):
        return None
    fields = payload.split(b" ", 2)
    if len(fields) < 2 or not fields[0].isdigit() or not fields[1].isdigit():
        raise ParseError(f"payload is not '<seq> <sent ns> ...': {payload[:60]!r}")
    return Received(int(fields[0]), int(fields[1]), int(seconds) * 1_000_000_000 + int(fraction))


def parse_output(lines: Iterable[bytes]) -> tuple[list[Received], int]:
    """Every measured message in the subscriber's output, in arrival order, and the number of lines that
    could not be parsed (a line cut by the subscriber's exit)."""
    received: list[Received] = []
    bad = 0
    for raw in lines:
        line = raw.rstrip(b"\n")
        if not line:
            continue
        try:
            parsed = parse_output_line(line)
        except ParseError:
            bad += 1
            continue
        if parsed is not None:
            received.append(parsed)
    return received, bad


def percentile(ordered: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending sequence (`fraction` in [0, 1]); NaN when empty."""
    if not ordered:
        return math.nan
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"percentile fraction {fraction} is outside [0, 1]")
    rank = max(1, math.ceil(fraction * len(ordered)))
    return float(ordered[rank - 1])


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One run: `sent` messages offered, what arrived. Times in milliseconds, rates in messages per second."""

    sent: int
    delivered: int
    """distinct messages received"""
    lost: int
    duplicates: int
    """receptions beyond the first of a message"""
    unexpected: int
    """receptions of sequence numbers never sent (a stale message of another run: a harness bug)"""
    rate: float
    """delivered / (last reception - first send)"""
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    cpu_wrappers_s: float = 0.0
    """CPU seconds of every wrapper process during the run (0 without wrappers)"""
    cpu_brokers_s: float = 0.0
    """CPU seconds of every broker process during the run"""
    cpu_clients_s: float = 0.0
    """CPU seconds of the publishing and the subscribing client (`mosquitto_pub`, `mosquitto_sub`) during the run"""
    idle_fraction: float = math.nan
    """the share of the machine's CPU time left idle during the run: near 0, the run was bound by CPU, and its rate
    by what every process (wrappers, brokers, clients, the kernel's work for them) spends per message"""
    bad_lines: int = 0
    offered_rate: float = math.nan
    """count / seconds the publisher took to write them (below the asked rate when the publisher fell behind)"""
    wrapper_drops: dict[str, int] = field(default_factory=dict)
    """the wrappers' drops during the run by reason, `kernel_receive` for a full UDP receive buffer
    (`Setup.wrapper_drops`); only reasons that counted some"""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def wrapper_cpu_per_1000(self) -> float:
        return 1000.0 * self.cpu_wrappers_s / self.delivered if self.delivered else math.nan

    @property
    def broker_cpu_per_1000(self) -> float:
        return 1000.0 * self.cpu_brokers_s / self.delivered if self.delivered else math.nan

    @property
    def client_cpu_per_1000(self) -> float:
        return 1000.0 * self.cpu_clients_s / self.delivered if self.delivered else math.nan


def summarize(received: Sequence[Received], sent: int, first_send_ns: int | None = None,
              cpu_wrappers_s: float = 0.0, cpu_brokers_s: float = 0.0, bad_lines: int = 0,
              publish_seconds: float = math.nan, cpu_clients_s: float = 0.0,
              idle_fraction: float = math.nan) -> RunSummary:
    """The summary of one run where messages 0..sent-1 were offered.

    Latency is measured on the first reception of each message. The rate is
    distinct deliveries over the time from the first send (`first_send_ns`,
    default: the earliest send stamp received) to the last reception.
    """
    first: dict[int, Received] = {}
    duplicates = unexpected = 0
    for message in received:
        if not 0 <= message.seq < sent:
            unexpected += 1
        elif message.seq in first:
            duplicates += 1
        else:
            first[message.seq] = message
    latencies = sorted((m.received_ns - m.sent_ns) / 1e6 for m in first.values())
    delivered = len(first)
    if delivered:
        start = first_send_ns if first_send_ns is not None else min(m.sent_ns for m in first.values())
        span = (max(m.received_ns for m in first.values()) - start) / 1e9
        rate = delivered / span if span > 0 else math.nan
    else:
        rate = 0.0
    return RunSummary(sent=sent, delivered=delivered, lost=sent - delivered, duplicates=duplicates,
                      unexpected=unexpected, rate=rate, p50_ms=percentile(latencies, 0.50),
                      p90_ms=percentile(latencies, 0.90), p99_ms=percentile(latencies, 0.99),
                      max_ms=latencies[-1] if latencies else math.nan, cpu_wrappers_s=cpu_wrappers_s,
                      cpu_brokers_s=cpu_brokers_s, cpu_clients_s=cpu_clients_s, idle_fraction=idle_fraction,
                      bad_lines=bad_lines, offered_rate=sent / publish_seconds if publish_seconds > 0 else math.nan)


def median(values: Iterable[float]) -> float:
    """The median of the values that are not NaN; NaN if none is."""
    kept = [value for value in values if not math.isnan(value)]
    return statistics.median(kept) if kept else math.nan


MEDIAN_FIELDS = ("rate", "offered_rate", "p50_ms", "p90_ms", "p99_ms", "max_ms", "wrapper_cpu_per_1000",
                 "broker_cpu_per_1000", "client_cpu_per_1000", "idle_fraction")
"""summary fields quoted as the median over rounds"""
TOTAL_FIELDS = ("sent", "lost", "duplicates", "unexpected", "bad_lines")
"""summary fields summed over rounds: one lost message in any round is reported"""


def combine_rounds(rounds: Sequence[RunSummary]) -> dict[str, float]:
    """Medians of the measured figures over rounds, totals of the counts, and the number of rounds."""
    combined: dict[str, float] = {"rounds": float(len(rounds))}
    for name in MEDIAN_FIELDS:
        combined[name] = median(float(getattr(summary, name)) for summary in rounds)
    for name in TOTAL_FIELDS:
        combined[name] = float(sum(getattr(summary, name) for summary in rounds))
    return combined


def ratio(ours: float, theirs: float) -> float:
    """ours / theirs; NaN when either is missing or theirs is 0."""
    if math.isnan(ours) or math.isnan(theirs) or theirs == 0:
        return math.nan
    return ours / theirs


def added_per_hop(chain: float, single: float, brokers: int) -> float:
    """Latency added by each broker-to-broker hop of a chain of `brokers` brokers, over one broker's."""
    if brokers < 2:
        raise ValueError("a chain has at least 2 brokers")
    if math.isnan(chain) or math.isnan(single):
        return math.nan
    return (chain - single) / (brokers - 1)
