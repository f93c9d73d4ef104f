"""Behind a load balancer (issue 39, item 5): HAProxy (the Debian package, TCP mode, round robin) in front of three
brokers of a federated line, and the same HAProxy in front of one broker (the reference), with the same clients:
paho and MQTT.js subscribers with persistent sessions, every client reconnecting every few seconds and so landing
on another broker each time, a QoS 1 and two QoS 2 streams (tests/lb_util.py, `STREAMS`); counted at the clients.

The federation must give what one broker gives: nothing lost, no client id connected on two brokers at once (for 2 s
or more: the brokers' logs count whole seconds), no QoS 2 message twice. QoS 1 duplicates are allowed (MQTT allows
them, and a session's handover gives the QoS 1 topic's other subscriber on its new broker a second copy of what it
had: docs/transparency.md); they are printed. The one loss unmodified Mosquitto brokers cannot always avoid is
allowed, as counted by the wrappers (drop `roaming_unreleased`): a QoS 2 message the client had taken and not been
released when its connection dropped, which the old broker's wrapper could not tell from the order its broker
processed them (`unreleased` less `unreleased_given`: federation/daemon/roaming_unreleased.py). The default run
takes 25 s of traffic, the reference beside the federation; `pytest -m lb_long` runs the same for five minutes
(`LB_LONG_SECONDS`), and a shared QoS 2 topic beside it, whose duplicates must all be copies the wrappers counted
(`shared_copies`).

Needs mosquitto, haproxy and, for the MQTT.js subscribers, Node.js with the `mqtt` package (scripts/install-deps.sh
installs all three; without MQTT.js paho subscribers take their place, said in the output).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from federation.tools.launch import BROKER_PORT, LocalFederation

from broker_util import requires_mosquitto, start_broker
from federation_util import make_federation_fixture, next_first_address  # noqa: F401 - the fixture
from lb_util import (
    HAVE_HAPROXY,
    HAVE_MQTTJS,
    SHARED_QOS2,
    STREAMS,
    LoadBalancedRun,
    LoadBalancer,
    Outcome,
    Stream,
    connected_twice,
)

pytestmark = [requires_mosquitto,
              pytest.mark.skipif(not HAVE_HAPROXY, reason="needs haproxy: apt-get install haproxy "
                                                          "(scripts/install-deps.sh)")]

SECONDS = 25.0
"""seconds of traffic in the default run"""


def reference(tmp_path: Path, seconds: float, streams: Sequence[Stream]) -> Outcome:
    broker = start_broker(tmp_path / "reference", extra_conf_lines=("sys_interval 1",))
    try:
        host = next_first_address().rsplit(".", 1)[0] + ".50"  # a loopback /24 of its own
        with LoadBalancer(tmp_path / "reference-haproxy", host, [(broker.host, broker.port)]) as balancer:
            return LoadBalancedRun(balancer.address, tmp_path / "reference-clients", seconds, streams=streams,
                                   mqttjs=HAVE_MQTTJS).run()
    finally:
        broker.stop()


def federated(federation: LocalFederation, tmp_path: Path, seconds: float, streams: Sequence[Stream]) -> Outcome:
    host = federation.node("n0").host.rsplit(".", 1)[0] + ".50"  # the federation's own /24
    backends = [(federation.node(name).host, BROKER_PORT) for name in federation.nodes]
    with LoadBalancer(tmp_path / "federation-haproxy", host, backends) as balancer:
        outcome = LoadBalancedRun(balancer.address, tmp_path / "federation-clients", seconds, streams=streams,
                                  mqttjs=HAVE_MQTTJS).run()
    outcome.twice = connected_twice({name: node.broker_log for name, node in federation.nodes.items()})
    return outcome


def both(federation: LocalFederation, tmp_path: Path, seconds: float,
         streams: Sequence[Stream] = STREAMS) -> tuple[Outcome, Outcome]:
    """The federation and the reference, side by side (each on loopback addresses of its own)."""
    with ThreadPoolExecutor(2) as pool:
        federation_run = pool.submit(federated, federation, tmp_path, seconds, streams)
        reference_run = pool.submit(reference, tmp_path, seconds, streams)
        return federation_run.result(), reference_run.result()


def roaming(federation: LocalFederation) -> dict[str, dict[str, Any]]:
    """Each wrapper's roaming counts (its status: federation.daemon.roaming)."""
    return {name: federation.status(name)["daemon"]["broker"]["roaming"] for name in federation.nodes}


