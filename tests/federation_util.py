"""Fixtures and helpers for tests that run a real federation: brokers and wrappers on loopback.

    from federation_util import clients_fixture, make_federation_fixture  # noqa: F401 - the fixtures

    def test_x(make_federation, clients):
        federation = make_federation(5, "ring")                 # started, converged
        sub = clients.subscribe(federation, "n2", "a/+/b")      # real mosquitto_sub, known to its wrapper
        federation.wait_mesh("a/+/b")
        clients.publish(federation, "n0", "a/x/b", b"hello")    # real mosquitto_pub
        sub.wait_for_count(1)

Every federation gets its own range of loopback addresses (127.0.<k>.10,
.11, ...; k counts up from 40, or from $FEDERATION_TEST_SUBNET), so federations
of different fixtures never collide with each other or with a running `make demo`
(127.0.0.10...); the workers of one session (pytest-xdist) take turns. Two test sessions at once need
different $FEDERATION_TEST_SUBNET.
Finalizers stop every process, also when a test fails. Nothing here sleeps
blindly: waits poll a condition until a deadline.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from federation.tools.launch import BROKER_PORT, LocalFederation, line, node_names, ring

from broker_util import Processes, mosquitto_pub, mosquitto_sub, wait_for

FAST_SETTINGS: dict[str, Any] = {
    "hello_interval": 0.2,
    "dead_intervals": 5,  # down after 1 s: short, but no flapping when 2 CPUs are busy
    "announce_interval": 1.0,
    "stats_interval": 0.5,  # a `counters` event twice a second lets wait_event_logs see the logs catch up
}
"""shorter timers for tests (the cold-start test uses the defaults)"""

SUBSCRIBER_FORMAT = "%q %r %l %x %t"
"""mosquitto_sub -F: qos, retain flag, payload length, payload in hex, topic (last: it may hold spaces)"""

def _subnet_numbers() -> Iterator[int]:
    """k for 127.0.<k>.0/24: counting up from $FEDERATION_TEST_SUBNET (40). Under pytest-xdist (`make test` runs
    two workers) worker i of n takes every n-th number from the i-th, so the workers never share a /24."""
    first = int(os.environ.get("FEDERATION_TEST_SUBNET", "40"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return itertools.count(first + worker, workers)


_subnets = _subnet_numbers()


def next_first_address() -> str:
    """127.0.<k>.10 with k unused so far in this test session."""
    k = next(_subnets)
    if k > 254:
        raise RuntimeError(f"the test session ran out of loopback /24s (127.0.{k}.0 does not exist): start it "
                           f"lower with FEDERATION_TEST_SUBNET (now {os.environ.get('FEDERATION_TEST_SUBNET', '40')})")
    return f"127.0.{k}.10"


def topology_links(kind: str, names: Sequence[str]) -> list[tuple[str, str]]:
    if kind == "line":
        return line(names)
    if kind == "ring":
        return ring(names)
    raise ValueError(f"unknown topology {kind!r}: line or ring")


def start_federation(workdir: Path, count: int, kind: str, settings: dict[str, Any] | None = FAST_SETTINGS,
                     wrappers: bool = True, topics: dict[str, list[str]] | None = None,
                     neighbours_in_file: bool = False) -> LocalFederation:
    """A started and converged federation (only its brokers with `wrappers=False`); the caller stops it.
    `topics`: topic policy lines by node name; `neighbours_in_file`: neighbours in the YAML files (LocalFederation)."""
    names = node_names(count)
    federation = LocalFederation(names, topology_links(kind, names), workdir, settings,
                                 first_address=next_first_address(), topics=topics,
                                 neighbours_in_file=neighbours_in_file)
    federation.start_brokers()
    try:
        if wrappers:
            federation.start_wrappers()
            federation.wait_converged(timeout=20)
    except BaseException:
        federation.stop()
        raise
    return federation


@pytest.fixture(name="make_federation")
def make_federation_fixture(tmp_path: Path) -> Iterator[Callable[..., LocalFederation]]:
    """`make_federation(count, "line" | "ring", settings=FAST_SETTINGS, wrappers=True, topics=None,
    neighbours_in_file=False)`: started and converged (only the brokers with `wrappers=False`); stopped after the
    test."""
    started: list[LocalFederation] = []

    def make(count: int, kind: str, settings: dict[str, Any] | None = FAST_SETTINGS,
             wrappers: bool = True, topics: dict[str, list[str]] | None = None,
             neighbours_in_file: bool = False) -> LocalFederation:
        federation = start_federation(tmp_path / f"federation-{len(started)}", count, kind, settings, wrappers,
                                      topics, neighbours_in_file)
        started.append(federation)
        return federation

    yield make
    for federation in started:
        federation.stop()
    # The daemon's contract: SIGTERM is a clean exit with status 0 (tests that SIGKILL a wrapper see -9).
    unclean = {name: node.wrapper_exits for federation in started for name, node in federation.nodes.items()
               if any(status not in (0, -signal.SIGKILL) for status in node.wrapper_exits)}
    assert not unclean, f"wrappers that did not exit cleanly on SIGTERM (exit statuses): {unclean}"


@dataclass(frozen=True)
class Message:
    qos: int
    retain: bool
    payload: bytes
    topic: str


class Subscriber:
    """A real mosquitto_sub writing one line per message (SUBSCRIBER_FORMAT) to a file."""

    def __init__(self, node: str, client_id: str, topic_filter: str, output: Path,
                 process: subprocess.Popen[bytes]) -> None:
        self.node = node
        self.client_id = client_id
        self.topic_filter = topic_filter
        self.output = output
        self.process = process

    def messages(self) -> list[Message]:
        found = []
        try:
            text = self.output.read_bytes().decode("utf-8")
        except FileNotFoundError:
            return []
        for raw in text.split("\n")[:-1]:  # the last piece is empty or a line being written
            qos, retain, length, hex_payload, topic = raw.split(" ", 4)
            payload = bytes.fromhex(hex_payload)
            assert len(payload) == int(length), f"mosquitto_sub printed {raw[:80]!r}"
            found.append(Message(int(qos), retain == "1", payload, topic))
        return found

    def received(self) -> list[tuple[str, bytes]]:
        return [(message.topic, message.payload) for message in self.messages()]

    def count(self, topic: str, payload: bytes) -> int:
        return self.received().count((topic, payload))

    def wait_for_count(self, count: int, timeout: float = 10.0) -> list[Message]:
        wait_for(lambda: len(self.messages()) >= count, timeout,
                 message=lambda: f"{count} messages at {self}; got {self.received()}")
        return self.messages()

    def wait_for_message(self, topic: str, payload: bytes, timeout: float = 10.0) -> Message:
        def arrived() -> Message | None:
            return next((m for m in self.messages() if (m.topic, m.payload) == (topic, payload)), None)

        found = wait_for(arrived, timeout, message=lambda: f"{topic} {payload[:40]!r} at {self}; "
                                                           f"got {[(t, p[:20]) for t, p in self.received()]}")
        assert found is not None
        return found

    def __repr__(self) -> str:
        return f"Subscriber({self.client_id} on {self.node}, {self.topic_filter!r})"


class PahoSubscriber:
    """A paho-mqtt 2.x MQTT v5 client that can subscribe, unsubscribe and disconnect while a test runs."""

    def __init__(self, host: str, client_id: str) -> None:
        self.client_id = client_id
        self.received: list[tuple[str, bytes, int]] = []
        self._lock = threading.Lock()
        self._acks: dict[int, threading.Event] = {}
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_ack
        self.client.on_unsubscribe = self._on_ack
        connected = threading.Event()
        self.client.on_connect = lambda *args: connected.set()
        self.client.connect(host, BROKER_PORT)
        self.client.loop_start()
        if not connected.wait(5):
            self.close()
            raise AssertionError(f"paho client {client_id} could not connect to {host}")

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.received.append((message.topic, bytes(message.payload), message.qos))

    def _on_ack(self, client: mqtt.Client, userdata: Any, mid: int, *rest: Any) -> None:
        self._acks.setdefault(mid, threading.Event()).set()

    def _wait_ack(self, mid: int, what: str) -> None:
        if not self._acks.setdefault(mid, threading.Event()).wait(5):
            raise AssertionError(f"paho client {self.client_id}: no ack for {what}")

    def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        result, mid = self.client.subscribe(topic_filter, qos)
        assert mid is not None, f"paho refused SUBSCRIBE {topic_filter}: {result}"
        self._wait_ack(mid, f"SUBSCRIBE {topic_filter}")

    def unsubscribe(self, topic_filter: str) -> None:
        result, mid = self.client.unsubscribe(topic_filter)
        assert mid is not None, f"paho refused UNSUBSCRIBE {topic_filter}: {result}"
        self._wait_ack(mid, f"UNSUBSCRIBE {topic_filter}")

    def payloads(self) -> list[bytes]:
        with self._lock:
            return [payload for _, payload, _ in self.received]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Streamer:
    """A paho MQTT v5 publisher in a thread: `count` publications on `topic`, payloads "1", "2", ..., each waited
    for (its PUBACK or PUBCOMP) and `pace` seconds apart; `close()` waits for the end."""

    def __init__(self, host: str, topic: str, count: int, qos: int = 1, pace: float = 0.005) -> None:
        self.topic = topic
        self.count = count
        self.qos = qos
        self.pace = pace
        self.acknowledged = 0
        self.error: BaseException | None = None
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"streamer-{topic}", protocol=mqtt.MQTTv5)
        self.client.connect(host, BROKER_PORT)
        self.client.loop_start()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for number in range(1, self.count + 1):
                self.client.publish(self.topic, str(number).encode(), qos=self.qos).wait_for_publish(30)
                self.acknowledged = number
                time.sleep(self.pace)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            self.error = error

    def close(self) -> None:
        self.thread.join(60)
        self.client.disconnect()
        self.client.loop_stop()


class Clients:
    """Real MQTT clients of a test, against the brokers of its federations; all stopped at teardown."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.processes = Processes()
        self.paho: list[PahoSubscriber] = []
        self._numbers = itertools.count(1)

    def subscribe(self, federation: LocalFederation, node: str, topic_filter: str, qos: int = 0,
                  extra: Sequence[str] = (), wait: bool = True, client_id: str | None = None) -> Subscriber:
        """Start `mosquitto_sub -t FILTER` on the node's broker; by default wait until its wrapper knows it."""
        number = next(self._numbers)
        client_id = client_id or f"sub{number}-{node}"
        output = self.directory / f"{client_id}.out"
        command = mosquitto_sub(BROKER_PORT, "-i", client_id, "-t", topic_filter, "-q", str(qos),
                                "-F", SUBSCRIBER_FORMAT, *extra, host=federation.node(node).host)
        with open(output, "wb") as sink:
            process = self.processes.start(command, stdout=sink)
        subscriber = Subscriber(node, client_id, topic_filter, output, process)
        if wait:
            wait_known(federation, node, client_id, topic_filter)
        return subscriber

    def paho_subscriber(self, federation: LocalFederation, node: str) -> PahoSubscriber:
        client = PahoSubscriber(federation.node(node).host, f"paho{next(self._numbers)}-{node}")
        self.paho.append(client)
        return client

    def publish(self, federation: LocalFederation, node: str, topic: str, payload: bytes | None, qos: int = 0,
                retain: bool = False, via: str = "file") -> None:
        """Run `mosquitto_pub` on the node's broker: the payload from a file (-f), stdin (-s) or -n if None."""
        arguments = ["-t", topic, "-q", str(qos), *(["-r"] if retain else [])]
        stdin: bytes | None = None
        if payload is None or (payload == b"" and via != "stdin"):
            arguments.append("-n")
        elif via == "file":
            path = self.directory / f"payload-{next(self._numbers)}"
            path.write_bytes(payload)
            arguments += ["-f", str(path)]
        elif via == "stdin":
            arguments.append("-s")
            stdin = payload
        elif via == "message":
            arguments += ["-m", payload.decode("utf-8")]
        else:
            raise ValueError(f"via: file, stdin or message, not {via!r}")
        result = subprocess.run(mosquitto_pub(BROKER_PORT, *arguments, host=federation.node(node).host),
                                input=stdin, capture_output=True, timeout=10, check=False)
        assert result.returncode == 0, f"mosquitto_pub {arguments} on {node} failed: {result.stderr!r}"

    def close(self) -> None:
        for client in self.paho:
            client.close()
        self.processes.close()


