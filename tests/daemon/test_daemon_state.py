"""The state directory (epoch, subscription table, atomic writes, lock) and the subscription table's rules."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from federation.daemon.broker_log import ClientConnected, ClientGone, ClientSubscribed, ClientUnsubscribed
from federation.daemon.state import (
    SAVE_COST_RATIO,
    STATE_FILE,
    STATE_SAVE_DELAY,
    BackgroundWriter,
    ClientRecord,
    EpochExhausted,
    LocalSubscriptions,
    PersistedState,
    StateError,
    StateSaver,
    StateStore,
    atomic_write,
    next_epoch,
)
from federation.daemon.status import StatusError, query
from federation.protocol.node import Node
from federation.protocol.types import Address
from federation.protocol.wire import MAX_EPOCH, MAX_JUMP_EPOCH

from broker_util import wait_for

REPO = Path(__file__).resolve().parents[2]


class Recorder:
    """A subscription sink that records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def local_subscribe(self, client: str, filter_: str, qos: int, now: float) -> None:
        self.calls.append(("sub", client, filter_, qos))

    def local_unsubscribe(self, client: str, filter_: str, now: float) -> None:
        self.calls.append(("unsub", client, filter_))

    def local_disconnect(self, client: str, now: float) -> None:
        self.calls.append(("gone", client))


# ------------------------------------------------------------------ epoch


def test_epoch_is_monotonic() -> None:
    assert next_epoch(None, 1000.7) == 1000
    assert next_epoch(999, 1000.2) == 1000
    assert next_epoch(1000, 1000.2) == 1001  # restarted within the same second
    assert next_epoch(5000, 1000.0) == 5001  # the wall clock went backwards: still forward
    epoch = None
    for _ in range(5):
        following = next_epoch(epoch, 1000.0)
        assert epoch is None or following > epoch
        epoch = following


def test_the_next_epoch_stays_in_the_node_range() -> None:
    """docs/protocol.md "Ranges": a saved epoch at the top leaves no next one: the start is refused, with why."""
    assert next_epoch(MAX_EPOCH - 1, 1000.0) == MAX_EPOCH
    assert next_epoch(MAX_JUMP_EPOCH, 1000.0) == MAX_JUMP_EPOCH + 1  # a node pushed to the jump limit restarts
    for saved in (MAX_EPOCH, 2**64 - 1):
        with pytest.raises(EpochExhausted, match="no next epoch"):
            next_epoch(saved, 1000.0)


# ------------------------------------------------------------------ store


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    store.lock()
    try:
        table = LocalSubscriptions({"c1": ClientRecord({"a/#": 1, "b": 0}, False),
                                    "c 2": ClientRecord({"$share/g/x/+": 2}, True)})
        receivers = {"a/#": ["10.0.0.2:10500", "10.0.0.3:10500"]}  # docs/protocol.md rule 7f
        store.save(PersistedState(42, "127.0.0.1:1883", table, filters=["a/#"], receivers=receivers), now=1.5)
        loaded, warning = store.load()
        assert warning is None
        assert (loaded.epoch, loaded.broker, loaded.saved_at) == (42, "127.0.0.1:1883", 1.5)
        assert loaded.subscriptions.to_json() == table.to_json()
        assert (loaded.filters, loaded.receivers) == (["a/#"], receivers)
        assert sorted(p.name for p in store.directory.iterdir()) == [STATE_FILE, "wrapper.lock"]  # no temp files
    finally:
        store.unlock()


def test_atomic_write_keeps_the_old_file_when_interrupted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.json"
    atomic_write(path, b"old")

    def crash(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError):
        atomic_write(path, b"new content")
    assert path.read_bytes() == b"old"


