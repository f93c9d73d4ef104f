"""Real MQTT subscribers for a scenario run, and the deliveries read back from what they printed.

Theory of operation
-------------------
Every scenario client (node, client id) is one `mosquitto_sub` process on
its node's broker, with the client id and all of the client's current
filters (`-t` once per filter; `-q` is the highest QoS asked for). A
`subscribe` of a new filter or an `unsubscribe` restarts the process with the
new filter set (stop, then start: the broker logs the disconnection and the
new subscriptions, which is what the wrapper learns from); an `unsubscribe`
of the last filter or a `disconnect` stops it. Each process prints one line
per message, `SUBSCRIBER_FORMAT`: the receive time, the payload in hex and
the topic, into its own file.

Deliveries. The report counts (publication, node) pairs, so what a node's
broker received must be told apart from what each of its clients printed:

* mosquitto_sub speaks MQTT 3.1.1, for which Mosquitto sends one copy per
  client however many of its filters match, so a client prints one line per
  copy its broker got;
* several clients on one node each print every copy: the node's copies of
  a publication are those of the client that printed most of them (members
  of one `$share/<group>/` group split the copies between them, so a group
  counts as one receiver, the sum of its members);
* on the origin node a client with a matching filter at publish time gets
  the publication from its own broker: that first line is not a delivery.

Ground truth for the `subscribed` flag of a delivery is the scenario's own
subscription history (`SubscriptionHistory`), not the processes: a
subscription is active from its `subscribe` event to its `unsubscribe` or
`disconnect`, as in the simulator.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from federation.harness.nodeconfig import BROKER_PORT
from federation.harness.processes import end_all
from federation.protocol.topic_filter import federated_filter, matches
from federation.scenario.report import DeliveryRecord

if TYPE_CHECKING:
    import subprocess

    from federation.harness.platform import Platform

SUBSCRIBER_FORMAT = "%U %x %t"
"""mosquitto_sub -F: unix receive time (ns), payload in hex, topic (last: it may hold spaces)"""
BROKER_HOST = "127.0.0.1"
"""every node's broker, as its own clients reach it"""


def subscriber_argv(client: str, filters: Mapping[str, int]) -> list[str]:
    """The mosquitto_sub command of one client: MQTT 3.1.1, clean session, stale retained messages skipped."""
    argv = ["mosquitto_sub", "-h", BROKER_HOST, "-p", str(BROKER_PORT), "-i", client,
            "-q", str(max(filters.values(), default=0)), "-R", "-F", SUBSCRIBER_FORMAT]
    for filter_ in sorted(filters):
        argv += ["-t", filter_]
    return argv


def publisher_argv(topic: str, qos: int, retain: bool) -> list[str]:
    """The mosquitto_pub of one `publish` event: connected ahead of time, one message per stdin line."""
    argv = ["mosquitto_pub", "-h", BROKER_HOST, "-p", str(BROKER_PORT), "-t", topic, "-q", str(qos), "-l"]
    return [*argv, "-r"] if retain else argv


def share_group(filter_: str) -> str | None:
    """The group of a `$share/<group>/<filter>` subscription, None for an ordinary filter."""
    if not filter_.startswith("$share/"):
        return None
    return filter_.split("/", 2)[1]


def filter_matches(filter_: str, topic: str) -> bool:
    federated = federated_filter(filter_)
    return federated is not None and matches(federated, topic)


@dataclass
class ClientRun:
    """One mosquitto_sub process of a scenario client."""

    node: str
    client: str
    filters: dict[str, int]
    output: Path
    started: float
    """run time (seconds from the run's start) the process was started"""
    process: subprocess.Popen[bytes] | None = None
    ended: float | None = None

    @property
    def receiver(self) -> str:
        """The key copies are counted under: the share group if every filter is in one, else the client."""
        groups = {share_group(filter_) for filter_ in self.filters}
        if len(groups) == 1 and None not in groups:
            return f"$share/{next(iter(groups))}"
        return f"client/{self.client}"

    def active_at(self, at: float) -> bool:
        return self.started <= at and (self.ended is None or at < self.ended)


@dataclass
class SubscriptionHistory:
    """(node, client, filter) -> [start, end) intervals of the scenario's subscriptions, in run time."""

    intervals: dict[tuple[str, str, str], list[list[float | None]]] = field(default_factory=dict)

    def start(self, node: str, client: str, filter_: str, at: float) -> None:
        spans = self.intervals.setdefault((node, client, filter_), [])
        if not spans or spans[-1][1] is not None:
            spans.append([at, None])

    def end(self, node: str, client: str, filter_: str, at: float) -> None:
        spans = self.intervals.get((node, client, filter_))
        if spans and spans[-1][1] is None:
            spans[-1][1] = at

    def subscribed(self, node: str, topic: str, at: float) -> bool:
        """Whether the node had a subscription matching `topic` at run time `at`."""
        for (where, _, filter_), spans in self.intervals.items():
            if where != node or not filter_matches(filter_, topic):
                continue
            for start, end in spans:
                assert start is not None
                if start <= at and (end is None or at < end):
                    return True
        return False


