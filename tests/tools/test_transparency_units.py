"""The transparency suite's pure parts: scenarios, the comparison and its diff, the matrix, the explanations."""

from __future__ import annotations

import json
from typing import Any

import pytest

from suites.transparency import report
from suites.transparency.catalogue import CASES, HUGE_SIZE, default_cases, long_level
from suites.transparency.compare import EXPIRY_TOLERANCE, compare, describe_reference, match
from suites.transparency.recorder import (
    Control,
    Message,
    digest,
    preview,
    publish_properties,
    received_properties,
)
from suites.transparency.runner import Recording, prefix_of, probe_topic
from suites.transparency.scenario import (
    Connect,
    Disconnect,
    Payload,
    Properties,
    Publish,
    Scenario,
    ScenarioError,
    Settle,
    Subscribe,
    Wait,
    describe_action,
    expand,
    scenario_names,
    short,
    size_text,
)
from suites.transparency.setups import Setup, concerns, counter_changes, event_summary, flatten
from suites.transparency.suite import CaseResult, SuiteResult, judge

# ------------------------------------------------------------ scenarios


def test_a_payload_is_the_same_bytes_on_every_setup_and_different_per_publication() -> None:
    payload = Payload(size=1000)
    assert payload.build("case/p/1") == payload.build("case/p/1")
    assert payload.build("case/p/1") != payload.build("case/p/2")
    assert len(payload.build("x")) == 1000 and Payload(size=0).build("x") == b""
    assert Payload(text="héllo").build("ignored") == "héllo".encode()
    with pytest.raises(ScenarioError):
        Payload()
    with pytest.raises(ScenarioError):
        Payload(text="a", size=1)


def test_sizes_read_as_people_write_them() -> None:
    assert size_text(0) == "0 B" and size_text(1024) == "1 KiB" and size_text(256 * 1024 + 1) == "256 KiB+1"
    assert size_text(HUGE_SIZE) == "16 MiB" and size_text(1500) == "1500 B"


def test_a_scenario_refuses_actions_of_clients_that_are_not_connected() -> None:
    with pytest.raises(ScenarioError, match="not connected"):
        Scenario("x", "t", (Subscribe("s", "{p}/#"),))
    with pytest.raises(ScenarioError, match="not connected"):
        Scenario("x", "t", (Connect("s", "a"), Disconnect("s"), Publish("s", "{p}/t", Payload(text="1"))))
    with pytest.raises(ScenarioError, match="already connected"):
        Scenario("x", "t", (Connect("s", "a"), Connect("s", "b")))
    with pytest.raises(ScenarioError, match="site"):
        Scenario("x", "t", (Connect("s", "z"),))
    with pytest.raises(ScenarioError, match="group"):
        Scenario("x", "t", (Connect("s", "a"),), groups={"g": ("nobody",)})
    with pytest.raises(ScenarioError, match="topic level"):
        Scenario("a/b", "t", ())


def test_options_are_checked_when_built() -> None:
    with pytest.raises(ScenarioError):
        Subscribe("s", "f", qos=3)
    with pytest.raises(ScenarioError):
        Subscribe("s", "f", retain_handling=3)
    with pytest.raises(ScenarioError):
        Subscribe("s", "f", identifier=0)
    with pytest.raises(ScenarioError):
        Publish("s", "", Payload(text="x"))  # an empty topic needs an alias
    Publish("s", "", Payload(text="x"), properties=Properties(topic_alias=1))
    with pytest.raises(ScenarioError):
        Wait(0)


def test_groups_make_one_receiver_and_a_settle_ends_every_scenario() -> None:
    scenario = Scenario("x", "t", (Connect("m1", "b"), Connect("m2", "c"), Connect("s", "a")),
                        groups={"g": ("m1", "m2")})
    assert scenario.receivers == ("g", "s") and scenario.receiver_of("m2") == "g"
    assert isinstance(scenario.with_settle_at_end()[-1], Settle)
    assert len(Scenario("y", "t", (Connect("s", "a"), Settle())).with_settle_at_end()) == 2


def test_every_case_of_the_catalogue_is_valid_and_named_once() -> None:
    cases = default_cases()
    assert scenario_names(cases) == list(CASES)
    for name in ("retained-before-subscribe", "retained-update", "retained-delete", "shared-remote-members",
                 "will", "message-expiry", "no-local", "overlapping-filters", "persistent-session", "qos-levels",
                 "payload-0B", "payload-16MiB", "long-topic", "long-filter-1000", "subscription-identifiers",
                 "topic-alias"):
        assert name in CASES
    for case in cases:
        assert case.to_json()["actions"], case.name
        for action in case.actions:
            assert describe_action(action)


