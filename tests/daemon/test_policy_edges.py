"""The topic policy at the wrapper's edges (federation.daemon.policy_edges) and in the subscriptions it tells
the node (federation.daemon.policy_subscriptions): what is kept out is counted by reason, custody ends for
what will not be injected, and a policy changed at run time changes only the difference."""

from __future__ import annotations

from federation.daemon.policy_edges import PolicyEdges
from federation.daemon.policy_subscriptions import PolicySubscriptions
from federation.daemon.topic_policy import Crossing, TopicPolicy
from federation.protocol.types import Address, Injection, InjectionRun

ORIGIN = Address("10.0.0.1", 10500)
SITE_A = TopicPolicy.parse(['sensors/# out 1 "" site-a/', "cmd/# in 1"])


def injection(topic: str, qos: int, seq: int, retain: bool = False) -> Injection:
    return Injection(topic, b"x", qos, retain, None, (ORIGIN, 1, seq), "f")


def test_exports_are_mapped_capped_and_counted() -> None:
    edges = PolicyEdges(SITE_A)
    assert edges.active
    assert edges.export("sensors/t1", 2) == Crossing("site-a/sensors/t1", 1)
    assert edges.export("sensors/t1", 0) == Crossing("site-a/sensors/t1", 0)
    assert edges.export("private/x", 1) is None
    assert edges.filtered["export"] == {"no_out_line": 1}
    assert not PolicyEdges().active and PolicyEdges().export("any", 2) == Crossing("any", 2)


def test_imports_keep_out_what_no_line_allows_and_end_its_custody() -> None:
    edges = PolicyEdges(SITE_A)
    done: list[tuple[Address, int, int]] = []
    kept = edges.imports([injection("cmd/a1", 2, 1), injection("other/x", 1, 2), injection("other/y", 0, 3),
                          injection("cmd/a2", 0, 4)], done.append)
    assert [(i.topic, i.qos) for i in kept] == [("cmd/a1", 1), ("cmd/a2", 0)]
    assert done == [(ORIGIN, 1, 2)]  # QoS 1 kept out: custody ends; QoS 0 has none
    assert edges.filtered["import"] == {"no_in_line": 2}
    capped = PolicyEdges(TopicPolicy.parse(["cmd/# in 0"]))
    done.clear()
    assert [(i.topic, i.qos) for i in capped.imports([injection("cmd/a1", 2, 5)], done.append)] == [("cmd/a1", 0)]
    assert done == [(ORIGIN, 1, 5)]  # injected at QoS 0: the broker will not acknowledge it


def test_runs_are_mapped_and_emptied_runs_dropped() -> None:
    edges = PolicyEdges(TopicPolicy.parse(["# in 0 here/ fed/"]))
    runs = [InjectionRun(["fed/a", "other", "fed/b"], [b"1", b"2", b"3"], ORIGIN, 1, [1, 2, 3], "#"),
            InjectionRun(["other"], [b"4"], ORIGIN, 1, [4], "#")]
    kept = edges.import_runs(runs)
    assert [(run.topics, run.payloads, run.seqs) for run in kept] == [(["here/a", "here/b"], [b"1", b"3"], [1, 3])]
    assert edges.filtered["import"]["no_in_line"] == 2
    status = edges.status()
    assert status["lines"] == ["# in 0 here/ fed/"]
    assert status["filtered"] == {"export": {"no_out_line": 0, "mapped_topic_invalid": 0},
                                  "import": {"no_in_line": 2, "mapped_topic_invalid": 0}}


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def local_subscribe(self, client: str, filter_: str, qos: int, now: float) -> None:
        self.calls.append(("subscribe", client, filter_, str(qos)))

    def local_unsubscribe(self, client: str, filter_: str, now: float) -> None:
        self.calls.append(("unsubscribe", client, filter_))

    def local_disconnect(self, client: str, now: float) -> None:
        self.calls.append(("disconnect", client))


