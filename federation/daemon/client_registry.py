"""One client id federation-wide: where each MQTT client is, kept as a retained value of the federation (issue 39,
item 3).

Theory of operation
-------------------
One broker allows one connection per client id: a second CONNECT with the id takes the first over (the old
connection closed, the session resumed or discarded as the new CONNECT's clean start says, the old will sent or
not by the same rule). Brokers of a federation, each unmodified, know only their own clients. So every wrapper
tells the federation where its clients are, in a *record* per client id: a retained value on a topic of the
federation's own (`REGISTRY_PREFIX` and the SHA-256 of the id: `registry_topic`), carried by the retained
publications' tree to every broker's wrapper and never injected into a broker (the wrappers take them out:
`is_record`). The retained machinery gives the registry what it needs: custody (QoS 1), the newest value per topic
everywhere (a version ordered by a hybrid logical clock, federation.daemon.retained_order: a connection made after
the wrapper knew of an earlier one is later), and anti-entropy after a partition.

A record says which broker (its wrapper's address) hosts the client id and how: `connected` (a connection came:
clean start, MQTT version), `offline` (its connection ended and its session may live on: its filters, so that a
broker it reconnects to can ask for its publications at once), or a `handover` (the old host has taken the session
over from its broker after the client moved: the QoS 1/2 messages that were queued for it, for the new host to
give it, and which publications the old broker had processed when it read the queue: `cut` and `had`; and what
the old host held for the client without giving it to its broker, when the client went on from a session it had
adopted before that session's handover had all been given: `carried`). A `late` record, on a topic of its own
per old host, follows a handover: the publications of the session's topics that reached the old broker only
after its fence (federation.daemon.roaming_late).

`ClientRegistry` decides, sans-I/O, what a record means for this wrapper: a newer record naming another host for a
client id this broker has (connected, or an offline session) is a takeover to carry out here (federation.daemon.
roaming); a handover for this broker is a session to finish here. Local clients' own retained publications on the
registry's topics are refused at the origin (federation.daemon.local_publications): a client cannot move another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from federation.daemon import retained

REGISTRY_PREFIX = retained.REGISTRY_PREFIX
"""the registry's topics: this and the SHA-256 (hex) of the client id; a topic no MQTT client is expected to use, and
whose retained publications by clients are refused (never federated)"""
CONNECTED = "connected"
OFFLINE = "offline"
HANDOVER = "handover"
LATE = "late"
"""what reached the old host's broker after its handover, for the new host (federation.daemon.roaming_late)"""
STATES = frozenset({CONNECTED, OFFLINE, HANDOVER, LATE})
RECORD_VERSION = 1
MAX_HANDOVER_MESSAGES = 10_000
"""queued messages one handover carries at most (the rest are counted lost: docs/transparency.md)"""

Message = tuple[str, bytes, int, bool, dict[str, Any] | None]
"""a queued message: topic, payload, QoS, retain flag, MQTT 5 properties (federation.daemon.mqtt_properties)"""
Cut = dict[str, tuple[int, int]]
"""origin ("host:port") -> (epoch, seq): every publication of that origin up to this one the old host's broker had"""
Had = dict[str, tuple[tuple[int, int, int], ...]]
"""origin ("host:port") -> ranges (epoch, first seq, last seq) of publications the old host's broker had"""
Carried = tuple[str, bytes, int, dict[str, Any] | None, str, int, int]
"""a message the old host held for the client: topic, payload, QoS, MQTT 5 properties, and its publication's origin
("host:port"), epoch and seq ("", 0, 0: none, a message of an earlier handover)"""


def ranges(ids: Iterable[tuple[int, int]]) -> tuple[tuple[int, int, int], ...]:
    """(epoch, seq) ids as few (epoch, first, last) ranges (`Had`)."""
    found: list[list[int]] = []
    for epoch, seq in sorted(set(ids)):
        if found and found[-1][0] == epoch and found[-1][2] == seq - 1:
            found[-1][2] = seq
        else:
            found.append([epoch, seq, seq])
    return tuple((epoch, first, last) for epoch, first, last in found)


def registry_topic(client: str) -> str:
    return REGISTRY_PREFIX + hashlib.sha256(client.encode("utf-8", "surrogatepass")).hexdigest()


def is_record(topic: str) -> bool:
    return topic.startswith(REGISTRY_PREFIX)


class RecordError(ValueError):
    """A registry value that is not a record this version reads (a client's, refused at its origin, or another
    version's): ignored, counted."""


