"""The receiver's order (federation.protocol.ordering, docs/protocol.md rule 7d), and the path per stream.

The `Ordering` part alone, fed `tm` bodies by hand; then nodes wired in memory, where a publication that
arrives before its predecessor waits for it, a deterministic parent keeps a stream on one path, and a
restarted origin's replay goes on where its streams were.
"""

from __future__ import annotations

import random
from collections import Counter

from federation.protocol import events
from federation.protocol.context import Identity, Outbox
from federation.protocol.neighbours import NeighbourTable
from federation.protocol.ordering import Ordering
from federation.protocol.publication_events import expand_all
from federation.protocol.settings import Settings
from federation.protocol.types import Address
from federation.protocol.wire import MODE_IN_MESH, TOPIC_MESSAGE, TopicMessage, packet_type

from node_harness import Harness, address

ORIGIN = Address("10.0.0.9", 10500)


def ordering(since: float = 0.0, **settings: float) -> tuple[Ordering, Outbox]:
    """The part alone; the local interest in every topic began at `since`."""
    chosen = Settings(**settings)  # type: ignore[arg-type]
    identity = Identity(Address("10.0.0.1", 10500), 1, 1, chosen, None)
    outbox = Outbox(identity, NeighbourTable([], 8), True)
    return Ordering(chosen, outbox, lambda topic: since, WAITING.append, WAITING.remove), outbox


WAITING: list[TopicMessage] = []
"""what the part told custody is waiting in a stream (and not passed yet)"""


def tm(seq: int, prev: int | None, epoch: int = 1, filter_: str = "a/#", prev_epoch: int | None = None) -> TopicMessage:
    previous = None if prev is None else (prev_epoch if prev_epoch is not None else epoch, prev)
    return TopicMessage(filter_, ORIGIN, epoch, seq, MODE_IN_MESH, 1, "a/b", b"p", 1, False, None, previous)


def seqs(released: list[TopicMessage]) -> list[int]:
    return [message.seq for message in released]


def test_a_publication_waits_for_its_predecessor_and_is_released_with_it() -> None:
    WAITING.clear()
    order, _ = ordering()
    assert seqs(order.offer(tm(1, None), True, 0.0)) == [1]
    assert seqs(order.offer(tm(3, 2), True, 0.1)) == []
    assert seqs(order.offer(tm(4, 3), True, 0.2)) == []
    assert order.waiting == 2 and order.next_deadline() == 10.1
    assert seqs(WAITING) == [3, 4]  # custody keeps them unacknowledged meanwhile
    assert seqs(order.offer(tm(2, 1), True, 0.3)) == [2, 3, 4]
    assert order.waiting == 0 and order.next_deadline() is None and WAITING == []


def test_publications_not_injected_here_still_pass_their_position() -> None:
    """A stream is followed whole once it is followed: a publication nobody here subscribed to is a link of
    the chain (its topic matches the filter but no local subscription)."""
    order, _ = ordering()
    assert seqs(order.offer(tm(1, None), True, 0.0)) == [1]
    assert seqs(order.offer(tm(3, 2), True, 0.1)) == []
    assert seqs(order.offer(tm(2, 1), False, 0.2)) == [3]
    assert order.offer(tm(7, None, filter_="b/#"), False, 0.3) == []  # a stream nobody injects from: no state
    assert len(order) == 1


def test_a_gap_is_skipped_after_the_timeout_and_the_late_one_is_still_delivered() -> None:
    order, outbox = ordering(reorder_timeout=2.0)
    order.offer(tm(1, None), True, 0.0)
    order.offer(tm(3, 2), True, 1.0)
    order.offer(tm(4, 3), True, 1.5)
    assert order.expire(2.9) == []
    assert seqs(order.expire(3.0)) == [3, 4]
    assert outbox.counters["order_gaps_skipped"] == 1
    (event,) = [e for e in outbox.take_events() if e.type == events.ORDER_GAP_SKIPPED]
    assert event.fields == {"pub": f"{ORIGIN}/1/3", "filter": "a/#", "reason": "timeout", "seconds": 2.0}
    assert seqs(order.offer(tm(2, 1), True, 4.0)) == [2]  # late, but not lost
    assert outbox.counters["order_late"] == 1


