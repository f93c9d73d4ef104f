"""What the wrapper keeps across restarts, and its model of the local broker's subscriptions.

Theory of operation: Mosquitto has no API that lists subscriptions and never
replays them, so a wrapper that restarts would stop federating every client
that subscribed before it started. `LocalSubscriptions` is the wrapper's own
table (client -> filters, and whether that client's session outlives its
connection), kept in step with the broker log and with the node; the state
directory holds it, together with the boot epoch, in one JSON file written
atomically (temporary file, fsync, rename, fsync of the directory), so a
crash at any instant leaves either the old file or the new one. At start the
table is replayed into the node (`replay`).

The fsync takes tens of milliseconds on a busy disk, a stall of every
datagram if it ran on the event loop. While running, `BackgroundWriter`
therefore writes in an executor thread: the loop only serialises the
snapshot (`StateStore.encode`, cheap, and it must see a consistent table),
one write runs at a time (the temporary file name is per process), and a
snapshot taken while a write is running waits, replacing any older waiting
one (the latest wins: only the newest table matters). `StateSaver` takes
at most one snapshot per `STATE_SAVE_DELAY` however many changes come in
that time. Startup and shutdown write synchronously (`StateStore.save`,
`StateSaver.save_now`), after waiting for the thread.

The epoch must never go backwards, or peers would take a restarted node's
new announcements and publications for stale ones: the next epoch is
`max(previous + 1, unix seconds)`, and it is written before the node sends
anything. An `flock` on a lock file stops two wrappers sharing a directory.

What the table cannot know (documented in docs/daemon.md): a clean client
that disconnected while the wrapper was down keeps its replayed filters until
that id is seen again; the cost is traffic nobody reads, never a lost
publication. Nor whether an MQTT 5 session outlived its connection (its expiry
is not logged): its filters stay until the broker's counts settle it
(federation.daemon.session_ledger: `session_ended`, `drop_carried`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Protocol

from federation.daemon.broker_log import (
    ClientConnected,
    ClientGone,
    ClientSubscribed,
    ClientUnsubscribed,
    LogEvent,
    connect_discards_session,
    filters_end_with_session,
)
from federation.protocol.wire import MAX_EPOCH

log = logging.getLogger("federation.daemon")
"""the wrapper's own logger"""

STATE_FILE = "wrapper-state.json"
LOCK_FILE = "wrapper.lock"
STATE_VERSION = 1
MAX_TRACKED_CONNECTIONS = 100_000
STATE_SAVE_DELAY = 0.5
"""seconds: while running, writes of the state file are debounced to at most one per this delay"""
SAVE_COST_RATIO = 10.0
"""a save waits at least this many times as long as the last write took (`StateSaver.delay`)"""


class StateError(Exception):
    """The state directory cannot be used (exit status 2); the message says what to fix."""


class SubscriptionSink(Protocol):
    """What the table tells about subscription changes (`federation.protocol.node.Node` is one)."""

    def local_subscribe(self, client: str, filter_: str, qos: int, now: float) -> None: ...

    def local_unsubscribe(self, client: str, filter_: str, now: float) -> None: ...

    def local_disconnect(self, client: str, now: float) -> None: ...


@dataclass
class ClientRecord:
    filters: dict[str, int] = field(default_factory=dict)
    """raw filter as the broker logged it -> granted qos"""
    persistent: bool = False
    """its filters may outlive its connection: clean session 0 (MQTT 3.x), or any MQTT 5 session (a clean start 1
    with a session expiry is persistent too, and the log does not show the expiry)"""
    carried: set[str] = field(default_factory=set)
    """filters held from before its current connection (a clean start 0 resumes them if the broker kept the
    session) and not subscribed again since: what goes if the session turns out not to have been kept"""

    def shared_count_of(self) -> int:
        """How many of its filters are shared subscriptions."""
        return _shared(self.filters)


class EpochExhausted(ValueError):
    """The saved epoch leaves no next one within the node's range (docs/protocol.md, "Ranges")."""


def next_epoch(previous: int | None, now_seconds: float) -> int:
    """The boot epoch after `previous`: later than it, and at least the unix time; EpochExhausted when that is
    beyond MAX_EPOCH (only a state file written by hand, or a million restarts at the top of the range, can)."""
    wall = int(now_seconds)
    epoch = wall if previous is None else max(previous + 1, wall)
    if not 0 <= epoch <= MAX_EPOCH:
        raise EpochExhausted(f"the saved epoch {previous} leaves no next epoch within 0 to {MAX_EPOCH} "
                             f"(docs/protocol.md, \"Ranges\"; only a hand-edited state file, or a million restarts "
                             f"at the top of the range, get there): remove its \"epoch\" field to start again from "
                             f"the unix time")
    return epoch


