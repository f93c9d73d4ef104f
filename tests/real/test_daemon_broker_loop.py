"""The broker adapter driven by an asyncio loop (what the wrapper runs), against a real Mosquitto.

The loop runs in a background thread; every call into the adapter is made on
that thread (`LoopThread.call`), as the runtime does. Items reach the test
through a real `LoopHandOff`, so batching and `flush` are exercised too.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from federation.daemon import lean_client
from federation.daemon.broker import BrokerAdapter
from federation.daemon.broker_items import (
    BrokerItem,
    Connected,
    ConnectFailed,
    Disconnected,
    LogLine,
    LoopHandOff,
    Publication,
    PublicationRun,
    Subscribed,
)
from federation.daemon.broker_log import BrokerLogTracker, ClientSubscribed
from federation.daemon.lean_client import PAHO_PRIVATE_NAMES, PublicClient
from federation.daemon.read_coalescing import ReadCoalescing
from federation.protocol.types import Address, Injection

from broker_util import (
    Broker,
    LoopThread,
    Processes,
    free_port,
    loop_thread_fixture,  # noqa: F401 - the `loop_thread` fixture
    mosquitto_pub,
    mosquitto_sub,
    requires_mosquitto,
    start_broker,
    wait_for,
)
from mqtt_bytes import acknowledgements

pytestmark = requires_mosquitto

WRAPPER_ID = "federation-wrapper-loop-test"
class Batches:
    """What the hand-off gives the consumer: batches of items (on the loop thread), each acknowledged once taken,
    as the runtime does (`adapter`, set once it is built)."""

    def __init__(self) -> None:
        self.batches: list[list[BrokerItem]] = []
        self.threads: set[str] = set()
        self.lock = threading.Lock()
        self.adapter: BrokerAdapter | None = None

    def __call__(self, batch: list[BrokerItem]) -> None:
        with self.lock:
            self.batches.append(batch)
            self.threads.add(threading.current_thread().name)
        if self.adapter is not None:
            self.adapter.acknowledge(acknowledgements(batch))

    def of(self, kind: type) -> list[Any]:
        """The items of `kind` handed over, in order (a `PublicationRun` counts as its `Publication`s)."""
        with self.lock:
            items = [item for batch in self.batches for item in batch]
        if kind is Publication:
            items = [each for item in items
                     for each in (item.publications() if isinstance(item, PublicationRun) else (item,))]
        return [item for item in items if isinstance(item, kind)]

    def log_events(self) -> list[Any]:
        tracker = BrokerLogTracker(WRAPPER_ID)
        return [event for line in self.of(LogLine) for event in tracker.feed(line.topic, line.payload)]


@pytest.fixture
def processes() -> Iterator[Processes]:
    started = Processes()
    yield started
    started.close()


@pytest.fixture
def make_adapter(loop_thread: LoopThread) -> Iterator[Callable[[int], tuple[BrokerAdapter, Batches]]]:
    adapters: list[BrokerAdapter] = []

    def make(port: int) -> tuple[BrokerAdapter, Batches]:
        batches = Batches()

        def build() -> BrokerAdapter:
            hand_off = LoopHandOff(loop_thread.loop, batches)
            adapter = BrokerAdapter(Address("127.0.0.1", port), WRAPPER_ID, hand_off.put, loop=loop_thread.loop,
                                    flush=hand_off.flush, hold=hand_off.hold)
            batches.adapter = adapter
            adapter.start()
            return adapter

        adapter = loop_thread.call(build)
        adapters.append(adapter)
        return adapter, batches

    yield make
    for adapter in adapters:
        loop_thread.call(adapter.stop)


def test_items_put_during_a_hold_wait_for_the_flush() -> None:
    """The adapter's read pass holds the hand-over: nothing is scheduled for what it puts, the flush at its end
    hands all of it over; outside a hold, a put schedules a run of the consumer."""
    loop = asyncio.new_event_loop()
    try:
        batches: list[list[BrokerItem]] = []
        hand_off = LoopHandOff(loop, batches.append)
        first, second, third = (Publication(f"t/{index}", b"p", 0, False, None) for index in range(3))
        hand_off.hold()
        hand_off.put(first)
        hand_off.put(second)
        loop.run_until_complete(asyncio.sleep(0))
        assert batches == []
        hand_off.flush()
        assert batches == [[first, second]]
        hand_off.put(third)
        loop.run_until_complete(asyncio.sleep(0))
        assert batches == [[first, second], [third]]
    finally:
        loop.close()


def test_connects_subscribes_and_runs_without_a_network_thread(tmp_path: Path, make_adapter: Any,
                                                               processes: Processes) -> None:
    with start_broker(tmp_path) as broker:
        adapter, batches = make_adapter(broker.port)
        wait_for(lambda: batches.of(Subscribed) and batches.of(LogLine), timeout=5, message="subscriptions and logs")
        assert adapter.on_loop and adapter.client._thread is None  # no paho thread was started
        assert batches.threads == {"test-loop"}
        sock = adapter.client.socket()
        assert sock is not None and sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        processes.start(mosquitto_sub(broker.port, "-i", "watcher", "-t", "w/#", "-q", "1"))
        wait_for(lambda: ClientSubscribed("watcher", "w/#", 1) in batches.log_events(), timeout=5,
                 message="the subscribe line")


def test_a_burst_of_publications_arrives_in_order_in_few_batches(tmp_path: Path, make_adapter: Any) -> None:
    with start_broker(tmp_path) as broker:
        _, batches = make_adapter(broker.port)
        wait_for(lambda: batches.of(Subscribed), timeout=5, message="the subscriptions")
        lines = "".join(f"message {index}\n" for index in range(2000))
        subprocess.run(mosquitto_pub(broker.port, "-t", "burst/x", "-l", "-q", "1"), input=lines.encode(),
                       check=True, timeout=20)
        wait_for(lambda: len(batches.of(Publication)) >= 2000, timeout=10, message="2000 publications")
        payloads = [p.payload for p in batches.of(Publication)]
        assert payloads == [f"message {index}".encode() for index in range(2000)]
        with_publications = [b for b in batches.batches
                             if any(isinstance(i, (Publication, PublicationRun)) for i in b)]
        assert 0 < len(with_publications) < 2000  # read in bursts, not one loop pass per message
        assert batches.of(PublicationRun)  # plain QoS 1 publications: read a run at a time


def test_a_flood_is_read_in_waits_and_a_trickle_at_once(tmp_path: Path, make_adapter: Any,
                                                       loop_thread: LoopThread) -> None:
    """Read coalescing on a real broker: a flood of QoS 0 publications is read in passes with waits between them
    (the threshold lowered to 1,000 a second, so a slow machine floods fast enough), in order and complete; lone
    publications afterwards are read as they come, without a wait."""
    with start_broker(tmp_path) as broker:
        adapter, batches = make_adapter(broker.port)
        wait_for(lambda: batches.of(Subscribed), timeout=5, message="the subscriptions")
        loop_thread.call(lambda: setattr(adapter.reading, "coalescing", ReadCoalescing(0.002, min_rate=1_000)))
        lines = "".join(f"flood {index}\n" for index in range(20000))
        subprocess.run(mosquitto_pub(broker.port, "-t", "flood/x", "-l", "-q", "0"), input=lines.encode(),
                       check=True, timeout=20)
        wait_for(lambda: len(batches.of(Publication)) >= 20000, timeout=10, message="20000 publications")
        assert [p.payload for p in batches.of(Publication)] == [f"flood {index}".encode() for index in range(20000)]
        assert adapter.reading.coalescing.waits > 0
        waits = adapter.reading.coalescing.waits
        for index in range(3):
            subprocess.run(mosquitto_pub(broker.port, "-t", "lone/x", "-m", f"lone {index}"), check=True, timeout=10)
            wait_for(lambda expected=20001 + index: len(batches.of(Publication)) == expected, timeout=5,
                     message=f"lone {index}")
        assert loop_thread.call(lambda: adapter.reading.coalescing.waits) == waits


def test_injections_reach_subscribers_corked_in_a_batch(tmp_path: Path, make_adapter: Any, loop_thread: LoopThread,
                                                        processes: Processes) -> None:
    with start_broker(tmp_path) as broker:
        adapter, batches = make_adapter(broker.port)
        wait_for(lambda: batches.of(Subscribed), timeout=5, message="the subscriptions")
        reader = processes.start(mosquitto_sub(broker.port, "-i", "reader", "-t", "fed/#", "-q", "1", "-C", "50"),
                                 stdout=subprocess.PIPE)
        wait_for(lambda: ClientSubscribed("reader", "fed/#", 1) in batches.log_events(), timeout=5,
                 message="the reader's subscription")
        origin = Address("10.0.0.9", 10500)
        injections = [Injection(f"fed/{index}", b"p%d" % index, index % 2, False, None, (origin, 1, index))
                      for index in range(50)]
        loop_thread.call(lambda: adapter.publish_all(injections))
        output, _ = reader.communicate(timeout=10)
        received = output.decode().split()
        # Each QoS keeps its order; the broker may let QoS 0 overtake QoS 1 messages still in flight.
        for qos in (0, 1):
            assert [p for p in received if int(p[1:]) % 2 == qos] == [f"p{i}" for i in range(qos, 50, 2)]
        assert adapter.injected == 50 and adapter.inject_failed == 0
        assert not [p for p in batches.of(Publication) if p.topic.startswith("fed/")]  # no echo (no_local)


def test_broker_restart_and_late_broker_reconnect(tmp_path: Path, make_adapter: Any) -> None:
    port = free_port()
    adapter, batches = make_adapter(port)  # nothing listens yet: attempts fail and are retried with backoff
    wait_for(lambda: batches.of(ConnectFailed), timeout=5, message="a failed connection attempt")
    broker = Broker(tmp_path / "late", port)
    broker.start()
    try:
        wait_for(lambda: batches.of(Connected) and batches.of(Subscribed), timeout=10,
                 message="a connection once the broker runs")
        broker.restart()
        wait_for(lambda: batches.of(Disconnected), timeout=5, message="the disconnect to be noticed")
        assert not batches.of(Disconnected)[0].expected
        wait_for(lambda: len(batches.of(Connected)) >= 2 and len(batches.of(Subscribed)) >= 2, timeout=10,
                 message="a reconnection and new subscriptions")
        subprocess.run(mosquitto_pub(port, "-t", "after/restart", "-m", "x"), check=True, timeout=10)
        wait_for(lambda: any(p.topic == "after/restart" for p in batches.of(Publication)), timeout=5,
                 message="publications after the restart")
    finally:
        broker.stop()


def test_stop_disconnects_cleanly(tmp_path: Path, make_adapter: Any, loop_thread: LoopThread) -> None:
    with start_broker(tmp_path) as broker:
        adapter, batches = make_adapter(broker.port)
        wait_for(lambda: batches.of(Subscribed), timeout=5, message="the subscriptions")
        loop_thread.call(adapter.stop)
        wait_for(lambda: batches.of(Disconnected), timeout=5, message="the disconnect item")
        assert batches.of(Disconnected)[-1].expected
        assert adapter.client.socket() is None
        wait_for(lambda: f"Client {WRAPPER_ID} disconnected." in broker.log_text(), timeout=5,
                 message="the broker to log a clean disconnect")


def test_paused_reading_lets_the_broker_queue_until_resumed(tmp_path: Path, make_adapter: Any,
                                                            loop_thread: LoopThread) -> None:
    with start_broker(tmp_path) as broker:
        adapter, batches = make_adapter(broker.port)
        wait_for(lambda: batches.of(Subscribed), timeout=5, message="the subscriptions")
        loop_thread.call(adapter.pause_reading)
        assert adapter.reading_paused
        subprocess.run(mosquitto_pub(broker.port, "-t", "held/x", "-m", "queued", "-q", "1"), check=True, timeout=10)
        subprocess.run(mosquitto_pub(broker.port, "-t", "held/marker", "-m", "m"), check=True, timeout=10)
        # Nothing is read while paused: a poll for the items must time out.
        with pytest.raises(AssertionError):
            wait_for(lambda: batches.of(Publication), timeout=1, message="no publication while paused")
        loop_thread.call(adapter.resume_reading)
        wait_for(lambda: [p.topic for p in batches.of(Publication)] == ["held/x", "held/marker"], timeout=5,
                 message="both queued publications after resuming")


def test_without_a_private_name_paho_s_public_path_carries_publications_both_ways(
        tmp_path: Path, make_adapter: Any, loop_thread: LoopThread, processes: Processes,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed paho lacks a name the lean path relies on (as after a rename): the adapter reads and
    injects through paho's documented API, in order, and the broker's acknowledgements complete the
    QoS 1 injections."""
    monkeypatch.setattr(lean_client, "PAHO_PRIVATE_NAMES", (*PAHO_PRIVATE_NAMES, "client._renamed_by_a_later_paho"))
    with start_broker(tmp_path) as broker:
        adapter, batches = make_adapter(broker.port)
        assert type(adapter.client) is PublicClient
        wait_for(lambda: batches.of(Subscribed) and batches.of(LogLine), timeout=5, message="subscriptions and logs")
        lines = "".join(f"message {index}\n" for index in range(500))
        subprocess.run(mosquitto_pub(broker.port, "-t", "burst/x", "-l", "-q", "1"), input=lines.encode(),
                       check=True, timeout=20)
        wait_for(lambda: len(batches.of(Publication)) >= 500, timeout=10, message="500 publications")
        assert [p.payload for p in batches.of(Publication)] == [f"message {index}".encode() for index in range(500)]
        reader = processes.start(mosquitto_sub(broker.port, "-i", "reader", "-t", "fed/#", "-q", "1", "-C", "20"),
                                 stdout=subprocess.PIPE)
        wait_for(lambda: ClientSubscribed("reader", "fed/#", 1) in batches.log_events(), timeout=5,
                 message="the reader's subscription")
        origin = Address("10.0.0.9", 10500)
        injections = [Injection(f"fed/{index}", b"p%d" % index, index % 2, False, None, (origin, 1, index))
                      for index in range(20)]
        loop_thread.call(lambda: adapter.publish_all(injections))
        output, _ = reader.communicate(timeout=10)
        received = output.decode().split()
        for qos in (0, 1):
            assert [p for p in received if int(p[1:]) % 2 == qos] == [f"p{i}" for i in range(qos, 20, 2)]
        assert adapter.injected == 20 and adapter.inject_failed == 0
        wait_for(lambda: loop_thread.call(adapter.backlog) == 0, timeout=5, message="the QoS 1 injections completed")
