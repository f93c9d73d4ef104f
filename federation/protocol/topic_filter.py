"""MQTT topic names and topic filters: validation, matching and a filter index.

Theory of operation. Every wrapper decides, for each publication, which
federated subscriptions want it; that is a topic-filter match, and it runs on
the per-message path. This module is pure: it imports neither paho nor
`socket`. paho's `topic_matches_sub` lives in `paho.mqtt.client`, a module
that pulls in sockets, threads and `ssl`, and core modules must not depend on
that.

The rules are MQTT 5's (section 4.7), which mosquitto follows:

- levels are separated by `/`; an empty level is a real level (`a//b`);
- `+` matches exactly one level, also an empty one (`a/+` matches `a/`);
- `#` matches any number of levels, including none: `a/#` matches `a`;
- a filter that starts with a wildcard never matches a topic starting with
  `$` (`#` does not see `$SYS/...`); `$SYS/#` must be asked for by name.

`matches` is the readable reference. `FilterIndex` gives the same answers for
many filters at once by walking a trie of filter levels, so the cost of a
lookup grows with the topic's depth and the wildcards on its path, not with
the number of filters. Tests check the two against each other.

Shared subscriptions (`$share/<group>/<filter>`) are load balancing inside
one broker; what federates is the filter after the group, which
`federated_filter` returns. `matches` and `FilterIndex` treat `$share/...`
literally, like the broker's topic tree does: resolve it first.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

MAX_LENGTH = 65535
"""bytes: the longest topic or filter MQTT can carry (UTF-8, two-byte length prefix)"""

SHARE_PREFIX = "$share/"
REPAIR_PREFIX = "$repair/"
"""the filter of a repair copy (a mode 3 `tm` and its acknowledgements, docs/protocol.md rule 7f):
`$repair/<host>/<port>/<filter>`. A `$` filter never federates, so it never collides with a real one, and a copy
repairing one publication for one broker has a key of its own at every hop"""

_LEVEL_SEPARATOR = "/"
_SINGLE_LEVEL = "+"
_MULTI_LEVEL = "#"


def _encoding_error(text: str, what: str) -> str | None:
    """Checks shared by topics and filters: NUL, UTF-8 encodability, length."""
    if "\0" in text:
        return f"{what} {text!r} contains a NUL character (U+0000), which MQTT forbids"
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as error:
        return (f"{what} {text!r} is not valid UTF-8: {error.reason} at index {error.start}; "
                "MQTT strings must be well-formed UTF-8")
    if size > MAX_LENGTH:
        return f"{what} is {size} bytes long in UTF-8; MQTT allows at most {MAX_LENGTH}"
    return None


def _plain_filter_error(text: str) -> str | None:
    """The wildcard rules for a filter that is not (or no longer) a shared subscription."""
    if not text:
        return "empty topic filter: a filter needs at least one character (use '#' for everything)"
    levels = text.split(_LEVEL_SEPARATOR)
    for position, level in enumerate(levels):
        if _MULTI_LEVEL in level:
            if level != _MULTI_LEVEL:
                return (f"topic filter {text!r}: '#' must fill a whole level, "
                        f"found level {level!r}")
            if position != len(levels) - 1:
                return f"topic filter {text!r}: '#' must be the last level"
        if _SINGLE_LEVEL in level and level != _SINGLE_LEVEL:
            return f"topic filter {text!r}: '+' must fill a whole level, found level {level!r}"
    return None


def validate_filter(text: str) -> str | None:
    """Return why `text` is not a valid MQTT 5 topic filter, or None if it is.

    Checks: non-empty; `#` alone in the last level; `+` alone in its level;
    no NUL; well-formed UTF-8 of at most 65535 bytes. A shared subscription
    `$share/<group>/<filter>` needs a non-empty group without `/`, `+` or `#`
    and a valid filter after it.
    """
    encoding_error = _encoding_error(text, "topic filter")
    if encoding_error is not None:
        return encoding_error
    if text.startswith(SHARE_PREFIX):
        group, separator, rest = text[len(SHARE_PREFIX):].partition(_LEVEL_SEPARATOR)
        if not group:
            return f"shared subscription {text!r} has an empty group: expected $share/<group>/<filter>"
        if _SINGLE_LEVEL in group or _MULTI_LEVEL in group:
            return f"shared subscription {text!r}: the group name {group!r} must not contain '+' or '#'"
        if not separator or not rest:
            return f"shared subscription {text!r} has no filter: expected $share/<group>/<filter>"
        return _plain_filter_error(rest)
    return _plain_filter_error(text)


def validate_topic(text: str) -> str | None:
    """Return why `text` is not a valid topic name to publish to, or None if it is."""
    if not text:
        return "empty topic name: a publication needs a topic of at least one character"
    if _SINGLE_LEVEL in text or _MULTI_LEVEL in text:
        return f"topic name {text!r} contains a wildcard ('+' or '#'); only filters may"
    return _encoding_error(text, "topic name")


def _matchable_topic(topic: str) -> bool:
    """The cheap part of `validate_topic`, used on the per-message path.

    A topic that is empty or holds a wildcard or NUL matches no filter. The
    UTF-8 and length checks are left to `validate_topic`: a broker has already
    refused such a publication.
    """
    return bool(topic) and _SINGLE_LEVEL not in topic and _MULTI_LEVEL not in topic \
        and "\0" not in topic


def is_system(topic_or_filter: str) -> bool:
    """True for `$`-topics and filters (`$SYS/...`, `$share/...`), which wildcards do not reach."""
    return topic_or_filter.startswith("$")


def matches(filter_: str, topic: str) -> bool:
    """True if the topic filter `filter_` matches the topic name `topic` (MQTT 5 rules).

    False whenever the filter is invalid or the topic is empty or holds a
    wildcard or NUL. `$share/...` filters are taken literally (see the module
    comment); pass them through `federated_filter` first.
    """
    if validate_filter(filter_) is not None or not _matchable_topic(topic):
        return False
    if is_system(topic) and filter_[0] in (_SINGLE_LEVEL, _MULTI_LEVEL):
        return False
    filter_levels = filter_.split(_LEVEL_SEPARATOR)
    topic_levels = topic.split(_LEVEL_SEPARATOR)
    for position, filter_level in enumerate(filter_levels):
        if filter_level == _MULTI_LEVEL:
            return True  # also when the topic ended one level earlier: `a/#` matches `a`
        if position >= len(topic_levels):
            return False
        if filter_level != _SINGLE_LEVEL and filter_level != topic_levels[position]:
            return False
    return len(filter_levels) == len(topic_levels)


def repair_filter(host: str, port: int, filter_: str) -> str:
    """The filter a repair copy of `filter_`'s publication for the broker at host:port carries (rule 7f)."""
    return f"{REPAIR_PREFIX}{host}/{port}/{filter_}"


