"""Which of two retained writes on one topic a broker kept, and the version a local write gets (issue 39, item 4).

Theory of operation
-------------------
Every retained value carries a version (docs/protocol.md rule 10, federation.daemon.retained): every wrapper keeps
the newest per topic and injects nothing older, so every broker that gets all the writes ends with the newest.
That holds only if each broker's own last write *is* the newest. A broker keeps the value it processed last, and
it processes two kinds of write on a topic: its own clients' (which the wrapper reads afterwards and must give a
version) and the wrapper's injections of other brokers' writes. Before issue 39 a local write got the wrapper's
wall clock at the moment it read the write, and a remote write injected meanwhile could be processed by the broker
*after* the local one and still be older: the broker kept the remote value, the other brokers the local one, for
good (10 to 19 of 20 topics of two racing writers, measured).

So the version of a local write follows the broker's order, which the wrapper can see on its one connection:

- The broker answers each of the wrapper's writes in the order it processes them, on the same connection that
  carries its clients' publications to the wrapper: a QoS 1 injection's PUBACK, a QoS 2 injection's PUBCOMP (it
  stores a QoS 2 retained value at the PUBREL), and, after a QoS 0 one, the PINGRESP to a PINGREQ the wrapper
  writes after it (the broker handles one connection's packets in order). An injection whose answer has not come
  when the wrapper reads a local write was processed after that write: the broker will end with the injection.
- `local_ms`: a local write read while injections on its topic are *pending* (written, not answered) gets a time
  just below the oldest of them, so every broker ends with the injected value, as this one will. Otherwise it gets
  a hybrid logical clock's time: its wall clock, or one millisecond past the newest value the wrapper knows for
  the topic when that is later (a write made after the broker took a remote value must beat it, whatever the
  clocks say). The time is the version's first field (`retained.ORDER`, carried beside the origin time, which
  stays the wall clock for message expiry).
- An injection still waiting to be written when a local write is read on its topic is processed after it too:
  it is written only if it is still the newest when its turn comes (`RetainedGate.admit`); a local write read
  meanwhile got a version above it, so it is stale then and dropped (counted `retained_stale`), and the broker
  keeps the local write, which every other broker takes as the newest.

The answers reach the runtime as broker items in the order they were read (`broker_items.RetainedApplied`), so a
local write and an answer read in one pass are taken in the broker's order.

A QoS 0 injection's answer is not exact. Mosquitto reads one packet per turn of its loop, so another client's
write can be processed between the injection and the PINGREQ behind it: a local write read before that PINGRESP
may have come before the injection or after it. The wrapper still orders it below (as for QoS 1/2), and once the
topic has no unanswered injection left it reads the broker's value for it on a short second connection
(`retained_scan.RetainedReading.check`); a value the federation does not have (the broker kept the local write)
is originated again, with a new version, and every broker converges on it, at the price of one more delivery of
that value to the other brokers' live subscribers (counted: `retained_scan.repaired`).

What this cannot see: a local write that the broker held back in its queue toward the wrapper (more than the
wrapper's Receive Maximum of QoS 1/2 messages unacknowledged) reaches the wrapper after answers the broker wrote
later; the wrapper then takes it for the later one. docs/transparency.md says so with the measured race.
"""

from __future__ import annotations

from federation.daemon.retained import RetainedStore
from federation.protocol.types import Injection, PublicationId

MAX_PREPARED = 65536
"""retained injections remembered between the store and their write at most (more wait only in a full queue)"""


