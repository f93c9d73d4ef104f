"""Clients that move between the federation's brokers: one connection per client id, and the session follows the
client (issue 39, item 3; the registry: federation.daemon.client_registry, the takeover: federation.daemon.kicker).

Theory of operation
-------------------
Every connection a local client makes is *claimed* in the registry (a `connected` record, this wrapper its host),
and a client with a session that may outlive its connections (any MQTT 5 one, an MQTT 3 one with clean session 0)
has its filters recorded too (an `offline`-state record on a topic of its own, `filters_topic`, rewritten at most
once per `FILTERS_DELAY` while they change), so that the broker it comes back to knows them at once.

When a client connects here whose last claim names another broker, with clean start 0 (it resumes its session),
this wrapper *adopts* the session it had there (`Adopted`): it asks the federation for the session's filters at
once (a pseudo client holds them in the node: `adopted_client`), and holds every publication matching them (and
no other local client's subscription) until the old broker's handover has come and the client has subscribed
again here: Mosquitto, which never saw the client, answered its CONNECT with session present 0, so the client
subscribes again (MQTT 5 says it must discard its session state; paho's `on_connect` and MQTT.js do) or hears
nothing; that much one broker's behaviour cannot be had without changing Mosquitto (docs/transparency.md).

The old broker's wrapper, on the newer claim, takes the client id over there (federation.daemon.kicker: the old
connection closed, the will handled by Mosquitto's own rules for the new clean start, the session resumed and its
queue read, then ended: the old broker stops queueing) and publishes a `handover` record with the messages that
were queued. The new host injects them, in order, once the client has subscribed to a filter matching each, then
what it held meanwhile, leaving out of the held ones those the handover carries too (the same topic, payload and
QoS: both brokers had the publications made between the adoption and the takeover). A handover that does not
come within `ADOPTION_GRACE` (the old broker's wrapper is down) releases what was held.

`Roaming` is the runtime's part, on the loop's thread: it is told the log's events, the registry's records (which
the runtime takes out of the injections: they are never injected), and asked which injections to make now.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from federation.daemon.broker_log import ClientConnected, ClientSubscribed, ClientUnsubscribed, LogEvent
from federation.daemon.client_registry import (
    CONNECTED,
    HANDOVER,
    OFFLINE,
    REGISTRY_PREFIX,
    ClientRegistry,
    Finish,
    Record,
    RecordError,
    TakeOver,
    registry_topic,
)
from federation.daemon.kicker import Outcome
from federation.daemon.retained import RetainedStore
from federation.daemon.state import SHARED_PREFIX, LocalSubscriptions, SubscriptionSink
from federation.protocol.topic_filter import federated_filter, matches
from federation.protocol.types import Address, Injection

log = logging.getLogger("federation.daemon")

FILTERS_DELAY = 0.5
"""seconds a client's filters record waits for more changes before it is published"""
ADOPTION_GRACE = 30.0
"""seconds a client's adopted session holds publications for it at most (the handover, its subscriptions)"""
MAX_HELD = 10_000
"""publications one adopted session holds at most (the oldest go first, counted)"""
ASSIGNED_PREFIX = "auto-"
"""how Mosquitto begins the client ids it assigns (an empty client id, MQTT 5's Assigned Client Identifier): no
record is made for those (mosquitto_pub and its like would leave one per run in every wrapper's store)"""
PSEUDO_PREFIX = "\x00session:"
"""the pseudo client holding an adopted session's filters in the node (U+0000 is in no client id)"""


def filters_topic(client: str) -> str:
    return registry_topic(client) + "/filters"


def adopted_client(client: str) -> str:
    return PSEUDO_PREFIX + client


class Originate(Protocol):
    """Originates a registry record as a retained QoS 1 publication of this wrapper's
    (`LocalPublications.originate_record`)."""

    def __call__(self, topic: str, payload: bytes, now: float, /) -> None: ...


class StartKicker(Protocol):
    """Starts a takeover of `client` on the local broker with `clean` (federation.daemon.kicker); `done` gets its
    outcome on the loop's thread."""

    def __call__(self, client: str, clean: bool, done: Callable[[Outcome], None], /) -> None: ...