def split_repair(text: str) -> tuple[str, int, str] | None:
    """(host, port, filter) of a repair filter, or None when `text` is not one (a host never holds a `/`)."""
    if not text.startswith(REPAIR_PREFIX):
        return None
    host, _, rest = text[len(REPAIR_PREFIX):].partition(_LEVEL_SEPARATOR)
    port, _, filter_ = rest.partition(_LEVEL_SEPARATOR)
    if not host or not port.isdigit() or len(port) > 5 or not filter_:
        return None
    return host, int(port), filter_


def federated_filter(filter_: str) -> str | None:
    """The filter a local subscription asks the federation for, or None if it stays local.

    `$share/<group>/<filter>` federates `<filter>`; `$`-filters such as
    `$SYS/#` describe one broker and are never federated; invalid filters
    give None (the broker refuses them anyway).
    """
    if validate_filter(filter_) is not None:
        return None
    if filter_.startswith(SHARE_PREFIX):
        filter_ = filter_[len(SHARE_PREFIX):].partition(_LEVEL_SEPARATOR)[2]
    if is_system(filter_):
        return None
    return filter_


class _TrieNode:
    """One filter level. `filter` is set when a stored filter ends here. A child that leads to one stored filter
    only is that filter itself (a string), not a chain of nodes: a filter costs a dictionary entry where no other
    shares its levels (four nodes for `site7/dev/+/cmd` made the index of a thousand-node simulation gigabytes)."""

    __slots__ = ("children", "filter")

    def __init__(self) -> None:
        self.children: dict[str, _TrieNode | str] = {}
        self.filter: str | None = None


MATCH_CACHE_SIZE = 4096
"""topics whose matching filters a `FilterIndex` remembers (the memory is emptied when full)"""


def _expanded(held: str, depth: int) -> _TrieNode:
    """A node for a child that held one filter whole: the filter goes one level down (or ends at the node)."""
    node = _TrieNode()
    levels = held.split(_LEVEL_SEPARATOR)
    if depth == len(levels):
        node.filter = held
    else:
        node.children[levels[depth]] = held
    return node


