"""Retained messages across a real federation (docs/protocol.md rule 10): real Mosquitto brokers (no persistence,
configs/mosquitto.conf) and wrappers on a line n0-n1-n2, plain MQTT v5 clients.

The transparency suite (test_transparency_real.py) compares retained cases with one broker; here what only a
federation has: the newest value wins when two brokers publish on one topic, every wrapper's store holds it, and
a broker restarted without persistence gets the retained values back from its wrapper's store.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from federation.harness.processes import find_tool
from federation.tools.launch import LocalFederation, line, node_names
from suites.faults.packet_filter import Cut, PacketFilter

from broker_util import requires_mosquitto, wait_for
from federation_util import FAST_SETTINGS, next_first_address

pytestmark = requires_mosquitto


class Client:
    """A paho MQTT v5 client on one broker: the (payload, retain) of every message it received."""

    def __init__(self, host: str, client_id: str) -> None:
        self.received: list[tuple[bytes, bool]] = []
        self.lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.client.on_message = self._on_message
        self.client.connect(host, 1883)
        self.client.loop_start()

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.received.append((bytes(message.payload), bool(message.retain)))

    def messages(self) -> list[tuple[bytes, bool]]:
        with self.lock:
            return list(self.received)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[LocalFederation]:
    names = node_names(3)
    started = LocalFederation(names, line(names), tmp_path / "federation", FAST_SETTINGS,
                              first_address=next_first_address())
    try:
        started.start()
        started.wait_converged(timeout=20)
        yield started
    finally:
        started.stop()


def retained_store(federation: LocalFederation, name: str) -> dict[str, Any]:
    store: dict[str, Any] = federation.status(name)["daemon"]["broker"]["retained"]
    return store


def late_subscriber(federation: LocalFederation, name: str, client_id: str, topic: str) -> Client:
    client = Client(federation.node(name).host, client_id)
    client.client.subscribe(topic, 1)
    return client


def test_the_newest_retained_value_is_on_every_broker_and_comes_back_after_a_broker_restart(
        federation: LocalFederation) -> None:
    publishers = [Client(federation.node(name).host, f"pub-{name}") for name in ("n0", "n2")]
    clients: list[Client] = list(publishers)
    try:
        publishers[0].client.publish("rt/status", b"v1", qos=1, retain=True).wait_for_publish(5)
        wait_for(lambda: all(retained_store(federation, name)["stored"] == 1 for name in ("n0", "n1", "n2")),
                 timeout=10, message="v1 in every wrapper's retained store")
        publishers[1].client.publish("rt/status", b"v2", qos=1, retain=True).wait_for_publish(5)
        wait_for(lambda: all(retained_store(federation, name)["stored"] == 2 for name in ("n0", "n1", "n2")),
                 timeout=10, message="v2 in every wrapper's retained store")
        for name in ("n0", "n1", "n2"):  # nobody subscribed anywhere: each broker holds v2 itself
            late = late_subscriber(federation, name, f"late-{name}", "rt/status")
            clients.append(late)
            wait_for(lambda late=late: late.messages() == [(b"v2", True)], timeout=5,
                     message=lambda late=late, name=name: f"v2, retained, on {name}; got {late.messages()}")
        federation.restart_broker("n2")  # persistence false: its retained messages are gone
        wait_for(lambda: retained_store(federation, "n2")["reinjected"] == 1, timeout=15,
                 message=lambda: f"n2's wrapper to give v2 back: {retained_store(federation, 'n2')}")
        again = late_subscriber(federation, "n2", "after-restart", "rt/status")
        clients.append(again)
        wait_for(lambda: again.messages() == [(b"v2", True)], timeout=5,
                 message=lambda: f"v2 after n2's restart; got {again.messages()}")
        publishers[0].client.publish("rt/status", b"", qos=1, retain=True).wait_for_publish(5)  # deleted
        wait_for(lambda: retained_store(federation, "n2")["tombstones"] == 1, timeout=10,
                 message="the deletion at n2")
        gone = late_subscriber(federation, "n1", "after-delete", "rt/#")
        clients.append(gone)
        gone.client.publish("rt/fence", b"f", qos=1)  # after its SUBSCRIBE on the same connection: in order
        wait_for(lambda: bool(gone.messages()), timeout=5, message="the fence")
        assert gone.messages()[0] == (b"f", False)  # the broker answered the SUBSCRIBE with no retained value
        assert all(retained_store(federation, name)["stale"] == 0 for name in ("n0", "n1", "n2"))
    finally:
        for client in clients:
            client.close()


def test_values_published_while_a_wrapper_was_away_reach_its_broker_when_it_comes_back(
        federation: LocalFederation) -> None:
    """QoS 0 retained publications (an update, a new topic, a deletion) made while n2's wrapper is stopped never
    cross on the tree; when it starts again, the stores' anti-entropy (rule 10: `rd`, `rs`, `rr`, `rv`) brings its
    store and its broker the newest values."""
    publisher = Client(federation.node("n0").host, "pub-n0")
    clients: list[Client] = [publisher]
    try:
        for topic, payload in (("rt/a", b"v1"), ("rt/gone", b"g1")):
            publisher.client.publish(topic, payload, qos=1, retain=True).wait_for_publish(5)
        wait_for(lambda: retained_store(federation, "n2")["stored"] == 2, timeout=10,
                 message="both values in n2's retained store")
        federation.stop_wrapper("n2")
        wait_for(lambda: all(not neighbour["up"] for neighbour in federation.status("n1")["neighbours"]
                             if neighbour["address"].startswith(federation.node("n2").host + ":")),
                 timeout=10, message="n1 to see n2's wrapper gone")
        for topic, payload in (("rt/a", b"v2"), ("rt/new", b"n1"), ("rt/gone", b"")):
            publisher.client.publish(topic, payload, qos=0, retain=True).wait_for_publish(5)
        wait_for(lambda: retained_store(federation, "n1")["stored"] == 5, timeout=10,
                 message=lambda: f"the three at n1: {retained_store(federation, 'n1')}")
        federation.start_wrapper("n2")
        # a new life of the wrapper: its store came back from the state directory, its counts start at 0
        wait_for(lambda: retained_store(federation, "n2")["stored"] == 3, timeout=15,
                 message=lambda: f"the three at n2 by the anti-entropy: {retained_store(federation, 'n2')}")
        late = late_subscriber(federation, "n2", "late-n2", "rt/#")
        clients.append(late)
        late.client.publish("rt/fence", b"f", qos=1)  # after its SUBSCRIBE on the same connection: in order
        wait_for(lambda: (b"f", False) in late.messages(), timeout=5, message="the fence")
        assert sorted(late.messages()) == [(b"f", False), (b"n1", True), (b"v2", True)]
        assert federation.status("n2")["counters"]["retained_values_injected"] == 3
    finally:
        for client in clients:
            client.close()


@pytest.mark.skipif(os.geteuid() != 0 or find_tool("nft") is None,
                    reason="the partition is an nftables rule: needs root and nftables")
def test_after_a_partition_heals_every_broker_holds_the_newest_retained_values(
        federation: LocalFederation) -> None:
    """n0-n1 | n2 cut (the wrappers' UDP between n1 and n2 dropped): QoS 0 retained publications on both sides,
    one topic updated on both (n0's later), one only on n2's side; after the heal every broker serves the newest."""
    hosts = {name: federation.node(name).host for name in ("n0", "n1", "n2")}
    publishers = {name: Client(hosts[name], f"pub-{name}") for name in ("n0", "n2")}
    clients: list[Client] = list(publishers.values())
    packet_filter = PacketFilter()
    try:
        cut = packet_filter.block(Cut((hosts["n1"],), (hosts["n2"],), "udp", federation.node("n1").wrapper_port))
        wait_for(lambda: not any(n["up"] for n in federation.status("n2")["neighbours"]), timeout=10,
                 message="n2 to see n1 down")
        publishers["n2"].client.publish("rt/x", b"right", qos=0, retain=True).wait_for_publish(5)
        publishers["n2"].client.publish("rt/y", b"right only", qos=0, retain=True).wait_for_publish(5)
        wait_for(lambda: retained_store(federation, "n2")["stored"] == 2, timeout=10, message="n2's two values")
        publishers["n0"].client.publish("rt/x", b"left", qos=0, retain=True).wait_for_publish(5)  # the newest
        wait_for(lambda: retained_store(federation, "n1")["stored"] == 1, timeout=10, message="n0's value at n1")
        packet_filter.unblock(cut)
        wait_for(lambda: [retained_store(federation, name)["stored"] for name in ("n0", "n1", "n2")] == [2, 2, 3],
                 timeout=20, message=lambda: "the newest everywhere: " + str(
                     {name: retained_store(federation, name) for name in ("n0", "n1", "n2")}))
        for name in ("n0", "n1", "n2"):
            late = late_subscriber(federation, name, f"late-{name}", "rt/#")
            clients.append(late)
            fence = b"fence " + name.encode()  # the other brokers' fences may come too: live, not retained
            late.client.publish("rt/fence", fence, qos=1)  # after its SUBSCRIBE on the same connection: in order
            wait_for(lambda late=late, fence=fence: (fence, False) in late.messages(), timeout=5,
                     message="the fence")
            assert sorted(m for m in late.messages() if m[1]) == [(b"left", True), (b"right only", True)], name
    finally:
        packet_filter.close()
        for client in clients:
            client.close()
