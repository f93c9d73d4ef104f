"""Overload on real parts: three Mosquitto brokers and wrappers in a line n0 - n1 - n2, QoS 0 floods
on n0 and n2 into a subscriber on n1, so the middle wrapper receives twice what either sender sends.

The claim: the links stay up (hellos are handled ahead of the data backlog) and every publication the
outer wrappers took from their brokers is delivered by n1 or reported as dropped with a reason; a loss
in the kernel's receive buffer (which the wrapper cannot count) is read from /proc/net/udp and must be
zero for the test to make that claim.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from federation.tools.launch import BROKER_PORT, LaunchError, LocalFederation

from broker_util import mosquitto_pub
from federation_util import (  # noqa: F401 - fixtures
    Clients,
    clients_fixture,
    flush_event_logs,
    make_federation_fixture,
    publication_events,
    wait_for,
)

FLOOD = 15000
"""QoS 0 publications per sending broker"""
SENDERS = ("n0", "n2")
SETTINGS: dict[str, Any] = {
    "hello_interval": 0.5,
    "dead_intervals": 3,  # down after 1.5 s without an echo: half the default 3 s
    "announce_interval": 1.0,
    "stats_interval": 0.5,
}


def udp_drops(host: str, port: int) -> int | None:
    """The kernel's count of datagrams dropped at the UDP socket bound to host:port (/proc/net/udp)."""
    try:
        lines = Path("/proc/net/udp").read_text().splitlines()[1:]
    except OSError:
        return None
    octets = [int(part) for part in host.split(".")]
    local = f"{octets[3]:02X}{octets[2]:02X}{octets[1]:02X}{octets[0]:02X}:{port:04X}"
    for line in lines:
        fields = line.split()
        if fields[1] == local:
            return int(fields[-1])
    return None


@pytest.mark.slow
def test_qos0_flood_keeps_the_link_up_and_counts_every_loss(make_federation: Any, clients: Clients,
                                                           tmp_path: Path) -> None:
    federation: LocalFederation = make_federation(3, "line", settings=SETTINGS)
    prefix = f"overload/{uuid.uuid4().hex[:8]}"
    subscriber = clients.subscribe(federation, "n1", f"{prefix}/#")
    federation.wait_mesh(subscriber.topic_filter)
    receiver = federation.node("n1")
    drops_before = udp_drops(receiver.host, receiver.wrapper_port) or 0
    payload = tmp_path / "payload"
    payload.write_bytes(b"p" * 200)
    started = time.monotonic()
    floods = [clients.processes.start(mosquitto_pub(BROKER_PORT, "-t", f"{prefix}/{name}", "-q", "0", "-f",
                                                     str(payload), "--repeat", str(FLOOD),
                                                     host=federation.node(name).host))
              for name in SENDERS]
    max_backlog = 0

    def overload(name: str) -> dict[str, Any] | None:
        """The wrapper's `daemon.overload` status, None when it is too busy to answer within the timeout."""
        try:
            status = federation.status(name, timeout=3.0)
        except LaunchError:  # a busy wrapper answers late; the next poll asks again
            return None
        return dict((status.get("daemon") or {}).get("overload") or {})

    def flooded() -> bool:
        nonlocal max_backlog
        seen = overload("n1")
        if seen is not None:
            max_backlog = max(max_backlog, int(seen.get("receive_backlog", 0)))
        return all(process.poll() is not None for process in floods)

    wait_for(flooded, 120, interval=0.2, message="the publishers to finish")

    def settled() -> bool:  # both wrappers idle: nothing waiting to be handled
        seen = [overload(name) for name in federation.nodes]
        return all(s is not None and s.get("receive_backlog") == 0 for s in seen)

    wait_for(settled, 120, interval=0.5, message="the wrappers to work off their backlogs")
    flush_event_logs(federation)
    elapsed = time.monotonic() - started
    kernel_drops = (udp_drops(receiver.host, receiver.wrapper_port) or 0) - drops_before

    events = publication_events(federation, prefix)
    originated = {e["pub"] for name in SENDERS for e in events[name] if e["type"] == "publication_originated"}
    delivered = {e["pub"] for e in events["n1"] if e["type"] == "publication_delivered"}
    dropped = {e["pub"]: e["reason"] for name in federation.nodes for e in events[name]
               if e["type"] == "publication_dropped"}
    downs = [e for name in federation.nodes for e in federation.events(name, ["neighbour_down"])]
    statuses = {name: federation.status(name) for name in federation.nodes}
    summary = (f"{len(originated)} originated, {len(delivered)} delivered, dropped "
               f"{dict(Counter(dropped.values()))}, kernel drops {kernel_drops}, max receive backlog {max_backlog}, "
               f"{elapsed:.1f} s; n1 drops {statuses['n1'].get('drops')}")
    print(summary)
    assert len(originated) > FLOOD // 2, summary  # the wrappers took a good part of the floods
    assert kernel_drops == 0, f"the kernel dropped datagrams the wrapper could not count; {summary}"
    silent = originated - delivered - set(dropped)
    assert not silent, f"{len(silent)} publications neither delivered nor reported; {summary}"
    assert downs == [], f"neighbour declared down under load: {[(e['node'], e['neighbour']) for e in downs]}; {summary}"
    assert subscriber.wait_for_count(len(delivered), timeout=30)


