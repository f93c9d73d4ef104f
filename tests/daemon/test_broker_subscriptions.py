"""Subscriptions the wrapper did not see (federation/daemon/broker_subscriptions.py): the hold after a broker
restart and the audit of the broker's subscription count, in virtual time."""

from __future__ import annotations

import random
import time
from collections import Counter

from federation.daemon import wrapper_events
from federation.daemon.broker import OWN_SUBSCRIPTIONS
from federation.daemon.broker_log import ClientSubscribed
from federation.daemon.broker_subscriptions import (
    DROP_REASON,
    HOLD_FULL_REASON,
    OVER_DELIVERY_FILTER,
    RESTART_CLIENT,
    UNACCOUNTED_CLIENT,
    BrokerSubscriptions,
    HeldTopics,
    ResubscribeHold,
    SubscriptionAudit,
    broker_counted,
)
from federation.daemon.state import ClientRecord, LocalSubscriptions
from federation.protocol.topic_filter import matches
from federation.protocol.types import Address, Injection

ORIGIN = Address("10.0.0.9", 10500)


def injection(seq: int, topic: str) -> Injection:
    return Injection(topic, b"p%d" % seq, 1, False, None, (ORIGIN, 1, seq))


class Sink:
    """The node's side: the pseudo clients' subscriptions."""

    def __init__(self) -> None:
        self.filters: dict[str, set[str]] = {}

    def local_subscribe(self, client: str, filter_: str, qos: int, now: float) -> None:
        self.filters.setdefault(client, set()).add(filter_)

    def local_unsubscribe(self, client: str, filter_: str, now: float) -> None:
        self.filters.get(client, set()).discard(filter_)

    def local_disconnect(self, client: str, now: float) -> None:
        self.filters.pop(client, None)


# ------------------------------------------------------------------ the hold


def test_publications_for_known_filters_wait_until_a_matching_subscription_and_keep_their_order() -> None:
    hold = ResubscribeHold(grace=30.0)
    assert hold.start({"a/#": 1, "b/+": 0, "$SYS/#": 0, "$share/g/c/#": 2}, now=100.0) == [
        ("a/#", 1), ("b/+", 0), ("c/#", 2)]  # federated filters; $SYS is never federated
    made = [injection(1, "a/x"), injection(2, "z/z"), injection(3, "b/y"), injection(4, "a/x"), injection(5, "c/q")]
    admitted = [item for item in made if hold.admit(item)]
    assert admitted == [made[1]]  # nobody knew z/z: it goes (the broker filters)
    released, ended = hold.subscribed("c1", "a/+")  # matches a/x, but a/# itself is still pending
    assert released == [made[0], made[3]] and ended is None
    assert hold.admit(injection(6, "a/x"))  # a/x has a subscriber again: no more holding
    released, ended = hold.subscribed("c1", "b/+")
    assert released == [made[2]] and ended == "b/+"
    assert hold.active and [item for item, _ in hold.held] == [made[4]]
    released, ended = hold.subscribed("c1", "$share/g/c/#")
    assert released == [made[4]] and ended == "c/#"
    released, ended = hold.subscribed("c1", "a/#")
    assert released == [] and ended == "a/#"
    assert not hold.active and hold.released == 4  # everything known is back: the grace ended early


def test_held_topics_a_filter_matches_are_those_mqtt_matching_gives() -> None:
    """`HeldTopics.matching` walks the filter down a trie of the held topics; it must give what testing each
    held topic with `matches` gives, through additions and removals."""
    generator = random.Random(7)
    levels = ["a", "b", "c", ""]
    topics = ["/".join(generator.choice(levels) for _ in range(generator.randint(1, 3))) for _ in range(40)]
    topics = [topic for topic in topics if topic] + ["$SYS/a", "a/$b"]  # an empty topic is no topic
    filters = ["#", "+", "a/#", "a/+", "+/+", "+/b/#", "a/b", "/#", "+/", "a/+/c", "$SYS/#", "+/+/+", "a//c"]
    trie, held = HeldTopics(), Counter[str]()
    for step in range(2000):
        topic = generator.choice(topics)
        if held[topic] and generator.random() < 0.4:
            trie.remove(topic)
            held[topic] -= 1
        else:
            trie.add(topic)
            held[topic] += 1
        if step % 20 == 0:
            for filter_ in filters:
                assert trie.matching(filter_) == {t for t, n in held.items() if n and matches(filter_, t)}, filter_