class SlowStore(StateStore):
    """A store whose writes block until released (a slow fsync), recording what they wrote."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.release = threading.Event()
        self.started = threading.Event()
        self.written: list[bytes] = []
        self.threads: set[int] = set()

    def write(self, content: bytes) -> None:
        self.threads.add(threading.get_ident())
        self.started.set()
        assert self.release.wait(10)
        super().write(content)
        self.written.append(content)


def test_background_writer_keeps_the_loop_free_and_writes_the_latest(tmp_path: Path) -> None:
    """A write runs in a thread while the loop goes on; snapshots taken meanwhile: only the newest is written."""
    store = SlowStore(tmp_path)
    errors: list[OSError] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        writer = BackgroundWriter(store, loop, errors.append)
        writer.submit(b"first")
        await loop.run_in_executor(None, store.started.wait, 10)
        ticks = 0
        for _ in range(5):  # the loop runs while the write is blocked
            await asyncio.sleep(0)
            ticks += 1
        writer.submit(b"second")
        writer.submit(b"third")  # replaces "second", which was never started
        assert writer.busy and store.written == []
        store.release.set()
        await writer.drain()
        assert not writer.busy and ticks == 5
        assert writer.superseded == 1

    asyncio.run(scenario())
    assert store.written == [b"first", b"third"]
    assert (tmp_path / STATE_FILE).read_bytes() == b"third"
    assert threading.get_ident() not in store.threads and errors == []


def test_background_writer_reports_errors_and_goes_on(tmp_path: Path) -> None:
    class FailingOnce(StateStore):
        failed = False

        def write(self, content: bytes) -> None:
            if not self.failed:
                self.failed = True
                raise OSError(28, "No space left on device")
            super().write(content)

    store = FailingOnce(tmp_path)
    errors: list[OSError] = []

    async def scenario() -> None:
        writer = BackgroundWriter(store, asyncio.get_running_loop(), errors.append)
        writer.submit(b"lost")
        await writer.drain()
        writer.submit(b"kept")
        await writer.drain()

    asyncio.run(scenario())
    assert [e.errno for e in errors] == [28]
    assert (tmp_path / STATE_FILE).read_bytes() == b"kept"


class EncodingStore(StateStore):
    """A store that notes the thread each encoding ran in."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.encoded_in: list[int] = []

    def encode(self, state: PersistedState, now: float) -> bytes:
        self.encoded_in.append(threading.get_ident())
        return super().encode(state, now)


def test_the_saver_encodes_a_copy_in_the_writers_thread(tmp_path: Path) -> None:
    """The loop only copies the table (encoding 100,000 filters took it 0.16-0.33 s); the copy is what is written,
    whatever the table becomes meanwhile."""
    store = EncodingStore(tmp_path)
    table = LocalSubscriptions({"c1": ClientRecord({"a/#": 1})})
    state = PersistedState(7, "127.0.0.1:1883", table)

    async def scenario() -> None:
        saver = StateSaver(store, state, asyncio.get_running_loop(), lambda: 9, lambda: 100.0)
        saver.schedule()
        saver.cancel()  # the timer's call, made at once:
        saver._save()
        table.apply(ClientSubscribed("c2", "b", 0), Recorder(), 1.0)  # after the copy
        await saver._writer.drain()

    asyncio.run(scenario())
    saved = json.loads((tmp_path / STATE_FILE).read_bytes())
    assert saved["clients"] == {"c1": {"persistent": False, "filters": {"a/#": 1}}} and saved["epoch"] == 9
    assert store.encoded_in and threading.get_ident() not in store.encoded_in


def test_saves_come_further_apart_when_a_write_takes_long(tmp_path: Path) -> None:
    async def scenario() -> float:
        saver = StateSaver(StateStore(tmp_path), PersistedState(), asyncio.get_running_loop(), lambda: 1,
                           lambda: 0.0)
        assert saver.delay == STATE_SAVE_DELAY
        saver._writer.last_seconds = 0.01
        assert saver.delay == STATE_SAVE_DELAY
        saver._writer.last_seconds = 0.3  # 100,000 filters encoded and written
        return saver.delay

    assert asyncio.run(scenario()) == pytest.approx(SAVE_COST_RATIO * 0.3)