def test_long_levels_have_exactly_the_length_asked_for() -> None:
    for total in (900, 1000, 60000):
        assert len(expand(long_level("long-filter", total), "tp/long-filter").encode()) == total
    assert short("x" * 100).endswith("(100 B)")


def test_probe_topics_match_their_filter() -> None:
    assert probe_topic("tp/c/#") == "tp/c/tp-probe"
    assert probe_topic("tp/c/+/x") == "tp/c/tp-probe/x"
    assert probe_topic("$share/g/tp/c/t") == "tp/c/t"
    assert prefix_of(CASES["will"]) == "tp/will"


# ------------------------------------------------------------ the recording client's conversions


def test_properties_go_out_and_come_back_as_plain_values() -> None:
    properties = Properties(user=(("k", "1"), ("k", "2")), content_type="text/plain", correlation_data=b"\x00\x01",
                            payload_format=1, message_expiry=30, topic_alias=4)
    built = publish_properties(properties)
    assert built is not None and publish_properties(Properties()) is None
    back = received_properties(built)
    assert back["user"] == [["k", "1"], ["k", "2"]] and back["correlation_data"] == "0001"
    assert (back["content_type"], back["payload_format"], back["message_expiry"], back["topic_alias"]) == \
        ("text/plain", 1, 30, 4)
    assert received_properties(None) == {}


def test_a_payload_preview_is_printable_text_only() -> None:
    assert preview(b"hello") == "hello" and preview(b"\x00\x01") == "" and preview(b"\xff") == ""
    assert len(digest(b"x")) == 16


# ------------------------------------------------------------ comparison


def message(client: str, text: str, *, topic: str = "tp/x/t", qos: int = 1, retain: bool = False, at: float = 0.0,
            **properties: Any) -> Message:
    payload = text.encode()
    return Message(client, topic, len(payload), digest(payload), preview(payload), qos, retain, properties, at)


SCENARIO = Scenario("x", "t", (Connect("s", "c"), Connect("m1", "b"), Connect("m2", "c"), Connect("p", "a")),
                    groups={"g": ("m1", "m2")})


def recording(setup: str, messages: dict[str, list[Message]], controls: dict[str, list[Control]] | None = None,
              published: dict[str, float] | None = None) -> Recording:
    return Recording("x", setup, messages, controls or {}, published=published or {})


def test_equal_recordings_are_the_same() -> None:
    reference = recording("one-broker", {"s": [message("s", "1"), message("s", "2")]})
    verdict = compare(SCENARIO, reference, recording("federation", {"s": [message("s", "1"), message("s", "2")]}))
    assert verdict.same and verdict.summary == "same" and not verdict.details


def test_missing_extra_and_changed_messages_are_told_apart() -> None:
    reference = recording("one-broker", {"s": [message("s", "1"), message("s", "2", retain=True)]})
    other = recording("federation", {"s": [message("s", "2"), message("s", "3")]})
    verdict = compare(SCENARIO, reference, other)
    assert not verdict.same
    assert verdict.counts == {"missing": 1, "extra": 1, "changed": 1, "order": 0, "answers": 0}
    assert verdict.summary == "missing 1, extra 1, changed 1"
    text = "\n".join(verdict.details)
    assert '-s <- tp/x/t q1 "1" (1 B)' in text and '+s <- tp/x/t q1 "3" (1 B)' in text
    assert 'changed: s <- tp/x/t q1 retained "2" (1 B)  ->  s <- tp/x/t q1 "2" (1 B)' in text


def test_order_is_judged_per_topic_on_first_arrivals() -> None:
    reference = [message("s", "1"), message("s", "2"), message("s", "a", topic="tp/x/u")]
    swapped_topics = [message("s", "a", topic="tp/x/u"), message("s", "1"), message("s", "2")]
    assert match(reference, swapped_topics, ordered=True).empty  # topics may interleave differently
    swapped = [message("s", "2"), message("s", "1"), message("s", "a", topic="tp/x/u")]
    assert match(reference, swapped, ordered=True).order == ["tp/x/t: 2 payloads in another order"]
    # copies of one publication (overlapping subscriptions) may come in any order
    copies = [message("s", "1", qos=0), message("s", "1", qos=2)]
    assert match(copies, list(reversed(copies)), ordered=True).empty