SHARED_PREFIX = "$share/"


def _shared(filters: Mapping[str, int]) -> int:
    return sum(1 for filter_ in filters if filter_.startswith(SHARED_PREFIX))


class LocalSubscriptions:
    """client -> ClientRecord, updated from broker-log events; every change is passed on to a sink.

    The number of (client, filter) pairs, and of shared ones, are kept as the table changes (`filter_count`,
    `shared_count`): the subscription audit reads them after every pass of log lines, and counting 100,000
    filters each time cost more than learning them (docs/daemon.md, "Learning subscriptions in bulk")."""

    def __init__(self, clients: Mapping[str, ClientRecord] | None = None) -> None:
        self.clients: dict[str, ClientRecord] = {
            client: ClientRecord(dict(record.filters), record.persistent)
            for client, record in sorted((clients or {}).items()) if record.filters
        }
        self._connected: dict[str, tuple[bool, int]] = {}
        """client id -> clean flag and MQTT version, for connections seen in this run (oldest first, bounded)"""
        self.filter_count = sum(len(record.filters) for record in self.clients.values())
        """(client, filter) pairs in the table"""
        self.shared_count = sum(_shared(record.filters) for record in self.clients.values())
        """of those, shared subscriptions (`$share/<group>/<filter>`)"""

    def copy(self) -> LocalSubscriptions:
        """An independent copy of the table (its records and counts; not the connections seen)."""
        copied = LocalSubscriptions.__new__(LocalSubscriptions)
        copied.clients = {client: ClientRecord(dict(record.filters), record.persistent, set(record.carried))
                          for client, record in self.clients.items()}
        copied._connected = {}
        copied.filter_count, copied.shared_count = self.filter_count, self.shared_count
        return copied

    def _forget(self, client: str) -> None:
        """Remove `client` and its filters from the table (and the counts)."""
        filters = self.clients.pop(client).filters
        self.filter_count -= len(filters)
        self.shared_count -= _shared(filters)

    def replay(self, sink: SubscriptionSink, now: float) -> int:
        """Tell the sink every filter held; returns the number of (client, filter) pairs."""
        count = 0
        for client, record in sorted(self.clients.items()):
            for filter_, qos in sorted(record.filters.items()):
                sink.local_subscribe(client, filter_, qos, now)
                count += 1
        return count

    def counted(self, client: str) -> int:
        """The client's filters that Mosquitto counts in `$SYS/broker/subscriptions/count` (not shared ones)."""
        record = self.clients.get(client)
        return 0 if record is None else len(record.filters) - _shared(record.filters)

    def count_effect(self, event: ClientSubscribed | ClientUnsubscribed) -> int:
        """What this subscribe or unsubscribe line does to the broker's count, as the table knows the client's
        filters: +1 for a filter it did not hold, -1 for one it held, 0 otherwise (a shared one is not counted)."""
        if event.filter.startswith(SHARED_PREFIX):
            return 0
        record = self.clients.get(event.client)
        held = record is not None and event.filter in record.filters
        if isinstance(event, ClientSubscribed):
            return 0 if held else 1
        return -1 if held else 0

    def apply(self, event: LogEvent, sink: SubscriptionSink, now: float) -> bool:
        """Update the table for one broker-log event and tell the sink; True if the table changed. Events of the
        wrapper's own connections (`own`) change nothing here."""
        if event.own:
            return False
        if isinstance(event, ClientConnected):
            return self._connected_event(event, sink, now)
        if isinstance(event, ClientSubscribed):
            record = self.clients.get(event.client)
            if record is None:
                record = self.clients[event.client] = ClientRecord()
            connection = self._connected.get(event.client)
            persistent = (not connection[0] or connection[1] >= 5) if connection is not None else record.persistent
            changed = record.filters.get(event.filter) != event.qos or record.persistent != persistent
            if event.filter not in record.filters:
                self.filter_count += 1
                self.shared_count += event.filter.startswith(SHARED_PREFIX)
            record.filters[event.filter] = event.qos
            record.carried.discard(event.filter)
            record.persistent = persistent
            sink.local_subscribe(event.client, event.filter, event.qos, now)
            return changed
        if isinstance(event, ClientUnsubscribed):
            record = self.clients.get(event.client)
            if record is None or event.filter not in record.filters:
                return False
            del record.filters[event.filter]
            record.carried.discard(event.filter)
            self.filter_count -= 1
            self.shared_count -= event.filter.startswith(SHARED_PREFIX)
            if not record.filters:
                del self.clients[event.client]
            sink.local_unsubscribe(event.client, event.filter, now)
            return True
        return self._gone_event(event, sink, now)

    def session_ended(self, client: str, sink: SubscriptionSink, now: float) -> bool:
        """The broker no longer holds the (offline) session of `client` (its counts said so): its filters go."""
        if client not in self.clients:
            return False
        self._forget(client)
        sink.local_disconnect(client, now)
        return True

    def drop_carried(self, client: str, sink: SubscriptionSink, now: float) -> bool:
        """`client` reconnected to a session the broker no longer had (session present 0): the filters carried from
        before and not subscribed again go (it subscribes again to what it needs)."""
        record = self.clients.get(client)
        if record is None or not record.carried:
            return False
        for filter_ in sorted(record.carried):
            del record.filters[filter_]
            self.filter_count -= 1
            self.shared_count -= filter_.startswith(SHARED_PREFIX)
            sink.local_unsubscribe(client, filter_, now)
        record.carried = set()
        if not record.filters:
            del self.clients[client]
        return True

    def _connected_event(self, event: ClientConnected, sink: SubscriptionSink, now: float) -> bool:
        self._connected.pop(event.client, None)
        self._connected[event.client] = (event.clean, event.protocol)
        while len(self._connected) > MAX_TRACKED_CONNECTIONS:
            del self._connected[next(iter(self._connected))]
        record = self.clients.get(event.client)
        if record is None:
            return False
        if connect_discards_session(event):
            self._forget(event.client)
            sink.local_disconnect(event.client, now)
            return True
        record.carried = set(record.filters)
        if not record.persistent:
            record.persistent = True
            return True
        return False

    def _gone_event(self, event: ClientGone, sink: SubscriptionSink, now: float) -> bool:
        self._connected.pop(event.client, None)
        record = self.clients.get(event.client)
        if record is None:
            return False
        ends = filters_end_with_session(event)
        if ends is None:
            # The tracker did not see this connection start (the wrapper started later):
            # the persisted flag is the best knowledge of the session kind.
            ends = not record.persistent
        if not ends:
            changed = False
            if event.clean and event.protocol is not None and record.shared_count_of():
                # A shared subscription is no interest but a membership (docs/protocol.md rule 9): kept while the
                # session may have ended, it would have publications chosen for a member that is gone. A clean
                # start's shared filters go with its connection, as before MQTT 5's rules were followed here (a
                # session that was kept in fact has them again when its client subscribes again).
                for filter_ in sorted(f for f in record.filters if f.startswith(SHARED_PREFIX)):
                    del record.filters[filter_]
                    record.carried.discard(filter_)
                    self.filter_count -= 1
                    self.shared_count -= 1
                    sink.local_unsubscribe(event.client, filter_, now)
                changed = True
                if not record.filters:
                    del self.clients[event.client]
                    return True
            if not record.persistent:  # (an MQTT 5 session taken for a clean one before)
                record.persistent = True
                changed = True
            return changed
        self._forget(event.client)
        sink.local_disconnect(event.client, now)
        return True

    def to_json(self) -> dict[str, Any]:
        return {client: {"persistent": record.persistent, "filters": dict(sorted(record.filters.items()))}
                for client, record in sorted(self.clients.items())}

    @classmethod
    def from_json(cls, data: Any, where: str) -> LocalSubscriptions:
        if not isinstance(data, dict):
            raise ValueError(f"{where}: 'clients' is not a mapping")
        clients: dict[str, ClientRecord] = {}
        for client, entry in data.items():
            if not isinstance(client, str) or not isinstance(entry, dict):
                raise ValueError(f"{where}: bad entry for client {client!r}")
            filters = entry.get("filters", {})
            if not isinstance(filters, dict) or not all(
                    isinstance(f, str) and isinstance(q, int) and q in (0, 1, 2) for f, q in filters.items()):
                raise ValueError(f"{where}: bad filters for client {client!r}")
            clients[client] = ClientRecord(dict(filters), bool(entry.get("persistent", False)))
        return cls(clients)


