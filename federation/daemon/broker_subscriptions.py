"""Subscriptions the wrapper did not see: a broker that lost them, and subscriptions it holds unaccounted for.

Theory of operation
-------------------
The wrapper learns its broker's subscriptions from the broker's log (federation.daemon.broker_log); Mosquitto
never lists or replays them. Two things break that picture, and both would leave subscribers silently
unfederated (docs/daemon.md "Subscriptions the wrapper did not see"):

- **The broker restarted** (without persistence, or our session expired): the broker connection comes back
  without its session after this run had one (`Connected.session_lost`). Every subscription is gone; the
  clients will subscribe again, a moment or seconds later. Injecting meanwhile would deliver to nobody. So
  `ResubscribeHold` keeps the filters the wrapper knew as interest (a pseudo client, `RESTART_CLIENT`, holds
  them in the node) for `resubscribe_grace` seconds, and holds every publication whose topic matches one of
  them and no filter subscribed since. A subscribe line for a filter releases, in their order, the held
  publications it matches, and ends the pseudo client's hold on that filter. A client that subscribed again
  before the wrapper was back on the broker's log is never seen doing so: when the broker's subscription
  count shows more subscriptions than its own three and those seen since, every held publication is
  released (the broker filters). When the grace ends, the publications still held are dropped (drop
  `no_subscriber_after_broker_restart`, a `publication_dropped` event each, a log line at most once a
  minute) and the pseudo client's remaining filters go.
- **Subscriptions made where the wrapper could not see them** (a wrapper added to a running broker, clients
  that subscribed while it was away for longer than the broker keeps log lines for it, a broker restarted
  with persistence): `SubscriptionAudit` compares the broker's `$SYS/broker/subscriptions/count` with the
  subscriptions the wrapper accounts for (its table, shared subscriptions left out as Mosquitto leaves them
  out, plus its own three). The count is a snapshot Mosquitto publishes every `sys_interval` when it
  changed, so it is compared with the largest number the wrapper knew over the last `COUNT_WINDOW` seconds
  before it arrived, up to now: a client that just left is not taken for one the wrapper missed. While the
  broker holds more, the wrapper over-delivers: a pseudo client (`UNACCOUNTED_CLIENT`) subscribes to `#` in
  the node, so every publication comes here and the broker filters; logged once, shown in status and
  metrics (`unaccounted_subscriptions`). It starts once the broker has counted more for `SETTLE` seconds,
  and ends after the counts agree for `CLEAR_AFTER` seconds.

The two classes are sans-I/O (time comes in as arguments); `BrokerSubscriptions` is the glue the runtime
holds: it tells the node (through `SubscriptionSink`) and reports (through `DropReport`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from federation.daemon import wrapper_events
from federation.daemon.broker import OWN_SUBSCRIPTIONS
from federation.daemon.state import LocalSubscriptions, SubscriptionSink
from federation.protocol import events
from federation.protocol.topic_filter import FilterIndex, federated_filter
from federation.protocol.types import Injection, PublicationId

log = logging.getLogger("federation.daemon")

RESTART_CLIENT = "\x00broker-restart"
"""the pseudo client holding the filters the wrapper knew before its broker restarted (U+0000 is in no
client id: MQTT forbids it in UTF-8 strings)"""
UNACCOUNTED_CLIENT = "\x00unaccounted-subscriptions"
"""the pseudo client subscribed to `#` while the broker holds subscriptions the wrapper does not know"""
OVER_DELIVERY_FILTER = "#"

MAX_HELD = 10000
"""publications held at most after a broker restart; beyond, the oldest goes (`resubscribe_hold_full`)"""
MAX_HELD_BYTES = 64 * 1024 * 1024
"""and payload bytes"""
HELD_DROP_LOG_INTERVAL = 60.0
"""seconds between log lines about held publications dropped (every one is counted and evented)"""
COUNT_WINDOW = 15.0
"""seconds before a subscription count arrived in which the broker may have taken it: Mosquitto's default
`sys_interval` (10 s) and some delivery slack. A broker with a longer `sys_interval` may make the wrapper
over-deliver for a while after clients leave (never the other way round)"""
CLEAR_AFTER = 30.0
"""seconds the counts must agree before over-delivery ends"""
SETTLE = 2.0
"""seconds the broker must count more than the wrapper knows before over-delivery starts: the count (QoS 0)
can arrive before the log line of a subscription it counts (measured when the log was read at QoS 2 and paho
handed a line over only after its PUBREL; under load that took long enough to start over-delivery for nothing)"""
DROP_REASON = "no_subscriber_after_broker_restart"
HOLD_FULL_REASON = "resubscribe_hold_full"


def broker_counted(subscriptions: LocalSubscriptions) -> int:
    """The (client, filter) pairs of the table that Mosquitto counts in `$SYS/broker/subscriptions/count`:
    every one but shared subscriptions (Mosquitto 2.0.11 leaves those out; measured, docs/daemon.md). Kept by
    the table as it changes: this is asked after every pass of log lines."""
    return subscriptions.filter_count - subscriptions.shared_count


# ------------------------------------------------------------------ after a broker restart


@dataclass(frozen=True, slots=True)
class Expired:
    """What the end of a grace leaves: the held publications dropped (with the filter each was held for) and
    the filters nobody subscribed to again."""

    dropped: list[tuple[Injection, str]]
    unresubscribed: list[str]


class _TopicNode:
    """One topic level of `HeldTopics`: how many held publications have the topic that ends here."""

    __slots__ = ("children", "count", "topic")

    def __init__(self) -> None:
        self.children: dict[str, _TopicNode] = {}
        self.count = 0
        self.topic = ""


class HeldTopics:
    """The topics of the held publications, with how many of each, in a trie of their levels: the topics a new
    filter matches are found by walking the filter down the trie (`matching`), not by testing every held
    publication. A subscribe line did that test for every held one: with 1,000 held, 0.9 ms a line, so the
    100,000 subscriptions of a restarted broker coming back would have taken the loop minutes, and the grace
    would have run out on publications whose subscribers were back but not yet read."""

    def __init__(self) -> None:
        self._root = _TopicNode()

    def add(self, topic: str) -> None:
        node = self._root
        for level in topic.split("/"):
            found = node.children.get(level)
            if found is None:
                found = node.children[level] = _TopicNode()
            node = found
        node.count += 1
        node.topic = topic

    def remove(self, topic: str) -> None:
        """One held publication of `topic` less (one that was added)."""
        path: list[tuple[_TopicNode, str]] = []
        node = self._root
        for level in topic.split("/"):
            path.append((node, level))
            node = node.children[level]
        node.count -= 1
        for parent, level in reversed(path):  # prune what leads to no held topic any more
            child = parent.children[level]
            if child.count or child.children:
                break
            del parent.children[level]

    def clear(self) -> None:
        self._root = _TopicNode()

    def matching(self, filter_: str) -> set[str]:
        """The held topics `filter_` (a valid federated filter) matches."""
        found: set[str] = set()
        levels = filter_.split("/")
        pending = [(self._root, 0)]
        while pending:
            node, depth = pending.pop()
            if depth == len(levels):
                if node.count:
                    found.add(node.topic)
                continue
            level = levels[depth]
            if level == "#":
                if node.count and depth:  # `a/#` matches `a` too
                    found.add(node.topic)
                below = [child for name, child in node.children.items() if depth or not name.startswith("$")]
                while below:
                    child = below.pop()
                    if child.count:
                        found.add(child.topic)
                    below.extend(child.children.values())
            elif level == "+":
                pending.extend((child, depth + 1) for name, child in node.children.items()
                               if depth or not name.startswith("$"))
            else:
                literal = node.children.get(level)
                if literal is not None:
                    pending.append((literal, depth + 1))
        return found


class ResubscribeHold:
    """The filters known before the broker restarted, and the publications held for them (module docstring)."""

    def __init__(self, grace: float, max_held: int = MAX_HELD, max_held_bytes: int = MAX_HELD_BYTES) -> None:
        self.grace = grace
        self.max_held = max_held
        self.max_held_bytes = max_held_bytes
        self.deadline: float | None = None
        """when the current grace ends; None while there is none"""
        self.pending: dict[str, int] = {}
        """federated filter -> qos: known before the restart, not subscribed since"""
        self._pending_index = FilterIndex()
        self._fresh = FilterIndex()
        """federated filters subscribed since the restart"""
        self.fresh_subscriptions: set[tuple[str, str]] = set()
        """(client, filter) subscribed since the restart that the broker counts (not shared ones)"""
        self._held: OrderedDict[int, tuple[Injection, str]] = OrderedDict()
        """arrival number -> a held publication and the filter it waits for, oldest first"""
        self._arrivals = 0
        self._by_topic: dict[str, deque[int]] = {}
        """topic -> the arrival numbers of its held publications, oldest first"""
        self._held_topics = HeldTopics()
        """the topics of `held`: which of them a new filter releases"""
        self.held_bytes = 0
        self.overflowed: list[tuple[Injection, str]] = []
        """held publications pushed out by the bounds, for the caller to report (`take_overflowed`)"""
        self.released = 0
        self.dropped = 0

    @property
    def held(self) -> list[tuple[Injection, str]]:
        """The held publications, oldest first, with the filter each waits for."""
        return list(self._held.values())

    @property
    def held_count(self) -> int:
        return len(self._held)

    @property
    def active(self) -> bool:
        return self.deadline is not None

    def start(self, filters: Mapping[str, int], now: float) -> list[tuple[str, int]]:
        """The broker lost its subscriptions: hold for `filters` (raw filter -> qos, as the table has them)
        until `now + grace`. Returns the federated filters newly pending (for the pseudo client), sorted. A
        second restart during a grace starts it anew, keeping what is held."""
        self.deadline = now + self.grace
        self._fresh = FilterIndex()
        self.fresh_subscriptions = set()
        added: list[tuple[str, int]] = []
        for raw, qos in sorted(filters.items()):
            federated = federated_filter(raw)
            if federated is None:
                continue
            if federated not in self.pending:
                self.pending[federated] = qos
                self._pending_index.add(federated)
                added.append((federated, qos))
            elif qos > self.pending[federated]:
                self.pending[federated] = qos
        return sorted(added)

    def admit(self, injection: Injection) -> bool:
        """True: inject it now. False: it is held (its topic matches a filter known before the restart and none
        subscribed since)."""
        if self.deadline is None:
            return True
        topic = injection.topic
        if self._fresh.matching(topic):
            return True
        waiting_for = self._pending_index.matching(topic)
        if not waiting_for:
            return True
        self._arrivals += 1
        self._held[self._arrivals] = (injection, waiting_for[0])
        self._by_topic.setdefault(topic, deque()).append(self._arrivals)
        self._held_topics.add(topic)
        self.held_bytes += len(injection.payload)
        while len(self._held) > self.max_held or self.held_bytes > self.max_held_bytes:
            arrival, oldest = self._held.popitem(last=False)
            self._forget(arrival, oldest[0])
            self.overflowed.append(oldest)
        return False

    def _forget(self, arrival: int, injection: Injection) -> None:
        """`injection` (held as `arrival`, now out of `_held`) leaves the indexes and the byte count."""
        self.held_bytes -= len(injection.payload)
        arrivals = self._by_topic[injection.topic]
        arrivals.remove(arrival)  # the oldest of its topic when the hold overflows: at the front
        if not arrivals:
            del self._by_topic[injection.topic]
        self._held_topics.remove(injection.topic)

    def take_overflowed(self) -> list[tuple[Injection, str]]:
        out, self.overflowed = self.overflowed, []
        self.dropped += len(out)
        return out

    def subscribed(self, client: str, raw_filter: str) -> tuple[list[Injection], str | None]:
        """A subscribe line: the held publications it releases (in their order) and the pending filter it ends
        (for the pseudo client to leave), if any."""
        if self.deadline is None:
            return [], None
        if not raw_filter.startswith("$share/"):
            self.fresh_subscriptions.add((client, raw_filter))
        federated = federated_filter(raw_filter)
        if federated is None:
            return [], None
        ended = None
        if federated in self.pending:
            del self.pending[federated]
            self._pending_index.discard(federated)
            ended = federated
        self._fresh.add(federated)
        released: list[Injection] = []
        # Only what this filter matches can be released now: a held publication matches no filter subscribed
        # before it (`admit`), nor one subscribed since (it was released then).
        topics = self._held_topics.matching(federated) if self._held else set()
        if topics:
            arrivals = sorted(arrival for topic in topics for arrival in self._by_topic[topic])  # in their order
            for arrival in arrivals:
                injection, _filter = self._held.pop(arrival)
                self._forget(arrival, injection)
                released.append(injection)
        self.released += len(released)
        if not self.pending and not self._held:
            self.deadline = None  # everything known is back: the grace is over early
        return released, ended

    def unseen_subscriptions(self, count: int, own: int) -> bool:
        """The broker counts more subscriptions than the wrapper's own and those seen made since the restart:
        clients subscribed again before the wrapper was back on the log."""
        return self.deadline is not None and count > own + len(self.fresh_subscriptions)

    def release_all(self) -> tuple[list[Injection], list[str]]:
        """End the grace now: every held publication, in order, and the filters still pending."""
        held, pending = self._end()
        self.released += len(held)
        return [injection for injection, _filter in held], pending

    def expire(self, now: float) -> Expired | None:
        """At the end of the grace: drop what is held and forget the filters not subscribed again."""
        if self.deadline is None or now < self.deadline:
            return None
        held, pending = self._end()
        self.dropped += len(held)
        return Expired(held, pending)

    def _end(self) -> tuple[list[tuple[Injection, str]], list[str]]:
        """No grace any more: what was held (with the filter it was held for) and the filters still pending."""
        held, pending = self.held, sorted(self.pending)
        self._held.clear()
        self._by_topic.clear()
        self._held_topics.clear()
        self.held_bytes = 0
        self.pending.clear()
        self._pending_index = FilterIndex()
        self._fresh = FilterIndex()
        self.deadline = None
        return held, pending


# ------------------------------------------------------------------ unaccounted subscriptions


class SubscriptionAudit:
    """The broker's subscription count against what the wrapper knows (module docstring)."""

    def __init__(self, own: int = OWN_SUBSCRIPTIONS, window: float = COUNT_WINDOW,
                 clear_after: float = CLEAR_AFTER, settle: float = SETTLE) -> None:
        self.own = own
        self.window = window
        self.clear_after = clear_after
        self.settle = settle
        self.over_delivery = False
        self.broker_count: int | None = None
        """the last `$SYS/broker/subscriptions/count`"""
        self.sample_at: float | None = None
        self.known = 0
        """subscriptions the wrapper accounts for now (its own not included)"""
        self.unaccounted = 0
        """subscriptions the broker held beyond what the wrapper accounted for, at the last evaluation"""
        self.switched_on = 0
        self._in_effect: tuple[float, int] | None = None
        """(time, known) of the change in effect at the last `expected` (None before the first change)"""
        self._history: deque[tuple[float, int]] = deque()
        """(time, known) of the changes after `_in_effect`, oldest first"""
        self._peaks: deque[tuple[float, int]] = deque()
        """of `_history`, each change no later one is at least as large as: the largest since a time is the first
        of these after it (a sliding-window maximum: at 2,000 subscription changes a second, taking the maximum
        of the whole window at each change held the loop at 60% of a core and the log fell 24,000 lines behind)"""
        self._agreeing_since: float | None = None
        self._differing_since: float | None = None

    def known_changed(self, known: int, now: float) -> bool | None:
        """The wrapper's count changed (its table did); a new over-delivery state, or None for no change."""
        if known != self.known or self._in_effect is None:
            self.known = known
            if self._in_effect is None:
                self._in_effect = (now, known)
            else:
                self._history.append((now, known))
                peaks = self._peaks
                while peaks and peaks[-1][1] <= known:
                    peaks.pop()
                peaks.append((now, known))
        return self._evaluate(now)

    def sample(self, count: int, now: float) -> bool | None:
        """The broker published its count; a new over-delivery state, or None for no change."""
        self.broker_count = count
        self.sample_at = now
        return self._evaluate(now)

    def tick(self, now: float) -> bool | None:
        """Once a second: over-delivery ends only on a tick after the counts agreed long enough."""
        return self._evaluate(now)

    def expected(self, now: float) -> int:
        """The most subscriptions the broker may hold that the wrapper knows of, for the last count.

        Mosquitto counts at each `sys_interval` tick and publishes only a changed count, so the count that
        arrived at `sample_at` is the broker's from some time within `window` before it, and, had the broker's
        count changed before `now - window`, a newer one would have come: it is still the broker's at
        `now - window` once that is after `sample_at`. Compared with the largest number known since then."""
        if self.sample_at is None:
            return self.known + self.own
        since = now - self.window if now - self.window > self.sample_at else self.sample_at - self.window
        history, peaks = self._history, self._peaks
        while history and history[0][0] <= since:
            self._in_effect = history.popleft()  # the last change at or before `since` was in effect then
        while peaks and peaks[0][0] <= since:
            peaks.popleft()
        in_effect = self._in_effect[1] if self._in_effect is not None else self.known
        return max(in_effect, peaks[0][1]) + self.own if peaks else in_effect + self.own

    def _evaluate(self, now: float) -> bool | None:
        count = self.broker_count
        if count is None:
            return None
        expected = self.expected(now)
        if count > expected:
            self.unaccounted = count - expected
            self._agreeing_since = None
            if self._differing_since is None:
                self._differing_since = now
            if not self.over_delivery and now - self._differing_since >= self.settle:
                self.over_delivery = True
                self.switched_on += 1
                return True
            return None
        self.unaccounted = 0
        self._differing_since = None
        if self._agreeing_since is None:
            self._agreeing_since = now
        if self.over_delivery and now - self._agreeing_since >= self.clear_after:
            self.over_delivery = False
            return False
        return None


