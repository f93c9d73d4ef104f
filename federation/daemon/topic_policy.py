"""Topic policies: what a wrapper lets out of its broker and into it, written as Mosquitto bridge `topic` lines.

Theory of operation
-------------------
A site that bridges its broker today has lines such as

    topic sensors/# out 1 "" site-a/
    topic cmd/# in 1

in its mosquitto.conf: `PATTERN [out|in|both [QOS [LOCAL_PREFIX REMOTE_PREFIX]]]`. The wrapper takes the same
lines (`--topic`, `topics:` in wrapper.yaml) with the federation in the bridge's remote role: the local topic of
a line is LOCAL_PREFIX + PATTERN (a filter on this broker), its remote topic REMOTE_PREFIX + PATTERN (a filter
in the federation's namespace, the one every wrapper speaks). No line at all means `# both 2`, the federation
as it always was.

`parse_line` reads one line by Mosquitto 2.0.11's rules (src/conf.c, src/bridge_topic.c) and refuses a bad one
with Mosquitto's own message; it is stricter where Mosquitto accepts a line it then uses wrongly or silently
reads otherwise (docs/topic-policies.md, "Where the wrapper is stricter"). `TopicPolicy` then answers three
questions, the way a bridge with those lines behaves:

- `export(topic)`: may a local publication leave, under which federation topic, at which QoS at most? Only if
  an `out`/`both` line's local topic matches it (the bridge subscribes to those on its local broker). The
  topic is mapped by the first such line that has a prefix (the bridge's `send__publish` walks its lines in
  order): the local prefix is taken off the front if the topic starts with it, the remote prefix put on. The
  QoS is at most the line's (the bridge's subscription QoS); where several lines match, the highest.
- `import_(topic)`: may a federation publication be injected here, under which local topic, at which QoS? The
  same with `in`/`both` lines and the remote topics (`bridge__remap_topic_in`).
- `import_filters(local_filter)`: which federation filters must this wrapper ask the federation for, for a
  local subscription? The part of the filter some `in`/`both` line covers (the intersection of two filters,
  `intersect`), mapped to the federation's namespace; none when no line covers it, so the wrapper never joins
  the mesh of a filter it would not inject. Shared subscriptions keep their group around the mapped filter.

Where several lines match one publication a bridge sends one copy per line (one subscription each); a policy
decides once, so a publication crosses once (docs/transparency.md, the policy cases). Decisions are cached per
topic (a bounded dict): the per-publication cost of a policy is one dict lookup for a topic seen before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from federation.protocol.topic_filter import MAX_LENGTH, SHARE_PREFIX, FilterIndex, validate_filter, validate_topic

DIRECTIONS = ("out", "in", "both")
EXPORTS = ("out", "both")
IMPORTS = ("in", "both")
EMPTY = '""'
"""how a line writes an empty prefix (or the empty pattern of a line that only maps prefixes)"""
SYNTAX = "PATTERN [out|in|both [QOS [LOCAL_PREFIX REMOTE_PREFIX]]]"
CACHE_SIZE = 65536
"""topics whose decision is remembered per direction (cleared when full)"""

NO_OUT_LINE = "no_out_line"
"""a local publication no `out`/`both` line matches: it stays on this broker"""
NO_IN_LINE = "no_in_line"
"""a federation publication no `in`/`both` line matches: it is not injected here"""
MAPPED_TOPIC_INVALID = "mapped_topic_invalid"
"""the prefixes made a topic MQTT cannot carry (empty, or longer than 65,535 bytes)"""
REASONS = {"export": (NO_OUT_LINE, MAPPED_TOPIC_INVALID), "import": (NO_IN_LINE, MAPPED_TOPIC_INVALID)}
"""the reasons a policy keeps a publication from crossing, by direction (status, metrics)"""


class TopicLineError(ValueError):
    """A line Mosquitto (or the wrapper, where it is stricter) refuses: Mosquitto's message, then the fix."""

    def __init__(self, mosquitto: str, fix: str) -> None:
        super().__init__(f"{mosquitto} {fix}")
        self.mosquitto = mosquitto
        """the line Mosquitto 2.0.11 logs for it, or the wrapper's in the same style"""
        self.fix = fix


