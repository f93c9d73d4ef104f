"""federation.daemon.broker_log against a real Mosquitto 2.0 and the real mosquitto_sub clients.

A paho v5 client subscribes to `$SYS/broker/log/#` as the wrapper does and
feeds every message to a BrokerLogTracker; the tests drive real clients and
wait (with deadlines) for the events they must cause. Every test also checks
that the broker sent no line the tracker could not read.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from federation.daemon.broker_log import (
    LOG_TOPIC_FILTER,
    BrokerLogTracker,
    ClientConnected,
    ClientGone,
    ClientSubscribed,
    ClientUnsubscribed,
    LogEvent,
    filters_end_with_session,
)

from broker_util import (
    HOST,
    Broker,
    Processes,
    mosquitto_sub,
    requires_mosquitto,
    start_broker,
    wait_for,
)

pytestmark = requires_mosquitto

WRAPPER_ID = "fed-wrapper-under-test"


class LogWatcher:
    """The wrapper's log subscription in miniature: paho v5 on `$SYS/broker/log/#` feeding a tracker."""

    def __init__(self, port: int, client_id: str = WRAPPER_ID) -> None:
        self.tracker = BrokerLogTracker(client_id)
        self.events: list[LogEvent] = []
        self.lines: list[tuple[str, bytes | bytearray]] = []
        self._lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.client.on_message = self._on_message
        self.client.connect(HOST, port)
        self.client.loop_start()
        self.client.subscribe(LOG_TOPIC_FILTER, qos=2)
        # The broker logs the watcher's own subscription on the log topic too:
        # once it arrives, every later line will.
        wait_for(lambda: self.tracker.counters.own_client >= 1, message="the watcher's own subscribe line")

    def _on_message(self, client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.lines.append((message.topic, message.payload))
            # The wrapper's own lines come marked `own` (for the session ledger): not a client's events.
            self.events.extend(event for event in self.tracker.feed(message.topic, message.payload) if not event.own)

    def snapshot(self) -> list[LogEvent]:
        with self._lock:
            return list(self.events)

    def about(self, client: str) -> list[LogEvent]:
        return [event for event in self.snapshot() if event.client == client]

    def wait_for_events(self, client: str, expected: list[LogEvent], timeout: float = 5.0) -> list[LogEvent]:
        """Wait until the events about `client` start with `expected`; return them all."""
        def arrived() -> list[LogEvent]:
            events = self.about(client)
            return events if events[:len(expected)] == expected else []
        return wait_for(arrived, timeout,
                        message=lambda: f"{expected} for {client!r}, got {self.about(client)}\n{self.transcript()}")

    def wait_for_event(self, client: str, matches: Callable[[LogEvent], bool], timeout: float = 5.0) -> LogEvent:
        def found() -> LogEvent | None:
            return next((event for event in self.about(client) if matches(event)), None)
        event = wait_for(found, timeout, message=lambda: f"an event about {client!r}\n{self.transcript()}")
        assert event is not None
        return event

    def transcript(self) -> str:
        with self._lock:
            return "\n".join(f"{topic} {payload!r}" for topic, payload in self.lines[-40:])

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    running = start_broker(tmp_path)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def processes() -> Iterator[Processes]:
    started = Processes()
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def watcher(broker: Broker) -> Iterator[LogWatcher]:
    watching = LogWatcher(broker.port)
    try:
        yield watching
        # Checked only when the test passed: the broker sent nothing the tracker cannot read.
        counters = watching.tracker.counters
        assert counters.not_understood == {}, watching.transcript()
        assert counters.truncated == 0 and counters.refused == 0
        assert all(event.client != WRAPPER_ID for event in watching.snapshot())
    finally:
        watching.close()


def test_filters_and_an_id_with_spaces_then_sigterm(broker: Broker, watcher: LogWatcher,
                                                     processes: Processes) -> None:
    sub = processes.start(mosquitto_sub(broker.port, "-i", "id with space", "-t", "a/+/c", "-t", "x/#"))
    before = watcher.wait_for_events("id with space", [
        ClientConnected("id with space", True, 2, 60),
        ClientSubscribed("id with space", "a/+/c", 0),
        ClientSubscribed("id with space", "x/#", 0),
    ])
    # mosquitto_sub catches SIGTERM and sends DISCONNECT: "disconnected", not "closed its connection".
    Processes.end(sub, signal.SIGTERM)
    events = watcher.wait_for_events("id with space", before + [ClientGone("id with space", "disconnected", True, 2)])
    assert isinstance(events[-1], ClientGone) and filters_end_with_session(events[-1])
    assert watcher.tracker.counters.unknown_client == 0
    assert "id with space" not in watcher.tracker.connected_clients


def test_sigkill_closes_the_connection(broker: Broker, watcher: LogWatcher, processes: Processes) -> None:
    sub = processes.start(mosquitto_sub(broker.port, "-i", "killed", "-t", "k/1"))
    before = watcher.wait_for_events("killed", [ClientConnected("killed", True, 2, 60),
                                                ClientSubscribed("killed", "k/1", 0)])
    Processes.end(sub, signal.SIGKILL)
    watcher.wait_for_events("killed", before + [ClientGone("killed", "closed", True, 2)])


def test_persistent_session_keeps_its_filters(broker: Broker, watcher: LogWatcher, processes: Processes) -> None:
    sub = processes.start(mosquitto_sub(broker.port, "-i", "pers", "-c", "-q", "1", "-t", "p/q"))
    watcher.wait_for_events("pers", [ClientConnected("pers", False, 2, 60), ClientSubscribed("pers", "p/q", 1)])
    Processes.end(sub, signal.SIGKILL)
    gone = watcher.wait_for_event("pers", lambda event: isinstance(event, ClientGone))
    assert gone == ClientGone("pers", "closed", False, 2)
    assert isinstance(gone, ClientGone) and not filters_end_with_session(gone)


@pytest.mark.parametrize(("version", "protocol"), [("mqttv31", 1), ("mqttv311", 2), ("mqttv5", 5)])
def test_protocol_versions_and_username(broker: Broker, watcher: LogWatcher, processes: Processes,
                                        version: str, protocol: int) -> None:
    client = f"proto-{version}"
    processes.start(mosquitto_sub(broker.port, "-V", version, "-i", client, "-u", "alice", "-k", "30",
                                  "-t", "v/x"))
    watcher.wait_for_events(client, [ClientConnected(client, True, protocol, 30, "alice"),
                                     ClientSubscribed(client, "v/x", 0)])


def test_v5_shared_subscription_and_sys_kept(broker: Broker, watcher: LogWatcher, processes: Processes) -> None:
    """`$SYS/#` is kept in the table (the broker counts it; the node never federates it)."""
    client = "v5(p2, c1, k60)"  # an id that holds the very suffix the broker appends
    processes.start(mosquitto_sub(broker.port, "-V", "mqttv5", "-i", client, "-t", "$share/grp/s/t",
                                  "-t", "$SYS/#", "-t", "v/5"))
    events = watcher.wait_for_events(client, [
        ClientConnected(client, True, 5, 60),
        ClientSubscribed(client, "$share/grp/s/t", 0),
        ClientSubscribed(client, "$SYS/#", 0),
        ClientSubscribed(client, "v/5", 0),
    ])
    assert len(events) == 4
    assert watcher.tracker.counters.dollar_filters == 1


def test_unsubscribe(broker: Broker, watcher: LogWatcher, processes: Processes) -> None:
    processes.start(mosquitto_sub(broker.port, "-i", "unsub", "-t", "u/1", "-U", "u/1", "-U", "u 2/x"))
    watcher.wait_for_events("unsub", [
        ClientConnected("unsub", True, 2, 60),
        ClientSubscribed("unsub", "u/1", 0),
        ClientUnsubscribed("unsub", "u/1"),
        ClientUnsubscribed("unsub", "u 2/x"),
    ])


def test_takeover(broker: Broker, watcher: LogWatcher, processes: Processes) -> None:
    processes.start(mosquitto_sub(broker.port, "-i", "dup", "-c", "-q", "1", "-t", "d/1"))
    watcher.wait_for_events("dup", [ClientConnected("dup", False, 2, 60), ClientSubscribed("dup", "d/1", 1)])
    processes.start(mosquitto_sub(broker.port, "-i", "dup", "-t", "d/2"))
    watcher.wait_for_events("dup", [
        ClientConnected("dup", False, 2, 60),
        ClientSubscribed("dup", "d/1", 1),
        ClientGone("dup", "takeover", False, 2),  # the old connection gets no line of its own
        ClientConnected("dup", True, 2, 60),  # clean: the broker discarded the old session
        ClientSubscribed("dup", "d/2", 0),
    ])


def _raw_connect(port: int, client_id: str, keepalive: int) -> socket.socket:
    """A v3.1.1 clean-session CONNECT that then never speaks again (nor sends PINGREQ)."""
    identifier = client_id.encode()
    variable_header = b"\x00\x04MQTT\x04\x02" + keepalive.to_bytes(2, "big")
    payload = len(identifier).to_bytes(2, "big") + identifier
    connection = socket.create_connection((HOST, port), timeout=5)
    connection.sendall(bytes([0x10, len(variable_header) + len(payload)]) + variable_header + payload)
    assert connection.recv(4) == b"\x20\x02\x00\x00", "expected CONNACK accepted"
    return connection


def test_keepalive_timeout(broker: Broker, watcher: LogWatcher) -> None:
    connection = _raw_connect(broker.port, "silent one", keepalive=1)
    try:
        watcher.wait_for_events("silent one", [ClientConnected("silent one", True, 2, 1)])
        # Seen: ~4 s for keepalive 1 (the broker checks late).
        watcher.wait_for_events("silent one", [ClientConnected("silent one", True, 2, 1),
                                               ClientGone("silent one", "timeout", True, 2)], timeout=15)
    finally:
        connection.close()


def test_session_expiry(broker: Broker, watcher: LogWatcher) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="expiring", protocol=mqtt.MQTTv5)
    properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    properties.SessionExpiryInterval = 1
    client.connect(HOST, broker.port, clean_start=False, properties=properties)
    client.loop_start()
    try:
        client.subscribe("e/1", qos=1)
        watcher.wait_for_events("expiring", [ClientConnected("expiring", False, 5, 60),
                                             ClientSubscribed("expiring", "e/1", 1)])
    finally:
        client.disconnect()
        client.loop_stop()
    events = watcher.wait_for_events("expiring", [
        ClientConnected("expiring", False, 5, 60),
        ClientSubscribed("expiring", "e/1", 1),
        ClientGone("expiring", "disconnected", False, 5),
        ClientGone("expiring", "expired", None),
    ], timeout=10)
    assert [filters_end_with_session(event) for event in events if isinstance(event, ClientGone)] == [False, True]


def test_bridge_connection(tmp_path: Path, broker: Broker, watcher: LogWatcher) -> None:
    bridge_name = f"{socket.gethostname()}.to-remote"
    local = start_broker(tmp_path, name="local", extra_conf_lines=(
        "connection to-remote", f"address {HOST}:{broker.port}", "topic sensors/# both 0"))
    try:
        events = watcher.wait_for_events(bridge_name, [ClientConnected(bridge_name, False, 2, 60, bridge=True),
                                                       ClientSubscribed(bridge_name, "sensors/#", 0)])
    finally:
        local.stop()
    # A broker stopping cleanly drops its bridge's socket without DISCONNECT.
    watcher.wait_for_events(bridge_name, events + [ClientGone(bridge_name, "closed", False, 2)])
