"""The wrapper's broker session against real Mosquitto brokers (docs/daemon.md "The broker session" and
"Subscriptions the wrapper did not see"): the broker's Receive Maximum kept with Mosquitto's default
configuration, the injection journal across a killed wrapper and a restarted broker, publications held for
the clients of a restarted broker, and subscribers the wrapper never saw.

The federations are real brokers and wrappers (`LocalFederation`); the journal tests drive the broker
adapter itself on an asyncio loop, as the runtime does, so that the moment of the "crash" is exact.
"""

from __future__ import annotations

import errno
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from federation.daemon.broker import BrokerAdapter
from federation.daemon.broker_items import BrokerItem, Connected
from federation.daemon.broker_subscriptions import DROP_REASON
from federation.daemon.injections import InjectionJournal
from federation.daemon.record_log import RecordLog
from federation.protocol.types import Address, Injection
from federation.tools.launch import MOSQUITTO_CONF_TEMPLATE, LocalFederation, line, node_names

from broker_util import (
    Broker,
    LoopThread,
    Processes,
    loop_thread_fixture,  # noqa: F401 - the `loop_thread` fixture
    mosquitto_sub,
    requires_mosquitto,
    start_broker,
    wait_for,
)
from federation_util import FAST_SETTINGS, next_first_address, wait_known
from mqtt_bytes import acknowledgements

pytestmark = requires_mosquitto

ORIGIN = Address("10.0.0.9", 10500)


@pytest.fixture
def federations(tmp_path: Path) -> Iterator[Callable[..., LocalFederation]]:
    """`make(count, options={}, template=None, wrappers=True)`: a line of real brokers (and wrappers, converged),
    `options` top-level keys of every wrapper's YAML, `template` the brokers' config template; stopped after."""
    started: list[LocalFederation] = []

    def make(count: int, options: dict[str, Any] | None = None, template: Path | None = None,
             wrappers: bool = True) -> LocalFederation:
        names = node_names(count)
        federation = LocalFederation(names, line(names), tmp_path / f"federation-{len(started)}", FAST_SETTINGS,
                                     first_address=next_first_address(), mosquitto_template=template)
        started.append(federation)
        federation.start_brokers()
        for node in federation.nodes.values():  # the YAML is written with the broker configs
            with open(node.wrapper_config, "a", encoding="utf-8") as yaml_file:
                yaml_file.writelines(f"{key}: {value}\n" for key, value in (options or {}).items())
        if wrappers:
            federation.start_wrappers()
            federation.wait_converged(timeout=20)
        return federation

    yield make
    for federation in started:
        federation.stop()


class PahoClient:
    """A paho MQTT v5 client on a federation node's broker: what it received, in order."""

    def __init__(self, host: str, client_id: str, port: int = 1883) -> None:
        self.received: list[bytes] = []
        self.lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.client.on_message = self._on_message
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *args: subscribed.set()
        self._subscribed = subscribed
        self.client.connect(host, port)
        self.client.loop_start()

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.received.append(bytes(message.payload))

    def subscribe(self, topic_filter: str, qos: int) -> None:
        self._subscribed.clear()
        self.client.subscribe(topic_filter, qos)
        assert self._subscribed.wait(5), f"no SUBACK for {topic_filter}"

    def payloads(self) -> list[bytes]:
        with self.lock:
            return list(self.received)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def paho_clients() -> Iterator[Callable[..., PahoClient]]:
    """`make(host, client_id, port=1883)`: a connected client, disconnected after the test."""
    made: list[PahoClient] = []

    def make(host: str, client_id: str, port: int = 1883) -> PahoClient:
        client = PahoClient(host, client_id, port)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def broker_status(federation: LocalFederation, name: str) -> dict[str, Any]:
    document: dict[str, Any] = federation.status(name)["daemon"]["broker"]
    return document


# ------------------------------------------------------------------ the broker's Receive Maximum


