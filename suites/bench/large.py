"""Throughput of one large payload across two brokers: federated by their wrappers, and bridged, in the same run.

`python -m suites.bench.large --size 16777216 --qos 1 --runs 5`: two Mosquitto brokers on
loopback joined by wrappers (the default settings: bulk transfers, docs/protocol.md), then two joined by a
Mosquitto bridge (`topic # out QOS`); for each run a paho subscriber on the second broker and a paho publisher on
the first, the time from the publish call to the last byte at the subscriber (checked byte for byte). Prints the
median and the spread per setup, and MiB/s (docs/benchmarks.md, "Large payloads").
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt

from federation.harness.processes import poll
from federation.tools.launch import BROKER_PORT, FederationNode, LocalFederation, line
from suites.bench.setups import BenchBrokers, bridge_lines


class Bridged(BenchBrokers):
    """Two brokers, the first bridged to the second with `topic # out QOS`."""

    def __init__(self, workdir: Path, first_address: str, qos: int) -> None:
        super().__init__(["a", "b"], [], workdir, first_address, bridges=True)
        self.qos = qos

    def extra_conf(self, node: FederationNode) -> list[str] | None:
        target = self.next_broker(node)
        if target is None:
            return None
        return bridge_lines(node.index, target.host, topic="#", qos=self.qos, label="large")


def _client(host: str, name: str) -> mqtt.Client:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"large-{name}-{uuid.uuid4().hex[:6]}")
    client.connect(host, BROKER_PORT)
    client.loop_start()
    return client


def one_run(brokers: LocalFederation, size: int, qos: int, wait_mesh: bool, timeout: float = 120.0) -> float:
    """Seconds from publishing `size` random bytes on broker a to receiving them whole on broker b."""
    topic = f"large/{uuid.uuid4().hex[:8]}"
    payload = os.urandom(size)
    got = threading.Event()
    received: list[bytes] = []

    def on_message(_client: mqtt.Client, _userdata: object, message: mqtt.MQTTMessage) -> None:
        received.append(bytes(message.payload))
        got.set()

    subscribed = threading.Event()
    subscriber = _client(brokers.node("b").host, "sub")
    subscriber.on_message = on_message
    subscriber.on_subscribe = lambda *_args: subscribed.set()
    publisher = _client(brokers.node("a").host, "pub")
    try:
        subscriber.subscribe(topic, qos)
        if not subscribed.wait(10):
            raise RuntimeError("the subscriber was not acknowledged")
        if wait_mesh:
            brokers.wait_mesh(topic)
        else:
            time.sleep(0.5)  # the bridge forwards `#`: nothing to wait for but the subscription itself
        started = time.monotonic()
        publisher.publish(topic, payload, qos)
        if not got.wait(timeout):
            raise RuntimeError(f"{size} bytes did not arrive within {timeout} s")
        elapsed = time.monotonic() - started
        if received[0] != payload:
            raise RuntimeError("the payload arrived changed")
        return elapsed
    finally:
        for client in (publisher, subscriber):
            client.loop_stop()
            client.disconnect()


def measure(kind: str, workdir: Path, first_address: str, size: int, qos: int, runs: int) -> list[float]:
    brokers: LocalFederation
    if kind == "federation":
        brokers = LocalFederation(["a", "b"], line(["a", "b"]), workdir / kind, {"stats_interval": 1.0},
                                  first_address=first_address)
        brokers.start()
        brokers.wait_converged(timeout=30)
    else:
        brokers = Bridged(workdir / kind, first_address, qos)
        brokers.start_brokers()
        poll(lambda: "large-bridge-0" in brokers.node("b").broker_log.read_text(errors="replace"), 30,
             lambda: "the bridge to connect")
    try:
        return [one_run(brokers, size, qos, kind == "federation") for _ in range(runs)]
    finally:
        brokers.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=16 * 1024 * 1024, help="payload bytes (default 16 MiB)")
    parser.add_argument("--qos", type=int, default=1, choices=(0, 1, 2))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--subnet", type=int, default=231, help="127.0.N.10 and 127.0.N+1.10 are used")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-large-") as directory:
        for offset, kind in enumerate(("federation", "bridge")):
            times = measure(kind, Path(directory), f"127.0.{args.subnet + offset}.10", args.size, args.qos, args.runs)
            median = statistics.median(times)
            print(f"{kind:10} {args.size} bytes QoS {args.qos}: median {median:.3f} s "
                  f"({args.size / median / 2**20:.1f} MiB/s), min {min(times):.3f} s, max {max(times):.3f} s, "
                  f"{len(times)} runs", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
