"""The new host's side of a client that moves (federation.daemon.roaming, whose `Roaming` this is a part of): a
session adopted here is finished with its old host's handover (its queued messages, then what was held here, each
once and in order, as the client subscribes again), late records are given (federation.daemon.roaming_late), what
came here after the client went on follows it, and what cannot be given is counted lost (docs/drops.md).

`Adoptions` holds no state of its own: it is `Roaming`'s, split from it by concern (roaming.py keeps the log's
events, the registry's records, the takeovers and the timers)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any

from federation.daemon.client_registry import Carried, Record
from federation.daemon.roaming_late import PENDING_WAIT, LateForwarding, Seen, key_of, session_filters
from federation.daemon.roaming_state import (
    ADOPTION_GRACE,
    LATE_WINDOW,
    Adopted,
    Dropper,
    RoamingCounts,
    adopted_client,
)
from federation.daemon.roaming_state import address_text as _text
from federation.daemon.roaming_unreleased import LOCAL, RecentQos2
from federation.daemon.state import SHARED_PREFIX, LocalSubscriptions, SubscriptionSink
from federation.protocol import events
from federation.protocol.topic_filter import federated_filter, matches
from federation.protocol.types import Address, Injection, PublicationId

log = logging.getLogger("federation.daemon")


class Adoptions:
    """`Roaming`'s adoptions (module docstring); the attributes are `Roaming`'s."""

    own: str
    table: LocalSubscriptions
    sink: SubscriptionSink
    adopted: dict[str, Adopted]
    counts: RoamingCounts
    late: LateForwarding
    seen: Seen
    _connected_here: Callable[[str], bool]
    _dropper: Dropper | None
    _released: list[Injection]
    _left_out: list[Injection]
    _recent: dict[str, tuple[Record, dict[str, int], float]]
    _handover_ids: itertools.count[int]
    _handover_epoch: int
    _pending_late: dict[str, tuple[list[Carried], float]]
    recent_qos2: RecentQos2
    _clock: float
    _here: Callable[[str], bool]

    def _finish(self, record: Record, now: float) -> list[Injection]:
        adopted = self.adopted.get(record.client)
        if adopted is None:
            if not (record.messages or record.carried):
                return []
            if not self._connected_here(record.client):  # it moved on before the handover came: follow it
                self._carry_on(record.client, [*(self._keyed(topic, payload, qos, properties)
                                                 for topic, payload, qos, _retain, properties in record.messages),
                                               *record.carried], now)
                return []
            adopted = self.adopted[record.client] = Adopted(record.client, record.source, dict(record.filters),
                                                            now + ADOPTION_GRACE)
            current = self.table.clients.get(record.client)
            adopted.subscribed = set(current.filters) if current is not None else set()
            self.seen.watch(record.client, session_filters(adopted.filters))
        # Numbered as no publication is (port 0): the journal and the node's custody never take one for another.
        try:
            source = Address(Address.parse(record.source, 0).host, 0)
        except ValueError:
            source = Address(record.source, 0)
        epoch = self._handover_epoch
        drained = [Injection(topic, payload, qos, False, properties, (source, epoch, next(self._handover_ids)))
                   for topic, payload, qos, _retain, properties in record.messages]
        # What the old host held and carried on: once, the copy held here if there is one (it comes later, in order).
        held_here = {(_text(held.publication[0]), *held.publication[1:]) for held in adopted.held}
        for topic, payload, qos, properties, origin, origin_epoch, seq in record.carried:
            if origin and (origin, origin_epoch, seq) in held_here:
                self.counts.duplicates_left_out += 1
                continue
            drained.append(Injection(topic, payload, qos, False, properties, (source, epoch, next(self._handover_ids))))
        # What both brokers had is given once: what the old broker had processed when its wrapper read the queue
        # (the client got it there, or it came in the handover) and was held here too is a copy.
        remaining = []
        for held in adopted.held:
            held_origin, held_epoch, held_seq = held.publication
            # A retained one is made all the same: the broker's retained value must follow.
            if not held.retain and record.covers(_text(held_origin), held_epoch, held_seq):
                self.counts.duplicates_left_out += 1
                self._left_out.append(held)
            else:
                remaining.append(held)
        adopted.record = record
        adopted.drained = [*drained, *adopted.late]  # what reached the old broker after its fence, after its queue
        adopted.late = []
        left_out = len(adopted.held) - len(remaining)
        adopted.held = remaining
        self._settle_own(adopted)
        log.info("client %r: the handover from %s came: %d messages first, then %d held here (%d held were copies)",
                 record.client, record.source, len(adopted.drained), len(remaining), left_out)
        for raw_filter, qos in record.filters.items():
            adopted.filters.setdefault(raw_filter, qos)
        return self._release(adopted, now)

    def _keyed(self, topic: str, payload: bytes, qos: int, properties: dict[str, Any] | None) -> Carried:
        """A message without a publication (a handover's queued one) as a late record carries it: numbered here,
        so that the next host gives it once however many late records carry it."""
        return topic, payload, qos, properties, f"{self.own}#handover", self._handover_epoch, next(self._handover_ids)

    def _carry_on(self, client: str, items: list[Carried], now: float) -> None:
        """Messages for `client` that came here after it moved on: sent on by the takeover of it here (in this
        host's late record), or waiting for that takeover to begin (`_give_late`)."""
        if items:
            self._give_late(client, items, now)

    def _late_record(self, record: Record, now: float) -> list[Injection]:
        """A late record (roaming_late.py): what reached the client's old broker after its fence; those not given
        here yet go to the client, after the handover's messages while its adoption lasts. A client not here (it
        went on, and the takeover of it here may not have begun yet) has them wait `PENDING_WAIT` for that
        takeover, which sends them on. Returns what to inject now, in order."""
        if record.host != self.own or record.source == self.own:
            return []
        items = self.seen.new(record.client, record.carried, now)
        if not items:
            return []
        self.counts.late_received += len(items)
        return self._give_late(record.client, items, now)

    def _give_late(self, client: str, items: list[Carried], now: float) -> list[Injection]:
        """Late publications for `client` (`_late_record`): given here, or sent on, or waiting for either."""
        adopted = self.adopted.get(client)
        if adopted is None and not self._connected_here(client):
            if not self.late.carry(client, items):
                waiting, _until = self._pending_late.get(client, ([], 0.0))
                self._pending_late[client] = ([*waiting, *items], now + PENDING_WAIT)
            return []
        self.seen.gave_late(client, items)
        injections = [Injection(topic, payload, qos, False, properties, self._handover_id(self._address(origin)))
                      for topic, payload, qos, properties, origin, _epoch, _seq in items]
        if adopted is not None:
            if adopted.drained is None:
                adopted.late += injections  # given after the handover's queue
                return []
            adopted.drained += injections
            return self._release(adopted, now)
        self.counts.delivered += len(injections)
        self.counts.shared_copies += sum(1 for injection in injections if self._another_takes(client, injection.topic))
        return injections

    @staticmethod
    def _address(origin: str) -> Address:
        try:
            return Address.parse(origin.split("#")[0], 0)
        except ValueError:
            return Address(origin, 0)

    def _drop_unknown(self, reason: str, count: int, client: str, now: float) -> None:
        """`count` publications lost for `client` whose ids roaming cannot tell (docs/drops.md)."""
        log.warning("client %r: %d publications lost (%s, docs/drops.md)", client, count, reason)
        if self._dropper is not None:
            for _ in range(count):
                self._dropper.drop(reason, event=events.PUBLICATION_DROPPED, now=now, pub=None, filter=None,
                                   reason=reason)

    def _drop_item(self, reason: str, item: Carried, now: float) -> None:
        key = key_of(item)
        self._drop_publication(reason, None if key is None or "#" in key[0] else key, item[0], now)

    def _drop_publication(self, reason: str, key: tuple[str, int, int] | None, topic: str, now: float) -> None:
        """One publication roaming loses (docs/drops.md), a `publication_dropped` event with its id when known."""
        self.counts.dropped += 1
        if self._dropper is not None:
            self._dropper.drop(reason, event=events.PUBLICATION_DROPPED, now=now,
                               pub=None if key is None else "/".join(map(str, key)), filter=None, reason=reason,
                               topic=topic)

    def _settle_own(self, adopted: Adopted) -> None:
        """This broker's own publications for the client, once the handover says which of them its old broker had
        (`Record.covers`): one it had and the client got here too goes from the handover (its copy there is the
        same topic and payload); one it did not have and the client did not get here (it came before the client
        subscribed again) is given, after the handover's messages."""
        record, drained = adopted.record, adopted.drained
        assert record is not None and drained is not None
        for (_origin, epoch, seq), injection, direct in adopted.own:
            covered = record.covers(self.own, epoch, seq)
            if direct and covered:
                for index, message in enumerate(drained):
                    if message.topic == injection.topic and message.payload == injection.payload:
                        del drained[index]
                        self.counts.duplicates_left_out += 1
                        break
            elif not direct and not covered:
                drained.append(injection)
                self.counts.own_given += 1
        adopted.own = []

    def local_published(self, published: list[tuple[PublicationId | None, str, bytes, int, bool,
                                                     dict[str, Any] | None]]) -> None:
        """Publications of this broker's own clients the node took (`LocalPublications.observe`): those an adopted
        session's client did not get here (it had not subscribed again yet) may be its to have, and those it did
        get may come again in the handover (`_settle_own`). Retained ones are left: the client's subscription brings
        the broker's retained value."""
        for publication, topic, payload, qos, retain, properties in published:
            if publication is not None and qos and not retain:
                self.recent_qos2.add(topic, payload, properties, LOCAL,
                                     (_text(publication[0]), publication[1], publication[2]), qos, self._clock)
        late, seen = self.late, self.seen
        if late.forwards or seen:
            for publication, topic, payload, qos, retain, properties in published:
                if publication is None or retain or not qos:
                    continue
                key = (_text(publication[0]), publication[1], publication[2])
                late.processed((topic, payload, qos, properties, *key), topic)
                seen.mark(key, topic, self._here)
        if not self.adopted:
            return
        for adopted in self.adopted.values():
            for publication, topic, payload, qos, retain, properties in published:
                if publication is None or retain or not adopted.wants(topic):
                    continue
                direct = adopted.resubscribed(topic)
                injection = Injection(topic, payload, qos, False, properties, self._handover_id(publication[0]))
                if adopted.record is None:
                    adopted.own.append((publication, injection, direct))
                elif not direct and adopted.drained is not None:  # the old session has ended: only here now
                    adopted.drained.append(injection)
                    self.counts.own_given += 1

    def _handover_id(self, address: Address) -> PublicationId:
        """An id for a message roaming gives: numbered as no publication is (port 0), so that the journal and the
        node's custody never take one for another."""
        return Address(address.host, 0), self._handover_epoch, next(self._handover_ids)

    def _resubscribed(self, adopted: Adopted, raw_filter: str, qos: int, now: float) -> list[Injection]:
        adopted.subscribed.add(raw_filter)
        # Its filters were not all known here (their record had not come): what it subscribes to is its session's.
        adopted.filters.setdefault(raw_filter, qos)
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
        handed = [injection for injection in released if injection.publication[0].port == 0]
        self.counts.delivered += len(handed)
        self.counts.shared_copies += sum(1 for injection in handed
                                         if self._another_takes(adopted.client, injection.topic))
        if not adopted.drained and not adopted.held and adopted.subscribed:
            self._end_adoption(adopted, now)
        return released

    def _end_adoption(self, adopted: Adopted, now: float) -> None:
        """No more holding for it: the pseudo client's filters leave the node; copies of what its handover covered
        that arrive late are looked for a while (`admit`)."""
        self.adopted.pop(adopted.client, None)
        self.seen.ended(adopted.client, now)
        if adopted.record is not None:
            self._recent[adopted.client] = (adopted.record, dict(adopted.filters), now + LATE_WINDOW)
        for raw in sorted(adopted.filters):
            federated = federated_filter(raw)
            if federated is not None and not raw.startswith(SHARED_PREFIX):
                self.sink.local_unsubscribe(adopted_client(adopted.client), federated, now)

    def _late_copy(self, injection: Injection, now: float) -> bool:
        """A publication a recent handover gave (its record covers it) that reached this wrapper after the record:
        left out (done) when no other local client takes its topic; else made, and the moved client gets it twice
        (counted: the broker gives a message to every subscriber)."""
        if injection.retain:
            return False  # made: the broker's retained value must follow
        origin, epoch, seq = injection.publication
        for client, (record, filters, until) in self._recent.items():
            if until <= now or not any(matches(filter_, injection.topic) for filter_ in filters
                                       if not filter_.startswith(SHARED_PREFIX)):
                continue
            if not record.covers(_text(origin), epoch, seq):
                continue
            if self._another_takes(client, injection.topic):
                self.counts.late_copies += 1
                return False
            self.counts.duplicates_left_out += 1
            self._left_out.append(injection)
            return True
        return False

    def _another_takes(self, client: str, topic: str) -> bool:
        return any(other != client and not other.startswith("\x00") and
                   any(matches(filter_, topic) for filter_ in record.filters if not filter_.startswith(SHARED_PREFIX))
                   for other, record in self.table.clients.items())

    @staticmethod
    def _key(injection: Injection) -> tuple[str, int, int] | None:
        origin, epoch, seq = injection.publication
        return (_text(origin), epoch, seq) if origin.port else None
