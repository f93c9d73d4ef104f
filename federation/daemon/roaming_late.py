"""What reaches a client's old broker after its takeover's fence, and what its new broker gave it: so that a
publication the federation routed only to the old broker while the client was between brokers still reaches the
client, once (issue 39 item 5; federation.daemon.roaming decides when each part is called).

Theory of operation
-------------------
A publication on a moved session's topics reaches the old broker after the takeover's fence when its origin sent it
before it knew of the new host (the client was between brokers; under load that takes seconds), or when the old
wrapper wrote it there late: the session has ended, so it went nowhere, and the new host never had it. Measured
behind HAProxy: a publication of the new broker's own publisher, made a millisecond before the client connected
there, routed to the old broker only and injected there after the fence. So the old host watches, from its
kicker's start until `FORWARD_WINDOW` after its handover, the publications its broker processes on the session's
topics that the handover does not cover (`Record.covers`: what the broker had by the fence), its injections and its
own clients' publications (`LateForwarding`). Each second with new ones it publishes a `late` record
(client_registry.LATE) with all of them so far, on a topic of its own per old host (a newer record replaces an older
one on its topic, so each is whole and none may be missed).

The new host remembers, from an adoption's start until `SEEN_WINDOW` after its end, which publications it gave the
client or holds for it (`Seen`), and gives those of a late record it has not: after the handover's messages while
the adoption lasts, else at once (behind what came since, as a publication delayed in the federation would be). A
client that has moved on again is followed: the takeover of it here forwards them in this host's own late record.
With neither the client nor a takeover of it here they are counted lost (`roaming_client_gone`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from federation.daemon.client_registry import LATE, Carried, Record, registry_topic
from federation.daemon.state import SHARED_PREFIX
from federation.protocol.topic_filter import matches

FORWARD_WINDOW = 5.0
"""seconds after a handover during which the old host forwards what still reaches its broker for the session"""
SEEN_WINDOW = FORWARD_WINDOW + 10.0
"""seconds after an adoption ends during which the new host remembers what it gave the client (a late record
comes within `FORWARD_WINDOW` and a second of the old host's handover, plus its way through the federation)"""
PENDING_WAIT = 2.0
"""seconds a late record's publications for a client that left this broker wait for its takeover here to begin
(the client's claim elsewhere can come just after them), then are counted lost"""
LATE_PART = "/late/"
"""a late record's topic: the client's registry topic, this, and a hash of the old host's address"""
MAX_FORWARDED = 10_000
"""publications one late record carries at most (beyond, counted lost: `roaming_late_full`)"""

Key = tuple[str, int, int]
"""a publication: origin ("host:port"), epoch, seq"""


def late_topic(client: str, source: str) -> str:
    return registry_topic(client) + LATE_PART + hashlib.sha256(source.encode()).hexdigest()[:16]


def is_late_topic(topic: str) -> bool:
    return LATE_PART in topic


def key_of(item: Carried) -> Key | None:
    """A carried message's publication, None for one without (a queued message of a handover)."""
    _topic, _payload, _qos, _properties, origin, epoch, seq = item
    return (origin, epoch, seq) if origin else None


def _wanted(filters: list[str], topic: str) -> bool:
    return any(matches(filter_, topic) for filter_ in filters)


def session_filters(filters: dict[str, int] | list[str]) -> list[str]:
    """The filters a session's own messages come by (shared subscriptions deliver to the group, not to it)."""
    return sorted(filter_ for filter_ in filters if not filter_.startswith(SHARED_PREFIX))


@dataclass
class Forward:
    """One takeover's forwarding, on the old host (module docstring)."""

    client: str
    host: str
    """the new host"""
    filters: list[str]
    record: Record | None = None
    """the handover, once made: what it covers is not forwarded"""
    until: float | None = None
    items: list[Carried] = field(default_factory=list)
    keys: set[Key] = field(default_factory=set)
    sent: int = 0
    """items in the last late record published"""
    overflow: int = 0
    closed: bool = False
    """the client came back to this broker: what reaches it now, the client gets here"""

    def add(self, item: Carried) -> bool:
        """Keep `item` unless it is known already or covered by the handover; True if kept."""
        key = key_of(item)
        if key is not None:
            if key in self.keys or (self.record is not None and self.record.covers(*key)):
                return False
            self.keys.add(key)
        if len(self.items) >= MAX_FORWARDED:
            self.overflow += 1
            return False
        self.items.append(item)
        return True


class LateForwarding:
    """The old host's side (module docstring). `own`: this wrapper's address as records name it."""

    def __init__(self, own: str) -> None:
        self.own = own
        self.forwards: dict[tuple[str, str], Forward] = {}
        """(client, new host) -> its forwarding"""
        self.forwarded = 0
        """publications sent on in late records (each once, however many records carried it)"""

    def start(self, client: str, host: str, filters: list[str]) -> None:
        """A takeover of `client` for `host` starts (before its fence): what follows on its topics is watched."""
        self.forwards[(client, host)] = Forward(client, host, filters)

    def handed_over(self, record: Record, fenced: bool, now: float) -> None:
        """Its handover was made. `fenced`: it names what the broker had by the fence; without that, what was
        watched since the kicker's start may be in its queue (then only what comes from now on is forwarded)."""
        forward = self.forwards.get((record.client, record.host))
        if forward is None:
            return
        forward.record, forward.until = record, now + FORWARD_WINDOW
        kept = [item for item in forward.items if fenced and not record.covers(*(key_of(item) or ("", 0, 0)))]
        forward.items, forward.keys = kept, {key for key in map(key_of, kept) if key is not None}

    def processed(self, item: Carried, topic: str) -> None:
        """A publication this broker processes now (an injection, or one of its own clients')."""
        for forward in self.forwards.values():
            if not forward.closed and _wanted(forward.filters, topic):
                forward.add(item)

    def stop(self, client: str, host: str | None = None) -> None:
        """`client` connected here again (`host` None), or on `host`: nothing more is forwarded for it but to that
        host (what was is still sent). A forwarding to a broker the client has left could give it there what it
        got since on another (measured: 6 QoS 2 duplicates in one run)."""
        for forward in self.forwards.values():
            if forward.client == client and forward.host != host:
                forward.closed = True

    def away(self, client: str) -> bool:
        """This broker handed `client` over lately and it has not come back: what the broker gives now, the client
        does not get here."""
        return any(forward.client == client and not forward.closed for forward in self.forwards.values())

    def carry(self, client: str, items: list[Carried]) -> bool:
        """Messages for `client`, which moved on from here: sent on by its newest forwarding; False if none."""
        forwards = [forward for forward in self.forwards.values() if forward.client == client]
        if not forwards:
            return False
        newest = max(forwards, key=lambda forward: forward.until if forward.until is not None else float("inf"))
        for item in items:
            newest.add(item)
        return True

    def due(self, now: float) -> tuple[list[Record], int]:
        """The late records to publish now (those with something new), and how many publications went beyond
        `MAX_FORWARDED` since the last call; forwardings whose window ended are forgotten."""
        records: list[Record] = []
        overflow = 0
        for key, forward in sorted(self.forwards.items()):
            if forward.record is not None and len(forward.items) > forward.sent:
                self.forwarded += len(forward.items) - forward.sent
                forward.sent = len(forward.items)
                records.append(Record(forward.client, forward.host, LATE, forward.record.clean, 5,
                                      {}, self.own, carried=tuple(forward.items)))
            overflow += forward.overflow
            forward.overflow = 0
            if forward.until is not None and forward.until <= now:
                del self.forwards[key]
        return records, overflow


class Seen:
    """The new host's side (module docstring): per client, the publications given to it or held for it here."""

    def __init__(self) -> None:
        self.filters: dict[str, list[str]] = {}
        self.keys: dict[str, set[Key]] = {}
        self.until: dict[str, float] = {}
        """client -> when it is forgotten (absent: its adoption lasts)"""
        self.given_late: dict[str, set[Key]] = {}
        """client -> publications given here from a late record: a copy arriving after it is one too many"""

    def watch(self, client: str, filters: list[str]) -> None:
        self.filters[client] = filters
        self.keys.setdefault(client, set())
        self.until.pop(client, None)

    def ended(self, client: str, now: float) -> None:
        if client in self.filters:
            self.until[client] = now + SEEN_WINDOW

    def mark(self, key: Key, topic: str, here: Callable[[str], bool]) -> None:
        """A publication this broker gives now: given to each watched client `here` (not one handed over to
        another broker lately: a late record may bring it what it did not get here)."""
        for client, filters in self.filters.items():
            if _wanted(filters, topic) and here(client):
                self.keys[client].add(key)

    def new(self, client: str, items: tuple[Carried, ...], now: float) -> list[Carried]:
        """Those of `items` not given here yet (now taken as given: a late record carries all its publications
        again each time, so a client not watched here is remembered from now on too)."""
        if client not in self.filters:
            self.watch(client, [])
            self.until[client] = now + SEEN_WINDOW
        known = self.keys[client]
        fresh = []
        for item in items:
            key = key_of(item)
            if key is None or key not in known:
                fresh.append(item)
                if key is not None:
                    known.add(key)
        return fresh

    def expire(self, now: float) -> None:
        for client in [client for client, until in self.until.items() if until <= now]:
            del self.until[client], self.filters[client], self.keys[client]
            self.given_late.pop(client, None)

    def gave_late(self, client: str, items: list[Carried]) -> None:
        self.given_late.setdefault(client, set()).update(key for key in map(key_of, items) if key is not None)

    def late_copy(self, key: Key, topic: str) -> str | None:
        """The client a late record gave this publication to here, if it is on one of its topics."""
        for client, keys in self.given_late.items():
            if key in keys and _wanted(self.filters.get(client, []), topic):
                return client
        return None

    def __bool__(self) -> bool:
        return bool(self.filters)
