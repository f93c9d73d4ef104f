"""Read a scenario YAML file into the backend-neutral model, or say exactly what is wrong.

Theory of operation: a scenario is written by a person and run by a machine
that may take minutes to reach the broken line, so every check happens here,
before any backend starts. Each problem raises `ScenarioError` with one
message shaped as

    FILE: ENTRY: PROBLEM; WHAT IS ALLOWED

(`runs/x.yaml: events[3] (publish): unknown node 'n9'; nodes are: n0, n1`), so
the reader can fix the file without opening this module. Parsing is a chain
of small functions that each own one entry path; they never return partial
objects: a value either converts fully or raises.

Only YAML reading touches the world (`load_scenario`); `parse_scenario` works
on an already-decoded mapping, which is what tests and generators use.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import yaml

from federation.protocol.settings import Settings, SettingsError
from federation.protocol.topic_filter import validate_filter, validate_topic
from federation.scenario.model import (
    Cut,
    Disconnect,
    Heal,
    Kill,
    LinkDefaults,
    Loss,
    NodeSpec,
    Publish,
    Restart,
    Scenario,
    ScenarioEvent,
    Subscribe,
    Unsubscribe,
)


class ScenarioError(Exception):
    """The scenario file is unreadable or invalid; the message names file, entry, problem and fix."""


TOP_LEVEL_KEYS = ("name", "description", "duration", "settle", "settings", "link_model", "nodes", "links", "events")
NODE_KEYS = ("id", "settings")
LINK_MODEL_KEYS = ("latency", "jitter", "loss", "duplicate")
ACTIONS = ("subscribe", "unsubscribe", "disconnect", "publish", "cut", "heal", "kill", "restart", "loss")
NODE_NAME = re.compile(r"[A-Za-z0-9_.-]+")
DEFAULT_SETTLE = 5.0


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate one scenario file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ScenarioError(f"{source}: cannot read the scenario file: {error.strerror or error}") from error
    except UnicodeDecodeError as error:
        raise ScenarioError(f"{source}: not UTF-8 text ({error.reason} at byte {error.start})") from error
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = error.problem or error.context or "invalid YAML"
        raise ScenarioError(f"{where}: YAML syntax error: {problem}") from error
    except yaml.YAMLError as error:
        raise ScenarioError(f"{source}: YAML error: {error}") from error
    if data is None:
        raise ScenarioError(f"{source}: the file is empty; a scenario needs at least `duration` and `nodes`")
    if not isinstance(data, dict):
        raise ScenarioError(
            f"{source}: the top level is a {_kind(data)}; a scenario is a mapping with keys {', '.join(TOP_LEVEL_KEYS)}"
        )
    return parse_scenario(data, source)


def parse_scenario(data: Mapping[str, Any], source: str) -> Scenario:
    """Validate an already-decoded scenario mapping; `source` names it in messages."""
    checker = _Checker(source)
    checker.keys(data, TOP_LEVEL_KEYS, "the top level", "keys")

    name = data.get("name", Path(source).stem)
    if not isinstance(name, str) or not name.strip():
        checker.fail("name", f"expected a non-empty string, got {name!r}")
    description = data.get("description")
    if description is not None and not isinstance(description, str):
        checker.fail("description", f"expected free text, got a {_kind(description)}")

    if "duration" not in data:
        checker.fail("duration", "missing; give the run length in seconds (a number > 0), e.g. `duration: 30`")
    duration = checker.number(data["duration"], "duration", minimum=0.0, exclusive=True, unit="seconds")
    settle = DEFAULT_SETTLE
    if data.get("settle") is not None:
        settle = checker.number(data["settle"], "settle", minimum=0.0, unit="seconds")

    settings_values = data.get("settings")
    if settings_values is not None and not isinstance(settings_values, dict):
        checker.fail("settings", f"expected a mapping of setting: value, got a {_kind(settings_values)}")
    settings = checker.settings(settings_values or {}, "settings")

    link_model = _parse_link_model(checker, data.get("link_model"))
    nodes = _parse_nodes(checker, data.get("nodes"), settings)
    names = [node.name for node in nodes]
    links = _parse_links(checker, data.get("links"), names)
    events = _parse_events(checker, data.get("events"), names, links, duration)

    return Scenario(
        name=name,
        source=source,
        nodes=tuple(nodes),
        links=tuple(links),
        settings=settings,
        duration=duration,
        events=tuple(sorted(events, key=lambda event: event.at)),
        link_model=link_model,
        settle=settle,
    )


class _Checker:
    """Builds messages for one file; every `fail` raises."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, entry: str, problem: str) -> NoReturn:
        raise ScenarioError(f"{self.source}: {entry}: {problem}")

    def keys(self, mapping: Mapping[Any, Any], allowed: tuple[str, ...], entry: str, what: str) -> None:
        for key in mapping:
            if key not in allowed:
                hint = _suggestion(key, allowed)
                self.fail(entry, f"unknown key {key!r}{hint}; allowed {what} are: {', '.join(allowed)}")

    def number(
        self, value: Any, entry: str, *, minimum: float | None = None, maximum: float | None = None,
        exclusive: bool = False, unit: str = "",
    ) -> float:
        unit_text = f" {unit}" if unit else ""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(entry, f"expected a number{f' ({unit})' if unit else ''}, got {value!r}")
        if minimum is not None and (value <= minimum if exclusive else value < minimum):
            bound = f"greater than {minimum:g}" if exclusive else f"at least {minimum:g}"
            self.fail(entry, f"must be {bound}{unit_text}, got {value!r}")
        if maximum is not None and value > maximum:
            self.fail(entry, f"must be at most {maximum:g}{unit_text}, got {value!r}")
        return float(value)

    def integer(self, value: Any, entry: str, *, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(entry, f"expected a whole number >= {minimum}, got {value!r}")
        if value < minimum:
            self.fail(entry, f"must be at least {minimum}, got {value!r}")
        return int(value)

    def text(self, value: Any, entry: str, what: str) -> str:
        if not isinstance(value, str) or not value:
            self.fail(entry, f"expected {what} (a non-empty string), got {value!r}")
        return str(value)

    def node(self, value: Any, entry: str, names: list[str]) -> str:
        if not isinstance(value, str) or value not in names:
            hint = _suggestion(value, names)
            self.fail(entry, f"unknown node {value!r}{hint}; nodes are: {', '.join(names)}")
        return str(value)

    def settings(self, values: Mapping[str, Any], entry: str) -> Settings:
        try:
            return Settings.from_mapping(values, where=f"{self.source}: {entry}")
        except SettingsError as error:
            raise ScenarioError(str(error)) from error


def _parse_link_model(checker: _Checker, value: Any) -> LinkDefaults:
    if value is None:
        return LinkDefaults()
    if not isinstance(value, dict):
        checker.fail("link_model", f"expected a mapping with keys {', '.join(LINK_MODEL_KEYS)}, got a {_kind(value)}")
    checker.keys(value, LINK_MODEL_KEYS, "link_model", "keys")
    defaults = LinkDefaults()
    return LinkDefaults(
        latency=checker.number(value.get("latency", defaults.latency), "link_model.latency", minimum=0.0,
                               unit="seconds"),
        jitter=checker.number(value.get("jitter", defaults.jitter), "link_model.jitter", minimum=0.0, unit="seconds"),
        loss=checker.number(value.get("loss", defaults.loss), "link_model.loss", minimum=0.0, maximum=100.0,
                            unit="percent"),
        duplicate=checker.number(value.get("duplicate", defaults.duplicate), "link_model.duplicate", minimum=0.0,
                                 maximum=100.0, unit="percent"),
    )


def _parse_nodes(checker: _Checker, value: Any, settings: Settings) -> list[NodeSpec]:
    if value is None or (isinstance(value, (dict, list)) and not value):
        checker.fail("nodes", "missing or empty; list node names (`nodes: [n0, n1]`) "
                              "or map them (`nodes: {n0: {id: 0}}`)")
    entries: list[tuple[Any, Any]]
    if isinstance(value, list):
        entries = [(item, None) for item in value]
    elif isinstance(value, dict):
        entries = list(value.items())
    else:
        checker.fail("nodes", f"expected a mapping of name -> {{id, settings}} or a list of names, "
                              f"got a {_kind(value)}")
    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    for index, (name, spec) in enumerate(entries):
        label = f"nodes[{index}]" if isinstance(value, list) else f"nodes.{name}"
        if not isinstance(name, str) or not NODE_NAME.fullmatch(name):
            checker.fail(label, f"bad node name {name!r}; names are strings of letters, digits, '_', '.' or '-' "
                                "(quote names YAML would read as numbers or booleans, e.g. '1' or 'no')")
        if name in seen:
            checker.fail(label, f"node {name!r} is listed twice; node names must be unique")
        seen.add(name)
        vid: int | None = None
        overrides: dict[str, Any] = {}
        if spec is not None:
            if not isinstance(spec, dict):
                checker.fail(label, f"expected null or a mapping with keys {', '.join(NODE_KEYS)}, got {spec!r}")
            checker.keys(spec, NODE_KEYS, label, "keys")
            if spec.get("id") is not None:
                vid = checker.integer(spec["id"], f"{label}.id", minimum=0)
            node_settings = spec.get("settings")
            if node_settings is not None:
                if not isinstance(node_settings, dict):
                    checker.fail(f"{label}.settings",
                                 f"expected a mapping of setting: value, got a {_kind(node_settings)}")
                overrides = dict(node_settings)
                merged = {key: getattr(settings, key) for key in settings.__dataclass_fields__}
                merged.update(overrides)
                checker.settings(merged, f"nodes.{name}.settings")
        nodes.append(NodeSpec(name=name, vid=vid, settings=overrides))
    return nodes


def _parse_links(checker: _Checker, value: Any, names: list[str]) -> list[tuple[str, str]]:
    if value is None:
        return []
    if not isinstance(value, list):
        checker.fail("links", f"expected a list of [a, b] pairs, got a {_kind(value)}")
    links: list[tuple[str, str]] = []
    first_index: dict[frozenset[str], int] = {}
    for index, item in enumerate(value):
        label = f"links[{index}]"
        a, b = _pair(checker, item, label, names)
        key = frozenset((a, b))
        if key in first_index:
            checker.fail(label, f"[{a}, {b}] repeats links[{first_index[key]}]; each neighbour pair is listed once "
                                "(links are undirected)")
        first_index[key] = index
        links.append((a, b))
    return links


def _pair(checker: _Checker, item: Any, label: str, names: list[str]) -> tuple[str, str]:
    if not isinstance(item, list) or len(item) != 2:
        checker.fail(label, f"expected a pair of node names [a, b], got {item!r}")
    a = checker.node(item[0], label, names)
    b = checker.node(item[1], label, names)
    if a == b:
        checker.fail(label, f"[{a}, {b}] links a node to itself; a link joins two different nodes")
    return a, b


class _EventContext:
    """What the per-action parsers need: the checker, the entry label and the scenario's graph."""

    def __init__(self, checker: _Checker, label: str, at: float, names: list[str],
                 links: list[tuple[str, str]], duration: float) -> None:
        self.checker = checker
        self.label = label
        self.at = at
        self.names = names
        self.links = links
        self.duration = duration

    def fail(self, problem: str) -> NoReturn:
        self.checker.fail(self.label, problem)

    def mapping(self, value: Any, action: str, required: tuple[str, ...], optional: tuple[str, ...]) -> dict[str, Any]:
        allowed = required + optional
        if not isinstance(value, dict):
            self.fail(f"expected a mapping with keys {', '.join(allowed)}, got {value!r}")
        self.checker.keys(value, allowed, self.label, f"{action} keys")
        for key in required:
            if key not in value:
                self.fail(f"missing {key!r}; required keys are: {', '.join(required)}")
        return value

    def node(self, value: Any) -> str:
        return self.checker.node(value, self.label, self.names)

    def qos(self, value: Any) -> int:
        if isinstance(value, bool) or value not in (0, 1, 2):
            self.fail(f"qos must be 0, 1 or 2, got {value!r}")
        return int(value)

    def neighbours(self, value: Any) -> tuple[str, str]:
        a, b = _pair(self.checker, value, self.label, self.names)
        if (a, b) not in self.links and (b, a) not in self.links:
            listed = ", ".join(f"{x}-{y}" for x, y in self.links) or "none"
            self.fail(f"{a} and {b} are not neighbours; links are: {listed}")
        return a, b


def _parse_events(checker: _Checker, value: Any, names: list[str], links: list[tuple[str, str]],
                  duration: float) -> list[ScenarioEvent]:
    if value is None:
        return []
    if not isinstance(value, list):
        checker.fail("events", f"expected a list of events, got a {_kind(value)}")
    events: list[ScenarioEvent] = []
    for index, item in enumerate(value):
        label = f"events[{index}]"
        if not isinstance(item, dict):
            checker.fail(label, f"expected a mapping like {{at: 1, <action>: ...}}, got {item!r}; "
                                f"actions are: {', '.join(ACTIONS)}")
        actions = [key for key in item if key in ACTIONS]
        if len(actions) != 1:
            found = ", ".join(str(key) for key in actions) or "none"
            checker.fail(label, f"expected exactly one action, found {found}; actions are: {', '.join(ACTIONS)}")
        action = actions[0]
        label = f"{label} ({action})"
        allowed = ("at", action, "oneway") if action == "cut" else ("at", action)
        checker.keys(item, allowed, label, "keys")
        if "at" not in item:
            checker.fail(label, f"missing 'at'; give the time in seconds from the start (0 to {duration:g})")
        at = checker.number(item["at"], f"{label}.at", minimum=0.0, maximum=duration, unit="seconds")
        context = _EventContext(checker, label, at, names, links, duration)
        events.append(_ACTION_PARSERS[action](context, item))
    return events


def _subscribe(context: _EventContext, item: Mapping[str, Any]) -> ScenarioEvent:
    body = context.mapping(item["subscribe"], "subscribe", ("node", "client", "filter"), ("qos",))
    topic_filter = _filter(context, body["filter"])
    return Subscribe(at=context.at, node=context.node(body["node"]),
                     client=context.checker.text(body["client"], context.label, "a client id"),
                     filter=topic_filter, qos=context.qos(body.get("qos", 0)))


def _unsubscribe(context: _EventContext, item: Mapping[str, Any]) -> ScenarioEvent:
    body = context.mapping(item["unsubscribe"], "unsubscribe", ("node", "client", "filter"), ())
    return Unsubscribe(at=context.at, node=context.node(body["node"]),
                       client=context.checker.text(body["client"], context.label, "a client id"),
                       filter=_filter(context, body["filter"]))


def _disconnect(context: _EventContext, item: Mapping[str, Any]) -> ScenarioEvent:
    body = context.mapping(item["disconnect"], "disconnect", ("node", "client"), ())
    return Disconnect(at=context.at, node=context.node(body["node"]),
                      client=context.checker.text(body["client"], context.label, "a client id"))


def _publish(context: _EventContext, item: Mapping[str, Any]) -> ScenarioEvent:
    body = context.mapping(item["publish"], "publish", ("node", "topic"),
                           ("count", "interval", "qos", "retain", "payload_size"))
    topic = body["topic"]
    if not isinstance(topic, str):
        context.fail(f"topic must be a string, got {topic!r}")
    problem = validate_topic(topic)
    if problem is not None:
        context.fail(problem)
    label = context.label
    count = context.checker.integer(body.get("count", 1), f"{label}.count", minimum=1)
    interval = context.checker.number(body.get("interval", 0.0), f"{label}.interval", minimum=0.0, unit="seconds")
    retain = body.get("retain", False)
    if not isinstance(retain, bool):
        context.fail(f"retain must be true or false, got {retain!r}")
    payload_size = context.checker.integer(body.get("payload_size", 0), f"{label}.payload_size", minimum=0)
    last = context.at + (count - 1) * interval
    if last > context.duration + 1e-9:
        context.fail(f"the last of {count} messages would be sent at {last:g}s, after the end of the run "
                     f"({context.duration:g}s); lower count or interval, or raise duration")
    return Publish(at=context.at, node=context.node(body["node"]), topic=topic, count=count, interval=interval,
                   qos=context.qos(body.get("qos", 0)), retain=retain, payload_size=payload_size)


def _cut(context: _EventContext, item: Mapping[str, Any]) -> ScenarioEvent:
    a, b = context.neighbours(item["cut"])
    oneway = item.get("oneway", False)
    if not isinstance(oneway, bool):
        context.fail(f"oneway must be true or false, got {oneway!r}")
    return Cut(at=context.at, a=a, b=b, oneway=oneway)


def _heal(context: _EventContext, item: Mapping[str, Any]) -> ScenarioEvent:
    a, b = context.neighbours(item["heal"])
    return Heal(at=context.at, a=a, b=b)


def _kill(context: _EventContext, item: Mapping[str, Any]) -> ScenarioEvent:
    value = item["kill"]
    if isinstance(value, dict):
        value = context.mapping(value, "kill", ("node",), ())["node"]
    return Kill(at=context.at, node=context.node(value))


def _restart(context: _EventContext, item: Mapping[str, Any]) -> ScenarioEvent:
    value = item["restart"]
    broker = False
    if isinstance(value, dict):
        body = context.mapping(value, "restart", ("node",), ("broker",))
        value = body["node"]
        broker = body.get("broker", False)
        if not isinstance(broker, bool):
            context.fail(f"broker must be true or false, got {broker!r}")
    return Restart(at=context.at, node=context.node(value), broker=broker)


def _loss(context: _EventContext, item: Mapping[str, Any]) -> ScenarioEvent:
    body = context.mapping(item["loss"], "loss", ("percent",), ("link", "all"))
    percent = context.checker.number(body["percent"], f"{context.label}.percent", minimum=0.0, maximum=100.0,
                                     unit="percent")
    every_link = body.get("all", False)
    if not isinstance(every_link, bool):
        context.fail(f"all must be true or false, got {every_link!r}")
    if every_link == ("link" in body):
        context.fail("give exactly one of `link: [a, b]` or `all: true`")
    link = None if every_link else context.neighbours(body["link"])
    return Loss(at=context.at, percent=percent, link=link)


def _filter(context: _EventContext, value: Any) -> str:
    if not isinstance(value, str):
        context.fail(f"filter must be a string, got {value!r} (quote filters that start with '#')")
    problem = validate_filter(value)
    if problem is not None:
        context.fail(problem)
    return str(value)


_ACTION_PARSERS: dict[str, Callable[[_EventContext, Mapping[str, Any]], ScenarioEvent]] = {
    "subscribe": _subscribe,
    "unsubscribe": _unsubscribe,
    "disconnect": _disconnect,
    "publish": _publish,
    "cut": _cut,
    "heal": _heal,
    "kill": _kill,
    "restart": _restart,
    "loss": _loss,
}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


def _suggestion(value: Any, choices: Any) -> str:
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, [str(choice) for choice in choices], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
