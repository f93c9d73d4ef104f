"""Federation modes: which filters are replicated in full, and how each filter's core is placed.

Theory of operation
-------------------
Interest-based routing (the default) suits most topics, but the seed
documents describe other ways to spread pub/sub over brokers, and each
serves a real need. They are options of the same engine, chosen per filter:

* ``replication: full`` (MQTT-ST, seed 001): every broker joins the mesh of a
  *replicated filter* R, which is then one tree rooted at R's core, and a
  publication whose topic matches R reaches every broker over that tree.
  ``full`` alone means R = ``#``; a mapping ``{filter: full}`` names several.
* ``core_placement: hash`` (seed 003): the core of a filter is the live
  member with the highest rendezvous weight (`federation.protocol.placement`);
  ``election`` (the default) is the seed's lowest-id election among
  subscribers. A mapping ``{filter: hash | election}`` sets it per filter.
* ``owned`` (seed 000): subtrees a node owns; see `federation.protocol.ownership`.

A per-filter rule applies to every federated filter *inside* it (every
topic the filter matches is matched by the rule's filter; `covers`). When
several rules cover a filter the most specific wins: the most literal levels,
then the most levels, then the alphabetically first. These settings must be
the same on every node (like every protocol setting), except `owned`,
`capability` and its weights, which describe the node itself.

This module parses and checks the settings (for `federation.protocol.settings`) and
answers, per filter, what the engine must do (`ModePolicy`). It is pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from federation.protocol.topic_filter import REPAIR_PREFIX, SHARE_PREFIX, federated_filter, validate_filter

INTEREST = "interest"
FULL = "full"
ELECTION = "election"
HASH = "hash"
LOWEST_ID = "lowest_id"
CAPABILITY = "capability"

REPLICATION_CHOICES = (INTEREST, FULL)
PLACEMENT_CHOICES = (ELECTION, HASH)
ROOT_CHOICES = (LOWEST_ID, CAPABILITY)

RETAINED_FILTER = "//retained//"
"""the built-in replicated filter that carries retained publications to every broker (docs/protocol.md rule 10):
a tree over the component like `replication: full`'s, made when the first retained publication needs it (so a
federation without retained publications sends nothing for it), kept out of the topic index (no topic is routed
on it by matching) and reserved: a client subscription to exactly this filter is not federated"""



def end_to_end(filter_: str) -> bool:
    """Does the origin's end-to-end custody (docs/protocol.md rule 7f) cover publications on `filter_`? Not a shared
    group's (one member serves it: rule 9), a repair's (it is one), nor the retained tree's (its stores converge by
    their own anti-entropy: rule 10). Where it does, a hop keeps no copy for a mesh neighbour that is down: the
    origin keeps the publication for the brokers beyond it and repairs it to them (federation.protocol.receivers)."""
    return not filter_.startswith((SHARE_PREFIX, REPAIR_PREFIX)) and filter_ != RETAINED_FILTER


RuleSetting = str | tuple[tuple[str, str], ...]
"""a mode for every filter (a string) or per-filter rules ((filter, mode) pairs, sorted)"""

_LEVEL = "/"
_ONE = "+"
_ALL = "#"


# ------------------------------------------------------------------ relations between filters


def covers(outer: str, inner: str) -> bool:
    """True if every topic that filter `inner` matches is matched by filter `outer` (inner is inside outer).

    Both must be valid, federated filters. `a/#` covers `a`, `a/b` and `a/+/c`;
    `a/+` covers `a/b` but not `a/#` (which matches `a` and `a/b/c`).
    """
    outer_levels = outer.split(_LEVEL)
    inner_levels = inner.split(_LEVEL)
    for position, level in enumerate(outer_levels):
        if level == _ALL:
            return True  # the rest of any topic, even no level (`a/#` matches `a`)
        if position >= len(inner_levels):
            return False  # inner's topics end here; outer needs another level
        inner_level = inner_levels[position]
        if inner_level == _ALL:
            # inner matches topics of any depth from here, outer does not; except at the first level,
            # where `#` and `+/#` are the same (a topic has at least one level)
            return position == 0 and outer_levels == [_ONE, _ALL]
        if level == _ONE:
            continue
        if inner_level != level:
            return False  # a different literal, or `+` (any level) against one literal
    return len(outer_levels) == len(inner_levels)


def overlaps(first: str, second: str) -> bool:
    """True if some topic matches both filters (valid, federated filters)."""
    a = first.split(_LEVEL)
    b = second.split(_LEVEL)
    for position in range(max(len(a), len(b))):
        x = a[position] if position < len(a) else None
        y = b[position] if position < len(b) else None
        if x == _ALL or y == _ALL:
            return True  # also when the other ended one level before: `a/#` matches `a`
        if x is None or y is None:
            return False
        if x != y and _ONE not in (x, y):
            return False
    return True


def specificity(filter_: str) -> tuple[int, int, str]:
    """Sort key of rules covering one filter: the first is the most specific."""
    levels = filter_.split(_LEVEL)
    literal = sum(1 for level in levels if level not in (_ONE, _ALL))
    return (-literal, -len(levels), filter_)


# ------------------------------------------------------------------ settings


def check_filter(value: Any, where: str) -> str:
    """A federated filter given in a setting, or ValueError saying what to write."""
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a topic filter (a string), got {value!r}")
    problem = validate_filter(value)
    if problem is not None:
        raise ValueError(f"{where}: {problem}")
    if federated_filter(value) != value:
        raise ValueError(f"{where}: {value!r} never federates ($-filters and $share/ are local to a broker); "
                         f"give the plain filter, e.g. 'kitchen/#'")
    return value


def _choice(value: Any, choices: tuple[str, ...], where: str) -> str:
    if isinstance(value, str) and value in choices:
        return value
    raise ValueError(f"{where}: expected one of {', '.join(choices)}, got {value!r}")


def parse_rules(value: Any, choices: tuple[str, ...], where: str, allowed_in_rules: tuple[str, ...]) -> RuleSetting:
    """`mode` for every filter, or `{filter: mode}` per filter (also accepted: [[filter, mode], ...])."""
    if isinstance(value, str) and value in choices:
        return value
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (list, tuple)) and all(isinstance(item, (list, tuple)) and len(item) == 2
                                                   for item in value):
        items = [(item[0], item[1]) for item in value]
    else:
        raise ValueError(f"{where}: expected one of {', '.join(choices)} (for every filter) or a mapping "
                         f"of filter: mode (e.g. {{\"alerts/#\": {allowed_in_rules[0]}}}), got {value!r}")
    rules: dict[str, str] = {}
    for filter_, mode in items:
        check_filter(filter_, f"{where}[{filter_!r}]")
        if filter_ in rules:
            raise ValueError(f"{where}: filter {filter_!r} is given twice; give each filter once")
        rules[filter_] = _choice(mode, allowed_in_rules, f"{where}[{filter_!r}]")
    return tuple(sorted(rules.items()))


def parse_owned(value: Any, where: str) -> tuple[str, ...]:
    """The subtrees a node owns: a list of federated filters (one filter alone is accepted too)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{where}: expected a list of topic filters, e.g. [\"kitchen/#\"], got {value!r}")
    owned = [check_filter(item, f"{where}[{index}]") for index, item in enumerate(value)]
    return tuple(sorted(set(owned)))


