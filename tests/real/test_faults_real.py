"""The fault suite of issue 19 (item 7) on real processes: does the federation keep MQTT's delivery contract?

Numbered QoS 1 and QoS 2 streams (100 publications/s each, at the same time, each on its own topic) run
from a paho publisher that records its acknowledgements, on broker a, to a persistent mosquitto_sub on
broker c, through a federated line a-b-c and ring a-b-c-d, while one fault happens and heals; what the
subscribers printed is judged (suites/faults, docs/guarantees.md). The same faults run on a
Mosquitto bridge chain a->b->c (`cleansession false`), the reference, printed beside the federation
(`pytest -s` is not needed: the table is printed in the terminal summary, tests/summary_tables.py).

Every case asserts the issue's target, with no mark left: 0 lost (acknowledged to the publisher, never
received), 0 out of order, and for QoS 2 0 duplicated (QoS 1 may repeat, as MQTT allows). The bridge chain is
reported and sanity-checked: every case ran and carried both streams until its fault (what it lost under the
fault is measured, not asserted: its QoS 2 bridges never recover from a disturbance in Mosquitto 2.0.11, and a
killed subscriber broker loses the QoS 1 publications its bridge delivers before the subscriber is back in some
runs; docs/guarantees.md).

The whole suite runs once per session (`suite` fixture), every setup in a worker process of its own and
the 30 s partition beside the rest, plus the QoS 2 burst at Mosquitto's default in-flight limit, and issue 37's
cases beside them (`suite.extended_jobs`): subscribers on both sides of a 20 s partition whose far side holds the
core, the core's wrapper stopped cleanly under load, two wrappers killed at once on a five-ring, a full state
directory on each side; then, alone, a flood of 2,000 publications of 100 kB at 500/s beside the plain streams. Each of
those is counted at every subscribing node and asserts the same target, and that the wrappers' counters agree
with what the subscribers received (`ledger.py`). Needs root (nftables, mount) and mosquitto; uses
$FEDERATION_TEST_SUBNET's next eleven /24s.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from federation.harness.processes import find_tool
from suites.faults import report
from suites.faults.burst import BURST_COUNT, burst_case, burst_job, rendered_inflight
from suites.faults.catalogue import EXTENDED, EXTENDED_FAULTS, FAULTS, SUITE
from suites.faults.cli import BURST_TITLE, write_results
from suites.faults.counting import StreamCount
from suites.faults.runner import CaseResult, Timing
from suites.faults.suite import BULK_CASE, Job, extended_jobs, merge, run_jobs, suite_jobs, suite_plans

from broker_util import REORDERS_AFTER_HELD_ACKS, requires_mosquitto
from federation_util import next_first_address
from summary_tables import print_summary_table

pytestmark = [requires_mosquitto,
              pytest.mark.skipif(os.geteuid() != 0 or find_tool("nft") is None,
                                 reason="the fault suite needs root and nftables (partitions are nftables rules)")]

FEDERATIONS = ("federation-line", "federation-ring")
BRIDGE = "bridge-line"

@dataclass
class Suite:
    results: dict[str, list[CaseResult]]
    burst: Job
    out: Path
    extended: dict[str, CaseResult]
    """issue 37's cases by name"""

    def case(self, setup: str, case: str) -> CaseResult:
        found = [result for result in self.results.get(setup, []) if result.case == case]
        assert found, f"{setup} did not run {case}; results are in {self.out}"
        return found[0]

    def extended_case(self, case: str) -> CaseResult:
        assert case in self.extended, f"issue 37's case {case} did not run; results are in {self.out}"
        return self.extended[case]


def subnets() -> Iterator[int]:
    """The /24s of $FEDERATION_TEST_SUBNET's sequence, as numbers."""
    while True:
        yield int(next_first_address().split(".")[2])


