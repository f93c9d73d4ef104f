"""The three things a scenario runs on: one broker, a federation, a Mosquitto bridge chain, all on loopback.

Theory of operation: every setup is a `federation.tools.launch.LocalFederation`
(the bridge chain is the benchmark's `BenchBrokers` with bridges and no
wrappers), so every broker is rendered from configs/mosquitto.conf and
started by the same code; they differ only in what joins the brokers and in
where each site's clients connect:

* `one-broker`: one broker; every site is it. The reference.
* `federation`: brokers a, b, c joined by wrappers (the project's default
  protocol settings), on a line a-b-c or a ring a-b-c-d (sites a, b, c;
  a and c are opposite).
* `bridge-chain`: brokers a, b, c, each bridged to the next with
  `topic # both 2` over MQTT v5 (`bridge_protocol_version mqttv50`: the
  default, v3.1.1, would drop every MQTT 5 property), the configuration a
  user compares a federation with. Only a line: bridges in a ring loop
  forever.

A federation also answers what its wrappers counted (`snapshot`) and said
(`explain`: the events about a case's topics, the changed drop counters and
the warnings of their logs), which the report prints under a case that
differs from the reference.
"""

from __future__ import annotations

import contextlib
import datetime
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from federation.daemon.topic_policy import IMPORTS, TopicPolicy, parse_line
from federation.harness.processes import LaunchError, poll
from federation.tools.launch import BROKER_PORT, FederationNode, LocalFederation, line, ring
from suites.bench.setups import BenchBrokers, bridge_lines
from suites.transparency.scenario import SITES

SETUP_KINDS = ("one-broker", "federation", "bridge-chain")
TOPOLOGIES = ("line", "ring")
START_TIMEOUT = 30.0
"""seconds each broker and wrapper gets to start (a wrapper's imports alone took over 10 s on a loaded machine)"""
CONVERGE_TIMEOUT = 30.0
BRIDGE_TIMEOUT = 30.0
"""seconds the bridges get to connect and subscribe at start"""
BRIDGE_RESTART = "1 2"
"""a bridge retries after 1-2 s (Mosquitto 2.0.11 backs off to 5 s and more even with a single value)"""
DEFAULT_SETTINGS: dict[str, Any] = {"stats_interval": 1.0}
"""the wrappers' protocol settings: the project's defaults, with a `counters` event every second, so the events
of the last case are known to be on disk soon after it"""
STATUS_PATHS = ("drops.", "envelope.drops.", "daemon.broker.log.truncated", "daemon.broker.log.refused",
                "daemon.broker.log.not_understood.", "daemon.broker.log.unknown_client",
                "daemon.broker.log.ambiguous", "daemon.broker.log.evicted", "daemon.broker.inject_failed",
                "daemon.broker.injection_dropped.", "daemon.broker.reconnects", "daemon.overload.receive_dropped.",
                "daemon.overload.send_shed_qos0", "daemon.overload.kernel_receive_drops")
"""the numbers of a wrapper's status that say something went wrong, as flattened paths (prefixes)"""
EXPLAINED_EVENTS = ("publication_originated", "publication_delivered", "publication_dropped", "duplicate_dropped",
                    "publication_retransmitted", "subscription_added", "subscription_removed")
_WRAPPER_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) (WARNING|ERROR|CRITICAL) (.*)$")


class BridgeChain(BenchBrokers):
    """Brokers in name order, each bridged to the next with `topic # both 2` over MQTT v5."""

    def extra_conf(self, node: FederationNode) -> list[str] | None:
        target = self.next_broker(node)
        if target is None:
            return None
        return bridge_lines(node.index, target.host, topic="#", qos=2, direction="both", protocol="mqttv50",
                            label="transparency", restart_timeout=BRIDGE_RESTART)

    def bridges_subscribed(self) -> list[str]:
        """The bridges whose subscription to `#` the next broker has not logged yet (empty: all are up)."""
        waiting = []
        for node in self.nodes.values():
            target = self.next_broker(node)
            if target is None:
                continue
            connection = f"transparency-bridge-{node.index}"
            try:
                text = target.broker_log.read_text(errors="replace")
            except FileNotFoundError:
                text = ""
            if not re.search(rf"^\d+: \S*\b{re.escape(connection)} 2 #$", text, re.MULTILINE):
                waiting.append(f"{node.name}->{target.name}")
        return waiting


