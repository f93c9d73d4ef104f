"""The backend-neutral pieces of the real-process scenario driver, without processes or root.

The driver itself runs on network namespaces in tests/real/netns/test_netns_partitions.py;
here are its rules: link state with the simulator's cut/heal/loss semantics,
deliveries read back from subscriber output, traffic totals from event logs,
views from status documents, and the checks made before anything is created.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from federation.harness.checks import check_scenario, node_plans
from federation.harness.clients import (
    SUBSCRIBER_FORMAT,
    ClientRun,
    SentPublication,
    SubscriptionHistory,
    deliveries,
    parse_line,
    publisher_argv,
    read_receipts,
    subscriber_argv,
)
from federation.harness.links import LinkState
from federation.harness.platform import InboundFilter
from federation.harness.statusview import parse_broker_id, ready_problem, serving_filter, view_of
from federation.harness.traffic import TrafficTally, lifetimes_seconds
from federation.protocol.types import Address, BrokerId
from federation.scenario.loader import ScenarioError, parse_scenario
from federation.scenario.model import Cut, Publish, Subscribe
from federation.scenario.report import PublicationRecord, classify

SQUARE = [("n0", "n1"), ("n1", "n2"), ("n2", "n3"), ("n3", "n0")]
SQUARE_SORTED = [("n0", "n1"), ("n0", "n3"), ("n1", "n2"), ("n2", "n3")]


# ------------------------------------------------------------ link state


def test_cut_both_ways_and_heal():
    links = LinkState(SQUARE)
    assert links.cut("n0", "n1") == {"n0", "n1"}
    assert links.inbound("n1") == {"n0": InboundFilter(cut=True)}
    assert links.inbound("n0") == {"n1": InboundFilter(cut=True)}
    assert ("n0", "n1") not in links.up_links()
    assert links.heal("n1", "n0") == {"n0", "n1"}
    assert links.inbound("n0") == {} and links.inbound("n1") == {}
    assert links.up_links() == SQUARE_SORTED


def test_oneway_cut_filters_the_receiver_only_and_takes_the_link_down():
    links = LinkState(SQUARE)
    assert links.cut("n0", "n1", oneway=True) == {"n1"}
    assert links.inbound("n1") == {"n0": InboundFilter(cut=True)}
    assert links.inbound("n0") == {}
    # the ground truth connects a link only when both directions carry traffic
    assert ("n0", "n1") not in links.up_links()


def test_loss_all_clears_link_overrides_as_in_the_simulator():
    links = LinkState(SQUARE)
    links.set_loss(30, ("n1", "n2"))
    assert links.inbound("n2") == {"n1": InboundFilter(loss=30)}
    assert links.loss_active()
    changed = links.set_loss(10)
    assert changed == {"n0", "n1", "n2", "n3"}
    assert links.inbound("n2") == {"n1": InboundFilter(loss=10), "n3": InboundFilter(loss=10)}
    links.set_loss(0)
    assert not links.loss_active()
    assert all(links.inbound(name) == {} for name in ("n0", "n1", "n2", "n3"))


def test_link_state_refuses_non_neighbours():
    links = LinkState(SQUARE)
    with pytest.raises(ValueError, match="not neighbours"):
        links.cut("n0", "n2")


# ------------------------------------------------------------ clients and deliveries


def test_client_commands():
    argv = subscriber_argv("sub0", {"b/#": 1, "a/+": 0})
    assert argv[:3] == ["mosquitto_sub", "-h", "127.0.0.1"]
    assert argv[argv.index("-q") + 1] == "1"  # one -q for all filters: the highest asked for
    assert argv[-4:] == ["-t", "a/+", "-t", "b/#"]
    assert "-R" in argv and argv[argv.index("-F") + 1] == SUBSCRIBER_FORMAT
    assert publisher_argv("a/b", 2, True)[-3:] == ["2", "-l", "-r"]


def _line(at: float, payload: dict[str, object] | bytes, topic: str) -> str:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return f"{at:.9f} {data.hex()} {topic}\n"


def test_parse_line_keeps_spaces_in_topics():
    assert parse_line(_line(12.5, b"hi", "a b/c").rstrip("\n")) == (12.5, b"hi", "a b/c")
    assert parse_line("garbage") is None


def _run(tmp_path: Path, node: str, client: str, filters: dict[str, int], lines: list[str],
         started: float = 0.0, ended: float | None = None) -> ClientRun:
    output = tmp_path / f"{node}.{client}.{started}.out"
    output.write_text("".join(lines))
    return ClientRun(node, client, filters, output, started, None, ended)


def test_deliveries_count_copies_per_node_not_per_client(tmp_path):
    t0 = 1000.0
    sent = {"n2-1": SentPublication("n2-1", "n2", "a/b", 1.0)}
    runs = [
        # two clients on n0 each print the one copy their broker got: one delivery
        _run(tmp_path, "n0", "x", {"a/#": 0}, [_line(t0 + 1.01, {"id": "n2-1"}, "a/b")]),
        _run(tmp_path, "n0", "y", {"a/b": 0}, [_line(t0 + 1.02, {"id": "n2-1"}, "a/b")]),
        # n1's client printed it twice: one delivery and one duplicate
        _run(tmp_path, "n1", "z", {"a/#": 0}, [_line(t0 + 1.03, {"id": "n2-1"}, "a/b"),
                                                _line(t0 + 1.04, {"id": "n2-1"}, "a/b")]),
    ]
    history = SubscriptionHistory()
    history.start("n0", "x", "a/#", 0.0)
    history.start("n1", "z", "a/#", 0.0)
    records = deliveries(read_receipts(runs, t0, final=True), runs, sent, history)
    assert [(r.node, round(r.at, 3), r.subscribed) for r in records] == [
        ("n0", 1.01, True), ("n1", 1.03, True), ("n1", 1.04, True)]


def test_the_origin_s_own_copy_is_not_a_delivery(tmp_path):
    t0 = 0.0
    sent = {"n0-1": SentPublication("n0-1", "n0", "a/b", 2.0)}
    local = _run(tmp_path, "n0", "x", {"a/#": 0}, [_line(2.001, {"id": "n0-1"}, "a/b")])
    echoed = _run(tmp_path, "n0", "w", {"a/#": 0}, [_line(2.001, {"id": "n0-1"}, "a/b"),
                                                   _line(2.050, {"id": "n0-1"}, "a/b")])
    history = SubscriptionHistory()
    records = deliveries(read_receipts([local], t0, final=True), [local], sent, history)
    assert records == []
    # a second copy at the origin is the federation delivering it back: unexpected
    records = deliveries(read_receipts([echoed], t0, final=True), [echoed], sent, history)
    assert [(r.node, r.at) for r in records] == [("n0", 2.05)]
    outcome = classify([PublicationRecord("n0-1", "n0", "a/b", 2.0, True, frozenset())], records)
    assert (outcome.unexpected, outcome.violations) == (1, [
        "publication n0-1 ('a/b' from n0 at 2.000000s) was delivered back to its origin"])


def test_a_shared_subscription_group_counts_as_one_receiver(tmp_path):
    sent = {f"n1-{i}": SentPublication(f"n1-{i}", "n1", "s/t", 1.0) for i in (1, 2)}
    runs = [
        _run(tmp_path, "n0", "m1", {"$share/g/s/#": 0}, [_line(1.1, {"id": "n1-1"}, "s/t")]),
        _run(tmp_path, "n0", "m2", {"$share/g/s/#": 0}, [_line(1.2, {"id": "n1-2"}, "s/t")]),
    ]
    records = deliveries(read_receipts(runs, 0.0, final=True), runs, sent, SubscriptionHistory())
    assert sorted((r.publication, r.node) for r in records) == [("n1-1", "n0"), ("n1-2", "n0")]


def test_foreign_lines_and_unfinished_lines(tmp_path):
    run = _run(tmp_path, "n0", "x", {"#": 0}, [_line(1.0, b"not json", "a"), _line(2.0, {"id": "n1-1"}, "a"),
                                               "3.0 7b22"])
    receipts = read_receipts([run], 0.0, final=False)
    assert receipts.foreign == 1  # the unfinished last line is not read until the end
    assert receipts.by_node["n0"]["client/x"]["n1-1"] == [2.0]
    assert read_receipts([run], 0.0, final=True).foreign == 2


def test_subscription_history_intervals():
    history = SubscriptionHistory()
    history.start("n0", "c", "a/#", 1.0)
    history.end("n0", "c", "a/#", 3.0)
    history.start("n0", "c", "a/#", 5.0)
    assert not history.subscribed("n0", "a/b", 0.5)
    assert history.subscribed("n0", "a/b", 2.0)
    assert not history.subscribed("n0", "a/b", 4.0)
    assert history.subscribed("n0", "a/b", 9.0)
    assert not history.subscribed("n0", "b", 2.0)
    assert not history.subscribed("n1", "a/b", 2.0)


# ------------------------------------------------------------ traffic


def test_traffic_sums_the_last_snapshot_of_every_lifetime(tmp_path):
    log = tmp_path / "events.jsonl"
    lines = [
        {"type": "node_started", "epoch": 7},
        {"type": "counters", "sent": {"hl": [10, 300], "tm": [2, 200]}},
        {"type": "counters", "sent": {"hl": [20, 600], "tm": [3, 300]}},  # killed after this
        {"type": "node_started", "epoch": 8},
        {"type": "counters", "sent": {"hl": [5, 150]}},
        {"type": "node_stopped", "counters": {"sent": {"hl": [6, 180], "fd": [1, 40]}}},
    ]
    log.write_text("\n".join(json.dumps(line) for line in lines) + "\n{broken\n")
    tally = TrafficTally()
    assert tally.read_event_log("n0", log) == 1
    tally.observe("n0", 7, {"hl": (25, 750), "tm": (3, 300)})  # a status poll saw more before the kill
    record = tally.record(node_seconds=12.0)
    assert record.control_by_type == {"fd": (1, 40), "hl": (31, 930)}
    assert (record.data_packets, record.data_bytes) == (3, 300)
    assert record.node_seconds == 12.0


def test_lifetimes_are_clipped_to_the_run():
    assert lifetimes_seconds([(0.0, 7.0), (13.0, None)], end=20.0) == pytest.approx(14.0)


# ------------------------------------------------------------ status documents


def _document(**changes: object) -> dict[str, object]:
    document: dict[str, object] = {
        "broker_id": "3@10.77.0.4:10500", "epoch": 5, "management_core": "0@10.77.0.1:10500",
        "federation": [{"address": "10.77.0.1:10500"}, {"address": "10.77.0.4:10500"}],
        "topics": [{"filter": "a/#", "core": "0@10.77.0.1:10500"}, {"filter": "b", "core": None}],
        "daemon": {"broker": {"connected": True, "log_lines": 3}},
    }
    document.update(changes)
    return document


def test_view_of_a_status_document():
    view = view_of(_document())
    assert view is not None
    assert view.broker_id == BrokerId(3, Address("10.77.0.4", 10500))
    assert view.members == frozenset({Address("10.77.0.1", 10500), Address("10.77.0.4", 10500)})
    assert view.topic_cores == {"a/#": BrokerId(0, Address("10.77.0.1", 10500))}
    assert view_of(_document(management_core=None)) is None
    with pytest.raises(ValueError):
        parse_broker_id("nope")


def test_a_wider_filter_serves_a_subscription_only_where_its_broker_does_not_federate_it_itself():
    """`wait_mesh`'s choice of mesh: n1's `p/#` (its own subscriber's), known everywhere, does not serve n0's `p/+/x`
    while n0's claim of it is not known yet (the mesh was called ready and a QoS 0 publication went nowhere); a
    covering filter the subscriber's own broker federates for it does (a fleet's aggregate)."""
    def document(topics: list[str], federated: list[str]) -> dict[str, object]:
        return {"topics": [{"filter": topic} for topic in topics], "federated": {"federated_filters": federated}}

    pending = {"n0": document(["p/#"], ["p/+/x"]), "n1": document(["p/#"], ["p/#"])}
    assert serving_filter(pending, "p/+/x") == "p/+/x"
    aggregated = {"n0": document(["p/#"], ["p/#"]), "n1": document(["p/#"], [])}
    assert serving_filter(aggregated, "p/+/x") == "p/#"


def test_ready_problem():
    assert ready_problem(_document()) is None
    assert ready_problem(None) == "no status reply yet"
    assert "connected=False" in str(ready_problem(_document(daemon={"broker": {"connected": False}})))


# ------------------------------------------------------------ checks before anything is created


def _scenario(**changes: object):
    data: dict[str, object] = {"duration": 10, "nodes": ["n0", "n1", "n2"], "links": [["n0", "n1"], ["n1", "n2"]],
                               "events": [{"at": 1, "cut": ["n0", "n1"]}]}
    data.update(changes)
    return parse_scenario(data, "test.yaml")


def test_check_scenario_accepts_a_valid_scenario():
    check_scenario(_scenario())


def test_check_scenario_catches_what_a_hand_built_scenario_gets_wrong():
    scenario = _scenario()
    unknown = dataclasses.replace(scenario, events=(Subscribe(1.0, "n9", "c", "a/#"),))
    with pytest.raises(ScenarioError, match="unknown node 'n9'; nodes are: n0, n1, n2"):
        check_scenario(unknown)
    not_linked = dataclasses.replace(scenario, events=(Cut(1.0, "n0", "n2"),))
    with pytest.raises(ScenarioError, match="n0 and n2 are not neighbours; links are: n0-n1, n1-n2"):
        check_scenario(not_linked)
    late = dataclasses.replace(scenario, events=(Publish(11.0, "n0", "a"),))
    with pytest.raises(ScenarioError, match="after the duration"):
        check_scenario(late)


def test_node_plans_draw_missing_ids_from_the_seed():
    scenario = _scenario(nodes={"n0": {"id": 4}, "n1": None, "n2": None},
                         settings={"hello_interval": 0.2})
    first = node_plans(scenario, seed=7)
    assert first == node_plans(scenario, seed=7)
    assert first[0].vid == 4
    assert first[1].vid != node_plans(scenario, seed=8)[1].vid
    assert first[1].neighbours == ("n0", "n2")
    assert first[0].settings["hello_interval"] == 0.2


def test_the_shipped_broker_config_renders_without_debug_logging(tmp_path: Path) -> None:
    from federation.harness.nodeconfig import WRAPPER_LOG_TYPES, mosquitto_template, render_mosquitto_conf

    rendered = render_mosquitto_conf(mosquitto_template(), "127.0.0.12", 1883, tmp_path, run_as_root=False)
    active = [line for line in rendered.splitlines() if line and not line.startswith("#")]
    assert "log_type all" not in active  # the shipped file lists the types the wrapper reads instead
    assert all(log_type in active for log_type in WRAPPER_LOG_TYPES)
    assert "set_tcp_nodelay true" in active and active.count("log_dest topic") == 1
    partial = render_mosquitto_conf("log_dest topic\nlog_type error\n", "127.0.0.12", 1883, tmp_path, False)
    assert "log_type all" in partial.splitlines()  # a template without the subscribe lines gets them back
