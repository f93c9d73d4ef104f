"""One fault case on a running setup: numbered streams, the fault and its healing, the drain, the verdicts.

Theory of operation: a case runs two streams at once, QoS 1 and QoS 2, each
on its own topic (`faults/<run>/<case>/q1`, `.../q2`) from its own
`PacedPublisher` on the publisher's broker to its own persistent
`StreamSubscriber` on the subscriber's broker; new topics and client ids per
case, so nothing of one case is counted in another.

1. Subscribe, then probe: a probe on every topic every `PROBE_INTERVAL` until
   each subscriber has printed one (the bridges are connected, or the
   wrappers know the subscription and the mesh carries it).
2. Stream: both publishers start; the schedule runs on the wall clock
   (each fault applied at its `at`, healed `seconds` later; a restarted
   wrapper is not awaited, so the schedule keeps its times); publishing
   goes on `tail` seconds after the last healing.
3. Drain: wait for the publishers' acknowledgements, then until every
   acknowledged publication has arrived, or nothing new has arrived for
   `quiet` seconds (but not before the setup has had as long after the
   healing as the fault lasted, `SETTLE_CAP` at most, and counting from
   when every wrapper is ready again: a wrapper restarted at the healing
   took 7 s to start once under load), or `drain_timeout`
   has passed; then stop the subscribers and judge what they printed
   (`counting`). A subscriber that exits meanwhile (mosquitto_sub does on
   a protocol error) is started again, as an application would reconnect,
   and counted.
4. Explain (federation only): each wrapper's status before and after
   (`snapshot`: drop counters, broker reconnects, injections) and the
   events the wrappers logged during the case (`EventTail`): how many of the
   stream's publications were originated at the publisher's node, delivered
   at the subscriber's, dropped where and why, dropped as duplicates.

Nothing sleeps blindly: every wait is for a condition or an instant of the
schedule, with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from federation.harness.processes import LaunchError, poll
from federation.protocol.publication_events import expand
from suites.faults.bulk import BulkLoad, BulkPublisher, BulkSubscriber, peak_resident_mib
from suites.faults.catalogue import Fault
from suites.faults.clients import PacedPublisher, StreamSubscriber
from suites.faults.counting import Arrival, StreamCount, count_stream
from suites.faults.ledger import ledger
from suites.faults.setups import TOPIC_ROOT, FaultSetup

Subscriber = StreamSubscriber | BulkSubscriber

PROBE_INTERVAL = 0.2
"""seconds between two probes while a subscriber has printed none"""
STREAM_QOS = (1, 2)
EVENT_FLUSH_TIMEOUT = 5.0
"""seconds the wrappers get to write the case's events to their logs"""
SETTLE_CAP = 30.0
"""seconds: after the last healing the drain gives the setup at least as long as the longest fault lasted (up
to this) before quiet may end it: TCP (a bridge) backs off its retransmissions during an outage, so a
connection that lost packets for 30 s may resend only 20-30 s after the healing"""
SUPERVISE_INTERVAL = 0.1
"""seconds between two checks that the subscribers still run"""


@dataclass(frozen=True)
class Timing:
    """How long each phase of a case lasts (seconds)."""

    rate: float = 100.0
    """publications per second of each stream"""
    lead: float = 2.0
    """stream before the first fault (the schedule's times count from the stream's start)"""
    tail: float = 2.0
    """stream after the last healing"""
    ack_timeout: float = 15.0
    quiet: float = 5.0
    """drain: nothing new for this long ends the wait"""
    drain_timeout: float = 35.0
    probe_timeout: float = 30.0


@dataclass(frozen=True)
class Scheduled:
    """A fault applied `at` seconds after the stream starts, healed `fault.seconds` later."""

    fault: Fault
    at: float


