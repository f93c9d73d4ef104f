"""The wrapper's retained store and what crossing the federation does to a publication's expiry.

Theory of operation
-------------------
Every retained publication reaches every broker of the component and is injected there with retain 1
(docs/protocol.md rule 10), so each broker holds the current retained value and serves its own new subscribers,
with its own retain handling, retain-as-published and QoS downgrade. Two copies of one topic's retained value can
cross (two publishers, a partition that heals), and a broker must end with the newest: the wrapper keeps what
it last gave its broker per topic (`RetainedStore`), with the value's *version*, and does not inject an older
one (counted `retained_stale`). A deletion (an empty retained payload) is kept as a tombstone, so a late copy
of the value it deleted is refused too.

The version is (time, origin epoch, origin seq, origin address), compared in that order: the time is the
origin wrapper's wall clock, in milliseconds, when it took the publication from its broker, unless the order of
its broker's writes asks for another (federation.daemon.retained_order: a hybrid logical clock, one millisecond
past the topic's newest known value when that is later, or just below an injection the broker will process
after it); it travels in the publication's properties under `ORIGIN_TIME`, and a time other than the wall clock
under `ORDER` beside it (`stamp`), which no MQTT client sees (`prepare` takes both out before the injection).
Epoch and seq order one origin's publications whatever its clock does; the address breaks the remaining ties.
Across origins the newest is the one with the later time, so brokers' clocks should be synchronised (NTP); a
clock that runs behind still orders a write after the values its broker holds (the hybrid clock).

The same stamp gives MQTT 5 message expiry its meaning across the federation: the receiving wrapper subtracts
the time since the origin took the publication (its wall clock minus the stamp, at least 0) from the Message
Expiry Interval, and drops a publication whose interval has run out (counted `message_expired`) instead of
injecting it with its original interval. The broker then counts down what is left, as for a local client.

The store is bounded (`max_topics`, `max_bytes`: tombstones go first, then the values kept longest; counted
`evicted`), and kept across a restart in the state directory (`RETAINED_FILE`, a `RecordLog`: one record per
value stored, compacted when dead records outweigh live ones). A broker that comes back without its session
(restarted without persistence) lost its retained messages: `reinjections` gives the store's values back, with
their remaining expiry.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from federation.daemon.record_log import RecordLog
from federation.protocol.retained_sync import RetainedVersions
from federation.protocol.types import Address, Injection, PublicationId
from federation.protocol.wire_types import RetainedCopy

REGISTRY_PREFIX = "//sessions//"
"""the registry of client ids' topics (federation.daemon.client_registry, which names it too)"""
ORIGIN_TIME = "federation_origin_ms"
"""tm.properties key: the origin wrapper's wall clock (ms) when it took a retained or expiring publication"""
ORDER = "federation_order_ms"
"""tm.properties key: the time of a retained publication's version when it is not `ORIGIN_TIME` (issue 39:
federation.daemon.retained_order); message expiry still counts from `ORIGIN_TIME`"""
EXPIRY = "message_expiry_interval"
"""tm.properties key of MQTT 5's Message Expiry Interval (federation.daemon.mqtt_properties)"""
RETAINED_FILE = "retained.log"
"""the store's file in the state directory"""
MAX_TOPICS = 100_000
"""retained topics kept at most (values and tombstones)"""
MAX_BYTES = 256 * 1024 * 1024
"""payload bytes kept at most"""
COMPACT_RATIO = 4
COMPACT_MIN_BYTES = 1024 * 1024

Version = tuple[int, int, int, str, int]
"""(origin time in ms, origin epoch, origin seq, origin host, origin port): the newest is the largest"""


def stamp(properties: dict[str, Any] | None, retain: bool, wall: float,
          order_ms: int | None = None) -> dict[str, Any] | None:
    """A local publication's properties as the federation carries them: with `ORIGIN_TIME` when it is retained or
    expires (`wall`: seconds since the epoch), and for a retained one whose version takes another time
    (`order_ms`, federation.daemon.retained_order), that time under `ORDER`; other publications are left as they
    are (nothing added)."""
    if not retain and (properties is None or EXPIRY not in properties):
        return properties
    wall_ms = int(wall * 1000)
    stamped = {**(properties or {}), ORIGIN_TIME: wall_ms}
    if retain and order_ms is not None and order_ms != wall_ms:
        stamped[ORDER] = order_ms
    return stamped


def version_of(publication: PublicationId, properties: dict[str, Any] | None) -> Version:
    origin, epoch, seq = publication
    time_ms = 0
    if properties:
        time_ms = properties.get(ORDER, properties.get(ORIGIN_TIME, 0))
    return (time_ms if isinstance(time_ms, int) else 0, epoch, seq, origin.host, origin.port)


