"""`python -m suites.bench.log_burst`: how fast a wrapper learns subscriptions from its broker's log.

Theory of operation
-------------------
A wrapper learns its broker's subscriptions from `$SYS/broker/log/M/subscribe`
(docs/daemon.md, "Learning subscriptions in bulk"). This starts a line of
`--nodes` real brokers and wrappers on loopback (federation.tools.launch), and
on the last broker one paho client either subscribes `--count` distinct
filters in SUBSCRIBE packets of 100 (`exact`: `dev/<i>/cmd`, `wildcard`:
`wdev/<i>/#`), or subscribes and unsubscribes `--rate` filters a second for
`--seconds`, each held for a second (`churn`). It prints:

- the learning timeline, from the `subscription_added` (and
  `subscription_removed`) events of that wrapper's event log: how many were
  learnt, when the last one was, how many a second, and the stalls (half a
  second or more with nothing learnt while some were missing);
- the hello round trip from its neighbour (the previous node of the line)
  while it learns, polled from that neighbour's status four times a second.
  The status gives the smoothed round trip (`rtt_ms`, weight
  `rtt_smoothing` per sample); each change of it is turned back into the
  sample that made it, and the largest sample is printed. The wrapper under
  test is not asked for its status until the end: a status document lists
  every subscription, and building it at 100,000 loads the wrapper measured;
- its broker connection: reconnections and the broker's "protocol error"
  lines, and whether it fell back to over-delivery.

The exit status is 0 when every subscription (and, for churn, every
unsubscription) was learnt and the connection never dropped, else 1.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from federation.daemon.lean_client import stop_network_thread
from federation.daemon.status import query
from federation.protocol.settings import Settings
from federation.tools.launch import BROKER_PORT, FederationNode, LocalFederation, line, node_names

CLIENT_ID = "log-burst"
PER_PACKET = 100
"""filters per SUBSCRIBE packet"""
POLL_INTERVAL = 0.25
"""seconds between looks at the neighbour's status"""
STALL = 0.5
"""seconds without a subscription learnt, while some are missing, that count as a stall"""


def filter_of(kind: str, number: int) -> str:
    return f"wdev/{number}/#" if kind == "wildcard" else f"dev/{number}/cmd" if kind == "exact" else \
        f"churn/{number}/cmd"


@dataclass
class Timeline:
    """What the wrapper's event log says it learnt about `client`."""

    added: list[float] = field(default_factory=list)
    """times of the `subscription_added` events"""
    removed: list[float] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path, client: str) -> Timeline:
        timeline = cls()
        with open(path, encoding="utf-8") as lines:
            for text in lines:
                if client not in text or '"subscription_' not in text:
                    continue
                event = json.loads(text)
                if event.get("client") != client:
                    continue
                if event["type"] == "subscription_added":
                    timeline.added.append(float(event["t"]))
                elif event["type"] == "subscription_removed":
                    timeline.removed.append(float(event["t"]))
        return timeline

    def per_second(self, start: float) -> list[int]:
        """Subscriptions learnt in each second from `start`."""
        counts = Counter(int(at - start) for at in self.added if at >= start)
        return [counts.get(second, 0) for second in range(max(counts, default=-1) + 1)]

    def stalls(self, start: float) -> list[tuple[float, float]]:
        """(seconds after `start`, length) of every gap of `STALL` or more from `start` to the first subscription
        learnt and between two of them."""
        times = sorted(self.added)
        return [(earlier - start, later - earlier) for earlier, later in zip([start, *times], times, strict=False)
                if later - earlier >= STALL]


def rtt_samples(smoothed: Sequence[float], weight: float) -> list[float]:
    """The round trip samples behind a series of smoothed round trips (each `(1 - weight) * previous + weight *
    sample`): one per change of the series."""
    samples = []
    for previous, current in zip(smoothed, smoothed[1:], strict=False):
        if current != previous:
            samples.append(previous + (current - previous) / weight)
    return samples


