"""Latency histograms as plain counts (federation/protocol/histogram.py): Prometheus' `le` buckets."""

from __future__ import annotations

import math

import pytest

from federation.protocol.histogram import Histogram


def test_samples_fall_in_the_first_bucket_they_do_not_exceed() -> None:
    histogram = Histogram((0.001, 0.01, 0.1))
    for value in (0.0005, 0.001, 0.002, 0.05, 0.1, 3.0):
        histogram.observe(value)
    assert histogram.cumulative() == [(0.001, 2), (0.01, 3), (0.1, 5), (math.inf, 6)]
    assert histogram.count == 6 and histogram.total == pytest.approx(3.1535)


@pytest.mark.parametrize("bounds", [(), (0.1, 0.01), (0.1, 0.1)])
def test_bounds_must_increase(bounds: tuple[float, ...]) -> None:
    with pytest.raises(ValueError):
        Histogram(bounds)