def remaining_expiry(properties: dict[str, Any], wall: float) -> int | None:
    """The Message Expiry Interval left now (whole seconds, rounded up), 0 when it ran out, None without one."""
    interval = properties.get(EXPIRY)
    if not isinstance(interval, int):
        return None
    origin_ms = properties.get(ORIGIN_TIME)
    if not isinstance(origin_ms, int):
        return interval
    left = interval - max(0.0, wall - origin_ms / 1000)
    return math.ceil(left) if left > 0 else 0


@dataclass(slots=True)
class RetainedValue:
    version: Version
    qos: int
    payload: bytes
    """empty: a tombstone (the value was deleted)"""
    properties: dict[str, Any] | None
    """as carried (with `ORIGIN_TIME`): its expiry is computed again at each injection"""

    @property
    def publication(self) -> PublicationId:
        origin_ms, epoch, seq, host, port = self.version
        return (Address(host, port), epoch, seq)


@dataclass
class RetainedCounts:
    stored: int = 0
    """values and tombstones that replaced an older one or were new"""
    stale: int = 0
    """retained publications older than the stored value: not injected"""
    repeated: int = 0
    """retained publications that are the stored value itself (a copy replayed to a restarted wrapper, whose
    duplicate cache started empty): not injected again, and no drop: the broker holds it"""
    expired: int = 0
    """publications whose Message Expiry Interval ran out in the federation: not injected"""
    evicted: int = 0
    """values and tombstones forgotten for the bounds"""
    reinjected: int = 0
    """values given again to a broker that lost them"""
    registry_stored: int = 0
    """records of the registry of client ids stored (federation.daemon.client_registry; not in `stored`)"""
    registry_stale: int = 0
    """records older than the one kept"""


class RetainedStore:
    """topic -> the newest retained value this wrapper knows (see the module docstring)."""

    def __init__(self, log: RecordLog | None = None, max_topics: int = MAX_TOPICS, max_bytes: int = MAX_BYTES) -> None:
        self.log = log
        self.max_topics = max_topics
        self.max_bytes = max_bytes
        self.values: dict[str, RetainedValue] = {}
        """in the order stored (the oldest first: evicted first after the tombstones)"""
        self.bytes = 0
        self.counts = RetainedCounts()
        self.undecodable = 0
        self.retained_versions = RetainedVersions()
        """every topic's version by bucket, for the node's anti-entropy of the stores (`Node.attach_retained`)"""
        if log is not None:
            for record in log.loaded():
                self._load(record)
            self._bound()

    def _load(self, record: bytes) -> None:
        try:
            topic, origin_ms, epoch, seq, host, port, qos, payload, properties = msgpack.unpackb(record, raw=False)
            version: Version = (int(origin_ms), int(epoch), int(seq), str(host), int(port))
            if properties is not None and not isinstance(properties, dict):
                raise ValueError("properties")
            self._put(str(topic), RetainedValue(version, int(qos), bytes(payload), properties))
        except (ValueError, TypeError, msgpack.UnpackException):
            self.undecodable += 1

    def _put(self, topic: str, value: RetainedValue) -> bool:
        old = self.values.get(topic)
        if old is not None:
            if value.version <= old.version:
                return False
            self.bytes -= len(old.payload)
            del self.values[topic]  # to the end: the newest stored
        self.values[topic] = value
        self.bytes += len(value.payload)
        self.retained_versions.put(topic, value.version)
        return True

    def known_ms(self, topic: str) -> int | None:
        """The time of the newest version known for `topic` (a tombstone's too), None when none is kept."""
        value = self.values.get(topic)
        return None if value is None else value.version[0]

    def holds(self, topic: str, publication: PublicationId, properties: dict[str, Any] | None) -> bool:
        """Is this retained publication the very value stored for `topic` (the same version)? Counted `repeated`."""
        old = self.values.get(topic)
        if old is None or old.version != version_of(publication, properties):
            return False
        self.counts.repeated += 1
        return True

    def offer(self, topic: str, publication: PublicationId, qos: int, payload: bytes,
              properties: dict[str, Any] | None) -> bool:
        """A retained publication given to (or made on) the local broker: True if it is the newest of its topic
        (stored, written to the log), False if the store holds a newer one (counted stale)."""
        value = RetainedValue(version_of(publication, properties), qos, payload, properties)
        registry = topic.startswith(REGISTRY_PREFIX)
        if not self._put(topic, value):
            if registry:
                self.counts.registry_stale += 1
            else:
                self.counts.stale += 1
            return False
        if registry:
            self.counts.registry_stored += 1
        else:
            self.counts.stored += 1
        if self.log is not None:
            origin_ms, epoch, seq, host, port = value.version
            self.log.append([msgpack.packb([topic, origin_ms, epoch, seq, host, port, qos, payload, properties],
                                           use_bin_type=True)])
        self._bound()
        return True

    def _bound(self) -> None:
        evicted = 0
        if len(self.values) > self.max_topics or self.bytes > self.max_bytes:
            # The registry's records first (the oldest ids': a client back after that is taken over all the same,
            # only not adopted), then tombstones, then the values kept longest.
            for topic in [t for t in self.values if t.startswith(REGISTRY_PREFIX)]:
                if len(self.values) <= self.max_topics and self.bytes <= self.max_bytes:
                    break
                self.bytes -= len(self.values.pop(topic).payload)
                self.retained_versions.remove(topic)
                evicted += 1
            for topic in [t for t, v in self.values.items() if not v.payload]:  # tombstones first
                if len(self.values) <= self.max_topics:
                    break
                del self.values[topic]
                self.retained_versions.remove(topic)
                evicted += 1
            while self.values and (len(self.values) > self.max_topics or self.bytes > self.max_bytes):
                topic = next(iter(self.values))
                self.bytes -= len(self.values.pop(topic).payload)
                self.retained_versions.remove(topic)
                evicted += 1
        self.counts.evicted += evicted
        log = self.log
        if log is not None and (evicted or log.size_bytes > max(COMPACT_MIN_BYTES, COMPACT_RATIO * (self.bytes + 64 *
                                                                                                     len(self.values)))):
            log.rewrite([msgpack.packb([topic, *value.version, value.qos, value.payload, value.properties],
                                       use_bin_type=True) for topic, value in self.values.items()])

    def reinjections(self, wall: float) -> list[Injection]:
        """The stored values (not the tombstones) as injections with retain, their expiry counted down; those
        whose expiry ran out are left out."""
        found: list[Injection] = []
        for topic, value in list(self.values.items()):
            if not value.payload or topic.startswith(REGISTRY_PREFIX):  # the registry's records never go to a broker
                continue
            expired, properties = carried(value.properties, wall)
            if expired:
                continue
            found.append(Injection(topic, value.payload, value.qos, True, properties, value.publication, None))
        self.counts.reinjected += len(found)
        return found

    def retained_copy(self, topic: str) -> RetainedCopy | None:
        """The stored value of `topic` as the anti-entropy carries it (`RetainedIndex`), properties as carried."""
        value = self.values.get(topic)
        if value is None:
            return None
        return RetainedCopy(topic, value.version, value.qos, value.payload, value.properties)

    def describe(self) -> dict[str, Any]:
        counts = self.counts
        registry = sum(1 for topic in self.values if topic.startswith(REGISTRY_PREFIX))
        return {"topics": len(self.values) - registry,
                "tombstones": sum(1 for v in self.values.values() if not v.payload),
                "bytes": self.bytes, "stored": counts.stored, "stale": counts.stale, "repeated": counts.repeated,
                "expired": counts.expired,
                "evicted": counts.evicted, "reinjected": counts.reinjected,
                "registry": {"records": registry, "stored": counts.registry_stored, "stale": counts.registry_stale}}

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


