"""The pure parts of the federation modes: filter relations, rendezvous hashing, capability, settings."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from federation.protocol.modes import ELECTION, FULL, HASH, ModePolicy, covers, overlaps
from federation.protocol.ownership import OwnershipTable
from federation.protocol.placement import capability, cpu_mhz, memory_mib, rendezvous_weight, rendezvous_winner
from federation.protocol.settings import Settings, SettingsError
from federation.protocol.topic_filter import matches
from federation.protocol.types import Address, BrokerId

ROOT = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------ covers / overlaps against brute force

LEVELS = ["a", "b", ""]
FILTER_LEVELS = ["a", "b", "+"]


def all_filters(depth: int) -> list[str]:
    found = ["#"]
    for length in range(1, depth + 1):
        for levels in itertools.product(FILTER_LEVELS, repeat=length):
            found.append("/".join(levels))
            found.append("/".join(levels) + "/#")
    return found


FILTERS = all_filters(3)
# Topics one level deeper than any filter, with a level ("z") no filter names: enough witnesses.
TOPICS = ["/".join(levels) for length in range(1, 6) for levels in itertools.product(LEVELS + ["z"], repeat=length)]
MATCHED = {f: frozenset(t for t in TOPICS if matches(f, t)) for f in FILTERS}


def test_covers_is_exactly_inclusion_of_matched_topics() -> None:
    wrong = [(outer, inner) for outer in FILTERS for inner in FILTERS
             if covers(outer, inner) != (MATCHED[inner] <= MATCHED[outer])]
    assert not wrong, wrong[:10]


def test_overlaps_is_exactly_a_common_topic() -> None:
    wrong = [(x, y) for x in FILTERS for y in FILTERS if overlaps(x, y) != bool(MATCHED[x] & MATCHED[y])]
    assert not wrong, wrong[:10]


@pytest.mark.parametrize("outer,inner,expected", [
    ("kitchen/#", "kitchen", True), ("kitchen/#", "kitchen/oven/temp", True), ("kitchen/#", "+/light", False),
    ("kitchen/+", "kitchen/#", False), ("#", "a/+/b/#", True), ("kitchen/oven/#", "kitchen/#", False),
])
def test_covers_examples(outer: str, inner: str, expected: bool) -> None:
    assert covers(outer, inner) is expected


# ------------------------------------------------------------------ rendezvous hashing


def ids(count: int) -> list[BrokerId]:
    return [BrokerId(index, Address(f"10.0.{index // 250}.{index % 250 + 1}", 10500)) for index in range(count)]


def test_weight_is_sha256_of_filter_and_address_and_does_not_depend_on_the_hash_seed() -> None:
    import hashlib

    expected = int.from_bytes(hashlib.sha256(b"a/#\x0010.0.0.1:10500").digest()[:8], "big")
    assert rendezvous_weight("a/#", Address("10.0.0.1", 10500)) == expected
    code = ("from federation.protocol.placement import rendezvous_weight; "
            "from federation.protocol.types import Address; "
            "print(rendezvous_weight('a/#', Address('10.0.0.1', 10500)))")
    for seed in ("1", "2"):
        output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}, cwd=str(ROOT)).stdout
        assert int(output) == expected


def test_winner_is_the_highest_weight_and_order_free() -> None:
    members = ids(20)
    for filter_ in ("a", "b/#", "c/+/d"):
        winner = rendezvous_winner(filter_, members)
        assert winner == max(members, key=lambda m: rendezvous_weight(filter_, m.address))
        assert rendezvous_winner(filter_, reversed(members)) == winner
    assert rendezvous_winner("a", []) is None


def test_cores_spread_evenly_and_only_the_leavers_filters_move() -> None:
    members = ids(10)
    filters = [f"topic/{index}" for index in range(2000)]
    before = {f: rendezvous_winner(f, members) for f in filters}
    load = Counter(before.values())
    assert len(load) == 10 and max(load.values()) < 2.0 * min(load.values()), load
    leaver = members[3]
    after = {f: rendezvous_winner(f, [m for m in members if m != leaver]) for f in filters}
    moved = {f for f in filters if before[f] != after[f]}
    assert moved == {f for f in filters if before[f] == leaver}
    joiner = BrokerId(99, Address("10.0.9.9", 10500))
    joined = {f: rendezvous_winner(f, members + [joiner]) for f in filters}
    assert {f for f in filters if joined[f] != before[f]} == {f for f in filters if joined[f] == joiner}


# ------------------------------------------------------------------ capability

CPUINFO = "processor\t: 0\ncpu MHz\t\t: 2400.000\n\nprocessor\t: 1\ncpu MHz\t\t: 2600.5\n"
MEMINFO = "MemTotal:       16384000 kB\nMemFree:         1000 kB\n"


def test_capability_is_a_times_mhz_plus_b_times_mib() -> None:
    assert cpu_mhz(CPUINFO) == pytest.approx(5000.5)
    assert memory_mib(MEMINFO) == pytest.approx(16000.0)
    assert capability(CPUINFO, MEMINFO, 1.0, 1.0) == 21000
    assert capability(CPUINFO, MEMINFO, 2.0, 0.5) == 18001
    assert capability("", "", 1.0, 1.0) == 0


def test_capability_of_this_machine_is_positive() -> None:
    with open("/proc/cpuinfo", encoding="utf-8") as cpu, open("/proc/meminfo", encoding="utf-8") as memory:
        assert capability(cpu.read(), memory.read(), 1.0, 1.0) > 0


# ------------------------------------------------------------------ settings and policy


def test_settings_accept_every_documented_form() -> None:
    settings = Settings.from_mapping({
        "replication": {"alerts/#": "full"}, "core_placement": {"metrics/#": "hash", "metrics/x/#": "election"},
        "replication_root": "capability", "owned": ["kitchen/#", "garage/#"], "capability": 7,
    })
    assert settings.replication == (("alerts/#", "full"),)
    assert settings.owned == ("garage/#", "kitchen/#")
    # The normalised values are accepted again (scenario per-node settings merge them back in).
    assert Settings.from_mapping({name: getattr(settings, name) for name in settings.__dataclass_fields__}) == settings
    assert Settings.from_mapping({"replication": "full", "owned": "kitchen/#"}).owned == ("kitchen/#",)
    assert Settings().replication == "interest" and Settings().core_placement == "election"


@pytest.mark.parametrize("values,fragment", [
    ({"replication": "everything"}, "settings.replication: expected one of interest, full"),
    ({"replication": {"a/#": "interest"}}, "settings.replication['a/#']: expected one of full"),
    ({"core_placement": {"a/#": "random"}}, "expected one of election, hash"),
    ({"core_placement": {"a/#x": "hash"}}, "'#' must fill a whole level"),
    ({"owned": ["$SYS/#"]}, "never federates"),
    ({"owned": [3]}, "expected a topic filter"),
    ({"replication_root": "fastest"}, "expected one of lowest_id, capability"),
    ({"capability": -1}, "must not be negative"),
])
def test_bad_mode_settings_name_the_field_and_the_fix(values: dict[str, object], fragment: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_mapping(values)
    assert fragment in str(caught.value)


def test_policy_answers_per_filter() -> None:
    policy = ModePolicy((("alerts/#", FULL),), (("metrics/#", HASH), ("metrics/local/#", ELECTION)), "capability", 5)
    assert policy.replicated == ("alerts/#",)
    assert policy.is_replicated("alerts/#") and not policy.is_replicated("alerts/fire")
    assert policy.placement("metrics/cpu") == HASH
    assert policy.placement("metrics/local/disk") == ELECTION  # the more specific rule wins
    assert policy.placement("chat/#") == ELECTION
    assert policy.rank("alerts/#") == 5 and policy.rank("metrics/cpu") == 0
    assert policy.parents("alerts/#", 2) == 1 and policy.parents("chat/#", 2) == 2
    everything = ModePolicy(FULL, HASH, "lowest_id", 0)
    assert everything.replicated == ("#",) and everything.placement("x/y") == HASH
    assert not everything.ranked_by_capability("#")


# ------------------------------------------------------------------ ownership bookkeeping


def test_ownership_flood_rule_conflicts_and_owner_choice() -> None:
    me = BrokerId(5, Address("10.0.0.5", 10500))
    other = BrokerId(3, Address("10.0.0.3", 10500))
    table = OwnershipTable(["kitchen/#"], capacity=16)
    assert table.receive("kitchen/oven/#", other, 1, 1, 1, False, 0.0) == "new"
    assert table.receive("kitchen/oven/#", other, 1, 1, 2, False, 0.1) == "old"       # same, longer
    assert table.receive("kitchen/oven/#", other, 1, 2, 3, False, 0.2) == "refresh"   # newer
    conflicts = table.new_conflicts()
    assert [(c.own, c.other_subtree, c.other) for c in conflicts] == [("kitchen/#", "kitchen/oven/#", other)]
    assert table.new_conflicts() == []  # reported once
    alive = lambda entry: entry.owner  # noqa: E731 - every announced owner is live here
    assert table.owner_of("kitchen/oven/temp", me, alive) == other  # covered by both: the lowest id
    assert table.owner_of("kitchen/light", me, alive) == me
    assert table.owner_of("+/light", me, alive) is None  # overlaps, not inside: not owned
    assert table.owner_of("kitchen/oven/temp", me, lambda entry: None) == me  # the other is not live
    assert table.receive("kitchen/oven/#", other, 1, 3, 1, True, 0.3) == "new"        # withdrawn
    assert table.receive("kitchen/oven/#", other, 1, 2, 1, False, 0.4) == "old"       # a late copy
    table.forget_conflicts()
    assert table.conflicts == {}
    assert table.receive("garage/#", other, 1, 1, 1, False, 0.0) == "new"
    assert table.expire(lifetime=15.0, now=20.0) and not table.entries
    assert table.receive("garage/#", other, 1, 1, 1, False, 21.0) == "old"             # expired: not again