def test_a_group_is_one_receiver_judged_as_a_set() -> None:
    reference = recording("one-broker", {"m1": [message("m1", "1"), message("m1", "3")], "m2": [message("m2", "2")]})
    shuffled = recording("federation", {"m1": [message("m1", "2")], "m2": [message("m2", "3"), message("m2", "1")]})
    verdict = compare(SCENARIO, reference, shuffled)
    assert verdict.same, verdict.details
    twice = recording("federation", {"m1": [message("m1", "1"), message("m1", "2"), message("m1", "3")],
                                     "m2": [message("m2", "1"), message("m2", "2"), message("m2", "3")]})
    verdict = compare(SCENARIO, reference, twice)
    assert verdict.summary == "extra 3" and verdict.details[0] == "g: extra 3"


def test_an_expiry_interval_is_judged_with_the_time_the_message_waited() -> None:
    published = {digest(b"long"): 1.0}
    reference = recording("one-broker", {"s": [message("s", "long", at=5.0, message_expiry=56)]}, published=published)
    later = recording("federation", {"s": [message("s", "long", at=6.0, message_expiry=55)]}, published=published)
    assert compare(SCENARIO, reference, later).same  # it waited a second longer and shrank by a second
    fresh = recording("federation", {"s": [message("s", "long", at=6.0, message_expiry=60)]}, published=published)
    verdict = compare(SCENARIO, reference, fresh)
    assert verdict.counts["changed"] == 1  # 5 s in transit, the interval did not shrink
    rounded = recording("federation", {"s": [message("s", "long", at=4.5, message_expiry=57)]}, published=published)
    assert EXPIRY_TOLERANCE >= 1.5 and compare(SCENARIO, reference, rounded).same  # whole seconds, either way


def test_answers_are_judged_and_acknowledgements_only_where_the_case_says() -> None:
    ack = {"p": [Control("p", "ack", "q1 tp/x/t No matching subscribers", 0.1)]}
    other_ack = {"p": [Control("p", "ack", "q1 tp/x/t Success", 0.1)]}
    verdict = compare(SCENARIO, recording("one-broker", {}, ack), recording("federation", {}, other_ack))
    assert verdict.same and "acknowledgements differ (not judged" in verdict.notes[0]
    judged = Scenario("x", "t", SCENARIO.actions, judge_acks=True)
    verdict = compare(judged, recording("one-broker", {}, ack), recording("federation", {}, other_ack))
    assert verdict.summary == "answers differ"
    suback = {"s": [Control("s", "suback", "tp/x/# Granted QoS 1", 0.1)]}
    refused = {"s": [Control("s", "suback", "tp/x/# Not authorized", 0.1)]}
    assert not compare(SCENARIO, recording("one-broker", {}, suback), recording("federation", {}, refused)).same


def test_a_case_that_did_not_run_is_not_the_same() -> None:
    broken = Recording("x", "federation", error="client s: no CONNACK")
    verdict = compare(SCENARIO, recording("one-broker", {}), broken)
    assert not verdict.same and verdict.summary.startswith("not run")


def test_the_reference_cell_says_what_was_delivered() -> None:
    assert describe_reference(SCENARIO, recording("one-broker", {})) == "nothing delivered"
    assert describe_reference(SCENARIO, recording("one-broker", {"s": [message("s", "1")]})) == "1 msg to 1 receiver"
    both = recording("one-broker", {"s": [message("s", "1")], "m1": [message("m1", "1"), message("m1", "2")]})
    assert describe_reference(SCENARIO, both) == "3 msgs to 2 receivers"


# ------------------------------------------------------------ the matrix and the saved results


def suite_result() -> SuiteResult:
    reference = recording("one-broker", {"s": [message("s", "1")]})
    federation = recording("federation", {})
    federation.explanation = ["a: originated 1", "c: nothing about these topics"]
    federation.ready_after = [0.5, 0.1, 0.2]
    cases = judge([SCENARIO], {"one-broker": {"x": reference}, "federation": {"x": federation},
                               "bridge-chain": {"x": recording("bridge-chain", {"s": [message("s", "1")]})}})
    return SuiteResult({"one-broker": "one", "federation": "fed", "bridge-chain": "chain"}, cases, 0.0, 60.0)