def test_a_backlog_that_keeps_coming_is_waited_for_past_the_timeout() -> None:
    """After a heal the origin repairs the far side's gap oldest first while the mesh brings the newest: the
    stream moves with every repair, so the newest wait as long as the repairs keep coming (rule 7d)."""
    order, outbox = ordering(reorder_timeout=2.0)
    order.offer(tm(1, None), True, 0.0)
    assert seqs(order.offer(tm(50, 49), True, 0.5)) == []  # the newest, over the healed mesh
    released = []
    for seq in range(2, 50):  # a repair a tenth of a second: 4.8 s in all, more than the timeout
        now = 0.5 + 0.1 * seq
        released += order.expire(now)
        released += order.offer(tm(seq, seq - 1), True, now)
    assert seqs(released) == list(range(2, 51))
    assert outbox.counters["order_gaps_skipped"] == 0 and outbox.counters["order_late"] == 0
    order.offer(tm(52, 51), True, 10.0)  # a gap nothing fills: skipped once the stream stood still that long
    assert order.next_deadline() == 12.0 and seqs(order.expire(12.0)) == [52]


def test_the_bounds_skip_gaps_instead_of_growing() -> None:
    order, outbox = ordering(reorder_max_stream=3, reorder_max=5)
    order.offer(tm(1, None), True, 0.0)
    released = []
    for seq in range(3, 8):
        released += order.offer(tm(seq, seq - 1), True, 0.1 * seq)
    assert seqs(released) == [3, 4, 5, 6, 7] and order.waiting == 0  # the 4th waiting one made it skip
    other = tm(1, None, filter_="b/#")
    order.offer(other, True, 1.0)
    for seq in range(3, 6):
        order.offer(tm(seq, seq - 1, filter_="b/#"), True, 1.0 + seq)
    order.offer(tm(10, 9), True, 9.0)
    order.offer(tm(12, 11), True, 9.0)
    released = order.offer(tm(14, 13), True, 9.0)  # six waiting in all: the oldest gap (b/#) goes
    assert seqs(released) == [3, 4, 5] and order.waiting == 3
    assert outbox.counters["order_gaps_skipped"] == 2


def test_one_stream_may_fill_the_whole_buffer_by_default() -> None:
    settings = Settings()
    assert settings.reorder_max_stream == settings.reorder_max
    order, outbox = ordering()
    order.offer(tm(1, None), True, 0.0)
    for seq in range(3, 3003):  # a partition's held publications, before the relay's one
        assert order.offer(tm(seq, seq - 1), True, 1.0) == []
    assert seqs(order.offer(tm(2, 1), True, 2.0)) == list(range(2, 3003))
    assert outbox.counters["order_gaps_skipped"] == 0


def test_a_stream_met_mid_way_waits_briefly_for_what_was_in_flight() -> None:
    order, outbox = ordering(reorder_start=1.0)
    assert order.offer(tm(5, 4), True, 0.0) == []  # its predecessor may be on its way
    assert seqs(order.offer(tm(4, 3), True, 0.2)) == []
    assert order.next_deadline() == 1.0
    assert seqs(order.expire(1.0)) == [4, 5]  # nothing earlier came: the stream starts at 4
    assert outbox.counters["order_started_midway"] == 1 and outbox.counters["order_gaps_skipped"] == 0
    assert outbox.take_events() == []
    order, _ = ordering(reorder_start=0.0)
    assert seqs(order.offer(tm(5, 4), True, 0.0)) == [5]


def test_an_established_subscriber_waits_for_the_start_of_a_stream_as_for_any_gap() -> None:
    """Subscribed long ago (or restored after a restart): a stream it has not seen yet began after it
    subscribed, so what came first is on its way; it waits `reorder_timeout` for it, not `reorder_start`."""
    order, outbox = ordering(since=float("-inf"), reorder_start=1.0, reorder_timeout=10.0)
    assert order.offer(tm(2, 1), True, 100.0) == []
    assert order.next_deadline() == 110.0
    assert seqs(order.offer(tm(1, None), True, 104.0)) == [1, 2]
    assert outbox.counters["order_started_midway"] == 0 and outbox.counters["order_late"] == 0


def test_an_origin_that_restarted_goes_on_across_its_epochs() -> None:
    order, _ = ordering()
    order.offer(tm(1, None), True, 0.0)
    order.offer(tm(2, 1), True, 0.1)
    # Its spool replays 3 (sent before it died, never acknowledged): the first replayed has no `prev`.
    assert seqs(order.offer(tm(3, None), True, 1.0)) == [3]
    # Then its new epoch: the first new one names the last replayed (epoch 1) as predecessor.
    assert seqs(order.offer(tm(2, 1, epoch=2), True, 1.2)) == []
    assert seqs(order.offer(tm(1, 3, epoch=2, prev_epoch=1), True, 1.1)) == [1, 2]
    assert order.positions() == {(ORIGIN, "a/#"): (2, 2)}


def test_restored_positions_keep_the_order_of_a_restarted_receiver() -> None:
    order, _ = ordering()
    order.restore({(ORIGIN, "a/#"): (1, 7)})
    assert seqs(order.offer(tm(9, 8), True, 0.0)) == []
    assert seqs(order.offer(tm(8, 7), True, 0.1)) == [8, 9]
    assert order.offer(tm(7, 6), False, 0.2) == []  # passed before the restart


