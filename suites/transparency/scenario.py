"""A scenario: a small script of client actions, the same whatever the clients connect to.

Theory of operation: a case of the transparency suite is written once, as
what MQTT clients do (connect, subscribe, publish, disconnect, wait), and run
unchanged on every setup (`setups`): one broker, a federation, a bridge
chain. Clients are placed on *sites* ("a", "b", "c"); a setup maps each site
to a broker (one broker: every site is the same broker). Topics and filters
are written with `{p}`, the case's own topic prefix, so many cases run one
after another on one started setup without seeing each other's retained
messages or queued sessions.

Actions are small frozen dataclasses, validated when built, with no I/O:
`runner` performs them. Two actions are about time, not about MQTT:

* `Settle`: the deliveries caused so far are over (every subscriber has what
  it will get). How a setup knows that is the runner's business (a fence on
  one broker, the reference's counts and a quiet period elsewhere); a case
  says where it needs it, for example between two publishers on different
  brokers whose publications must not race. The runner adds one at the end.
* `Wait`: the clients do nothing for a while (a message's expiry interval
  runs out, a session stays offline): part of the scenario, the same
  everywhere.

A subscription is made ready before the next action by default: the runner
publishes probes from every site until the subscriber has one from each
(`Subscribe.ready`), the black-box way to know the subscription reaches
every broker; probes never appear in a recording.

Shared subscription members are compared as one receiver (`Scenario.groups`):
which member gets a publication is the broker's choice, that the group gets
each one once is the contract.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from federation.daemon.topic_policy import TopicLineError, parse_line

SITES = ("a", "b", "c")
"""the places a client can be; a setup maps each to a broker"""
PREFIX_FIELD = "{p}"
MAX_TOPIC_BYTES = 65535


class ScenarioError(ValueError):
    """A scenario that cannot run: an unknown client or site, a bad option (the case's author must fix it)."""


def expand(text: str, prefix: str) -> str:
    """A topic or filter of the scenario with its prefix filled in."""
    return text.replace(PREFIX_FIELD, prefix)


@dataclass(frozen=True)
class Payload:
    """What a publication carries: `text` (UTF-8), or `size` bytes made from `seed` (deterministic: the same
    bytes on every setup, different for every publication)."""

    text: str | None = None
    size: int | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.size is None):
            raise ScenarioError("a payload has either text or a size")
        if self.size is not None and not 0 <= self.size <= 256 * 1024 * 1024:
            raise ScenarioError(f"payload size {self.size}: 0 .. 256 MiB (MQTT's limit)")

    def build(self, seed: str) -> bytes:
        if self.text is not None:
            return self.text.encode()
        assert self.size is not None
        if self.size == 0:
            return b""
        block = hashlib.sha256(seed.encode()).hexdigest().encode() + b"|"
        return (block * (self.size // len(block) + 1))[:self.size]

    def describe(self) -> str:
        return repr(self.text) if self.text is not None else size_text(self.size or 0)


def size_text(size: int) -> str:
    """1024 -> "1 KiB", 262145 -> "256 KiB+1", 5 -> "5 B"."""
    for unit, name in ((1024 * 1024, "MiB"), (1024, "KiB")):
        whole, rest = divmod(size, unit)
        if whole and rest < 16:
            return f"{whole} {name}" + (f"+{rest}" if rest else "")
    return f"{size} B"


@dataclass(frozen=True)
class Properties:
    """The MQTT 5 properties a publication (or a will) carries; None leaves one out."""

    user: tuple[tuple[str, str], ...] = ()
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    payload_format: int | None = None
    """Payload Format Indicator: 0 bytes, 1 UTF-8"""
    message_expiry: int | None = None
    """Message Expiry Interval, seconds"""
    topic_alias: int | None = None
    """Topic Alias (publications only): with an empty topic, the alias's topic is used"""

    def __post_init__(self) -> None:
        if self.payload_format not in (None, 0, 1):
            raise ScenarioError(f"payload format indicator {self.payload_format}: 0 or 1")
        if self.message_expiry is not None and self.message_expiry < 0:
            raise ScenarioError("message expiry: seconds, not negative")
        if self.topic_alias is not None and not 1 <= self.topic_alias <= 65535:
            raise ScenarioError(f"topic alias {self.topic_alias}: 1 .. 65535")

    @property
    def empty(self) -> bool:
        return self == Properties()


@dataclass(frozen=True)
class Will:
    """A will message given at connect; `delay`: the Will Delay Interval, seconds."""

    topic: str
    payload: Payload
    qos: int = 1
    retain: bool = False
    properties: Properties = Properties()
    delay: int = 0


# ------------------------------------------------------------------ actions


@dataclass(frozen=True)
class Connect:
    """Connect `client` at `site` (MQTT v5). `clean_start` False with a `session_expiry` keeps a session.
    `identity`: the MQTT client id's name when several of the scenario's clients share one (the same device
    connecting again on another broker: each connection a client of its own, recorded apart)."""

    client: str
    site: str
    clean_start: bool = True
    session_expiry: int = 0
    will: Will | None = None
    identity: str | None = None


@dataclass(frozen=True)
class Subscribe:
    """SUBSCRIBE one filter with the v5 options. `ready`: probe until it reaches this subscriber from every
    site before the next action (False: go on at once, as a hasty client would)."""

    client: str
    filter: str
    qos: int = 1
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    identifier: int | None = None
    ready: bool = True

    def __post_init__(self) -> None:
        _check_qos(self.qos)
        if self.retain_handling not in (0, 1, 2):
            raise ScenarioError(f"retain handling {self.retain_handling}: 0, 1 or 2")
        if self.identifier is not None and not 1 <= self.identifier <= 268435455:
            raise ScenarioError(f"subscription identifier {self.identifier}: 1 .. 268,435,455")


@dataclass(frozen=True)
class Unsubscribe:
    client: str
    filter: str


@dataclass(frozen=True)
class Publish:
    """PUBLISH and, at QoS 1 and 2, wait for its acknowledgement (as a client that keeps order does)."""

    client: str
    topic: str
    payload: Payload
    qos: int = 1
    retain: bool = False
    properties: Properties = Properties()

    def __post_init__(self) -> None:
        _check_qos(self.qos)
        if not self.topic and self.properties.topic_alias is None:
            raise ScenarioError("an empty topic needs a topic alias")


@dataclass(frozen=True)
class Disconnect:
    """A clean DISCONNECT; `with_will` sends reason 0x04 (Disconnect with Will Message)."""

    client: str
    with_will: bool = False


@dataclass(frozen=True)
class Kill:
    """The client's TCP connection closes without DISCONNECT (a crashed client): the broker sends its will."""

    client: str


@dataclass(frozen=True)
class Wait:
    seconds: float

    def __post_init__(self) -> None:
        if not 0 < self.seconds <= 60:
            raise ScenarioError(f"wait {self.seconds}: more than 0, at most 60 s")


@dataclass(frozen=True)
class Settle:
    """Every delivery caused so far is over (see the module docstring)."""


Action = Connect | Subscribe | Unsubscribe | Publish | Disconnect | Kill | Wait | Settle


def _check_qos(qos: int) -> None:
    if qos not in (0, 1, 2):
        raise ScenarioError(f"QoS {qos}: 0, 1 or 2")


# ------------------------------------------------------------------ the scenario


@dataclass(frozen=True)
class Scenario:
    """One case: a name (also its topic prefix), a title, the actions, the shared-subscription groups
    (receiver name -> member clients), and what the comparison includes."""

    name: str
    title: str
    actions: tuple[Action, ...]
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    judge_acks: bool = False
    """compare the publishers' acknowledgement reason codes too (otherwise they are reported, not judged)"""
    settle_timeout: float = 3.0
    """seconds a Settle waits for the reference's deliveries on the other setups (they take milliseconds when
    they come at all; a case with large payloads gives more)"""
    ack_timeout: float = 10.0
    """seconds a QoS 1/2 publication waits for its acknowledgement"""
    topics: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """topic policy lines by site (a policy case, suites.transparency.policies): given to that site's
    wrapper and to its bridge alike, each under the case's prefix; only a and c (b is the bridge chain's hub)"""
    bridge_duplicates: str | None = None
    """why the bridge chain delivers some publications more than once in this case; its recording is then
    compared with each duplicate left out (what one broker would do)"""
    session_present_differs: str | None = None
    """why a CONNACK's session present flag cannot be what one broker answers in this case (a client back on
    another broker, which never saw it): then reported as a note, not judged (docs/transparency.md)"""

    def __post_init__(self) -> None:
        if not self.name or any(char in self.name for char in "/+#$ "):
            raise ScenarioError(f"scenario name {self.name!r}: non-empty, no / + # $ or space (it is a topic level)")
        for site, lines in self.topics.items():
            if site not in ("a", "c"):
                raise ScenarioError(f"{self.name}: topic lines for site {site!r}: only a and c have their own (b is "
                                    f"the bridge chain's hub, the federation's namespace)")
            for line in lines:
                try:
                    parse_line(line)
                except TopicLineError as error:
                    raise ScenarioError(f"{self.name}: topic line {line!r} of {site}: {error}") from None
        connected: set[str] = set()
        seen: set[str] = set()
        for index, action in enumerate(self.actions):
            where = f"{self.name} action {index + 1} ({type(action).__name__})"
            if isinstance(action, Connect):
                if action.site not in SITES:
                    raise ScenarioError(f"{where}: site {action.site!r} is not one of {', '.join(SITES)}")
                if action.client in connected:
                    raise ScenarioError(f"{where}: {action.client} is already connected")
                connected.add(action.client)
                seen.add(action.client)
            elif isinstance(action, (Subscribe, Unsubscribe, Publish, Disconnect, Kill)):
                if action.client not in connected:
                    raise ScenarioError(f"{where}: {action.client} is not connected")
                if isinstance(action, (Disconnect, Kill)):
                    connected.discard(action.client)
        for group, members in self.groups.items():
            if group in seen:
                raise ScenarioError(f"{self.name}: group {group!r} has a client's name")
            unknown = sorted(set(members) - seen)
            if unknown or not members:
                raise ScenarioError(f"{self.name}: group {group!r} names unknown clients {unknown}")

    @property
    def clients(self) -> tuple[str, ...]:
        """Every client, in order of first connection."""
        names: list[str] = []
        for action in self.actions:
            if isinstance(action, Connect) and action.client not in names:
                names.append(action.client)
        return tuple(names)

    def receiver_of(self, client: str) -> str:
        """The name a client's messages are compared under: its group's, or its own."""
        for group, members in self.groups.items():
            if client in members:
                return group
        return client

    @property
    def receivers(self) -> tuple[str, ...]:
        found: list[str] = []
        for client in self.clients:
            receiver = self.receiver_of(client)
            if receiver not in found:
                found.append(receiver)
        return tuple(found)

    def with_settle_at_end(self) -> tuple[Action, ...]:
        return self.actions if self.actions and isinstance(self.actions[-1], Settle) else (*self.actions, Settle())

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"name": self.name, "title": self.title,
                                    "groups": {k: list(v) for k, v in self.groups.items()},
                                    "actions": [describe_action(action) for action in self.actions]}
        if self.topics:
            document["topics"] = {site: list(lines) for site, lines in self.topics.items()}
        return document


def describe_action(action: Action) -> str:
    """One line a person reads: `c1@c subscribe {p}/# q1 nl rap rh2 id7`."""
    if isinstance(action, Connect):
        session = ("clean" if action.clean_start else "clean start 0") + \
            (f", session expiry {action.session_expiry}s" if action.session_expiry else "")
        if action.identity:
            session += f", client id {action.identity}"
        will = f", will on {action.will.topic} q{action.will.qos}{' retained' if action.will.retain else ''}" \
            if action.will else ""
        return f"{action.client} connects to {action.site} ({session}{will})"
    if isinstance(action, Subscribe):
        options = [f"q{action.qos}"] + (["no_local"] if action.no_local else []) \
            + (["rap"] if action.retain_as_published else []) \
            + ([f"rh{action.retain_handling}"] if action.retain_handling else []) \
            + ([f"id{action.identifier}"] if action.identifier is not None else [])
        return f"{action.client} subscribes {short(action.filter)} {' '.join(options)}"
    if isinstance(action, Unsubscribe):
        return f"{action.client} unsubscribes {short(action.filter)}"
    if isinstance(action, Publish):
        extra = (" retained" if action.retain else "") + ("" if action.properties.empty else " +properties")
        return f"{action.client} publishes {action.payload.describe()} q{action.qos}{extra} on " \
               f"{short(action.topic) or '(alias)'}"
    if isinstance(action, Disconnect):
        return f"{action.client} disconnects" + (" with will" if action.with_will else "")
    if isinstance(action, Kill):
        return f"{action.client} is killed (TCP closed without DISCONNECT)"
    if isinstance(action, Wait):
        return f"wait {action.seconds:g} s"
    return "settle"


def short(text: str, limit: int = 48) -> str:
    """A topic or filter for people: long ones are cut in the middle, with their length."""
    if len(text) <= limit:
        return text
    return f"{text[:24]}...{text[-12:]} ({len(text.encode())} B)"


def scenario_names(scenarios: Sequence[Scenario]) -> list[str]:
    names = [scenario.name for scenario in scenarios]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ScenarioError(f"scenario names must be unique: {duplicates}")
    return names