def test_the_matrix_has_a_column_per_setup_and_a_row_per_case() -> None:
    result = suite_result()
    table = report.text_table(result)
    assert table.splitlines()[0].split(" | ")[0].strip() == "case"
    assert "1 msg to 1 receiver" in table and "missing 1" in table and "same" in table
    markdown = report.markdown_table(result)
    assert markdown.splitlines()[0] == "| case | what the clients do | one broker | federation | bridge chain |"
    text = report.full_text(result)
    assert "## x on the federation: missing 1" in text and "  a: originated 1" in text
    assert "- federation: fed; 3 subscriptions reached from every site after 0.20 s (median), 0.50 s at most" in text
    assert "- one broker: one\n" in text
    assert "x on the bridge chain" not in text  # the same and without notes: nothing to say


def test_results_survive_a_round_trip_through_json() -> None:
    result = suite_result()
    again = SuiteResult.from_json(json.loads(json.dumps(result.to_json())))
    assert report.full_text(again) == report.full_text(result)
    assert isinstance(again.case("x"), CaseResult)
    with pytest.raises(KeyError):
        again.case("nope")


# ------------------------------------------------------------ what the wrappers said


def test_status_numbers_flatten_and_their_changes_read_as_deltas() -> None:
    document = {"drops": {"publication_too_large": 2}, "daemon": {"broker": {"log": {"truncated": 1}}, "ok": True}}
    assert flatten(document) == {"drops.publication_too_large": 2, "daemon.broker.log.truncated": 1}
    assert counter_changes({"drops.a": 1}, {"drops.a": 3, "drops.b": 1}) == ["drops.a +2", "drops.b +1"]


def test_events_are_counted_for_the_case_topics_without_probes() -> None:
    events = [
        {"t": 10.0, "type": "publication_originated", "topic": "tp/x/t", "retain": True, "filters": []},
        {"t": 10.1, "type": "publication_originated", "topic": "tp/x/tp-probe", "filters": ["tp/x/#"]},
        {"t": 10.1, "type": "publication_originated", "topic": "tp/x/t", "filters": ["tp/x/#"]},
        {"t": 10.2, "type": "publication_dropped", "topic": "tp/x/t", "reason": "too_large"},
        {"t": 10.3, "type": "subscription_added", "filter": "$share/g/tp/x/#", "federated": False},
        {"t": 10.4, "type": "publication_delivered", "topic": "tp/xy/t"},
        {"t": 99.0, "type": "publication_delivered", "topic": "tp/x/t"},
    ]
    assert concerns(events[4], "tp/x") and not concerns(events[5], "tp/x") and not concerns(events[1], "tp/x")
    assert event_summary(events, "tp/x", 9.0, 11.0) == \
        "originated retained (no filter) 1, originated 1, dropped too_large 1, subscription_added (not federated) 1"


def test_setups_map_sites_to_brokers(tmp_path: Any) -> None:
    one = Setup("one-broker", tmp_path, "127.0.210.10")
    assert one.probe_sites == ("a",) and one.address("c") == one.address("a")
    federation = Setup("federation", tmp_path, "127.0.211.10", "ring")
    assert federation.probe_sites == ("a", "b", "c") and len(federation.brokers.nodes) == 4
    assert federation.address("c")[0] == "127.0.211.12"
    with pytest.raises(ValueError, match="line"):
        Setup("bridge-chain", tmp_path, "127.0.212.10", "ring")


# ------------------------------------------------------------ the policy cases (issue 38)


def test_a_policy_case_line_is_put_under_the_case_prefix_keeping_what_it_says() -> None:
    from suites.transparency.policies import rewrite

    assert rewrite('sensors/# out 1 "" site-a/', "tp/x") == "sensors/# out 1 tp/x/ tp/x/site-a/"
    assert rewrite("cmd/# in 1", "tp/x") == "tp/x/cmd/# in 1"
    assert rewrite("s/#", "tp/x") == "tp/x/s/# out 0"
    assert rewrite('"" both 2 here there', "tp/x") == '"" both 2 tp/x/here tp/x/there'


