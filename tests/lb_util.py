"""Clients behind a TCP load balancer (HAProxy) in front of brokers, counted at the clients (issue 39, item 5).

    with LoadBalancer(workdir, "127.0.44.50", [("127.0.44.10", 1883), ...]) as balancer:
        run = LoadBalancedRun(balancer.address, workdir, seconds=40, reconnect=3.0, streams=STREAMS)
        outcome = run.run()        # publishers and subscribers, every one reconnecting every few seconds

HAProxy (the Debian package) runs in TCP mode with round-robin balancing, so each new connection goes to the
next broker: a client that reconnects lands on another broker each time, as a device behind a site's load
balancer does. The same clients run against one broker behind the same HAProxy (the reference) and against three
brokers of a federation.

The clients, each reconnecting every `reconnect` seconds (±25 %, so they do not move in step):

- a paho MQTT v5 publisher per stream (QoS 1 or 2): numbered publications on `lb/<stream>/s`, each waited for
  (PUBACK, PUBCOMP) before the next, 20 a second; it reconnects with a clean DISCONNECT between two;
- per stream, its subscribers (`Stream`: paho, MQTT.js or both; tests/loadbalancer/mqttjs_subscriber.js), each a
  persistent session (clean start on the first connection only, a session expiry of 300 s): paho's subscribes again
  in `on_connect` when the session is not present, MQTT.js by itself; their TCP connection is dropped (no
  DISCONNECT) to reconnect.

`STREAMS`, the tests' layout: a QoS 1 topic with a paho and an MQTT.js subscriber, and a QoS 2 topic for each
alone. Two subscribers of one topic see what a session's handover does to the other clients of its new broker: a
handed-over message reaches every subscriber of its topic there, so one that had it live gets it again
(docs/transparency.md: unmodified Mosquitto cannot give a message to one subscriber alone), which MQTT allows at
QoS 1 and not at QoS 2. `SHARED_QOS2` puts both on one QoS 2 topic, to measure that.

What is counted (`Outcome`): per subscriber, the publications acknowledged to the publisher that it never received
(`lost`), received more than once (`duplicated`: MQTT allows it at QoS 1, not at QoS 2), and the connections of
each client id that overlapped on two brokers for 2 s or more (`twice`, from the brokers' logs, whole seconds).
Nothing here sleeps blindly but the clients' own pacing: the end waits, with a deadline, for what is on its way.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from broker_util import wait_for

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
NODE = shutil.which("node") or "/usr/bin/node"
REPO = Path(__file__).resolve().parents[1]
MQTTJS_SUBSCRIBER = REPO / "tests" / "loadbalancer" / "mqttjs_subscriber.js"
NODE_MODULES = Path(os.environ.get("MQTTJS_NODE_MODULES", REPO / "build" / "node" / "node_modules"))
"""where scripts/install-deps.sh installs MQTT.js (`npm install --prefix build/node mqtt`)"""
HAVE_HAPROXY = os.access(HAPROXY, os.X_OK)
HAVE_MQTTJS = os.access(NODE, os.X_OK) and (NODE_MODULES / "mqtt").is_dir()
PORT = 1883
RATE = 20.0
"""publications a second per stream"""
SESSION_EXPIRY = 300
PROBE = b"probe"
"""the payload of the probes that make the subscriptions ready (left out of the counts)"""


@dataclass(frozen=True)
class Stream:
    """One publisher's stream on `lb/<number>/s` at `qos`, and its subscribers' kinds ("paho", "mqttjs")."""

    qos: int
    kinds: tuple[str, ...]


STREAMS = (Stream(1, ("paho", "mqttjs")), Stream(2, ("paho",)), Stream(2, ("mqttjs",)))
"""the tests' streams (module docstring)"""
SHARED_QOS2 = (Stream(2, ("paho", "mqttjs")),)
"""two subscribers of one QoS 2 topic (module docstring)"""