@dataclass
class PersistedState:
    epoch: int | None = None
    broker: str | None = None
    """the broker the subscriptions were learned from (`host:port`)"""
    subscriptions: LocalSubscriptions = field(default_factory=LocalSubscriptions)
    saved_at: float | None = None
    filters: list[str] = field(default_factory=list)
    """the federated filters the node knew (`Node.known_filters`): a restarted node holds its spooled QoS 1/2
    publications on them until their core is heard of (`Node.restore`)"""
    receivers: dict[str, list[str]] = field(default_factory=dict)
    """the brokers known to subscribe to each filter ("host:port", `Node.receivers_known`): a restarted node's
    spooled publications still await those behind a partition (`Node.restore`, docs/protocol.md rule 7f)"""


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves the old or the new content, never a mix."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class StateStore:
    """The state directory: one JSON file and a lock file held while the wrapper runs."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / STATE_FILE
        self._lock: IO[str] | None = None
        self.writes = 0

    def lock(self) -> None:
        """Create the directory and take its lock; StateError if impossible or held by another wrapper."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            handle = open(self.directory / LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115 (held while running)
        except OSError as error:
            raise StateError(f"--state-dir: cannot use {str(self.directory)!r}: {error.strerror or error}; "
                             f"give a writable directory") from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise StateError(f"--state-dir: {str(self.directory)!r} is in use by another wrapper (pid {holder}); "
                             f"give each wrapper its own state directory") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._lock = handle

    def unlock(self) -> None:
        if self._lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock.fileno(), fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def load(self) -> tuple[PersistedState, str | None]:
        """The saved state, and a warning if the file was unreadable (it is then set aside, not lost)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return PersistedState(), None
        except OSError as error:
            raise StateError(f"--state-dir: cannot read {str(self.path)!r}: {error.strerror or error}") from None
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
                raise ValueError(f"expected a JSON object with version {STATE_VERSION}")
            epoch = data.get("epoch")
            if epoch is not None and (not isinstance(epoch, int) or epoch < 0):
                raise ValueError(f"bad epoch {epoch!r}")
            subscriptions = LocalSubscriptions.from_json(data.get("clients", {}), str(self.path))
            broker = data.get("broker")
            saved_at = data.get("saved_at")
            filters = data.get("filters", [])
            if not isinstance(filters, list) or not all(isinstance(f, str) for f in filters):
                raise ValueError(f"bad filters {filters!r}")
            receivers = data.get("receivers", {})
            if not isinstance(receivers, dict) or not all(
                    isinstance(f, str) and isinstance(brokers, list) and all(isinstance(b, str) for b in brokers)
                    for f, brokers in receivers.items()):
                raise ValueError(f"bad receivers {receivers!r}")
            return PersistedState(epoch, broker if isinstance(broker, str) else None, subscriptions,
                                  float(saved_at) if isinstance(saved_at, (int, float)) else None, filters,
                                  receivers), None
        except ValueError as error:
            aside = self.path.with_name(f"{STATE_FILE}.unreadable-{int(time.time())}")
            os.replace(self.path, aside)
            # The epoch is lost with the file; unix time still moves it forward unless
            # the previous life started within the same second.
            return PersistedState(), (f"state file {self.path} was unreadable ({error}); moved it to {aside} "
                                      f"and started with no saved subscriptions")

    def encode(self, state: PersistedState, now: float) -> bytes:
        """The file's content for `state` (a snapshot: later changes to `state` do not reach it)."""
        data = {
            "version": STATE_VERSION, "epoch": state.epoch, "broker": state.broker, "saved_at": round(now, 3),
            "clients": state.subscriptions.to_json(), "filters": sorted(state.filters),
            "receivers": {f: sorted(brokers) for f, brokers in sorted(state.receivers.items())},
        }
        return (json.dumps(data, indent=1, sort_keys=False) + "\n").encode("utf-8")

    def write(self, content: bytes) -> None:
        """Atomically replace the file with `content` (any thread; never two at once: see BackgroundWriter)."""
        atomic_write(self.path, content)
        self.writes += 1

    def save(self, state: PersistedState, now: float) -> None:
        """Write `state` now, on the calling thread (startup and shutdown)."""
        self.write(self.encode(state, now))