class PolicyBridges(BenchBrokers):
    """Brokers a, b, c where a and c are each bridged to b over MQTT v5 with their topic lines (`topic # both 2`
    for a site without lines): the bridge chain of the policy cases (policies.py), b the remote side of both."""

    def __init__(self, workdir: Path, first_address: str, topics: Mapping[str, Sequence[str]]) -> None:
        super().__init__(list(SITES), [], workdir, first_address, bridges=True)
        self.topics = {site: list(topics.get(site) or ["# both 2"]) for site in ("a", "c")}  # none: everything

    def extra_conf(self, node: FederationNode) -> list[str] | None:
        lines = self.topics.get(node.name)
        if lines is None:
            return None
        bridge = bridge_lines(node.index, self.node("b").host, topic="#", qos=2, direction="both",
                              protocol="mqttv50", label="transparency", restart_timeout=BRIDGE_RESTART)
        return [line for line in bridge if not line.startswith("topic ")] + [f"topic {line}" for line in lines]

    def bridges_subscribed(self) -> list[str]:
        """The bridges b has not seen connect, or whose remote subscriptions (their in and both lines) it has
        not logged yet (empty: all are up)."""
        try:
            text = self.node("b").broker_log.read_text(errors="replace")
        except FileNotFoundError:
            text = ""
        waiting = []
        for site, lines in self.topics.items():
            connection = f"transparency-bridge-{self.node(site).index}"
            wanted = [f"{connection} {line.qos} {line.remote_topic}" for line in map(parse_line, lines)
                      if line.direction in IMPORTS]
            connected = re.search(rf" as \S*\b{re.escape(connection)} \(", text)  # the client id: HOST.connection
            if not connected or any(not re.search(rf"^\d+: \S*\b{re.escape(entry)}$", text, re.MULTILINE)
                                    for entry in wanted):
                waiting.append(f"{site}->b")
        return waiting


