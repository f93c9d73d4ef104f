"""The soak (marker `faults_long`, opt-in: `pytest -m faults_long tests/real/test_soak_real.py`): a ring under
QoS 1 and QoS 2 streams of 300 publications/s each for 20 minutes, subscribers on both sides of it (b, and c the
core), a wrapper stopped cleanly and started again every 2 minutes (the core's first: its filters hand over) and
one killed with SIGKILL every 5 (suites/faults/soak.py). Counted at both subscribers: 0 lost, in order,
QoS 2 once; the wrappers' counters agree with those counts (ledger.py). $SOAK_MINUTES shortens it (the faults keep
their period). Replay: `python -m suites.faults soak`. Needs root (nftables for the suite's setup) and
mosquitto.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from federation.harness.processes import find_tool
from suites.faults import report
from suites.faults.soak import SOAK_MINUTES, SOAK_RATE, soak_job, soak_title
from suites.faults.suite import run_job

from broker_util import requires_mosquitto
from federation_util import next_first_address

pytestmark = [pytest.mark.faults_long, requires_mosquitto,
              pytest.mark.skipif(os.geteuid() != 0 or find_tool("nft") is None,
                                 reason="the fault suite needs root and nftables")]

MINUTES = float(os.environ.get("SOAK_MINUTES", str(SOAK_MINUTES)))


def test_a_soak_with_restarts_and_kills_loses_nothing_at_any_subscriber(tmp_path: Path) -> None:
    job = soak_job(tmp_path, next_first_address(), MINUTES)
    [result] = run_job(job, progress=lambda line: None)
    title = soak_title(job.cases[0], SOAK_RATE)
    replay = f"replay: python -m suites.faults soak --minutes {MINUTES:g}; files in {tmp_path}"
    assert result.error is None, f"the soak could not be judged: {result.error}\n{replay}"
    summary = "\n".join([*report.extended_lines([result], {result.case: title}), *report.explain_lines(result),
                         *(f"ledger: {problem}" for problem in result.ledger.get("problems", [])), replay])
    for qos in sorted(result.streams):
        assert result.meets(qos), summary
    assert not result.ledger["problems"], summary
    assert sum(count.acknowledged for count in result.streams.values()) >= 2 * SOAK_RATE * MINUTES * 60 * 0.9, summary