class NeighbourWatch:
    """The smoothed round trip from `watcher` to `watched`, read from `watcher`'s status in a thread."""

    def __init__(self, watcher: FederationNode, watched: FederationNode) -> None:
        self.watcher = watcher
        self.address = watched.address
        self.smoothed: list[float] = []
        self.downs = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="neighbour-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                document = query(self.watcher.host, self.watcher.wrapper_port, timeout=5)
            except Exception:  # noqa: BLE001 - counted: a status that did not come is a figure too
                self.errors += 1
            else:
                for neighbour in document["neighbours"]:
                    if neighbour.get("address") == self.address:
                        if neighbour.get("rtt_ms") is not None:
                            self.smoothed.append(float(neighbour["rtt_ms"]))
                        self.downs += not neighbour.get("up")
            self._stop.wait(POLL_INTERVAL)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class Subscriber:
    """The paho client of the burst (MQTT 3.1.1), counting its SUBACKs and UNSUBACKs."""

    def __init__(self, host: str) -> None:
        self.acknowledged = 0
        self._lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=CLIENT_ID, protocol=mqtt.MQTTv311)
        self.client.on_subscribe = self._acknowledge
        self.client.on_unsubscribe = self._acknowledge
        self.client.connect(host, BROKER_PORT)
        self.client.loop_start()

    def _acknowledge(self, *args: Any) -> None:
        with self._lock:
            self.acknowledged += 1

    def wait_acknowledged(self, requests: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.acknowledged < requests and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.acknowledged >= requests

    def close(self) -> None:
        self.client.disconnect()
        stop_network_thread(self.client)


def burst(subscriber: Subscriber, kind: str, count: int) -> int:
    """Subscribe `count` filters in packets of `PER_PACKET`; the number of packets."""
    packets = 0
    for start in range(0, count, PER_PACKET):
        numbers = range(start, min(count, start + PER_PACKET))
        subscriber.client.subscribe([(filter_of(kind, number), 1) for number in numbers])
        packets += 1
    return packets


def churn(subscriber: Subscriber, rate: int, seconds: float) -> tuple[int, int]:
    """Subscribe `rate` filters a second (10 a packet) for `seconds`, unsubscribing each packet's a second
    later; (filters, packets)."""
    started = time.monotonic()
    held: deque[tuple[float, list[str]]] = deque()
    made = packets = 0
    while time.monotonic() - started < seconds:
        now = time.monotonic()
        filters = [filter_of("churn", made + offset) for offset in range(10)]
        subscriber.client.subscribe([(each, 1) for each in filters])
        held.append((now, filters))
        made += len(filters)
        packets += 1
        while held and now - held[0][0] >= 1.0:
            subscriber.client.unsubscribe(held.popleft()[1])
            packets += 1
        delay = started + made / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    while held:
        subscriber.client.unsubscribe(held.popleft()[1])
        packets += 1
    return made, packets


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suites.bench.log_burst",
                                     description="How fast a wrapper learns subscriptions from its broker's log "
                                                 "(docs/daemon.md, \"Learning subscriptions in bulk\").")
    parser.add_argument("--kind", choices=("exact", "wildcard", "churn"), default="exact")
    parser.add_argument("--count", type=int, default=100_000, help="filters of a burst (default 100,000)")
    parser.add_argument("--rate", type=int, default=1000, help="churn: subscriptions a second (default 1,000)")
    parser.add_argument("--seconds", type=float, default=60.0, help="churn: how long (default 60)")
    parser.add_argument("--nodes", type=int, default=3, help="brokers in the line (default 3; at least 2)")
    parser.add_argument("--first-address", default="127.0.210.10",
                        help="loopback address of the first node (default 127.0.210.10)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the nodes' files go (default: a temporary directory, removed after)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for the wrapper to learn everything (default 120)")
    arguments = parser.parse_args(argv)
    if arguments.nodes < 2:
        parser.error("--nodes: at least 2 (the hello round trip is measured from the neighbour)")
    workdir = arguments.workdir or Path(tempfile.mkdtemp(prefix="log-burst-"))
    shutil.rmtree(workdir, ignore_errors=True)
    names = node_names(arguments.nodes)
    federation = LocalFederation(names, line(names), workdir, None, first_address=arguments.first_address)
    try:
        return _run(federation, names, arguments)
    finally:
        federation.stop()
        if arguments.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(federation: LocalFederation, names: list[str], arguments: argparse.Namespace) -> int:
    federation.start()
    federation.wait_converged(30)
    tested, neighbour = federation.node(names[-1]), federation.node(names[-2])
    subscriber = Subscriber(tested.host)
    watch = NeighbourWatch(neighbour, tested)
    expected_removed = 0
    started = last_ack = time.time()
    timeline = Timeline()
    try:
        time.sleep(1.0)  # a few round trips before the burst, to start the series from the idle value
        started = time.time()
        if arguments.kind == "churn":
            expected, packets = churn(subscriber, arguments.rate, arguments.seconds)
            expected_removed = expected
            what = f"{expected:,} filters subscribed and unsubscribed a second later, {arguments.rate:,} a second"
        else:
            expected = arguments.count
            packets = burst(subscriber, arguments.kind, expected)
            what = f"{expected:,} {arguments.kind} filters ({filter_of(arguments.kind, 0).replace('0', '<i>')})"
        acknowledged = subscriber.wait_acknowledged(packets, arguments.timeout)
        last_ack = time.time()
        print(f"{what} on {tested.name} ({tested.host}): {'all' if acknowledged else 'NOT all'} acknowledged "
              f"{last_ack - started:.2f} s after the first packet", flush=True)
        deadline = time.monotonic() + arguments.timeout
        timeline = Timeline.read(Path(tested.event_log), CLIENT_ID)
        while (len(timeline.added) < expected or len(timeline.removed) < expected_removed) \
                and time.monotonic() < deadline:
            time.sleep(1.0)
            timeline = Timeline.read(Path(tested.event_log), CLIENT_ID)
    finally:
        watch.stop()
    try:
        return _report(tested, neighbour, watch, timeline, started, last_ack, expected, expected_removed)
    finally:
        subscriber.close()  # after the report: its subscriptions end with its (clean) session