class LoadBalancer:
    """HAProxy in TCP mode on `host`:PORT, round robin over `backends` (host, port); stopped on exit."""

    def __init__(self, workdir: Path, host: str, backends: Sequence[tuple[str, int]]) -> None:
        self.workdir = workdir
        self.address = (host, PORT)
        self.config = workdir / "haproxy.cfg"
        workdir.mkdir(parents=True, exist_ok=True)
        servers = "\n".join(f"    server b{index} {backend_host}:{backend_port}"
                            for index, (backend_host, backend_port) in enumerate(backends))
        self.config.write_text(f"""global
    maxconn 2000
defaults
    mode tcp
    timeout connect 2s
    timeout client 1h
    timeout server 1h
frontend mqtt
    bind {host}:{PORT}
    default_backend brokers
backend brokers
    balance roundrobin
{servers}
""")
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LoadBalancer:
        log = open(self.workdir / "haproxy.log", "wb")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen([HAPROXY, "-db", "-f", str(self.config)], stdout=log, stderr=log)
        log.close()

        def listening() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"haproxy exited: {(self.workdir / 'haproxy.log').read_text()[-500:]}")
            with socket.socket() as probe:
                probe.settimeout(0.2)
                return probe.connect_ex(self.address) == 0

        wait_for(listening, 10, interval=0.05, message="haproxy to listen")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def jitter(seconds: float, rng: random.Random) -> float:
    return seconds * rng.uniform(0.75, 1.25)


class Publisher(threading.Thread):
    """Numbered publications on `lb/<stream>/s` at `qos`, each waited for; reconnects every few seconds."""

    def __init__(self, address: tuple[str, int], stream: int, qos: int, reconnect: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.address, self.stream, self.qos, self.reconnect = address, stream, qos, reconnect
        self.rng = random.Random(seed)
        self.acknowledged: list[int] = []
        self.acknowledged_at: dict[int, float] = {}
        self.reconnections = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def _connect(self) -> mqtt.Client:
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"lb-publisher-{self.stream}",
                             protocol=mqtt.MQTTv5)
        client.connect(*self.address)
        client.loop_start()
        wait_for(client.is_connected, 10, interval=0.01, message=f"publisher {self.stream} to connect")
        return client

    def run(self) -> None:
        try:
            client = self._connect()
            number = 0
            moved_at = time.monotonic() + jitter(self.reconnect, self.rng)
            while not self.stop.is_set():
                number += 1
                info = client.publish(f"lb/{self.stream}/s", str(number).encode(), qos=self.qos)
                info.wait_for_publish(30)
                self.acknowledged.append(number)
                self.acknowledged_at[number] = time.time()
                time.sleep(1.0 / RATE)
                if time.monotonic() >= moved_at:
                    client.disconnect()
                    client.loop_stop()
                    client = self._connect()
                    self.reconnections += 1
                    moved_at = time.monotonic() + jitter(self.reconnect, self.rng)
            client.disconnect()
            client.loop_stop()
        except BaseException as error:  # noqa: BLE001 - reported by the run
            self.error = error


class PahoSubscriber:
    """A persistent session (clean start on the first connection only, an expiry), subscribing again in
    `on_connect` when the session is not present; its TCP connection dropped every few seconds."""

    def __init__(self, address: tuple[str, int], client_id: str, stream: int, qos: int, reconnect: float,
                 seed: int) -> None:
        self.name = client_id
        self.stream, self.qos = stream, qos
        self.received: list[Received] = []
        """in arrival order"""
        self.connections: list[bool] = []
        """session present of each CONNACK"""
        self.connected_at: list[float] = []
        self.lock = threading.Lock()
        self.probes = 0
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.client.reconnect_delay_set(0.1, 0.5)  # type: ignore[arg-type]  # paho sleeps on floats
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = SESSION_EXPIRY
        self.client.connect(*address, properties=properties)  # clean start: paho's FIRST_ONLY
        self.client.loop_start()
        self.rng = random.Random(seed)
        self.reconnect = reconnect
        self.stop = threading.Event()
        self.dropper = threading.Thread(target=self._drop, daemon=True)
        self.dropper.start()

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        with self.lock:
            self.connections.append(bool(flags.session_present))
            self.connected_at.append(time.time())
        if not flags.session_present:
            client.subscribe(f"lb/{self.stream}/s", self.qos)

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            if message.payload == PROBE:
                self.probes += 1
            else:
                self.received.append(Received(int(message.payload), message.qos, len(self.connections) - 1,
                                              time.time()))

    def probed(self) -> bool:
        with self.lock:
            return self.probes > 0

    def _drop(self) -> None:
        while not self.stop.wait(jitter(self.reconnect, self.rng)):
            sock = self.client.socket()
            if isinstance(sock, socket.socket):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def numbers(self) -> list[int]:
        with self.lock:
            return [received.number for received in self.received]

    def history(self) -> tuple[list[Received], list[tuple[bool, float]]]:
        with self.lock:
            return list(self.received), list(zip(self.connections, self.connected_at, strict=True))

    def close(self) -> None:
        self.stop.set()
        self.dropper.join(5)
        self.client.disconnect()
        self.client.loop_stop()