@dataclass(frozen=True, slots=True)
class TopicLine:
    """One parsed line; `local_topic` and `remote_topic` are the filters it relates."""

    text: str
    pattern: str | None
    """None for the empty pattern `""` (the prefixes alone)"""
    direction: str
    qos: int
    local_prefix: str | None
    remote_prefix: str | None
    local_topic: str
    remote_topic: str

    @property
    def remaps(self) -> bool:
        """Has a prefix: only such lines map topics (Mosquitto's `topic_remapping`)."""
        return self.local_prefix is not None or self.remote_prefix is not None


@dataclass(frozen=True, slots=True)
class Crossing:
    """A publication that may cross: under `topic`, at QoS `qos` at most."""

    topic: str
    qos: int


def parse_line(text: str) -> TopicLine:
    """One line, as it follows `topic` in mosquitto.conf; TopicLineError with Mosquitto's message if bad."""
    tokens = [token for token in text.split(" ") if token]  # Mosquitto splits on spaces only (strtok " ")
    if not tokens:
        raise TopicLineError("Error: Empty topic value in configuration.", f"Write {SYNTAX}.")
    pattern_token, rest = tokens[0], tokens[1:]
    direction, qos = "out", 0  # Mosquitto's defaults
    local_token: str | None = None
    remote_token: str | None = None
    if rest:
        given = rest.pop(0)
        if given.lower() not in DIRECTIONS:
            hint = " Leave out the word `topic`: a line is what follows it in mosquitto.conf." \
                if pattern_token == "topic" else ""
            raise TopicLineError(f"Error: Invalid bridge topic direction '{given}'.",
                                 f"Write out, in or both after the pattern.{hint}")
        direction = given.lower()
    if rest:
        given = rest.pop(0)
        if given.startswith("#"):
            rest = []  # a comment: QoS 0, as Mosquitto reads it
        elif given in ("0", "1", "2"):
            qos = int(given)
        else:
            raise TopicLineError(f"Error: Invalid bridge QoS level '{given}'.", "Write 0, 1 or 2.")
    if rest:
        given = rest.pop(0)
        if given.startswith("#"):
            rest = []
        else:
            local_token = given
            if not rest or rest[0].startswith("#"):
                raise TopicLineError(f"Error: Invalid bridge remapping: local prefix '{given}' without a remote "
                                     f"prefix.",
                                     f'Write both prefixes, {EMPTY} for an empty one (Mosquitto 2.0.11 would take '
                                     f'the missing one as empty).')
            remote_token = rest.pop(0)
    if rest and not rest[0].startswith("#"):
        raise TopicLineError(f"Error: Unexpected '{rest[0]}' after the remote prefix.",
                             f"Write {SYNTAX}; a # starts a comment (Mosquitto 2.0.11 ignores the rest silently).")
    return _line(text, pattern_token, direction, qos, local_token, remote_token)


