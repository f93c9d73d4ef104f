"""Topic policies in Mosquitto's bridge `topic` syntax (federation.daemon.topic_policy): the parsing rules and
messages, the mapping of topics and filters both ways, the QoS cap, overlapping lines; the filter arithmetic
checked against the reference matcher on every topic of a small alphabet."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.daemon.topic_policy import (
    MAPPED_TOPIC_INVALID,
    NO_IN_LINE,
    NO_OUT_LINE,
    Crossing,
    TopicLineError,
    TopicPolicy,
    intersect,
    parse_line,
)
from federation.protocol.topic_filter import matches


def policy(*lines: str) -> TopicPolicy:
    return TopicPolicy.parse(lines)


# ------------------------------------------------------------------ parsing


def test_a_line_reads_as_mosquitto_reads_it() -> None:
    line = parse_line('sensors/# out 1 "" site-a/')
    assert (line.pattern, line.direction, line.qos, line.local_prefix, line.remote_prefix) == \
        ("sensors/#", "out", 1, None, "site-a/")
    assert (line.local_topic, line.remote_topic) == ("sensors/#", "site-a/sensors/#")
    assert parse_line("x").direction == "out" and parse_line("x").qos == 0  # Mosquitto's defaults
    assert parse_line("x BOTH 2").direction == "both"  # strcasecmp
    assert parse_line("  x   in   1  ").direction == "in"  # runs of spaces separate, as strtok's
    assert parse_line("x out # a comment").qos == 0
    assert parse_line("x out 2 # a comment").local_prefix is None
    assert parse_line('"" both 0 loc/ rem/').local_topic == "loc/"
    assert parse_line('a/+ both 2 "" ""').remaps is False


@pytest.mark.parametrize(("text", "mosquitto"), [
    ("", "Error: Empty topic value in configuration."),
    ("sensors/# up 1", "Error: Invalid bridge topic direction 'up'."),
    ("x out 3", "Error: Invalid bridge QoS level '3'."),
    ("x out -1", "Error: Invalid bridge QoS level '-1'."),
    ('"" both 0 a/ ""', "Error: Invalid bridge remapping."),
    ("x both 0 a# b/", "Error: Invalid bridge topic local prefix 'a#'."),
    ("a/+ both 2 lo/ re/+/", "Error: Invalid bridge topic remote prefix 're/+/'."),
    ("# both 0 loc rem", "Error: Invalid bridge topic local prefix and pattern combination 'loc#'."),
])
def test_a_bad_line_gets_mosquittos_message(text: str, mosquitto: str) -> None:
    with pytest.raises(TopicLineError) as raised:
        parse_line(text)
    assert raised.value.mosquitto == mosquitto
    assert str(raised.value).startswith(mosquitto) and raised.value.fix


@pytest.mark.parametrize(("text", "says"), [
    ("x both 0 a/", "without a remote prefix"),          # Mosquitto takes the missing prefix as empty
    ('x both 0 ""', "without a remote prefix"),
    ("x out 1x", "Invalid bridge QoS level '1x'"),         # Mosquitto's atoi reads 1
    ("x out 256", "Invalid bridge QoS level '256'"),       # ... and (uint8_t) 256 is 0
    ("a/#/b out", "Invalid bridge topic pattern 'a/#/b'"),  # Mosquitto starts, its subscription fails
    ("x out 1 a/ b/ extra", "Unexpected 'extra'"),         # Mosquitto ignores the rest
    ("$SYS/# out", "no $ topics"),
    ("topic sensors/# out", "Leave out the word `topic`"),
])
def test_where_the_wrapper_is_stricter_it_says_what_to_write(text: str, says: str) -> None:
    with pytest.raises(TopicLineError, match=says.replace("(", r"\(").replace("$", r"\$")):
        parse_line(text)


# ------------------------------------------------------------------ decisions


def test_the_issue_example_maps_out_and_in() -> None:
    site_a = policy('sensors/# out 1 "" site-a/', "cmd/# in 1")
    assert site_a.export("sensors/t1") == Crossing("site-a/sensors/t1", 1)
    assert site_a.export("private/x") == NO_OUT_LINE
    assert site_a.export("cmd/a1") == NO_OUT_LINE        # an `in` line lets nothing out
    assert site_a.import_("cmd/a1") == Crossing("cmd/a1", 1)
    assert site_a.import_("other/x") == NO_IN_LINE
    assert site_a.import_("site-a/sensors/echo") == NO_IN_LINE  # an `out` line lets nothing in
    assert site_a.import_filters("cmd/#") == {"cmd/#": 1}
    assert site_a.import_filters("sensors/#") == {}     # nothing to ask the federation for: no mesh joined
    assert site_a.import_filters("#") == {"cmd/#": 1}   # only what can be injected
    assert site_a.import_filters("+/a1") == {"cmd/a1": 1}


def test_both_ways_with_prefixes_map_back_and_forth() -> None:
    site = policy("# both 2 local/ fed/site-b/")
    assert site.export("local/x/y") == Crossing("fed/site-b/x/y", 2)
    assert site.export("other") == NO_OUT_LINE
    assert site.import_("fed/site-b/x/y") == Crossing("local/x/y", 2)
    assert site.import_filters("local/+/y") == {"fed/site-b/+/y": 2}
    # `fed/site-b/#` matches `fed/site-b` too, which Mosquitto injects as `local/fed/site-b`: asked for by name
    assert site.import_filters("$share/g/local/#") == {"$share/g/fed/site-b/#": 2, "$share/g/fed/site-b": 2}
    assert site.import_filters("$SYS/#") == {"$SYS/#": 2}  # left as is: the node never federates it


def test_the_first_line_with_a_prefix_maps_the_topic_as_in_mosquitto() -> None:
    """Mosquitto's send__publish maps with the first remapping line that matches, whichever line delivered."""
    lines = policy("a/# out 0", 'a/b/# out 2 "" x/', 'a/# out 1 "" y/')
    assert lines.export("a/b/c") == Crossing("x/a/b/c", 2)  # the highest QoS of the matching lines
    assert lines.export("a/c") == Crossing("y/a/c", 1)
    assert policy("a/# out 1").export("a/c") == Crossing("a/c", 1)