class MqttjsSubscriber:
    """tests/loadbalancer/mqttjs_subscriber.js as a process; its lines read as they come."""

    def __init__(self, address: tuple[str, int], client_id: str, stream: int, qos: int, reconnect: float,
                 workdir: Path) -> None:
        self.name = client_id
        self.stream, self.qos = stream, qos
        self.output = workdir / f"{client_id}.out"
        environment = {**os.environ, "NODE_PATH": str(NODE_MODULES)}
        with open(self.output, "wb") as sink:
            self.process = subprocess.Popen(
                [NODE, str(MQTTJS_SUBSCRIBER), f"mqtt://{address[0]}:{address[1]}", client_id, f"lb/{stream}/s",
                 str(qos), str(reconnect)], stdout=sink, stderr=subprocess.STDOUT, env=environment)

    def _lines(self) -> list[str]:
        return self.output.read_text(errors="replace").splitlines()

    def history(self) -> tuple[list[Received], list[tuple[bool, float]]]:
        """What arrived, and each connection's session present and time, from the script's lines in order."""
        received: list[Received] = []
        connections: list[tuple[bool, float]] = []
        for line in self._lines():
            parts = line.split(" ", 5)
            if parts[0] == "connect" and len(parts) == 3:
                connections.append((parts[1] == "1", int(parts[2]) / 1000))
            elif parts[0] == "msg" and len(parts) == 6 and parts[5].isdigit():
                received.append(Received(int(parts[5]), int(parts[1]), len(connections) - 1, int(parts[3]) / 1000))
        return received, connections

    @property
    def connections(self) -> list[bool]:
        return [present for present, _at in self.history()[1]]

    def numbers(self) -> list[int]:
        return [received.number for received in self.history()[0]]

    def probed(self) -> bool:
        return any(line.startswith("msg ") and line.endswith(" probe") for line in self._lines())

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


@dataclass(frozen=True)
class Received:
    number: int
    qos: int
    connection: int
    """the index of the connection it came on (0: the first)"""
    at: float
    """time.time() at arrival"""


@dataclass
class SubscriberCount:
    name: str
    stream: int
    qos: int
    acknowledged: int
    received: int
    lost: list[int]
    duplicated: int
    out_of_order: int
    connections: int
    session_present: int
    details: list[str] = field(default_factory=list)
    """where the lost and doubled ones fell (connection index and seconds from the start), for a failure's text"""

    def text(self) -> str:
        return (f"{self.name} (QoS {self.qos}): {self.received} of {self.acknowledged}, lost {len(self.lost)}"
                f"{' ' + str(self.lost[:8]) if self.lost else ''}, duplicated {self.duplicated}, out of order "
                f"{self.out_of_order}; {self.connections} connections ({self.session_present} with the session)"
                + "".join(f"\n    {line}" for line in self.details))


