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
once (a pseudo client holds them in the node: `adopted_client`), and holds every publication matching them (other
local clients get theirs when it is released, a moment late) until the old broker's handover has come and the
client has subscribed again here: Mosquitto, which never saw the client, answered its CONNECT with session
present 0, so the client subscribes again (MQTT 5 says it must discard its session state; paho's `on_connect` and
MQTT.js do) or hears nothing; that much one broker's behaviour cannot be had without changing Mosquitto
(docs/transparency.md). What the client subscribes to here is its session's too (its filters' record may not have
come yet).

The old broker's wrapper, on the newer claim, takes the client id over there (federation.daemon.kicker: the old
connection closed, the will handled by Mosquitto's own rules for the new clean start, the session resumed and its
queue read up to a fence, then ended: the old broker stops queueing) and publishes a `handover` record with the
messages that were queued and which publications its broker had processed by the fence (`Takeover`: the fence is
published on the wrapper's own connection, behind its injections, and read back there, behind its own clients'
publications). The new host injects the handover's messages, in order, once the client has subscribed to a
filter matching each, then what it held meanwhile, leaving out of the held ones those the old broker had (both
brokers had the publications made between the adoption and the fence: the client got them there, or they came in
the handover). A handover that does not come within `ADOPTION_GRACE` (the old broker's wrapper is down) releases
what was held.

A client can go on before its adopted session is all given (behind a load balancer it moves every few seconds):
what this wrapper still held for it, never given to its broker, goes in its own handover (`carried`, after the
queue), and is injected here once the kicker is done, for the other local clients that subscribe to it (held
for them too, so that the adopted client got nothing out of order).

What unmodified Mosquitto cannot be made to do, docs/transparency.md says: session present 0 on the new broker;
a handed-over message reaches every local subscriber of its topic on the new broker, so another client there that
had it live gets it again (`shared_copies`); a QoS 2 message the client had taken (PUBREC) and not been released
(PUBREL) when it moved is not given again (`unreleased`, counted by the kicker).

`Roaming` is the runtime's part, on the loop's thread: it is told the log's events, the registry's records (which
the runtime takes out of the injections: they are never injected), and asked which injections to make now.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

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
    ranges,
    registry_topic,
)
from federation.daemon.kicker import Outcome
from federation.daemon.retained import RetainedStore
from federation.daemon.roaming_state import (
    ADOPTION_GRACE,
    ASSIGNED_PREFIX,
    FENCE_WAIT,
    FILTERS_DELAY,
    LATE_WINDOW,
    MAX_HELD,
    Adopted,
    Originate,
    PublishFence,
    RoamingCounts,
    StartKicker,
    Takeover,
    adopted_client,
    filters_topic,
)
from federation.daemon.roaming_state import address_text as _text
from federation.daemon.state import SHARED_PREFIX, LocalSubscriptions, SubscriptionSink
from federation.protocol.topic_filter import federated_filter, matches
from federation.protocol.types import Address, Injection, PublicationId

log = logging.getLogger("federation.daemon")