def _report(tested: FederationNode, neighbour: FederationNode, watch: NeighbourWatch, timeline: Timeline,
            started: float, last_ack: float, expected: int, expected_removed: int) -> int:
    last = max(timeline.added, default=started)
    print(f"learnt by its wrapper: {len(timeline.added):,} of {expected:,} subscriptions"
          + (f", {len(timeline.removed):,} of {expected_removed:,} unsubscriptions" if expected_removed else "")
          + f"; the last {last - started:.2f} s after the first packet, {last - last_ack:+.2f} s after the last "
            f"acknowledgement")
    print(f"learnt per second: {timeline.per_second(started)}")
    stalls = timeline.stalls(started)
    print("stalls (0.5 s or more with nothing learnt): " + (", ".join(f"{length:.1f} s at +{at:.1f} s"
                                                                       for at, length in stalls) or "none"))
    weight = Settings().rtt_smoothing
    samples = rtt_samples(watch.smoothed, weight)
    print(f"hello round trip {neighbour.name} -> {tested.name} while it learnt: largest sample "
          f"{max(samples, default=0.0):.0f} ms, median {sorted(samples)[len(samples) // 2] if samples else 0.0:.0f} ms "
          f"({len(samples)} samples, reconstructed from the smoothed rtt_ms); polls seeing it down: {watch.downs}, "
          f"status polls unanswered: {watch.errors}")
    broker = query(tested.host, tested.wrapper_port, timeout=30)["daemon"]["broker"]
    settled = time.monotonic() + 5.0  # the broker publishes its count once a second (sys_interval), when it changed
    while broker["subscription_count"]["broker"] != broker["subscription_count"]["known"] + \
            broker["subscription_count"]["own"] and time.monotonic() < settled:
        time.sleep(0.5)
        broker = query(tested.host, tested.wrapper_port, timeout=30)["daemon"]["broker"]
    log = Path(tested.broker_log).read_text(errors="replace")
    protocol_errors = sum(1 for text in log.splitlines()
                          if broker["client_id"] in text and "protocol error" in text)
    count = broker["subscription_count"]
    print(f"its broker connection: reconnections {broker['reconnects']}, protocol errors {protocol_errors}; the "
          f"broker's count {count['broker']}, the wrapper's {count['known']} (+{count['own']} its own), "
          f"over-delivery {'ON' if count['over_delivery'] else 'off'}")
    complete = len(timeline.added) >= expected and len(timeline.removed) >= expected_removed
    return 0 if complete and not broker["reconnects"] and not protocol_errors else 1


if __name__ == "__main__":
    sys.exit(main())