def describe(received: list[Received], connections: list[tuple[bool, float]], acknowledged_at: dict[int, float],
             start: float, limit: int = 6) -> list[str]:
    """Where the lost and doubled publications of one subscriber fell: the connection (index, session present,
    seconds from `start`) each copy came on, or that was current when a lost one was acknowledged."""
    def connection_at(at: float) -> int:
        return max((index for index, (_present, since) in enumerate(connections) if since <= at), default=-1)

    def show(index: int) -> str:
        if index < 0:
            return "before the first connection"
        present, since = connections[index]
        return f"connection {index} (session present {int(present)}, at {since - start:.1f} s)"

    lines = []
    copies: dict[int, list[Received]] = defaultdict(list)
    for item in received:
        copies[item.number].append(item)
    doubled = [number for number, items in copies.items() if len(items) > 1]
    for number in doubled[:limit]:
        lines.append(f"{number} (acknowledged at {acknowledged_at.get(number, start) - start:.1f} s) came "
                     + ", ".join(f"at {item.at - start:.1f} s on {show(item.connection)}" for item in copies[number]))
    lost = sorted(set(acknowledged_at) - set(copies))
    runs: list[list[int]] = []
    for number in lost:
        if runs and runs[-1][-1] == number - 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    for run in runs[:limit]:
        at = acknowledged_at[run[0]]
        lines.append(f"lost {run[0]}..{run[-1]} (acknowledged from {at - start:.1f} s, during "
                     f"{show(connection_at(at))})")
    return lines


@dataclass
class Outcome:
    subscribers: list[SubscriberCount] = field(default_factory=list)
    publisher_reconnections: int = 0
    twice: list[str] = field(default_factory=list)
    """client ids connected on two brokers at once for 2 s or more (with the seconds)"""
    errors: list[str] = field(default_factory=list)
    started: float = 0.0
    """time.time() when the publishers started (the details' seconds count from it)"""

    def text(self) -> str:
        return "\n".join([*(count.text() for count in self.subscribers),
                          f"publishers reconnected {self.publisher_reconnections} times",
                          f"client ids connected twice: {self.twice or 'none'}", *self.errors])


class LoadBalancedRun:
    """The clients of the module docstring against `address` (the load balancer) for `seconds`."""

    def __init__(self, address: tuple[str, int], workdir: Path, seconds: float, reconnect: float = 3.0,
                 streams: Sequence[Stream] = STREAMS, mqttjs: bool = True, seed: int = 39) -> None:
        """`mqttjs` False: paho subscribers where the streams say MQTT.js (it is not installed)."""
        self.address, self.workdir, self.seconds, self.reconnect = address, workdir, seconds, reconnect
        self.streams, self.mqttjs, self.seed = streams, mqttjs, seed
        workdir.mkdir(parents=True, exist_ok=True)

    def run(self) -> Outcome:
        subscribers: list[PahoSubscriber | MqttjsSubscriber] = []
        publishers: list[Publisher] = []
        outcome = Outcome()
        try:
            for index, spec in enumerate(self.streams):
                stream = index + 1
                for kind in spec.kinds:
                    if kind == "mqttjs" and self.mqttjs:
                        subscribers.append(MqttjsSubscriber(self.address, f"lb-mqttjs-{stream}", stream, spec.qos,
                                                            self.reconnect, self.workdir))
                    elif f"lb-paho-{stream}" not in {subscriber.name for subscriber in subscribers}:
                        subscribers.append(PahoSubscriber(self.address, f"lb-paho-{stream}", stream, spec.qos,
                                                          self.reconnect, self.seed + stream))
            # Every subscription made before the streams begin (one broker: at once; the federation: its mesh).
            wait_for(lambda: all(subscriber.connections for subscriber in subscribers), 20, interval=0.1,
                     message="every subscriber connected")
            self._settle(subscribers)
            publishers = [Publisher(self.address, index + 1, spec.qos, self.reconnect, self.seed + 100 + index)
                          for index, spec in enumerate(self.streams)]
            started = outcome.started = time.time()
            for publisher in publishers:
                publisher.start()
            deadline = time.monotonic() + self.seconds
            while time.monotonic() < deadline and all(publisher.is_alive() for publisher in publishers):
                time.sleep(0.2)
            for publisher in publishers:
                publisher.stop.set()
            for publisher in publishers:
                publisher.join(60)
                if publisher.error is not None:
                    outcome.errors.append(f"publisher {publisher.stream}: {publisher.error!r}")
            # The end: what was acknowledged reaches every subscriber, or stops coming for 10 s.
            expected = {publisher.stream: set(publisher.acknowledged) for publisher in publishers}
            last = [-1, time.monotonic()]

            def done() -> bool:
                count = sum(len(subscriber.numbers()) for subscriber in subscribers)
                if count != last[0]:
                    last[:] = [count, time.monotonic()]
                complete = all(expected[subscriber.stream] <= set(subscriber.numbers()) for subscriber in subscribers)
                return complete or time.monotonic() - last[1] > 10.0

            wait_for(done, 120, interval=0.2, message="the subscribers to get what was acknowledged")
            time.sleep(1.0)  # a duplicate on its way comes now
            acknowledged_at = {publisher.stream: dict(publisher.acknowledged_at) for publisher in publishers}
            for subscriber in subscribers:
                received, history = subscriber.history()
                numbers = [item.number for item in received]
                acknowledged = expected[subscriber.stream]
                counts = Counter(numbers)
                firsts = list(dict.fromkeys(numbers))
                connections = subscriber.connections
                outcome.subscribers.append(SubscriberCount(
                    subscriber.name, subscriber.stream, subscriber.qos, len(acknowledged),
                    len(set(numbers) & acknowledged),
                    sorted(acknowledged - set(numbers)), sum(n - 1 for n in counts.values() if n > 1),
                    sum(1 for a, b in zip(firsts, firsts[1:], strict=False) if b < a),
                    len(connections), sum(connections),
                    describe(received, history, acknowledged_at[subscriber.stream], started)))
            outcome.publisher_reconnections = sum(publisher.reconnections for publisher in publishers)
            return outcome
        finally:
            for publisher in publishers:
                publisher.stop.set()
            for subscriber in subscribers:
                subscriber.close()

    def _settle(self, subscribers: Sequence[PahoSubscriber | MqttjsSubscriber]) -> None:
        """Probe each stream's topic until its subscribers have a probe (a publication with a payload that is no
        number, left out of the counts): the federation's meshes are formed, as on one broker at once."""
        prober = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="lb-prober", protocol=mqtt.MQTTv5)
        prober.connect(*self.address)
        prober.loop_start()
        try:
            def probed() -> bool:
                for stream in sorted({subscriber.stream for subscriber in subscribers}):
                    prober.publish(f"lb/{stream}/s", PROBE, qos=1)
                return all(subscriber.probed() for subscriber in subscribers)

            wait_for(probed, 30, interval=0.3, message="the probes at every subscriber")
        finally:
            prober.disconnect()
            prober.loop_stop()


