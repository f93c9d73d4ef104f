"""`SeenCache`: what it promises to remember, and its bounds."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from federation.protocol.dedup import SeenCache


def test_new_then_duplicate_and_a_positive_capacity() -> None:
    cache = SeenCache(4)
    assert cache.add("a") is True
    assert cache.add("a") is False
    assert "a" in cache and "b" not in cache
    with pytest.raises(ValueError, match="capacity must be positive"):
        SeenCache(0)


def test_the_older_half_is_forgotten_at_once_and_counted() -> None:
    cache = SeenCache(4)  # generations of 2
    for key in "abcd":
        assert cache.add(key)
    # a, b filled a generation, then c, d the next: a and b went with it
    assert set(cache) == {"c", "d"} and len(cache) == 2 and cache.evictions == 2
    assert cache.add("e") and set(cache) == {"c", "d", "e"}
    assert cache.add("f") and set(cache) == {"e", "f"} and cache.evictions == 4
    assert cache.add("c") is True  # forgotten, so new again


def test_a_key_seen_again_is_carried_into_the_newer_generation() -> None:
    cache = SeenCache(4)
    for key in "abc":
        cache.add(key)  # older: a, b; newer: c
    assert cache.add("a") is False  # newer: c, a -> full: older becomes c, a
    assert cache.add("x") and cache.add("y")  # c and a survive one more generation, then go
    assert "a" not in cache and set(cache) == {"x", "y"}
    assert len(cache) == 2


def test_capacity_one_remembers_the_last_key() -> None:
    cache = SeenCache(1)
    assert cache.add(1) and not cache.add(1)
    assert cache.add(2) and 1 not in cache and not cache.add(2)


@given(st.integers(min_value=1, max_value=16), st.lists(st.integers(min_value=0, max_value=40), max_size=300))
def test_every_key_among_the_last_half_capacity_is_remembered(capacity: int, keys: list[int]) -> None:
    """Against a least-recently-used model of capacity // 2: what the model holds is a duplicate, a key never
    added is new, and no more than `capacity` keys are held."""
    cache = SeenCache(capacity)
    model: OrderedDict[int, None] = OrderedDict()
    guaranteed = max(1, capacity // 2)
    ever: set[int] = set()
    for key in keys:
        new = cache.add(key)
        if key in model:
            assert not new, (key, list(model))
        if key not in ever:
            assert new
        ever.add(key)
        model[key] = None
        model.move_to_end(key)
        while len(model) > guaranteed:
            model.popitem(last=False)
        assert len(cache) <= capacity
        assert set(model) <= set(cache)


def _state(cache: SeenCache) -> tuple[set[object], set[object], int]:
    return set(cache._newer), set(cache._older), cache.evictions


@given(st.integers(1, 40), st.lists(st.lists(st.integers(0, 60), max_size=25), max_size=12))
def test_a_run_of_keys_at_once_leaves_what_one_at_a_time_leaves(capacity: int, runs: list[list[int]]) -> None:
    """`add_all`, and `add_if_all_new` when it takes a run, leave the generations and the eviction count that
    `add` of each key in order leaves; `add_if_all_new` takes a run only when `add` would find each one new, and
    otherwise changes nothing."""
    one, whole, checked = SeenCache(capacity), SeenCache(capacity), SeenCache(capacity)
    for keys in runs:
        results = [one.add(key) for key in keys]
        whole.add_all(keys)
        before = _state(checked)
        if checked.add_if_all_new(keys):
            assert all(results)
        else:
            assert _state(checked) == before
            for key in keys:
                checked.add(key)
        assert _state(whole) == _state(one) == _state(checked)
