"""A publication that reaches the subscriber's wrapper before the wrapper has read the subscription from its broker's
log (issue 36's churn misses; federation.daemon.subscription_fence).

Real Mosquitto brokers and wrappers on a line n0-n1, plain clients. n1's wrapper reaches its broker through a TCP
relay in the test, so the test can hold back what the broker sends the wrapper (its log lines among it) while the
client's own connection is direct: the client subscribes and gets its SUBACK, a publication is made on n0 and
reaches n1's wrapper, and only then does the wrapper read the subscribe line. The filter n1 federates is a covering
one (`dev/+/cmd`, three devices with `aggregate_fanout` 2), so the publication comes to n1 whether or not the wrapper
knows the new device's subscription: one broker delivers it (the SUBACK came before the publication), and so must the
federation. A publication for a device nobody subscribes to is counted as not subscribed here, not injected.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from federation.tools.launch import BROKER_PORT, FederationNode, LocalFederation

from broker_util import free_port, requires_mosquitto, wait_for
from federation_util import (
    FAST_SETTINGS,
    Clients,
    clients_fixture,  # noqa: F401 - the `clients` fixture
    next_first_address,
    topology_links,
)

pytestmark = requires_mosquitto

SETTINGS = {**FAST_SETTINGS, "aggregate_fanout": 2}
"""three device filters under `dev/+/cmd` are federated as that one"""


class Relay:
    """A TCP relay between a wrapper and its broker; `hold()` stops passing what the broker sends (it waits in the
    sockets and the broker), `release()` passes it again. The wrapper's own packets always pass."""

    def __init__(self, listen_host: str, broker_host: str) -> None:
        self.broker = (broker_host, BROKER_PORT)
        self.port = free_port(listen_host)
        self.listener = socket.create_server((listen_host, self.port))
        self.listener.settimeout(0.2)
        self.passing = threading.Event()
        self.passing.set()
        self.stopped = threading.Event()
        self.sockets: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                continue
            upstream = socket.create_connection(self.broker)
            self.sockets += [downstream, upstream]
            for source, sink, gate in ((downstream, upstream, None), (upstream, downstream, self.passing)):
                thread = threading.Thread(target=self._pump, args=(source, sink, gate), daemon=True)
                self.threads.append(thread)
                thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket, gate: threading.Event | None) -> None:
        source.settimeout(0.2)
        while not self.stopped.is_set():
            if gate is not None and not gate.wait(0.2):
                continue  # held: what the broker sends stays unread
            try:
                data = source.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            while gate is not None and not gate.wait(0.2) and not self.stopped.is_set():
                pass  # read while `hold` came: passed on only after `release`
            try:
                sink.sendall(data)
            except OSError:
                break
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def hold(self) -> None:
        self.passing.clear()

    def release(self) -> None:
        self.passing.set()

    def close(self) -> None:
        self.stopped.set()
        self.passing.set()
        self.listener.close()
        for end in self.sockets:
            end.close()
        for thread in self.threads:
            thread.join(2)


class RelayedFederation(LocalFederation):
    """A LocalFederation whose named wrappers reach their brokers through a `Relay`."""

    relays: dict[str, Relay]

    def _wrapper_command(self, node: FederationNode) -> list[str]:
        command = super()._wrapper_command(node)
        relay = self.relays.get(node.name)
        if relay is None:
            return command
        direct = f"{node.host}:{BROKER_PORT}"
        assert direct in command, command
        return [f"127.0.0.1:{relay.port}" if part == direct else part for part in command]


@pytest.fixture
def relayed(tmp_path: Any) -> Iterator[tuple[LocalFederation, Relay]]:
    names = ["n0", "n1"]
    federation = RelayedFederation(names, topology_links("line", names), tmp_path / "federation", SETTINGS,
                                   first_address=next_first_address())
    relay = Relay("127.0.0.1", federation.node("n1").host)
    federation.relays = {"n1": relay}
    try:
        federation.start_brokers()
        federation.start_wrappers()
        federation.wait_converged(timeout=20)
        yield federation, relay
    finally:
        federation.stop()
        relay.close()


def data_received(status: dict[str, Any]) -> int:
    """Publication packets (`tm`, `tq`, `tb`) the wrapper took from its neighbours."""
    received = status["received"]
    return sum(received.get(kind, [0])[0] for kind in ("tm", "tq", "tb"))


def test_a_publication_before_the_wrapper_read_the_subscription_is_delivered(
        relayed: tuple[LocalFederation, Relay], clients: Clients) -> None:
    federation, relay = relayed
    devices = [clients.subscribe(federation, "n1", f"dev/{device}/cmd", qos=1) for device in range(3)]

    def covered() -> bool:  # n0 routes `dev/+/cmd` to n1: a publication to a known device arrives
        clients.publish(federation, "n0", "dev/0/cmd", b"ready", qos=1)
        return devices[0].count("dev/0/cmd", b"ready") > 0
    wait_for(covered, 20, interval=0.5, message=lambda: f"dev/0/cmd from n0 at n1: {devices[0].received()}")

    late = clients.paho_subscriber(federation, "n1")
    def status() -> dict[str, Any]:
        return federation.status("n1")

    def hold_status() -> dict[str, Any]:
        return dict(status()["daemon"]["broker"].get("unmatched_hold", {}))

    relay.hold()
    try:
        late.subscribe("dev/77/cmd", qos=1)  # SUBACK: the broker has it; the wrapper has not read its log line
        before = data_received(status())
        clients.publish(federation, "n0", "dev/77/cmd", b"probe", qos=1)
        clients.publish(federation, "n0", "dev/88/cmd", b"nobody", qos=1)  # no subscriber anywhere
        wait_for(lambda: data_received(status()) >= before + 2, 10, interval=0.05,
                 message=lambda: f"n1's wrapper to take the two publications: {status()['received']}")
        assert "dev/77/cmd" not in status().get("local_subscriptions", {}).get(late.client_id, {}), \
            "the relay did not hold the log line back: the race was not made"
    finally:
        relay.release()
    wait_for(lambda: b"probe" in late.payloads(), 10, interval=0.05,
             message=lambda: f"the probe at the subscriber of dev/77/cmd; n1's hold: {hold_status()}")
    assert late.payloads() == [b"probe"]

    def settled() -> dict[str, Any] | None:
        hold = hold_status()
        return hold if hold["held"] == 0 and hold["not_subscribed"] >= 1 else None
    hold = wait_for(settled, 10, interval=0.05, message=lambda: f"n1's hold: {hold_status()}")
    assert hold["injected"] >= 1 and hold["dropped"] == 0, hold
    counters = status()["counters"]
    assert counters.get("publications_not_subscribed", 0) >= 1, counters
    assert all(payload != b"nobody" for device in devices for _topic, payload in device.received())