class Setup:
    """One setup: its brokers, which broker each site uses, how to start and stop it; `topics`: topic policy
    lines by site (the policy cases: a federation's wrappers and a bridge chain's bridges get them)."""

    def __init__(self, kind: str, workdir: Path, first_address: str, topology: str = "line",
                 settings: Mapping[str, Any] | None = None, topics: Mapping[str, Sequence[str]] | None = None) -> None:
        if kind not in SETUP_KINDS:
            raise ValueError(f"setup {kind!r}: one of {', '.join(SETUP_KINDS)}")
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology {topology!r}: line or ring")
        if kind == "bridge-chain" and topology != "line":
            raise ValueError("a bridge chain is a line (bridges in a ring loop forever)")
        if topics and kind == "one-broker":
            raise ValueError("one broker has no topic policy: the policy cases run on a bridge chain and a federation")
        self.kind = kind
        self.topology = topology if kind == "federation" else ("line" if kind == "bridge-chain" else "-")
        self.topics = {site: list(lines) for site, lines in (topics or {}).items()}
        directory = workdir / kind
        self.brokers: LocalFederation
        if kind == "one-broker":
            self.brokers = LocalFederation(["one"], [], directory, first_address=first_address)
            self.site_nodes = {site: "one" for site in SITES}
        elif kind == "federation":
            names = ["a", "b", "c", "d"] if topology == "ring" else ["a", "b", "c"]
            links = ring(names) if topology == "ring" else line(names)
            self.brokers = LocalFederation(names, links, directory, dict(settings or DEFAULT_SETTINGS),
                                           first_address=first_address, topics=self.topics)
            self.site_nodes = {site: site for site in SITES}
        elif topics is not None:
            self.brokers = PolicyBridges(directory, first_address, self.topics)
            self.site_nodes = {site: site for site in SITES}
        else:
            self.brokers = BridgeChain(list(SITES), [], directory, first_address, bridges=True)
            self.site_nodes = {site: site for site in SITES}

    @property
    def name(self) -> str:
        return self.kind

    @property
    def reference(self) -> bool:
        return self.kind == "one-broker"

    @property
    def settles_on_fence(self) -> bool:
        """A `$` fence reaches every client only on one broker (no bridge or wrapper carries `$` topics)."""
        return self.kind == "one-broker"

    def policy(self, site: str) -> TopicPolicy:
        """The topic policy of a site's broker (every site's is everything without topic lines)."""
        return TopicPolicy.parse(self.topics.get(self.site_nodes[site], ()))

    def broker_of(self, site: str) -> str:
        return self.site_nodes[site]

    def describe(self) -> str:
        if self.kind == "one-broker":
            return "one Mosquitto broker, every client on it"
        order = list(self.brokers.nodes)
        lines = "; ".join(f"{site}: {len(lines)} topic lines" for site, lines in sorted(self.topics.items()))
        if self.kind == "federation":
            shape = "-".join(order) + ("-" + order[0] if self.topology == "ring" else "")
            extra = f"; {lines}" if lines else ""
            return f"federation {self.topology} {shape} (wrappers with the default settings{extra})"
        if isinstance(self.brokers, PolicyBridges):
            return f"bridge chain a->b<-c (a and c bridged to b with their topic lines, # both 2 without; {lines})"
        return f"bridge chain {'<->'.join(order)} (topic # both 2, bridge_protocol_version mqttv50)"

    def address(self, site: str) -> tuple[str, int]:
        return self.brokers.node(self.site_nodes[site]).host, BROKER_PORT

    @property
    def probe_sites(self) -> tuple[str, ...]:
        """One site per distinct broker (the first that uses it)."""
        seen: dict[str, str] = {}
        for site in SITES:
            seen.setdefault(self.site_nodes[site], site)
        return tuple(seen.values())

    def start(self) -> None:
        """Start the brokers (and wrappers, until converged; or bridges, until subscribed); LaunchError."""
        try:
            if self.kind == "federation":
                self.brokers.start(timeout=START_TIMEOUT)
                self.brokers.wait_converged(timeout=CONVERGE_TIMEOUT)
            else:
                self.brokers.start_brokers(timeout=START_TIMEOUT)
            if isinstance(self.brokers, (BridgeChain, PolicyBridges)):
                chain = self.brokers
                poll(lambda: not chain.bridges_subscribed(), BRIDGE_TIMEOUT,
                     lambda: f"the bridges {', '.join(chain.bridges_subscribed())} to subscribe")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self.brokers.stop()

    def problems(self) -> list[str]:
        """Processes of this setup that have exited (empty when all run)."""
        found = []
        for node in self.brokers.nodes.values():
            if not node.broker_running:
                found.append(f"the broker of {node.name} is not running")
            if self.kind == "federation" and not node.wrapper_running:
                found.append(f"the wrapper of {node.name} is not running")
        return found

    def diagnostics(self) -> str:
        return self.brokers.diagnostics()

    # ------------------------------------------------------------ what a federation's wrappers say

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Every wrapper's status numbers under `STATUS_PATHS` (empty without wrappers)."""
        if self.kind != "federation":
            return {}
        found: dict[str, dict[str, float]] = {}
        for name, document in self.brokers.statuses(list(self.brokers.nodes)).items():
            found[name] = {} if document is None else {
                path: value for path, value in flatten(document).items() if path.startswith(STATUS_PATHS)}
        return found

    def wait_events(self, after: float) -> None:
        """Until every wrapper's event log holds what it emitted before `after` (unix time); no-op otherwise."""
        if self.kind == "federation":
            with contextlib.suppress(LaunchError):  # the explanation is then incomplete, never wrong
                self.brokers.wait_event_logs(after, timeout=15.0)

    def explain(self, prefix: str, started: float, ended: float, before: Mapping[str, Mapping[str, float]],
                after: Mapping[str, Mapping[str, float]]) -> list[str]:
        """What the wrappers said about one case: events on its topics in [started, ended], status numbers
        that changed, WARNING/ERROR lines of their logs (one line per wrapper)."""
        if self.kind != "federation":
            return []
        lines = []
        for name, node in self.brokers.nodes.items():
            parts = [event_summary(self.brokers.events(name, EXPLAINED_EVENTS), prefix, started, ended)]
            changed = counter_changes(before.get(name, {}), after.get(name, {}))
            if changed:
                parts.append("status " + ", ".join(changed))
            warnings = log_warnings(node.wrapper_log, started, ended)
            if warnings:
                parts.append("log: " + " | ".join(warnings))
            text = "; ".join(part for part in parts if part)
            lines.append(f"{name}: {text or 'nothing about these topics'}")
        return lines


