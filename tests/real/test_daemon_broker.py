"""The broker adapter and the runtime against a real Mosquitto 2.0 and the real mosquitto_sub/pub clients.

`BrokerAdapter` tests collect what paho's thread hands over in a list; runtime
tests run a whole `Runtime` (UDP, timer, node) in a background thread with
its own asyncio loop and record the calls its started wrapper's node receives.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from federation.daemon import broker_health, lean_client
from federation.daemon.broker import BrokerAdapter
from federation.daemon.broker_items import BrokerItem, Connected, Disconnected, LogLine, Publication, Subscribed
from federation.daemon.broker_log import BrokerLogTracker, ClientSubscribed
from federation.daemon.client_registry import CONNECTED, Record, is_record
from federation.daemon.config import DaemonConfig
from federation.daemon.lean_client import PAHO_PRIVATE_NAMES, PublicClient
from federation.daemon.mqtt_properties import dict_to_properties, properties_to_dict
from federation.daemon.retained import ORIGIN_TIME
from federation.daemon.running import Running
from federation.daemon.runtime import Runtime
from federation.protocol.types import Address, Injection

from broker_util import (
    MOSQUITTO,
    Broker,
    Processes,
    free_port,
    mosquitto_pub,
    mosquitto_sub,
    requires_mosquitto,
    start_broker,
    wait_for,
)
from mqtt_bytes import acknowledgements
from runtime_util import RuntimeThread, runtime_config

pytestmark = requires_mosquitto

REPO = Path(__file__).resolve().parents[2]
WRAPPER_ID = "federation-wrapper-test"
PROPERTIES = {
    "user_property": [["k", "v"], ["k", "second"], ["trace", "a b"]],
    "content_type": "text/plain",
    "response_topic": "reply/here",
    "correlation_data": b"\x00corr",
    "payload_format_indicator": 1,
    "message_expiry_interval": 300,
}
PUB_PROPERTY_ARGS = [
    "-D", "publish", "user-property", "k", "v", "-D", "publish", "user-property", "k", "second",
    "-D", "publish", "user-property", "trace", "a b", "-D", "publish", "content-type", "text/plain",
    "-D", "publish", "response-topic", "reply/here", "-D", "publish", "correlation-data", "\x01corr",
    "-D", "publish", "payload-format-indicator", "1", "-D", "publish", "message-expiry-interval", "300",
]


class Collector:
    """Items handed over by the adapter (from paho's thread), each acknowledged once taken, as the runtime does
    (`adapter`, set once it is built)."""

    def __init__(self) -> None:
        self.items: list[BrokerItem] = []
        self.lock = threading.Lock()
        self.adapter: BrokerAdapter | None = None

    def __call__(self, item: BrokerItem) -> None:
        with self.lock:
            self.items.append(item)
        if self.adapter is not None:
            self.adapter.acknowledge(acknowledgements([item]))

    def of(self, kind: type) -> list[Any]:
        with self.lock:
            return [item for item in self.items if isinstance(item, kind)]

    def log_events(self) -> list[Any]:
        tracker = BrokerLogTracker(WRAPPER_ID)
        return [event for line in self.of(LogLine) for event in tracker.feed(line.topic, line.payload)]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with start_broker(tmp_path, name="broker") as running:
        yield running


@pytest.fixture
def processes() -> Iterator[Processes]:
    started = Processes()
    yield started
    started.close()


@pytest.fixture
def adapter_factory() -> Iterator[Callable[..., tuple[BrokerAdapter, Collector]]]:
    adapters: list[BrokerAdapter] = []

    def make(broker: Broker, max_qos: int = 2) -> tuple[BrokerAdapter, Collector]:
        collected = Collector()
        adapter = BrokerAdapter(Address("127.0.0.1", broker.port), WRAPPER_ID, collected, max_qos)
        collected.adapter = adapter
        adapters.append(adapter)
        adapter.start()
        wait_for(lambda: collected.of(Subscribed), timeout=5, message="the adapter to subscribe")
        # The broker logs the adapter's own subscription on the log topic: the log works.
        wait_for(lambda: collected.of(LogLine), timeout=5, message="the first log line")
        return adapter, collected

    yield make
    for adapter in adapters:
        adapter.stop()


def subscriber(processes: Processes, broker: Broker, topic: str, client_id: str, *extra: str,
               fmt: str = "%t|%p|%q|%r|%P") -> subprocess.Popen[bytes]:
    return processes.start(mosquitto_sub(broker.port, "-V", "mqttv5", "-i", client_id, "-t", topic, "-F", fmt,
                                         *extra), stdout=subprocess.PIPE)


def read_line(process: subprocess.Popen[bytes], timeout: float = 5.0) -> str:
    """One output line of a client process, within `timeout` (the process keeps running)."""
    assert process.stdout is not None
    result: list[bytes] = []
    reader = threading.Thread(target=lambda: result.append(process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    assert result and result[0], f"no output line within {timeout} s"
    return result[0].decode().rstrip("\n")


# ------------------------------------------------------------------ the adapter


def test_properties_convert_both_ways() -> None:
    properties, skipped = dict_to_properties(PROPERTIES)
    assert skipped == []
    assert properties_to_dict(properties) == PROPERTIES
    properties, skipped = dict_to_properties({"payload_format_indicator": 7, "nonsense": "x",
                                              "message_expiry_interval": -1, "content_type": 5})
    assert sorted(skipped) == ["content_type", "message_expiry_interval", "nonsense", "payload_format_indicator"]
    assert dict_to_properties(None) == (None, [])


def test_a_subscribing_client_is_seen(broker: Broker, processes: Processes, adapter_factory: Any) -> None:
    adapter, collected = adapter_factory(broker)
    sock = adapter.client.socket()
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    processes.start(mosquitto_sub(broker.port, "-i", "watcher", "-t", "a/+/c", "-t", "x/#", "-q", "1"))
    expected = [ClientSubscribed("watcher", "a/+/c", 1), ClientSubscribed("watcher", "x/#", 1)]
    wait_for(lambda: all(e in collected.log_events() for e in expected), timeout=5,
             message=lambda: f"the subscribe lines; got {collected.log_events()}")


def test_a_local_publication_arrives_with_qos_retain_and_properties(broker: Broker, processes: Processes,
                                                                   adapter_factory: Any) -> None:
    adapter, collected = adapter_factory(broker)
    for qos in (0, 1, 2):
        command = mosquitto_pub(broker.port, "-V", "mqttv5", "-t", f"pub/{qos}", "-m", f"payload {qos}",
                                "-q", str(qos), *(["-r"] if qos == 1 else []), *PUB_PROPERTY_ARGS)
        subprocess.run(command, check=True, timeout=10)
    wait_for(lambda: len(collected.of(Publication)) >= 3, timeout=5, message="three publications")
    publications = collected.of(Publication)
    by_topic = {p.topic: p for p in publications}
    for qos in (0, 1, 2):
        publication = by_topic[f"pub/{qos}"]
        assert publication.payload == f"payload {qos}".encode()
        assert publication.qos == qos
        assert publication.retain == (qos == 1)
        assert publication.properties == {**PROPERTIES, "correlation_data": b"\x01corr"}
    # Retained messages stored before subscribing are not replayed (retain handling 2) after a reconnect.
    adapter.client.reconnect()
    wait_for(lambda: len(collected.of(Subscribed)) >= 2, timeout=5, message="the resubscription")
    marker = mosquitto_pub(broker.port, "-t", "marker", "-m", "m")
    subprocess.run(marker, check=True, timeout=10)
    wait_for(lambda: any(p.topic == "marker" for p in collected.of(Publication)), message="the marker")
    assert [p.topic for p in collected.of(Publication)].count("pub/1") == 1


def test_injection_reaches_subscribers_and_is_not_echoed(broker: Broker, processes: Processes,
                                                         adapter_factory: Any) -> None:
    adapter, collected = adapter_factory(broker)
    reader = subscriber(processes, broker, "fed/#", "reader", "-q", "2")
    wait_for(lambda: ClientSubscribed("reader", "fed/#", 2) in collected.log_events(), message="reader subscribed")
    injection = Injection("fed/one", b"remote payload", 1, False, PROPERTIES, (Address("10.0.0.9", 10500), 7, 1))
    assert adapter.publish(injection)
    line = read_line(reader)
    topic, payload, qos, retain, user = line.split("|", 4)
    assert (topic, payload, qos, retain) == ("fed/one", "remote payload", "1", "0")
    assert "k:v" in user and "k:second" in user and "trace:a b" in user
    # No echo: a later local publication arrives, the injected one never did.
    subprocess.run(mosquitto_pub(broker.port, "-t", "fed/marker", "-m", "m"), check=True, timeout=10)
    wait_for(lambda: any(p.topic == "fed/marker" for p in collected.of(Publication)), message="the marker")
    assert [p.topic for p in collected.of(Publication)] == ["fed/marker"]


def test_injected_qos_is_capped(broker: Broker, processes: Processes, adapter_factory: Any) -> None:
    adapter, collected = adapter_factory(broker, max_qos=0)
    reader = subscriber(processes, broker, "cap/#", "reader", "-q", "2")
    wait_for(lambda: ClientSubscribed("reader", "cap/#", 2) in collected.log_events(), message="reader subscribed")
    assert adapter.publish(Injection("cap/x", b"p", 2, True, None, (Address("10.0.0.9", 10500), 7, 2)))
    assert read_line(reader).split("|")[:3] == ["cap/x", "p", "0"]
    # The retain flag was kept: a later subscriber gets the stored message, flagged retained.
    late = subscriber(processes, broker, "cap/#", "late", "-q", "2")
    assert read_line(late).split("|")[:4] == ["cap/x", "p", "0", "1"]


def test_what_happens_while_the_wrapper_is_away_is_delivered_later(broker: Broker, processes: Processes,
                                                                    adapter_factory: Any) -> None:
    """The wrapper's session outlives a short absence: queued log lines and QoS 1/2 publications arrive."""
    first, _ = adapter_factory(broker)
    first.stop()
    processes.start(mosquitto_sub(broker.port, "-i", "during-gap", "-t", "g/#"))
    wait_for(lambda: "during-gap 0 g/#" in broker.log_text(), message="the subscription while away")
    subprocess.run(mosquitto_pub(broker.port, "-t", "g/1", "-m", "queued", "-q", "1"), check=True, timeout=10)
    _, collected = adapter_factory(broker)
    wait_for(lambda: ClientSubscribed("during-gap", "g/#", 0) in collected.log_events(), timeout=5,
             message="the queued subscribe line")
    wait_for(lambda: [p.payload for p in collected.of(Publication) if p.topic == "g/1"] == [b"queued"], timeout=5,
             message="the queued publication")


def test_broker_restart_reconnects_and_resubscribes(broker: Broker, processes: Processes,
                                                    adapter_factory: Any) -> None:
    adapter, collected = adapter_factory(broker)
    broker.restart()
    wait_for(lambda: collected.of(Disconnected), timeout=5, message="the disconnect to be noticed")
    wait_for(lambda: len(collected.of(Connected)) >= 2 and len(collected.of(Subscribed)) >= 2, timeout=10,
             message="a reconnection and new subscriptions")
    assert not collected.of(Disconnected)[0].expected
    processes.start(mosquitto_sub(broker.port, "-i", "after-restart", "-t", "r/#"))
    wait_for(lambda: ClientSubscribed("after-restart", "r/#", 0) in collected.log_events(), timeout=5,
             message="the log subscription to work again")
    subprocess.run(mosquitto_pub(broker.port, "-t", "r/1", "-m", "x"), check=True, timeout=10)
    wait_for(lambda: any(p.topic == "r/1" for p in collected.of(Publication)), message="publications again")


def start_mosquitto(processes: Processes, path: Path, conf: str) -> None:
    """A broker with exactly this config (plus `user root` as root), started and accepting connections."""
    path.write_text(conf + ("user root\n" if os.geteuid() == 0 else ""))
    process = processes.start([MOSQUITTO, "-c", str(path)])
    port = int(next(line.split()[1] for line in conf.splitlines() if line.startswith("listener ")))

    def accepts() -> bool:
        assert process.poll() is None, f"mosquitto -c {path} exited with {process.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            return False

    wait_for(accepts, timeout=5, message=f"mosquitto -c {path} to listen")


def test_shipped_mosquitto_conf_gives_the_wrapper_what_it_needs(tmp_path: Path, processes: Processes) -> None:
    shipped = (REPO / "configs" / "mosquitto.conf").read_text()
    assert "\nlistener 1883\n" in shipped
    port = free_port()
    start_mosquitto(processes, tmp_path / "mosquitto.conf",
                    # (stderr is a pipe nobody reads here: drop that destination)
                    shipped.replace("\nlistener 1883\n", f"\nlistener {port} 127.0.0.1\n")
                    .replace("\nlog_dest stderr\n", "\n"))
    collected = Collector()
    adapter = BrokerAdapter(Address("127.0.0.1", port), WRAPPER_ID, collected)
    adapter.start()
    try:
        wait_for(lambda: collected.of(LogLine), timeout=5, message="log lines from the shipped config")
        processes.start(mosquitto_sub(port, "-i", "shipped-sub", "-t", "s/#"))
        wait_for(lambda: ClientSubscribed("shipped-sub", "s/#", 0) in collected.log_events(), timeout=5,
                 message="the subscription to be logged")
    finally:
        adapter.stop()


# ------------------------------------------------------------------ the runtime with a real broker


class RecordingRuntime(Runtime):
    """A Runtime whose node records local_publish calls: the clients' publications in `published`, and apart, the
    wrapper's own records of the registry of client ids (every connection is claimed: client_registry.py) by client
    id and state in `claims`."""

    def __init__(self, config: DaemonConfig) -> None:
        super().__init__(config)
        self.published: list[tuple[str, bytes, int, bool, dict[str, Any] | None]] = []
        self.claims: list[tuple[str, str]] = []

    async def build(self) -> Running:
        wrapper = await super().build()
        node = wrapper.node
        original = node.local_publish

        def local_publish(topic: str, payload: bytes, qos: int, retain: bool, properties: dict[str, Any] | None,
                          now: float) -> Any:
            if is_record(topic):
                record = Record.decode(payload)
                self.claims.append((record.client, record.state))
            else:
                self.published.append((topic, payload, qos, retain, properties))
            return original(topic, payload, qos, retain, properties, now)

        node.local_publish = local_publish  # type: ignore[method-assign]
        return wrapper


def test_runtime_feeds_the_node(broker: Broker, processes: Processes, tmp_path: Path) -> None:
    runtime = RecordingRuntime(runtime_config(broker.port, state_dir=tmp_path / "state"))
    thread = RuntimeThread(runtime)
    wrapper = thread.wrapper
    store = wrapper.resources.store
    assert store is not None
    try:
        wait_for(lambda: wrapper.broker_health.log_lines > 0, timeout=5, message="log lines reaching the wrapper")
        clean = processes.start(mosquitto_sub(broker.port, "-i", "clean-sub", "-t", "c/#"))
        processes.start(mosquitto_sub(broker.port, "-i", "kept-sub", "-c", "-q", "1", "-t", "k/+"))
        node = wrapper.node
        wait_for(lambda: node.clients == {"clean-sub": {"c/#": 0}, "kept-sub": {"k/+": 1}}, timeout=5,
                 message=lambda: f"both subscriptions in the node; it has {node.clients}")
        subprocess.run(mosquitto_pub(broker.port, "-V", "mqttv5", "-t", "c/1", "-m", "hello", "-q", "2", "-r",
                                     *PUB_PROPERTY_ARGS), check=True, timeout=10)
        wait_for(lambda: runtime.published, timeout=5, message="node.local_publish")
        topic, payload, qos, retain, properties = runtime.published[0]
        stamped = dict(properties or {})
        origin_ms = stamped.pop(ORIGIN_TIME)  # a retained publication carries its version's time (rule 10)
        assert isinstance(origin_ms, int) and origin_ms > 0
        assert (topic, payload, qos, retain, stamped) == ("c/1", b"hello", 2, True,
                                                          {**PROPERTIES, "correlation_data": b"\x01corr"})
        assert {("clean-sub", CONNECTED), ("kept-sub", CONNECTED)} <= set(runtime.claims)
        # A clean client's disconnect removes its filters; a persistent session keeps them.
        Processes.end(clean)
        wait_for(lambda: "clean-sub" not in node.clients, timeout=5, message="the clean client's filters to go")
        wait_for(lambda: '"clean-sub"' not in store.path.read_text(), timeout=5,
                 message="the state file to drop the clean client")
        for process in processes.started:
            Processes.end(process)
        wait_for(lambda: "kept-sub" not in wrapper.tracker.connected_clients, timeout=5,
                 message="the persistent client's disconnect line")
        assert node.clients == {"kept-sub": {"k/+": 1}}
    finally:
        assert thread.stop() == 0
    saved = store.path.read_text()
    assert '"kept-sub"' in saved and '"persistent": true' in saved


def test_runtime_on_pahos_public_path_feeds_the_node(broker: Broker, processes: Processes,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed paho lacks a name the lean path relies on: the wrapper still learns subscriptions and
    hands publications to its node, through paho's documented API."""
    monkeypatch.setattr(lean_client, "PAHO_PRIVATE_NAMES", (*PAHO_PRIVATE_NAMES, "client._renamed_by_a_later_paho"))
    runtime = RecordingRuntime(runtime_config(broker.port))
    thread = RuntimeThread(runtime)
    try:
        assert type(thread.wrapper.broker.client) is PublicClient
        # The subscribe line must come after the wrapper's subscription to the log (or it is never seen).
        wait_for(lambda: thread.wrapper.broker_health.log_lines > 0, timeout=5, message="log lines reaching it")
        processes.start(mosquitto_sub(broker.port, "-i", "public-sub", "-t", "p/#"))
        node = thread.wrapper.node
        wait_for(lambda: node.clients == {"public-sub": {"p/#": 0}}, timeout=5,
                 message=lambda: f"the subscription in the node; it has {node.clients}")
        subprocess.run(mosquitto_pub(broker.port, "-t", "p/1", "-m", "hello", "-q", "1"), check=True, timeout=10)
        wait_for(lambda: runtime.published, timeout=5, message="node.local_publish")
        assert runtime.published[0] == ("p/1", b"hello", 1, False, None)
        assert ("public-sub", CONNECTED) in runtime.claims
    finally:
        assert thread.stop() == 0


def test_runtime_warns_when_the_broker_sends_no_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    processes: Processes, caplog: pytest.LogCaptureFixture) -> None:
    # A broker without `log_dest topic` (broker_util's brokers always have it, so this one is made by hand).
    port = free_port()
    start_mosquitto(processes, tmp_path / "silent.conf",
                    f"listener {port} 127.0.0.1\nallow_anonymous true\nlog_dest none\n")
    monkeypatch.setattr(broker_health, "LOG_SILENCE_WARNING_AFTER", 0.5)
    caplog.set_level(logging.WARNING, logger="federation.daemon")
    thread = RuntimeThread(Runtime(runtime_config(port)))
    try:
        wait_for(lambda: "log_dest topic" in caplog.text, timeout=5, message="the missing-log warning")
        assert "log_type all" in caplog.text and f"127.0.0.1:{port}" in caplog.text
        assert thread.wrapper.broker_health.connected
    finally:
        assert thread.stop() == 0


def test_runtime_survives_a_broker_that_is_down_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    caplog.set_level(logging.INFO, logger="federation.daemon")
    thread = RuntimeThread(Runtime(runtime_config(port)))
    health = thread.wrapper.broker_health
    try:
        wait_for(lambda: "unreachable" in caplog.text, timeout=5, message="the unreachable-broker warning")
        assert not health.connected
        with start_broker(tmp_path, port=port, name="late"):
            wait_for(lambda: health.connected and health.log_lines > 0, timeout=15,
                     message="the connection once the broker is up")
    finally:
        assert thread.stop() == 0