def test_the_table_keeps_its_counts_through_any_events() -> None:
    """`filter_count` and `shared_count` (what the subscription audit reads after every pass) always equal a
    count of the table."""
    generator = random.Random(3)
    clients = ["a", "b", "c d"]
    filters = ["x/#", "y", "$share/g/x/+", "$share/h/y", "$SYS/#"]
    table, sink = LocalSubscriptions({"a": ClientRecord({"y": 0, "$share/g/x/+": 1}, True)}), Recorder()
    for step in range(3000):
        client = generator.choice(clients)
        kind = generator.randrange(6)
        event: Any
        if kind <= 1:
            event = ClientSubscribed(client, generator.choice(filters), generator.randrange(3))
        elif kind == 2:
            event = ClientUnsubscribed(client, generator.choice(filters))
        elif kind == 3:
            event = ClientConnected(client, generator.random() < 0.5, 5, 60)
        elif kind == 4:
            event = ClientGone(client, generator.choice(["disconnected", "closed", "expired"]),
                               generator.choice([True, False, None]), generator.choice([4, 5, None]))
        else:
            event = None
            (table.session_ended if generator.random() < 0.5 else table.drop_carried)(client, sink, float(step))
        if event is not None:
            table.apply(event, sink, float(step))
        pairs = [f for record in table.clients.values() for f in record.filters]
        assert (table.filter_count, table.shared_count) == (len(pairs), sum(f.startswith("$share/") for f in pairs))
        copied = table.copy()
        assert (copied.filter_count, copied.shared_count, copied.clients) == \
            (table.filter_count, table.shared_count, table.clients)