class BackgroundWriter:
    """Writes snapshots with `StateStore.write` in an executor: one at a time, the latest waiting one wins.

    Used from the event loop's thread only. `on_error` gets the OSError of a failed write (on the loop).
    """

    def __init__(self, store: StateStore, loop: asyncio.AbstractEventLoop,
                 on_error: Callable[[OSError], None],
                 executor: concurrent.futures.Executor | None = None) -> None:
        self.store = store
        self.loop = loop
        self.on_error = on_error
        self.executor = executor
        self._running: asyncio.Future[None] | None = None
        self._waiting: bytes | Callable[[], bytes] | None = None
        self.superseded = 0
        """snapshots replaced by a newer one before they were written"""
        self.last_seconds = 0.0
        """how long the last write took in the writer's thread, encoding included"""

    @property
    def busy(self) -> bool:
        return self._running is not None or self._waiting is not None

    def submit(self, content: bytes | Callable[[], bytes]) -> None:
        """Write `content`, or what `content()` returns: called in the writer's thread, so the loop does not
        encode a large table (it hands over a copy)."""
        if self._running is not None:
            if self._waiting is not None:
                self.superseded += 1
            self._waiting = content
            return
        self._start(content)

    def _start(self, content: bytes | Callable[[], bytes]) -> None:
        running = self._running = self.loop.run_in_executor(self.executor, self._write, content)
        running.add_done_callback(self._done)

    def _write(self, content: bytes | Callable[[], bytes]) -> None:
        """In the writer's thread: encode (when given a callable) and write; `last_seconds` says how long."""
        started = time.perf_counter()
        self.store.write(content() if callable(content) else content)
        self.last_seconds = time.perf_counter() - started

    def _done(self, future: asyncio.Future[None]) -> None:
        self._running = None
        if not future.cancelled():
            error = future.exception()
            if isinstance(error, OSError):
                self.on_error(error)
            elif error is not None:
                self.on_error(OSError(f"unexpected error: {error!r}"))
        if self._waiting is not None:
            content, self._waiting = self._waiting, None
            self._start(content)

    async def drain(self) -> None:
        """Wait until no write is running or waiting (the waiting one is written first)."""
        while self._running is not None:
            await asyncio.wait([self._running])
            await asyncio.sleep(0)  # let `_done` start the waiting snapshot