class SubscriberClients:
    """The run's mosquitto_sub processes; see the module docstring."""

    def __init__(self, platform: Platform, directory: Path, clock: Callable[[], float]) -> None:
        self.platform = platform
        self.directory = directory
        self.clock = clock
        self.filters: dict[tuple[str, str], dict[str, int]] = {}
        self.current: dict[tuple[str, str], ClientRun] = {}
        self.runs: list[ClientRun] = []
        self.history = SubscriptionHistory()

    def subscribe(self, node: str, client: str, filter_: str, qos: int) -> None:
        now = self.clock()
        self.history.start(node, client, filter_, now)
        filters = self.filters.setdefault((node, client), {})
        if filters.get(filter_) == qos and (node, client) in self.current:
            return
        filters[filter_] = qos
        self._restart(node, client)

    def unsubscribe(self, node: str, client: str, filter_: str) -> None:
        self.history.end(node, client, filter_, self.clock())
        filters = self.filters.get((node, client), {})
        if filters.pop(filter_, None) is None:
            return
        self._restart(node, client)

    def disconnect(self, node: str, client: str) -> None:
        now = self.clock()
        for filter_ in self.filters.pop((node, client), {}):
            self.history.end(node, client, filter_, now)
        self._stop(node, client)

    def restart_node(self, node: str) -> None:
        """Start every client of `node` again (after its broker restarted: see the driver)."""
        for (where, client) in sorted(self.filters):
            if where == node:
                self._restart(node, client)

    def _stop(self, node: str, client: str) -> None:
        run = self.current.pop((node, client), None)
        if run is None:
            return
        if run.process is not None:
            end_all([run.process])
        run.ended = self.clock()

    def _restart(self, node: str, client: str) -> None:
        self._stop(node, client)
        filters = dict(self.filters.get((node, client), {}))
        if not filters:
            return
        output = self.directory / f"{node}.{client}.{len(self.runs)}.out"
        run = ClientRun(node, client, filters, output, self.clock())
        run.process = self.platform.start_client(node, subscriber_argv(client, filters), output)
        self.current[(node, client)] = run
        self.runs.append(run)

    def stop_all(self) -> None:
        processes = [run.process for run in self.current.values() if run.process is not None]
        end_all(processes)
        now = self.clock()
        for run in self.current.values():
            run.ended = now
        self.current.clear()


@dataclass(frozen=True)
class SentPublication:
    """What the driver knows about one publication it made."""

    payload_id: str
    origin: str
    topic: str
    sent_at: float
    """run time"""


@dataclass
class Receipts:
    """Lines the subscribers printed, read back: node -> receiver -> payload id -> receive times (run time)."""

    by_node: dict[str, dict[str, dict[str, list[float]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(list))))
    topics: dict[str, str] = field(default_factory=dict)
    """payload id -> topic it arrived on"""
    foreign: int = 0
    """lines that were not one of the run's payloads (not JSON, no id)"""


def parse_line(raw: str) -> tuple[float, bytes, str] | None:
    """(unix receive time, payload, topic) of one SUBSCRIBER_FORMAT line; None if malformed."""
    parts = raw.split(" ", 2)
    if len(parts) != 3:
        return None
    try:
        return float(parts[0]), bytes.fromhex(parts[1]), parts[2]
    except ValueError:
        return None


def payload_id(payload: bytes) -> str | None:
    try:
        document = json.loads(payload)
    except ValueError:
        return None
    identifier = document.get("id") if isinstance(document, dict) else None
    return identifier if isinstance(identifier, str) else None


def read_receipts(runs: Iterable[ClientRun], t0: float, final: bool) -> Receipts:
    """Every line of every run's output; `final`: the processes have ended, a last unterminated line counts."""
    receipts = Receipts()
    for run in runs:
        try:
            text = run.output.read_bytes().decode("utf-8", errors="replace")
        except FileNotFoundError:
            continue
        lines = text.split("\n")
        if not final:
            lines = lines[:-1]  # the last piece is empty or a line being written
        for raw in lines:
            if not raw:
                continue
            parsed = parse_line(raw)
            identifier = payload_id(parsed[1]) if parsed is not None else None
            if parsed is None or identifier is None:
                receipts.foreign += 1
                continue
            received, _, topic = parsed
            receipts.by_node[run.node][run.receiver][identifier].append(received - t0)
            receipts.topics.setdefault(identifier, topic)
    return receipts


def deliveries(receipts: Receipts, runs: Sequence[ClientRun], sent: Mapping[str, SentPublication],
               history: SubscriptionHistory) -> list[DeliveryRecord]:
    """The (publication, node) deliveries the report classifies; see the module docstring for the rules."""
    records: list[DeliveryRecord] = []
    for node in sorted(receipts.by_node):
        receivers = receipts.by_node[node]
        identifiers = sorted({identifier for copies in receivers.values() for identifier in copies})
        for identifier in identifiers:
            publication = sent.get(identifier)
            best: list[float] = []
            for receiver in sorted(receivers):
                times = sorted(receivers[receiver].get(identifier, []))
                if not times:
                    continue
                if publication is not None and publication.origin == node and _local_copy(
                        runs, node, receiver, publication):
                    times = times[1:]
                if len(times) > len(best) or (times and len(times) == len(best) and times[0] < best[0]):
                    best = times
            topic = publication.topic if publication is not None else receipts.topics.get(identifier, "")
            for at in best:
                records.append(DeliveryRecord(identifier, node, at, history.subscribed(node, topic, at)))
    return records


def _local_copy(runs: Sequence[ClientRun], node: str, receiver: str, publication: SentPublication) -> bool:
    """Whether a run of this receiver had a matching filter when the publication was made on its node."""
    return any(run.node == node and run.receiver == receiver and run.active_at(publication.sent_at)
               and any(filter_matches(filter_, publication.topic) for filter_ in run.filters)
               for run in runs)