def test_the_empty_pattern_maps_one_prefix_onto_the_other() -> None:
    lines = policy('"" both 1 here/status there/status')
    assert lines.export("here/status") == Crossing("there/status", 1)
    assert lines.export("here/status/x") == NO_OUT_LINE  # the local topic is a topic, not a subtree


def test_a_mapping_that_empties_the_topic_is_refused() -> None:
    assert policy('# out 1 a/ ""').export("a/") == MAPPED_TOPIC_INVALID


def test_no_line_is_the_federation_as_it_was() -> None:
    everything = TopicPolicy()
    assert everything.everything and everything.export("any/t") == Crossing("any/t", 2)
    assert everything.import_("any/t") == Crossing("any/t", 2)
    assert everything.import_filters("$share/g/a/#") == {"$share/g/a/#": 2}
    assert policy("x").everything is False
    assert policy("a out", "b in") == policy("a out", "b in") != policy("b in", "a out")


def test_decisions_are_cached_per_topic() -> None:
    lines = policy("a/# out 1")
    first = lines.export("a/b")
    assert lines.export("a/b") is first


# ------------------------------------------------------------------ filter arithmetic, against the reference


LEVELS = ("a", "b", "")
TOPICS = ["/".join(levels) for depth in range(1, 5) for levels in itertools.product(LEVELS, repeat=depth)]
"""every topic of up to 4 levels over a, b and the empty level"""
filters = st.lists(st.sampled_from(("a", "b", "", "+")), min_size=0, max_size=3).flatmap(
    lambda levels: st.sampled_from(["/".join([*levels, "#"]), "/".join(levels)] if levels else ["#"]))


@settings(max_examples=400, deadline=None)
@given(filters, filters)
def test_intersect_matches_exactly_what_both_filters_match(first: str, second: str) -> None:
    common = intersect(first, second)
    both = {topic for topic in TOPICS if matches(first, topic) and matches(second, topic)}
    found = {topic for topic in TOPICS if common is not None and matches(common, topic)}
    assert found == both, (first, second, common)


lines_strategy = st.lists(st.tuples(filters, st.sampled_from(("in", "out", "both")), st.sampled_from(("", "a/", "b/")),
                                    st.sampled_from(("", "a/", "b/"))), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(lines_strategy, filters)
def test_a_subscription_asks_for_every_federation_topic_it_would_receive(
        specs: list[tuple[str, str, str, str]], local_filter: str) -> None:
    """Whatever the lines: a federation topic injected here under a topic the local filter matches is matched by
    one of the filters the subscription asks the federation for (the mesh it joins brings it)."""
    texts = [f"{pattern} {direction} 1 {local or chr(34) * 2} {remote or chr(34) * 2}"
             for pattern, direction, local, remote in specs]
    try:
        lines = policy(*texts)
    except TopicLineError:
        return  # a prefix and pattern Mosquitto refuses
    asked = lines.import_filters(local_filter)
    for topic in TOPICS:
        crossing = lines.import_(topic)
        if isinstance(crossing, Crossing) and matches(local_filter, crossing.topic):
            assert any(matches(federated, topic) for federated in asked), (texts, local_filter, topic, asked)
