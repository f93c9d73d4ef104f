"""The order of a broker's retained writes (federation.daemon.retained_order, issue 39 item 4): a local write's
version follows what the broker processed before and after it, as the wrapper sees on its connection.

These are the rules the broker link must keep (issue 41 rewrites it): a retained injection is pending from its
write until the broker's answer to it (a QoS 1 PUBACK, a QoS 2 PUBCOMP, the PINGRESP after a QoS 0 one) is read,
in order with the local publications around it; a local write read while one is pending is ordered below it; an
injection that waited while a newer local write was read is not written at all.
"""

from __future__ import annotations

from federation.daemon.retained import ORDER, ORIGIN_TIME, RetainedStore, prepare, stamp, version_of
from federation.daemon.retained_order import RetainedGate, RetainedOrder
from federation.protocol.types import Address, Injection, PublicationId

A = Address("10.0.0.1", 10500)
B = Address("10.0.0.2", 10500)
WALL = 1_800_000_000.0
WALL_MS = int(WALL * 1000)


def remote(topic: str, payload: bytes, publication: PublicationId, wall: float, qos: int = 1) -> Injection:
    return Injection(topic, payload, qos, True, stamp(None, True, wall), publication, "//retained//")


def test_a_local_write_gets_its_wall_clock_or_one_past_the_topics_known_value() -> None:
    """A hybrid logical clock: a write made after the broker took a value must beat it, whatever the clocks say."""
    order = RetainedOrder()
    assert order.local_ms("t", WALL_MS, None) == WALL_MS
    assert order.local_ms("t", WALL_MS, WALL_MS - 5) == WALL_MS
    assert order.local_ms("t", WALL_MS, WALL_MS + 700) == WALL_MS + 701  # a clock behind another broker's
    assert order.clock_ahead == 1


def test_a_local_write_read_while_an_injection_on_its_topic_is_unanswered_is_ordered_below_it() -> None:
    """The broker answers in the order it processes: no answer yet means the local write came first, so the broker
    ends with the injection, and so must every other broker."""
    order = RetainedOrder()
    order.written("t", (B, 1, 1), WALL_MS + 50)
    order.written("t", (B, 1, 2), WALL_MS + 60)
    assert order.local_ms("t", WALL_MS + 100, WALL_MS + 60) == WALL_MS + 49  # below the oldest unanswered
    assert order.local_ms("other", WALL_MS + 100, None) == WALL_MS + 100  # other topics are not concerned
    order.applied((B, 1, 1))
    order.applied((B, 1, 2))
    assert order.local_ms("t", WALL_MS + 100, WALL_MS + 60) == WALL_MS + 100  # answered: processed before it
    assert order.pending_total == 0 and order.below_pending == 1


def test_the_version_takes_the_order_time_and_expiry_keeps_the_wall_clock() -> None:
    properties = stamp({"message_expiry_interval": 30}, True, WALL, order_ms=WALL_MS - 3)
    assert properties == {"message_expiry_interval": 30, ORIGIN_TIME: WALL_MS, ORDER: WALL_MS - 3}
    assert version_of((A, 1, 1), properties)[0] == WALL_MS - 3
    assert stamp(None, True, WALL, order_ms=WALL_MS) == {ORIGIN_TIME: WALL_MS}  # the same time: not repeated
    kept, _dropped = prepare([Injection("t", b"v", 1, True, properties, (A, 1, 1), "f")], RetainedStore(), WALL + 1)
    assert kept[0].properties == {"message_expiry_interval": 29}  # no client sees either stamp


def test_an_injection_that_waited_while_a_newer_local_write_came_is_not_written() -> None:
    """Its turn came after the broker took the local write (newer by its version): writing it then would leave
    this broker with an older value than every other one."""
    store = RetainedStore()
    order = RetainedOrder()
    gate = RetainedGate(store, order)
    waiting = remote("t", b"remote", (B, 1, 1), WALL)
    kept, _ = prepare([waiting], store, WALL)
    gate.prepared(kept[0])
    local_ms = order.local_ms("t", WALL_MS + 1, store.known_ms("t"))  # nothing pending: it was not written yet
    store.offer("t", (A, 1, 1), 1, b"local", stamp(None, True, WALL + 0.001, local_ms))
    assert not gate.admit(kept[0])
    assert gate.stale_at_write == 1 and order.pending_total == 0


def test_the_gate_keeps_an_injection_pending_under_its_federation_topic() -> None:
    """A topic policy may map the injection to another local topic: the order is kept by the store's topic."""
    store = RetainedStore()
    order = RetainedOrder()
    gate = RetainedGate(store, order)
    kept, _ = prepare([remote("site-b/t", b"v", (B, 1, 1), WALL)], store, WALL)
    gate.prepared(kept[0])
    mapped = Injection("t", b"v", 1, True, kept[0].properties, (B, 1, 1), "f")  # as `PolicyEdges.imports` makes it
    assert gate.admit(mapped)
    assert order.pending("site-b/t") == 1 and order.pending("t") == 0
    gate.applied((B, 1, 1))
    assert order.pending_total == 0


def test_a_local_write_placed_against_a_qos0_injection_is_checked_once_the_topic_is_answered() -> None:
    """A QoS 0 injection's answer is the PINGRESP behind it, and Mosquitto may process another client's write
    between the two: the broker's value for the topic is read afterwards (a check), not trusted."""
    order = RetainedOrder()
    order.written("q0", (B, 1, 1), WALL_MS, exact=False)
    order.written("q1", (B, 1, 2), WALL_MS, exact=True)
    order.local_ms("q0", WALL_MS + 1, WALL_MS)
    order.local_ms("q1", WALL_MS + 1, WALL_MS)
    assert order.take_checks() == set()  # not before the answer
    order.applied((B, 1, 2))
    order.applied((B, 1, 1))
    assert order.take_checks() == {"q0"}  # the QoS 1 one was exact
    assert order.take_checks() == set()
