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

A publication that reaches the old broker only after the fence (its origin did not know of the new host yet)
went nowhere there: the old host sends it on in a `late` record for a few seconds after its handover, and the new
host gives what it had not given the client (federation.daemon.roaming_late). A client whose last connection here
ended with a DISCONNECT and that holds no filters here is not taken over (nothing queued, no will pending).
Every publication roaming cannot give is counted under a drop reason with a `publication_dropped` event
(docs/drops.md, `roaming_...`).

What unmodified Mosquitto cannot be made to do, docs/transparency.md says: session present 0 on the new broker;
a handed-over message reaches every local subscriber of its topic on the new broker, so another client there that
had it live gets it again (`shared_copies`); a QoS 2 message the client had taken (PUBREC) and not been released
(PUBREL) when it moved is not given again (`unreleased`, counted by the kicker).

The new host's side (the adoption's end, the handover and late records given) is `Adoptions`
(federation.daemon.roaming_adoption), a part of `Roaming` split from it by concern. `Roaming` is the runtime's part,
on the loop's thread: it is told the log's events, the registry's records (which
the runtime takes out of the injections: they are never injected), and asked which injections to make now.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable

from federation.daemon.broker_log import ClientConnected, ClientGone, ClientSubscribed, ClientUnsubscribed, LogEvent
from federation.daemon.client_registry import (
    CONNECTED,
    HANDOVER,
    OFFLINE,
    REGISTRY_PREFIX,
    Carried,
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
from federation.daemon.roaming_adoption import Adoptions
from federation.daemon.roaming_late import LateForwarding, Seen, is_late_topic, late_topic, session_filters
from federation.daemon.roaming_state import (
    ADOPTION_GRACE,
    ASSIGNED_PREFIX,
    FENCE_WAIT,
    FILTERS_DELAY,
    MAX_HELD,
    Adopted,
    Dropper,
    Originate,
    PublishFence,
    RoamingCounts,
    StartKicker,
    Takeover,
    adopted_client,
    filters_topic,
)
from federation.daemon.roaming_state import address_text as _text
from federation.daemon.roaming_unreleased import INJECTED, SEED_SECONDS, RecentQos2
from federation.daemon.state import SHARED_PREFIX, LocalSubscriptions, SubscriptionSink
from federation.protocol.topic_filter import federated_filter, matches
from federation.protocol.types import Address, Injection

log = logging.getLogger("federation.daemon")


class Roaming(Adoptions):
    """The runtime's part of one-client-id-federation-wide (module docstring)."""

    def __init__(self, own: Address, table: LocalSubscriptions, sink: SubscriptionSink, store: RetainedStore,
                 originate: Originate, start_kicker: StartKicker, connected_here: Callable[[str], bool],
                 offline_here: Callable[[str], bool], publish_fence: PublishFence,
                 dropper: Dropper | None = None) -> None:
        """`connected_here(client)`: the log tracker has it connected; `offline_here(client)`: the session ledger
        knows an offline session of it that may live; `dropper` counts what roaming loses (the node's drops and
        `publication_dropped` events: docs/drops.md)."""
        self._publish_fence = publish_fence
        self._dropper = dropper
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
        self.late = LateForwarding(self.own)
        """what reaches this broker for a session after its takeover's fence, sent on (roaming_late.py)"""
        self.seen = Seen()
        """what this broker gave a client whose session it adopted (roaming_late.py)"""
        self._pending_late: dict[str, tuple[list[Carried], float]] = {}
        """client -> late publications for it that came after it left, waiting for its takeover here to begin"""
        self._left_cleanly: set[str] = set()
        self.recent_qos2 = RecentQos2()
        self._clock = 0.0
        """the time of the last call that told it (`local_published` is not told the time)"""
        """this broker's recent QoS 2 publications: which ones a taken-over client had not been released"""
        """clients whose last connection here ended with a DISCONNECT (`_needs_takeover`)"""

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
            self._left_cleanly.discard(event.client)
            self.late.stop(event.client)  # back here: it gets here what reaches this broker for it
            self._connected(event, now)
            waiting, _until = self._pending_late.pop(event.client, ([], 0.0))
            return self._give_late(event.client, waiting, now) if waiting else []
        elif isinstance(event, ClientGone):
            if event.reason == "disconnected" and not event.kicker:
                self._left_cleanly.add(event.client)
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
        self.seen.watch(client, session_filters(filters))
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
        if is_late_topic(injection.topic):
            return self._late_record(record, now)
        if record.state == CONNECTED:
            self.late.stop(record.client, record.host)
        action = self.registry.received(injection.payload, self._needs_takeover(record)
                                        and record.client not in self._kicking)
        if isinstance(action, TakeOver):
            self._take_over(action, now)
        elif isinstance(action, Finish):
            return self._finish(action.record, now)
        return []

    def _needs_takeover(self, record: Record) -> bool:
        """This broker has `record.client`'s id (connected, or a session that may live here), so that a newer claim
        elsewhere takes it over here. Not a client whose last connection here ended with a DISCONNECT and that
        holds no filters here: its will is gone, and a session left nothing queued (its takeover was needless
        work, and its connection with the client's id could close the client's next one here)."""
        client = record.client
        previous = self.registry.known(client)
        connected = self._connected_here(client)
        hosted = connected or self._offline_here(client) or client in self.table.clients \
            or (previous is not None and previous.host == self.own and previous.state != HANDOVER)
        if not hosted or connected or client not in self._left_cleanly or client in self.adopted \
                or record.host == self.own or record.state != CONNECTED:
            return hosted
        held = self.table.clients.get(client)
        if held is not None and held.filters:
            return True
        self.counts.takeovers_skipped += 1
        return False

    def _take_over(self, action: TakeOver, now: float) -> None:
        client = action.client
        self._kicking.add(client)
        self.counts.takeovers += 1
        record = self.table.clients.get(client)
        takeover = self._takeovers[client] = Takeover(action, dict(record.filters) if record is not None else {})
        if not action.clean:  # a resumed session: what reaches this broker for it from now on is watched
            filters = session_filters(takeover.filters)
            self.late.start(client, action.host, filters)
            waiting, _until = self._pending_late.pop(client, ([], 0.0))
            # What reached the wrapper a moment before may reach the broker after the fence (its injection queue):
            # what the handover covers is left out of it (`LateForwarding.handed_over`).
            recent = self.recent_qos2.since(now - SEED_SECONDS,
                                            lambda topic: any(matches(filter_, topic) for filter_ in filters))
            self.late.carry(client, [*recent, *waiting])
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
            if outcome.lost:
                self._drop_unknown("roaming_handover_full", outcome.lost, client, now)
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
        record = Record(action.client, action.host, HANDOVER, action.clean, 5, takeover.filters, self.own,
                        tuple(outcome.messages), cut, outcome.lost, had, carried)
        if outcome.unreleased:  # given again, first, where the broker's order tells which they were
            filters = session_filters(takeover.filters)
            released = self.recent_qos2.unreleased(
                outcome.unreleased, lambda topic: any(matches(filter_, topic) for filter_ in filters),
                outcome.messages[0] if outcome.messages else None,
                (lambda key: record.covers(*key)) if cut or had else None)
            self.counts.unreleased_given += len(released)
            if len(released) < outcome.unreleased:
                self._drop_unknown("roaming_unreleased", outcome.unreleased - len(released), action.client, now)
            record = dataclasses.replace(record, messages=(*released, *outcome.messages))
        self._originate(registry_topic(action.client), record.encode(), now)
        self.late.handed_over(record, bool(cut or had) or not outcome.session_present, now)
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

    # ------------------------------------------------------------ injections

    def admit(self, injections: list[Injection], now: float) -> list[Injection]:
        """The injections to make now: those an adopted session waits for are held (in order), also when another
        local client subscribes to their topic (it gets them when they are released, a moment late: given now, they
        would reach the adopted client before what was queued for it, or twice)."""
        self._clock = now
        late, seen = self.late, self.seen
        if not self.adopted and not self._recent and not late.forwards and not seen:
            self._processed(injections, now)
            return injections
        admitted: list[Injection] = []
        for injection in injections:
            origin, epoch, seq = injection.publication
            if origin.port and injection.qos and not injection.retain:
                key = (_text(origin), epoch, seq)
                given_to = seen.late_copy(key, injection.topic)
                if given_to is not None:  # a late record brought it first: this copy is one too many for it
                    if not self._another_takes(given_to, injection.topic):
                        self.counts.duplicates_left_out += 1
                        self._left_out.append(injection)
                        continue
                    self.counts.late_copies += 1
                seen.mark(key, injection.topic, self._here)
            holder = next((adopted for adopted in self.adopted.values() if adopted.wants(injection.topic)), None)
            if holder is None:
                if not self._late_copy(injection, now):
                    admitted.append(injection)
                continue
            holder.held.append(injection)
            if len(holder.held) > MAX_HELD:
                oldest = holder.held.pop(0)
                self._left_out.append(oldest)  # lost, counted: its custody ends
                holder.dropped += 1
                self._drop_publication("roaming_held_full", self._key(oldest), oldest.topic, now)
        self._processed(admitted, now)
        return admitted

    def _here(self, client: str) -> bool:
        """`client` gets what this broker gives it: its session adopted here, connected here, or not handed over
        from here lately (its session here, offline, queues it; measured: marking only connected clients, a
        client that dropped and came back to the same broker got 2 publications again from a late record)."""
        return client in self.adopted or self._connected_here(client) or not self.late.away(client)

    def _processed(self, injections: list[Injection], now: float) -> None:
        """Injections made now: kept for a takeover's forwarding and its unreleased messages (only those made: a
        copy left out never reached the broker, and the client had it)."""
        recent, late = self.recent_qos2, self.late
        for injection in injections:
            origin, epoch, seq = injection.publication
            if injection.qos and not injection.retain and origin.port:
                key = (_text(origin), epoch, seq)
                recent.add(injection.topic, injection.payload, injection.properties, INJECTED, key, injection.qos,
                           now)
                if late.forwards:
                    late.processed((injection.topic, injection.payload, injection.qos, injection.properties, *key),
                                   injection.topic)

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
            for injection in waiting:
                if not adopted.resubscribed(injection.topic):
                    self._drop_publication("roaming_not_resubscribed", self._key(injection), injection.topic, now)
            released += taken + adopted.held
            self._end_adoption(adopted, now)
        for client in [client for client, (_record, _filters, until) in self._recent.items() if until <= now]:
            del self._recent[client]
        late_records, overflow = self.late.due(now)
        for late_record in late_records:
            self._originate(late_topic(late_record.client, self.own), late_record.encode(), now)
        if overflow:
            self._drop_unknown("roaming_late_full", overflow, "(several)", now)
        self.seen.expire(now)
        for client in [client for client, (_items, until) in self._pending_late.items() if until <= now]:
            items, _until = self._pending_late.pop(client)
            for item in items:
                self._drop_item("roaming_client_gone", item, now)
        return released

    def describe(self) -> dict[str, object]:
        return {**self.registry.describe(), "filters_received": self.filters_known, **self.counts.as_dict(),
                "late_forwarded": self.late.forwarded, "adopting": len(self.adopted),
                "held": sum(len(a.held) for a in self.adopted.values()), "taking_over": len(self._takeovers)}


__all__ = ["REGISTRY_PREFIX", "Roaming"]
