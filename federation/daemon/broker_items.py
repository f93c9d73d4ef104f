"""What the broker connection hands the runtime (`BrokerItem`), and the hand-over itself (`LoopHandOff`).

Theory of operation: paho's callbacks run in paho's network thread or on
the asyncio loop (federation.daemon.broker); either way each one becomes a
small immutable item, queued in arrival order and given to the runtime in
batches, so the node sees the broker's log lines, publications and
connection changes in the order they happened, on the loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from federation.protocol.types import Injection, PublicationId


@dataclass(frozen=True, slots=True)
class LogLine:
    """A message on `$SYS/broker/log/...`; acknowledged by the runtime when `qos` is 1 or 2 (packet id `mid`)."""

    topic: str
    payload: bytes
    mid: int = 0
    qos: int = 0


@dataclass(slots=True)
class Publication:
    """A publication made by a local client (never one the wrapper injected: no_local).

    Not frozen, though nothing changes one: one is made per message, and a frozen dataclass's `__init__`
    (an `object.__setattr__` call per field) costs about three times as much."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict[str, Any] | None
    mid: int = 0
    """the broker's packet id of a QoS 1/2 publication: the runtime acknowledges it once the node has taken it
    (`BrokerAdapter.acknowledge`)"""
    dup: bool = False
    """the broker sent it again after a reconnection (MQTT's DUP flag): perhaps one the spool holds already"""


@dataclass(frozen=True, slots=True)
class PublicationRun:
    """Plain publications by local clients read together (`LeanClient.lean_run`): one QoS (0 or 1), none
    retained, sent again or with properties, none on a `$` topic; what a `Publication` each would say, in
    lists, so that nothing is made per message between the broker's bytes and the node."""

    topics: list[str]
    payloads: list[bytes]
    qos: int
    mids: list[int]
    """the broker's packet ids at QoS 1 (acknowledged by the runtime as a `Publication`'s), empty at QoS 0"""

    def publications(self) -> list[Publication]:
        """The same, a `Publication` each (for what the runtime takes one at a time)."""
        mids = self.mids or [0] * len(self.topics)
        return [Publication(topic, payload, self.qos, False, None, mid)
                for topic, payload, mid in zip(self.topics, self.payloads, mids, strict=True)]


@dataclass(frozen=True, slots=True)
class Connected:
    """CONNACK success; the subscriptions are being made."""

    session_present: bool = False
    session_lost: bool = False
    """the broker had our session on the previous connection of this run and has it no more: it restarted
    (without persistence, or the session expired), so its clients' subscriptions are gone too"""
    receive_maximum: int = 65535
    """how many QoS 1/2 publications the broker takes unacknowledged from us (its CONNACK; MQTT's default)"""
    resent: int = 0
    """unfinished QoS 1/2 injections paho sends again in the session (same packet id, DUP; or PUBREL)"""
    reinjected: tuple[Injection, ...] = ()
    """unfinished QoS 1/2 injections the broker cannot have any more (no session): to publish anew, in order"""


@dataclass(frozen=True, slots=True)
class SubscriptionCount:
    """`$SYS/broker/subscriptions/count`: how many subscriptions the broker holds (Mosquitto publishes it every
    `sys_interval` when it changed, and keeps it retained; shared subscriptions are not counted)."""

    count: int


@dataclass(frozen=True, slots=True)
class CountsRound:
    """`$SYS/broker/uptime`: Mosquitto begins a round of its `$SYS` counts (one every `sys_interval`; the counts that
    changed follow it, before any later log line: federation.daemon.session_ledger)."""


@dataclass(frozen=True, slots=True)
class ClientCount:
    """`$SYS/broker/clients/total` (`total`: the sessions the broker holds, connected or not) or
    `$SYS/broker/clients/disconnected` (those without a connection)."""

    total: bool
    count: int


@dataclass(frozen=True, slots=True)
class ConnectRefused:
    """CONNACK failure (e.g. not authorised); paho keeps retrying."""

    reason: str


CLOSED_BEFORE_CONNACK = "the broker closed the connection before answering CONNECT"
RESET_IN_HANDSHAKE = "the broker reset the connection during the TLS handshake"


