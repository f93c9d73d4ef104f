"""QoS 1 under 10% loss on real brokers and wrappers (netns backend; configs/topologies/lossy-qos1-real.yaml).

Four namespaces in a ring, each with its own Mosquitto and wrapper; nftables
drops 10% of the datagrams on every link, both ways, while two
`mosquitto_pub -q 1` clients publish 60 messages each. The expected-delivery
rule puts publications made under loss outside its bound, so the check is
read from the report's counts: every one of the 2 x 120 (publication,
subscriber) pairs delivered to `mosquitto_sub` (`delivered_outside_bound`)
and nothing duplicated. The wrappers' counters must show the loss was real
(retransmissions happened). About 75 s of wall time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from federation.netns import run_scenario, system
from federation.scenario.loader import load_scenario

REASON = system.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

SCENARIO = Path(__file__).resolve().parents[3] / "configs" / "topologies" / "lossy-qos1-real.yaml"


def retransmissions(events: Path) -> int:
    """Sum of the wrappers' `publication_retransmitted` events."""
    total = 0
    for log in sorted((events / "nodes").glob("*/events.jsonl")):
        total += sum(1 for line in log.read_text().splitlines()
                     if json.loads(line).get("type") == "publication_retransmitted")
    return total


def test_qos1_with_10_percent_loss_nothing_lost_nothing_duplicated(tmp_path: Path) -> None:
    events = tmp_path / "run"
    report = run_scenario(load_scenario(SCENARIO), seed=1, events_path=str(events))
    publications = report["publications"]
    print(f"\nsent {publications['sent']}, delivered outside bound {publications['delivered_outside_bound']}, "
          f"duplicates {publications['duplicates']}, retransmissions {retransmissions(events)}")
    # In bound: the 5 before and the 5 after, to both subscribers; outside (under loss): 2 x 120 QoS 1.
    assert publications["sent"] == 130
    assert publications["expected_deliveries"] == 20 and publications["delivered"] == 20 and publications["lost"] == 0
    assert publications["delivered_outside_bound"] == 240
    assert publications["duplicates"] == 0 and publications["unexpected"] == 0
    assert retransmissions(events) > 0