def flatten(document: Any, path: str = "") -> dict[str, float]:
    """The numeric leaves of a JSON document as dotted paths (booleans left out)."""
    found: dict[str, float] = {}
    if isinstance(document, dict):
        for key, value in document.items():
            found.update(flatten(value, f"{path}{key}."))
    elif isinstance(document, (int, float)) and not isinstance(document, bool):
        found[path.rstrip(".")] = document
    return found


def counter_changes(before: Mapping[str, float], after: Mapping[str, float]) -> list[str]:
    """`drops.publication_too_large +3`, for every number that changed."""
    changes = []
    for path in sorted(set(before) | set(after)):
        delta = after.get(path, 0) - before.get(path, 0)
        if delta:
            changes.append(f"{path} {delta:+g}")
    return changes


def concerns(event: Mapping[str, Any], prefix: str) -> bool:
    """Whether an event is about the case's topics: its topic or filter is under `prefix` (probes excluded)."""
    topic = event.get("topic")
    if isinstance(topic, str):
        return topic.startswith(prefix + "/") and "tp-probe" not in topic.split("/")
    topic_filter = event.get("filter")
    if isinstance(topic_filter, str):
        if topic_filter.startswith("$share/"):
            topic_filter = topic_filter.split("/", 2)[-1]
        return topic_filter.startswith(prefix + "/") or topic_filter == prefix
    return False


def event_summary(found: list[dict[str, Any]], prefix: str, started: float, ended: float) -> str:
    """`originated 3, originated retained (no filter) 1, delivered 3, dropped too_large 2`: the events about the
    case's topics within [started, ended], counted by kind; an originated publication says whether it was
    retained and whether no federated filter matched it (then it went nowhere)."""
    counts: dict[str, int] = {}
    for event in found:
        if not started <= float(event.get("t", 0.0)) <= ended or not concerns(event, prefix):
            continue
        kind = str(event.get("type", "")).removeprefix("publication_")
        if kind == "dropped":
            kind = f"dropped {event.get('reason')}"
        elif kind == "originated":
            kind += (" retained" if event.get("retain") else "") + (" (no filter)" if not event.get("filters") else "")
        elif kind in ("subscription_added", "subscription_removed") and not event.get("federated", True):
            kind += " (not federated)"
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{kind} {count}" for kind, count in counts.items())


def log_warnings(path: Path, started: float, ended: float, limit: int = 3) -> list[str]:
    """The wrapper log's WARNING/ERROR lines stamped within [started, ended] (local time, millisecond)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    found = []
    for raw in text.splitlines():
        match = _WRAPPER_LOG_LINE.match(raw)
        if match is None:
            continue
        stamp = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").timestamp() \
            + int(match.group(2)) / 1000
        if started - 0.5 <= stamp <= ended + 0.5:
            found.append(f"{match.group(3)} {match.group(4)[:300]}")
    return found[:limit]