def _line(text: str, pattern_token: str, direction: str, qos: int, local_token: str | None,
          remote_token: str | None) -> TopicLine:
    """The checks of Mosquitto's `bridge__add_topic`, in its order, then the wrapper's own."""
    pattern = None if pattern_token == EMPTY else pattern_token
    local_prefix = None if local_token in (None, EMPTY) else local_token
    remote_prefix = None if remote_token in (None, EMPTY) else remote_token
    for side, prefix in (("local", local_prefix), ("remote", remote_prefix)):
        if prefix is not None and ("+" in prefix or "#" in prefix or len(prefix.encode()) > MAX_LENGTH):
            raise TopicLineError(f"Error: Invalid bridge topic {side} prefix '{prefix}'.",
                                 "A prefix is the start of a topic: no + or #.")
    if pattern is None and (local_prefix is None or remote_prefix is None):
        raise TopicLineError("Error: Invalid bridge remapping.",
                             f"The empty pattern {EMPTY} maps one prefix onto the other: give both, not empty.")
    local_topic = (local_prefix or "") + (pattern or "")
    remote_topic = (remote_prefix or "") + (pattern or "")
    for side, prefix, topic in (("local", local_prefix, local_topic), ("remote", remote_prefix, remote_topic)):
        if validate_filter(topic) is not None:
            if prefix is None:  # Mosquitto 2.0.11 takes such a line and its subscription then fails
                raise TopicLineError(f"Error: Invalid bridge topic pattern '{topic}'.",
                                     "The pattern is a topic filter: + and # fill a whole level, # only the last.")
            raise TopicLineError(f"Error: Invalid bridge topic {side} prefix and pattern combination '{topic}'.",
                                 "A prefix and the pattern are joined as they are: end the prefix with / before a "
                                 "wildcard.")
        if topic.startswith("$"):
            raise TopicLineError(f"Error: Invalid bridge topic {side} topic '{topic}'.",
                                 "The federation carries no $ topics (they describe one broker).")
    return TopicLine(text, pattern, direction, qos, local_prefix, remote_prefix, local_topic, remote_topic)


def remap(topic: str, strip: str | None, add: str | None) -> str:
    """`topic` with `strip` taken off its front (when it starts with it) and `add` put on: what Mosquitto does to
    a bridged topic, byte for byte; also used on filters (the same string operation)."""
    if strip and topic.startswith(strip):
        topic = topic[len(strip):]
    return add + topic if add else topic


def intersect(first: str, second: str) -> str | None:
    """The filter matching exactly the topics both filters match, or None when they share none (MQTT 5 rules:
    `#` also matches the level above it, so `a/#` and `+` share `a`; a leading wildcard sees no `$` topic)."""
    left, right = first.split("/"), second.split("/")
    if (left[0] in ("+", "#") and right[0].startswith("$")) or (right[0] in ("+", "#") and left[0].startswith("$")):
        return None
    levels: list[str] = []
    index = 0
    while True:
        mine = left[index] if index < len(left) else None
        theirs = right[index] if index < len(right) else None
        if mine == "#":
            return "/".join(levels + right[index:])
        if theirs == "#":
            return "/".join(levels + left[index:])
        if mine is None or theirs is None:
            return "/".join(levels) if mine is None and theirs is None else None
        if mine == "+":
            levels.append(theirs)
        elif theirs == "+" or mine == theirs:
            levels.append(mine)
        else:
            return None
        index += 1


class _Side:
    """The lines of one direction with a filter index over their filters, and a cache of decisions."""

    def __init__(self, lines: Sequence[TopicLine], source: str) -> None:
        """`source`: which filter of a line a topic is matched against ("local" for exports, "remote" for
        imports)."""
        self.lines = tuple(lines)
        self.by_filter: dict[str, list[TopicLine]] = {}
        for line in self.lines:
            self.by_filter.setdefault(line.local_topic if source == "local" else line.remote_topic, []).append(line)
        self.index = FilterIndex(self.by_filter)
        self.source = source
        self.cache: dict[str, Crossing | str] = {}

    def decide(self, topic: str, refusal: str) -> Crossing | str:
        cached = self.cache.get(topic)
        if cached is not None:
            return cached
        matched = self.index.matching(topic)
        decision: Crossing | str
        if not matched:
            decision = refusal
        else:
            lines = {id(line): line for filter_ in matched for line in self.by_filter[filter_]}
            qos = max(line.qos for line in lines.values())
            mapped = topic
            for line in self.lines:  # the first line with a prefix that matches maps the topic, as in Mosquitto
                if line.remaps and id(line) in lines:
                    if self.source == "local":
                        mapped = remap(topic, line.local_prefix, line.remote_prefix)
                    else:
                        mapped = remap(topic, line.remote_prefix, line.local_prefix)
                    break
            decision = Crossing(mapped, qos) if validate_topic(mapped) is None else MAPPED_TOPIC_INVALID
        if len(self.cache) >= CACHE_SIZE:
            self.cache.clear()
        self.cache[topic] = decision
        return decision


