"""The fault suite's pure parts: the verdicts, the nftables rules, the schedules, the jobs, the table."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from suites.faults import report
from suites.faults.catalogue import FAULTS, LINE, NEIGHBOUR_DOWN_SECONDS, RING, SUITE, Fault, describe
from suites.faults.counting import Arrival, OutputError, count_stream, parse_line, parse_output, runs
from suites.faults.packet_filter import Cut, render_table
from suites.faults.runner import CaseResult, Scheduled, Timing, explain_streams
from suites.faults.schedule import RandomCase, random_case
from suites.faults.setups import inflight_settings, inflight_template
from suites.faults.suite import CasePlan, Job, merge, suite_jobs, suite_plans

# ------------------------------------------------------------ counting


def test_a_clean_stream_meets_the_target() -> None:
    count = count_stream(5, [1, 2, 3, 4, 5], [1, 2, 3, 4, 5])
    assert (count.lost, count.duplicated, count.inversions, count.late, count.unexpected) == (0, 0, 0, 0, 0)
    assert count.meets(1) and count.meets(2)


def test_lost_means_acknowledged_and_never_received() -> None:
    count = count_stream(6, [1, 2, 3, 4, 5], [1, 2, 5, 6])
    assert count.lost == 2  # 3 and 4; 6 was never acknowledged, so missing it would not count
    assert count.lost_sample == (3, 4) and count.lost_ranges == ((3, 4),)
    assert count.unacknowledged == 1
    assert not count.meets(1)


def test_duplicates_fail_qos2_only() -> None:
    count = count_stream(3, [1, 2, 3], [1, 2, 2, 3, 3, 3])
    assert count.duplicated == 3
    assert count.meets(1) and not count.meets(2)


def test_order_counts_first_arrivals_only() -> None:
    # 2 arrives after 3: one adjacent inversion, one late publication; the copy of 1 at the end is a duplicate,
    # not a second inversion.
    count = count_stream(4, [1, 2, 3, 4], [1, 3, 2, 4, 1])
    assert (count.inversions, count.late, count.duplicated) == (1, 1, 1)
    # 5 first, then 1..4: one adjacent inversion, but four publications arrived after a later one.
    count = count_stream(5, range(1, 6), [5, 1, 2, 3, 4])
    assert (count.inversions, count.late) == (1, 4)
    assert not count.meets(1)


def test_the_client_librarys_swap_after_a_broker_restart_is_told_apart() -> None:
    # What the ring and then the line printed (docs/guarantees.md): 200 died in the killed broker's PUBREC-PUBREL
    # window, and libmosquitto printed it in the place of 401, which the restarted broker sent under the same id.
    printed = [*range(1, 200), *range(201, 401), 200, *range(402, 801)]
    plain = count_stream(800, range(1, 801), printed)
    assert (plain.lost, plain.late, plain.swapped) == (1, 1, ())
    assert not plain.meets(2)
    count = count_stream(800, range(1, 801), printed, broker_restarted=True)
    assert count.swapped == ((401, 200),)
    assert (count.lost, count.late, count.inversions, count.duplicated) == (0, 0, 0, 0)
    assert count.meets(2)
    assert "swapped by the client 1" in report.cell(count, 2)


def test_only_that_mark_is_a_swap() -> None:
    everything = range(1, 11)
    # 5 missing and nothing in its place: a loss, restart or not.
    assert count_stream(10, everything, [1, 2, 3, 4, 6, 7, 8, 9, 10], broker_restarted=True).lost == 1
    # 5 and 6 missing, 2 printed again where 5 was: the first print counts, so 2 is a duplicate and 5, 6 are lost.
    count = count_stream(10, everything, [1, 2, 3, 4, 2, 7, 8, 9, 10], broker_restarted=True)
    assert (count.lost, count.swapped) == (2, ())
    # 3 printed late in 5's place, but 6 is missing too: not the mark (one message for one); 5 and 6 are lost.
    count = count_stream(10, everything, [1, 2, 4, 3, 7, 8, 9, 10], broker_restarted=True)
    assert count.swapped == () and count.lost == 2
    # A newer message in the place of a missing one is no swap (the client holds only older ones).
    count = count_stream(10, everything, [1, 2, 3, 4, 9, 6, 7, 8, 10], broker_restarted=True)
    assert count.swapped == () and count.lost == 1


def test_strays_are_unexpected() -> None:
    count = count_stream(2, [1, 2], [1, 2, 99])
    assert count.unexpected == 1 and not count.meets(1)


def test_subscriber_output_lines() -> None:
    assert parse_line(b"1795564011.833000000 17") == Arrival(17, 1795564011.833)
    assert parse_line(b"1795564011.833000000 probe 3") is None
    with pytest.raises(OutputError):
        parse_line(b"1795564011.833000000 hello")
    with pytest.raises(OutputError):
        parse_line(b"17")
    # The last piece, without its newline, is a line being written: left out.
    assert [arrival.seq for arrival in parse_output(b"1.0 1\n2.0 probe 1\n3.0 2\n4.0 3")] == [1, 2]


def test_runs() -> None:
    assert runs([7, 1, 2, 3, 9, 10]) == [(1, 3), (7, 7), (9, 10)]
    assert runs([]) == []


# ------------------------------------------------------------ packet filter


def test_cut_rules_cover_both_directions() -> None:
    cut = Cut(("127.0.200.10", "127.0.200.11"), ("127.0.200.12",), "udp", 10500)
    assert cut.rules() == [
        'iifname "lo" ip saddr { 127.0.200.10, 127.0.200.11 } ip daddr 127.0.200.12 udp dport 10500 drop',
        'iifname "lo" ip saddr 127.0.200.12 ip daddr { 127.0.200.10, 127.0.200.11 } udp sport 10500 drop',
    ]


def test_a_reset_lets_the_resets_through() -> None:
    forward, backward = Cut((), ("127.0.200.11",), "tcp", 1884, "reset").rules()
    assert forward == 'iifname "lo" ip daddr 127.0.200.11 tcp dport 1884 tcp flags & rst != rst reject with tcp reset'
    assert backward.startswith('iifname "lo" ip saddr 127.0.200.11 tcp sport 1884 tcp flags & rst != rst')


@pytest.mark.parametrize("arguments", [
    dict(sources=("a",), destinations=(), protocol="udp", port=1),
    dict(sources=("a",), destinations=("b",), protocol="icmp", port=1),
    dict(sources=("a",), destinations=("b",), protocol="udp", port=1, action="reset"),
])
def test_bad_cuts_are_refused(arguments: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Cut(**arguments)


def test_the_table_script() -> None:
    script = render_table("mqf_faults_1_1", ["rule one", "rule two"])
    assert script.startswith("table inet mqf_faults_1_1 {\n  chain input {\n    type filter hook input priority 0;")
    assert "    rule one\n    rule two\n" in script


# ------------------------------------------------------------ catalogue and schedules


def test_the_suite_covers_every_fault_of_the_issue() -> None:
    kinds = {(fault.kind, fault.role) for fault in SUITE}
    assert kinds == {("kill_wrapper", "publisher"), ("kill_wrapper", "middle"), ("kill_wrapper", "subscriber"),
                     ("kill_broker", "subscriber"), ("kill_broker", "middle"), ("pause_wrapper", "middle"),
                     ("partition", None)}
    assert FAULTS["partition"].seconds == 30.0
    assert FAULTS["pause-middle-wrapper"].seconds > NEIGHBOUR_DOWN_SECONDS


def test_topologies() -> None:
    assert LINE.cut_links() == [("b", "c")]
    assert RING.cut_links() == [("b", "c"), ("d", "a")]
    with pytest.raises(ValueError, match="no bypass"):
        LINE.node("bypass")
    assert describe(FAULTS["kill-middle-wrapper"], LINE, bridge=True) == \
        "the bridge connections of b reset and refused for 6 s"
    assert describe(FAULTS["partition"], RING, bridge=False) == "UDP dropped between a+b | c+d for 30 s"


def test_faults_check_their_fields() -> None:
    with pytest.raises(ValueError):
        Fault("x", "partition", "middle", 1.0, "")
    with pytest.raises(ValueError):
        Fault("x", "kill_wrapper", None, 1.0, "")
    with pytest.raises(ValueError):
        Fault("x", "explode", "middle", 1.0, "")


def test_a_seed_always_gives_the_same_schedule() -> None:
    assert random_case(7) == random_case(7)
    assert [random_case(seed) for seed in range(1, 6)] != [random_case(seed) for seed in range(2, 7)]


def test_random_schedules_keep_their_rules() -> None:
    for seed in range(1, 200):
        _check_schedule(random_case(seed))


def _check_schedule(case: RandomCase) -> None:
    assert 1 <= len(case.schedule) <= 3
    held: dict[str, list[tuple[float, float]]] = {}
    for item in case.schedule:
        assert item.at >= 2.0 and item.at + item.fault.seconds <= case.length + 1e-9
        assert not (item.fault.kind == "kill_broker" and item.fault.role == "publisher")
        if item.fault.role is not None:
            case.topology.node(item.fault.role)  # a role the topology has
        process = "network" if item.fault.role is None else (
            ("broker " if item.fault.kind == "kill_broker" else "wrapper ") + case.topology.node(item.fault.role))
        span = (item.at, item.at + item.fault.seconds)
        assert all(span[1] <= other[0] or other[1] <= span[0] for other in held.get(process, []))
        held.setdefault(process, []).append(span)


# ------------------------------------------------------------ jobs


def test_a_long_fault_gets_a_job_of_its_own(tmp_path: Path) -> None:
    plans = suite_plans()
    jobs = suite_jobs(["federation-line", "bridge-line"], plans, tmp_path, itertools.count(200), Timing())
    assert [(job.setup, [plan.case for plan in job.cases], job.first_address) for job in jobs] == [
        ("federation-line", [fault.name for fault in SUITE if fault.name != "partition"], "127.0.200.10"),
        ("federation-line", ["partition"], "127.0.201.10"),
        ("bridge-line", [fault.name for fault in SUITE if fault.name != "partition"], "127.0.202.10"),
        ("bridge-line", ["partition"], "127.0.203.10"),
    ]
    results = [[CaseResult(job.setup, plan.case, []) for plan in job.cases] for job in jobs]
    merged = merge(jobs, results)
    assert [result.case for result in merged["federation-line"]][-1] == "partition"
    assert len(merged["bridge-line"]) == len(SUITE)


def test_jobs_travel_as_json(tmp_path: Path) -> None:
    case = random_case(3)
    job = Job("federation-ring", (CasePlan(case.name, case.schedule, case.length, (1, 2), None),
                                  CasePlan("burst-10", (), streams=(2,), burst=10)),
              tmp_path, "127.0.200.10", Timing(rate=50.0), {"stats_interval": 1.0}, tmp_path / "t.conf")
    assert Job.from_json(job.to_json()) == job


def test_inflight_template(tmp_path: Path) -> None:
    source = tmp_path / "source.conf"
    source.write_text("listener 1883\nmax_inflight_messages 1000\n  max_inflight_bytes 0\n# max_inflight_messages 5\n")
    default = inflight_template(tmp_path / "default.conf", None, source).read_text()
    assert inflight_settings(default) == []
    raised = inflight_template(tmp_path / "raised.conf", 100, source).read_text()
    assert inflight_settings(raised) == ["max_inflight_messages 100"]


# ------------------------------------------------------------ explanation and table


def test_explain_streams_follows_the_stream_through_the_events() -> None:
    events = {
        "a": [{"type": "publication_originated", "pub": "p1", "topic": "t/q1"},
              {"type": "publication_originated", "pub": "p2", "topic": "t/q1"},
              {"type": "publication_originated", "pub": "x", "topic": "other"},
              {"type": "publication_dropped", "pub": "p2", "reason": "no_core"},
              {"type": "publication_dropped", "pub": "x", "reason": "no_route"}],
        "b": [{"type": "duplicate_dropped", "pub": "p1"}, {"type": "publication_retransmitted", "pub": "p1"}],
        "c": [{"type": "publication_delivered", "pub": "p1", "topic": "t/q1"},
              {"type": "publication_delivered", "pub": "p1", "topic": "t/q1"}],
    }
    explained = explain_streams(events, {1: "t/q1"}, "a", "c")
    assert explained["1"] == {"originated": 2, "delivered": 2, "delivered_unique": 1,
                              "dropped": {"a": {"no_core": 1}}, "duplicate_dropped": {"b": 1}, "retransmitted": 1}
    assert explained["all_drops"] == {"a": {"no_core": 1, "no_route": 1}}


def test_the_table_puts_setups_side_by_side() -> None:
    fine = count_stream(3, [1, 2, 3], [1, 2, 3])
    lossy = count_stream(3, [1, 2, 3], [1, 3, 3])
    results = {
        "federation-line": [CaseResult("federation-line", "kill", [], {1: lossy, 2: lossy})],
        "bridge-line": [CaseResult("bridge-line", "kill", [], {1: fine, 2: fine})],
    }
    rows = report.rows(results, {"kill": "kill it"})
    assert rows == [["kill it", "1", "lost 1, dup 1 /3", "ok /3"], ["kill it", "2", "lost 1, dup 1 /3", "ok /3"]]
    text = report.text_table(results, {"kill": "kill it"})
    assert text.splitlines()[0].split("  ")[-1] == "bridge chain a->b->c (reference)"
    assert report.markdown_table(results, {}).splitlines()[0] == \
        "| fault | QoS | federation line a-b-c | bridge chain a->b->c (reference) |"
    assert report.markdown_table(results, {}).splitlines()[2] == "| kill | 1 | lost 1, dup 1 /3 | ok /3 |"
    assert report.markdown_table(results, {"kill": "a | b"}).splitlines()[2].startswith("| a \\| b | 1 |")
    assert report.cell(None, 1, error="boom") == "not judged"


def test_case_results_travel_as_json() -> None:
    result = CaseResult("federation-ring", "partition", [{"fault": "partition"}],
                        {1: count_stream(4, [1, 2, 3, 4], [1, 3, 2])}, healed=5.0, last_arrival={1: 9.0},
                        subscriber_restarts={1: 0})
    again = CaseResult.from_json(result.to_json())
    assert again.streams == result.streams and again.last_arrival == {1: 9.0} and again.healed == 5.0
    assert report.drain_note(again) == "last arrival QoS 1 +4.0 s from the healing"


def test_scheduled_faults_are_applied_at_their_time() -> None:
    plan = CasePlan("x", (Scheduled(FAULTS["kill-middle-wrapper"], 2.0), Scheduled(FAULTS["partition"], 5.0)))
    assert plan.fault_seconds == 33.0
    assert CasePlan("y", ()).fault_seconds == 0.0


# ---------------------------------------------------------------- issue 37's cases

def test_the_extended_cases_name_their_topologies_and_roles() -> None:
    from suites.faults.catalogue import EXTENDED, RING5, RING_SPLIT, TOPOLOGIES
    names = [fault.name for _topology, fault in EXTENDED]
    assert names == ["split-both-sides", "stop-core", "kill-two-wrappers", "disk-full-publisher",
                     "disk-full-subscriber"]
    for topology, fault in EXTENDED:
        for role in fault.roles:
            TOPOLOGIES[topology].node(role)  # every role exists there
    two = dict((fault.name, fault) for _topology, fault in EXTENDED)["kill-two-wrappers"]
    assert two.roles == ("middle", "bypass") and describe(two, RING5, bridge=False) == \
        "kill -9 wrapper c+e for 6 s"
    # The far side's subscriber is the core (the lowest id): the near side loses its core at the cut.
    assert min(RING_SPLIT.vids, key=lambda pair: pair[1])[0] == RING_SPLIT.node("subscriber") == "c"
    assert min(RING5.vids, key=lambda pair: pair[1])[0] == RING5.node("subscriber") == "d"
    assert RING_SPLIT.also_subscribing == ("b",) and RING5.also_subscribing == ("b",)
    with pytest.raises(ValueError):
        Fault("x", "disk_full", "publisher+middle", 1.0, "")  # one process only
    with pytest.raises(ValueError):
        Fault("x", "kill_wrapper", "middle+nowhere", 1.0, "")


def test_the_extended_jobs_group_by_topology_and_keep_the_full_disk_apart(tmp_path: Path) -> None:
    from suites.faults.suite import BULK_CASE, extended_jobs
    jobs = extended_jobs(tmp_path, itertools.count(120), Timing())
    cases = {(job.setup, job.small_state_dirs): [plan.case for plan in job.cases] for job in jobs}
    assert cases == {("federation-ring-split", False): ["split-both-sides", "stop-core"],
                     ("federation-ring5", False): ["kill-two-wrappers"],
                     ("federation-line", True): ["disk-full-publisher", "disk-full-subscriber"],
                     ("federation-line", False): [BULK_CASE]}
    assert all(Job.from_json(job.to_json()) == job for job in jobs)
    only = extended_jobs(tmp_path, itertools.count(120), Timing(), cases=["stop-core"])
    assert [[plan.case for plan in job.cases] for job in only] == [["stop-core"]]
    [disk] = [job for job in jobs if job.small_state_dirs]
    for plan, role in zip(disk.cases, ("publisher", "subscriber"), strict=True):  # a full disk, then its wrapper
        full, restart = plan.schedule                                             # restarted once it has room
        assert (full.fault.kind, restart.fault.kind) == ("disk_full", "stop_wrapper")
        assert restart.fault.role == full.fault.role == role and restart.at == full.at + full.fault.seconds + 5.0


def test_the_ledger_finds_a_silent_loss_and_a_broken_custody_count() -> None:
    from suites.faults.ledger import ledger
    topics = {"1": "t/q1"}
    events = {"a": [{"type": "publication_originated", "pub": f"a/1/{seq}", "topic": "t/q1"} for seq in (1, 2, 3)],
              "c": [{"type": "publication_delivered", "pub": f"a/1/{seq}", "topic": "t/q1"} for seq in (1, 2)]}
    lost_one = {"c": {"1": count_stream(3, [1, 2, 3], [1, 2])}}
    snapshot = {"pid": 7, "counters": {"publications_originated": 0, "custody_released": 0, "custody_given_up": 0},
                "custody": {"own_open": 0}}
    later = {"pid": 7, "counters": {"publications_originated": 3, "custody_released": 3, "custody_given_up": 0},
             "custody": {"own_open": 0}}
    found = ledger(events, topics, "a", lost_one, {"a": snapshot}, {"a": later})
    assert [problem.split(":")[0] for problem in found["problems"]] == ["1 at c"]  # lost 1, reported dropped 0
    dropped = {**events, "b": [{"type": "publication_dropped", "pub": "a/1/3", "reason": "receiver_hold_expired"}]}
    given_up = {**later, "counters": {**later["counters"], "custody_released": 2, "custody_given_up": 1}}
    assert ledger(dropped, topics, "a", lost_one, {"a": snapshot}, {"a": given_up})["problems"] == []
    nothing_lost = {"c": {"1": count_stream(3, [1, 2, 3], [1, 2, 3])}}
    delivered_all = {**events, "c": [{"type": "publication_delivered", "pub": f"a/1/{seq}", "topic": "t/q1"}
                                     for seq in (1, 2, 3)]}
    wrong = ledger(delivered_all, topics, "a", nothing_lost, {"a": snapshot},
                   {"a": {**later, "counters": {**later["counters"], "custody_released": 2}}})
    assert len(wrong["problems"]) == 1 and wrong["problems"][0].startswith("origin: released 2")
    restarted = ledger(delivered_all, topics, "a", nothing_lost, {"a": snapshot}, {"a": {**later, "pid": 8}})
    assert restarted["problems"] == [] and restarted["origin"]["checked"].startswith("no")
    events_lost = {**events, "c": delivered_all["c"][:2]}  # c's wrapper died before writing the third
    assert len(ledger(events_lost, topics, "a", nothing_lost, {"a": snapshot}, {"a": later})["problems"]) == 1
    killed = ledger(events_lost, topics, "a", nothing_lost, {"a": snapshot}, {"a": later}, frozenset({"c"}))
    assert killed["problems"] == [] and killed["streams"]["1"]["nodes"]["c"]["checked"].startswith("lost only")


def test_extended_results_travel_as_json() -> None:
    result = CaseResult("federation-ring-split", "split-both-sides", [], {1: count_stream(2, [1, 2], [1, 2])},
                        more={"b": {1: count_stream(2, [1, 2], [2])}}, bulk=count_stream(3, [1, 2, 3], [1, 2, 3]),
                        latency={"1": {"p50": 0.1, "p99": 0.2, "max": 0.3}},
                        memory={"a": {"wrapper_mib": 40.0, "broker_mib": 8.0}}, ledger={"problems": []})
    again = CaseResult.from_json(result.to_json())
    assert (again.more, again.bulk, again.latency, again.memory) == (result.more, result.bulk, result.latency,
                                                                     result.memory)
    assert not again.meets(1)  # b lost one: the case misses the target


def test_catch_up_measures_what_was_missing_at_the_healing() -> None:
    from suites.faults.runner import catch_up
    published = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # 1-6 published at those times; healed at 4.5
    arrivals = [Arrival(1, 1.1), Arrival(2, 2.1), Arrival(3, 5.5), Arrival(4, 6.5), Arrival(5, 5.2), Arrival(6, 6.1)]
    assert catch_up(published, [1, 2, 3, 4, 5, 6], arrivals, 4.5) == {"backlog": 2, "arrived": 2, "seconds": 2.0,
                                                                       "rate": 1.0}
    assert catch_up(published, [1, 2], arrivals, 4.5) is None  # nothing missing then
    assert catch_up(published, [3, 4], arrivals[:3], 4.5) == {"backlog": 2, "arrived": 1, "seconds": 1.0,
                                                               "rate": 1.0}


def test_extended_lines_name_every_stream_and_what_was_measured() -> None:
    result = CaseResult("federation-ring-split", "split-both-sides", [], {1: count_stream(2, [1, 2], [1, 2])},
                        more={"b": {1: count_stream(2, [1, 2], [2])}}, ledger={"problems": []},
                        catch_up={"c/1": {"backlog": 2.0, "arrived": 2.0, "seconds": 0.5, "rate": 4.0}},
                        subscriber_node="c")
    [line] = report.extended_lines([result], {"split-both-sides": "the split"})
    assert line == ("the split: QoS 1 at c: ok /2; QoS 1 at b: lost 1 /2; counters agree; "
                    "c/1 caught up 2 in 0.5 s")


def test_the_soak_restarts_every_two_minutes_kills_every_five_and_never_twice_at_once(tmp_path: Path) -> None:
    from suites.faults.soak import SOAK_SETUP, soak_job, soak_plan
    plan = soak_plan()
    kinds = [item.fault.kind for item in plan.schedule]
    assert plan.length == 1200.0 and kinds.count("stop_wrapper") == 9 and kinds.count("kill_wrapper") == 3
    assert [item.at for item in plan.schedule if item.fault.kind == "stop_wrapper"] == [120.0 * n for n in range(1, 10)]
    assert [item.at for item in plan.schedule if item.fault.kind == "kill_wrapper"] == [300.0, 660.0, 900.0]
    spans = sorted((item.at, item.at + item.fault.seconds) for item in plan.schedule)
    assert all(end < following for (_, end), (following, _) in itertools.pairwise(spans))  # one fault at a time
    assert spans[-1][1] < plan.length
    assert plan.schedule[0].fault.role == "subscriber"  # the core (c on the split ring) hands over first
    job = soak_job(tmp_path, "127.0.9.10", minutes=4.0, rate=50.0)
    assert job.setup == SOAK_SETUP and job.timing.rate == 50.0 and job.cases[0].length == 240.0
    assert Job.from_json(job.to_json()) == job
