"""Reading the retained messages a broker already holds (federation.daemon.retained_scan): which of them the
wrapper originates (docs/protocol.md rule 10), and its scan connection kept out of the log tracker and the
subscription audit."""

from __future__ import annotations

from federation.daemon import wrapper_events
from federation.daemon.broker_log import SUBSCRIBE_TOPIC, BrokerLogTracker, ClientConnected, ClientSubscribed
from federation.daemon.broker_subscriptions import UNACCOUNTED_CLIENT, BrokerSubscriptions
from federation.daemon.retained import RetainedStore, stamp
from federation.daemon.retained_scan import SCAN_SUBSCRIPTIONS, HeldRetained, scan_client_id, to_originate
from federation.daemon.state import ClientRecord, LocalSubscriptions
from federation.protocol.types import Address

A = Address("10.0.0.1", 10500)
B = Address("10.0.0.2", 10500)
WALL = 1_800_000_000.0


class _Sink:
    """A `SubscriptionSink` told nothing worth keeping."""

    def local_subscribe(self, client: str, filter_: str, qos: int, now: float) -> None: ...

    def local_unsubscribe(self, client: str, filter_: str, now: float) -> None: ...

    def local_disconnect(self, client: str, now: float) -> None: ...


def held(topic: str, payload: bytes) -> HeldRetained:
    return HeldRetained(topic, payload, 1, None)


def chosen(messages: list[HeldRetained], store: RetainedStore, before: dict[str, object] | None = None) -> list[str]:
    start = dict(store.values) if before is None else before
    return [message.topic for message in to_originate(messages, start, store.values)]  # type: ignore[arg-type]


def test_what_the_store_does_not_hold_is_originated_and_what_it_holds_is_not() -> None:
    store = RetainedStore()
    store.offer("from/federation", (B, 1, 4), 1, b"v", stamp(None, True, WALL))  # injected by this wrapper
    store.offer("ours", (A, 1, 1), 0, b"w", stamp(None, True, WALL))  # taken from this broker before
    messages = [held("from/federation", b"v"), held("ours", b"w"), held("before/the/federation", b"x")]
    assert chosen(messages, store) == ["before/the/federation"]


def test_a_payload_other_than_the_stores_is_originated_a_deleted_one_too() -> None:
    """Published on the broker while the wrapper was down: newer than the store's value (or its tombstone)."""
    store = RetainedStore()
    store.offer("changed", (B, 1, 1), 1, b"old", stamp(None, True, WALL))
    store.offer("deleted", (B, 1, 2), 1, b"", stamp(None, True, WALL))
    assert chosen([held("changed", b"new"), held("deleted", b"again")], store) == ["changed", "deleted"]


def test_a_topic_stored_while_the_scan_ran_is_left_alone() -> None:
    """The store got a newer value (from the federation, given to the broker, or a local client's) after the scan
    started: what the scan read may be older, and originating it would give the old value a newer version."""
    store = RetainedStore()
    store.offer("t", (A, 1, 1), 1, b"old", stamp(None, True, WALL))
    before = dict(store.values)
    store.offer("t", (B, 1, 1), 1, b"newer", stamp(None, True, WALL + 1))
    store.offer("u", (B, 1, 2), 1, b"first", stamp(None, True, WALL + 1))
    assert chosen([held("t", b"read before it"), held("u", b"read before it")], store, before) == []  # type: ignore[arg-type]


def test_the_tracker_ignores_the_scan_connection_as_it_ignores_the_wrappers_own() -> None:
    """Its lines are marked `own` (the subscription table ignores them; the session ledger counts them)."""
    own = "fed-wrapper"
    scan = scan_client_id(own)
    tracker = BrokerLogTracker(own, helper_client_ids=(scan,))
    for text in (f"New client connected from 127.0.0.1:4 as {scan} (p5, c1, k30).",):
        assert tracker.feed("$SYS/broker/log/N", f"1795277416: {text}".encode()) == [
            ClientConnected(scan, True, 5, 30, own=True)]
    assert tracker.feed(SUBSCRIBE_TOPIC, f"1795277416: {scan} 2 #".encode()) == [
        ClientSubscribed(scan, "#", 2, own=True)]
    assert tracker.counters.own_client == 2 and not tracker.connected_clients
    table = LocalSubscriptions()
    assert not table.apply(ClientSubscribed(scan, "#", 2, own=True), _Sink(), 0.0) and table.clients == {}


def test_the_scans_subscriptions_do_not_start_over_delivery() -> None:
    """The broker counts the scan's two subscriptions while it runs (and in the count it publishes next)."""
    table = LocalSubscriptions({"s1": ClientRecord({"a/#": 1})})
    outbox = wrapper_events.WrapperEvents("10.0.0.1:10500")
    sink_filters: dict[str, set[str]] = {}

    class Sink:
        def local_subscribe(self, client: str, filter_: str, qos: int, now: float) -> None:
            sink_filters.setdefault(client, set()).add(filter_)

        def local_unsubscribe(self, client: str, filter_: str, now: float) -> None:
            sink_filters.setdefault(client, set()).discard(filter_)

    guard = BrokerSubscriptions(Sink(), lambda reason: None, outbox, table, grace=30.0)  # type: ignore[arg-type]
    guard.table_changed(now=0.0)
    guard.helpers_subscribed(SCAN_SUBSCRIPTIONS, now=1.0)
    guard.helpers_subscribed(0, now=1.5)
    guard.counted(1 + 3 + SCAN_SUBSCRIPTIONS, now=2.0)  # counted while the scan ran, published after it ended
    for now in (3.0, 6.0, 10.0):
        guard.tick(now)
    assert not sink_filters.get(UNACCOUNTED_CLIENT) and not guard.audit.over_delivery