def test_every_case_gives_each_policy_site_its_lines_or_everything_under_its_prefix() -> None:
    from suites.transparency.policies import POLICY_CASES, case_lines, policy_cases

    lines = case_lines(policy_cases(), prefix_of)
    assert set(lines) == {"a", "c"}
    for site in ("a", "c"):
        expected = sum(len(case.topics.get(site) or ("# both 2",)) for case in policy_cases())
        assert len(lines[site]) == expected
    assert "tp/policy-private-topics/# both 2" in lines["c"]  # c has no lines in that case: everything
    assert all(case.topics for case in POLICY_CASES.values())
    with pytest.raises(ScenarioError, match="b is the bridge chain's hub"):
        Scenario("x", "t", (), topics={"b": ("# both 2",)})
    with pytest.raises(ScenarioError, match="Invalid bridge topic direction"):
        Scenario("x", "t", (), topics={"a": ("# sideways",)})


def test_probes_go_where_the_lines_let_them_through() -> None:
    from federation.daemon.topic_policy import TopicPolicy
    from suites.transparency.policies import probe_topics

    policies = {"a": TopicPolicy.parse(['sensors/# out 1 "" site-a/', "cmd/# in 1"]), "b": TopicPolicy(),
                "c": TopicPolicy()}
    brokers = {"a": "a", "b": "b", "c": "c"}
    sites = ("a", "b", "c")
    assert probe_topics(policies, brokers, sites, "c", "site-a/sensors/#") == {
        "a": "sensors/tp-probe", "b": "site-a/sensors/tp-probe", "c": "site-a/sensors/tp-probe"}
    assert probe_topics(policies, brokers, sites, "c", "sensors/#") == {
        "b": "sensors/tp-probe", "c": "sensors/tp-probe"}  # a's sensors/ go out under site-a/
    assert probe_topics(policies, brokers, sites, "a", "cmd/+") == {
        "a": "cmd/tp-probe", "b": "cmd/tp-probe", "c": "cmd/tp-probe"}
    assert probe_topics(policies, brokers, sites, "a", "other/x") == {"a": "other/x"}
    # A subscriber of # on a is reached from elsewhere inside what a imports (cmd/#), from a on its own topic.
    assert probe_topics(policies, brokers, sites, "a", "$share/g/#") == {
        "a": "tp-probe", "b": "cmd/tp-probe", "c": "cmd/tp-probe"}


def test_a_bridge_chains_duplicates_are_left_out_at_the_highest_qos() -> None:
    from suites.transparency.compare import without_duplicates

    scenario = Scenario("dups", "t", (Connect("s", "c"), Connect("m1", "b"), Connect("m2", "c")),
                        groups={"g": ("m1", "m2")}, bridge_duplicates="overlapping lines")
    recording = Recording("dups", "bridge-chain", {
        "s": [message("s", "one", topic="t/x", qos=0, at=1.0), message("s", "one", topic="t/x", qos=2, at=1.1),
              message("s", "two", topic="t/y", qos=0, at=1.2)],
        "m1": [message("m1", "job", topic="t/j", at=2.0)], "m2": [message("m2", "job", topic="t/j", at=2.1)]})
    once = without_duplicates(scenario, recording)
    assert [(m.topic, m.qos) for m in once.messages["s"]] == [("t/x", 2), ("t/y", 0)]
    assert [m.client for m in [*once.messages["m1"], *once.messages["m2"]]] == ["m1"]  # the group got it once
    assert recording.messages["s"][0].qos == 0  # the recording itself is kept as it was


def test_the_policy_bridge_chain_bridges_a_and_c_to_b_with_their_lines(tmp_path: Any) -> None:
    setup = Setup("bridge-chain", tmp_path, "127.0.213.10", topics={"a": ["cmd/# in 1"]})
    bridges = setup.brokers
    conf = bridges.extra_conf(bridges.node("a"))  # type: ignore[attr-defined]
    assert conf is not None and "address 127.0.213.11:1883" in conf and "topic cmd/# in 1" in conf
    assert not [line for line in conf if line.startswith("topic #")]
    assert "topic # both 2" in (bridges.extra_conf(bridges.node("c")) or [])  # type: ignore[attr-defined]
    assert bridges.extra_conf(bridges.node("b")) is None  # type: ignore[attr-defined]
    assert setup.policy("a").texts == ("cmd/# in 1",) and setup.policy("b").everything
    assert not setup.settles_on_fence and Setup("one-broker", tmp_path, "127.0.214.10").settles_on_fence
    with pytest.raises(ValueError, match="one broker has no topic policy"):
        Setup("one-broker", tmp_path, "127.0.215.10", topics={"a": ["x"]})
