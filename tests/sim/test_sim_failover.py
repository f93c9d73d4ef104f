"""The failover bench (suites/bench/sim_failover.py) on a small overlay: both designs run the same trial;
every parent link carries a copy (no loss when one of two parents fails), the tree loses QoS 0 only for the
moments before the standby parent carries, and QoS 1 nothing."""

from __future__ import annotations

from suites.bench.sim_failover import DESIGNS, FailoverOptions, format_table, run


def test_one_link_failure_both_designs() -> None:
    results = run(FailoverOptions(nodes=24, trials=1, subscribers=6, rate=10.0, after=4.0, drain=6.0, seed=3))
    assert len(results["trials"]) == 1
    every, tree = (results["summary"][design] for design in DESIGNS)
    assert every["qos0_lost_total"] == 0 and every["qos1_lost_total"] == 0
    assert tree["qos1_lost_total"] == 0 and tree["qos0_outage_seconds"]["max"] < 1.6
    assert tree["copies_per_publication_before"]["mean"] < every["copies_per_publication_before"]["mean"]
    assert every["violations"] == tree["violations"] == 0
    assert "tree + standby" in format_table(results)