def test_a_subscribe_line_costs_little_however_much_is_held() -> None:
    """What a restarted broker's 100,000 subscriptions coming back cost: each line looks only at what its own
    filter matches (a test of every held publication per line took 0.9 ms a line with 1,000 held)."""
    hold = ResubscribeHold(grace=30.0, max_held=5000)
    hold.start({f"dev/{number}/cmd": 1 for number in range(20_000)}, now=0.0)
    for seq in range(5000):
        hold.admit(injection(seq, f"dev/{seq * 3}/cmd"))
    started = time.perf_counter()
    released = [each for number in range(20_000) for each in hold.subscribed("c", f"dev/{number}/cmd")[0]]
    took = time.perf_counter() - started
    assert released == [injection(seq, f"dev/{seq * 3}/cmd") for seq in range(5000) if seq * 3 < 20_000]
    assert took < 5.0, f"20,000 subscribe lines with 5,000 publications held took {took:.1f} s"


def test_at_the_end_of_the_grace_what_is_held_is_dropped_and_unresubscribed_filters_forgotten() -> None:
    hold = ResubscribeHold(grace=30.0)
    hold.start({"a/#": 1, "b/#": 1}, now=100.0)
    assert not hold.admit(injection(1, "a/1")) and not hold.admit(injection(2, "b/1"))
    hold.subscribed("c1", "b/#")
    assert hold.expire(129.9) is None
    expired = hold.expire(130.0)
    assert expired is not None
    assert expired.dropped == [(injection(1, "a/1"), "a/#")] and expired.unresubscribed == ["a/#"]
    assert not hold.active and hold.admit(injection(3, "a/1")) and hold.dropped == 1


def test_the_hold_is_bounded_and_pushes_out_the_oldest() -> None:
    hold = ResubscribeHold(grace=30.0, max_held=3, max_held_bytes=1 << 20)
    hold.start({"a/#": 1}, now=0.0)
    for seq in range(1, 6):
        assert not hold.admit(injection(seq, "a/x"))
    assert [item.publication[2] for item, _ in hold.take_overflowed()] == [1, 2]
    assert [item.publication[2] for item, _ in hold.held] == [3, 4, 5] and hold.dropped == 2


# ------------------------------------------------------------------ the audit


def test_a_subscription_the_wrapper_never_saw_switches_over_delivery_on_until_the_counts_agree() -> None:
    audit = SubscriptionAudit(own=3, window=15.0, clear_after=30.0, settle=2.0)
    assert audit.known_changed(2, now=0.0) is None
    assert audit.sample(5, now=1.0) is None  # 2 known + 3 own: agrees
    assert audit.sample(6, now=11.0) is None and audit.unaccounted == 1  # one more than the wrapper knows...
    assert audit.tick(12.0) is None
    assert audit.tick(13.0) is True  # ... for 2 s: not a log line still on its way
    assert audit.tick(40.0) is None  # still unaccounted: stays on
    assert audit.known_changed(3, now=41.0) is None  # the subscriber subscribed again, now seen: agrees
    assert audit.tick(70.0) is None
    assert audit.tick(71.0) is False and not audit.over_delivery


def test_a_client_that_just_left_is_not_taken_for_one_the_wrapper_missed() -> None:
    """The broker's count is a snapshot up to `sys_interval` old: a count taken before a client left arrives
    after the wrapper saw it leave."""
    audit = SubscriptionAudit(own=3, window=15.0, clear_after=30.0, settle=0.0)
    audit.known_changed(4, now=0.0)
    audit.sample(7, now=1.0)
    audit.known_changed(3, now=20.0)  # a client left
    assert audit.sample(7, now=25.0) is None  # taken before it left: within the window, 4 were known
    assert audit.tick(40.0) is None
    assert audit.tick(41.0) is True  # no newer count 15 s on: the broker still holds it, the wrapper knows no more


def test_a_count_that_overtakes_the_subscribe_line_it_counts_starts_nothing() -> None:
    audit = SubscriptionAudit(own=3, window=15.0, clear_after=30.0, settle=2.0)
    audit.known_changed(0, now=0.0)
    assert audit.sample(4, now=1.0) is None  # the count (QoS 0) came first...
    assert audit.known_changed(1, now=1.5) is None  # ... the log line (QoS 2) half a second later
    assert audit.tick(5.0) is None and not audit.over_delivery and audit.switched_on == 0


def test_the_expected_count_is_the_largest_known_since_the_change_in_effect_at_the_window() -> None:
    """`expected` keeps a sliding-window maximum; here against the whole history searched at every call."""
    rng = random.Random(7)
    audit = SubscriptionAudit(own=3, window=15.0, clear_after=30.0, settle=2.0)
    history: list[tuple[float, int]] = []
    now, known, sample_at = 0.0, 0, None
    for _ in range(5000):
        now += rng.choice((0.001, 0.01, 0.5, 3.0))
        if rng.random() < 0.1:
            sample_at = now
            audit.sample(rng.randrange(100), now)
        else:
            known = max(0, known + rng.randrange(-5, 6))
            audit.known_changed(known, now)
            if not history or history[-1][1] != known:
                history.append((now, known))
        if sample_at is None:
            continue
        since = now - 15.0 if now - 15.0 > sample_at else sample_at - 15.0
        first = max((i for i, (at, _) in enumerate(history) if at <= since), default=0)
        assert audit.expected(now) == max(k for _, k in history[first:]) + 3


