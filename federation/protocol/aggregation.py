"""Which filters a node federates for its local subscriptions: covering filters instead of thousands of exact ones.

Theory of operation
-------------------
A site that gives every device its own topics (`dev/<id>/cmd`) holds tens of
thousands of subscriptions on one broker. Federated one by one, each is a
topic core, a mesh and a row at every node of the federation; federated as
one covering filter (`dev/+/cmd`) they cost one. The price is extra
deliveries: a publication to a device nobody subscribes to here crosses the
overlay to this broker all the same (the node injects only what a local
subscription matches: `LocalSubscriptions.index`), so over-delivery costs
traffic, never a wrong delivery. docs/protocol.md "Aggregation" gives the
trade-off as measured.

The rule, over the node's *raw* federated filters (one per distinct filter a
local client holds, `federated_filter` applied):

1. **Collapse by fan-out.** The raw filters form a trie of levels. A node of
   the trie with more than `fanout` distinct next levels is *collapsed*: every
   raw filter below it is federated with that level replaced by `+`
   (`dev/17/cmd` -> `dev/+/cmd`), the rest of the filter kept. Only the
   topmost collapsed node on a path counts. It stays collapsed until its
   fan-out falls below half of `fanout` (hysteresis: churn at the threshold
   must not flip the federated set back and forth).
2. **Coarsen.** If the filters below a collapsed node still differ in more
   than `fanout` ways after the `+` (`dev/<id>/<id-specific>`), the node
   federates `prefix/#` instead, until they differ in fewer than half as many.
3. **Cover.** A federated filter that another federated filter of this node
   covers (`dev/5/cmd` under `dev/#`, `dev/+/cmd` under `dev/+/#`) is not
   federated on its own: it costs nothing more.

A raw filter whose level at a collapsed node is `#` (`dev/#` under a
collapsed `dev`) keeps its own form: `+` would not cover it, and it covers
the rest anyway. With `fanout` 0 only rule 3 applies.

The trie is path-compressed (a child that leads to a single raw filter is
stored as the rest of that filter, not as nodes), so a per-device filter
costs a dictionary entry. No raw filter remembers its federated form: the
form is a function of the trie, computed again for the filters below a node
whose state changes.

Outputs: `effective` (federated filter -> raw filters it serves) and the
changes to it (`take_changes`), each a batch of filters that entered and
left together. The caller (`LocalSubscriptions`) keeps a filter that left in
the same batch as others entered until those others' meshes are ready, so a
re-aggregation never leaves a gap in which a publication finds no mesh.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from federation.protocol.topic_filter import MATCH_CACHE_SIZE, FilterIndex

SEPARATOR = "/"
SINGLE = "+"
MULTI = "#"
Core = TypeVar("Core")
_WILD_LEVEL = "\x01"
"""stands for a wildcard level of a filter looked up as a topic among the wildcard filters (only `+` and `#`
match it, as only they can cover a wildcard level; `covers` then judges exactly)"""


def covers(wider: str, narrower: str) -> bool:
    """Does every topic `narrower` matches also match `wider` (MQTT filter semantics)? True for equal filters."""
    wide = wider.split(SEPARATOR)
    narrow = narrower.split(SEPARATOR)
    for position, level in enumerate(wide):
        if level == MULTI:
            return True  # also when `narrower` ends one level earlier: `a/#` matches `a`
        if position >= len(narrow):
            return False
        other = narrow[position]
        if other == MULTI:
            return False
        if level != SINGLE and level != other:
            return False
    return len(narrow) == len(wide)


def _rest(levels: list[str]) -> str:
    """The levels after a child, as a compressed child stores them: each with a separator before it, so "" (the
    filter ends at the child) differs from "/" (one more level, empty)."""
    return "".join(SEPARATOR + level for level in levels)


def covering(index: FilterIndex, filter_: str) -> list[str]:
    """The filters of `index` that cover `filter_` (itself included when it is there), sorted."""
    return [other for other in index.matching(_probe(filter_)) if covers(other, filter_)]


def _rest_matches(rest: list[str], levels: list[str], start: int) -> bool:
    """Do the filter levels `rest` match the topic levels from `start` on (MQTT rules)?"""
    for offset, level in enumerate(rest):
        if level == MULTI:
            return True  # also when the topic ended one level earlier
        position = start + offset
        if position >= len(levels) or (level != SINGLE and level != levels[position]):
            return False
    return start + len(rest) == len(levels)


class ServingCores(Generic[Core]):
    """Who serves a subscription to a filter in a view of the cores (filter -> core): the filter's own core or, when
    it has none, the core of a filter there that covers it (the first in sorted order: a broker federates a covering
    filter for the ones it covers). For checks over many filters: the covering filters are indexed once."""

    def __init__(self, cores: Mapping[str, Core]) -> None:
        self._cores = cores
        self._wildcards: FilterIndex | None = None

    def __call__(self, filter_: str) -> Core | None:
        core = self._cores.get(filter_)
        if core is not None:
            return core
        if self._wildcards is None:
            self._wildcards = FilterIndex(other for other in self._cores if SINGLE in other or MULTI in other)
        found = covering(self._wildcards, filter_)
        return self._cores[found[0]] if found else None


def _probe(filter_: str) -> str:
    return SEPARATOR.join(_WILD_LEVEL if level in (SINGLE, MULTI) else level for level in filter_.split(SEPARATOR))


class _Node:
    """One level of the raw trie. `children` maps a next level to a node, or to the rest of the one raw filter
    below it (`_rest`: "" when that filter ends at the child)."""

    __slots__ = ("children", "ends", "collapsed", "suffixes", "coarse")

    def __init__(self) -> None:
        self.children: dict[str, _Node | str] = {}
        self.ends = False
        """a raw filter ends at this node"""
        self.collapsed = False
        """the topmost collapsed node of its path (rule 1)"""
        self.suffixes: Counter[str] | None = None
        """when collapsed: the rest after the collapsed level of each raw filter below, counted (rule 2)"""
        self.coarse = False
        """when collapsed: federated as `prefix/#` (rule 2)"""


@dataclass(frozen=True, slots=True)
class Batch:
    """Effective filters that entered (`added`) and left (`removed`) as one change."""

    added: tuple[str, ...]
    removed: tuple[str, ...]


class Aggregation:
    """The federated filters for a set of raw filters (see the module docstring)."""

    def __init__(self, fanout: int) -> None:
        if fanout < 0:
            raise ValueError(f"fanout must be 0 (off) or more, got {fanout}")
        self.fanout = fanout
        self._root = _Node()
        self._raw = 0
        self.federated: Counter[str] = Counter()
        """federated filter (rules 1 and 2) -> raw filters it stands for"""
        self.effective: dict[str, str] = {}
        """federated filter not covered by another (rule 3) -> itself; the mesh's local interest"""
        self._covered_by: dict[str, str] = {}
        """federated filter covered by another -> the one that covers it (the top of a chain)"""
        self._covering: dict[str, set[str]] = {}
        """the other way: federated filter -> the ones it covers"""
        self._wildcards = FilterIndex()
        """the federated filters with a wildcard: the only ones that can cover another"""
        self._batches: list[Batch] = []
        self._matches: dict[str, list[str]] = {}
        """topic -> `matching(topic)`: publications repeat their topics; emptied whenever a raw filter comes or
        goes"""

    def __len__(self) -> int:
        return self._raw

    # ------------------------------------------------------------ changes

    def add(self, raw: str) -> None:
        """A raw filter (already validated and federated) gained its first local subscription."""
        levels = raw.split(SEPARATOR)
        path = self._insert(levels)
        if path is None:
            return  # already there
        self._raw += 1
        self._matches.clear()
        before: Counter[str] = Counter()
        after: Counter[str] = Counter()
        collapsed_at = self._topmost_collapsed(path)
        if collapsed_at is not None:
            node, depth = collapsed_at
            self._suffix_change(node, levels, depth, +1, before, after)
        else:
            # A node on the path may now pass the fan-out: the topmost that does collapses.
            for node, depth in path:
                if self.fanout and not node.collapsed and len(node.children) > self.fanout:
                    self._remap(node, levels[:depth], lambda n=node, d=depth: self._collapse(n, levels[:d]),
                                before, after, exclude=raw)
                    after[self._form(levels)] += 1
                    break
            else:
                after[self._form(levels)] += 1
        self._apply(before, after)

    def remove(self, raw: str) -> None:
        """A raw filter lost its last local subscription."""
        levels = raw.split(SEPARATOR)
        if not self._contains(levels):
            return
        before: Counter[str] = Counter()
        after: Counter[str] = Counter()
        before[self._form(levels)] += 1
        path = self._path(levels)
        collapsed_at = self._topmost_collapsed(path)
        self._delete(levels)
        self._raw -= 1
        self._matches.clear()
        if collapsed_at is not None:
            node, depth = collapsed_at
            suffixes = node.suffixes
            assert suffixes is not None
            self._count_suffix(suffixes, levels, depth, -1)
            prefix = levels[:depth]
            if len(node.children) < self.fanout // 2 or not node.children:
                self._remap(node, prefix, lambda: self._uncollapse(node, prefix), before, after)
            elif node.coarse and len(suffixes) < self.fanout // 2:
                self._remap(node, prefix, lambda: setattr(node, "coarse", False), before, after)
        self._apply(before, after)

    def take_changes(self) -> list[Batch]:
        """The changes to `effective` since the last call, in order."""
        batches, self._batches = self._batches, []
        return batches

    def form_of(self, raw: str) -> str:
        """The federated filter a raw filter held here is federated as (rules 1 and 2; before rule 3)."""
        levels = raw.split(SEPARATOR)
        if not self._contains(levels):
            raise KeyError(raw)
        return self._form(levels)

    def serving(self, raw: str) -> str:
        """The effective filter whose mesh brings the publications `raw` matches."""
        form = self.form_of(raw)
        return self._covered_by.get(form, form)

    def matching(self, topic: str) -> list[str]:
        """The raw filters held here that match `topic`, sorted (a new list), as `FilterIndex.matching` gives them:
        the trie that aggregates the filters also answers which publications the local broker wants, so the raw
        filters are held once (a `FilterIndex` of them cost 400 bytes a filter more)."""
        cached = self._matches.get(topic)
        if cached is not None:
            return cached.copy()
        found = self._find(topic)
        if len(self._matches) >= MATCH_CACHE_SIZE:
            self._matches.clear()
        self._matches[topic] = found
        return found.copy()

    def _find(self, topic: str) -> list[str]:
        if not topic or SINGLE in topic or MULTI in topic or "\0" in topic:
            return []
        levels = topic.split(SEPARATOR)
        depth_of_topic = len(levels)
        wildcards_at_root = not topic.startswith("$")  # `#` and `+` first never match a `$` topic
        found: list[str] = []
        # (node, depth, the filter's levels down to it: the topic's, or `+` where it went through one)
        pending: list[tuple[_Node, int, tuple[str, ...]]] = [(self._root, 0, ())]
        while pending:
            node, depth, prefix = pending.pop()
            wildcards = depth > 0 or wildcards_at_root
            children = node.children
            if wildcards and MULTI in children:
                found.append(SEPARATOR.join((*prefix, MULTI)))  # `#` takes the rest, even none
            if depth == depth_of_topic:
                if node.ends:
                    found.append(SEPARATOR.join(prefix))
                continue
            for key in (levels[depth], SINGLE) if wildcards else (levels[depth],):
                child = children.get(key)
                if child is None:
                    continue
                if isinstance(child, str):
                    rest = child[1:].split(SEPARATOR) if child else []
                    if _rest_matches(rest, levels, depth + 1):
                        found.append(SEPARATOR.join((*prefix, key, *rest)))
                else:
                    pending.append((child, depth + 1, (*prefix, key)))
        found.sort()
        return found

    def describe(self) -> dict[str, object]:
        """For status: how many raw filters, federated and effective filters, and the collapsed prefixes."""
        return {"raw": self._raw, "federated": len(self.federated), "effective": len(self.effective),
                "collapsed": sorted(SEPARATOR.join(prefix) + ("/#" if node.coarse else "/+")
                                    for node, prefix in self._collapsed_nodes())}

    # ------------------------------------------------------------ the trie

    def _insert(self, levels: list[str]) -> list[tuple[_Node, int]] | None:
        """Add a raw filter; the nodes on its path with their depths (the node at depth d is followed by level
        d), or None if it was there."""
        node = self._root
        path: list[tuple[_Node, int]] = []
        for depth, level in enumerate(levels):
            path.append((node, depth))
            child = node.children.get(level)
            if child is None:
                node.children[level] = _rest(levels[depth + 1:])
                return path
            if isinstance(child, str):
                child = node.children[level] = self._expand(child)
            node = child
        if node.ends:
            return None
        node.ends = True
        return path

    @staticmethod
    def _expand(rest: str) -> _Node:
        """A node for a child that held the rest of one raw filter ("" when it ended at the child)."""
        node = _Node()
        if rest == "":
            node.ends = True
        else:
            remaining = rest[1:].split(SEPARATOR)
            node.children[remaining[0]] = _rest(remaining[1:])
        return node

    def _walk(self, levels: list[str]) -> tuple[list[tuple[_Node, int]], _Node | str | None]:
        node = self._root
        path: list[tuple[_Node, int]] = []
        for depth, level in enumerate(levels):
            path.append((node, depth))
            child = node.children.get(level)
            if child is None or isinstance(child, str):
                return path, child if isinstance(child, str) and child == _rest(levels[depth + 1:]) else None
            node = child
        return path, node

    def _contains(self, levels: list[str]) -> bool:
        _, end = self._walk(levels)
        return isinstance(end, str) or (end is not None and end.ends)

    def _path(self, levels: list[str]) -> list[tuple[_Node, int]]:
        return self._walk(levels)[0]

    def _delete(self, levels: list[str]) -> None:
        path, end = self._walk(levels)
        if isinstance(end, _Node):
            end.ends = False
            if end.children:
                return
        # Remove the leaf, then every node left with nothing (never the root); a node left with one raw filter
        # below it is not compressed again (it may grow back).
        node, depth = path[-1]
        del node.children[levels[depth]]
        for node, depth in reversed(path[:-1]):
            child = node.children[levels[depth]]
            assert isinstance(child, _Node)
            if child.ends or child.children:
                break
            del node.children[levels[depth]]

    @staticmethod
    def _topmost_collapsed(path: list[tuple[_Node, int]]) -> tuple[_Node, int] | None:
        for node, depth in path:
            if node.collapsed:
                return node, depth
        return None

    def _collapsed_nodes(self) -> Iterator[tuple[_Node, list[str]]]:
        stack: list[tuple[_Node, list[str]]] = [(self._root, [])]
        while stack:
            node, prefix = stack.pop()
            if node.collapsed:
                yield node, prefix
                continue
            for level, child in node.children.items():
                if isinstance(child, _Node):
                    stack.append((child, [*prefix, level]))

    @staticmethod
    def _raw_below(node: _Node, prefix: list[str]) -> Iterator[list[str]]:
        """The raw filters below a node (as level lists), the node's own included."""
        stack: list[tuple[_Node, list[str]]] = [(node, prefix)]
        while stack:
            current, levels = stack.pop()
            if current.ends:
                yield levels
            for level, child in current.children.items():
                if isinstance(child, str):
                    yield [*levels, level, *child[1:].split(SEPARATOR)] if child else [*levels, level]
                else:
                    stack.append((child, [*levels, level]))

    # ------------------------------------------------------------ forms

    def _form(self, levels: list[str]) -> str:
        """The federated filter of a raw filter held in the trie (rules 1 and 2)."""
        node: _Node | str = self._root
        for depth, level in enumerate(levels):
            assert isinstance(node, _Node)
            if node.collapsed and level != MULTI:
                head = levels[:depth]
                if node.coarse:
                    return SEPARATOR.join([*head, MULTI])
                return SEPARATOR.join([*head, SINGLE, *levels[depth + 1:]])
            child = node.children[level]
            if isinstance(child, str):
                break
            node = child
        return SEPARATOR.join(levels)

    @staticmethod
    def _suffix(levels: list[str], depth: int) -> str | None:
        """What rule 2 compares below a node collapsed at `depth`: the levels after the collapsed one (None for a
        filter whose collapsed level is `#`, which keeps its own form)."""
        if depth >= len(levels) or levels[depth] == MULTI:
            return None
        return SEPARATOR.join(levels[depth + 1:])

    def _count_suffix(self, suffixes: Counter[str], levels: list[str], depth: int, delta: int) -> None:
        suffix = self._suffix(levels, depth)
        if suffix is None:
            return
        suffixes[suffix] += delta
        if suffixes[suffix] <= 0:
            del suffixes[suffix]

    def _suffix_change(self, node: _Node, levels: list[str], depth: int, delta: int, before: Counter[str],
                       after: Counter[str]) -> None:
        """A raw filter added below a collapsed node (`delta` +1): counted, and the node coarsened if it must."""
        suffixes = node.suffixes
        assert suffixes is not None
        self._count_suffix(suffixes, levels, depth, delta)
        if not node.coarse and len(suffixes) > self.fanout:
            raw = SEPARATOR.join(levels)
            self._remap(node, levels[:depth], lambda: setattr(node, "coarse", True), before, after, exclude=raw)
        after[self._form(levels)] += 1

    def _collapse(self, node: _Node, prefix: list[str]) -> None:
        depth = len(prefix)
        node.collapsed = True
        node.suffixes = Counter()
        for levels in self._raw_below(node, prefix):
            self._count_suffix(node.suffixes, levels, depth, +1)
        self._clear_below(node)
        node.coarse = len(node.suffixes) > self.fanout

    @staticmethod
    def _clear_below(node: _Node) -> None:
        """Only the topmost collapsed node counts: those below it forget (they are judged again if it opens)."""
        stack = [child for child in node.children.values() if isinstance(child, _Node)]
        while stack:
            current = stack.pop()
            current.collapsed, current.suffixes, current.coarse = False, None, False
            stack.extend(child for child in current.children.values() if isinstance(child, _Node))

    def _uncollapse(self, node: _Node, prefix: list[str]) -> None:
        node.collapsed, node.suffixes, node.coarse = False, None, False
        if not self.fanout:
            return
        # Nodes below may pass the fan-out on their own: the topmost of each path collapses.
        stack: list[tuple[_Node, list[str]]] = [(node, prefix)]
        while stack:
            current, levels = stack.pop()
            if current is not node and len(current.children) > self.fanout:
                self._collapse(current, levels)
                continue
            stack.extend((child, [*levels, level]) for level, child in current.children.items()
                         if isinstance(child, _Node))

    def _remap(self, node: _Node, prefix: list[str], change: object, before: Counter[str], after: Counter[str],
               exclude: str | None = None) -> None:
        """Change a node's state (`change()`), moving the raw filters below it from their old forms to their new
        ones; `exclude`: a raw filter the caller accounts for itself (the one being added)."""
        below = [levels for levels in self._raw_below(node, prefix) if SEPARATOR.join(levels) != exclude]
        for levels in below:
            before[self._form(levels)] += 1
        change()  # type: ignore[operator]
        for levels in below:
            after[self._form(levels)] += 1

    # ------------------------------------------------------------ the federated and effective sets

    def _apply(self, before: Counter[str], after: Counter[str]) -> None:
        federated = self.federated
        entered: list[str] = []
        left: list[str] = []
        for form in sorted(set(before) | set(after)):
            delta = after[form] - before[form]
            if not delta:
                continue
            had = form in federated
            federated[form] += delta
            if federated[form] <= 0:
                del federated[form]
                if had:
                    left.append(form)
                    self._wildcards.discard(form)
            elif not had:
                entered.append(form)
                if MULTI in form or SINGLE in form:
                    self._wildcards.add(form)
        if entered or left:
            self._recover(entered, left)

    def _recover(self, entered: list[str], left: list[str]) -> None:
        """Rule 3 after federated filters entered and left: which are effective now, and the batch of changes."""
        effective = self.effective
        judge = set(entered)
        for form in left:
            judge |= self._covering.get(form, set())  # what it covered is judged again
        for form in entered:
            if MULTI in form or SINGLE in form:  # what it may cover
                judge.update(other for other in effective if other != form and covers(form, other))
        touched = judge | set(left)
        was = {form for form in touched if form in effective}
        for form in left:
            self._set_cover(form, None)
            effective.pop(form, None)
            self._covering.pop(form, None)
        pending = sorted(judge - set(left), reverse=True)
        while pending:
            form = pending.pop()
            covering_form = self._cover_of(form)
            if covering_form is not None and self._covering.get(form):
                # It covered others and is covered now: they point at the top of the chain instead.
                pending.extend(sorted(self._covering[form], reverse=True))
                touched |= self._covering[form]
            self._set_cover(form, covering_form)
        now = {form for form in touched if form in effective}
        added, removed = tuple(sorted(now - was)), tuple(sorted(was - now))
        if added or removed:
            self._batches.append(Batch(added, removed))

    def _set_cover(self, form: str, covering_form: str | None) -> None:
        """`form` is covered by `covering_form` (None: by nothing; it is effective if it is federated)."""
        old = self._covered_by.get(form)
        if old == covering_form and (old is not None or form in self.effective):
            return
        if old is not None:
            covered = self._covering.get(old)
            if covered is not None:
                covered.discard(form)
                if not covered:
                    del self._covering[old]
        if covering_form is None:
            self._covered_by.pop(form, None)
            if form in self.federated:
                self.effective[form] = form
        else:
            self._covered_by[form] = covering_form
            self._covering.setdefault(covering_form, set()).add(form)
            self.effective.pop(form, None)

    def _cover_of(self, form: str) -> str | None:
        """A federated filter other than `form` that covers it (the first in sorted order), or None. Two equal
        covers cannot happen: federated filters are distinct."""
        found = [other for other in covering(self._wildcards, form) if other != form]
        if not found:
            return None
        # Prefer one that nothing else covers (the top of the chain), else the first.
        for candidate in found:
            if not any(other != candidate and covers(other, candidate) for other in found):
                return candidate
        return found[0]