def check(federation_outcome: Outcome, reference_outcome: Outcome, counts: dict[str, dict[str, Any]],
          shared_qos2: bool = False) -> str:
    """The assertions of the module docstring; returns the text printed."""
    totals = {key: sum(int(each.get(key, 0)) for each in counts.values())
              for key in ("takeovers", "takeovers_skipped", "adopted", "taken_queued", "delivered",
                          "duplicates_left_out", "carried", "shared_copies", "late_forwarded", "late_received",
                          "late_copies", "unreleased", "unreleased_given", "fences_late", "handovers_late", "dropped")}
    text = (f"\none broker behind HAProxy:\n{reference_outcome.text()}\n"
            f"the federation's three brokers behind HAProxy:\n{federation_outcome.text()}\n"
            f"the wrappers' roaming counts: {totals}"
            + ("" if HAVE_MQTTJS else "\n(MQTT.js not installed: paho subscribers in its place)"))
    print(text)
    assert not reference_outcome.errors and not federation_outcome.errors, text
    # The reference shows what the clients get where nothing is federated: the setup itself loses nothing.
    assert all(not count.lost for count in reference_outcome.subscribers), text
    assert not any(count.duplicated for count in reference_outcome.subscribers if count.qos == 2), text
    for count in federation_outcome.subscribers:
        assert count.qos == 2 or not count.lost, f"{count.name} lost {len(count.lost)}: {text}"
        assert count.connections >= 3, f"{count.name} hardly moved: {text}"
    # A QoS 2 message the client had taken (PUBREC) and not been released (PUBREL) when its connection dropped: one
    # broker releases it when the client comes back; another broker cannot, and the old one's wrapper gives it again
    # where its broker's order tells which it was, and counts it lost where not.
    lost_qos2 = sum(len(count.lost) for count in federation_outcome.subscribers if count.qos == 2)
    counted = totals["unreleased"] - totals["unreleased_given"]
    assert lost_qos2 <= counted, f"QoS 2 publications lost beyond those counted (roaming_unreleased): {text}"
    subscribers = Counter(count.stream for count in federation_outcome.subscribers)
    alone = [count for count in federation_outcome.subscribers if count.qos == 2 and subscribers[count.stream] == 1]
    assert not any(count.duplicated for count in alone), f"QoS 2 duplicates: {text}"
    if shared_qos2:  # a second copy to the other subscriber of a topic on a session's new broker, counted there
        shared = sum(count.duplicated for count in federation_outcome.subscribers
                     if count.qos == 2 and subscribers[count.stream] > 1)
        assert shared <= totals["shared_copies"], f"QoS 2 duplicates the wrappers did not count: {text}"
    assert not federation_outcome.twice, text
    assert totals["adopted"] and totals["takeovers"], f"no session moved between brokers: {text}"
    return text


def test_clients_behind_a_load_balancer_get_what_one_broker_gives(make_federation: Any, tmp_path: Path) -> None:
    federation: LocalFederation = make_federation(3, "line")
    federation_outcome, reference_outcome = both(federation, tmp_path, SECONDS)
    check(federation_outcome, reference_outcome, roaming(federation))


@pytest.mark.lb_long
def test_clients_behind_a_load_balancer_for_minutes(make_federation: Any, tmp_path: Path) -> None:
    seconds = float(os.environ.get("LB_LONG_SECONDS", "300"))
    federation: LocalFederation = make_federation(3, "line")
    federation_outcome, reference_outcome = both(federation, tmp_path, seconds, (*STREAMS, *SHARED_QOS2))
    check(federation_outcome, reference_outcome, roaming(federation), shared_qos2=True)
