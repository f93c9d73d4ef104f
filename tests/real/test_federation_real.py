"""The whole system, for real: Mosquitto brokers, wrapper daemons and the command-line MQTT clients.

Every test runs real `mosquitto` processes on 127.0.x.y, a real `python
wrapper.py` beside each, linked by `federation.tools.launch.LocalFederation`, and
drives them with `mosquitto_sub` / `mosquitto_pub` (and paho where a client
must unsubscribe while connected). What the clients print is the verdict;
the wrappers' event logs add what the clients cannot see (where a
publication went, that it went nowhere else).

Tests that do not disturb the federation share one line and one ring per
module, each test under its own topic prefix; tests that restart or kill
something get their own federation. Timers are shortened (FAST_SETTINGS)
except in the cold-start test, which measures the defaults.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from federation.daemon.config import load_config
from federation.daemon.state import STATE_FILE
from federation.protocol.topic_filter import matches
from federation.tools.launch import BROKER_PORT, REPO_ROOT, LocalFederation, render_mosquitto_conf

from broker_util import MOSQUITTO, MOSQUITTO_SUB, free_port, requires_mosquitto, wait_for
from federation_util import (
    Clients,
    Subscriber,
    clients_fixture,  # noqa: F401 - the `clients` fixture
    flush_event_logs,
    make_federation_fixture,  # noqa: F401 - the `make_federation` fixture
    next_first_address,
    publication_events,
    start_federation,
    wait_known,
)

pytestmark = requires_mosquitto


@pytest.fixture(scope="module")
def line_federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFederation]:
    """n0 - n1 - n2 - n3, shared by the tests of this module that leave it as they found it."""
    federation = start_federation(tmp_path_factory.mktemp("line"), 4, "line")
    yield federation
    stop_cleanly(federation)


@pytest.fixture(scope="module")
def ring_federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFederation]:
    """n0 - n1 - n2 - n3 - n4 - n0, shared likewise."""
    federation = start_federation(tmp_path_factory.mktemp("ring"), 5, "ring")
    yield federation
    stop_cleanly(federation)


def stop_cleanly(federation: LocalFederation) -> None:
    """Stop it, and check the daemon's contract: every wrapper exits with status 0 on SIGTERM."""
    federation.stop()
    exits = {name: node.wrapper_exits for name, node in federation.nodes.items()}
    assert all(statuses == [0] for statuses in exits.values()), f"wrapper exit statuses: {exits}"


def unique_prefix(label: str) -> str:
    return f"{label}/{uuid.uuid4().hex[:8]}"


def publish_until_received(clients: Clients, federation: LocalFederation, node: str, topic: str,
                           subscriber: Subscriber, timeout: float, interval: float = 0.05) -> tuple[float, int]:
    """Publish distinct payloads every `interval` s until the subscriber prints one; (seconds, attempts)."""
    begun = time.monotonic()
    deadline = begun + timeout
    attempt = 0
    while True:
        attempt += 1
        clients.publish(federation, node, topic, f"probe-{attempt}".encode())
        poll_until = time.monotonic() + interval
        while time.monotonic() < poll_until:
            if subscriber.messages():
                return time.monotonic() - begun, attempt
            time.sleep(0.01)
        if subscriber.messages():
            return time.monotonic() - begun, attempt
        if time.monotonic() > deadline:
            raise AssertionError(f"no probe on {topic} from {node} reached {subscriber} within {timeout:g} s "
                                 f"({attempt} published)\n{federation.diagnostics()}")


def assert_exactly_once(subscribers: list[Subscriber], published: list[tuple[str, str, bytes]]) -> None:
    """Each subscriber holds each matching publication once and nothing else."""
    for subscriber in subscribers:
        expected = sorted((topic, payload) for _, topic, payload in published
                          if matches(subscriber.topic_filter, topic))
        got = sorted(subscriber.received())
        assert got == expected, f"{subscriber}: expected each of {expected} once, got {got}"