# ------------------------------------------------------------------ the runtime's part


class DropReport(Protocol):
    """How a dropped publication is counted (the node's one drop counter, `Node.drop`)."""

    def __call__(self, reason: str, /) -> None: ...


class GiveBack(Protocol):
    """How a held QoS 1/2 publication that will not be injected goes back to the node (`Node.injection_failed`):
    its copy is left unacknowledged, so custody of it stays upstream."""

    def __call__(self, publication: PublicationId, now: float, /) -> None: ...


class BrokerSubscriptions:
    """A running wrapper's `ResubscribeHold` and `SubscriptionAudit`, told to its node (pseudo clients) and
    reported (drops, events, log lines). Used on the loop's thread."""

    def __init__(self, sink: SubscriptionSink, drop: DropReport, outbox: wrapper_events.WrapperEvents,
                 table: LocalSubscriptions, grace: float, give_back: GiveBack | None = None) -> None:
        self.sink = sink
        self.drop = drop
        self.give_back = give_back
        self.outbox = outbox
        self.table = table
        self.hold = ResubscribeHold(grace)
        self.audit = SubscriptionAudit()
        self.helper_subscriptions = 0
        """subscriptions the wrapper's other connections hold now (its retained scan, federation.daemon.retained_scan),
        which the broker counts as it counts the wrapper's own"""
        self._drops_logged_at = float("-inf")
        self._drops_unlogged = 0

    # ------------------------------------------------------------ a broker that lost its subscriptions

    def broker_restarted(self, now: float) -> None:
        """The broker lost our session, so its clients' subscriptions too: keep what the table knew as interest
        for the grace, and hold what would go nowhere."""
        filters: dict[str, int] = {}
        for record in self.table.clients.values():
            for filter_, qos in record.filters.items():
                filters[filter_] = max(qos, filters.get(filter_, 0))
        added = self.hold.start(filters, now)
        for federated, qos in added:
            self.sink.local_subscribe(RESTART_CLIENT, federated, qos, now)
        pending = sorted(self.hold.pending)
        log.warning("the broker restarted (it no longer had the wrapper's session): its clients' subscriptions are "
                    "gone until they subscribe again. Publications for the %d filters it knew (%s) are held for "
                    "up to %g s (resubscribe_grace) and injected when a matching subscription is logged again",
                    len(pending), ", ".join(pending[:5]) + (", ..." if len(pending) > 5 else ""), self.hold.grace)
        self.outbox.emit(wrapper_events.RESUBSCRIBE_GRACE_STARTED, now, filters=pending, seconds=self.hold.grace)

    def admit(self, injections: list[Injection], now: float) -> list[Injection]:
        """The injections to make now, in order; the rest are held (or dropped when the hold is full)."""
        hold = self.hold
        if not hold.active:
            return injections  # the common case, once per pass: no copy
        admitted = [injection for injection in injections if hold.admit(injection)]
        for injection, filter_ in hold.take_overflowed():
            self._dropped(injection, filter_, HOLD_FULL_REASON, now)
        return admitted

    def subscribed(self, client: str, raw_filter: str, now: float) -> list[Injection]:
        """A subscribe line was logged: the held publications it releases, in order."""
        released, ended = self.hold.subscribed(client, raw_filter)
        if ended is not None:
            self.sink.local_unsubscribe(RESTART_CLIENT, ended, now)
        if not self.hold.active and (released or ended is not None):
            self._grace_ended(now, [])
        return released

    def _grace_ended(self, now: float, unresubscribed: list[str], dropped: int = 0) -> None:
        self.outbox.emit(wrapper_events.RESUBSCRIBE_GRACE_ENDED, now, released=self.hold.released,
                         dropped=dropped, unresubscribed=unresubscribed)

    # ------------------------------------------------------------ the broker's count

    def table_changed(self, now: float) -> None:
        known = broker_counted(self.table) + self.helper_subscriptions
        self._over_delivery(self.audit.known_changed(known, now), now)

    def helpers_subscribed(self, count: int, now: float) -> None:
        """The wrapper's other connections hold `count` subscriptions from now on (`helper_subscriptions`)."""
        self.helper_subscriptions = count
        self.table_changed(now)

    def counted(self, count: int, now: float) -> list[Injection]:
        """The broker's subscription count: over-delivery starts or not, and, during a grace, the publications
        it releases (in order) when the broker holds subscriptions made since its restart that were not seen."""
        self._over_delivery(self.audit.sample(count, now), now)
        hold = self.hold
        if not hold.unseen_subscriptions(count, self.audit.own + self.helper_subscriptions):
            return []
        seen = len(hold.fresh_subscriptions)
        released, ended = hold.release_all()
        for filter_ in ended:
            self.sink.local_unsubscribe(RESTART_CLIENT, filter_, now)
        log.warning("the broker holds %d subscriptions made since it restarted that the wrapper did not see (clients "
                    "that subscribed again before it was back on the broker's log): injecting the %d publications "
                    "held for them", count - self.audit.own - seen, len(released))
        self._grace_ended(now, [])
        return released

    def _over_delivery(self, state: bool | None, now: float) -> None:
        if state is None:
            return
        audit = self.audit
        if state:
            self.sink.local_subscribe(UNACCOUNTED_CLIENT, OVER_DELIVERY_FILTER, 2, now)
            log.warning("the broker holds %d subscriptions the wrapper never saw (its count %s, the wrapper knows "
                        "%d and holds %d itself): delivering every federated publication to this broker (interest "
                        "in #), which filters them, until the counts agree for %g s", audit.unaccounted,
                        audit.broker_count, audit.known, audit.own, audit.clear_after)
        else:
            self.sink.local_unsubscribe(UNACCOUNTED_CLIENT, OVER_DELIVERY_FILTER, now)
            log.info("the broker's subscription count agrees with the wrapper's again: over-delivery ended")
        self.outbox.emit(wrapper_events.UNACCOUNTED_SUBSCRIPTIONS, now, broker_count=audit.broker_count or 0,
                         known=audit.known, over_delivery=state)

    # ------------------------------------------------------------ time

    def tick(self, now: float) -> None:
        """Once a second: end a grace that is over, end over-delivery once the counts agreed long enough."""
        expired = self.hold.expire(now)
        if expired is not None:
            for filter_ in expired.unresubscribed:
                self.sink.local_unsubscribe(RESTART_CLIENT, filter_, now)
            for injection, filter_ in expired.dropped:
                self._dropped(injection, filter_, DROP_REASON, now)
            if expired.unresubscribed:
                log.warning("nobody subscribed again to %d filters within %g s of the broker restart (%s): the "
                            "wrapper no longer asks the federation for them", len(expired.unresubscribed),
                            self.hold.grace, ", ".join(expired.unresubscribed[:5]))
            self._grace_ended(now, expired.unresubscribed, len(expired.dropped))
        self._over_delivery(self.audit.tick(now), now)
        self._log_drops(now)

    def _dropped(self, injection: Injection, filter_: str, reason: str, now: float) -> None:
        self.drop(reason)
        if injection.qos and self.give_back is not None:
            self.give_back(injection.publication, now)
        self.outbox.emit(events.PUBLICATION_DROPPED, now, pub=events.publication_text(injection.publication),
                         filter=filter_, reason=reason)
        self._drops_unlogged += 1
        self._log_drops(now)

    def _log_drops(self, now: float) -> None:
        if not self._drops_unlogged or now - self._drops_logged_at < HELD_DROP_LOG_INTERVAL:
            return
        self._drops_logged_at = now
        log.warning("dropped %d publications held after the broker restarted: no subscriber matching them "
                    "subscribed again within resubscribe_grace (%g s), or the hold was full (drops %s and %s; "
                    "logged at most once a minute)", self._drops_unlogged, self.hold.grace, DROP_REASON,
                    HOLD_FULL_REASON)
        self._drops_unlogged = 0

    def status(self) -> dict[str, object]:
        hold, audit = self.hold, self.audit
        return {
            "resubscribe_grace": {"active": hold.active, "seconds": hold.grace, "deadline": hold.deadline,
                                  "pending_filters": sorted(hold.pending), "held": hold.held_count,
                                  "held_bytes": hold.held_bytes, "released": hold.released, "dropped": hold.dropped},
            "subscription_count": {"broker": audit.broker_count, "known": audit.known, "own": audit.own,
                                   "unaccounted_subscriptions": audit.unaccounted,
                                   "over_delivery": audit.over_delivery, "over_delivery_started": audit.switched_on},
        }