def test_qos0_never_waits_and_drops_the_late_ones() -> None:
    order, outbox = ordering()
    assert not order.qos0_late(ORIGIN, "a/#", 1, 5)
    assert not order.qos0_late(ORIGIN, "a/#", 1, 7)
    assert order.qos0_late(ORIGIN, "a/#", 1, 6)
    assert not order.qos0_late(ORIGIN, "a/#", 2, 1)  # a new epoch of its origin
    assert order.qos0_late(ORIGIN, "a/#", 1, 9)
    assert outbox.drops["qos0_late"] == 2


# ---------------------------------------------------------------- on nodes

class HoldingHarness(Harness):
    """Holds back the first `tm` of publication `held_seq` sent to node `held_for`, for `delay` seconds."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.held_seq = -1
        self.held_for = -1
        self.delay = 0.0
        self.parked: list[tuple[float, bytes, Address, int]] = []
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def lose(self, data: bytes, source: Address, target: int) -> bool:
        if target == self.held_for and packet_type(data) == TOPIC_MESSAGE and self.held_seq >= 0:
            from federation.protocol.wire import decode
            body = decode(data).body
            assert isinstance(body, TopicMessage)
            if body.seq == self.held_seq:
                self.held_seq = -1
                self.parked.append((self.now + self.delay, data, source, target))
                return True
        return False

    def run(self, until: float) -> None:
        while True:
            super().run(min(until, self.parked[0][0]) if self.parked else until)
            if not self.parked or self.parked[0][0] > until:
                return
            _, data, source, target = self.parked.pop(0)
            self.nodes[target].receive_packet(data, source, self.now)
            self.flush(target)


def test_a_publication_overtaken_on_the_way_is_injected_in_order() -> None:
    harness = HoldingHarness([(0, 1), (1, 2)], settings=Settings(retransmit_timeout=5.0, retransmit_timeout_max=5.0))
    harness.do(0, "local_subscribe", "sub", "a/#", 1)
    harness.run(8.0)
    harness.held_seq, harness.held_for, harness.delay = 2, 0, 0.5  # the second publication is late by 0.5 s
    made = [harness.do(2, "local_publish", "a/b", b"x", 1, False, None) for _ in range(4)]
    harness.run(harness.now + 0.2)
    assert [i.publication for _, i in harness.delivered] == made[:1]  # 3 and 4 wait for 2
    harness.run(harness.now + 1)
    assert [i.publication for _, i in harness.delivered] == made
    assert harness.nodes[0].publications.ordering.waiting == 0


def test_a_stream_cut_off_from_its_origin_waits_for_it_past_the_timeout() -> None:
    """0 (the subscriber) - 1 - 2 (the origin): the second publication's copy to 0 is lost, the two after it wait
    for it, and then 0-1 is cut for 20 s, twice `reorder_timeout`. The gap is not skipped while 0 does not reach
    the origin (it keeps the publication for 0: rule 7f); after the healing it comes and all four are injected in
    order. Without the wait, the gap was skipped during the cut and the second came late."""
    harness = HoldingHarness([(0, 1), (1, 2)])
    harness.do(0, "local_subscribe", "sub", "a/#", 1)
    harness.run(8.0)
    harness.held_seq, harness.held_for, harness.delay = 2, 0, 1000.0  # lost
    made = [harness.do(2, "local_publish", "a/b", b"x", 1, False, None) for _ in range(4)]
    harness.run(harness.now + 0.05)
    harness.cut_link(0, 1)
    harness.run(harness.now + 20)
    node = harness.nodes[0]
    assert [i.publication for _, i in harness.delivered] == made[:1]
    assert node.publications.ordering.waiting == 2 and node.counters["order_gaps_skipped"] == 0
    harness.heal(0, 1)
    harness.run(harness.now + 15)
    assert [i.publication for _, i in harness.delivered] == made
    assert node.counters["order_gaps_skipped"] == 0 and node.counters["order_late"] == 0


def test_a_gap_whose_origin_is_in_reach_is_still_skipped_after_the_timeout() -> None:
    order, outbox = ordering(reorder_timeout=2.0)
    order.offer(tm(1, None), True, 0.0)
    order.offer(tm(3, 2), True, 1.0)
    assert seqs(order.expire(3.0)) == [3] and outbox.counters["order_gaps_skipped"] == 1
    cut, outbox = ordering(reorder_timeout=2.0, receiver_hold=10.0)
    cut._in_reach = lambda origin: False  # type: ignore[method-assign]
    cut.offer(tm(1, None), True, 0.0)
    cut.offer(tm(3, 2), True, 1.0)
    assert cut.expire(3.0) == [] and cut.next_deadline() == 5.0  # its origin out of reach: it waits
    assert cut.expire(9.0) == []
    assert seqs(cut.expire(11.0)) == [3]  # but not beyond receiver_hold
    back, _ = ordering(reorder_timeout=2.0)
    reach = [False]
    back._in_reach = lambda origin: reach[0]  # type: ignore[method-assign]
    back.offer(tm(1, None), True, 0.0)
    back.offer(tm(3, 2), True, 1.0)
    assert back.expire(3.0) == []
    reach[0] = True
    back.routes_changed(4.0)  # back in reach: the gap waits a timeout from now
    assert back.expire(5.0) == [] and seqs(back.expire(6.0)) == [3]


def test_a_partition_that_heals_one_link_first_delivers_in_order() -> None:
    """Ring 0-1-2-3-0, origin 0, the only subscriber 2 (the core); 1-2 and 3-0 cut for 15 s. 1 holds what it had
    taken toward the core before it knew of the cut, 0 holds the rest. 3-0 heals first: 0's 1,500 held publications
    reach 2 through 3 and wait there for 1's; with a stream bounded at 1,000, as it was, the buffer skipped 1's gap
    and those came late (the fault suite's ring partition once delivered 254 of 3,400 out of order this way)."""
    harness = Harness([(0, 1), (1, 2), (2, 3), (3, 0)])
    harness.do(2, "local_subscribe", "sub", "f/#", 1)
    harness.run(10.0)
    made = []

    def publish(count: int) -> None:
        for _ in range(count):
            made.append(harness.do(0, "local_publish", "f/x", b"p", 1, False, None))
            harness.run(harness.now + 0.01)

    publish(100)
    harness.cut_link(1, 2)
    harness.cut_link(3, 0)
    publish(1500)
    harness.heal(3, 0)
    publish(300)
    harness.heal(1, 2)
    publish(100)
    harness.run(harness.now + 30)
    node = harness.nodes[2]
    assert [injection.publication for index, injection in harness.delivered if index == 2] == made
    assert node.counters["order_gaps_skipped"] == 0


def test_a_stream_toward_the_core_keeps_to_one_parent() -> None:
    # Square 0-1-2-3-0: 2 publishes toward the core 0, through 1 or 3; every publication takes the same one.
    harness = Harness([(0, 1), (1, 2), (2, 3), (0, 3)], seed=7)
    harness.do(0, "local_subscribe", "sub", "a/#", 1)
    harness.run(8.0)
    for _ in range(20):
        harness.do(2, "local_publish", "a/b", b"x", 0, False, None)
        harness.run(harness.now + 0.01)
    paths = Counter(e["to"][0] for e in expand_all(harness.events) if e["type"] == "publication_forwarded"
                    and e["node"] == str(address(2)))
    assert paths == {str(address(1)): 20}  # the lowest id of the two parents
    assert len(harness.delivered) == 20


def test_qos0_late_copies_are_dropped_not_injected() -> None:
    harness = HoldingHarness([(0, 1), (1, 2)])
    harness.do(0, "local_subscribe", "sub", "a/#", 0)
    harness.run(8.0)
    harness.held_seq, harness.held_for, harness.delay = 1, 0, 0.3
    made = [harness.do(2, "local_publish", "a/b", b"x", 0, False, None) for _ in range(3)]
    harness.run(harness.now + 1)
    assert [i.publication for _, i in harness.delivered] == made[1:]
    assert harness.nodes[0].drops["qos0_late"] == 1


def test_random_delays_on_a_ring_never_reorder_a_qos1_stream() -> None:
    """Four nodes in a ring, the subscriber opposite the publisher, every `tm` delayed at random (0-30 ms)
    on every hop: arrivals are shuffled, injections are not."""
    rng = random.Random(5)

    class Jittery(Harness):
        def flush(self, index: int) -> None:
            super().flush(index)
            self.queue = [(when + rng.uniform(0, 0.03) if when == self.now + self.latency
                           and packet_type(data) == TOPIC_MESSAGE else when, counter, data, source, target)
                          for when, counter, data, source, target in self.queue]
            import heapq
            heapq.heapify(self.queue)

    harness = Jittery([(0, 1), (1, 2), (2, 3), (3, 0)])
    harness.do(2, "local_subscribe", "sub", "a/#", 1)
    harness.do(0, "local_subscribe", "sub", "a/#", 1)
    harness.run(8.0)
    made = []
    for _ in range(60):
        made.append(harness.do(1, "local_publish", "a/b", b"x", 1, False, None))
        harness.run(harness.now + 0.002)
    harness.run(harness.now + 5)
    for node in (0, 2):
        assert [i.publication for n, i in harness.delivered if n == node] == made, node
    assert sum(n.publications.ordering.status()["waiting"] for n in harness.nodes.values()) == 0