def test_a_qos2_burst_through_three_default_brokers_arrives_complete_in_order_without_reconnects(
        federations: Callable[..., LocalFederation], paho_clients: Callable[..., PahoClient], tmp_path: Path
        ) -> None:
    """Mosquitto's default `max_inflight_messages` (20) is its Receive Maximum: a wrapper that sent more QoS 2
    injections unacknowledged was disconnected over and over (1 of 2,000 arrived within 60 s)."""
    template = tmp_path / "default-inflight.conf"  # the shipped config, without any max_inflight_messages line
    template.write_text("".join(line for line in MOSQUITTO_CONF_TEMPLATE.read_text().splitlines(keepends=True)
                                if line.split()[:1] != ["max_inflight_messages"]))
    federation = federations(3, template=template)
    count = 2000
    subscriber = paho_clients(federation.node("n2").host, "burst-subscriber")
    subscriber.subscribe("burst/#", 2)
    federation.wait_mesh("burst/#")
    publisher = paho_clients(federation.node("n0").host, "burst-publisher")
    infos = [publisher.client.publish("burst/t", b"%d" % index, qos=2) for index in range(count)]
    for info in infos:
        info.wait_for_publish(30)
    wait_for(lambda: len(subscriber.payloads()) >= count, timeout=60,
             message=lambda: f"{count} publications at n2; got {len(subscriber.payloads())}\n"
                             f"{federation.diagnostics()}")
    assert subscriber.payloads() == [b"%d" % index for index in range(count)]  # complete, once, in order
    statuses = {name: broker_status(federation, name) for name in federation.nodes}
    assert {name: status["reconnects"] for name, status in statuses.items()} == {"n0": 0, "n1": 0, "n2": 0}
    assert statuses["n2"]["session"]["receive_maximum"] == 20
    injections = statuses["n2"]["injections"]
    assert injections["acknowledged"] == count and injections["delivered"] == count


# ------------------------------------------------------------------ the injection journal


