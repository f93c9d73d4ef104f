"""One client id federation-wide (issue 39 item 3): the registry's records (federation.daemon.client_registry) and
what a wrapper does with them (federation.daemon.roaming), without brokers: the takeover of a client that connected
elsewhere, the adoption of a session that comes here, and the handover's messages given once, in order."""

from __future__ import annotations

from typing import Any

import pytest

from federation.daemon.broker_log import ClientConnected, ClientSubscribed
from federation.daemon.client_registry import (
    CONNECTED,
    HANDOVER,
    OFFLINE,
    ClientRegistry,
    Finish,
    Record,
    RecordError,
    TakeOver,
    is_record,
    registry_topic,
)
from federation.daemon.kicker import Outcome
from federation.daemon.retained import RetainedStore, stamp
from federation.daemon.roaming import ADOPTION_GRACE, Roaming, adopted_client, filters_topic
from federation.daemon.state import LocalSubscriptions
from federation.protocol.types import Address, Injection

HERE = Address("10.0.0.3", 10500)
THERE = "10.0.0.1:10500"
WALL = 1_800_000_000.0


class Sink:
    def __init__(self) -> None:
        self.filters: dict[str, set[str]] = {}

    def local_subscribe(self, client: str, filter_: str, qos: int, now: float) -> None:
        self.filters.setdefault(client, set()).add(filter_)

    def local_unsubscribe(self, client: str, filter_: str, now: float) -> None:
        self.filters.get(client, set()).discard(filter_)

    def local_disconnect(self, client: str, now: float) -> None:
        self.filters.pop(client, None)


class World:
    """A `Roaming` with its table, store and sink, and what it originated and asked to take over."""

    def __init__(self) -> None:
        self.table = LocalSubscriptions()
        self.sink = Sink()
        self.store = RetainedStore()
        self.originated: list[Record] = []
        self.kicks: list[tuple[str, bool]] = []
        self.kick_done: list[Any] = []
        self.connected: set[str] = set()
        self.roaming = Roaming(HERE, self.table, self.sink, self.store,
                               lambda topic, payload, now: self.originated.append(Record.decode(payload)),
                               self._kick, self.connected.__contains__, lambda client: False)
        self.seq = 0

    def _kick(self, client: str, clean: bool, done: Any) -> None:
        self.kicks.append((client, clean))
        self.kick_done.append(done)

    def receive(self, topic: str, record: Record, now: float = 0.0) -> list[Injection]:
        """A record from THERE, newer than any before (the store takes it, as `retained.prepare` does)."""
        self.seq += 1
        publication = (Address.parse(THERE, 0), 1, self.seq)
        properties = stamp(None, True, WALL + self.seq)
        self.store.offer(topic, publication, 1, record.encode(), properties)
        return self.roaming.record(Injection(topic, record.encode(), 1, True, properties, publication), now)


def injection(seq: int, topic: str, payload: bytes) -> Injection:
    return Injection(topic, payload, 1, False, None, (Address("10.0.0.2", 10500), 1, seq), "q/#")


def test_a_record_reads_back_and_a_foreign_value_is_refused() -> None:
    record = Record("dev", THERE, HANDOVER, False, 5, {"q/#": 1}, "10.0.0.9:10500",
                    (("q/1", b"one", 1, False, None), ("q/2", b"two", 2, False, {"content_type": "x"})),
                    {"10.0.0.2:10500": (1, 7)}, lost=3)
    assert Record.decode(record.encode()) == record
    with pytest.raises(RecordError):
        Record.decode(b"a client's own retained value")
    assert is_record(registry_topic("dev")) and is_record(filters_topic("dev")) and not is_record("q/1")


def test_a_newer_connection_elsewhere_takes_over_only_a_client_id_this_broker_has() -> None:
    registry = ClientRegistry("10.0.0.3:10500")
    claim = Record("dev", THERE, CONNECTED, False).encode()
    assert registry.received(claim, hosted=True) == TakeOver("dev", False, THERE)
    assert registry.received(claim, hosted=False) is None
    # An offline record (a connection ended elsewhere) or a handover between others never takes anything over.
    assert registry.received(Record("dev", THERE, OFFLINE).encode(), hosted=True) is None
    assert registry.received(Record("dev", THERE, HANDOVER, source="10.0.0.9:10500").encode(), hosted=True) is None
    # A handover for this broker is a session to finish here.
    handover = Record("dev", "10.0.0.3:10500", HANDOVER, source=THERE)
    assert registry.received(handover.encode(), hosted=True) == Finish(handover)