def test_broker_counted_leaves_out_shared_subscriptions_as_mosquitto_does() -> None:
    table = LocalSubscriptions({"a": ClientRecord({"x/#": 1, "$share/g/y": 0}), "b": ClientRecord({"$SYS/#": 0})})
    assert broker_counted(table) == 2


# ------------------------------------------------------------------ the runtime's part


def make() -> tuple[BrokerSubscriptions, Sink, Counter[str], wrapper_events.WrapperEvents, LocalSubscriptions]:
    sink = Sink()
    drops: Counter[str] = Counter()
    outbox = wrapper_events.WrapperEvents("10.0.0.1:10500")
    table = LocalSubscriptions({"s1": ClientRecord({"a/#": 1}), "s2": ClientRecord({"b/c": 2})})

    def drop(reason: str) -> None:
        drops[reason] += 1

    return BrokerSubscriptions(sink, drop, outbox, table, grace=30.0), sink, drops, outbox, table


def test_after_a_broker_restart_interest_is_kept_and_held_drops_are_counted_and_evented() -> None:
    guard, sink, drops, outbox, _table = make()
    guard.broker_restarted(now=0.0)
    assert sink.filters[RESTART_CLIENT] == {"a/#", "b/c"}
    assert guard.admit([injection(1, "a/1"), injection(2, "q"), injection(3, "b/c")], now=1.0) == [injection(2, "q")]
    assert guard.subscribed("s2", "b/c", now=2.0) == [injection(3, "b/c")]
    assert sink.filters[RESTART_CLIENT] == {"a/#"}
    guard.tick(31.0)
    assert sink.filters[RESTART_CLIENT] == set() and drops == {DROP_REASON: 1}
    kinds = [(event.type, event.fields.get("reason")) for event in outbox.drain()]
    assert kinds == [(wrapper_events.RESUBSCRIBE_GRACE_STARTED, None), ("publication_dropped", DROP_REASON),
                     (wrapper_events.RESUBSCRIBE_GRACE_ENDED, None)]
    assert guard.status()["resubscribe_grace"]["dropped"] == 1


def test_subscriptions_made_before_the_wrapper_was_back_on_the_log_release_what_is_held() -> None:
    """A client subscribed again before the wrapper reconnected (its subscribe line was never seen): the broker's
    count says so, and what was held for the filters known before is injected rather than dropped."""
    guard, sink, drops, outbox, _table = make()
    guard.broker_restarted(now=0.0)
    held = [injection(1, "a/1"), injection(2, "b/c"), injection(3, "a/2")]
    assert guard.admit(held, now=1.0) == []
    assert guard.subscribed("s2", "b/c", now=2.0) == [held[1]]
    assert guard.counted(OWN_SUBSCRIPTIONS + 1, now=3.0) == []  # its own and the one seen: nothing unseen
    assert guard.counted(OWN_SUBSCRIPTIONS + 2, now=13.0) == [held[0], held[2]]  # one more: released, in order
    assert not guard.hold.active and sink.filters[RESTART_CLIENT] == set() and not drops
    assert [event.fields for event in outbox.drain() if event.type == wrapper_events.RESUBSCRIBE_GRACE_ENDED] == [
        {"released": 3, "dropped": 0, "unresubscribed": []}]


def test_a_full_hold_drops_with_its_own_reason() -> None:
    guard, _sink, drops, _outbox, _table = make()
    guard.hold.max_held = 1
    guard.broker_restarted(now=0.0)
    guard.admit([injection(1, "a/1"), injection(2, "a/2")], now=1.0)
    assert drops == {HOLD_FULL_REASON: 1}


def test_over_delivery_is_a_pseudo_subscription_to_everything() -> None:
    guard, sink, _drops, outbox, table = make()
    guard.table_changed(now=0.0)
    guard.counted(OWN_SUBSCRIPTIONS + 3, now=1.0)  # 2 known + its own + 1 unseen
    guard.tick(3.0)
    assert sink.filters[UNACCOUNTED_CLIENT] == {OVER_DELIVERY_FILTER}
    table.apply(ClientSubscribed("s3", "c/d", 0), sink, now=2.0)  # the unseen one subscribes again and is seen
    guard.table_changed(now=2.0)
    guard.tick(33.0)
    assert sink.filters[UNACCOUNTED_CLIENT] == set()
    states = [event.fields["over_delivery"] for event in outbox.drain()
              if event.type == wrapper_events.UNACCOUNTED_SUBSCRIPTIONS]
    assert states == [True, False]