@dataclass
class Adopted:
    """A session this broker took from another (module docstring)."""

    client: str
    source: str
    filters: dict[str, int]
    """raw filter -> qos, as the old host recorded them"""
    deadline: float
    held: list[Injection] = field(default_factory=list)
    drained: list[Injection] | None = None
    """the handover's messages, once it came"""
    subscribed: set[str] = field(default_factory=set)
    """filters the client subscribed to again here"""
    dropped: int = 0

    def wants(self, topic: str) -> bool:
        return any(matches(filter_, topic) for filter_ in self.filters if not filter_.startswith(SHARED_PREFIX))

    def resubscribed(self, topic: str) -> bool:
        return any(matches(filter_, topic) for filter_ in self.subscribed)


@dataclass
class RoamingCounts:
    claims: int = 0
    filters_records: int = 0
    takeovers: int = 0
    """client ids this broker had that connected on another broker: taken over here"""
    taken_queued: int = 0
    """queued messages read from this broker's sessions and handed to their new host"""
    adopted: int = 0
    """sessions this broker took from another"""
    delivered: int = 0
    """handed-over messages injected here"""
    duplicates_left_out: int = 0
    """held publications the handover carried too (both brokers had them)"""
    dropped: int = 0
    """held or handed-over messages no subscription of their client took within the grace"""
    handovers_late: int = 0
    """adoptions whose handover did not come within the grace"""