@dataclass
class CaseResult:
    """What one case measured; `error` says why a case could not be judged (then `streams` may be empty)."""

    setup: str
    case: str
    schedule: list[dict[str, Any]]
    streams: dict[int, StreamCount] = field(default_factory=dict)
    actions: list[dict[str, Any]] = field(default_factory=list)
    """what was done when (unix time), as done"""
    explain: dict[str, Any] = field(default_factory=dict)
    started: float = 0.0
    ended: float = 0.0
    healed: float | None = None
    """unix time of the last healing"""
    last_arrival: dict[int, float] = field(default_factory=dict)
    """per stream, unix time of the last message the subscriber printed"""
    subscriber_restarts: dict[int, int] = field(default_factory=dict)
    """per stream, how often its mosquitto_sub had exited (it exits on a protocol error) and was started again"""
    more: dict[str, dict[int, StreamCount]] = field(default_factory=dict)
    """the streams as the subscribers on other nodes (the topology's `also_subscribing`) received them, by node"""
    bulk: StreamCount | None = None
    """the bulk flood's stream, at the subscriber's node (`bulk.py`)"""
    latency: dict[str, dict[str, float]] = field(default_factory=dict)
    """per plain stream (its QoS), seconds from publishing to arrival at the subscriber's node: p50, p99, max"""
    memory: dict[str, dict[str, float | None]] = field(default_factory=dict)
    """per node, the peak resident MiB of its wrapper and its broker (`VmHWM`) when the case ended"""
    ledger: dict[str, Any] = field(default_factory=dict)
    """the wrappers' counters and events against what the subscribers received (`ledger.py`)"""
    subscriber_node: str = ""
    """the node of the subscriber role (`streams` are counted there, `more` at the others)"""
    catch_up: dict[str, dict[str, float]] = field(default_factory=dict)
    """per "node/QoS": after the last healing, how many acknowledged publications made before it were missing there
    (`backlog`), how long until the last of them arrived (`seconds`) and at what rate they came (`rate`, per s)"""
    error: str | None = None

    def meets(self, qos: int) -> bool:
        stream = self.streams.get(qos)
        return self.error is None and stream is not None and stream.meets(qos) and \
            all(counts[qos].meets(qos) for counts in self.more.values() if qos in counts)

    def bulk_meets(self) -> bool:
        return self.error is None and (self.bulk is None or self.bulk.meets(1))

    def to_json(self) -> dict[str, Any]:
        return {"setup": self.setup, "case": self.case, "schedule": self.schedule,
                "streams": {str(qos): count.to_json() for qos, count in sorted(self.streams.items())},
                "actions": self.actions, "explain": self.explain, "started": self.started, "ended": self.ended,
                "seconds": round(self.ended - self.started, 1), "healed": self.healed,
                "last_arrival": {str(qos): value for qos, value in sorted(self.last_arrival.items())},
                "subscriber_restarts": {str(qos): value for qos, value in sorted(self.subscriber_restarts.items())},
                "more": {node: {str(qos): count.to_json() for qos, count in sorted(counts.items())}
                         for node, counts in sorted(self.more.items())},
                "bulk": None if self.bulk is None else self.bulk.to_json(), "latency": self.latency,
                "memory": self.memory, "ledger": self.ledger, "catch_up": self.catch_up,
                "subscriber_node": self.subscriber_node, "error": self.error}

    @staticmethod
    def from_json(document: dict[str, Any]) -> CaseResult:
        bulk = document.get("bulk")
        return CaseResult(
            setup=document["setup"], case=document["case"], schedule=document["schedule"],
            streams={int(qos): _count_of(counts) for qos, counts in document["streams"].items()},
            more={node: {int(qos): _count_of(counts) for qos, counts in streams.items()}
                  for node, streams in document.get("more", {}).items()},
            bulk=None if bulk is None else _count_of(bulk), latency=document.get("latency", {}),
            memory=document.get("memory", {}), ledger=document.get("ledger", {}),
            catch_up=document.get("catch_up", {}), subscriber_node=document.get("subscriber_node", ""),
            actions=document["actions"], explain=document["explain"], started=document["started"],
            ended=document["ended"], healed=document.get("healed"),
            last_arrival={int(qos): value for qos, value in document.get("last_arrival", {}).items()},
            subscriber_restarts={int(qos): value for qos, value in document.get("subscriber_restarts", {}).items()},
            error=document["error"])


def _count_of(counts: dict[str, Any]) -> StreamCount:
    return StreamCount(**{**counts, "lost_sample": tuple(counts["lost_sample"]),
                          "lost_ranges": tuple(tuple(pair) for pair in counts["lost_ranges"]),
                          "swapped": tuple(tuple(pair) for pair in counts.get("swapped", ()))})