# ------------------------------------------------------------------ delivery


@pytest.mark.parametrize("topology", ["line", "ring"])
def test_each_publication_reaches_each_matching_subscriber_exactly_once(
        topology: str, request: pytest.FixtureRequest, clients: Clients) -> None:
    federation: LocalFederation = request.getfixturevalue(f"{topology}_federation")
    prefix = unique_prefix(f"once-{topology}")
    far = list(federation.nodes)[-1]
    subscribers = [
        clients.subscribe(federation, far, f"{prefix}/kitchen/temperature"),
        clients.subscribe(federation, "n1", f"{prefix}/+/temperature"),
        clients.subscribe(federation, "n1", f"{prefix}/kitchen/#"),  # overlaps the one above on the same broker
        clients.subscribe(federation, "n2", f"{prefix}/#"),
    ]
    for subscriber in subscribers:
        federation.wait_mesh(subscriber.topic_filter)
    published = [
        ("n0", f"{prefix}/kitchen/temperature", b"21.5"),
        ("n0", f"{prefix}/garage/temperature", b"17.0"),
        ("n0", f"{prefix}/kitchen/humidity", b"40"),
        ("n0", f"{prefix}/attic", b"dusty"),
        (far, f"{prefix}/kitchen/temperature", b"21.6"),  # at a broker with a subscriber of its own
        ("n1", f"{prefix}/garage/temperature", b"17.1"),
        ("n2", f"{prefix}/kitchen/temperature", b"21.7"),
        ("n0", f"other-{prefix}/kitchen/temperature", b"nobody"),  # no subscriber anywhere
    ]
    for node, topic, payload in published:
        clients.publish(federation, node, topic, payload)
    for subscriber in subscribers:
        for _, topic, payload in published:
            if matches(subscriber.topic_filter, topic):
                subscriber.wait_for_message(topic, payload)
    flush_event_logs(federation)  # also gives any duplicate time to show up at a subscriber
    assert_exactly_once(subscribers, published)

    # The event logs: a delivery exactly where a local subscriber matches, once, and nowhere else.
    events = publication_events(federation, prefix)
    origin_of = {event["pub"]: (name, event["topic"]) for name, node_events in events.items()
                 for event in node_events if event["type"] == "publication_originated"}
    assert len(origin_of) == len(published) - 1, f"originated: {origin_of}"  # the last one matches no prefix
    for pub, (origin, topic) in origin_of.items():
        expected = sorted({s.node for s in subscribers if matches(s.topic_filter, topic)} - {origin})
        delivered = sorted(name for name, node_events in events.items() for event in node_events
                           if event["type"] == "publication_delivered" and event["pub"] == pub)
        assert delivered == expected, f"{pub} ({topic} from {origin}) delivered at {delivered}, expected {expected}"
    nobody = [event for name in federation.nodes for event in federation.events(name, ["publication_delivered"])
              if str(event.get("topic", "")).startswith("other-")]
    assert nobody == []