class RetainedOrder:
    """The retained injections written to the broker and not answered yet, by topic (see the module docstring)."""

    def __init__(self) -> None:
        self._pending: dict[PublicationId, tuple[str, int]] = {}
        """publication -> (topic, the time of its version): written, not answered"""
        self._by_topic: dict[str, dict[PublicationId, int]] = {}
        self._inexact: set[PublicationId] = set()
        """of `_pending`, QoS 0 injections: their answer (a PINGRESP) does not place a local write exactly"""
        self._unsure: set[str] = set()
        """topics with a local write ordered below a QoS 0 injection: to check once nothing is pending there"""
        self._to_check: set[str] = set()
        """topics to check now (`take_checks`)"""
        self.below_pending = 0
        """local writes given a version below an unanswered injection: the broker keeps the injected value"""
        self.clock_ahead = 0
        """local writes given a time past their wall clock: the topic's known value was later"""

    def written(self, topic: str, publication: PublicationId, version_ms: int, exact: bool = True) -> None:
        """A retained injection went to the broker (or will, before anything written after it); `exact`: its answer
        is a PUBACK or PUBCOMP (QoS 1/2), not a PINGRESP behind it (QoS 0)."""
        self._pending[publication] = (topic, version_ms)
        self._by_topic.setdefault(topic, {})[publication] = version_ms
        if exact:
            self._inexact.discard(publication)
        else:
            self._inexact.add(publication)

    def applied(self, publication: PublicationId) -> None:
        """The broker's answer to it was read (or it will never be processed): no longer pending."""
        found = self._pending.pop(publication, None)
        if found is None:
            return
        self._inexact.discard(publication)
        topic = found[0]
        waiting = self._by_topic[topic]
        del waiting[publication]
        if not waiting:
            del self._by_topic[topic]
            if topic in self._unsure:
                self._unsure.discard(topic)
                self._to_check.add(topic)

    def take_checks(self) -> set[str]:
        """The topics whose value on the broker is to be read now (a local write on each was ordered against a QoS
        0 injection, which is answered now)."""
        checks, self._to_check = self._to_check, set()
        return checks

    def pending(self, topic: str) -> int:
        return len(self._by_topic.get(topic, ()))

    @property
    def pending_total(self) -> int:
        return len(self._pending)

    def local_ms(self, topic: str, wall_ms: int, known_ms: int | None) -> int:
        """The time of a local write's version, read now: below the oldest unanswered injection on `topic`, or
        the hybrid logical clock's (`wall_ms`, or `known_ms` + 1 when the topic's known value is later)."""
        waiting = self._by_topic.get(topic)
        if waiting:
            self.below_pending += 1
            if not self._inexact.isdisjoint(waiting):
                self._unsure.add(topic)
            return min(waiting.values()) - 1
        if known_ms is not None and known_ms >= wall_ms:
            self.clock_ahead += 1
            return known_ms + 1
        return wall_ms

    def describe(self) -> dict[str, int]:
        return {"pending": len(self._pending), "below_pending": self.below_pending, "clock_ahead": self.clock_ahead,
                "to_check": len(self._unsure) + len(self._to_check)}


class RetainedGate:
    """What the broker connection asks before it writes a retained injection, and tells once the broker answered
    (federation.daemon.injector): the store says whether it is still the topic's newest, the order keeps it
    pending until the answer."""

    def __init__(self, store: RetainedStore, order: RetainedOrder) -> None:
        self.store = store
        self.order = order
        self.stale_at_write = 0
        """retained injections not written: a local write read while they waited to be written is newer"""
        self._topics: dict[PublicationId, str] = {}
        """publication -> the federation's topic of a retained injection on its way to the broker (a topic policy
        may map it to another local topic: the store and the order know the federation's)"""

    def prepared(self, injection: Injection) -> None:
        """A retained injection the store took (`retained.prepare`), before any topic policy maps it."""
        topics = self._topics
        topics[injection.publication] = injection.topic
        if len(topics) > MAX_PREPARED:  # ones dropped on their way (a full queue): forget the oldest
            del topics[next(iter(topics))]

    def admit(self, injection: Injection, exact: bool = True) -> bool:
        """Write it (it is pending from now) if the store still holds it as its topic's value; False when a newer
        value came meanwhile (counted; the caller ends its custody: the broker holds something newer). `exact`:
        its answer will be a PUBACK or PUBCOMP (`RetainedOrder.written`)."""
        topic = self._topics.pop(injection.publication, injection.topic)
        value = self.store.values.get(topic)
        if value is not None and value.publication != injection.publication:
            self.stale_at_write += 1
            self.store.counts.stale += 1
            self.order.applied(injection.publication)  # written once, then published anew: no longer pending
            return False
        if value is not None:  # a topic the store evicted (its bounds) says nothing of the order
            self.order.written(topic, injection.publication, value.version[0], exact)
        return True

    def applied(self, publication: PublicationId) -> None:
        self.order.applied(publication)

    def describe(self) -> dict[str, int]:
        """Status `daemon.broker.retained.order`: pending injections, local writes ordered below one or past their
        wall clock, injections not written for a newer local write."""
        return {**self.order.describe(), "stale_at_write": self.stale_at_write}
