"""`python -m suites.bench.subscriptions`: a site with many device subscriptions, against a bridge chain.

Theory of operation
-------------------
IoT sites give every device topics of its own (`dev/<id>/cmd`), so one
broker holds tens of thousands of subscriptions. For each setup (a line of
brokers joined by Mosquitto bridges, or by the wrappers with their default
settings: `setups.py`) the bench:

1. measures the wrappers' (or, for bridges, the brokers') CPU and memory
   with nothing subscribed;
2. subscribes N distinct filters from one client on the last broker, in
   SUBSCRIBE packets of 100 (`exact`: `bench/dev/<i>/cmd`; `wildcard`:
   `bench/wdev/<i>/#`), and notes the last SUBACK;
3. probes until a round of QoS 0 publications from the first broker, to the
   filters subscribed last and to random ones, all arrive: the convergence
   time is from the last SUBACK to that round;
4. sweeps: one QoS 1 publication to each filter's topic from the first
   broker, counted at the subscriber;
5. measures an idle window: control bytes per link per second (the wrappers'
   packets, all types, sent by both ends; for bridges, the bridge
   connections' TCP bytes both ways from `ss`), each wrapper's CPU in percent
   of a core and RSS; the memory per filter is taken once converged, before
   the sweep, against step 1;
6. reads the wrappers' brief status: hello round trips, neighbours ever
   declared down, and what each federates for the subscriptions.

Every figure is printed with the command that reproduces it, and written as
JSON (`--out`).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from federation.daemon.status import StatusError, query
from federation.tools.launch import BROKER_PORT, WRAPPER_PORT, LaunchError
from suites.bench.setups import Setup, SetupSpec, cpu_seconds

SUBSCRIBE_BATCH = 100
"""filters per SUBSCRIBE packet"""
SUBSCRIBES_IN_FLIGHT = 20
"""SUBSCRIBE packets awaiting their SUBACK at once"""
PROBES = 200
"""publications per convergence round: half to the filters subscribed last, half to random ones"""
PROBE_WAIT = 1.5
"""seconds a convergence round waits for its probes"""
PROBE_GAP = 0.2
"""seconds between convergence rounds"""
CONVERGE_LIMIT = 120.0
"""seconds after the last SUBACK a setup gets to deliver a whole round"""
SWEEP_STALL = 30.0
"""seconds without a new delivery after which the sweep stops counting"""


def filter_of(kind: str, index: int) -> str:
    return f"bench/dev/{index}/cmd" if kind == "exact" else f"bench/wdev/{index}/#"


def topic_of(kind: str, index: int) -> str:
    return f"bench/dev/{index}/cmd" if kind == "exact" else f"bench/wdev/{index}/x"


def index_of(topic: str) -> int | None:
    """The device index of a bench topic (None for another topic)."""
    parts = topic.split("/")
    return int(parts[2]) if len(parts) >= 3 and parts[2].isdigit() else None


@dataclass
class Result:
    setup: str
    kind: str
    filters: int
    subscribe_seconds: float | None = None
    converged_seconds: float | None = None
    swept: int = 0
    sweep_seconds: float | None = None
    idle_seconds: float = 0.0
    control_bytes_per_link_per_second: float | None = None
    cpu_percent: dict[str, float] = field(default_factory=dict)
    """per wrapper (per broker for bridges): CPU in percent of one core over the idle window"""
    rss_mb: dict[str, float] = field(default_factory=dict)
    """per wrapper (broker): RSS at the end of the idle window, after the sweep"""
    rss_bytes_per_filter: dict[str, float] = field(default_factory=dict)
    """per wrapper (broker): (RSS once converged - RSS before subscribing) / filters"""
    broker_rss_mb: dict[str, float] = field(default_factory=dict)
    hello_rtt_ms_max: float | None = None
    neighbours_down: int | None = None
    """times a wrapper declared a neighbour down during the case (it must stay 0)"""
    federated: dict[str, Any] = field(default_factory=dict)
    """what the last wrapper federates for the subscriptions (its status `federated`)"""
    problems: list[str] = field(default_factory=list)


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Counting:
    """A paho client that counts the distinct device indexes it receives, by payload kind (`p<round>`, `s`)."""

    def __init__(self, client_id: str, host: str) -> None:
        self.lock = threading.Lock()
        self.rounds: dict[str, set[int]] = {}
        self.last_at = time.monotonic()
        self.subacks = 0
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311)
        self.client.max_inflight_messages_set(1000)
        self.client.max_queued_messages_set(0)
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.connect(host, BROKER_PORT, keepalive=60)
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, message: mqtt.MQTTMessage) -> None:
        index = index_of(message.topic)
        if index is None:
            return
        with self.lock:
            self.rounds.setdefault(message.payload.decode(errors="replace"), set()).add(index)
            self.last_at = time.monotonic()

    def _on_subscribe(self, *args: Any) -> None:
        with self.lock:
            self.subacks += 1

    def got(self, label: str) -> set[int]:
        with self.lock:
            return set(self.rounds.get(label, ()))

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def subscribe_all(subscriber: Counting, kind: str, count: int) -> float:
    """Subscribe `count` filters in packets of SUBSCRIBE_BATCH; returns the wall time of the last SUBACK."""
    packets = 0
    for start in range(0, count, SUBSCRIBE_BATCH):
        while packets - subscriber.subacks >= SUBSCRIBES_IN_FLIGHT:
            time.sleep(0.001)
        batch = range(start, min(count, start + SUBSCRIBE_BATCH))
        subscriber.client.subscribe([(filter_of(kind, index), 1) for index in batch])
        packets += 1
    deadline = time.monotonic() + 120
    while subscriber.subacks < packets:
        if time.monotonic() > deadline:
            raise LaunchError(f"only {subscriber.subacks} of {packets} SUBACKs in 120 s")
        time.sleep(0.001)
    return time.monotonic()


def publisher_client(host: str) -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-sweep-{time.monotonic_ns()}",
                         protocol=mqtt.MQTTv311)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.connect(host, BROKER_PORT, keepalive=60)
    client.loop_start()
    return client


def converge(publisher: mqtt.Client, subscriber: Counting, kind: str, count: int, last_suback: float,
             rng: random.Random) -> float | None:
    """Seconds from the last SUBACK to the first probe round that arrived whole (None: none within the limit).
    A round leaves every PROBE_GAP seconds and is judged PROBE_WAIT after it left, so the answer is within a gap."""
    recent = list(range(max(0, count - PROBES // 2), count))
    rounds: list[tuple[str, float, set[int]]] = []
    number = 0
    while time.monotonic() - last_suback < CONVERGE_LIMIT:
        number += 1
        label = f"p{number}"
        sample = set(recent) | {rng.randrange(count) for _ in range(PROBES - len(recent))}
        sent_at = time.monotonic()
        for index in sorted(sample):
            publisher.publish(topic_of(kind, index), label.encode(), qos=0)
        rounds.append((label, sent_at, sample))
        time.sleep(PROBE_GAP)
        while rounds and (time.monotonic() - rounds[0][1] >= PROBE_WAIT
                          or subscriber.got(rounds[0][0]) >= rounds[0][2]):
            label, sent_at, sample = rounds.pop(0)
            if subscriber.got(label) >= sample:
                return round(max(0.0, sent_at - last_suback), 3)
    return None


def sweep(publisher: mqtt.Client, subscriber: Counting, kind: str, count: int) -> tuple[int, float]:
    """One QoS 1 publication to each filter; (distinct deliveries, seconds until the last one or the stall)."""
    started = time.monotonic()
    for index in range(count):
        info = publisher.publish(topic_of(kind, index), b"s", qos=1)
        while info.rc == mqtt.MQTT_ERR_QUEUE_SIZE:  # paho's window is full: let it drain
            time.sleep(0.001)
            info = publisher.publish(topic_of(kind, index), b"s", qos=1)
    while len(subscriber.got("s")) < count and time.monotonic() - subscriber.last_at < SWEEP_STALL:
        time.sleep(0.1)
    got = len(subscriber.got("s"))
    return got, round((subscriber.last_at if got else time.monotonic()) - started, 3)


def bridge_bytes(hosts: Sequence[str]) -> int:
    """TCP bytes (sent and received) of the connections between the brokers (the bridges), from `ss`."""
    try:
        output = subprocess.run(["ss", "-tinH", "state", "established"], capture_output=True, text=True,
                                timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    total = 0
    lines = output.splitlines()
    for line, info in zip(lines[0::2], lines[1::2], strict=False):
        fields = line.split()
        if len(fields) < 4:
            continue
        local, peer = fields[2].rsplit(":", 1)[0], fields[3].rsplit(":", 1)
        if local in hosts and peer[0] in hosts and peer[1] == str(BROKER_PORT):
            for name in ("bytes_sent", "bytes_received"):
                found = re.search(rf"{name}:(\d+)", info)
                total += int(found.group(1)) if found else 0
    return total


def wrapper_bytes(documents: dict[str, dict[str, Any]]) -> int:
    return sum(sum(size for _, size in document.get("sent", {}).values()) for document in documents.values())


def wrapper_statuses(nodes: list[Any], problems: list[str]) -> dict[str, dict[str, Any]]:
    """Each wrapper's brief status document by node name; one that does not answer is a problem of the run."""
    found = {}
    for node in nodes:
        try:
            found[node.name] = query(node.host, WRAPPER_PORT, timeout=10, brief=True)
        except StatusError as error:
            problems.append(f"{node.name}: {error}")
    return found


