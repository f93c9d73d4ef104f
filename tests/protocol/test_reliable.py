"""Hop-by-hop acknowledgement and retransmission of QoS 1/2 publications (federation.protocol.reliable).

Nodes are wired together in memory (tests/node_harness.py); a drop rule
decides which datagrams the network loses, so each test scripts exactly
the loss it is about.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from federation.protocol import wire
from federation.protocol.settings import Settings
from federation.protocol.types import Address

from node_harness import Harness, address

DropRule = Callable[[bytes, Address, int], bool]
"""(datagram, source, target index) -> True to lose it"""


class LossyHarness(Harness):
    def __init__(self, *args: object, **kwargs: object) -> None:
        self.drop: DropRule = lambda data, source, target: False
        self.lost: list[str] = []
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def lose(self, data: bytes, source: Address, target: int) -> bool:
        if self.drop(data, source, target):
            self.lost.append(wire.packet_type(data) or "?")
            return True
        return False


def events_of(harness: Harness, kind: str, node: int | None = None) -> list[dict[str, object]]:
    return [e for e in harness.events if e["type"] == kind and (node is None or e["node"] == str(address(node)))]


def converged_line(settings: Settings | None = None) -> LossyHarness:
    """0 - 1, a QoS 1 subscriber at 0 (the core), converged."""
    harness = LossyHarness([(0, 1)], settings=settings)
    harness.do(0, "local_subscribe", "sub", "a/#", 1)
    harness.run(8.0)
    assert harness.nodes[1].mesh.topics["a/#"].core is not None
    return harness


def drop_first(kind: str, count: int) -> DropRule:
    left = [count]

    def rule(data: bytes, source: Address, target: int) -> bool:
        if wire.packet_type(data) == kind and left[0] > 0:
            left[0] -= 1
            return True
        return False
    return rule


def test_a_lost_qos1_publication_is_retransmitted_until_acknowledged_and_delivered_once() -> None:
    harness = converged_line()
    harness.drop = drop_first(wire.TOPIC_MESSAGE, 2)
    harness.do(1, "local_publish", "a/b", b"x", 1, False, None)
    harness.run(12.0)
    assert [(i, inj.topic) for i, inj in harness.delivered] == [(0, "a/b")]
    retransmitted = events_of(harness, "publication_retransmitted", 1)
    assert [e["attempt"] for e in retransmitted] == [1, 2]
    assert harness.nodes[1].counters["retransmissions"] == 2
    assert harness.nodes[1].counters["acks"] == 1
    assert not harness.nodes[1].reliable.unacked
    assert harness.lost == ["tm", "tm"]


def test_receivers_ack_duplicates_too_and_a_lost_ack_costs_one_duplicate_not_a_delivery() -> None:
    harness = converged_line()
    harness.drop = drop_first(wire.TOPIC_ACK, 1)
    harness.do(1, "local_publish", "a/b", b"x", 1, False, None)
    harness.run(12.0)
    assert len(harness.delivered) == 1
    assert harness.nodes[0].counters["duplicates_dropped"] == 1  # the retransmission, dropped by the cache...
    assert harness.nodes[0].sent_by_type[wire.TOPIC_ACK] == 2    # ... and acknowledged again
    assert not harness.nodes[1].reliable.unacked


def test_backoff_doubles_with_jitter_up_to_the_cap_and_never_gives_up_while_the_neighbour_is_up() -> None:
    settings = Settings(retransmit_timeout=0.1, retransmit_timeout_max=0.4)
    harness = converged_line(settings)
    harness.drop = lambda data, source, target: wire.packet_type(data) == wire.TOPIC_ACK
    harness.do(1, "local_publish", "a/b", b"x", 1, False, None)
    sent_at = harness.now
    harness.run(sent_at + 5.0)
    times = [sent_at] + [float(e["t"]) for e in events_of(harness, "publication_retransmitted", 1)]  # type: ignore[arg-type]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert len(gaps) >= 10
    for gap, base in zip(gaps, [0.1, 0.2, 0.4, 0.4, 0.4, 0.4], strict=False):
        assert base - 1e-6 <= gap <= base * 1.25 + 1e-6, (gaps, base)
    assert events_of(harness, "publication_dropped", 1) == []
    assert len(harness.delivered) == 1  # every retransmission reached 0 and was acknowledged again (and lost)
    assert harness.nodes[0].counters["duplicates_dropped"] == len(gaps)
    assert len(harness.nodes[1].reliable.unacked) == 1 and harness.released == []
    harness.drop = lambda data, source, target: False  # the acknowledgements get through again
    harness.run(harness.now + 1.0)
    assert not harness.nodes[1].reliable.unacked and harness.released == [(1, harness.delivered[0][1].publication)]


def test_qos0_stays_best_effort() -> None:
    harness = converged_line()
    harness.drop = drop_first(wire.TOPIC_MESSAGE, 1)
    harness.do(1, "local_publish", "a/b", b"x", 0, False, None)
    harness.run(12.0)
    assert harness.delivered == []
    assert harness.nodes[1].counters["retransmissions"] == 0
    assert harness.nodes[0].sent_by_type[wire.TOPIC_ACK] == 0
    assert not harness.nodes[1].reliable.unacked


def test_copies_in_custody_are_never_evicted_only_replays_are() -> None:
    """Beyond `max_unacked` the table keeps every copy someone waits for (the origin's embedder paces its own:
    `unacked_copies`); what it forgets is a replay to a new mesh neighbour nobody waits for."""
    harness = converged_line(Settings(max_unacked=3))
    harness.drop = lambda data, source, target: wire.packet_type(data) in (wire.TOPIC_MESSAGE, wire.TOPIC_ACK)
    for _ in range(10):
        harness.do(1, "local_publish", "a/b", b"x", 1, False, None)
    publisher = harness.nodes[1]
    assert len(publisher.reliable.unacked) == 10 and publisher.unacked_copies == 10
    assert not publisher.reliable.orphans and publisher.drops["replay_evicted"] == 0
    harness.drop = lambda data, source, target: False
    harness.run(harness.now + 10)
    assert not publisher.reliable.unacked and len(harness.released) == 10 and len(harness.delivered) == 10
    assert len(publisher.reliable._heap) <= 4 * 3 + 64


def test_a_next_hop_that_goes_down_is_routed_around() -> None:
    # Square 0-1-2-3-0: 0 is the core with the subscriber; 2 publishes toward it through 1 or 3.
    harness = LossyHarness([(0, 1), (1, 2), (2, 3), (0, 3)])
    harness.do(0, "local_subscribe", "sub", "a/#", 1)
    harness.run(8.0)
    publisher = harness.nodes[2]
    first: list[int] = []

    def cut_first_hop(data: bytes, source: Address, target: int) -> bool:
        # Whichever parent 2 picks for the publication, that link dies at once, both ways, for good.
        if source == address(2) and wire.packet_type(data) == wire.TOPIC_MESSAGE and not first:
            first.append(target)
        return bool(first) and {int(source.host.rsplit(".", 1)[1]), target} == {2, first[0]}
    harness.drop = cut_first_hop
    harness.do(2, "local_publish", "a/b", b"x", 1, False, None)
    harness.run(harness.now + 15)
    assert first and [i for i, _ in harness.delivered] == [0]
    assert publisher.counters["reroutes"] >= 1
    assert events_of(harness, "neighbour_down", 2)
    assert not publisher.reliable.unacked


def test_a_publication_reaches_a_mesh_part_that_joined_after_it_passed() -> None:
    # 0 - 1 - 2: 2 subscribes after 1 handled the publication (its copy to 2 could not exist yet); 1 sends
    # its recent QoS 1 publications to its new child, so 2 gets it once.
    harness = LossyHarness([(0, 1), (1, 2)])
    harness.do(0, "local_subscribe", "sub", "a/#", 1)
    harness.do(1, "local_subscribe", "sub", "a/#", 1)
    harness.run(8.0)
    harness.do(0, "local_publish", "a/b", b"x", 1, False, None)
    harness.run(harness.now + 0.5)
    harness.do(2, "local_subscribe", "sub", "a/#", 1)
    harness.run(harness.now + 5)
    assert sorted(i for i, _ in harness.delivered) == [1, 2]
    assert harness.nodes[1].counters["replayed_to_new_mesh_neighbours"] == 1


def test_settings_for_retransmission_are_validated() -> None:
    import pytest

    from federation.protocol.settings import SettingsError
    with pytest.raises(SettingsError, match="retransmit_timeout_max"):
        Settings.from_mapping({"retransmit_timeout": 1.0, "retransmit_timeout_max": 0.5})
    with pytest.raises(SettingsError, match="max_unacked"):
        Settings.from_mapping({"max_unacked": 0})
    with pytest.raises(SettingsError, match="retransmit_limit.* was removed: QoS 1/2 copies are now sent again"):
        Settings.from_mapping({"retransmit_limit": 8})
    with pytest.raises(SettingsError, match="reorder_timeout"):
        Settings.from_mapping({"reorder_timeout": 0})
    assert dataclasses.replace(Settings(), reorder_timeout=1.5).reorder_timeout == 1.5


def test_a_nearly_full_table_refuses_new_copies_and_loses_none() -> None:
    """The middle node's next hop loses everything for 2 s while 28 QoS 1 publications cross: the middle
    node stops acknowledging new copies once its table is nearly full, instead of forgetting the oldest
    (whose only copy the network lost); the publisher keeps them and sends them again, and every
    publication arrives once."""
    harness = LossyHarness([(0, 1), (1, 2)], settings=Settings(max_unacked=16))
    harness.do(0, "local_subscribe", "sub", "a/#", 1)
    harness.run(8.0)
    assert harness.nodes[2].mesh.topics["a/#"].core is not None
    outage_ends = harness.now + 2.0
    harness.drop = lambda data, source, target: (harness.now < outage_ends and source == address(1)
                                                 and wire.packet_type(data) == wire.TOPIC_MESSAGE)
    for _ in range(28):  # 5 ms apart: the middle node's acknowledgements keep the publisher's table small
        harness.do(2, "local_publish", "a/b", b"x", 1, False, None)
        harness.run(harness.now + 0.005)
    middle = harness.nodes[1]
    assert len(middle.reliable.unacked) == 14  # 16 - 16 // 8: room kept for a copy to each mesh neighbour
    assert middle.drops["reliable_table_full"] == 14
    harness.run(harness.now + 40)
    publications = [injection.publication for _, injection in harness.delivered]
    assert len(publications) == 28 and len(set(publications)) == 28
    assert middle.drops["replay_evicted"] == 0 and harness.nodes[2].drops["replay_evicted"] == 0
    assert not middle.reliable.unacked and not harness.nodes[2].reliable.unacked


def test_a_backlogged_delivery_leaves_new_copies_to_their_sender() -> None:
    """While the embedder says the local broker is backed up, the core takes no new QoS 1 copy (no `ta`);
    the publisher sends it again, and it arrives once after the backlog clears."""
    harness = converged_line()
    core = harness.nodes[0]
    core.report_delivery_backlog(True)
    harness.do(1, "local_publish", "a/b", b"x", 1, False, None)
    harness.run(harness.now + 0.5)
    assert harness.delivered == [] and core.drops["delivery_backlogged"] >= 1
    assert core.sent_by_type[wire.TOPIC_ACK] == 0 and harness.nodes[1].reliable.unacked
    core.report_delivery_backlog(False)
    harness.run(harness.now + 10)
    assert len(harness.delivered) == 1 and not harness.nodes[1].reliable.unacked


def test_copies_count_their_bytes_and_large_recent_publications_are_kept_within_max_recent_bytes() -> None:
    """The embedder's backpressure window counts bytes too (`Node.unacked_bytes`: large publications fill it long
    before the count), and the publications kept for new mesh neighbours are bounded in bytes (issue 37: a flood of
    100 kB publications had every wrapper keep seconds of them)."""
    harness = converged_line(Settings(max_recent_bytes=250_000))
    harness.drop = lambda data, source, target: wire.packet_type(data) == wire.TOPIC_ACK
    payload = b"p" * 100_000
    for _ in range(5):
        harness.do(1, "local_publish", "a/b", payload, 1, False, None)
    publisher = harness.nodes[1]
    assert publisher.unacked_copies == 5 and publisher.unacked_bytes == 5 * (100_000 + len("a/b"))
    assert publisher.reliable.recent.bytes <= 250_000 and publisher.reliable.recent_evicted >= 3
    harness.drop = lambda data, source, target: False
    harness.run(harness.now + 10)
    assert publisher.unacked_copies == 0 and publisher.unacked_bytes == 0
    assert len(harness.delivered) == 5
