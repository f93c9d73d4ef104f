"""A QoS 2 stream across repeated restarts of the publisher's broker (issue 39, item 2), counted at the subscriber.

Real Mosquitto brokers (no persistence, configs/mosquitto.conf) and wrappers on a line n0-n1; a paho MQTT v5
publisher on n0 publishes numbered QoS 2 publications one at a time (each waited for, as a careful client does,
and sent again by paho after a reconnection); a paho subscriber on n1 counts them. n0's broker is killed (kill -9)
and started again six times in the middle of the stream.

Before issue 39 the wrapper kept the QoS 2 packet ids it had answered with PUBREC across such a restart, though the
broker came back without its session and numbered its messages from 1 again: a new message under one of those ids
had its PUBREC held for a PUBREL that never came, or, sent again with DUP later, was taken for a repeat and not
handed over (1 run in 9 lost an acknowledged publication: the spool skipped one packet id). The wrapper now
forgets them at a CONNACK without the session (tests/daemon/test_broker_session.py specifies the rule).

What is counted: every publication n0's wrapper took from its broker (its `publications_originated` events, one
topic per publication) reaches the subscriber once for each time it was taken, in order. What the broker
acknowledged and never gave the wrapper is lost by Mosquitto's own contract, as the subscriber of one broker
restarted so would lose it (docs/guarantees.md): publications it acknowledged while its wrapper had not subscribed
again yet after a restart (the publisher's reconnection can beat the wrapper's), and the one in flight when it
was killed. Each such loss must fall in a restart's window, from the kill until the wrapper's connection is back
(its `broker_connected` event); a loss outside one would be the wrapper's. A publication the publisher sent again
to a restarted broker that had already passed it on is taken twice (its PUBREC died with the broker), as on one
broker.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from federation.tools.launch import BROKER_PORT, LocalFederation

from broker_util import requires_mosquitto, wait_for
from federation_util import flush_event_logs, make_federation_fixture  # noqa: F401 - the fixture

pytestmark = requires_mosquitto

RESTARTS = 6
DOWN = 0.5
"""seconds n0's broker stays down each time"""
BETWEEN = 2.0
"""seconds of stream between two restarts"""


class Publisher(threading.Thread):
    """Publishes `s/1`, `s/2`, ... at QoS 2, one at a time: each is waited for (paho sends it again after a
    reconnection) before the next; `acknowledged` lists those paho saw completed."""

    def __init__(self, host: str) -> None:
        super().__init__(daemon=True)
        self.acknowledged: list[int] = []
        self.acknowledged_at: dict[int, float] = {}
        """number -> unix time its PUBCOMP was seen"""
        self.stop = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="restart-publisher", protocol=mqtt.MQTTv5)
        self.client.reconnect_delay_set(0.1, 0.5)  # type: ignore[arg-type]  # paho sleeps on floats
        self.client.connect(host, BROKER_PORT)
        self.client.loop_start()

    def run(self) -> None:
        number = 0
        while not self.stop.is_set():
            number += 1
            while not self.client.is_connected() and not self.stop.is_set():
                time.sleep(0.01)
            info = self.client.publish(f"s/{number}", str(number).encode(), qos=2)
            deadline = time.monotonic() + 30
            # `info._published`: paho raises from `is_published` for one published while the connection dropped,
            # which it still sends after the reconnection
            while not info._published and time.monotonic() < deadline:  # noqa: SLF001
                time.sleep(0.002)
            if info._published:  # noqa: SLF001
                self.acknowledged.append(number)
                self.acknowledged_at[number] = time.time()
            time.sleep(0.003)

    def close(self) -> None:
        self.stop.set()
        self.join(40)
        self.client.disconnect()
        self.client.loop_stop()


def test_a_qos2_stream_crosses_repeated_restarts_of_its_publishers_broker(make_federation: Any) -> None:
    federation: LocalFederation = make_federation(2, "line")
    received: list[int] = []
    lock = threading.Lock()

    def on_message(client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with lock:
            received.append(int(message.topic.split("/")[1]))

    subscriber = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="restart-subscriber", protocol=mqtt.MQTTv5)
    subscriber.on_message = on_message
    subscribed = threading.Event()
    subscriber.on_subscribe = lambda *args: subscribed.set()
    subscriber.connect(federation.node("n1").host, BROKER_PORT)
    subscriber.loop_start()
    publisher: Publisher | None = None
    try:
        subscriber.subscribe("s/#", 2)
        assert subscribed.wait(10)
        federation.wait_mesh("s/#")
        publisher = Publisher(federation.node("n0").host)
        publisher.start()
        kills: list[float] = []
        for _ in range(RESTARTS):
            time.sleep(BETWEEN)  # the stream flows meanwhile
            kills.append(time.time())
            federation.stop_broker("n0", kill=True)
            time.sleep(DOWN)
            federation.start_broker("n0")
        time.sleep(BETWEEN)
        publisher.close()
        acknowledged = publisher.acknowledged
        flush_event_logs(federation, ["n0"])
        taken = [int(topic.split("/")[1]) for event in federation.events("n0", ["publications_originated"])
                 for topic in event.get("topics", []) if topic.startswith("s/")]
        wait_for(lambda: len(received) >= len(taken), 30, interval=0.1,
                 message=lambda: f"{len(taken)} publications at the subscriber, {len(received)} arrived")
        time.sleep(0.5)  # anything more (a duplicate) would come now
        with lock:
            got = list(received)
        assert sorted(got) == sorted(taken), (
            f"taken by n0's wrapper and never received: {sorted(set(taken) - set(got))}; received and never taken: "
            f"{sorted(set(got) - set(taken))}; counts differ: "
            f"{sorted(n for n in set(got) if got.count(n) != taken.count(n))}")
        assert got == sorted(got), f"out of order: {[(a, b) for a, b in zip(got, got[1:], strict=False) if b < a]}"
        back = sorted(event["t"] for event in federation.events("n0", ["broker_connected"]))
        windows = [(kill, next((t for t in back if t > kill), float("inf")) + 0.1) for kill in kills]
        lost_in_broker = sorted(set(acknowledged) - set(taken))
        unexplained = [number for number in lost_in_broker
                       if not any(start - 0.05 <= publisher.acknowledged_at[number] <= end for start, end in windows)]
        assert not unexplained, (f"acknowledged, never taken by the wrapper, and outside every restart's window: "
                                 f"{unexplained} (acknowledged at {[publisher.acknowledged_at[n] for n in unexplained]}"
                                 f", windows {windows})")
        assert len(acknowledged) > 500, f"the stream hardly flowed: {len(acknowledged)} acknowledged"
        print(f"\nQoS 2 across {RESTARTS} restarts of the publisher's broker: {len(acknowledged)} acknowledged, "
              f"{len(taken)} taken by its wrapper ({len(taken) - len(set(taken))} twice: sent again to a broker "
              f"that had passed them on), {len(got)} received, in order, once per taking; {len(lost_in_broker)} "
              f"lost in the broker while it restarted (before its wrapper was back): {lost_in_broker}")
    finally:
        if publisher is not None and publisher.is_alive():
            publisher.close()
        subscriber.disconnect()
        subscriber.loop_stop()