@dataclass(frozen=True)
class Record:
    client: str
    host: str
    """the wrapper ("host:port") whose broker has the client id now"""
    state: str
    clean: bool = True
    """the clean start of the connection that made the session (`connected`), or of the one that took it over
    (`handover`)"""
    protocol: int = 5
    filters: Mapping[str, int] = field(default_factory=dict)
    """the session's filters (raw, as its broker logged them) -> granted QoS: `offline` and `handover`"""
    source: str = ""
    """`handover`: the wrapper that took the session over from its broker"""
    messages: tuple[Message, ...] = ()
    """`handover`: the QoS 1/2 messages its broker had queued for it, in order"""
    cut: Cut = field(default_factory=dict)
    """`handover`: per origin, the last publication of a prefix its broker had when the queue was read (the old
    host's own clients' publications, numbered in the order its broker processed them)"""
    lost: int = 0
    """`handover`: queued messages not carried (beyond `MAX_HANDOVER_MESSAGES`)"""
    had: Had = field(default_factory=dict)
    """`handover`: other publications its broker had by then, of the session's topics (injected there lately,
    each stream in its order, streams interleaved): with `cut`, what the new host holds that is a copy"""
    carried: tuple[Carried, ...] = ()
    """`handover`: what the old host held for the client and never gave its broker (it had adopted the session
    from yet another broker and the client went on before all was given), in order, after `messages`"""

    def covers(self, origin: str, epoch: int, seq: int) -> bool:
        """The old broker had this publication when the queue was read (`cut`, `had`)."""
        up_to = self.cut.get(origin)
        if up_to is not None and (epoch, seq) <= up_to:
            return True
        return any(each_epoch == epoch and first <= seq <= last for each_epoch, first, last in self.had.get(origin, ()))

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise RecordError(f"record state {self.state!r}: one of {sorted(STATES)}")
        if not self.client or not self.host:
            raise RecordError("a record needs a client id and a host")

    def encode(self) -> bytes:
        return msgpack.packb({
            "v": RECORD_VERSION, "c": self.client, "h": self.host, "s": self.state, "k": self.clean,
            "p": self.protocol, "f": dict(sorted(self.filters.items())), "src": self.source,
            "m": [list(message) for message in self.messages], "cut": {o: list(p) for o, p in sorted(self.cut.items())},
            "lost": self.lost, "had": {o: [list(r) for r in ranges] for o, ranges in sorted(self.had.items())},
            "x": [list(message) for message in self.carried]}, use_bin_type=True)

    @staticmethod
    def decode(data: bytes) -> Record:
        try:
            value = msgpack.unpackb(data, raw=False, strict_map_key=True)
        except (ValueError, TypeError, msgpack.UnpackException) as error:
            raise RecordError(f"not msgpack: {error}") from None
        if not isinstance(value, dict) or value.get("v") != RECORD_VERSION:
            raise RecordError("not a record of this version")
        try:
            filters = {str(f): int(q) for f, q in value.get("f", {}).items()}
            messages = tuple((str(m[0]), bytes(m[1]), int(m[2]), bool(m[3]), m[4] if isinstance(m[4], dict) else None)
                             for m in value.get("m", []))
            cut = {str(o): (int(p[0]), int(p[1])) for o, p in value.get("cut", {}).items()}
            had = {str(o): tuple((int(r[0]), int(r[1]), int(r[2])) for r in ranges)
                   for o, ranges in value.get("had", {}).items()}
            carried = tuple((str(m[0]), bytes(m[1]), int(m[2]), m[3] if isinstance(m[3], dict) else None, str(m[4]),
                             int(m[5]), int(m[6])) for m in value.get("x", []))
            return Record(str(value["c"]), str(value["h"]), str(value["s"]), bool(value.get("k", True)),
                          int(value.get("p", 5)), filters, str(value.get("src", "")), messages, cut,
                          int(value.get("lost", 0)), had, carried)
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise RecordError(f"a field is missing or of the wrong type: {error}") from None


@dataclass(frozen=True, slots=True)
class TakeOver:
    """Take `client` over on this broker (its connection closed, its session resumed into ours with `clean`
    false, or discarded), then hand what was queued for it to `host`."""

    client: str
    clean: bool
    host: str


@dataclass(frozen=True, slots=True)
class Finish:
    """A handover for this broker: give `record`'s messages to the client (it is, or comes, connected here)."""

    record: Record


Action = TakeOver | Finish


class ClientRegistry:
    """What the registry's newest records mean for this wrapper (module docstring). `own`: this wrapper's address."""

    def __init__(self, own: str) -> None:
        self.own = own
        self.records: dict[str, Record] = {}
        """client id -> its newest record (the retained store keeps them across restarts; this, what was seen)"""
        self.undecodable = 0
        self.takeovers = 0
        """client ids this broker had that connected elsewhere (a newer record named another host)"""
        self.handovers_in = 0

    def received(self, data: bytes, hosted: bool) -> Action | None:
        """A record newer than any before for its topic (the store says so). `hosted`: this broker has the client
        id now (connected, or an offline session that may live). The action it calls for here, if any."""
        try:
            record = Record.decode(data)
        except RecordError:
            self.undecodable += 1
            return None
        if record.state in (OFFLINE, LATE):
            return None  # a connection ended somewhere: it moves nothing (only a new connection takes a client over)
        self.records[record.client] = record
        if record.host == self.own:
            if record.state == HANDOVER and record.source != self.own:
                self.handovers_in += 1
                return Finish(record)
            return None
        if not hosted or record.state == HANDOVER:
            return None
        self.takeovers += 1
        return TakeOver(record.client, record.clean, record.host)

    def known(self, client: str) -> Record | None:
        return self.records.get(client)

    def describe(self) -> dict[str, int]:
        return {"records": len(self.records), "takeovers": self.takeovers, "handovers_in": self.handovers_in,
                "undecodable": self.undecodable}