_CONNECTED = re.compile(r"^(\d+): New client connected from \S+ as (lb-\S+) \(")
_TAKEOVER = re.compile(r"^\d+: (lb-\S+) \d \$federation/handover/")
"""a wrapper's takeover connection with the client's id (federation.daemon.kicker) subscribing to its fence"""
_GONE = re.compile(r"^(\d+): (?:Client (lb-\S+) (?:disconnected|closed its connection|has exceeded timeout"
                   r"|already connected)|Socket error on client (lb-\S+))")


def connected_twice(logs: dict[str, Path]) -> list[str]:
    """Client ids (lb-...) that had a connection on two brokers at once for 2 s or more, from the brokers' logs
    (whole seconds: a takeover within the second is not counted). A wrapper's takeover connection, which uses the
    client's id for a moment, is not the client's."""
    intervals: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for broker, path in logs.items():
        open_at: dict[str, int] = {}
        for line in path.read_text(errors="replace").splitlines():
            connected = _CONNECTED.match(line)
            if connected:
                open_at[connected.group(2)] = int(connected.group(1))
                continue
            takeover = _TAKEOVER.match(line)
            if takeover:
                open_at.pop(takeover.group(1), None)
                continue
            gone = _GONE.match(line)
            if gone:
                client = gone.group(2) or gone.group(3)
                if client in open_at:
                    intervals[client].append((broker, open_at.pop(client), int(gone.group(1))))
        end = max((int(m.group(1)) for m in (re.match(r"^(\d+):", line) for line in
                                              path.read_text(errors="replace").splitlines()) if m), default=0)
        for client, start in open_at.items():
            intervals[client].append((broker, start, end))
    found = []
    for client, spans in sorted(intervals.items()):
        for index, (broker, start, end) in enumerate(spans):
            for other, other_start, other_end in spans[index + 1:]:
                if other != broker and min(end, other_end) - max(start, other_start) >= 2:
                    found.append(f"{client} on {broker} {start}-{end} and {other} {other_start}-{other_end}")
    return found
