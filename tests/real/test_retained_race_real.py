"""Concurrent retained writes on different brokers converge (issue 39, item 4): real Mosquitto brokers and wrappers,
plain MQTT v5 clients.

Two clients on different brokers publish a retained value on the same topic at the same instant, for many topics at
once. One broker always ends with one value per topic (the last it processed). The federation must end the same
way: every broker serving the same value for each topic, within a few seconds, and staying so; before issue 39 a
wrapper stamped its local write when it read it from its broker, after its broker had already stored the remote
write the wrapper injected meanwhile, and 10 to 19 of 20 topics were left with different values on different
brokers for good (docs/protocol.md rule 10, "Newest wins").

Counted at the clients: each broker is read by a fresh subscriber (retain handling 0), as a client that connects
later would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from federation.tools.launch import BROKER_PORT, LocalFederation

from broker_util import requires_mosquitto, wait_for
from federation_util import make_federation_fixture  # noqa: F401 - the fixture

pytestmark = requires_mosquitto

TOPICS = 20
ROUNDS = 3
CONVERGE_WITHIN = 5.0
"""seconds after the last write by which every broker must serve the same value for every topic"""


class Writer:
    """A connected paho MQTT v5 client that publishes when told (a barrier makes the writers of a round start at
    the same instant)."""

    def __init__(self, host: str, client_id: str) -> None:
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        connected = threading.Event()
        self.client.on_connect = lambda *args: connected.set()
        self.client.connect(host, BROKER_PORT)
        self.client.loop_start()
        assert connected.wait(10), f"writer {client_id} did not connect to {host}"
        self.client.socket().setsockopt(6, 1, 1)  # TCP_NODELAY: the writes leave at once

    def write(self, items: Sequence[tuple[str, bytes]], qos: int) -> None:
        """Publish them retained, and return once the broker has processed them all (at QoS 0, a QoS 1
        publication behind them, on a topic nobody reads, has its PUBACK: the broker handles a connection's packets
        in order)."""
        infos = [self.client.publish(topic, payload, qos=qos, retain=True) for topic, payload in items]
        if not qos:
            infos = [self.client.publish("race-writer-done", b"", qos=1)]
        for info in infos:
            info.wait_for_publish(10)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def retained_values(host: str, prefix: str, count: int, timeout: float = 1.0) -> dict[str, bytes]:
    """What a new subscriber of `prefix/#` on `host` gets as retained messages (topic -> payload)."""
    found: dict[str, bytes] = {}
    lock = threading.Lock()

    def on_message(client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        if message.retain:
            with lock:
                found[message.topic] = bytes(message.payload)

    reader = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    reader.on_message = on_message
    reader.connect(host, BROKER_PORT)
    reader.loop_start()
    try:
        reader.subscribe(f"{prefix}/#", 1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with lock:
                if len(found) >= count:
                    break
            time.sleep(0.02)
        time.sleep(0.1)  # anything still on its way after the last expected one
        with lock:
            return dict(found)
    finally:
        reader.disconnect()
        reader.loop_stop()


def disagreements(values: dict[str, dict[str, bytes]], topics: Sequence[str]) -> dict[str, dict[str, bytes | None]]:
    """topic -> broker -> value, for the topics whose value is not the same on every broker."""
    differing: dict[str, dict[str, bytes | None]] = {}
    for topic in topics:
        seen = {broker: found.get(topic) for broker, found in values.items()}
        if len(set(seen.values())) > 1 or None in seen.values():
            differing[topic] = seen
    return differing


@pytest.mark.parametrize("qos", [0, 1])
def test_concurrent_retained_writes_on_different_brokers_converge(make_federation: Any, qos: int) -> None:
    federation: LocalFederation = make_federation(3, "line")
    names = list(federation.nodes)
    ends = (names[0], names[-1])
    writers = {name: Writer(federation.node(name).host, f"racer-{name}") for name in (*ends, names[1])}
    try:
        for round_number in range(ROUNDS):
            prefix = f"race{qos}/{round_number}"
            topics = [f"{prefix}/t{index}" for index in range(TOPICS)]
            barrier = threading.Barrier(len(writers))

            def race(name: str, writer: Writer, topics: list[str] = topics,
                     barrier: threading.Barrier = barrier, round_number: int = round_number) -> None:
                barrier.wait(10)
                writer.write([(topic, f"{name}-{round_number}-{topic}".encode()) for topic in topics], qos)

            threads = [threading.Thread(target=race, args=(name, writer)) for name, writer in writers.items()]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            written = time.monotonic()
            values: dict[str, dict[str, bytes]] = {}

            def converged(topics: list[str] = topics, prefix: str = prefix,
                          values: dict[str, dict[str, bytes]] = values) -> bool:
                values.clear()
                values.update({name: retained_values(federation.node(name).host, prefix, len(topics))
                               for name in names})
                return not disagreements(values, topics)

            wait_for(converged, CONVERGE_WITHIN, interval=0.2, message=lambda topics=topics, values=values: (
                f"every broker serving the same retained value within {CONVERGE_WITHIN:g} s of the race; "
                f"differing topics: {disagreements(values, topics)}"))
            took = time.monotonic() - written
            # And it stays so: nothing later moves a broker off the common value.
            time.sleep(1.0)
            again = {name: retained_values(federation.node(name).host, prefix, len(topics)) for name in names}
            assert again == values, f"round {round_number}: the values moved after converging ({took:.1f} s)"
        orders = {name: {**federation.status(name)["daemon"]["broker"]["retained"]["order"],
                         **{key: federation.status(name)["daemon"]["broker"]["retained_scan"][key]
                            for key in ("checks", "repaired")}} for name in names}
        print(f"\nretained race qos {qos}: the order of each wrapper's broker writes: {orders}")
    finally:
        for writer in writers.values():
            writer.close()