class JournaledAdapter:
    """A broker adapter with an injection journal on a loop thread, as the runtime holds one."""

    def __init__(self, loop: LoopThread, broker: Broker, journal_path: Path, client_id: str) -> None:
        self.loop = loop
        self.items: list[BrokerItem] = []
        self.journal = InjectionJournal(RecordLog(journal_path), 1000)
        self.adapter: BrokerAdapter

        def build() -> None:
            self.adapter = BrokerAdapter(Address("127.0.0.1", broker.port), client_id, self._take, loop=loop.loop,
                                         recorder=self.journal)
            self.adapter.restore([(entry.mid, entry.injection, entry.released)
                                  for entry in self.journal.in_flight()])
            self.adapter.start()  # `_take` may run before `loop.call` returns: the adapter is known by then

        loop.call(build)

    def _take(self, item: BrokerItem) -> None:  # on the loop: acknowledge what it was given, as the runtime does
        self.items.append(item)
        self.adapter.acknowledge(acknowledgements([item]))

    def connected(self) -> list[Connected]:
        return [item for item in self.items if isinstance(item, Connected)]

    def publish(self, injections: list[Injection]) -> None:
        self.loop.call(lambda: self.adapter.publish_all(injections))

    def crash(self) -> None:
        """What kill -9 leaves: the TCP connection reset, nothing more sent, nothing more read."""
        def reset() -> None:
            adapter = self.adapter
            adapter._stopping = True  # no reconnection
            for handle in (adapter._connect_handle, adapter._keepalive_handle, adapter.reading._read_retry):
                if handle is not None:
                    handle.cancel()
            sock = adapter.client.socket()
            assert isinstance(sock, socket.socket)
            self.loop.loop.remove_reader(sock)
            if adapter._writing:
                self.loop.loop.remove_writer(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
            adapter.reading.watched = None
            adapter.client._sock = None  # paho forgets it without closing it again (nor telling the adapter)

        self.loop.call(reset)
        self.journal.close()

    def stop(self) -> None:
        if not self.adapter._stopping:
            self.loop.call(self.adapter.stop)
            self.journal.close()


def injections(first: int, count: int) -> list[Injection]:
    return [Injection("journal/t", b"%d" % seq, 2, False, None, (ORIGIN, 1, seq)) for seq in range(first,
                                                                                                  first + count)]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with start_broker(tmp_path, name="broker") as running:
        yield running


def journaled_scenario(loop_thread: LoopThread, broker: Broker, tmp_path: Path) -> JournaledAdapter:
    """Ten QoS 2 injections left unfinished by a killed wrapper: five past PUBREC (the PUBREL never went out),
    five written and never answered; the broker holds all ten, undelivered."""
    first = JournaledAdapter(loop_thread, broker, tmp_path / "injections.log", "journal-wrapper")
    wait_for(lambda: first.adapter.connected, message="the wrapper to connect")
    assert first.adapter.receive_maximum == 20
    sent_pubrels: list[int] = []
    first.adapter.client._send_pubrel = lambda mid: (sent_pubrels.append(mid),  # type: ignore[method-assign]
                                                     MQTTErrorCode.MQTT_ERR_SUCCESS)[1]
    first.publish(injections(0, 5))
    wait_for(lambda: len(sent_pubrels) == 5, message="five PUBRECs")  # recorded; the crash takes the PUBRELs
    loop_thread.call(first.adapter.pause_reading)
    first.publish(injections(5, 5))
    wait_for(lambda: first.adapter.client.want_write() is False, message="the five PUBLISH packets written")
    first.crash()
    return first


def test_a_killed_wrappers_unfinished_qos2_injections_are_sent_again_and_delivered_once(
        loop_thread: LoopThread, broker: Broker, tmp_path: Path, paho_clients: Callable[..., PahoClient]) -> None:
    reader = paho_clients("127.0.0.1", "journal-reader", broker.port)
    reader.subscribe("journal/#", 2)
    journaled_scenario(loop_thread, broker, tmp_path)
    assert reader.payloads() == []  # Mosquitto delivers a QoS 2 message at the PUBREL
    second = JournaledAdapter(loop_thread, broker, tmp_path / "injections.log", "journal-wrapper")
    assert [(entry.mid, entry.released) for entry in second.journal.in_flight()] == \
        [(mid, mid <= 6) for mid in range(2, 12)]  # packet id 1 went to the first SUBSCRIBE
    wait_for(lambda: second.connected(), message="the restarted wrapper to connect")
    assert second.connected()[0] == Connected(True, False, 20, 10, ())  # the session was kept: sent again
    wait_for(lambda: second.adapter.counts["acknowledged"] == 10, message="the broker to complete all ten")
    second.publish(injections(10, 1))  # a marker: QoS 2 messages of one client are delivered in order
    wait_for(lambda: b"10" in reader.payloads(), message="the marker")
    assert sorted(reader.payloads()) == sorted(b"%d" % seq for seq in range(11))  # each once
    wait_for(lambda: second.journal.in_flight() == [], message="the marker's PUBCOMP")
    assert second.journal.is_completed((ORIGIN, 1, 3))
    second.stop()


def test_qos2_injections_the_broker_completed_while_the_journal_was_refused_are_not_sent_again_after_a_restart(
        loop_thread: LoopThread, broker: Broker, tmp_path: Path, paho_clients: Callable[..., PahoClient],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills once the injections' `started` records are written: their PUBREC and PUBCOMP records are
    refused, kept, and written once it has room (the runtime's retry: `write_unwritten`). A restart then finds
    nothing unfinished; a journal that lost them would send the PUBLISH packets again, and the broker, which
    completed those packet ids, would deliver each a second time (issue 37: 1-7 doubled)."""
    reader = paho_clients("127.0.0.1", "journal-reader", broker.port)
    reader.subscribe("journal/#", 2)
    first = JournaledAdapter(loop_thread, broker, tmp_path / "injections.log", "journal-wrapper")
    wait_for(lambda: first.adapter.connected, message="the wrapper to connect")
    full = [False]
    append = first.journal.log.append

    def refusing_append(payloads: list[bytes]) -> None:
        if full[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        append(payloads)

    monkeypatch.setattr(first.journal.log, "append", refusing_append)
    # One loop call: the disk is full before the broker's first PUBREC can be read.
    loop_thread.call(lambda: (first.adapter.publish_all(injections(0, 5)), full.__setitem__(0, True)))
    wait_for(lambda: first.adapter.counts["acknowledged"] == 5, message="the broker to complete all five")
    wait_for(lambda: len(reader.payloads()) == 5, message="five deliveries")
    assert loop_thread.call(lambda: first.journal.unwritten) >= 2  # the PUBRECs' records and the completions
    assert not loop_thread.call(first.journal.write_unwritten)
    full[0] = False
    assert loop_thread.call(first.journal.write_unwritten)
    first.stop()
    second = JournaledAdapter(loop_thread, broker, tmp_path / "injections.log", "journal-wrapper")
    assert second.journal.in_flight() == [] and second.journal.is_completed((ORIGIN, 1, 4))
    wait_for(lambda: second.connected(), message="the restarted wrapper to connect")
    assert second.connected()[0].resent == 0
    second.publish(injections(5, 1))  # a marker: QoS 2 messages of one client are delivered in order
    wait_for(lambda: b"5" in reader.payloads(), message="the marker")
    assert sorted(reader.payloads()) == sorted(b"%d" % seq for seq in range(6))  # each once
    second.stop()


def test_a_broker_that_lost_the_session_gets_the_unfinished_injections_anew(
        loop_thread: LoopThread, broker: Broker, tmp_path: Path, paho_clients: Callable[..., PahoClient]) -> None:
    """A PUBREL after a broker restart would be answered "done" for a message the broker never delivered: the
    unfinished ones are published anew instead, with new packet ids."""
    journaled_scenario(loop_thread, broker, tmp_path)
    broker.restart()  # no persistence: the session, and the ten held messages, are gone
    reader = paho_clients("127.0.0.1", "journal-reader", broker.port)
    reader.subscribe("journal/#", 2)
    second = JournaledAdapter(loop_thread, broker, tmp_path / "injections.log", "journal-wrapper")
    wait_for(lambda: second.connected(), message="the restarted wrapper to connect")
    connected = second.connected()[0]
    assert (connected.session_present, connected.session_lost, connected.resent) == (False, False, 0)
    assert connected.reinjected == tuple(injections(0, 10))  # in their order, for the runtime to publish
    second.publish(list(connected.reinjected))
    wait_for(lambda: len(reader.payloads()) >= 10, message="ten deliveries")
    assert reader.payloads() == [b"%d" % seq for seq in range(10)]
    wait_for(lambda: second.journal.in_flight() == [], message="the journal to see them completed")
    second.stop()


# ------------------------------------------------------------------ subscriptions the wrapper did not see


def test_publications_for_a_restarted_broker_wait_for_their_subscriber_or_are_dropped_after_the_grace(
        federations: Callable[..., LocalFederation], tmp_path: Path) -> None:
    federation = federations(2, {"resubscribe_grace": 4})
    processes = Processes()
    host = federation.node("n1").host
    # A persistent subscriber (clean session 0): the wrapper keeps its filter across its disconnection.
    command = mosquitto_sub(1883, "-i", "held-sub", "-c", "-q", "1", "-t", "held/#", host=host)
    try:
        output = tmp_path / "held-sub.out"

        def start_subscriber() -> None:
            with open(output, "ab") as sink:
                processes.start(command, stdout=sink)

        def lines() -> list[str]:
            return output.read_text().split() if output.exists() else []

        start_subscriber()
        wait_known(federation, "n1", "held-sub", "held/#")
        federation.wait_mesh("held/#")
        processes.close()  # the subscriber goes away (SIGTERM: it closes its socket), its broker restarts
        federation.restart_broker("n1")
        wait_for(lambda: broker_status(federation, "n1")["session"]["lost"] == 1, timeout=15,
                 message="the wrapper of n1 to see its broker lost the session")
        publisher = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="held-publisher", protocol=mqtt.MQTTv5)
        publisher.connect(federation.node("n0").host, 1883)
        publisher.loop_start()
        try:
            for index in range(5):
                publisher.publish("held/t", b"before-%d" % index, qos=1).wait_for_publish(5)
            wait_for(lambda: broker_status(federation, "n1")["resubscribe_grace"]["held"] == 5,
                     message=lambda: f"n1 to hold five: {broker_status(federation, 'n1')['resubscribe_grace']}")
            start_subscriber()  # it subscribes again: what was held is injected, in order
            wait_for(lambda: len(lines()) >= 5, message=lambda: f"the five held ones; got {lines()}")
            assert lines() == [f"before-{index}" for index in range(5)]
            processes.close()
            federation.restart_broker("n1")
            wait_for(lambda: broker_status(federation, "n1")["session"]["lost"] == 2, timeout=15,
                     message="the second broker restart")
            for index in range(3):
                publisher.publish("held/t", b"nobody-%d" % index, qos=1).wait_for_publish(5)
            wait_for(lambda: federation.status("n1")["drops"].get(DROP_REASON) == 3, timeout=15,
                     message=lambda: f"three drops after the grace: {federation.status('n1')['drops']}")
        finally:
            publisher.disconnect()
            publisher.loop_stop()
        grace = broker_status(federation, "n1")["resubscribe_grace"]
        assert (grace["active"], grace["held"], grace["released"], grace["dropped"]) == (False, 0, 5, 3)
        federation.wait_event_logs(time.time(), names=["n1"])
        ended = federation.events("n1", ["resubscribe_grace_ended"])
        assert [(event["released"], event["dropped"]) for event in ended] == [(5, 0), (5, 3)]
        dropped = [event for event in federation.events("n1", ["publication_dropped"])
                   if event["reason"] == DROP_REASON]
        assert len(dropped) == 3 and {event["filter"] for event in dropped} == {"held/#"}
    finally:
        processes.close()


def test_a_subscriber_the_wrapper_never_saw_still_gets_remote_publications(
        federations: Callable[..., LocalFederation], paho_clients: Callable[..., PahoClient]) -> None:
    """It subscribed before its wrapper started: the broker's subscription count says the wrapper misses one, and
    the wrapper over-delivers (before, it got nothing until it subscribed again)."""
    assert "\nsys_interval 1\n" in MOSQUITTO_CONF_TEMPLATE.read_text()  # a count every second
    federation = federations(3, wrappers=False)
    subscriber = paho_clients(federation.node("n2").host, "unseen-subscriber")
    subscriber.subscribe("unseen/#", 1)
    federation.start_wrappers()
    federation.wait_converged(timeout=20)
    wait_for(lambda: broker_status(federation, "n2")["subscription_count"]["over_delivery"], timeout=20,
             message=lambda: f"over-delivery at n2: {broker_status(federation, 'n2')['subscription_count']}")
    assert "unseen-subscriber" not in federation.status("n2")["local_subscriptions"]
    publisher = paho_clients(federation.node("n0").host, "unseen-publisher")
    sent = [0]

    def delivered() -> bool:  # publish until one arrives: the mesh of `#` forms as the cores are elected
        publisher.client.publish("unseen/t", b"%d" % sent[0], qos=1).wait_for_publish(5)
        sent[0] += 1
        return bool(subscriber.payloads())

    wait_for(delivered, timeout=20, interval=0.2,
             message=lambda: f"a publication at the subscriber n2's wrapper never saw ({sent[0]} published)\n"
                             f"{federation.diagnostics()}")
    federation.wait_event_logs(time.time(), names=["n2"])
    [event] = federation.events("n2", ["unaccounted_subscriptions"])
    assert event["over_delivery"] is True and event["broker_count"] > event["known"]
