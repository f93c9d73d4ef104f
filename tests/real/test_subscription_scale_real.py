"""A site with tens of thousands of device subscriptions (issue 36's "Done when"): 30,000 distinct filters on one
broker of a real 3-broker line with the default configuration, one publication to each from another broker,
counted at the subscriber; no neighbour ever declared down; an idle link carries under 1 KB/s.

It runs `suites.bench.subscriptions` once, on real Mosquitto brokers and wrappers (docs/benchmarks.md,
"Subscription scale", has the figures at 100,000 beside the bridge chain)."""

from __future__ import annotations

from pathlib import Path

import pytest

from suites.bench.setups import Setup, SetupSpec
from suites.bench.subscriptions import run_case

from federation_util import next_first_address

pytestmark = pytest.mark.broker

FILTERS = 30000
IDLE_SECONDS = 30.0
MAX_IDLE_BYTES_PER_LINK = 1024.0


def test_thirty_thousand_device_filters_are_all_served_and_idle_links_stay_quiet(tmp_path: Path) -> None:
    subnet = int(next_first_address().split(".")[2])
    setup = Setup(SetupSpec("federation", 3), tmp_path, subnet)
    setup.start()
    try:
        result = run_case(setup, "exact", FILTERS, IDLE_SECONDS, seed=1)
    finally:
        setup.stop()
    assert not result.problems, result.problems
    assert result.swept == FILTERS, f"{FILTERS - result.swept} of {FILTERS} publications never arrived: {result}"
    assert result.converged_seconds is not None, f"no probe round arrived whole: {result}"
    assert result.neighbours_down == 0, f"a wrapper declared a neighbour down: {result}"
    assert result.control_bytes_per_link_per_second is not None
    assert result.control_bytes_per_link_per_second < MAX_IDLE_BYTES_PER_LINK, result
    # The 30,000 are federated as one covering filter (docs/protocol.md, "Aggregation").
    assert result.federated["raw"] == FILTERS and result.federated["effective"] == 1, result.federated