class Roaming:
    """The runtime's part of one-client-id-federation-wide (module docstring)."""

    def __init__(self, own: Address, table: LocalSubscriptions, sink: SubscriptionSink, store: RetainedStore,
                 originate: Originate, start_kicker: StartKicker, connected_here: Callable[[str], bool],
                 offline_here: Callable[[str], bool]) -> None:
        """`connected_here(client)`: the log tracker has it connected; `offline_here(client)`: the session ledger
        knows an offline session of it that may live."""
        self.own = f"{own.host}:{own.port}"
        self.registry = ClientRegistry(self.own)
        self.table = table
        self.sink = sink
        self.store = store
        self._originate = originate
        self._start_kicker = start_kicker
        self._connected_here = connected_here
        self._offline_here = offline_here
        self.adopted: dict[str, Adopted] = {}
        self.counts = RoamingCounts()
        self._filters_due: dict[str, float] = {}
        """client -> when its filters record is to be published"""
        self._kicking: set[str] = set()
        self.filters_known = 0
        """filters records received (one per change of a client's filters elsewhere)"""
        self._handover_ids = itertools.count(1)
        self._handover_epoch = int(time.time())

    @property
    def holding(self) -> bool:
        """An adopted session holds publications: every injection must pass `admit`."""
        return bool(self.adopted)

    # ------------------------------------------------------------ the log's events

    def log_event(self, event: LogEvent, now: float) -> list[Injection]:
        """A log event of a local client, after the table took it; what it releases (held for an adopted session),
        in order."""
        if event.own:
            return []
        if isinstance(event, ClientConnected):
            self._connected(event, now)
        elif isinstance(event, (ClientSubscribed, ClientUnsubscribed)):
            record = self.table.clients.get(event.client)
            if record is not None and record.persistent:
                self._filters_due.setdefault(event.client, now + FILTERS_DELAY)
            if isinstance(event, ClientSubscribed) and event.client in self.adopted:
                return self._resubscribed(self.adopted[event.client], event.filter, now)
        # A client that leaves an adopted session here before the handover came: what is held waits for it (it may
        # come back here) until the grace ends, or goes on with it when it connects elsewhere (`_take_over`).
        return []

    def _connected(self, event: ClientConnected, now: float) -> None:
        client = event.client
        if client.startswith(ASSIGNED_PREFIX):
            return  # an id the broker made up for a client that gave none: it never connects again with it
        previous = self._last_claim(client)
        self.counts.claims += 1
        self._originate(registry_topic(client), Record(client, self.own, CONNECTED, event.clean,
                                                       event.protocol).encode(), now)
        if event.clean or previous is None or previous.host == self.own or client in self.adopted:
            return
        filters = self._last_filters(client, previous)
        adopted = Adopted(client, previous.host, filters, now + ADOPTION_GRACE)
        self.adopted[client] = adopted
        self.counts.adopted += 1
        for raw, qos in sorted(filters.items()):
            federated = federated_filter(raw)
            if federated is not None and not raw.startswith(SHARED_PREFIX):
                self.sink.local_subscribe(adopted_client(client), federated, qos, now)
        log.info("client %r connected here with clean start 0, its session on %s: asking for what that session "
                 "gets (%d filters) and waiting for the messages queued there", client, previous.host,
                 len(filters))

    def _last_claim(self, client: str) -> Record | None:
        """The registry's newest claim of `client` (the retained store keeps it across restarts)."""
        known = self.registry.known(client)
        if known is not None and known.state != OFFLINE:
            return known
        value = self.store.values.get(registry_topic(client))
        if value is None or not value.payload:
            return None
        try:
            return Record.decode(value.payload)
        except RecordError:
            return None

    def _last_filters(self, client: str, claim: Record) -> dict[str, int]:
        value = self.store.values.get(filters_topic(client))
        if value is not None and value.payload:
            try:
                record = Record.decode(value.payload)
            except RecordError:
                record = None
            if record is not None and record.host == claim.host:
                return dict(record.filters)
        return dict(claim.filters)

    # ------------------------------------------------------------ the registry's records

    def record(self, injection: Injection, now: float) -> list[Injection]:
        """A registry record newer than any before for its topic (the runtime took it out of the injections: it
        is never injected); what it releases, in order."""
        client_topic = injection.topic.removesuffix("/filters")
        if client_topic != injection.topic:
            self.filters_known += 1
            return []  # a filters record: read when the client connects here (`_last_filters`)
        try:
            record = Record.decode(injection.payload)
        except RecordError:
            self.registry.undecodable += 1
            return []
        previous = self.registry.known(record.client)
        hosted = self._connected_here(record.client) or self._offline_here(record.client) \
            or record.client in self.table.clients \
            or (previous is not None and previous.host == self.own and previous.state != HANDOVER)
        action = self.registry.received(injection.payload, hosted and record.client not in self._kicking)
        if isinstance(action, TakeOver):
            self._take_over(action, now)
        elif isinstance(action, Finish):
            return self._finish(action.record, now)
        return []

    def _take_over(self, action: TakeOver, now: float) -> None:
        client = action.client
        self._kicking.add(client)
        self.counts.takeovers += 1
        record = self.table.clients.get(client)
        filters = dict(record.filters) if record is not None else {}
        adopted = self.adopted.pop(client, None)
        if adopted is not None:  # it went on to another broker before its handover came: what it held goes on
            self._end_adoption(adopted, now)
        log.info("client %r connected on %s: taking it over on this broker (clean start %d)", client, action.host,
                 action.clean)

        def done(outcome: Outcome) -> None:
            self._kicking.discard(client)
            self.counts.taken_queued += len(outcome.messages)
            if outcome.problem is not None:
                log.warning("taking client %r over on this broker: %s; %d queued messages handed over", client,
                            outcome.problem, len(outcome.messages))
            self._originate(registry_topic(client), Record(
                client, action.host, HANDOVER, action.clean, 5, filters, self.own, tuple(outcome.messages),
                lost=outcome.lost).encode(), now)

        self._start_kicker(client, action.clean, done)

    def _finish(self, record: Record, now: float) -> list[Injection]:
        adopted = self.adopted.get(record.client)
        if adopted is None:
            if not record.messages or not self._connected_here(record.client):
                return []
            adopted = self.adopted[record.client] = Adopted(record.client, record.source, dict(record.filters),
                                                            now + ADOPTION_GRACE)
            current = self.table.clients.get(record.client)
            adopted.subscribed = set(current.filters) if current is not None else set()
        epoch = self._handover_epoch
        try:
            source = Address.parse(record.source, 0)
        except ValueError:
            source = Address(record.source, 0)
        drained = [Injection(topic, payload, qos, False, properties, (source, epoch, next(self._handover_ids)))
                   for topic, payload, qos, _retain, properties in record.messages]
        # What both brokers had (published between the adoption and the takeover) is given once.
        remaining = list(adopted.held)
        for message in drained:
            for index, held in enumerate(remaining):
                if (held.topic, held.payload, held.qos) == (message.topic, message.payload, message.qos):
                    del remaining[index]
                    self.counts.duplicates_left_out += 1
                    break
        adopted.held = remaining
        adopted.drained = drained
        if not adopted.filters and record.filters:
            adopted.filters = dict(record.filters)
        return self._release(adopted, now)

    def _resubscribed(self, adopted: Adopted, raw_filter: str, now: float) -> list[Injection]:
        adopted.subscribed.add(raw_filter)
        federated = federated_filter(raw_filter)
        if raw_filter in adopted.filters and federated is not None:
            self.sink.local_unsubscribe(adopted_client(adopted.client), federated, now)
        return self._release(adopted, now)

    def _release(self, adopted: Adopted, now: float) -> list[Injection]:
        """Once the handover came: its messages, then what was held, each as soon as a subscription of the client
        here takes it; the adoption ends when nothing is left."""
        if adopted.drained is None:
            return []
        released: list[Injection] = []
        for queue_name in ("drained", "held"):
            queue: list[Injection] = getattr(adopted, queue_name)
            kept: list[Injection] = []
            for injection in queue:
                if adopted.resubscribed(injection.topic) and not kept:
                    released.append(injection)
                else:
                    kept.append(injection)  # in order: one waiting keeps those after it waiting
            setattr(adopted, queue_name, kept)
            if kept:
                break
        self.counts.delivered += sum(1 for injection in released if injection.publication[1] == self._handover_epoch)
        if not adopted.drained and not adopted.held:
            self._end_adoption(adopted, now)
        return released

    def _end_adoption(self, adopted: Adopted, now: float) -> None:
        """No more holding for it: the pseudo client's filters leave the node."""
        self.adopted.pop(adopted.client, None)
        for raw in sorted(adopted.filters):
            federated = federated_filter(raw)
            if federated is not None and not raw.startswith(SHARED_PREFIX):
                self.sink.local_unsubscribe(adopted_client(adopted.client), federated, now)

    # ------------------------------------------------------------ injections

    def admit(self, injections: list[Injection], now: float) -> list[Injection]:
        """The injections to make now: those an adopted session waits for are held (in order) unless another local
        client's subscription takes them too."""
        if not self.adopted:
            return injections
        admitted: list[Injection] = []
        for injection in injections:
            holder = next((adopted for adopted in self.adopted.values() if adopted.wants(injection.topic)), None)
            if holder is None or self._another_takes(holder.client, injection.topic):
                admitted.append(injection)
                continue
            holder.held.append(injection)
            if len(holder.held) > MAX_HELD:
                holder.held.pop(0)
                holder.dropped += 1
                self.counts.dropped += 1
        return admitted

    def _another_takes(self, client: str, topic: str) -> bool:
        return any(other != client and not other.startswith("\x00") and
                   any(matches(filter_, topic) for filter_ in record.filters if not filter_.startswith(SHARED_PREFIX))
                   for other, record in self.table.clients.items())

    # ------------------------------------------------------------ time

    def tick(self, now: float) -> list[Injection]:
        """Once a second: filters records due, adoptions whose grace ended (what a subscription of the client takes
        is released, the rest dropped, counted). Returns what is released."""
        due = [client for client, at in self._filters_due.items() if at <= now]
        for client in sorted(due):
            del self._filters_due[client]
            record = self.table.clients.get(client)
            if record is None or not record.persistent:
                continue
            self.counts.filters_records += 1
            self._originate(filters_topic(client), Record(client, self.own, OFFLINE, False, 5,
                                                          dict(record.filters)).encode(), now)
        released: list[Injection] = []
        for adopted in [adopted for adopted in self.adopted.values() if adopted.deadline <= now]:
            if adopted.drained is None:
                self.counts.handovers_late += 1
                log.warning("no handover came for client %r from %s within %g s: what was held for it goes to its "
                            "subscriptions here", adopted.client, adopted.source, ADOPTION_GRACE)
            taken = [injection for injection in [*(adopted.drained or []), *adopted.held]
                     if adopted.resubscribed(injection.topic)]
            left = len(adopted.drained or []) + len(adopted.held) - len(taken)
            self.counts.dropped += left
            released += taken
            self._end_adoption(adopted, now)
        return released

    def describe(self) -> dict[str, object]:
        counts = self.counts
        return {**self.registry.describe(), "filters_received": self.filters_known,
                "claims": counts.claims, "filters_records": counts.filters_records,
                "takeovers": counts.takeovers, "taken_queued": counts.taken_queued, "adopted": counts.adopted,
                "adopting": len(self.adopted), "held": sum(len(a.held) for a in self.adopted.values()),
                "delivered": counts.delivered, "duplicates_left_out": counts.duplicates_left_out,
                "dropped": counts.dropped, "handovers_late": counts.handovers_late}


__all__ = ["REGISTRY_PREFIX", "Roaming", "adopted_client", "filters_topic"]