def neighbour_flaps(documents: dict[str, dict[str, Any]]) -> int:
    """The neighbour flaps the wrappers counted, all together."""
    return sum(n.get("flaps", 0) for d in documents.values() for n in d.get("neighbours", []))


def run_case(setup: Setup, kind: str, count: int, idle: float, seed: int) -> Result:
    spec = setup.spec
    nodes = list(setup.brokers.nodes.values())
    federation = spec.kind == "federation"
    result = Result(spec.name, kind, count)
    processes = {node.name: pid for node, pid in zip(nodes, setup.wrapper_pids() if federation
                                                      else setup.broker_pids(), strict=True)}
    brokers = {node.name: pid for node, pid in zip(nodes, setup.broker_pids(), strict=True)}

    time.sleep(2.0)
    before = {name: rss_bytes(pid) for name, pid in processes.items()}
    flaps_before = neighbour_flaps(wrapper_statuses(nodes, result.problems)) if federation else 0
    rng = random.Random(seed)
    subscriber = Counting(f"bench-subscriber-{time.monotonic_ns()}", nodes[-1].host)
    publisher = publisher_client(nodes[0].host)
    try:
        started = time.monotonic()
        last_suback = subscribe_all(subscriber, kind, count)
        result.subscribe_seconds = round(last_suback - started, 3)
        print(f"  {spec.name} {kind}: {count} filters subscribed in {result.subscribe_seconds} s", flush=True)
        result.converged_seconds = converge(publisher, subscriber, kind, count, last_suback, rng)
        print(f"  {spec.name} {kind}: converged {result.converged_seconds} s after the last SUBACK", flush=True)
        subscribed = {name: rss_bytes(pid) for name, pid in processes.items()}
        result.rss_bytes_per_filter = {name: round((subscribed[name] - before[name]) / count, 1)
                                       for name in subscribed}
        result.swept, result.sweep_seconds = sweep(publisher, subscriber, kind, count)
        print(f"  {spec.name} {kind}: sweep {result.swept} of {count} in {result.sweep_seconds} s", flush=True)
        time.sleep(5.0)  # the sweep's acknowledgements and digests settle
        cpu_start = {name: cpu_seconds(pid) for name, pid in processes.items()}
        documents_start = wrapper_statuses(nodes, result.problems) if federation else {}
        bytes_start = wrapper_bytes(documents_start) if federation else bridge_bytes([n.host for n in nodes])
        window_start = time.monotonic()
        time.sleep(idle)
        documents_end = wrapper_statuses(nodes, result.problems) if federation else {}
        bytes_end = wrapper_bytes(documents_end) if federation else bridge_bytes([n.host for n in nodes])
        seconds = time.monotonic() - window_start
        result.idle_seconds = round(seconds, 1)
        links = max(1, len(nodes) - 1)
        result.control_bytes_per_link_per_second = round((bytes_end - bytes_start) / links / seconds, 1)
        result.cpu_percent = {name: round(100 * (cpu_seconds(pid) - cpu_start[name]) / seconds, 2)
                              for name, pid in processes.items()}
        result.rss_mb = {name: round(rss_bytes(pid) / 2**20, 1) for name, pid in processes.items()}
        result.broker_rss_mb = {name: round(rss_bytes(pid) / 2**20, 1) for name, pid in brokers.items()}
        if federation:
            rtts = [n["rtt_ms"] for d in documents_end.values() for n in d.get("neighbours", [])
                    if n.get("rtt_ms") is not None]
            result.hello_rtt_ms_max = max(rtts) if rtts else None
            result.neighbours_down = neighbour_flaps(documents_end) - flaps_before
            last = documents_end.get(nodes[-1].name, {})
            result.federated = {key: last.get("federated", {}).get(key) for key in ("raw", "federated", "effective",
                                                                                     "collapsed")}
    finally:
        subscriber.close()
        publisher.loop_stop()
        publisher.disconnect()
    return result