def parse_mode_setting(key: str, value: Any, where: str) -> Any:
    """The checked value of one mode setting (`MODE_SETTINGS`); ValueError names the fix."""
    if key == "replication":
        # Per filter only `full` means something: every filter not replicated in full is interest-based.
        return parse_rules(value, REPLICATION_CHOICES, where, (FULL,))
    if key == "core_placement":
        return parse_rules(value, PLACEMENT_CHOICES, where, PLACEMENT_CHOICES)
    if key == "replication_root":
        return _choice(value, ROOT_CHOICES, where)
    if key == "owned":
        return parse_owned(value, where)
    raise KeyError(key)


MODE_SETTINGS = ("replication", "core_placement", "replication_root", "owned")
"""settings whose values are not numbers; `federation.protocol.settings` hands them to `parse_mode_setting`"""


def describe_rules(value: RuleSetting) -> Any:
    """The setting as YAML would write it (a string or a mapping)."""
    return value if isinstance(value, str) else dict(value)


# ------------------------------------------------------------------ what the engine asks


class ModePolicy:
    """Per-filter answers from the settings, cached (filters are asked about on every reconcile)."""

    def __init__(self, replication: RuleSetting, core_placement: RuleSetting, replication_root: str,
                 capability: int) -> None:
        replicated: tuple[str, ...]
        if isinstance(replication, str):
            replicated = ("#",) if replication == FULL else ()
        else:
            replicated = tuple(sorted(filter_ for filter_, mode in replication if mode == FULL))
        self.replicated: tuple[str, ...] = replicated
        """the filters replicated in full: every node joins their meshes"""
        self._replicated = frozenset((*replicated, RETAINED_FILTER))
        """the replicated filters, the built-in one for retained publications included (made only on demand)"""
        if isinstance(core_placement, str):
            self._placement_rules: tuple[tuple[str, str], ...] = (("#", core_placement),)
        else:
            self._placement_rules = tuple(sorted(core_placement, key=lambda rule: specificity(rule[0])))
        self.capability_root = replication_root == CAPABILITY
        self.capability = capability
        self._placement: dict[str, str] = {}
        self.any_hash = any(mode == HASH for _, mode in self._placement_rules)

    @classmethod
    def from_settings(cls, settings: Any) -> ModePolicy:
        return cls(settings.replication, settings.core_placement, settings.replication_root,
                   int(settings.capability))

    def is_replicated(self, filter_: str) -> bool:
        """Is `filter_` itself a replicated filter (a tree every node joins)?"""
        return filter_ in self._replicated

    def placement(self, filter_: str) -> str:
        """`hash` or `election` for this federated filter: the most specific covering rule, else election."""
        cached = self._placement.get(filter_)
        if cached is None:
            cached = ELECTION
            if self.any_hash:
                for rule, mode in self._placement_rules:
                    if covers(rule, filter_):
                        cached = mode
                        break
            if len(self._placement) >= 65536:
                self._placement.clear()
            self._placement[filter_] = cached
        return cached

    def ranked_by_capability(self, filter_: str) -> bool:
        """Is the core of `filter_` chosen by capability (a replicated filter with `replication_root: capability`)?"""
        return self.capability_root and filter_ in self._replicated

    def rank(self, filter_: str) -> int:
        """The rank this node puts in its claims for `filter_` (its capability, or 0)."""
        return self.capability if self.ranked_by_capability(filter_) else 0

    def parents(self, filter_: str, redundancy: int) -> int:
        """Parents per member: one for replicated filters (a tree, as MQTT-ST), else `redundancy`."""
        return 1 if filter_ in self._replicated else redundancy

    def mode_name(self, filter_: str) -> str:
        """For status rows: `full`, `hash` or `interest`."""
        if filter_ in self._replicated:
            return FULL
        return HASH if self.placement(filter_) == HASH else INTEREST