@pytest.fixture(scope="module", name="suite")
def suite_fixture(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Suite:
    out = tmp_path_factory.mktemp("faults")
    numbers = subnets()
    timing = Timing()
    jobs = suite_jobs([*FEDERATIONS, BRIDGE], suite_plans(), out, numbers, timing)
    burst = burst_job(out / "burst", f"127.0.{next(numbers)}.10")
    more = extended_jobs(out / "extended", numbers, timing, cases=EXTENDED_CASES)
    flood = extended_jobs(out / "extended", numbers, timing, cases=[BULK_CASE])
    progress: list[str] = []
    outcomes = run_jobs([*jobs, burst, *more], progress=progress.append)
    # The flood alone, after the rest: it measures throughput, fairness and memory, which eight federations
    # side by side on a couple of CPUs would measure instead.
    outcomes += run_jobs(flood, progress=progress.append)
    more += flood
    results = merge([*jobs, burst], outcomes[:len(jobs) + 1])
    extended = {result.case: result for cases in outcomes[len(jobs) + 1:] for result in cases}
    titles = {fault.name: fault.title for fault in SUITE} | {burst_case(BURST_COUNT):
                                                              BURST_TITLE.format(count=BURST_COUNT)}
    write_results(out, results, titles, timing, 0.0, ["(tests/real/test_faults_real.py)"])
    write_results(out / "extended", merge(more, outcomes[len(jobs) + 1:]), extended_titles(), timing, 0.0,
                  ["(tests/real/test_faults_real.py, issue 37's cases)"])
    # The reference is reported, whatever the verdicts.
    print_summary_table(request.config, "fault suite (issue 19): federation beside the Mosquitto bridge chain",
                        f"{report.text_table(results, titles)}\n{report.LEGEND}\n"
                        f"results, logs and client outputs: {out}")
    print_summary_table(request.config, "fault suite (issue 37): each stream counted at every subscribing node",
                        "\n".join(report.extended_lines(list(extended.values()), extended_titles())))
    return Suite(results, burst, out, extended)


EXTENDED_CASES = [fault.name for _topology, fault in EXTENDED]


def extended_titles() -> dict[str, str]:
    return {fault.name: fault.title for _topology, fault in EXTENDED} | {
        BULK_CASE: "2,000 publications of 100 kB at 500/s (QoS 1) beside the two 100/s streams"}


def case_params() -> list[Any]:
    params = []
    for setup in FEDERATIONS:
        for fault in SUITE:
            for qos in (1, 2):
                params.append(pytest.param(setup, fault.name, qos, id=f"{setup}-{fault.name}-q{qos}"))
    return params


def describe(result: CaseResult, qos: int) -> str:
    count = result.streams[qos]
    lines = [f"{result.setup} / {result.case} ({FAULTS[result.case].title}), QoS {qos}: "
             f"{report.cell(count, qos)}; lost first {list(count.lost_sample[:10])}, runs "
             f"{list(count.lost_ranges[:5])}", report.drain_note(result), *report.explain_lines(result)]
    return "\n".join(line for line in lines if line)


@pytest.mark.parametrize(("setup", "fault", "qos"), case_params())
def test_the_federation_keeps_the_contract_under_the_fault(suite: Suite, setup: str, fault: str, qos: int) -> None:
    result = suite.case(setup, fault)
    assert result.error is None, f"{setup} / {fault} could not be judged: {result.error}"
    assert result.streams[qos].meets(qos), describe(result, qos)


@pytest.mark.parametrize("fault", [fault.name for fault in SUITE])
def test_the_bridge_reference_delivers(suite: Suite, fault: str) -> None:
    """A sanity check of the reference, not a verdict on it: the chain ran the case and carried both streams
    until the fault (what it did under the fault is reported in the table)."""
    result = suite.case(BRIDGE, fault)
    assert result.error is None, f"the bridge chain could not be judged under {fault}: {result.error}"
    before_fault = int(Timing().rate * Timing().lead * 0.8)  # published well before the fault
    for qos, count in sorted(result.streams.items()):
        first_lost = count.lost_ranges[0][0] if count.lost_ranges else None
        assert count.received >= before_fault and (first_lost is None or first_lost > before_fault), \
            f"the bridge chain did not carry QoS {qos} before the fault {fault}: {report.cell(count, qos)}, " \
            f"lost from {first_lost}"


def test_the_burst_keeps_mosquittos_default_inflight_limit(suite: Suite) -> None:
    configs = rendered_inflight(suite.burst)
    assert len(configs) == 3 and not any(configs.values()), f"max_inflight_* lines in the burst's brokers: {configs}"


def test_a_qos2_burst_arrives_complete_and_in_order_at_the_default_inflight_limit(suite: Suite) -> None:
    result = suite.case("federation-line", burst_case(BURST_COUNT))
    assert result.error is None, f"the burst could not be judged: {result.error}"
    count = result.streams[2]
    assert count.acknowledged == BURST_COUNT
    assert count.meets(2), describe(result, 2)


def test_every_case_ran(suite: Suite) -> None:
    expected = {setup: [fault.name for fault in SUITE] for setup in (*FEDERATIONS, BRIDGE)}
    ran = {setup: [result.case for result in suite.results.get(setup, []) if result.case in FAULTS]
           for setup in expected}
    assert ran == expected
    assert not [(result.setup, result.case, result.error) for cases in suite.results.values() for result in cases
                if result.error], "cases that could not be judged"



# ---------------------------------------------------------------- issue 37's cases


def describe_extended(result: CaseResult) -> str:
    lines = [f"{result.setup} / {result.case}: " + "; ".join(report.extended_lines([result], extended_titles()))]
    lines += report.explain_lines(result)
    lines += [f"ledger: {problem}" for problem in result.ledger.get("problems", [])]
    return "\n".join(lines)


def counts_at_every_node(result: CaseResult, qos: int) -> list[StreamCount]:
    return [result.streams[qos], *(counts[qos] for counts in result.more.values() if qos in counts)]


@pytest.mark.parametrize("case", EXTENDED_CASES)
@pytest.mark.parametrize("qos", [1, 2])
def test_issue37_case_loses_nothing_at_any_subscribing_node(suite: Suite, case: str, qos: int) -> None:
    """0 lost, QoS 2 once, nothing unexpected, at the subscriber's node and at every other subscribing node (issue
    37's "Done when"; the order below)."""
    result = suite.extended_case(case)
    assert result.error is None, f"{case} could not be judged: {result.error}"
    assert all(count.lost == 0 and count.unexpected == 0 and (qos < 2 or count.duplicated == 0)
               for count in counts_at_every_node(result, qos)), describe_extended(result)


BROKER_ORDER = ("Mosquitto before 2.0.13 sends the publisher-side wrapper some publications ahead of those it "
                "queued while the wrapper held its intake (eclipse/mosquitto#2306, test_broker_order_real.py), and "
                "the wrapper numbers them in the order read (2 in 11 runs of this case; docs/guarantees.md)")


@pytest.mark.parametrize("case", [pytest.param(case, marks=pytest.mark.xfail(strict=False, reason=BROKER_ORDER))
                                  if case == "disk-full-publisher" and REORDERS_AFTER_HELD_ACKS else case
                                  for case in EXTENDED_CASES])
@pytest.mark.parametrize("qos", [1, 2])
def test_issue37_case_keeps_the_order_at_every_subscribing_node(suite: Suite, case: str, qos: int) -> None:
    """Every stream in the origin's order at every subscribing node (a split's far side after the heal included)."""
    result = suite.extended_case(case)
    assert result.error is None, f"{case} could not be judged: {result.error}"
    assert all(count.ordered for count in counts_at_every_node(result, qos)), describe_extended(result)


@pytest.mark.parametrize("case", [*EXTENDED_CASES, BULK_CASE])
def test_issue37_case_counters_agree_with_the_subscribers(suite: Suite, case: str) -> None:
    """The wrappers' events and counters against what the subscribers received (ledger.py): no loss without a
    drop and its event, delivered at least what arrived, the origin's custody accounted for."""
    result = suite.extended_case(case)
    assert result.error is None, f"{case} could not be judged: {result.error}"
    assert result.ledger and not result.ledger["problems"], describe_extended(result)


def test_the_far_side_of_a_split_catches_up_after_the_heal(suite: Suite) -> None:
    """The far side's subscriber gets what was published during the split, in order (above), while new
    publications keep coming: every one missing at the healing arrives. Its rate is measured, not asserted (it
    depends on the machine: 700-2,400 a second alone, 40-390 beside the rest of the suite and other runs;
    docs/guarantees.md); a drain as slow as issue 37 found (17 a second) misses the drain's deadline and fails the
    cases above."""
    result = suite.extended_case("split-both-sides")
    caught = {key: value for key, value in result.catch_up.items() if key.startswith("c/")}
    assert set(caught) == {"c/1", "c/2"}, result.catch_up
    for key, value in caught.items():
        assert value["arrived"] == value["backlog"] >= 1000, (key, value)


@pytest.mark.parametrize("case", ["disk-full-publisher", "disk-full-subscriber"])
def test_a_full_disk_is_said_once_and_makes_the_wrapper_not_ready_until_it_has_room(suite: Suite,
                                                                                    case: str) -> None:
    """One ERROR line and /readyz not ready with the reason while the state directory is full, one line when it
    takes writes again, no traceback; the wrapper is then restarted and nothing arrives twice at QoS 2 (the cases
    above)."""
    result = suite.extended_case(case)
    fault = EXTENDED_FAULTS[case]
    node = {"publisher": "a", "subscriber": "c"}[fault.role or ""]
    during = result.explain["status_during"][case][node]
    assert during is not None and during["ready"]["ready"] is False, during
    assert any("cannot write" in reason and "state directory" in reason for reason in during["ready"]["reasons"])
    assert during["storage"]["ok"] is False and during["storage"]["write_failures"] >= 1
    after = result.explain["status_after"][node]  # restarted since (catalogue.FOLLOW_UPS)
    assert after["storage"]["ok"] is True and after["ready"]["ready"], after
    log = (suite.out / "extended" / "federation-line-disk" / "nodes" / node / "wrapper.log").read_text()
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len([line for line in errors if "cannot write" in line]) == 1, errors
    assert "Traceback" not in log
    assert len([line for line in log.splitlines() if "can be written again" in line]) == 1


STARVED_SLACK = 2.0
"""seconds a plain stream's p99 latency may exceed the flood's (noise: the two are measured on different clients)"""


def test_a_bulk_flood_arrives_whole_beside_plain_streams_that_keep_flowing_with_bounded_memory(suite: Suite) -> None:
    result = suite.extended_case(BULK_CASE)
    assert result.error is None, f"the bulk flood could not be judged: {result.error}"
    assert result.bulk is not None and result.bulk.acknowledged == 2000
    assert result.bulk.meets(1) and all(result.meets(qos) for qos in (1, 2)), describe_extended(result)
    # Never starved: a plain publication is no later than the large ones published beside it. Not a bound in
    # seconds: on a machine that cannot carry the flood at 500/s every stream queues in the publisher's broker
    # alike (15 s at p99 beside another engineer's benchmark, 0.02-0.2 s alone); a link that served the
    # transfers first would leave the plain streams far behind them (before da986bd: stalled for minutes).
    bulk = result.latency["bulk"]["p99"]
    for qos in ("1", "2"):
        assert result.latency[qos]["p99"] <= bulk + STARVED_SLACK, result.latency
    for peaks in result.memory.values():  # the flood is 200 MB: no wrapper keeps most of it
        assert peaks["wrapper_mib"] is not None and peaks["wrapper_mib"] < 200, result.memory
