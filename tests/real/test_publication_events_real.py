"""Real wrappers whose event logs leave out the per-publication events still deliver everything, once.

Two Mosquitto brokers and their wrappers (the benchmark's `federation-2`
setup, with `--publication-events off`: every event type but the four made
per publication and hop), driven by `mosquitto_pub` and `mosquitto_sub`
through the benchmark's own run: every message must arrive exactly once, and
the event logs must hold the control-plane events and none of the others.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from federation.protocol import events
from suites.bench.runner import Case, run_case
from suites.bench.setups import Setup, SetupSpec

from broker_util import requires_mosquitto
from federation_util import next_first_address

pytestmark = requires_mosquitto


@pytest.mark.parametrize("qos", [0, 1])
def test_without_publication_events_every_message_arrives_once(tmp_path: Path, qos: int) -> None:
    subnet = int(next_first_address().split(".")[2])
    setup = Setup(SetupSpec.parse("federation-2"), tmp_path / "setup", subnet, publication_events=False)
    setup.start()
    try:
        summary = run_case(setup, Case(qos, 64, 500.0, 1000), f"quiet/q{qos}", tmp_path / "runs")
    finally:  # the wrappers stop on SIGTERM and write out their event logs
        setup.stop()
    assert (summary.sent, summary.delivered, summary.lost, summary.duplicates) == (1000, 1000, 0, 0)
    assert summary.wrapper_drops == {}  # the wrappers' own counters agree: nothing dropped anywhere
    for node in setup.brokers.nodes.values():
        kinds = {json.loads(line)["type"] for line in node.event_log.read_text().splitlines()}
        assert kinds >= {events.NODE_STARTED, events.NEIGHBOUR_UP, events.NODE_STOPPED}, kinds
        assert not kinds & events.PER_PUBLICATION, kinds
