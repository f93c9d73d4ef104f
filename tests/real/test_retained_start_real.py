"""Retained messages a broker held before its wrapper started (docs/protocol.md rule 10, "Retained messages the
broker held before"): real Mosquitto brokers and wrappers on a line n0-n1-n2, the real mosquitto_pub and
mosquitto_sub. What a subscriber on another broker gets is compared with what one broker gives."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from federation.tools.launch import LocalFederation, line, node_names

from broker_util import mosquitto_pub, mosquitto_sub, requires_mosquitto, wait_for
from federation_util import FAST_SETTINGS, next_first_address

pytestmark = requires_mosquitto

FORMAT = "%r %q %t %p"
"""mosquitto_sub's output per message: retain flag, QoS, topic, payload"""


def publish_retained(federation: LocalFederation, name: str, topic: str, payload: str, qos: int) -> None:
    node = federation.node(name)
    subprocess.run(mosquitto_pub(node.broker_port, "-t", topic, "-m", payload, "-q", str(qos), "-r",
                                 host=node.host), check=True, timeout=10)


def retained_read(federation: LocalFederation, name: str, topic_filter: str, count: int) -> list[str]:
    """What a new subscriber (QoS 1) on broker `name` gets at once: `count` messages, sorted."""
    node = federation.node(name)
    done = subprocess.run(mosquitto_sub(node.broker_port, "-t", topic_filter, "-q", "1", "-C", str(count), "-W",
                                        "10", "-F", FORMAT, host=node.host), capture_output=True, timeout=15)
    return sorted(done.stdout.decode().splitlines())


def retained_store(federation: LocalFederation, name: str) -> dict[str, Any]:
    store: dict[str, Any] = federation.status(name)["daemon"]["broker"]["retained"]
    return store


def test_retained_messages_held_before_the_wrappers_start_reach_every_broker(tmp_path: Path) -> None:
    names = node_names(3)
    federation = LocalFederation(names, line(names), tmp_path / "federation", FAST_SETTINGS,
                                 first_address=next_first_address())
    try:
        federation.start_brokers()
        publish_retained(federation, "n0", "before/a", "held-by-n0", 1)
        publish_retained(federation, "n2", "before/b", "held-by-n2", 0)
        # One broker: a new subscriber gets the value that broker holds.
        one_broker = sorted(retained_read(federation, "n0", "before/#", 1)
                            + retained_read(federation, "n2", "before/#", 1))
        assert one_broker == ["1 0 before/b held-by-n2", "1 1 before/a held-by-n0"]
        federation.start_wrappers()
        federation.wait_converged(timeout=20)
        wait_for(lambda: all(retained_store(federation, name)["topics"] == 2 for name in names), timeout=15,
                 message=lambda: f"both topics in every store: {[retained_store(federation, n) for n in names]}")
        for name in names:  # every broker gives a new subscriber both, as the broker that held each did
            assert retained_read(federation, name, "before/#", 2) == one_broker, name

        # n0's wrapper is down while a client updates n0's value at QoS 0 (the broker queues no QoS 0 publication
        # for the wrapper's session): the store knows before/b (injected from the federation) and an older
        # before/a; only the update is originated when the wrapper is back.
        federation.stop_wrapper("n0")
        publish_retained(federation, "n0", "before/a", "updated-while-down", 0)
        federation.start_wrapper("n0")
        wait_for(lambda: retained_read(federation, "n2", "before/a", 1) == ["1 0 before/a updated-while-down"],
                 timeout=15, message="the update made while n0's wrapper was down, on n2")
        assert retained_read(federation, "n1", "before/#", 2) == ["1 0 before/a updated-while-down",
                                                                 "1 0 before/b held-by-n2"]
        broker = federation.status("n0")["daemon"]["broker"]
        assert broker["retained_scan"] == {"scans": 1, "incomplete": 0, "read": 2, "originated": 1, "checks": 0,
                                           "repaired": 0}
        assert broker["retained"]["stored"] == 1  # before/b, from the federation, was not originated again
        assert not broker["subscription_count"]["over_delivery"], broker["subscription_count"]
        assert all(retained_store(federation, name)["stale"] == 0 for name in names)
    finally:
        federation.stop()