def test_unsubscribe_and_disconnect_stop_forwarding_to_that_broker(ring_federation: LocalFederation,
                                                                   clients: Clients) -> None:
    federation = ring_federation
    prefix = unique_prefix("leave")
    topic_filter = f"{prefix}/#"
    staying = clients.subscribe(federation, "n1", topic_filter)  # first: n1 holds the topic core
    federation.wait_mesh(topic_filter)
    leaving = clients.paho_subscriber(federation, "n3")
    leaving.subscribe(topic_filter, qos=1)
    wait_known(federation, "n3", leaving.client_id, topic_filter)
    federation.wait_mesh(topic_filter)
    clients.publish(federation, "n0", f"{prefix}/before", b"1")
    staying.wait_for_message(f"{prefix}/before", b"1")
    wait_for(lambda: leaving.payloads() == [b"1"], 10, message=lambda: f"paho got {leaving.received}")

    leaving.unsubscribe(topic_filter)  # a v5 client unsubscribes and stays connected
    wait_known(federation, "n3", leaving.client_id, None)
    assert_not_member(federation, "n3", topic_filter)
    federation.wait_mesh(topic_filter)
    clients.publish(federation, "n0", f"{prefix}/after-unsubscribe", b"2")
    staying.wait_for_message(f"{prefix}/after-unsubscribe", b"2")

    # A disconnect (the mosquitto_sub process ends) does the same.
    gone = clients.subscribe(federation, "n4", topic_filter)
    federation.wait_mesh(topic_filter)
    clients.publish(federation, "n0", f"{prefix}/with-n4", b"3")
    gone.wait_for_message(f"{prefix}/with-n4", b"3")
    clients.processes.end(gone.process)
    wait_known(federation, "n4", gone.client_id, None)
    assert_not_member(federation, "n4", topic_filter)
    federation.wait_mesh(topic_filter)
    clients.publish(federation, "n0", f"{prefix}/after-disconnect", b"4")
    staying.wait_for_message(f"{prefix}/after-disconnect", b"4")

    flush_event_logs(federation)
    assert leaving.payloads() == [b"1"]
    assert staying.received() == [(f"{prefix}/before", b"1"), (f"{prefix}/after-unsubscribe", b"2"),
                                  (f"{prefix}/with-n4", b"3"), (f"{prefix}/after-disconnect", b"4")]
    events = publication_events(federation, prefix)
    for topic, left in ((f"{prefix}/after-unsubscribe", "n3"), (f"{prefix}/after-disconnect", "n4")):
        pub = publication_id(events, topic)
        address = federation.node(left).address
        sent_there = [event for name in events for event in events[name]
                      if event["pub"] == pub and event["type"] == "publication_forwarded"
                      and address in event.get("to", [])]
        assert sent_there == [], f"{topic} still forwarded to {left} after it left: {sent_there}"
        assert [event for event in events[left] if event["pub"] == pub] == [], f"{left} saw {topic}"


def publication_id(events: dict[str, list[dict[str, Any]]], topic: str) -> str:
    """The id of the one publication originated on `topic`."""
    found = [event["pub"] for node_events in events.values() for event in node_events
             if event["type"] == "publication_originated" and event["topic"] == topic]
    assert len(found) == 1, f"publications originated on {topic}: {found}"
    return str(found[0])


def assert_not_member(federation: LocalFederation, node: str, topic_filter: str) -> None:
    def left() -> bool:
        row = next((t for t in federation.status(node)["topics"] if t["filter"] == topic_filter), None)
        return row is None or not row["member"]

    wait_for(left, 10, message=lambda: f"{node} to leave the mesh of {topic_filter}: {federation.status(node)}")


