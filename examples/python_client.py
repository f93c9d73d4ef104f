#!/usr/bin/env python3
"""Two ordinary paho-mqtt 2.x clients on two different brokers of a running federation.

    make demo                               # in one terminal: 5 brokers on 127.0.0.10-14
    python3 examples/python_client.py       # in another

The subscriber connects to one broker (default 127.0.0.12, the demo's n2)
and subscribes to `demo/python/#`; the publisher connects to another
(default 127.0.0.10, n0) and publishes readings there. Neither client knows
about the federation: they are plain MQTT clients of their own broker, and
the wrappers beside the brokers carry the readings across. Each reading
arrives once; the script prints it with its end-to-end latency.

A new subscription takes the federation a moment to learn (the wrapper reads
it from its broker's log, then the overlay elects a topic core and joins the
mesh: well under a second on loopback), so the script first publishes small
probes until one comes through, then the real readings.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode


def connect(host: str, port: int, client_id: str) -> mqtt.Client:
    """An MQTT v5 client, connected, with its network thread running; exits with a message if it cannot."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    connected = threading.Event()

    def on_connect(client: mqtt.Client, userdata: Any, flags: Any, reason_code: ReasonCode,
                   properties: Properties | None) -> None:
        if not reason_code.is_failure:
            connected.set()

    client.on_connect = on_connect
    try:
        client.connect(host, port)
    except OSError as error:
        sys.exit(f"cannot connect to the broker at {host}:{port} ({error}); is the federation running? "
                 f"(`make demo` starts one on 127.0.0.10-14)")
    client.loop_start()
    if not connected.wait(5):
        client.loop_stop()
        sys.exit(f"the broker at {host}:{port} did not accept the connection")
    sock = client.socket()
    if isinstance(sock, socket.socket):  # paho leaves Nagle on: ~10 ms extra per small message
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--publish-host", default="127.0.0.10", help="broker the publisher uses (default n0)")
    parser.add_argument("--subscribe-host", default="127.0.0.12", help="broker the subscriber uses (default n2)")
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--topic", default="demo/python", help="topic prefix (default demo/python)")
    parser.add_argument("--count", type=int, default=10, help="readings to publish (default 10)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between readings (default 0.5)")
    parser.add_argument("--qos", type=int, choices=(0, 1, 2), default=1)
    options = parser.parse_args(argv)

    received: list[tuple[str, dict[str, Any], float]] = []
    probes_seen = threading.Event()
    lock = threading.Lock()

    def on_message(client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        arrived = time.time()
        if message.topic.endswith("/probe"):
            probes_seen.set()
            return
        reading = json.loads(message.payload)
        with lock:
            received.append((message.topic, reading, arrived))
        latency_ms = (arrived - reading["sent_at"]) * 1000
        print(f"  subscriber on {options.subscribe_host} got {message.topic} {reading['celsius']} C "
              f"(reading #{reading['seq']}, QoS {message.qos}, {latency_ms:.1f} ms after publishing)")

    subscriber = connect(options.subscribe_host, options.port, "python-example-subscriber")
    subscriber.on_message = on_message
    subscribed = threading.Event()
    subscriber.on_subscribe = lambda *args: subscribed.set()
    subscriber.subscribe(f"{options.topic}/#", qos=options.qos)
    if not subscribed.wait(5):
        sys.exit("the subscription was not acknowledged")
    print(f"subscriber: connected to {options.subscribe_host}, subscribed to {options.topic}/#")

    publisher = connect(options.publish_host, options.port, "python-example-publisher")
    print(f"publisher:  connected to {options.publish_host}")

    print("waiting for the federation to carry the new subscription (publishing probes)...")
    deadline = time.monotonic() + 15
    while not probes_seen.wait(0.1):
        publisher.publish(f"{options.topic}/probe", b"", qos=0)
        if time.monotonic() > deadline:
            sys.exit(f"no probe from {options.publish_host} reached {options.subscribe_host} in 15 s: are both "
                     f"brokers in the same running federation? (`python3 wrapper.py status --node HOST:10500`)")
    print("the path exists; publishing readings:")

    for seq in range(1, options.count + 1):
        reading = {"seq": seq, "celsius": round(20 + seq / 10, 1), "sent_at": time.time()}
        publisher.publish(f"{options.topic}/kitchen/temperature", json.dumps(reading), qos=options.qos)
        time.sleep(options.interval)

    # Wait (briefly) for the last readings still on their way.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with lock:
            if len(received) >= options.count:
                break
        time.sleep(0.05)
    time.sleep(0.2)  # a second copy, if there ever were one, would show up here
    for client in (publisher, subscriber):
        client.disconnect()
        client.loop_stop()

    with lock:
        sequence = [reading["seq"] for _, reading, _ in received]
    duplicates = len(sequence) - len(set(sequence))
    print(f"published {options.count}, received {len(set(sequence))} distinct, {duplicates} duplicates")
    return 0 if sorted(sequence) == list(range(1, options.count + 1)) else 1


if __name__ == "__main__":
    sys.exit(main())
