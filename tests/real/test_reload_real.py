"""Live reconfiguration on real wrapper processes (issue 38): a wrapper whose YAML file gains a neighbour and an
export takes them up on SIGHUP, as the same process, while a QoS 1 stream crosses it and arrives whole; a file
that does not validate is refused with the start-up message and changes nothing.

The line n0-n1 runs; n2 runs alone (no neighbour listed). n1 (the wrapper reloaded) has its neighbours in its
YAML file (not on its command line, which would win over the file) and the topic lines `stream/# out 1` and
`cmd/# in 1`; a client of n1 subscribes to cmd/# before the reload.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from federation.tools.launch import LocalFederation

from broker_util import requires_mosquitto, wait_for
from federation_util import (  # noqa: F401 - the fixtures
    FAST_SETTINGS,
    Clients,
    Streamer,
    Subscriber,
    clients_fixture,
    next_first_address,
    wait_known,
)

pytestmark = requires_mosquitto

BEFORE = ["stream/# out 1", "cmd/# in 1"]
AFTER = [*BEFORE, "news/# out 1"]
STREAM = 600
"""QoS 1 publications of the stream, about 3 s of it at the Streamer's pace"""


def status_of(federation: LocalFederation, name: str) -> dict[str, Any]:
    return federation.status(name)


def neighbour_up(federation: LocalFederation, name: str, other: str) -> bool:
    address = federation.node(other).address
    return any(n.get("address") == address and n.get("up") for n in federation.status(name)["neighbours"])


def reach(clients: Clients, federation: LocalFederation, node: str, topic: str, subscriber: Subscriber,
          timeout: float = 15.0) -> None:
    """Publish `topic` at `node` every 0.2 s until `subscriber` has it: the path is up, as a client sees it."""
    deadline = time.monotonic() + timeout
    while True:
        clients.publish(federation, node, topic, b"probe", qos=0)
        try:
            wait_for(lambda: topic in [m.topic for m in subscriber.messages()], timeout=0.2)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise


@pytest.fixture(name="federation")
def federation_fixture(tmp_path: Path) -> Iterator[LocalFederation]:
    federation = LocalFederation(["n0", "n1", "n2"], [("n0", "n1")], tmp_path / "federation", FAST_SETTINGS,
                                 first_address=next_first_address(), topics={"n1": BEFORE},
                                 neighbours_in_file=True)
    federation.start_brokers()
    try:
        federation.start_wrappers()
        federation.wait_converged(timeout=20, names=["n0", "n1"])
        yield federation
    finally:
        federation.stop()
    assert all(node.wrapper_exits == [0] for node in federation.nodes.values()), \
        {name: node.wrapper_exits for name, node in federation.nodes.items()}


def test_a_reload_adds_a_neighbour_and_an_export_while_a_stream_crosses(federation: LocalFederation,
                                                                        clients: Clients) -> None:
    streamed = clients.subscribe(federation, "n0", "stream/#", qos=1)
    commands_b = clients.subscribe(federation, "n1", "cmd/#", qos=1)
    news_c = clients.subscribe(federation, "n2", "news/#", qos=1)
    reach(clients, federation, "n1", "stream/probe", streamed)
    reach(clients, federation, "n0", "cmd/probe", commands_b)
    before = status_of(federation, "n1")
    pid = before["daemon"]["pid"]
    assert pid == federation.node("n1").wrapper_process.pid
    assert not neighbour_up(federation, "n1", "n2")

    streamer = Streamer(federation.node("n1").host, "stream/s", STREAM, qos=1)
    try:
        wait_for(lambda: streamer.acknowledged >= STREAM // 3, timeout=30, message="a third of the stream")
        federation.write_wrapper_config("n1", topics=AFTER, neighbours=["n0", "n2"])
        assert federation.signal_wrapper("n1") == pid
        wait_for(lambda: status_of(federation, "n1")["daemon"]["reloads"]["configurations"] == 1, timeout=10,
                 message="n1 to take up its new configuration")
        assert streamer.acknowledged < STREAM, "the stream ended before the reload: make it longer"
    finally:
        streamer.close()
    assert streamer.error is None, streamer.error

    # The same process, joined to n2 and exporting news/: a client of n2 gets n1's news.
    wait_for(lambda: neighbour_up(federation, "n1", "n2") and neighbour_up(federation, "n2", "n1"), timeout=10,
             message="the link n1-n2 to come up")
    reach(clients, federation, "n1", "news/x", news_c)
    after = status_of(federation, "n1")
    assert after["daemon"]["pid"] == pid and federation.node("n1").wrapper_running
    config = after["daemon"]["config"]
    assert config["sha256"] != before["daemon"]["config"]["sha256"] and config["pending_restart"] == []
    assert config["loaded_at"] > before["daemon"]["config"]["loaded_at"]
    assert after["daemon"]["topic_policy"]["lines"] == AFTER

    # The QoS 1 stream that crossed n1 during the reload arrived whole, in order.
    messages = streamed.wait_for_count(STREAM, timeout=30)
    numbers = [int(m.payload) for m in messages if m.topic == "stream/s"]
    first = list(dict.fromkeys(numbers))
    assert first == list(range(1, STREAM + 1)), f"missing {sorted(set(range(1, STREAM + 1)) - set(numbers))[:10]}"
    # No local subscription was forgotten: n1's client of cmd/# still gets what n0 publishes.
    clients.publish(federation, "n0", "cmd/after-reload", b"still here", qos=1)
    commands_b.wait_for_message("cmd/after-reload", b"still here")

    # A file that does not validate: refused with the start-up message, and nothing changes.
    federation.node("n1").wrapper_config.write_text(
        'neighbors: ["' + federation.node("n0").address + '"]\ntopics:\n  - "news/# sideways 1"\n', encoding="utf-8")
    federation.signal_wrapper("n1")
    wait_for(lambda: status_of(federation, "n1")["daemon"]["reloads"]["failures"] == 1, timeout=10,
             message="n1 to refuse the file")
    refused = status_of(federation, "n1")["daemon"]
    assert refused["config"] == config and refused["topic_policy"]["lines"] == AFTER
    assert refused["reloads"]["last_error"] == (
        f"{federation.node('n1').wrapper_config}: topics[0] 'news/# sideways 1': Error: Invalid bridge topic "
        f"direction 'sideways'. Write out, in or both after the pattern.")
    log = federation.node("n1").wrapper_log.read_text()
    assert f"federation-wrapper: error: {refused['reloads']['last_error']}" in log
    assert neighbour_up(federation, "n1", "n2")
    clients.publish(federation, "n1", "news/after-refusal", b"unchanged", qos=1)
    news_c.wait_for_message("news/after-refusal", b"unchanged")
    assert refused["pid"] == pid

