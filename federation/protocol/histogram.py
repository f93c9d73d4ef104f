"""Latency histograms kept as plain counts: what a Prometheus histogram exports, without Prometheus.

Theory of operation: a sample falls in the first bucket whose upper bound
it does not exceed (Prometheus' `le`); the exporter (federation/daemon/
metrics.py) reads the cumulative counts, the sum and the count at each
scrape. Counting is one bisection and three additions, cheap enough for
every hello back, and pure (no clock, no I/O), so the protocol node can
keep one per neighbour (`Neighbour.rtt_histogram`) and the daemon one for
its broker's acknowledgements.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""seconds: upper bounds for round trips and acknowledgement delays, from loopback to a slow WAN"""


class Histogram:
    """Counts of samples per bucket of `bounds` (and above the last), their sum and their number."""

    __slots__ = ("bounds", "counts", "total", "count")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"histogram bounds must be increasing and not empty, got {bounds!r}")
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, samples at or below it) per bucket, the last bound infinite (= `count`)."""
        out = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out
