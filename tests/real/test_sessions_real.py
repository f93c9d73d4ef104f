"""MQTT 5 sessions on a real federation (issue 39): real Mosquitto brokers and wrappers, paho MQTT v5 clients.

Item 1, persistent sessions by MQTT 5's rules: a session lives as long as its Session Expiry Interval, whatever its
first CONNECT's clean start, and the broker's log says neither. The wrapper keeps an MQTT 5 client's filters when
its connection ends and settles the session's fate from the broker's `$SYS` counts
(federation.daemon.session_ledger): here a clean start without an expiry is found ended (its filters go, so the
federation stops carrying its topics to that broker) and one with an expiry is found kept (its filters stay, and
what is published meanwhile waits for it on its broker). The transparency suite compares the clients' view with
one broker (persistent-clean-start, persistent-killed); this module checks what the wrapper concluded.
"""

from __future__ import annotations

import threading
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from federation.tools.launch import BROKER_PORT, LocalFederation

from broker_util import requires_mosquitto, wait_for
from federation_util import make_federation_fixture, wait_known  # noqa: F401 - the fixture

pytestmark = requires_mosquitto


class Session:
    """A paho MQTT v5 client with a given clean start and session expiry; records what it receives."""

    def __init__(self, host: str, client_id: str, clean_start: bool, expiry: int) -> None:
        self.received: list[tuple[str, bytes]] = []
        self.session_present: bool | None = None
        self.lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5,
                                  reconnect_on_failure=False)
        self.client.on_message = self._on_message
        connected = threading.Event()

        def on_connect(client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
            self.session_present = bool(flags.session_present)
            connected.set()

        self.client.on_connect = on_connect
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = expiry
        self.client.connect(host, BROKER_PORT, clean_start=clean_start, properties=properties)
        self.client.loop_start()
        assert connected.wait(10), f"{client_id} did not connect to {host}"

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.received.append((message.topic, bytes(message.payload)))

    def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        done = threading.Event()
        self.client.on_subscribe = lambda *args: done.set()
        self.client.subscribe(topic_filter, qos)
        assert done.wait(10), f"no SUBACK for {topic_filter}"

    def messages(self) -> list[tuple[str, bytes]]:
        with self.lock:
            return list(self.received)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def publish(host: str, topic: str, payload: bytes, qos: int = 1) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.connect(host, BROKER_PORT)
    client.loop_start()
    try:
        client.publish(topic, payload, qos=qos).wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()


def local_filters(federation: LocalFederation, node: str) -> dict[str, Any]:
    subscriptions: dict[str, Any] = federation.status(node).get("local_subscriptions", {})
    return subscriptions


def sessions_status(federation: LocalFederation, node: str) -> dict[str, Any]:
    status: dict[str, Any] = federation.status(node)["daemon"]["broker"]["sessions"]
    return status


def wait_settled(federation: LocalFederation, node: str, gone: tuple[str, ...], kept: tuple[str, ...]) -> None:
    """Until the node's wrapper holds no filter of `gone` and still those of `kept`, with no session unsure."""
    def settled() -> bool:
        filters = local_filters(federation, node)
        return not any(client in filters for client in gone) and all(client in filters for client in kept) \
            and sessions_status(federation, node)["unsure"] == 0

    # Mosquitto counts every `sys_interval` (1 s in configs/mosquitto.conf: a round every 2 s); a round or two.
    wait_for(settled, 15, interval=0.2, message=lambda: (
        f"{node}'s wrapper to drop the filters of {gone} and keep those of {kept}: it holds "
        f"{local_filters(federation, node)}, sessions {sessions_status(federation, node)}"))


def wait_following(federation: LocalFederation, node: str) -> None:
    """Until the node's wrapper follows its broker's counts: after it subscribed, they are the broker's retained
    ones and a round follows that it saw in part; sessions that end meanwhile stay unsure (the safe side)."""
    wait_for(lambda: sessions_status(federation, node)["following"], 10, interval=0.2,
             message=lambda: f"{node}'s wrapper to follow its broker's counts: {sessions_status(federation, node)}")


def test_the_broker_counts_settle_which_mqtt_5_sessions_outlived_their_connection(make_federation: Any) -> None:
    federation: LocalFederation = make_federation(2, "line")
    wait_following(federation, "n1")
    far = federation.node("n1").host
    ended = Session(far, "ends-with-connection", clean_start=True, expiry=0)
    kept = Session(far, "kept-for-5-minutes", clean_start=True, expiry=300)
    ended.subscribe("sessions/ended/#")
    kept.subscribe("sessions/kept/#")
    wait_known(federation, "n1", "ends-with-connection", "sessions/ended/#")
    wait_known(federation, "n1", "kept-for-5-minutes", "sessions/kept/#")
    ended.close()
    wait_settled(federation, "n1", gone=("ends-with-connection",), kept=("kept-for-5-minutes",))
    kept.close()
    wait_for(lambda: sessions_status(federation, "n1")["confirmed_kept"] >= 1, 15, interval=0.2,
             message=lambda: f"the kept session confirmed: {sessions_status(federation, 'n1')}")
    wait_settled(federation, "n1", gone=("ends-with-connection",), kept=("kept-for-5-minutes",))
    assert sessions_status(federation, "n1")["ended"] >= 1
    # The kept session's broker still gets what is published for it, and keeps it for the client.
    federation.wait_mesh("sessions/kept/#")
    publish(federation.node("n0").host, "sessions/kept/1", b"while away")
    back = Session(far, "kept-for-5-minutes", clean_start=False, expiry=300)
    try:
        assert back.session_present
        wait_for(lambda: back.messages() == [("sessions/kept/1", b"while away")], 10,
                 message=lambda: f"the queued message at the returning session; it got {back.messages()}")
    finally:
        back.close()


def test_sessions_that_end_in_one_round_are_told_apart_when_one_comes_back(make_federation: Any) -> None:
    """Two sessions with one filter each leave in the same round, one of them for good: the counts cannot tell
    which (both filters stay: over-delivery, counted `undecided`), until the other one comes back and finds its
    session kept; then the first is known to have ended."""
    federation: LocalFederation = make_federation(2, "line")
    wait_following(federation, "n1")
    far = federation.node("n1").host
    ended = Session(far, "twin-ended", clean_start=True, expiry=0)
    kept = Session(far, "twin-kept", clean_start=True, expiry=300)
    ended.subscribe("twins/a/#")
    kept.subscribe("twins/b/#")
    wait_known(federation, "n1", "twin-ended", "twins/a/#")
    wait_known(federation, "n1", "twin-kept", "twins/b/#")
    rounds = sessions_status(federation, "n1")["rounds"]
    ended.close()
    kept.close()
    wait_for(lambda: sessions_status(federation, "n1")["rounds"] >= rounds + 2, 10, interval=0.2,
             message="two rounds of the broker's counts")
    filters = local_filters(federation, "n1")
    if "twin-ended" in filters:  # (both left in one round: undecided, both kept for now)
        assert "twin-kept" in filters and sessions_status(federation, "n1")["unsure"] == 2
    back = Session(far, "twin-kept", clean_start=False, expiry=300)
    try:
        assert back.session_present
        wait_settled(federation, "n1", gone=("twin-ended",), kept=("twin-kept",))
    finally:
        back.close()