def publish_numbered(host: str, topic_of: dict[int, str], count: int, rate: float) -> None:
    """Publish 1..count on each topic of `topic_of` (QoS -> topic), interleaved, at `rate` per topic per second,
    from one paho client; returns once every QoS 1 publication is acknowledged."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"numbered-{uuid.uuid4().hex[:6]}")
    client.max_queued_messages_set(0)
    client.connect(host, BROKER_PORT)
    client.loop_start()
    try:
        infos = []
        begun = time.monotonic()
        for number in range(1, count + 1):
            for qos, topic in topic_of.items():
                infos.append(client.publish(topic, str(number).encode(), qos=qos))
            pause = begun + number / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # pacing the publisher, not waiting for a condition
        for info in infos:
            info.wait_for_publish(timeout=10)
    finally:
        client.loop_stop()
        client.disconnect()


def numbers_in_arrival_order(subscriber: Subscriber, topic: str) -> list[int]:
    return [int(message.payload) for message in subscriber.messages() if message.topic == topic]


def test_two_equal_paths_keep_each_stream_in_order_as_one_broker_does(make_federation: Any,
                                                                      clients: Clients) -> None:
    """MQTT 5 section 4.6: one publisher's messages on one topic arrive in the order sent. On a 4-ring the
    publisher's broker n0 and the subscriber's broker n2 are joined by two paths of two hops (n1 and n3); a
    numbered QoS 0 and a QoS 1 stream must arrive in order, exactly as the same streams do on one broker (the
    subscriber's own, n2, published there beside the federated ones)."""
    federation = make_federation(4, "ring")
    prefix = unique_prefix("order-ring")
    federated = clients.subscribe(federation, "n2", f"{prefix}/far/#", qos=1)
    reference = clients.subscribe(federation, "n2", f"{prefix}/near/#", qos=1)
    federation.wait_mesh(federated.topic_filter)
    count = 1000
    far = {0: f"{prefix}/far/q0", 1: f"{prefix}/far/q1"}
    near = {0: f"{prefix}/near/q0", 1: f"{prefix}/near/q1"}
    publish_numbered(federation.node("n0").host, far, count, rate=200)
    publish_numbered(federation.node("n2").host, near, count, rate=200)
    wait_for(lambda: len(numbers_in_arrival_order(federated, far[1])) >= count, 30,
             message=lambda: f"the QoS 1 stream through the ring: {len(numbers_in_arrival_order(federated, far[1]))}"
                             f" of {count}\n{federation.diagnostics()}")
    wait_for(lambda: len(numbers_in_arrival_order(reference, near[1])) >= count, 30, message="the reference")
    flush_event_logs(federation)
    for qos in (0, 1):
        expected = numbers_in_arrival_order(reference, near[qos])
        got = numbers_in_arrival_order(federated, far[qos])
        assert expected == list(range(1, count + 1)), f"one broker, QoS {qos}: {expected[:20]}..."
        if qos:
            first_wrong = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
            assert got == expected, f"QoS 1 through the ring: {len(got)} arrived, first out of order at {first_wrong}"
        else:  # best effort: what arrives must be in order and none twice
            assert got == sorted(set(got)), f"QoS 0 through the ring out of order: {got[:40]}..."
            assert len(got) >= count * 0.95, f"QoS 0 through the ring: {len(got)} of {count} arrived"


def test_qos_is_kept_end_to_end(ring_federation: LocalFederation, clients: Clients) -> None:
    federation = ring_federation
    prefix = unique_prefix("qos")
    subscriber = clients.subscribe(federation, "n2", f"{prefix}/#", qos=2)
    federation.wait_mesh(subscriber.topic_filter)
    for qos in (0, 1, 2):
        clients.publish(federation, "n0", f"{prefix}/q{qos}", f"at qos {qos}".encode(), qos=qos)
    got = {m.topic: m.qos for m in subscriber.wait_for_count(3)}
    assert got == {f"{prefix}/q0": 0, f"{prefix}/q1": 1, f"{prefix}/q2": 2}


def test_a_retained_publication_is_retained_on_the_remote_broker(ring_federation: LocalFederation,
                                                                 clients: Clients) -> None:
    federation = ring_federation
    prefix = unique_prefix("retain")
    live = clients.subscribe(federation, "n3", f"{prefix}/#", qos=1)
    federation.wait_mesh(live.topic_filter)
    clients.publish(federation, "n0", f"{prefix}/door", b"open", qos=1, retain=True)
    live.wait_for_message(f"{prefix}/door", b"open")
    # A client that subscribes later, on the remote broker, gets it from that broker's retained store.
    later = clients.subscribe(federation, "n3", f"{prefix}/door", qos=1, wait=False)
    message = later.wait_for_message(f"{prefix}/door", b"open")
    assert message.retain, f"the late subscriber got {message}: not flagged retained"
    assert message.qos == 1

    # An empty retained publication clears it there too. The marker, published after it on the same path,
    # shows the clear was handled: a still-retained "open" would reach a new subscriber with the marker.
    clients.publish(federation, "n0", f"{prefix}/door", b"", qos=1, retain=True)
    clients.publish(federation, "n0", f"{prefix}/marker", b"after-clear", qos=1, retain=True)
    live.wait_for_message(f"{prefix}/marker", b"after-clear")
    latest = clients.subscribe(federation, "n3", f"{prefix}/#", qos=1, wait=False)
    latest.wait_for_message(f"{prefix}/marker", b"after-clear")
    assert latest.received() == [(f"{prefix}/marker", b"after-clear")]


PAYLOADS = {
    "empty": (b"", "file"),
    "binary": (bytes(range(256)) * 4, "file"),
    "60KB-file": (os.urandom(60 * 1024), "file"),
    "60KB-stdin": (os.urandom(60 * 1024), "stdin"),
}


# (ids matter: pytest puts the test id in PYTEST_CURRENT_TEST, and a 60 KB id breaks every exec)
@pytest.mark.parametrize(("label", "payload", "via"), [(label, *case) for label, case in PAYLOADS.items()],
                         ids=list(PAYLOADS))
def test_payloads_arrive_byte_for_byte(ring_federation: LocalFederation, clients: Clients, label: str,
                                       payload: bytes, via: str) -> None:
    federation = ring_federation
    prefix = unique_prefix(f"payload-{label}")
    subscriber = clients.subscribe(federation, "n3", f"{prefix}/#")
    federation.wait_mesh(subscriber.topic_filter)
    clients.publish(federation, "n1", f"{prefix}/blob", payload, qos=1, via=via)
    message = subscriber.wait_for_message(f"{prefix}/blob", payload)
    assert len(message.payload) == len(payload)


def test_utf8_topics_with_spaces(ring_federation: LocalFederation, clients: Clients) -> None:
    federation = ring_federation
    prefix = unique_prefix("utf8")
    topic = f"{prefix}/salle à manger/température extérieure 🌡"
    exact = clients.subscribe(federation, "n2", topic)
    wildcard = clients.subscribe(federation, "n4", f"{prefix}/+/température extérieure 🌡")
    for subscriber in (exact, wildcard):
        federation.wait_mesh(subscriber.topic_filter)
    clients.publish(federation, "n0", topic, "12,5 °C".encode(), via="message")
    for subscriber in (exact, wildcard):
        assert subscriber.wait_for_message(topic, "12,5 °C".encode()).topic == topic


def test_status_command_line(ring_federation: LocalFederation) -> None:
    document = ring_federation.status_cli("n2")
    for key in ("node", "broker_id", "management_core", "neighbours", "federation", "topics", "sent", "received",
                "drops", "counters"):
        assert key in document, f"`wrapper.py status --json` lacks {key!r}: {sorted(document)}"
    assert document["node"] == ring_federation.node("n2").address
    assert sorted(n["address"] for n in document["neighbours"]) == sorted(
        ring_federation.node(n).address for n in ("n1", "n3"))
    assert all(n["up"] for n in document["neighbours"])
    assert len(document["federation"]) == 5
    assert document["management_core"] == f"1@{ring_federation.node('n0').address}"


# ------------------------------------------------------------------ restarts and failures


def test_broker_restarts(make_federation: Any, clients: Clients) -> None:
    federation: LocalFederation = make_federation(3, "line")
    prefix = unique_prefix("broker-restart")
    subscriber = clients.subscribe(federation, "n2", f"{prefix}/#")
    federation.wait_mesh(subscriber.topic_filter)
    clients.publish(federation, "n0", f"{prefix}/t", b"first")
    subscriber.wait_for_message(f"{prefix}/t", b"first")

    # The publisher's broker restarts: its wrapper reconnects and federates again.
    federation.restart_broker("n0")
    federation.wait_wrapper_ready("n0")
    clients.publish(federation, "n0", f"{prefix}/t", b"after-n0-restart")
    subscriber.wait_for_message(f"{prefix}/t", b"after-n0-restart")

    # The subscriber's broker restarts: mosquitto_sub reconnects and subscribes again by itself, and a new
    # client subscribes too; both get publications again.
    broker_log = federation.node("n2").broker_log
    offset = broker_log.stat().st_size
    federation.restart_broker("n2")
    federation.wait_wrapper_ready("n2")
    fresh = clients.subscribe(federation, "n2", f"{prefix}/t")
    # mosquitto_sub retries after about a second; the wrapper still lists it from before, so ask the broker.
    resubscribed = f"{subscriber.client_id} 0 {subscriber.topic_filter}"
    wait_for(lambda: resubscribed in broker_log.read_bytes()[offset:].decode(errors="replace"), 10,
             message=f"mosquitto_sub to subscribe again ({resubscribed!r} in {broker_log})")
    wait_known(federation, "n2", subscriber.client_id, subscriber.topic_filter)
    federation.wait_mesh(subscriber.topic_filter)
    federation.wait_mesh(fresh.topic_filter)
    clients.publish(federation, "n0", f"{prefix}/t", b"after-n2-restart")
    subscriber.wait_for_message(f"{prefix}/t", b"after-n2-restart")
    fresh.wait_for_message(f"{prefix}/t", b"after-n2-restart")
    flush_event_logs(federation)
    assert subscriber.count(f"{prefix}/t", b"after-n2-restart") == 1
    assert fresh.received() == [(f"{prefix}/t", b"after-n2-restart")]


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_subscribers_keep_receiving_across_a_wrapper_restart(make_federation: Any, clients: Clients,
                                                             kill: bool) -> None:
    federation: LocalFederation = make_federation(4, "ring")
    prefix = unique_prefix("wrapper-restart")
    subscriber = clients.subscribe(federation, "n2", f"{prefix}/#")
    federation.wait_mesh(subscriber.topic_filter)
    clients.publish(federation, "n0", f"{prefix}/t", b"before")
    subscriber.wait_for_message(f"{prefix}/t", b"before")
    state_dir = federation.node("n2").state_dir
    # The wrapper saves its subscription table shortly after a change; a crash before that loses it.
    state_file = state_dir / STATE_FILE  # not the temporary file: a kill before the rename loses that one
    wait_for(lambda: state_file.is_file() and subscriber.client_id in state_file.read_text(errors="replace"), 5,
             message=f"the wrapper of n2 to save {subscriber.client_id} in {state_file}")

    status = federation.stop_wrapper("n2", kill=kill)
    assert status == (-9 if kill else 0), f"the wrapper exited with {status}"
    federation.start_wrapper("n2")
    federation.wait_converged()
    wait_known(federation, "n2", subscriber.client_id, subscriber.topic_filter)
    federation.wait_mesh(subscriber.topic_filter)
    published = [("n0", f"{prefix}/t", f"after-{i}".encode()) for i in range(5)]
    for node, topic, payload in published:
        clients.publish(federation, node, topic, payload)
    for _, topic, payload in published:
        subscriber.wait_for_message(topic, payload)
    flush_event_logs(federation)
    assert_exactly_once([subscriber], [("n0", f"{prefix}/t", b"before"), *published])


def test_traffic_goes_around_a_killed_wrapper_in_a_ring(make_federation: Any, clients: Clients) -> None:
    federation: LocalFederation = make_federation(5, "ring")
    prefix = unique_prefix("detour")
    subscriber = clients.subscribe(federation, "n2", f"{prefix}/#")
    federation.wait_mesh(subscriber.topic_filter)
    clients.publish(federation, "n0", f"{prefix}/t", b"short-way")  # n0 - n1 - n2
    subscriber.wait_for_message(f"{prefix}/t", b"short-way")

    federation.stop_wrapper("n1", kill=True)
    survivors = ["n0", "n2", "n3", "n4"]
    federation.wait_converged(names=survivors)
    federation.wait_mesh(subscriber.topic_filter, names=survivors)
    published = [("n0", f"{prefix}/long-way-{i}", b"x") for i in range(5)]
    for node, topic, payload in published:
        clients.publish(federation, node, topic, payload)
    for _, topic, payload in published:
        subscriber.wait_for_message(topic, payload)
    flush_event_logs(federation, survivors)
    assert_exactly_once([subscriber], [("n0", f"{prefix}/t", b"short-way"), *published])
    events = publication_events(federation, prefix)
    detour = {federation.node(n).address for n in ("n3", "n4")}
    for _, topic, _ in published:
        pub = publication_id(events, topic)
        hops = {address for name in survivors for e in events[name]
                if e["pub"] == pub and e["type"] == "publication_forwarded" for address in e["to"]}
        assert detour <= hops, f"{topic} went to {hops}, not round by n4 and n3"


def test_cold_start_with_default_settings_delivers_within_3_s(make_federation: Any, clients: Clients) -> None:
    """A 5-broker line from nothing, protocol defaults: a publication at one end reaches the other end fast."""
    federation: LocalFederation = make_federation(5, "line", settings=None, wrappers=False)
    for name in federation.nodes:
        federation.start_wrapper(name, wait=False)
    last_started = time.monotonic()
    federation.wait_wrapper_ready("n4")
    subscriber = clients.subscribe(federation, "n4", "cold/+/start")
    federation.wait_wrapper_ready("n0")
    took, attempts = publish_until_received(clients, federation, "n0", "cold/end/start", subscriber, timeout=10)
    since_start = time.monotonic() - last_started
    print(f"\ncold start, 5-broker line, default settings: first delivery {since_start:.2f} s after the last "
          f"wrapper started ({took:.2f} s of publishing, {attempts} probes)")
    assert since_start < 3.0, f"first delivery {since_start:.2f} s after the last wrapper started"


# ------------------------------------------------------------------ the demo and the launcher


def test_demo_runs_and_leaves_nothing_running(tmp_path: Path) -> None:
    first = next_first_address()
    workdir = tmp_path / "demo"
    result = subprocess.run([sys.executable, "-m", "federation.tools.demo", "--nodes", "4", "--duration", "0",
                             "--first-address", first, "--workdir", str(workdir)],
                            capture_output=True, text=True, timeout=90, cwd=REPO_ROOT, check=False)
    assert result.returncode == 0, f"demo exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    assert "exactly once" in result.stdout
    assert "received: home/kitchen/temperature 21.5" in result.stdout
    assert "Everything the demo started has stopped" in result.stdout
    left = subprocess.run(["pgrep", "-af", str(workdir)], capture_output=True, text=True, check=False)
    assert left.stdout == "", f"still running after the demo:\n{left.stdout}"


def test_demo_exits_2_when_an_address_is_taken(tmp_path: Path) -> None:
    first = next_first_address()
    with socket.socket() as squatter:
        squatter.bind((first, 1883))
        squatter.listen()
        result = subprocess.run([sys.executable, "-m", "federation.tools.demo", "--duration", "0", "--first-address",
                                 first, "--workdir", str(tmp_path)],
                                capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{first}:1883 (TCP) is already in use" in result.stderr


@pytest.mark.parametrize("as_root", [True, False])
def test_broker_config_is_rendered_from_the_template(tmp_path: Path, as_root: bool) -> None:
    template = ("listener 1883\nallow_anonymous true\nlog_dest topic\nlog_type all\nlog_dest stderr\n"
                "persistence true\npersistence_location /var/lib/mosquitto/\nuser mosquitto\n")
    rendered = render_mosquitto_conf(template, "127.0.0.12", 1883, tmp_path, as_root)
    active = [line for line in rendered.splitlines() if line and not line.startswith("#")]
    assert active[0] == "listener 1883 127.0.0.12"
    assert active.count("log_dest topic") == 1 and "log_type all" in active
    assert f"log_dest file {tmp_path / 'broker.log'}" in active
    assert f"persistence_location {tmp_path}/" in active
    assert "log_dest stderr" not in active and "listener 1883" not in active
    assert ("user root" in active) == as_root and "user mosquitto" not in active


# ------------------------------------------------------------------ the examples

HOME_IOT_ROOMS = ("kitchen", "living-room", "garage", "garden")
SITES = ("paris", "montreal", "singapore")


def test_home_iot_configs_load_and_form_a_ring() -> None:
    configs = {room: load_config({"config": str(REPO_ROOT / "examples" / "home-iot" / f"{room}.yaml")})
               for room in HOME_IOT_ROOMS}
    address = {room: config.announced for room, config in configs.items()}
    for room, config in configs.items():
        assert config.name == room
        assert config.broker.host == config.bind.host and config.broker.port == 1883
        assert len(config.neighbours) == 2, f"{room}: {config.neighbours}"
        for neighbour in config.neighbours:
            other = next(r for r, a in address.items() if a == neighbour)
            assert address[room] in configs[other].neighbours, f"{room} lists {other}, not the other way round"
    assert len({config.vid for config in configs.values()}) == 4
    assert len({config.settings for config in configs.values()}) == 1, "rooms must share their settings"


def test_three_sites_wrapper_configs_agree() -> None:
    configs = {site: load_config({"config": str(REPO_ROOT / "examples" / "three-sites" / site / "wrapper.yaml")})
               for site in SITES}
    addresses = {config.announced for config in configs.values()}
    for site, config in configs.items():
        assert set(config.neighbours) == addresses - {config.announced}, site
        assert str(config.broker) == "127.0.0.1:1883"
    assert len({config.vid for config in configs.values()}) == 3
    assert len({config.settings for config in configs.values()}) == 1, "sites must share their settings"


@pytest.mark.parametrize("site", SITES)
def test_three_sites_broker_configs_start(tmp_path: Path, site: str) -> None:
    """Each site's mosquitto.conf, with its placeholder addresses and paths moved here, starts; anonymous
    clients are served on the loopback listener and refused on the LAN one."""
    text = (REPO_ROOT / "examples" / "three-sites" / site / "mosquitto.conf").read_text()
    lan = next(line.split()[2] for line in text.splitlines()
               if line.startswith("listener ") and not line.endswith("127.0.0.1"))
    local_port, lan_host = free_port(), next_first_address()
    (tmp_path / "passwd").write_text("")
    text = (text.replace("listener 1883 127.0.0.1", f"listener {local_port} 127.0.0.1")
            .replace(lan, lan_host).replace("/etc/mosquitto/passwd", str(tmp_path / "passwd"))
            .replace("/var/log/mosquitto/", f"{tmp_path}/").replace("/var/lib/mosquitto/", f"{tmp_path}/"))
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(text + ("user root\n" if os.geteuid() == 0 else ""))
    broker = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        log = tmp_path / "mosquitto.log"
        wait_for(lambda: log.exists() and " running" in log.read_text(), 5,
                 message=lambda: f"mosquitto to start with {site}'s config: {broker.poll()}")
        local = subprocess.run([MOSQUITTO_SUB, "-h", "127.0.0.1", "-p", str(local_port), "-t", "$SYS/broker/log/#",
                                "-C", "1", "-W", "5"], capture_output=True, timeout=10, check=False)
        assert local.returncode == 0 and local.stdout, f"loopback listener: {local}"
        remote = subprocess.run([MOSQUITTO_SUB, "-h", lan_host, "-p", "1883", "-t", "x", "-C", "1", "-W", "5"],
                                capture_output=True, timeout=10, check=False)
        assert b"not authorised" in remote.stderr, f"LAN listener accepted an anonymous client: {remote}"
    finally:
        broker.terminate()
        broker.wait(5)
        assert broker.stderr is not None
        broker.stderr.close()


def test_python_client_example_against_a_running_federation(ring_federation: LocalFederation) -> None:
    result = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "python_client.py"),
                             "--publish-host", ring_federation.node("n0").host,
                             "--subscribe-host", ring_federation.node("n2").host,
                             "--topic", unique_prefix("python-example"), "--count", "5", "--interval", "0.05"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "published 5, received 5 distinct, 0 duplicates" in result.stdout
