"""Node behaviour on small in-memory networks (tests/node_harness.py)."""

from __future__ import annotations

import pytest

from federation.protocol.settings import Settings
from federation.protocol.types import BrokerId

from node_harness import Harness, address

SEED_LINKS = [(0, 1), (0, 2), (1, 4), (1, 5), (2, 5), (4, 5), (4, 3), (5, 3)]


def agree(h: Harness) -> bool:
    views = [n.view() for n in h.nodes.values()]
    members = {address(i) for i in h.nodes}
    return all(v.members == members for v in views) and len({v.management_core for v in views}) == 1 and \
        len({tuple(sorted(v.topic_cores.items())) for v in views}) == 1


def delivered_to(h: Harness, pub: object) -> list[int]:
    return sorted(i for i, inj in h.delivered if inj.publication == pub)


def test_cold_start_converges_fast_and_elects_lowest_id() -> None:
    h = Harness(SEED_LINKS)
    h.run(1.0)
    assert agree(h), [n.view() for n in h.nodes.values()]
    assert h.nodes[3].view().management_core == BrokerId(0, address(0))
    status = h.nodes[5].status(h.now)
    by_address = {row["address"]: row for row in status["federation"]}
    assert by_address[str(address(0))]["distance"] == 2
    assert sorted(by_address[str(address(0))]["next_hops"]) == [str(address(1)), str(address(2))]


def test_publication_reaches_subscriber_once_through_redundant_paths() -> None:
    h = Harness(SEED_LINKS)
    h.run(1.0)
    h.do(0, "local_subscribe", "sub", "mytopic/example_subtopic", 0)
    h.run(2.0)
    assert all(n.view().topic_cores == {"mytopic/example_subtopic": BrokerId(0, address(0))} for n in h.nodes.values())
    for origin in (4, 5, 3):
        pub = h.do(origin, "local_publish", "mytopic/example_subtopic", b"x", 0, False, None)
        h.run(h.now + 0.5)
        assert delivered_to(h, pub) == [0]


def test_core_contention_resolves_to_lower_id() -> None:
    h = Harness(SEED_LINKS)
    h.run(1.0)
    h.do(4, "local_subscribe", "a", "t", 0)
    h.do(2, "local_subscribe", "b", "t", 0)
    h.run(2.0)
    assert {n.view().topic_cores["t"] for n in h.nodes.values()} == {BrokerId(2, address(2))}
    pub = h.do(3, "local_publish", "t", b"p", 1, False, None)
    h.run(h.now + 0.5)
    assert delivered_to(h, pub) == [2, 4]


def test_wildcards_deliver_once_per_broker() -> None:
    h = Harness(SEED_LINKS)
    h.run(1.0)
    h.do(0, "local_subscribe", "a", "a/#", 0)
    h.do(0, "local_subscribe", "b", "a/+/c", 0)
    h.do(3, "local_subscribe", "c", "a/b/c", 0)
    h.run(2.0)
    pub = h.do(4, "local_publish", "a/b/c", b"p", 0, False, None)
    h.run(h.now + 0.5)
    assert delivered_to(h, pub) == [0, 3]
    pub = h.do(4, "local_publish", "a/x", b"p", 0, False, None)
    h.run(h.now + 0.5)
    assert delivered_to(h, pub) == [0]


def test_partition_elects_core_on_each_side_and_merge_keeps_lowest() -> None:
    h = Harness(SEED_LINKS)
    h.run(1.0)
    h.do(0, "local_subscribe", "a", "t/#", 0)
    h.do(3, "local_subscribe", "b", "t/#", 0)
    h.run(2.0)
    for a, b in [(1, 4), (1, 5), (2, 5)]:
        h.cut_link(a, b)
    h.run(8.0)
    assert h.nodes[4].view().management_core == BrokerId(3, address(3))
    assert h.nodes[4].view().topic_cores["t/#"] == BrokerId(3, address(3))
    assert h.nodes[1].view().topic_cores["t/#"] == BrokerId(0, address(0))
    pub = h.do(5, "local_publish", "t/x", b"p", 0, False, None)
    h.run(h.now + 0.5)
    assert delivered_to(h, pub) == [3]
    for a, b in [(1, 4), (1, 5), (2, 5)]:
        h.heal(a, b)
    h.run(h.now + 3.0)
    assert agree(h)
    assert h.nodes[4].view().topic_cores["t/#"] == BrokerId(0, address(0))
    pub = h.do(5, "local_publish", "t/x", b"p", 0, False, None)
    h.run(h.now + 0.5)
    assert delivered_to(h, pub) == [0, 3]


def test_unsubscribe_prunes_and_core_withdraws() -> None:
    h = Harness([(0, 1), (1, 2)])
    h.run(1.0)
    h.do(2, "local_subscribe", "s", "x", 0)
    h.run(2.0)
    assert h.nodes[0].view().topic_cores == {"x": BrokerId(2, address(2))}
    h.do(2, "local_unsubscribe", "s", "x")
    h.run(3.0)
    assert all(n.view().topic_cores == {} for n in h.nodes.values())
    pub = h.do(0, "local_publish", "x", b"p", 0, False, None)
    h.run(h.now + 0.5)
    assert delivered_to(h, pub) == []