@dataclass(frozen=True, slots=True)
class ConnectFailed:
    """The TCP connection could not be made (broker down or unreachable), or its TLS handshake failed; the
    adapter retries with backoff."""

    reason: str = ""
    """what the socket or the TLS layer said ("" when nothing more is known)"""
    tls: bool = False
    """True when the TLS handshake failed (the TCP connection was made)"""

    @classmethod
    def of(cls, error: BaseException, tls: bool) -> ConnectFailed:
        """What a failed connection attempt tells the operator: a TLS handshake failure, or the socket's error."""
        if isinstance(error, ssl.SSLError):
            reason = str(getattr(error, "reason", None) or error).replace("_", " ").lower()
            verify = getattr(error, "verify_message", None)
            return cls(f"{reason}: {verify}" if verify else reason, tls=True)
        if tls and isinstance(error, (ConnectionResetError, ConnectionAbortedError)):
            return cls(RESET_IN_HANDSHAKE, tls=True)
        return cls(getattr(error, "strerror", None) or str(error))


@dataclass(frozen=True, slots=True)
class Disconnected:
    reason: str
    expected: bool
    """True when the wrapper asked for it (shutdown)"""
    unfinished: int = 0
    """QoS 1/2 injections the broker had not completed when the connection ended"""


@dataclass(frozen=True, slots=True)
class Subscribed:
    """SUBACK for the wrapper's subscriptions: the filters refused."""

    refused: tuple[str, ...]
    """filters the broker refused, with its reason ("$SYS/broker/log/#: Not authorized")"""


@dataclass(frozen=True, slots=True)
class RetainedApplied:
    """The broker has processed a retained injection of ours (its PUBACK or PUBCOMP, or the PINGRESP after it, was
    read here, in order with the publications around it: federation.daemon.retained_order)."""

    publication: PublicationId


@dataclass(frozen=True, slots=True)
class HandoverFence:
    """A takeover's fence, which this connection published, read back on it: in order with the local clients'
    publications (QoS 1/2) the broker processed before and after it (federation.daemon.roaming)."""

    topic: str


BrokerItem = (LogLine | Publication | PublicationRun | Connected | ConnectRefused | ConnectFailed | Disconnected
              | Subscribed | SubscriptionCount | RetainedApplied | CountsRound | ClientCount | HandoverFence)


def split_oversized_runs(batch: list[BrokerItem], limit: int) -> list[BrokerItem]:
    """`batch` itself, or with each `PublicationRun` that holds a payload above `limit` as its `Publication`s
    (the runtime refuses such a publication, and takes the rest, one at a time)."""
    def oversized(item: BrokerItem) -> bool:
        return isinstance(item, PublicationRun) and max(map(len, item.payloads), default=0) > limit

    if not any(map(oversized, batch)):
        return batch
    return [each for item in batch
            for each in (item.publications() if isinstance(item, PublicationRun) and oversized(item) else (item,))]


class LoopHandOff:
    """Hand-over of items to the asyncio loop, in order, in batches.

    `put` may be called from any thread. The consumer runs on the loop with
    every item queued since its last run: one loop wake-up per burst instead
    of one per message. Called on the loop's own thread (the adapter driven
    by the loop), `put` skips the lock and the self-pipe write of
    `call_soon_threadsafe`, and `flush` (the adapter calls it after reading a
    burst) runs the consumer at once instead of one loop iteration later;
    `hold` (before the read) spares `put` scheduling a run meanwhile.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, consumer: Callable[[list[BrokerItem]], None]) -> None:
        self._loop = loop
        self._consumer = consumer
        self._items: list[BrokerItem] = []
        self._scheduled = False
        self._handle: asyncio.Handle | None = None
        self._lock = threading.Lock()
        """guards `_items` and `_scheduled` against other threads' `put`"""
        self._held = False
        """set by `hold` until the next `flush`"""
        self._loop_thread = threading.get_ident()
        """made on the loop's thread (the running wrapper builds it there)"""

    def put(self, item: BrokerItem) -> None:
        if threading.get_ident() == self._loop_thread:
            self._items.append(item)  # only another thread's put competes, and it takes the lock
            if not self._scheduled and not self._held:
                self._scheduled = True
                self._handle = self._loop.call_soon(self._drain)
            return
        with self._lock:
            self._items.append(item)
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: the daemon is exiting
            self._loop.call_soon_threadsafe(self._drain)

    def hold(self) -> None:
        """On the loop's thread: `flush` is called before the loop runs anything else, so `put` on this thread
        need not schedule a run until then (the adapter's read pass: a scheduled run, cancelled at once, cost
        a handle per pass)."""
        self._held = True

    def flush(self) -> None:
        """On the loop's thread: hand over what is queued now (and cancel the scheduled run); ends a `hold`."""
        self._held = False
        handle = self._handle
        if handle is not None:
            handle.cancel()
        if self._items:
            self._drain()

    def _drain(self) -> None:
        with self._lock:
            self._scheduled = False
            self._handle = None
            batch, self._items = self._items, []
        if batch:
            self._consumer(batch)