def test_without_lines_the_node_is_told_exactly_what_the_table_says() -> None:
    node = Recorder()
    sink = PolicySubscriptions(node, TopicPolicy())
    sink.local_subscribe("c", "a/#", 1, 0.0)
    sink.local_subscribe("c", "a/#", 1, 0.0)  # a SUBSCRIBE again is told again, as before
    sink.local_subscribe("c", "$share/g/b", 2, 0.0)
    sink.local_unsubscribe("c", "a/#", 0.0)
    sink.local_unsubscribe("c", "never/subscribed", 0.0)
    sink.local_disconnect("c", 0.0)
    assert node.calls == [("subscribe", "c", "a/#", "1"), ("subscribe", "c", "a/#", "1"),
                          ("subscribe", "c", "$share/g/b", "2"), ("unsubscribe", "c", "a/#"), ("disconnect", "c")]


def test_a_subscription_asks_only_for_what_it_can_import() -> None:
    node = Recorder()
    sink = PolicySubscriptions(node, SITE_A)
    sink.local_subscribe("c", "sensors/#", 2, 0.0)  # nothing to import: the node never hears of it
    sink.local_subscribe("d", "#", 2, 0.0)
    sink.local_subscribe("d", "cmd/+", 0, 0.0)  # inside cmd/#, which d asked for already
    assert node.calls == [("subscribe", "d", "cmd/#", "1"), ("subscribe", "d", "cmd/+", "0")]
    assert sink.not_imported() == ["sensors/#"] and sink.federated == 2
    node.calls.clear()
    sink.local_unsubscribe("d", "#", 0.0)
    assert node.calls == [("unsubscribe", "d", "cmd/#")]


def test_a_new_policy_joins_the_new_filters_first_then_leaves_the_old() -> None:
    node = Recorder()
    sink = PolicySubscriptions(node, TopicPolicy.parse(["a/# in 1"]))
    sink.local_subscribe("c", "#", 2, 0.0)
    sink.local_subscribe("c", "b/x", 2, 0.0)
    node.calls.clear()
    assert sink.set_policy(TopicPolicy.parse(["a/# in 1", "b/# in 2"]), 1.0) == 2  # b/# and b/x
    assert node.calls == [("subscribe", "c", "b/#", "2"), ("subscribe", "c", "b/x", "2")]
    node.calls.clear()
    assert sink.set_policy(TopicPolicy.parse(["b/# in 2"]), 2.0) == 1
    assert node.calls == [("unsubscribe", "c", "a/#")]
    node.calls.clear()
    assert sink.set_policy(TopicPolicy.parse(["b/# in 2"]), 3.0) == 0 and node.calls == []


def test_status_shows_the_configuration_and_what_the_policy_kept_out() -> None:
    from federation.daemon.status import render

    document = {"node": "127.0.0.1:10500", "broker_id": "1@127.0.0.1:10500", "management_core": None,
                "daemon": {"config": {"file": "/etc/mqtt-federation/wrapper.yaml", "sha256": "ab" * 32,
                                      "loaded_at": 0.0, "pending_restart": ["max_qos"]},
                           "topic_policy": {"lines": list(SITE_A.texts),
                                            "filtered": {"export": {"no_out_line": 3, "mapped_topic_invalid": 0},
                                                         "import": {"no_in_line": 0, "mapped_topic_invalid": 0}},
                                            "subscriptions": {"not_imported": ["sensors/#"]}}}}
    rendered = render(document)
    assert "configuration: /etc/mqtt-federation/wrapper.yaml, sha256 abababababababab..." in rendered
    assert "WAITING FOR A RESTART: max_qos" in rendered
    assert 'topic policy: sensors/# out 1 "" site-a/ | cmd/# in 1; kept out: export no_out_line 3' in rendered
    assert "local subscriptions no in/both line imports: sensors/#" in rendered