def carried(properties: dict[str, Any] | None, wall: float) -> tuple[bool, dict[str, Any] | None]:
    """(expired, the properties to inject: without `ORIGIN_TIME` and `ORDER`, the expiry counted down)."""
    if not properties or ORIGIN_TIME not in properties:
        return False, properties
    left = remaining_expiry(properties, wall)
    if left == 0:
        return True, None
    kept = {key: value for key, value in properties.items() if key != ORIGIN_TIME and key != ORDER}
    if left is not None:
        kept[EXPIRY] = left
    return False, kept or None


def prepare(injections: Sequence[Injection], store: RetainedStore, wall: float
            ) -> tuple[list[Injection], list[tuple[PublicationId, bool | None]]]:
    """The node's injections as the broker gets them: expiry counted down and the stamp taken out, retained ones
    checked against the store. Returns them and the publications not injected, each with True if it expired
    (`message_expired`), False if it is stale (`retained_stale`), None if it is the stored value itself (the
    broker holds it: no drop): the caller counts the drops and tells the node they are all done."""
    kept: list[Injection] = []
    dropped: list[tuple[PublicationId, bool | None]] = []
    for injection in injections:
        properties = injection.properties
        if not injection.retain and (not properties or ORIGIN_TIME not in properties):
            kept.append(injection)  # the common case: nothing to do
            continue
        if injection.retain:
            if store.holds(injection.topic, injection.publication, properties):
                dropped.append((injection.publication, None))
                continue
            if not store.offer(injection.topic, injection.publication, injection.qos, injection.payload, properties):
                dropped.append((injection.publication, False))
                continue
        expired, adjusted = carried(properties, wall)
        if expired:
            store.counts.expired += 1
            dropped.append((injection.publication, True))
            continue
        kept.append(Injection(injection.topic, injection.payload, injection.qos, injection.retain, adjusted,
                              injection.publication, injection.filter))
    return kept, dropped