def catch_up(published_at: list[float], acknowledged: list[int], arrivals: list[Arrival],
             healed: float) -> dict[str, float] | None:
    """How a subscriber caught up after a healing at `healed` (unix time): the acknowledged publications made before
    it and not arrived by then (`backlog`), the seconds until the last of them arrived, and their rate; None
    when nothing was missing at the healing."""
    first: dict[int, float] = {}
    for arrival in arrivals:
        first.setdefault(arrival.seq, arrival.received)
    missing = [seq for seq in acknowledged
               if seq <= len(published_at) and published_at[seq - 1] < healed and first.get(seq, healed + 1) >= healed]
    if not missing:
        return None
    arrived = [first[seq] for seq in missing if seq in first]
    seconds = max(arrived) - healed if arrived else 0.0
    return {"backlog": len(missing), "arrived": len(arrived), "seconds": round(seconds, 3),
            "rate": round(len(arrived) / seconds, 1) if seconds > 0 else 0.0}


def percentiles(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of `values` (seconds, rounded to the millisecond); empty for none."""
    if not values:
        return {}
    ordered = sorted(values)
    return {"p50": round(ordered[len(ordered) // 2], 3), "p99": round(ordered[min(len(ordered) - 1,
                                                                                  int(len(ordered) * 0.99))], 3),
            "max": round(ordered[-1], 3)}


class EventTail:
    """The events a wrapper appended to its log since this object was made (whole lines only), runs of
    publications as one record per publication (`publication_events.expand`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        found: list[dict[str, Any]] = []
        for raw in data[:data.rfind(b"\n") + 1].splitlines():
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if isinstance(event, dict):
                found.extend(expand(event))
        return found


def explain_streams(events: dict[str, list[dict[str, Any]]], topics: dict[int, str], publisher: str,
                    subscriber: str) -> dict[str, Any]:
    """Per stream, from the wrappers' events of a case: originated at the publisher's node, delivered at the
    subscriber's (copies included), dropped (node -> reason -> count), dropped as duplicates (node -> count),
    retransmitted; and every drop of the case by node and reason, whatever its stream."""
    explained: dict[str, Any] = {}
    for qos, topic in sorted(topics.items()):
        originated = {event.get("pub") for event in events.get(publisher, [])
                      if event.get("type") == "publication_originated" and event.get("topic") == topic}
        dropped: dict[str, Counter[str]] = {}
        duplicates: Counter[str] = Counter()
        retransmitted = 0
        for node, node_events in sorted(events.items()):
            for event in node_events:
                if event.get("pub") not in originated:
                    continue
                kind = event.get("type")
                if kind == "publication_dropped":
                    dropped.setdefault(node, Counter())[str(event.get("reason"))] += 1
                elif kind == "duplicate_dropped":
                    duplicates[node] += 1
                elif kind == "publication_retransmitted":
                    retransmitted += 1
        delivered = [event.get("pub") for event in events.get(subscriber, [])
                     if event.get("type") == "publication_delivered" and event.get("topic") == topic]
        explained[str(qos)] = {
            "originated": len(originated), "delivered": len(delivered), "delivered_unique": len(set(delivered)),
            "dropped": {node: dict(reasons) for node, reasons in dropped.items()},
            "duplicate_dropped": dict(duplicates), "retransmitted": retransmitted}
    all_drops: dict[str, Counter[str]] = {}
    for node, node_events in sorted(events.items()):
        for event in node_events:
            if event.get("type") == "publication_dropped":
                all_drops.setdefault(node, Counter())[str(event.get("reason"))] += 1
    explained["all_drops"] = {node: dict(reasons) for node, reasons in all_drops.items()}
    return explained


class CaseRun:
    """Runs one case on a started, healthy setup; see the module docstring."""

    def __init__(self, setup: FaultSetup, case: str, schedule: list[Scheduled], timing: Timing, clients_dir: Path,
                 run_token: str, length: float = 0.0, streams: tuple[int, ...] = STREAM_QOS,
                 burst: int | None = None, qos2_v5: bool = False, bulk: BulkLoad | None = None) -> None:
        """`length`: the streams run at least this long (seconds), and `timing.tail` after the last healing.
        `streams`: their QoS levels. `burst`: each stream is that many publications as fast as they go,
        instead of `timing.rate` per second. `qos2_v5`: the QoS 2 subscriber speaks MQTT v5 (session expiry),
        else 3.1.1 (clean session off) like the QoS 1 subscriber. `bulk`: a flood of large publications beside
        the streams (bulk.py), on a topic and to a subscriber of its own."""
        self.setup = setup
        self.length = length
        self.healed_at = time.monotonic()
        """monotonic time of the last healing (of the start, before one)"""
        self.case = case
        self.schedule = sorted(schedule, key=lambda item: item.at)
        self.timing = timing
        self.clients_dir = clients_dir
        self.topics = {qos: f"{TOPIC_ROOT}/{run_token}/{case}/q{qos}" for qos in streams}
        self.result = CaseResult(setup.name, case, [
            {"fault": item.fault.name, "at": round(item.at, 3), "seconds": item.fault.seconds,
             "what": setup.describe(item.fault)} for item in self.schedule],
            subscriber_node=setup.topology.node("subscriber"))
        client_ids = {qos: f"faults-{run_token}-{case}-q{qos}"[:60] for qos in streams}
        self.publishers = {qos: PacedPublisher(setup.publish_host, setup.broker_port, topic, qos,
                                               None if burst else timing.rate, client_ids[qos] + "-pub", burst)
                           for qos, topic in self.topics.items()}
        self.subscribers = {qos: StreamSubscriber(setup.subscribe_host, setup.broker_port, topic, qos,
                                                  client_ids[qos] + "-sub", clients_dir / f"{client_ids[qos]}.out",
                                                  protocol="mqttv5" if qos == 2 and qos2_v5 else "mqttv311")
                            for qos, topic in self.topics.items()}
        self.more_subscribers: dict[str, dict[int, StreamSubscriber]] = {
            node: {qos: StreamSubscriber(setup.host(node), setup.broker_port, topic, qos,
                                         f"{client_ids[qos]}-{node}-sub"[:64],
                                         clients_dir / f"{client_ids[qos]}-{node}.out",
                                         protocol="mqttv5" if qos == 2 and qos2_v5 else "mqttv311")
                   for qos, topic in self.topics.items()}
            for node in setup.subscriber_nodes[1:]}
        """the subscribers of the other subscribing nodes (`Topology.also_subscribing`), by node and QoS"""
        self.bulk_topic = f"{TOPIC_ROOT}/{run_token}/{case}/bulk"
        self.bulk_publisher: BulkPublisher | None = None
        self.bulk_subscriber: BulkSubscriber | None = None
        if bulk is not None:
            bulk_id = f"faults-{run_token}-{case}-bulk"[:56]
            self.bulk_publisher = BulkPublisher(setup.publish_host, setup.broker_port, self.bulk_topic, bulk,
                                                bulk_id + "-pub")
            self.bulk_subscriber = BulkSubscriber(setup.subscribe_host, setup.broker_port, self.bulk_topic,
                                                  bulk_id + "-sub", clients_dir / f"{bulk_id}.out")

    def _all_publishers(self) -> list[PacedPublisher]:
        return [*self.publishers.values(), *([self.bulk_publisher] if self.bulk_publisher is not None else [])]

    def _all_subscribers(self) -> list[tuple[PacedPublisher, str, Subscriber]]:
        """(publisher, topic, subscriber) of every stream end: the subscriber node's, the other nodes', the bulk's."""
        ends: list[tuple[PacedPublisher, str, Subscriber]] = [
            (self.publishers[qos], self.topics[qos], subscriber) for qos, subscriber in self.subscribers.items()]
        for subscribers in self.more_subscribers.values():
            ends += [(self.publishers[qos], self.topics[qos], subscriber) for qos, subscriber in subscribers.items()]
        if self.bulk_publisher is not None and self.bulk_subscriber is not None:
            ends.append((self.bulk_publisher, self.bulk_topic, self.bulk_subscriber))
        return ends

    @property
    def _subscriber_broker_killed(self) -> bool:
        """Does the case kill the subscriber's broker (so its client library may swap a QoS 2 message: counting.py)?"""
        return any(item.fault.kind == "kill_broker" and item.fault.role == "subscriber" for item in self.schedule)

    def run(self) -> CaseResult:
        result = self.result
        result.started = time.time()
        tails = {name: EventTail(node.event_log) for name, node in self.setup.brokers.nodes.items()}
        before = self.setup.snapshot()
        try:
            self._subscribe_and_probe()
            self._stream()
            self._drain()
        except LaunchError as error:
            result.error = str(error)
        finally:
            for publisher in self._all_publishers():
                publisher.close()
            for _publisher, _topic, subscriber in self._all_subscribers():
                subscriber.stop()
        for qos, publisher in self.publishers.items():
            subscriber = self.subscribers[qos]
            arrivals = subscriber.arrivals()
            result.streams[qos] = count_stream(publisher.sent, publisher.acknowledged(),
                                               [arrival.seq for arrival in arrivals],
                                               broker_restarted=qos == 2 and self._subscriber_broker_killed)
            result.latency[str(qos)] = percentiles(publisher.latencies(arrivals))
            if arrivals:
                result.last_arrival[qos] = arrivals[-1].received
            result.subscriber_restarts[qos] = subscriber.restarts
        for node, subscribers in self.more_subscribers.items():
            result.more[node] = {qos: count_stream(self.publishers[qos].sent, self.publishers[qos].acknowledged(),
                                                   [arrival.seq for arrival in subscriber.arrivals()])
                                 for qos, subscriber in subscribers.items()}
        if result.healed is not None:
            nodes = self.setup.subscriber_nodes
            by_node = {nodes[0]: self.subscribers, **self.more_subscribers}
            for node, subscribers in by_node.items():
                for qos, subscriber in subscribers.items():
                    publisher = self.publishers[qos]
                    caught = catch_up(list(publisher.published_at), publisher.acknowledged(), subscriber.arrivals(),
                                      result.healed)
                    if caught is not None:
                        result.catch_up[f"{node}/{qos}"] = caught
        if self.bulk_publisher is not None and self.bulk_subscriber is not None:
            arrivals = self.bulk_subscriber.arrivals()
            result.bulk = count_stream(self.bulk_publisher.sent, self.bulk_publisher.acknowledged(),
                                       [arrival.seq for arrival in arrivals])
            result.latency["bulk"] = percentiles(self.bulk_publisher.latencies(arrivals))
        if not self.setup.bridge:
            self._explain(before, tails)
        result.ended = time.time()
        return result

    def _action(self, what: str) -> None:
        self.result.actions.append({"t": round(time.time(), 3), "what": what})

    def _subscribe_and_probe(self) -> None:
        for _publisher, _topic, subscriber in self._all_subscribers():
            subscriber.start()
        for publisher in self._all_publishers():
            publisher.connect()
        probes = [0]

        def probed() -> bool:
            self._keep_subscribers()
            missing = {topic: publisher for publisher, topic, subscriber in self._all_subscribers()
                       if not any(line.partition(b" ")[2].startswith(b"probe")
                                  for line in subscriber.raw().split(b"\n"))}
            for topic, publisher in sorted(missing.items()):
                probes[0] += 1
                publisher.client.publish(topic, b"probe %d" % probes[0], qos=1)
            return not missing

        poll(probed, self.timing.probe_timeout,
             lambda: f"a probe to reach the subscribers on {self.setup.subscribe_host} "
                     f"({probes[0]} sent):\n{self.setup.diagnostics()}", interval=PROBE_INTERVAL)
        self._action("probes arrived")

    def _stream(self) -> None:
        start = time.monotonic()
        for publisher in self._all_publishers():
            publisher.start()
        self._action("streams started")
        steps: list[tuple[float, int, Scheduled]] = []
        for item in self.schedule:
            steps += [(item.at, 0, item), (item.at + item.fault.seconds, 1, item)]
        steps.sort(key=lambda step: (step[0], step[1]))
        heals: dict[int, Any] = {}
        end = max(max((at for at, _, _ in steps), default=self.timing.lead) + self.timing.tail, self.length)
        try:
            for at, phase, item in steps:
                self._wait_until(start + at)
                if phase == 0:
                    heals[id(item)] = self.setup.apply(item.fault)
                    self._action(f"applied {item.fault.name}: {self.setup.describe(item.fault)}")
                else:
                    if item.fault.kind == "disk_full":  # what the wrappers say with it still on (issue 37)
                        self.result.explain.setdefault("status_during", {})[item.fault.name] = self.setup.snapshot()
                    heals.pop(id(item))()
                    self.healed_at = time.monotonic()
                    self.result.healed = time.time()
                    self._action(f"healed {item.fault.name}")
            self._wait_until(start + end)
            for publisher in self._all_publishers():
                publisher.wait_published(self.timing.ack_timeout)
        finally:
            for heal in heals.values():  # an error mid-schedule: undo what is still applied
                heal()
            for publisher in self._all_publishers():
                publisher.stop()
        self._action("streams stopped")

    def _wait_until(self, instant: float) -> None:
        """Until a scheduled instant of the case, keeping the subscribers running meanwhile."""
        while True:
            self._keep_subscribers()
            delay = instant - time.monotonic()
            if delay <= 0:
                return
            time.sleep(min(delay, SUPERVISE_INTERVAL))

    def _keep_subscribers(self) -> None:
        for _publisher, topic, subscriber in self._all_subscribers():
            if subscriber.restart_if_exited():
                self._action(f"the subscriber of {topic} on {subscriber.client_id} had exited "
                             f"({subscriber.last_error()}); started again")

    def _drain(self) -> None:
        deadline = time.monotonic() + self.timing.ack_timeout
        for publisher in self._all_publishers():
            publisher.wait_acknowledged(max(0.0, deadline - time.monotonic()))
        self._action("acknowledgements in" if all(len(p.acknowledged()) == p.sent for p in self._all_publishers())
                     else "acknowledgement timeout")
        ends = self._all_subscribers()
        wanted = {index: set(publisher.acknowledged()) for index, (publisher, _topic, _sub) in enumerate(ends)}
        settled = self.healed_at + min(SETTLE_CAP, max((item.fault.seconds for item in self.schedule), default=0.0))
        last_count = [-1]
        last_change = [time.monotonic()]

        def drained() -> str | None:
            self._keep_subscribers()
            seen = {index: {arrival.seq for arrival in subscriber.arrivals()}
                    for index, (_publisher, _topic, subscriber) in enumerate(ends)}
            if all(wanted[index] <= seen[index] for index in wanted):
                return "complete"
            count = sum(map(len, seen.values()))
            now = time.monotonic()
            if count != last_count[0]:
                last_count[0], last_change[0] = count, now
            if now - last_change[0] < self.timing.quiet or now < settled:
                return None
            if not self.setup.forwarding_ready(self.timing.quiet):  # a wrapper restarted: quiet counts from its start
                last_change[0] = now
                return None
            return "quiet"

        try:
            how = poll(drained, self.timing.drain_timeout, "the drain", interval=0.1)
        except LaunchError:
            how = "timeout"
        self._action(f"drained ({how})")

    def _explain(self, before: dict[str, Any], tails: dict[str, EventTail]) -> None:
        brokers = self.setup.brokers
        running = brokers.running_wrappers()
        with contextlib.suppress(LaunchError):  # else explain with what was written
            brokers.wait_event_logs(time.time(), timeout=EVENT_FLUSH_TIMEOUT, names=running)
        events = {name: tail.read() for name, tail in tails.items()}
        topology = self.setup.topology
        after = self.setup.snapshot()
        self.result.explain = {
            **self.result.explain,
            "events": explain_streams(events, self.topics, topology.node("publisher"), topology.node("subscriber")),
            "status_before": before, "status_after": after}
        result = self.result
        topics = {str(qos): topic for qos, topic in self.topics.items()}
        counts: dict[str, dict[str, StreamCount]] = {
            topology.node("subscriber"): {str(qos): count for qos, count in result.streams.items()}}
        for node, more in result.more.items():
            counts[node] = {str(qos): count for qos, count in more.items()}
        if result.bulk is not None:
            topics["bulk"] = self.bulk_topic
            counts[topology.node("subscriber")]["bulk"] = result.bulk
        killed = frozenset(topology.node(role) for item in self.schedule if item.fault.kind == "kill_wrapper"
                           for role in item.fault.roles)
        result.ledger = ledger(events, topics, topology.node("publisher"), counts, before, after, killed)
        for name, member in brokers.nodes.items():
            wrapper, broker = member.wrapper_process, member.broker_process
            result.memory[name] = {
                "wrapper_mib": peak_resident_mib(wrapper.pid if wrapper is not None and wrapper.poll() is None
                                                 else None),
                "broker_mib": peak_resident_mib(broker.pid if broker is not None and broker.poll() is None
                                                else None)}