class StateSaver:
    """A running wrapper's `PersistedState`, saved at most once per `delay` after a change.

    Used from the event loop's thread. The loop copies the table (a consistent snapshot: a few milliseconds at
    100,000 filters) and a `BackgroundWriter` encodes and writes the copy in its thread; `save_now` writes on
    the calling thread once the writer is idle (shutdown). Encoded on the loop, 100,000 filters took 0.16-0.33 s,
    every `STATE_SAVE_DELAY` while a burst of subscriptions was learnt: the loop answered nothing meanwhile. The
    writer's thread still takes the GIL and a CPU, so `delay` grows with the time the last write took
    (`SAVE_COST_RATIO`): the writes take at most about a tenth of the time. `epoch` reads the node's epoch,
    which the file never lags behind."""

    def __init__(self, store: StateStore, state: PersistedState, loop: asyncio.AbstractEventLoop,
                 epoch: Callable[[], int], now: Callable[[], float],
                 filters: Callable[[], list[str]] | None = None,
                 receivers: Callable[[], dict[str, list[str]]] | None = None) -> None:
        self.store = store
        self.state = state
        self._loop = loop
        self._epoch = epoch
        self._now = now
        self._filters = filters
        self._receivers = receivers
        self._writer = BackgroundWriter(store, loop, self._failed)
        self._handle: asyncio.TimerHandle | None = None

    @property
    def delay(self) -> float:
        """seconds from a change to the save that takes it: `STATE_SAVE_DELAY`, or `SAVE_COST_RATIO` times the
        last write when that is longer"""
        return max(STATE_SAVE_DELAY, SAVE_COST_RATIO * self._writer.last_seconds)

    def schedule(self) -> None:
        """The state changed: save it within `delay`, once for every change made meanwhile."""
        if self._handle is None:
            self._handle = self._loop.call_later(self.delay, self._save)

    def _save(self) -> None:
        self._handle = None
        snapshot, now = self._snapshot(), self._now()
        self._writer.submit(lambda: self.store.encode(snapshot, now))  # encoding and fsync off the loop

    def _snapshot(self) -> PersistedState:
        """A copy of the state as it is now, for the writer's thread (the table goes on changing on the loop)."""
        state = self.state
        state.epoch = max(state.epoch or 0, self._epoch())
        if self._filters is not None:
            state.filters = self._filters()
        if self._receivers is not None:
            state.receivers = self._receivers()
        return replace(state, subscriptions=state.subscriptions.copy(), filters=list(state.filters),
                       receivers={f: list(brokers) for f, brokers in state.receivers.items()})

    def _content(self) -> bytes:
        return self.store.encode(self._snapshot(), self._now())

    async def save_now(self) -> None:
        """Write the state on this thread, after the writer thread's write (one writer at a time)."""
        self.cancel()
        await self._writer.drain()
        try:
            self.store.write(self._content())
        except OSError as error:
            self._failed(error)

    def cancel(self) -> None:
        """Forget the pending save."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _failed(self, error: OSError) -> None:
        log.error("cannot save the state file %s: %s (will retry at the next change)", self.store.path, error)
