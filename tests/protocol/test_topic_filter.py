"""Topic-filter validation, MQTT 5 matching, and FilterIndex against `matches`."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.protocol.topic_filter import (
    MAX_LENGTH,
    FilterIndex,
    federated_filter,
    is_system,
    matches,
    validate_filter,
    validate_topic,
)

# ----------------------------------------------------------------- validation

VALID_FILTERS = [
    "#", "+", "a", "a/b", "a/+", "a/#", "+/+", "+/#", "/", "//", "a//b", "/#", "+/",
    "$SYS/#", "$SYS/broker/+", "sport/tennis/+/score", "é/ü/+", " ",
    "$share/group/a/#", "$share/g/+", "$share/g/$SYS/#", "$share", "$shared/a",
]

INVALID_FILTERS = [
    ("", "empty"),
    ("a#", "whole level"),
    ("#a", "whole level"),
    ("a/#/b", "last level"),
    ("#/#", "last level"),
    ("a/b#", "whole level"),
    ("a+", "whole level"),
    ("+a/b", "whole level"),
    ("a/++", "whole level"),
    ("a/\0", "NUL"),
    ("a/\ud800", "UTF-8"),
    ("$share/", "empty group"),
    ("$share//a", "empty group"),
    ("$share/g", "no filter"),
    ("$share/g/", "no filter"),
    ("$share/g+/a", "group name"),
    ("$share/g#/a", "group name"),
    ("$share/g/a/#/b", "last level"),
]


@pytest.mark.parametrize("filter_", VALID_FILTERS)
def test_valid_filters(filter_: str) -> None:
    assert validate_filter(filter_) is None


@pytest.mark.parametrize("filter_,reason", INVALID_FILTERS)
def test_invalid_filters_say_why(filter_: str, reason: str) -> None:
    error = validate_filter(filter_)
    assert error is not None
    assert reason in error


def test_filter_length_is_counted_in_utf8_bytes() -> None:
    assert validate_filter("a" * MAX_LENGTH) is None
    error = validate_filter("a" * (MAX_LENGTH + 1))
    assert error is not None and "65536 bytes" in error
    # Two bytes per character in UTF-8: within the limit by characters, over it by bytes.
    two_byte = "é" * (MAX_LENGTH // 2 + 1)
    assert len(two_byte) < MAX_LENGTH
    assert validate_filter(two_byte) is not None


@pytest.mark.parametrize("topic", ["a", "a/b", "/", "a//b", "$SYS/broker/uptime", " ", "é", "a/"])
def test_valid_topics(topic: str) -> None:
    assert validate_topic(topic) is None


@pytest.mark.parametrize("topic,reason", [
    ("", "empty"),
    ("a/+", "wildcard"),
    ("a/#", "wildcard"),
    ("a+b", "wildcard"),
    ("a/\0", "NUL"),
    ("\udfff", "UTF-8"),
    ("a" * (MAX_LENGTH + 1), "at most"),
])
def test_invalid_topics_say_why(topic: str, reason: str) -> None:
    error = validate_topic(topic)
    assert error is not None
    assert reason in error


def test_is_system() -> None:
    assert is_system("$SYS/broker/uptime")
    assert is_system("$share/g/a")
    assert is_system("$")
    assert not is_system("a/$SYS")
    assert not is_system("")
    assert not is_system("#")


# ------------------------------------------------------------------- matching

MATCH_CASES = [
    # Literal levels.
    ("a", "a", True),
    ("a", "b", False),
    ("a/b", "a/b", True),
    ("a/b", "a", False),
    ("a", "a/b", False),
    ("a/b", "a/c", False),
    ("A", "a", False),
    # `+`: exactly one level, possibly empty.
    ("+", "a", True),
    ("+", "a/b", False),
    ("a/+", "a/b", True),
    ("a/+", "a/", True),
    ("a/+", "a", False),
    ("a/+", "a/b/c", False),
    ("+/b", "/b", True),
    ("+/+", "/", True),
    ("+", "/", False),
    ("a/+/c", "a//c", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    # `#`: any number of levels, including none (the parent level).
    ("#", "a", True),
    ("#", "a/b/c", True),
    ("#", "/", True),
    ("a/#", "a", True),
    ("a/#", "a/", True),
    ("a/#", "a/b/c", True),
    ("a/#", "ab", False),
    ("a/#", "b/a", False),
    ("a/b/#", "a", False),
    ("/#", "/", True),
    ("/#", "a", False),
    ("+/#", "a", True),
    ("+/#", "a/b", True),
    ("+/+/#", "a", False),
    ("a//#", "a/", True),
    # `$` topics: wildcards in the first level never reach them.
    ("#", "$SYS/broker/uptime", False),
    ("+/broker/uptime", "$SYS/broker/uptime", False),
    ("+/#", "$SYS", False),
    ("$SYS/#", "$SYS/broker/uptime", True),
    ("$SYS/#", "$SYS", True),
    ("$SYS/+/uptime", "$SYS/broker/uptime", True),
    ("$SYS/broker/uptime", "$SYS/broker/uptime", True),
    ("#", "a/$SYS", True),
    ("a/+", "a/$x", True),
    # Shared subscriptions are literal here; resolve them with federated_filter.
    ("$share/g/a", "a", False),
    ("$share/g/a", "$share/g/a", True),
    # Invalid inputs never match.
    ("a/#/b", "a/x/b", False),
    ("a+", "a+", False),
    ("", "", False),
    ("#", "", False),
    ("+", "", False),
    ("a/+", "a/+", False),
    ("#", "a/#", False),
    ("#", "a\0", False),
]


@pytest.mark.parametrize("filter_,topic,expected", MATCH_CASES)
def test_matches(filter_: str, topic: str, expected: bool) -> None:
    assert matches(filter_, topic) is expected


@pytest.mark.parametrize("filter_,topic,expected", MATCH_CASES)
def test_index_agrees_on_the_table(filter_: str, topic: str, expected: bool) -> None:
    index = FilterIndex([filter_])
    assert index.matching(topic) == ([filter_] if expected else [])


# ---------------------------------------------------------- federated filters

@pytest.mark.parametrize("filter_,expected", [
    ("a/b", "a/b"),
    ("#", "#"),
    ("a/+/c", "a/+/c"),
    ("$share/group/a/#", "a/#"),
    ("$share/g/+", "+"),
    ("$share/g//x", "/x"),
    ("$SYS/#", None),
    ("$SYS/broker/uptime", None),
    ("$share/g/$SYS/#", None),
    ("$anything", None),
    ("$share", None),
    ("$share/g", None),
    ("", None),
    ("a/#/b", None),
    ("$share/g/a#", None),
])
def test_federated_filter(filter_: str, expected: str | None) -> None:
    assert federated_filter(filter_) == expected


# --------------------------------------------------------------- FilterIndex

def test_index_behaves_like_a_set() -> None:
    index = FilterIndex()
    assert len(index) == 0
    assert list(index) == []
    index.add("b/#")
    index.add("a/+")
    index.add("a/+")
    assert len(index) == 2
    assert list(index) == ["a/+", "b/#"]
    assert "a/+" in index
    assert "a/b" not in index
    assert 3 not in index
    index.discard("a/+")
    index.discard("a/+")
    index.discard("never/added")
    assert list(index) == ["b/#"]
    assert repr(index) == "FilterIndex(['b/#'])"


def test_index_matching_is_sorted_and_complete() -> None:
    filters = ["a/b/c", "a/+/c", "+/b/c", "#", "a/#", "a/b/#", "+/+/+", "a/b", "x/#", "$SYS/#"]
    index = FilterIndex(filters)
    assert index.matching("a/b/c") == ["#", "+/+/+", "+/b/c", "a/#", "a/+/c", "a/b/#", "a/b/c"]
    assert index.matching("a/b") == ["#", "a/#", "a/b", "a/b/#"]
    assert index.matching("$SYS/load") == ["$SYS/#"]
    assert index.matching("a/+") == []
    assert index.matching("") == []


def test_index_discard_prunes_without_losing_neighbours() -> None:
    index = FilterIndex(["a/b/c", "a/b", "a/#", "a/b/c/d"])
    index.discard("a/b/c/d")
    assert index.matching("a/b/c/d") == ["a/#"]
    assert index.matching("a/b/c") == ["a/#", "a/b/c"]
    index.discard("a/b")
    assert index.matching("a/b") == ["a/#"]
    assert index.matching("a/b/c") == ["a/#", "a/b/c"]
    index.discard("a/#")
    index.discard("a/b/c")
    assert len(index) == 0
    assert index._root.children == {}  # every node was pruned
    index.add("a/b")
    assert index.matching("a/b") == ["a/b"]


def test_invalid_filters_are_members_that_never_match() -> None:
    index = FilterIndex(["a/#/b", "a+", "", "a/b"])
    assert len(index) == 4
    assert "a/#/b" in index
    assert list(index) == ["", "a+", "a/#/b", "a/b"]
    assert index.matching("a/x/b") == []
    assert index.matching("a/b") == ["a/b"]
    index.discard("a/#/b")
    assert "a/#/b" not in index
    assert len(index) == 3


def test_index_against_matches_on_random_filters() -> None:
    """A seeded brute-force comparison over a small alphabet of levels."""
    rng = random.Random(20240601)
    levels = ["a", "b", "", "$SYS", "c"]

    def random_topic() -> str:
        return "/".join(rng.choice(levels) for _ in range(rng.randint(1, 4)))

    def random_filter() -> str:
        parts = [rng.choice(levels + ["+", "+"]) for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.3:
            parts.append("#")
        return "/".join(parts)

    index = FilterIndex()
    for round_ in range(30):
        for _ in range(25):
            index.add(random_filter())
        for filter_ in rng.sample(sorted(index), k=min(5, len(index))):
            index.discard(filter_)
        for _ in range(50):
            topic = random_topic()
            expected = [f for f in sorted(index) if matches(f, topic)]
            assert index.matching(topic) == expected, (round_, topic)


# ----------------------------------------------------------------- properties

LEVELS = st.sampled_from(["a", "b", "", "$SYS", "$x", "é", "a b"])
TOPICS = st.lists(LEVELS, min_size=1, max_size=5).map("/".join)
FILTER_LEVELS = st.one_of(LEVELS, st.just("+"), st.just("#"), st.just("a#"), st.just("+b"))
FILTERS = st.one_of(
    st.lists(FILTER_LEVELS, min_size=1, max_size=5).map("/".join),
    st.text(alphabet="ab/+#$", max_size=8),
)


@settings(max_examples=300, deadline=None)
@given(filters=st.sets(FILTERS, max_size=30), removed=st.sets(FILTERS, max_size=5),
       topics=st.lists(TOPICS, min_size=1, max_size=10))
def test_index_matching_equals_matches(filters: set[str], removed: set[str], topics: list[str]) -> None:
    index = FilterIndex(filters)
    for filter_ in sorted(removed):
        index.discard(filter_)
    kept = filters - removed
    assert list(index) == sorted(kept)
    for topic in topics:
        assert index.matching(topic) == [f for f in sorted(kept) if matches(f, topic)]


@given(filter_=FILTERS, topic=TOPICS)
def test_plus_and_hash_generalise_literals(filter_: str, topic: str) -> None:
    """A filter equal to the topic matches it unless it is invalid; `#` below a match matches too."""
    if validate_topic(topic) is None:
        assert matches(topic, topic)
        assert matches(topic + "/#", topic)
    if matches(filter_, topic) and not filter_.endswith("#"):
        assert matches(filter_ + "/#", topic)


@given(filter_=FILTERS)
def test_federated_filter_is_valid_and_not_system(filter_: str) -> None:
    federated = federated_filter(filter_)
    if federated is not None:
        assert validate_filter(federated) is None
        assert not is_system(federated)