def _rest_matches(filter_levels: list[str], levels: list[str], start: int) -> bool:
    """Do a filter's levels from `start` on match the topic's from `start` on (those before matched already)?"""
    for position in range(start, len(filter_levels)):
        level = filter_levels[position]
        if level == _MULTI_LEVEL:
            return True  # also when the topic ended one level earlier
        if position >= len(levels) or (level != _SINGLE_LEVEL and level != levels[position]):
            return False
    return len(filter_levels) == len(levels)


class FilterIndex:
    """A set of topic filters that answers "which of them match this topic?".

    Behaves like a set of strings (`add`, `discard`, `in`, `len`, sorted
    iteration). `matching(topic)` equals
    `[f for f in sorted(index) if matches(f, topic)]`, computed by walking a
    trie of filter levels. Invalid filters may be added (they can arrive from
    a peer); they are members of the set but never match, exactly as with
    `matches`. Validate at the boundary that received them to report them.
    """

    def __init__(self, filters: Iterable[str] = ()) -> None:
        self._root = _TrieNode()
        self._filters: set[str] = set()
        self._unmatchable: set[str] = set()
        self._matches: dict[str, list[str]] = {}
        """topic -> `matching(topic)`: publications repeat their topics; emptied whenever the set changes"""
        for filter_ in filters:
            self.add(filter_)

    def add(self, filter_: str) -> None:
        if filter_ in self._filters:
            return
        self._filters.add(filter_)
        self._matches.clear()
        if validate_filter(filter_) is not None:
            self._unmatchable.add(filter_)
            return
        levels = filter_.split(_LEVEL_SEPARATOR)
        node = self._root
        for depth, level in enumerate(levels):
            child = node.children.get(level)
            if child is None:
                node.children[level] = filter_  # the rest of its levels stay in the string
                return
            if isinstance(child, str):
                child = node.children[level] = _expanded(child, depth + 1)
            node = child
        node.filter = filter_

    def discard(self, filter_: str) -> None:
        if filter_ not in self._filters:
            return
        self._filters.remove(filter_)
        self._matches.clear()
        if filter_ in self._unmatchable:
            self._unmatchable.remove(filter_)
            return
        path: list[tuple[_TrieNode, str]] = []
        node = self._root
        for level in filter_.split(_LEVEL_SEPARATOR):
            path.append((node, level))
            child = node.children[level]
            if isinstance(child, str):  # the filter itself, held whole below this level
                del node.children[level]
                path.pop()
                break
            node = child
        else:
            node.filter = None
        # Prune the nodes that no longer lead to any filter, deepest first.
        for parent, level in reversed(path):
            child = parent.children[level]
            assert isinstance(child, _TrieNode)
            if child.filter is not None or child.children:
                break
            del parent.children[level]

    def __contains__(self, filter_: object) -> bool:
        return filter_ in self._filters

    def __len__(self) -> int:
        return len(self._filters)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._filters))

    def __repr__(self) -> str:
        return f"FilterIndex({sorted(self._filters)!r})"

    def matching(self, topic: str) -> list[str]:
        """The stored filters that match `topic`, sorted (a new list: the caller may keep or change it)."""
        cached = self._matches.get(topic)
        if cached is not None:
            return cached.copy()
        found = self._walk(topic)
        if len(self._matches) >= MATCH_CACHE_SIZE:
            self._matches.clear()
        self._matches[topic] = found
        return found.copy()

    def _walk(self, topic: str) -> list[str]:
        if not _matchable_topic(topic):
            return []
        levels = topic.split(_LEVEL_SEPARATOR)
        depth_of_topic = len(levels)
        wildcards_allowed_at_root = not is_system(topic)
        found: list[str] = []
        # Each trie node is reached at most once: from one node, the literal
        # child and the `+` child are different nodes, since topics hold no `+`.
        pending: list[tuple[_TrieNode, int]] = [(self._root, 0)]
        while pending:
            node, depth = pending.pop()
            wildcards_allowed = depth > 0 or wildcards_allowed_at_root
            if wildcards_allowed:
                rest = node.children.get(_MULTI_LEVEL)
                if rest is not None:  # `#` takes the remaining levels, even none
                    held = rest if isinstance(rest, str) else rest.filter
                    if held is not None:
                        found.append(held)
            if depth == depth_of_topic:
                if node.filter is not None:
                    found.append(node.filter)
                continue
            for child in (node.children.get(levels[depth]),
                          node.children.get(_SINGLE_LEVEL) if wildcards_allowed else None):
                if child is None:
                    continue
                if isinstance(child, str):  # one filter, its levels below this one still to compare
                    if _rest_matches(child.split(_LEVEL_SEPARATOR), levels, depth + 1):
                        found.append(child)
                else:
                    pending.append((child, depth + 1))
        found.sort()
        return found