def test_unreadable_state_is_set_aside(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    (tmp_path / STATE_FILE).write_text("{not json")
    state, warning = store.load()
    assert state.epoch is None and not state.subscriptions.clients
    assert warning is not None and "unreadable" in warning
    assert any(p.name.startswith(f"{STATE_FILE}.unreadable-") for p in tmp_path.iterdir())


def test_lock_refuses_a_second_wrapper(tmp_path: Path) -> None:
    first = StateStore(tmp_path)
    first.lock()
    try:
        with pytest.raises(StateError, match=r"in use by another wrapper \(pid \d+\)"):
            StateStore(tmp_path).lock()
    finally:
        first.unlock()
    second = StateStore(tmp_path)
    second.lock()  # free again
    second.unlock()


# ------------------------------------------------------------------ the subscription table


def test_clean_client_loses_filters_on_disconnect() -> None:
    table, sink = LocalSubscriptions(), Recorder()
    assert not table.apply(ClientConnected("c", clean=True, protocol=4, keepalive=60), sink, 0)
    assert table.apply(ClientSubscribed("c", "a/#", 1), sink, 0)
    assert table.apply(ClientSubscribed("c", "b", 0), sink, 0)
    assert table.apply(ClientUnsubscribed("c", "b"), sink, 0)
    assert not table.apply(ClientUnsubscribed("c", "never"), sink, 0)
    assert table.apply(ClientGone("c", "closed", clean=True, protocol=4), sink, 0)
    assert sink.calls == [("sub", "c", "a/#", 1), ("sub", "c", "b", 0), ("unsub", "c", "b"), ("gone", "c")]
    assert table.clients == {}


def test_an_mqtt_5_clean_start_session_keeps_its_filters_until_its_end_is_known() -> None:
    """Issue 39: clean start 1 with a session expiry is a persistent session (0 of 10 queued messages reached a
    client that came back, before). The filters stay until the broker's counts say the session ended."""
    table, sink = LocalSubscriptions(), Recorder()
    table.apply(ClientConnected("c", clean=True, protocol=5, keepalive=60), sink, 0)
    table.apply(ClientSubscribed("c", "a/#", 1), sink, 0)
    assert table.clients["c"].persistent
    table.apply(ClientGone("c", "closed", clean=True, protocol=5), sink, 0)
    assert table.clients["c"].filters == {"a/#": 1} and sink.calls[-1] == ("sub", "c", "a/#", 1)
    assert table.session_ended("c", sink, 1)
    assert table.clients == {} and sink.calls[-1] == ("gone", "c")


def test_a_clean_start_sessions_shared_subscriptions_go_with_its_connection() -> None:
    """A shared subscription is a membership of its group: kept while the session may have ended, the federation
    would choose this broker for publications its gone member never gets (rule 9)."""
    table, sink = LocalSubscriptions(), Recorder()
    table.apply(ClientConnected("m", clean=True, protocol=5, keepalive=60), sink, 0)
    table.apply(ClientSubscribed("m", "$share/g/t", 1), sink, 0)
    table.apply(ClientSubscribed("m", "plain", 1), sink, 0)
    assert table.apply(ClientGone("m", "disconnected", clean=True, protocol=5), sink, 0)
    assert table.clients["m"].filters == {"plain": 1} and sink.calls[-1] == ("unsub", "m", "$share/g/t")
    assert (table.filter_count, table.shared_count) == (1, 0)


def test_a_reconnection_to_a_session_the_broker_no_longer_had_drops_only_the_filters_carried_over() -> None:
    table, sink = LocalSubscriptions(), Recorder()
    table.apply(ClientConnected("c", clean=False, protocol=5, keepalive=60), sink, 0)
    table.apply(ClientSubscribed("c", "old/#", 1), sink, 0)
    table.apply(ClientSubscribed("c", "again", 1), sink, 0)
    table.apply(ClientGone("c", "closed", clean=False, protocol=5), sink, 0)
    table.apply(ClientConnected("c", clean=False, protocol=5, keepalive=60), sink, 0)  # session present 0, it turns out
    table.apply(ClientSubscribed("c", "again", 1), sink, 0)  # subscribed again after the new CONNACK
    assert table.drop_carried("c", sink, 1)
    assert table.clients["c"].filters == {"again": 1} and sink.calls[-1] == ("unsub", "c", "old/#")
    assert (table.filter_count, table.counted("c")) == (1, 1)


def test_the_wrappers_own_connections_change_nothing_in_the_table() -> None:
    table, sink = LocalSubscriptions(), Recorder()
    assert not table.apply(ClientConnected("w", clean=True, protocol=5, keepalive=60, own=True), sink, 0)
    assert not table.apply(ClientSubscribed("w", "#", 2, own=True), sink, 0)
    assert table.clients == {} and sink.calls == []


@pytest.mark.parametrize("reason", ["disconnected", "closed", "timeout", "takeover"])
def test_persistent_session_keeps_filters_until_a_clean_connect_or_expiry(reason: str) -> None:
    table, sink = LocalSubscriptions(), Recorder()
    table.apply(ClientConnected("p", clean=False, protocol=4, keepalive=60), sink, 0)
    table.apply(ClientSubscribed("p", "x/+", 2), sink, 0)
    assert table.clients["p"].persistent
    assert not table.apply(ClientGone("p", reason, clean=False), sink, 0)  # type: ignore[arg-type]
    assert table.clients["p"].filters == {"x/+": 2}
    table.apply(ClientConnected("p", clean=False, protocol=4, keepalive=60), sink, 0)  # resumes: kept
    assert "p" in table.clients
    table.apply(ClientGone("p", "closed", clean=False), sink, 0)
    assert table.apply(ClientConnected("p", clean=True, protocol=4, keepalive=60), sink, 0)  # clean: discarded
    assert "p" not in table.clients and sink.calls[-1] == ("gone", "p")


def test_expiry_ends_a_persistent_session() -> None:
    table, sink = LocalSubscriptions(), Recorder()
    table.apply(ClientConnected("p", clean=False, protocol=4, keepalive=60), sink, 0)
    table.apply(ClientSubscribed("p", "x", 0), sink, 0)
    table.apply(ClientGone("p", "closed", clean=False), sink, 0)
    assert table.apply(ClientGone("p", "expired", clean=None), sink, 0)
    assert table.clients == {}


def test_unknown_session_kind_uses_the_saved_flag() -> None:
    """After a restart the tracker never saw the connect line (clean=None): the saved flag decides."""
    table = LocalSubscriptions({"p": ClientRecord({"x": 1}, persistent=True),
                                "c": ClientRecord({"y": 1}, persistent=False)})
    sink = Recorder()
    assert not table.apply(ClientGone("p", "closed", clean=None), sink, 0)
    assert table.apply(ClientGone("c", "closed", clean=None), sink, 0)
    assert set(table.clients) == {"p"}


def test_takeover_by_a_clean_connection_discards_the_old_filters() -> None:
    table, sink = LocalSubscriptions(), Recorder()
    table.apply(ClientConnected("d", clean=True, protocol=5, keepalive=60), sink, 0)
    table.apply(ClientSubscribed("d", "t", 0), sink, 0)
    table.apply(ClientGone("d", "takeover", clean=True), sink, 0)
    table.apply(ClientConnected("d", clean=True, protocol=5, keepalive=60), sink, 0)
    table.apply(ClientSubscribed("d", "u", 1), sink, 0)
    assert table.clients["d"].filters == {"u": 1}


def test_replay_into_a_real_node_and_json_round_trip() -> None:
    table = LocalSubscriptions({"c1": ClientRecord({"a/#": 1, "b/+": 0}, False),
                                "c2": ClientRecord({"a/#": 2}, True), "empty": ClientRecord({}, False)})
    assert "empty" not in table.clients
    again = LocalSubscriptions.from_json(json.loads(json.dumps(table.to_json())), "test")
    assert again.to_json() == table.to_json()
    node = Node(Address("127.0.0.1", 10500), [], epoch=1, rng=random.Random(1))
    node.start(0.0)
    assert again.replay(node, 0.0) == 3
    assert node.clients == {"c1": {"a/#": 1, "b/+": 0}, "c2": {"a/#": 2}}
    assert node.local_count("a/#") == 2
    with pytest.raises(ValueError):
        LocalSubscriptions.from_json({"c": {"filters": {"a": 7}}}, "test")


# ------------------------------------------------------------------ the daemon restarting with its state


def wrapper_process(tmp_path: Path, port: int, state_dir: Path, log_name: str) -> subprocess.Popen[bytes]:
    # A broker port where nothing listens: the wrapper keeps retrying and keeps the overlay (and status) alive.
    dead_broker = f"127.0.0.1:{port}"
    stderr = open(tmp_path / log_name, "wb")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(
        [sys.executable, str(REPO / "wrapper.py"), "--bind", f"127.0.0.1:{port}", "--broker", dead_broker,
         "--state-dir", str(state_dir), "--log-level", "DEBUG"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, cwd=REPO)
    stderr.close()
    return process


def test_restarted_wrapper_advances_the_epoch_and_replays_subscriptions(tmp_path: Path) -> None:
    port = free_udp_port()
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    saved = {"version": 1, "epoch": 4_000_000_000, "broker": f"127.0.0.1:{port}", "saved_at": 1.0,
             "clients": {"sensor-7": {"persistent": True, "filters": {"plant/+/temp": 1}}}}
    (state_dir / STATE_FILE).write_text(json.dumps(saved))

    def status() -> dict[str, Any] | None:
        try:
            return query("127.0.0.1", port, timeout=0.3)
        except StatusError:
            return None

    for life in (1, 2):
        log_path = tmp_path / f"wrapper-{life}.log"
        process = wrapper_process(tmp_path, port, state_dir, log_path.name)
        try:
            document = wait_for(status, timeout=10, message=log_path.read_text)
            assert document is not None
            assert document["epoch"] == 4_000_000_000 + life  # never backwards, even behind the wall clock
            assert document["local_subscriptions"] == {"sensor-7": {"plant/+/temp": 1}}
        finally:
            process.terminate()
            assert process.wait(10) == 0, log_path.read_text()
        on_disk = json.loads((state_dir / STATE_FILE).read_text())
        assert on_disk["epoch"] == 4_000_000_000 + life
        assert on_disk["clients"] == saved["clients"]


def free_udp_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port