@dataclass(eq=False)
class TopicPolicy:
    """A wrapper's topic lines, as decisions (module docstring). No line: everything crosses both ways, as is."""

    lines: tuple[TopicLine, ...] = ()
    _exports: _Side = field(init=False, repr=False)
    _imports: _Side = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._exports = _Side([line for line in self.lines if line.direction in EXPORTS], "local")
        self._imports = _Side([line for line in self.lines if line.direction in IMPORTS], "remote")

    @classmethod
    def parse(cls, texts: Iterable[str]) -> TopicPolicy:
        """The policy of these lines; TopicLineError from the first bad one (the caller names it)."""
        return cls(tuple(parse_line(text) for text in texts))

    @property
    def everything(self) -> bool:
        """No line: the federation as it always was (`# both 2`); the wrapper then asks nothing per publication."""
        return not self.lines

    @property
    def texts(self) -> tuple[str, ...]:
        return tuple(line.text for line in self.lines)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TopicPolicy) and self.texts == other.texts

    def __hash__(self) -> int:
        return hash(self.texts)

    def export(self, topic: str) -> Crossing | str:
        """A local publication on `topic`: where and at which QoS at most it goes into the federation, or the
        reason it stays on this broker."""
        if not self.lines:
            return Crossing(topic, 2)
        return self._exports.decide(topic, NO_OUT_LINE)

    def import_(self, topic: str) -> Crossing | str:
        """A federation publication on `topic`: where and at which QoS at most it is injected here, or the reason
        it is not."""
        if not self.lines:
            return Crossing(topic, 2)
        return self._imports.decide(topic, NO_IN_LINE)

    def import_filters(self, local_filter: str) -> dict[str, int]:
        """The federation filters a local subscription to `local_filter` asks for, each with the QoS its lines
        allow at most; empty when no `in`/`both` line covers any of it. `$share/<group>/F` keeps its group around
        each filter F maps to; other `$` filters are given back as they are (the node never federates them)."""
        if not self.lines:
            return {local_filter: 2}
        if local_filter.startswith(SHARE_PREFIX):
            group, _, inner = local_filter[len(SHARE_PREFIX):].partition("/")
            return {f"{SHARE_PREFIX}{group}/{mapped}": qos for mapped, qos in self.import_filters(inner).items()}
        if local_filter.startswith("$"):
            return {local_filter: 2}
        found: dict[str, int] = {}
        for line in self._imports.lines:
            common = intersect(local_filter, line.local_topic)
            if common is None:
                continue
            mapped = remap(common, line.local_prefix, line.remote_prefix)
            if validate_filter(mapped) is None:
                found[mapped] = max(found.get(mapped, 0), line.qos)
            remote = line.remote_prefix
            if line.pattern == "#" and remote is not None and remote.endswith("/") and len(remote) > 1:
                # `fed/#` matches `fed` too, which does not start with the prefix `fed/`: Mosquitto injects it
                # with the local prefix put on, unstripped. Asked for by name where the subscription sees it.
                parent = remote[:-1]
                crossing = self.import_(parent)
                if isinstance(crossing, Crossing) and intersect(local_filter, crossing.topic) is not None:
                    found[parent] = max(found.get(parent, 0), crossing.qos)
        return found

    def describe(self) -> list[str]:
        """The lines as given, for status (`["# both 2 (no topics given)"]` without lines)."""
        return list(self.texts) if self.lines else ["# both 2 (no topics given)"]


EVERYTHING = TopicPolicy()
"""the policy of a wrapper given no topic lines"""