@dataclass
class ChurnResult:
    setup: str
    seconds: float
    rate: int
    subscribed: int = 0
    unsubscribed: int = 0
    probes: int = 0
    """QoS 1 publications to a filter subscribed 1 to 3 s before (held 5 s)"""
    missed: int = 0
    cpu_percent: dict[str, float] = field(default_factory=dict)
    hello_rtt_ms_max: float | None = None
    neighbours_down: int | None = None
    unmatched_hold: dict[str, Any] = field(default_factory=dict)
    """the subscriber's wrapper at the end: its status `daemon.broker.unmatched_hold` (publications that matched no
    subscription it had read yet, held until its log was read up to a fence; docs/daemon.md)"""
    problems: list[str] = field(default_factory=list)


CHURN_TICK = 0.01
"""seconds between churn steps"""
CHURN_LIFETIME = 5.0
"""seconds each churned filter stays subscribed"""
PROBE_AGES = (1.0, 3.0)
"""a probe goes to a filter subscribed this long before (it stays 2 s more: time to arrive)"""


def run_churn(setup: Setup, seconds: float, rate: int, seed: int) -> ChurnResult:
    """Subscribe `rate` new filters a second and unsubscribe as many (each held CHURN_LIFETIME) on the last broker,
    while the first broker publishes to filters subscribed for PROBE_AGES: how many of those never arrive."""
    nodes = list(setup.brokers.nodes.values())
    federation = setup.spec.kind == "federation"
    result = ChurnResult(setup.spec.name, seconds, rate)
    processes = {node.name: pid for node, pid in zip(nodes, setup.wrapper_pids() if federation
                                                      else setup.broker_pids(), strict=True)}
    rng = random.Random(seed)

    time.sleep(2.0)
    flaps_before = neighbour_flaps(wrapper_statuses(nodes, result.problems)) if federation else 0
    subscriber = Counting(f"bench-churn-{time.monotonic_ns()}", nodes[-1].host)
    publisher = publisher_client(nodes[0].host)
    alive: list[tuple[float, int]] = []  # (subscribed at, index), oldest first
    expected: list[str] = []
    rtts: list[float] = []
    try:
        cpu_start = {name: cpu_seconds(pid) for name, pid in processes.items()}
        started = time.monotonic()
        next_poll = started + 1.0
        made = 0
        per_tick = rate * CHURN_TICK
        owed = 0.0
        while time.monotonic() - started < seconds:
            now = time.monotonic()
            owed += per_tick
            batch = list(range(made, made + int(owed)))
            owed -= len(batch)
            if batch:
                subscriber.client.subscribe([(f"bench/churn/{index}/cmd", 1) for index in batch])
                alive += [(now, index) for index in batch]
                made += len(batch)
            gone = []
            while alive and now - alive[0][0] >= CHURN_LIFETIME:
                gone.append(alive.pop(0)[1])
            if gone:
                subscriber.client.unsubscribe([f"bench/churn/{index}/cmd" for index in gone])
                result.unsubscribed += len(gone)
            ready = [index for at, index in alive if PROBE_AGES[0] <= now - at <= PROBE_AGES[1]]
            if ready:
                label = f"c{len(expected)}"
                publisher.publish(f"bench/churn/{rng.choice(ready)}/cmd", label.encode(), qos=1)
                expected.append(label)
            if federation and now >= next_poll:
                next_poll = now + 1.0
                polled = wrapper_statuses(nodes, result.problems)
                rtts += [n["rtt_ms"] for d in polled.values() for n in d.get("neighbours", [])
                         if n.get("rtt_ms") is not None]
            time.sleep(max(0.0, CHURN_TICK - (time.monotonic() - now)))
        elapsed = time.monotonic() - started
        result.cpu_percent = {name: round(100 * (cpu_seconds(pid) - cpu_start[name]) / elapsed, 1)
                              for name, pid in processes.items()}
        result.subscribed = made
        time.sleep(PROBE_AGES[1] + 2.0)  # the last probes arrive
        result.probes = len(expected)
        result.missed = sum(1 for label in expected if not subscriber.got(label))
        if federation:
            result.hello_rtt_ms_max = max(rtts) if rtts else None
            found = wrapper_statuses(nodes, result.problems)
            result.neighbours_down = neighbour_flaps(found) - flaps_before
            result.unmatched_hold = dict(found.get(nodes[-1].name, {}).get("daemon", {}).get("broker", {})
                                         .get("unmatched_hold", {}))
    finally:
        subscriber.close()
        publisher.loop_stop()
        publisher.disconnect()
    return result