def test_killed_core_is_replaced_and_restart_is_believed() -> None:
    h = Harness([(0, 1), (1, 2), (2, 3), (3, 0)], settings=Settings(hello_interval=0.2))
    h.run(1.0)
    h.do(1, "local_subscribe", "s", "x", 0)
    h.do(3, "local_subscribe", "s", "x", 0)
    h.run(2.0)
    assert h.nodes[0].view().topic_cores["x"] == BrokerId(1, address(1))
    h.kill(1)
    h.run(4.0)
    assert h.nodes[0].view().topic_cores["x"] == BrokerId(3, address(3))
    assert address(1) not in h.nodes[0].view().members
    node = h.start(1)
    node.local_subscribe("s", "x", 0, h.now)
    h.flush(1)
    h.run(h.now + 1.0)
    assert agree(h)
    # The restarted node learns the living core before it may claim: it joins instead of contesting.
    assert h.nodes[1].view().topic_cores["x"] == BrokerId(3, address(3))
    pub = h.do(2, "local_publish", "x", b"p", 0, False, None)
    h.run(h.now + 0.5)
    assert delivered_to(h, pub) == [1, 3]


def test_id_collision_settles() -> None:
    h = Harness([(0, 1), (1, 2), (2, 3)], vids={0: 5, 1: 1, 2: 2, 3: 5})
    h.run(2.0)
    vids = [n.vid for n in h.nodes.values()]
    assert len(set(vids)) == 4
    assert h.nodes[0].vid == 5  # the lower address keeps the id
    assert agree(h)


def test_one_way_cut_takes_link_down_both_ways() -> None:
    h = Harness([(0, 1), (1, 2), (2, 0)], settings=Settings(hello_interval=0.2))
    h.run(1.0)
    h.cut_link(0, 1, oneway=True)
    h.run(3.0)
    assert h.nodes[1].status(h.now)["federation"][0]["next_hops"] == [str(address(2))]
    assert agree(h)


def test_malformed_packets_are_counted_and_change_nothing() -> None:
    h = Harness([(0, 1)])
    h.run(1.0)
    before = h.nodes[0].view()
    for data in (b"", b"\x93\xa2hl", b"garbage" * 10):
        h.nodes[0].receive_packet(data, address(1), h.now)
    h.nodes[0].receive_packet(b"\x91", address(9), h.now)
    assert h.nodes[0].drops["malformed"] == 4
    assert h.nodes[0].view() == before
    dropped = [e for e in h.nodes[0].events_emitted() if e.type == "packet_dropped"]
    assert len(dropped) == 4


def test_publication_held_while_core_elected_then_sent() -> None:
    h = Harness([(0, 1), (1, 2)], settings=Settings(hello_interval=0.2))
    h.run(1.0)
    h.do(2, "local_subscribe", "s", "x", 0)
    h.do(0, "local_subscribe", "s", "x", 0)
    h.run(2.0)
    assert h.nodes[1].view().topic_cores["x"] == BrokerId(0, address(0))
    h.kill(0)
    h.run(h.now + 0.1)
    # node 1 still believes in core 0 for a moment; once it is declared dead, node 2 claims
    h.run(h.now + 1.0)
    pub = h.do(1, "local_publish", "x", b"p", 0, False, None)
    h.run(h.now + 1.0)
    assert delivered_to(h, pub) == [2]


def test_hello_exchange_measures_a_clock_offset_within_half_the_round_trip() -> None:
    """Two nodes whose clocks differ by 0.5 s, over a link 10 ms one way and 30 ms the other."""
    import heapq
    import random

    from federation.protocol import events
    from federation.protocol.node import Node

    skew = {0: 0.0, 1: 0.5}
    delay = {(0, 1): 0.010, (1, 0): 0.030}
    settings = Settings(hello_interval=0.2, stats_interval=1.0)
    nodes = {i: Node(address(i), [address(1 - i)], 1, random.Random(i), settings, vid=i) for i in (0, 1)}
    queue: list[tuple[float, int, int, bytes]] = []
    emitted: list[tuple[int, object]] = []
    true_time = 0.0

    def drain(index: int) -> None:
        for data, _ in nodes[index].packets_to_send():
            heapq.heappush(queue, (true_time + delay[(index, 1 - index)], len(queue), 1 - index, data))
        emitted.extend((index, event) for event in nodes[index].events_emitted())

    for index in (0, 1):
        nodes[index].start(true_time + skew[index])
        drain(index)
    while true_time < 3.0:
        timers = [(timer - skew[i], i) for i in (0, 1) if (timer := nodes[i].get_timer()) is not None]
        next_timer, which = min(timers)
        if queue and queue[0][0] <= next_timer:
            true_time, _, index, data = heapq.heappop(queue)
            nodes[index].receive_packet(data, address(1 - index), true_time + skew[index])
        else:
            true_time, index = max(true_time, next_timer), which
            nodes[index].handle_timer(true_time + skew[index])
        drain(index)
    rtt = delay[(0, 1)] + delay[(1, 0)]
    for index, sign in ((0, 1), (1, -1)):
        neighbour = nodes[index].neighbours.get(address(1 - index))
        assert neighbour is not None and neighbour.up
        # NTP's answer is off by half the delay asymmetry ((30 - 10) / 2 ms), inside the rtt / 2 bound.
        assert neighbour.clock_offset == pytest.approx(sign * 0.5 + sign * (delay[(0, 1)] - delay[(1, 0)]) / 2)
        assert neighbour.clock_error == pytest.approx(rtt / 2)
        assert abs(neighbour.clock_offset - sign * 0.5) <= neighbour.clock_error
    ups = [e for i, e in emitted if i == 0 and e.type == events.NEIGHBOUR_UP]  # type: ignore[attr-defined]
    assert ups and ups[0].fields["clock_error"] == pytest.approx(rtt / 2)  # type: ignore[attr-defined]
    counters = [e for i, e in emitted if i == 0 and e.type == events.COUNTERS]  # type: ignore[attr-defined]
    clocks = counters[-1].fields["clocks"][str(address(1))]  # type: ignore[attr-defined]
    assert clocks["offset"] == pytest.approx(0.5 - 0.010) and clocks["error"] == pytest.approx(0.020)