def test_a_connection_here_is_claimed_and_a_client_that_was_elsewhere_is_adopted() -> None:
    world = World()
    world.receive(registry_topic("dev"), Record("dev", THERE, CONNECTED, True))
    world.receive(filters_topic("dev"), Record("dev", THERE, OFFLINE, False, 5, {"q/#": 1}))
    world.connected.add("dev")
    world.roaming.log_event(ClientConnected("dev", False, 5, 60), 1.0)
    assert [(r.client, r.host, r.state) for r in world.originated] == [("dev", "10.0.0.3:10500", CONNECTED)]
    assert world.sink.filters[adopted_client("dev")] == {"q/#"}  # the federation brings its publications at once
    assert world.roaming.holding
    # A clean start discards the session: nothing to adopt (one broker discards it too).
    world.roaming.log_event(ClientConnected("other", True, 5, 60), 1.0)
    assert "other" not in world.roaming.adopted


def test_what_the_handover_carries_comes_first_once_and_in_order_then_what_was_held() -> None:
    world = World()
    world.receive(registry_topic("dev"), Record("dev", THERE, CONNECTED, True))
    world.receive(filters_topic("dev"), Record("dev", THERE, OFFLINE, False, 5, {"q/#": 1}))
    world.connected.add("dev")
    world.roaming.log_event(ClientConnected("dev", False, 5, 60), 1.0)
    # Publications for it arrive before the handover (one of them the old broker had too: in both).
    arriving = [injection(5, "q/5", b"five"), injection(6, "q/6", b"six"), injection(7, "other/x", b"not its")]
    assert world.roaming.admit(arriving, 1.1) == [arriving[2]]
    world.table.apply(ClientConnected("dev", False, 5, 60), world.sink, 1.2)
    world.table.apply(ClientSubscribed("dev", "q/#", 1), world.sink, 1.2)
    assert world.roaming.log_event(ClientSubscribed("dev", "q/#", 1), 1.2) == []  # the handover first
    handover = Record("dev", "10.0.0.3:10500", HANDOVER, False, 5, {"q/#": 1}, THERE,
                      (("q/3", b"three", 1, False, None), ("q/4", b"four", 1, False, None),
                       ("q/5", b"five", 1, False, None)))
    released = world.receive(registry_topic("dev"), handover, 1.3)
    assert [i.payload for i in released] == [b"three", b"four", b"five", b"six"]
    assert world.roaming.counts.duplicates_left_out == 1 and not world.roaming.holding
    assert world.sink.filters[adopted_client("dev")] == set()


def test_a_client_id_this_broker_has_is_taken_over_and_its_queue_handed_to_the_new_host() -> None:
    world = World()
    world.connected.add("dev")
    world.table.apply(ClientConnected("dev", False, 5, 60), world.sink, 0.0)
    world.table.apply(ClientSubscribed("dev", "q/#", 1), world.sink, 0.0)
    world.receive(registry_topic("dev"), Record("dev", THERE, CONNECTED, False))
    assert world.kicks == [("dev", False)]
    world.kick_done[0](Outcome(True, [("q/1", b"queued", 1, False, None)]))
    handover = world.originated[-1]
    assert (handover.state, handover.host, handover.source) == (HANDOVER, THERE, "10.0.0.3:10500")
    assert handover.messages == (("q/1", b"queued", 1, False, None),) and dict(handover.filters) == {"q/#": 1}


def test_an_adoption_whose_handover_never_comes_gives_what_it_held_to_the_clients_subscriptions() -> None:
    world = World()
    world.receive(registry_topic("dev"), Record("dev", THERE, CONNECTED, True))
    world.receive(filters_topic("dev"), Record("dev", THERE, OFFLINE, False, 5, {"q/#": 1}))
    world.roaming.log_event(ClientConnected("dev", False, 5, 60), 1.0)
    held = injection(5, "q/5", b"five")
    assert world.roaming.admit([held], 1.1) == []
    world.roaming.log_event(ClientSubscribed("dev", "q/#", 1), 1.2)
    assert world.roaming.tick(1.0 + ADOPTION_GRACE) == [held]
    assert world.roaming.counts.handovers_late == 1 and not world.roaming.holding