@pytest.fixture(name="clients")
def clients_fixture(tmp_path: Path) -> Iterator[Clients]:
    directory = tmp_path / "clients"
    directory.mkdir()
    made = Clients(directory)
    yield made
    made.close()


def wait_known(federation: LocalFederation, node: str, client_id: str, topic_filter: str | None,
               timeout: float = 10.0) -> None:
    """Wait until the node's wrapper lists `client_id` (with `topic_filter`; None: without any filter)."""
    def known() -> bool:
        subscriptions = federation.status(node).get("local_subscriptions", {})
        filters = subscriptions.get(client_id, {})
        return topic_filter in filters if topic_filter is not None else not filters

    wait_for(known, timeout, interval=0.05, message=lambda: (
        f"the wrapper of {node} to {'learn' if topic_filter else 'forget'} {client_id}'s "
        f"{topic_filter or 'filters'}; it knows {federation.status(node).get('local_subscriptions')}"))


def publication_events(federation: LocalFederation, topic_prefix: str) -> dict[str, list[dict[str, Any]]]:
    """Per node: the publication events for publications whose topic starts with `topic_prefix`."""
    originated = {event["pub"]: event["topic"] for name in federation.nodes
                  for event in federation.events(name, ["publication_originated"])}
    ours = {pub for pub, topic in originated.items() if str(topic).startswith(topic_prefix)}
    kinds = ["publication_originated", "publication_forwarded", "publication_delivered", "duplicate_dropped",
             "publication_dropped"]
    return {name: [event for event in federation.events(name, kinds) if event.get("pub") in ours]
            for name in federation.nodes}


def flush_event_logs(federation: LocalFederation, names: Sequence[str] | None = None) -> None:
    """Wait until every (named) wrapper has written all events emitted up to now."""
    federation.wait_event_logs(time.time(), timeout=15, names=names)