PACED_FLOOD = 50000
"""QoS 0 publications per sending broker in the paced flood: several seconds of work for the middle wrapper"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "with-properties"])
def test_a_sustained_qos0_flood_is_paced_not_dropped(kind: str, make_federation: Any, clients: Clients,
                                                     tmp_path: Path) -> None:
    """n0 - n1 - n2, floods from n0 and n2 into a subscriber on n1: the subscriber receives every publication
    once. Plain QoS 0 travels in `tb` runs, which n1 may well keep up with; publications with a user property
    travel as one `tm` each, which it cannot, so n1 must tell n0 and n2 `rb` and they stop reading their
    brokers meanwhile (federation.protocol.pacing)."""
    federation: LocalFederation = make_federation(3, "line", settings=SETTINGS)
    prefix = f"paced/{uuid.uuid4().hex[:8]}"
    subscriber = clients.subscribe(federation, "n1", f"{prefix}/#")
    federation.wait_mesh(subscriber.topic_filter)
    payload = tmp_path / "payload"
    payload.write_bytes(b"p" * 64)
    properties = (["-V", "mqttv5", "-D", "publish", "user-property", "k", "v"] if kind == "with-properties" else [])
    # Drops before the flood are the start's (a hello that named a peer's epoch before it knew it): not the flood's.
    before = {name: dict(federation.status(name).get("drops") or {}) for name in federation.nodes}
    floods = [clients.processes.start(mosquitto_pub(BROKER_PORT, "-t", f"{prefix}/{name}", "-q", "0", "-f",
                                                     str(payload), "--repeat", str(PACED_FLOOD), *properties,
                                                     host=federation.node(name).host))
              for name in SENDERS]
    expected = PACED_FLOOD * len(floods)
    wait_for(lambda: all(flood.poll() is not None for flood in floods), 120, interval=0.2,
             message="the publishers to finish")

    def lines() -> int:  # counted, not parsed: parsing 100,000 lines at every poll would load the machine
        return subscriber.output.read_bytes().count(b"\n") if subscriber.output.exists() else 0

    def status_summary() -> str:
        statuses = {name: federation.status(name) for name in federation.nodes}
        return "; ".join(f"{name}: pacing {status.get('pacing')}, drops {status.get('drops')}"
                         for name, status in statuses.items())

    wait_for(lambda: lines() >= expected, 180, interval=0.5,
             message=lambda: f"{expected} messages at n1, got {lines()}; {status_summary()}")
    statuses = {name: federation.status(name) for name in federation.nodes}
    summary = f"{lines()} of {expected} arrived; {status_summary()}"
    print(summary)
    dropped = {name: {reason: count - before[name].get(reason, 0)
                      for reason, count in (status.get("drops") or {}).items() if count > before[name].get(reason, 0)}
               for name, status in statuses.items()}
    assert not any(dropped.values()), f"{summary}; during the flood: {dropped}"
    if kind == "with-properties":
        assert statuses["n1"]["pacing"]["sent"] > 0, summary
        assert all(statuses[name]["pacing"]["received"] > 0 for name in SENDERS), summary
    messages = subscriber.wait_for_count(expected)
    assert Counter(message.topic for message in messages) == {f"{prefix}/{name}": PACED_FLOOD for name in SENDERS}