class Roaming:
    """The runtime's part of one-client-id-federation-wide (module docstring)."""

    def __init__(self, own: Address, table: LocalSubscriptions, sink: SubscriptionSink, store: RetainedStore,
                 originate: Originate, start_kicker: StartKicker, connected_here: Callable[[str], bool],
                 offline_here: Callable[[str], bool], publish_fence: PublishFence) -> None:
        """`connected_here(client)`: the log tracker has it connected; `offline_here(client)`: the session ledger
        knows an offline session of it that may live."""
        self._publish_fence = publish_fence
        self.own = _text(own)
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
        self._takeovers: dict[str, Takeover] = {}
        """client -> its takeover under way here"""
        self._fences: dict[str, Takeover] = {}
        """fence topic -> its takeover, until the fence is read back"""
        self._released: list[Injection] = []
        """injections released outside the log's events and the registry's records (`take_released`)"""
        self._left_out: list[Injection] = []
        """injections never to be made (copies of what a handover gave), done for the node's custody
        (`take_left_out`)"""
        self._recent: dict[str, tuple[Record, dict[str, int], float]] = {}
        """client -> its ended adoption's handover, filters and until when late copies are looked for (`LATE_WINDOW`)"""
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
                return self._resubscribed(self.adopted[event.client], event.filter, event.qos, now)
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
        takeover = self._takeovers[client] = Takeover(action, dict(record.filters) if record is not None else {})
        adopted = self.adopted.get(client)
        if adopted is not None:  # it went on before all was given here: what is left goes on in the handover
            missed = [injection for _publication, injection, direct in adopted.own if not direct]
            takeover.carried = [*(adopted.drained or []), *missed, *adopted.held]
            adopted.drained, adopted.held, adopted.own = [], [], []
            self._end_adoption(adopted, now)
        log.info("client %r connected on %s: taking it over on this broker (clean start %d)", client, action.host,
                 action.clean)

        def ready(fence: str, now: float) -> None:
            takeover.fence = fence
            takeover.had = self._publish_fence(fence, takeover.filters)
            if takeover.had is not None:
                self._fences[fence] = takeover

        def done(outcome: Outcome, now: float) -> None:
            takeover.outcome = outcome
            takeover.done_at = now
            self._kicking.discard(client)
            self.counts.taken_queued += len(outcome.messages)
            self.counts.unreleased += outcome.unreleased
            if outcome.problem is not None:
                log.warning("taking client %r over on this broker: %s; %d queued messages handed over", client,
                            outcome.problem, len(outcome.messages))
            if outcome.problem is not None or takeover.had is None or takeover.own is not None:
                self._hand_over(takeover, now)

        self._start_kicker(client, action.clean, ready, done)

    def fence_read(self, fence: str, own: tuple[int, int], now: float) -> None:
        """A fence came back on the wrapper's connection; `own`: (epoch, seq) of the last local publication the node
        numbered before it (the broker processed those before the fence, and only those: both at QoS 1/2, in
        order)."""
        takeover = self._fences.pop(fence, None)
        if takeover is None:
            return  # sent again after a reconnection, or its takeover gave up waiting
        takeover.own = own
        if takeover.outcome is not None:
            self._hand_over(takeover, now)

    def _hand_over(self, takeover: Takeover, now: float) -> None:
        """The handover record: what the session had queued and which publications its broker had. Only when the
        kicker read up to the fence are the publications named: a drain cut short has not got them all (the new
        host then gives what it held as well: over-delivery, not loss)."""
        action, outcome = takeover.action, takeover.outcome
        assert outcome is not None
        if self._takeovers.get(action.client) is takeover:
            del self._takeovers[action.client]
        if takeover.fence is not None:
            self._fences.pop(takeover.fence, None)
        cut: dict[str, tuple[int, int]] = {}
        had: dict[str, tuple[tuple[int, int, int], ...]] = {}
        if outcome.problem is None and outcome.session_present and takeover.had is not None:
            had = {_text(origin): ranges(ids) for origin, ids in takeover.had.items()}
            if takeover.own is not None:
                cut[self.own] = takeover.own
            else:
                self.counts.fences_late += 1
        carried = tuple((injection.topic, injection.payload, injection.qos, injection.properties,
                         *self._carried_id(injection)) for injection in takeover.carried)
        self.counts.carried += len(carried)
        log.info("client %r handed over to %s: %d queued messages, %d held here%s", action.client, action.host,
                 len(outcome.messages), len(carried), "" if cut else " (without the fence's cut: the new broker may "
                 "give some twice)" if outcome.session_present else "")
        self._originate(registry_topic(action.client), Record(
            action.client, action.host, HANDOVER, action.clean, 5, takeover.filters, self.own,
            tuple(outcome.messages), cut, outcome.lost, had, carried).encode(), now)
        # The client's session here has ended (the kicker is done): what was held goes to the other local clients
        # that subscribe to it, once.
        self._released += takeover.carried

    def _carried_id(self, injection: Injection) -> tuple[str, int, int]:
        """A carried message's publication, for the new host to know its copy ("", 0, 0: one of an earlier
        handover, numbered here)."""
        origin, epoch, seq = injection.publication
        if origin.port == 0 or injection.filter is None:
            return "", 0, 0
        return _text(origin), epoch, seq

    def take_released(self) -> list[Injection]:
        """What was released outside the calls that return it (a handover made once its kicker was done), in
        order, to inject now."""
        released, self._released = self._released, []
        return released

    def take_left_out(self) -> list[Injection]:
        """Injections held or arriving here that will never be made (their copy came in a handover): the embedder
        reports each done, so its custody ends (and the copy it came in is acknowledged)."""
        left_out, self._left_out = self._left_out, []
        return left_out

    def _finish(self, record: Record, now: float) -> list[Injection]:
        adopted = self.adopted.get(record.client)
        if adopted is None:
            if not (record.messages or record.carried) or not self._connected_here(record.client):
                return []
            adopted = self.adopted[record.client] = Adopted(record.client, record.source, dict(record.filters),
                                                            now + ADOPTION_GRACE)
            current = self.table.clients.get(record.client)
            adopted.subscribed = set(current.filters) if current is not None else set()
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
        adopted.drained = drained
        left_out = len(adopted.held) - len(remaining)
        adopted.held = remaining
        self._settle_own(adopted)
        log.info("client %r: the handover from %s came: %d messages first, then %d held here (%d held were copies)",
                 record.client, record.source, len(adopted.drained), len(remaining), left_out)
        for raw_filter, qos in record.filters.items():
            adopted.filters.setdefault(raw_filter, qos)
        return self._release(adopted, now)

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
        if adopted.record is not None:
            self._recent[adopted.client] = (adopted.record, dict(adopted.filters), now + LATE_WINDOW)
        for raw in sorted(adopted.filters):
            federated = federated_filter(raw)
            if federated is not None and not raw.startswith(SHARED_PREFIX):
                self.sink.local_unsubscribe(adopted_client(adopted.client), federated, now)

    # ------------------------------------------------------------ injections

    def admit(self, injections: list[Injection], now: float) -> list[Injection]:
        """The injections to make now: those an adopted session waits for are held (in order), also when another
        local client subscribes to their topic (it gets them when they are released, a moment late: given now, they
        would reach the adopted client before what was queued for it, or twice)."""
        if not self.adopted and not self._recent:
            return injections
        admitted: list[Injection] = []
        for injection in injections:
            holder = next((adopted for adopted in self.adopted.values() if adopted.wants(injection.topic)), None)
            if holder is None:
                if not self._late_copy(injection, now):
                    admitted.append(injection)
                continue
            holder.held.append(injection)
            if len(holder.held) > MAX_HELD:
                self._left_out.append(holder.held.pop(0))  # lost, counted: its custody ends
                holder.dropped += 1
                self.counts.dropped += 1
        return admitted

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
        for takeover in list(self._takeovers.values()):  # the kicker is done; its fence is not back
            if takeover.done_at is not None and now - takeover.done_at >= FENCE_WAIT:
                self._hand_over(takeover, now)
        released: list[Injection] = []
        for adopted in [adopted for adopted in self.adopted.values() if adopted.deadline <= now]:
            if adopted.drained is None:
                self.counts.handovers_late += 1
                log.warning("no handover came for client %r from %s within %g s: what was held for it goes to its "
                            "subscriptions here", adopted.client, adopted.source, ADOPTION_GRACE)
            # What came for the client alone goes if it subscribed again here; what was held goes to the broker
            # (other local clients may take it; it was held for them too).
            missed = [injection for _publication, injection, direct in adopted.own if not direct]
            waiting = [*(adopted.drained or []), *missed]
            taken = [injection for injection in waiting if adopted.resubscribed(injection.topic)]
            self.counts.dropped += len(waiting) - len(taken)
            released += taken + adopted.held
            self._end_adoption(adopted, now)
        for client in [client for client, (_record, _filters, until) in self._recent.items() if until <= now]:
            del self._recent[client]
        return released

    def describe(self) -> dict[str, object]:
        counts = self.counts
        return {**self.registry.describe(), "filters_received": self.filters_known,
                "claims": counts.claims, "filters_records": counts.filters_records,
                "takeovers": counts.takeovers, "taken_queued": counts.taken_queued, "adopted": counts.adopted,
                "adopting": len(self.adopted), "held": sum(len(a.held) for a in self.adopted.values()),
                "delivered": counts.delivered, "duplicates_left_out": counts.duplicates_left_out,
                "dropped": counts.dropped, "handovers_late": counts.handovers_late,
                "fences_late": counts.fences_late, "shared_copies": counts.shared_copies,
                "carried": counts.carried, "own_given": counts.own_given, "late_copies": counts.late_copies,
                "unreleased": counts.unreleased, "taking_over": len(self._takeovers)}


__all__ = ["REGISTRY_PREFIX", "Roaming"]