def table(results: Sequence[Result]) -> str:
    headers = ["setup", "filters", "kind", "subscribe s", "converged s", "swept", "idle B/s/link", "CPU % (max)",
               "RSS/filter B (last)", "hello RTT ms", "down"]
    rows = []
    for r in results:
        last = list(r.rss_bytes_per_filter.values())[-1] if r.rss_bytes_per_filter else None
        rows.append([r.setup, r.filters, r.kind, r.subscribe_seconds, r.converged_seconds, f"{r.swept}/{r.filters}",
                     r.control_bytes_per_link_per_second, max(r.cpu_percent.values(), default=None), last,
                     r.hello_rtt_ms_max, r.neighbours_down])
    widths = [max(len(str(h)), *(len(str(row[i])) for row in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suites.bench.subscriptions",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--filters", type=int, nargs="+", default=[100000], help="numbers of filters (default 100000)")
    parser.add_argument("--kind", choices=("exact", "wildcard"), nargs="+", default=["exact", "wildcard"])
    parser.add_argument("--setups", nargs="+", default=["bridge-3", "federation-3"])
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of the idle window (default 30)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--settings", type=json.loads, default=None, metavar="JSON",
                        help="the wrappers' protocol settings (default: the shipped ones), e.g. "
                             "'{\"aggregate_fanout\": 0, \"max_topics\": 200000}': every filter federated as it "
                             "is, the control plane's own cost")
    parser.add_argument("--subnet", type=int, default=230, help="first loopback /24 used (127.0.<subnet>.x)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--churn", type=float, default=0.0, metavar="SECONDS",
                        help="instead: churn of --rate subscribes and unsubscribes a second for SECONDS, probed")
    parser.add_argument("--rate", type=int, default=1000, help="churn: subscribes (and unsubscribes) a second")
    args = parser.parse_args(argv)
    if args.churn > 0:
        return churn_main(args)
    specs = [SetupSpec.parse(name) for name in args.setups]
    results: list[Result] = []
    workdir = Path(tempfile.mkdtemp(prefix="federation-bench-subscriptions-"))
    print(f"bench subscriptions: {' '.join(sys.argv[1:]) or 'defaults'}; work files in {workdir}", flush=True)
    for count in args.filters:
        for kind in args.kind:
            for offset, spec in enumerate(specs):
                setup = Setup(spec, workdir / f"{kind}-{count}", args.subnet + offset, settings=settings(args))
                setup.start()
                try:
                    results.append(run_case(setup, kind, count, args.idle, args.seed))
                finally:
                    setup.stop()
                if args.out is not None:
                    args.out.write_text(json.dumps([asdict(r) for r in results], indent=2))
    print(table(results))
    for r in results:
        print(f"{r.setup} {r.kind} {r.filters}: CPU % {r.cpu_percent}, RSS MB {r.rss_mb}, RSS/filter B "
              f"{r.rss_bytes_per_filter}, brokers' RSS MB {r.broker_rss_mb}, federated {r.federated}"
              + (f", problems {r.problems}" if r.problems else ""))
    return 0


def settings(args: argparse.Namespace) -> dict[str, Any] | None:
    """The wrappers' protocol settings the arguments ask for (None: the defaults)."""
    return dict(args.settings) if args.settings else None


def churn_main(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="federation-bench-churn-"))
    print(f"bench subscriptions churn: {args.rate}/s for {args.churn} s; work files in {workdir}", flush=True)
    results = []
    for offset, name in enumerate(args.setups):
        setup = Setup(SetupSpec.parse(name), workdir / name, args.subnet + offset, settings=settings(args))
        setup.start()
        try:
            results.append(run_churn(setup, args.churn, args.rate, args.seed))
        finally:
            setup.stop()
        print(f"  {results[-1]}", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps([asdict(r) for r in results], indent=2))
    for r in results:
        print(f"{r.setup}: {r.subscribed} subscribed, {r.unsubscribed} unsubscribed in {r.seconds} s; probes "
              f"{r.probes}, missed {r.missed}; CPU % {r.cpu_percent}; hello RTT max {r.hello_rtt_ms_max} ms; "
              f"neighbours down {r.neighbours_down}" + (f"; unmatched hold {r.unmatched_hold}" if r.unmatched_hold
                                                        else "") + (f"; problems {r.problems}" if r.problems else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
