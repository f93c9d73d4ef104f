"""Custody of QoS 1/2 publications (federation.protocol.custody, docs/protocol.md rule 7a "Custody").

A node acknowledges a copy only once what it took on with it is done: its own copies acknowledged by
their next hops, its injection reported done by the embedder, nothing held. Nodes are wired together in
memory (tests/node_harness.py); the harness reports injections done at once unless a test says not to,
and a drop rule decides which datagrams the network loses.
"""

from __future__ import annotations

from collections import Counter

import pytest

from federation.protocol import wire
from federation.protocol.settings import Settings
from federation.protocol.types import Address, BrokerId, PublicationId

from node_harness import Harness, address


class LossyHarness(Harness):
    def __init__(self, *args: object, **kwargs: object) -> None:
        self.losing: set[tuple[int, int, str]] = set()
        """(from, to, packet type) lost"""
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def lose(self, data: bytes, source: Address, target: int) -> bool:
        return (int(source.host.rsplit(".", 1)[1]), target, wire.packet_type(data) or "") in self.losing


def index_of(transport: Address) -> int:
    return int(transport.host.rsplit(".", 1)[1])


def delivered(harness: Harness, node: int) -> list[PublicationId]:
    return [injection.publication for index, injection in harness.delivered if index == node]


def publish(harness: Harness, node: int, count: int = 1, topic: str = "a/b", qos: int = 1) -> list[PublicationId]:
    made = []
    for _ in range(count):
        publication = harness.do(node, "local_publish", topic, b"x", qos, False, None)
        assert publication is not None
        made.append(publication)  # type: ignore[arg-type]
    return made


def line(settings: Settings | None = None) -> LossyHarness:
    """0 - 1 - 2: the QoS 1 subscriber at 0 (the core), converged; 2 publishes through 1."""
    harness = LossyHarness([(0, 1), (1, 2)], settings=settings)
    harness.do(0, "local_subscribe", "sub", "a/#", 1)
    harness.run(8.0)
    assert harness.nodes[2].mesh.topics["a/#"].core is not None
    return harness


def quiet(harness: Harness) -> None:
    """Nothing owed anywhere: every copy acknowledged, nothing held, nothing waiting for its predecessor."""
    for index, node in harness.nodes.items():
        assert not node.reliable.unacked, (index, list(node.reliable.unacked))
        assert not node.custody.entries, (index, list(node.custody.entries))
        assert node.mesh.held_count == 0 and node.publications.ordering.waiting == 0, index


# ---------------------------------------------------------------- the acknowledgement waits for what is owed

def test_a_relay_acknowledges_only_once_its_next_hop_has() -> None:
    harness = line()
    harness.losing = {(0, 1, wire.TOPIC_ACK)}  # the core's acknowledgements never reach the relay
    (publication,) = publish(harness, 2)
    harness.run(harness.now + 10)
    assert delivered(harness, 0) == [publication]
    relay, origin = harness.nodes[1], harness.nodes[2]
    assert relay.sent_by_type[wire.TOPIC_ACK] == 0, "the relay acknowledged what its next hop had not"
    assert relay.custody.get(publication, "a/#") is not None and len(origin.reliable.unacked) == 1
    assert harness.released == [] and origin.counters["retransmissions"] > 0
    assert relay.counters["retransmissions_absorbed"] > 0  # the origin's retransmissions wait with the relay
    harness.losing = set()
    harness.run(harness.now + 5)
    assert harness.released == [(2, publication)] and delivered(harness, 0) == [publication]
    quiet(harness)


def test_the_receiver_acknowledges_once_its_broker_has_the_publication() -> None:
    harness = line()
    harness.injections_done = False  # the embedder has not heard from its broker yet
    (publication,) = publish(harness, 2)
    harness.run(harness.now + 2)
    core = harness.nodes[0]
    assert delivered(harness, 0) == [publication] and core.sent_by_type[wire.TOPIC_ACK] == 0
    assert harness.released == [] and core.custody.injecting
    core.injection_done(publication, harness.now)
    harness.flush(0)
    harness.run(harness.now + 1)
    assert harness.released == [(2, publication)]
    quiet(harness)


def test_our_own_publication_is_released_once_every_filter_has_delivered_it() -> None:
    # Two filters match a/b: a/# (subscriber at 0) and a/+ (subscriber at 3): 2 - 1 - 0, 2 - 3.
    harness = LossyHarness([(0, 1), (1, 2), (2, 3)])
    harness.do(0, "local_subscribe", "sub", "a/#", 1)
    harness.do(3, "local_subscribe", "sub", "a/+", 1)
    harness.run(8.0)
    harness.losing = {(3, 2, wire.TOPIC_ACK)}
    (publication,) = publish(harness, 2)
    harness.run(harness.now + 3)
    assert delivered(harness, 0) == [publication] and delivered(harness, 3) == [publication]
    assert harness.released == []  # a/# is done, a/+ is not
    harness.losing = set()
    harness.run(harness.now + 5)
    assert harness.released == [(2, publication)]
    quiet(harness)


def test_a_publication_nobody_subscribed_to_is_released_at_once_and_qos0_takes_no_custody() -> None:
    harness = line()
    (nobody,) = publish(harness, 2, topic="b/c")
    assert harness.released == [(2, nobody)]
    publish(harness, 2, qos=0)
    harness.run(harness.now + 2)
    assert len(delivered(harness, 0)) == 1 and harness.released == [(2, nobody)]
    assert all(node.sent_by_type[wire.TOPIC_ACK] == 0 for node in harness.nodes.values())
    quiet(harness)


# ---------------------------------------------------------------- meshes: fan-out, redundancy, cycles

def test_fan_out_waits_for_every_mesh_neighbour() -> None:
    # Star around the core 0: subscribers at 0, 2 and 3; 1 publishes (not a member).
    harness = LossyHarness([(0, 1), (0, 2), (0, 3)])
    for index in (0, 2, 3):
        harness.do(index, "local_subscribe", "sub", "a/#", 1)
    harness.run(8.0)
    harness.losing = {(3, 0, wire.TOPIC_ACK)}
    (publication,) = publish(harness, 1)
    harness.run(harness.now + 3)
    assert sorted(index for index, _ in harness.delivered) == [0, 2, 3]
    assert harness.nodes[0].custody.get(publication, "a/#").copies == {address(3)}  # type: ignore[union-attr]
    assert harness.released == []
    harness.losing = set()
    harness.run(harness.now + 5)
    assert harness.released == [(1, publication)]
    quiet(harness)


def test_a_mesh_with_redundant_parents_and_copies_from_every_side_never_deadlocks() -> None:
    # A ring of six, everyone subscribed: each member has two parents and gets every publication from
    # two sides (both parents carry publications); every node publishes at once.
    harness = LossyHarness([(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 0)], settings=Settings(data_parents=2))
    for index in range(6):
        harness.do(index, "local_subscribe", "sub", "a/#", 1)
    harness.run(8.0)
    made = [publication for index in range(6) for publication in publish(harness, index, 3)]
    harness.run(harness.now + 5)
    counts = Counter((index, injection.publication) for index, injection in harness.delivered)
    assert set(counts.values()) == {1}
    assert {publication for _, publication in counts} == set(made)
    assert len(counts) == len(made) * 5  # every node but the origin
    assert sorted(publication for _, publication in harness.released) == sorted(made)
    assert sum(node.counters["duplicates_dropped"] for node in harness.nodes.values()) > 0
    quiet(harness)


def test_a_copy_rerouted_back_through_its_origin_is_delivered() -> None:
    """The ring bug of issue 19: 0 - 1 - 2 - 3 - 0, the core 2 subscribed, 0 publishes through its lowest
    parent 1; the link 1 - 2 dies with copies on it. 1 reroutes them through 0 (its only way now): 0
    originated them, and takes them on again toward the core through 3, instead of dropping them as
    duplicates after acknowledging them."""
    harness = LossyHarness([(0, 1), (1, 2), (2, 3), (3, 0)])
    harness.do(2, "local_subscribe", "sub", "a/#", 1)
    harness.run(8.0)
    harness.cut_link(1, 2)
    made = publish(harness, 0, 5)
    harness.run(harness.now + 15)
    assert sorted(delivered(harness, 2)) == sorted(made)
    assert harness.nodes[0].counters["rerouted_through"] > 0
    assert sorted(publication for _, publication in harness.released) == sorted(made)
    quiet(harness)


def test_a_toward_core_duplicate_at_a_member_is_acknowledged_at_once() -> None:
    harness = line()
    (publication,) = publish(harness, 2)
    harness.run(harness.now + 2)
    core, relay = harness.nodes[0], harness.nodes[1]
    acks = core.sent_by_type[wire.TOPIC_ACK]
    message = wire.TopicMessage("a/#", address(2), publication[1], publication[2], wire.MODE_TOWARD_CORE, 1, "a/b",
                                b"x", 1, False, None)
    relay.outbox.send(wire.TOPIC_MESSAGE, message, [address(0)])  # as a relay rerouting it would
    harness.flush(1)
    harness.run(harness.now + 1)
    assert core.sent_by_type[wire.TOPIC_ACK] == acks + 1 and delivered(harness, 0) == [publication]
    assert core.counters["rerouted_through"] == 0


# ---------------------------------------------------------------- faults

def test_a_relay_that_restarts_loses_its_obligations_and_its_upstream_sends_again() -> None:
    harness = line()
    harness.losing = {(0, 1, wire.TOPIC_ACK)}
    made = publish(harness, 2, 3)
    harness.run(harness.now + 1)
    assert len(delivered(harness, 0)) == 3 and harness.released == []
    harness.kill(1)  # it held the three, acknowledged to nobody
    harness.run(harness.now + 1)
    harness.losing = set()
    harness.start(1)
    harness.run(harness.now + 15)
    assert sorted(publication for _, publication in harness.released) == sorted(made)
    assert sorted(set(delivered(harness, 0))) == sorted(made)
    quiet(harness)


def test_a_full_hold_at_a_relay_gives_copies_back_unacknowledged_and_none_is_lost() -> None:
    # 2 - 1 - 0 with a second way 2 - 3 - 0 cut: the relay 1 loses its link to the core while it has copies.
    harness = LossyHarness([(0, 1), (1, 2)], settings=Settings(max_held_publications=2))
    harness.do(0, "local_subscribe", "sub", "a/#", 1)
    harness.run(8.0)
    harness.losing = {(1, 0, wire.TOPIC_MESSAGE)}
    made = publish(harness, 2, 6)
    harness.run(harness.now + 0.5)
    harness.cut_link(0, 1)
    harness.run(harness.now + 10)
    relay = harness.nodes[1]
    assert relay.drops["held_overflow"] > 0 and relay.mesh.held_count <= 2
    assert harness.released == [] and delivered(harness, 0) == []
    harness.losing = set()
    harness.heal(0, 1)
    harness.run(harness.now + 30)
    assert sorted(delivered(harness, 0)) == sorted(made)
    assert sorted(publication for _, publication in harness.released) == sorted(made)
    quiet(harness)


def test_a_failed_injection_gives_the_copy_back_and_the_next_one_is_injected() -> None:
    harness = line()
    harness.injections_done = False
    (publication,) = publish(harness, 2)
    harness.run(harness.now + 0.5)
    core = harness.nodes[0]
    core.injection_failed(publication, harness.now)
    harness.injections_done = True
    harness.run(harness.now + 5)
    assert delivered(harness, 0) == [publication, publication]  # injected again from the retransmission
    assert core.counters["injections_failed"] == 1 and harness.released == [(2, publication)]
    quiet(harness)


def test_a_child_that_is_down_keeps_its_copies_and_gets_them_when_it_comes_back() -> None:
    """0 (core, subscribed) - 1 - 2 (subscribed): 1 is a member with child 2. 2 is cut off for longer than
    the neighbour-down time (its links cut both ways, as a stopped wrapper) while 0 publishes: 1 keeps the
    copies for its child and sends them when it is back, before the child's membership expires. The origin
    has never heard of 2 as a receiver (nothing of it reached 2 before), so its custody ends when 0 and 1 have
    them: the copies 1 keeps hold nobody up (rule 7f), and 2 gets them all the same."""
    harness = LossyHarness([(0, 1), (1, 2)])
    harness.do(0, "local_subscribe", "sub", "a/#", 1)
    harness.do(2, "local_subscribe", "sub", "a/#", 1)
    harness.run(8.0)
    harness.cut_link(1, 2)
    made = publish(harness, 0, 4)
    harness.run(harness.now + 6)
    assert delivered(harness, 2) == []
    assert sorted(publication for _, publication in harness.released) == sorted(made)
    assert harness.nodes[1].counters["copies_left_to_origin"] >= 4
    harness.heal(1, 2)
    harness.run(harness.now + 10)
    assert delivered(harness, 2) == made
    quiet(harness)


def test_a_receiver_cut_off_is_awaited_by_the_origin_not_by_the_hops_between() -> None:
    """As above, but 2 got a publication before the cut (its acknowledgement's reach named it): 1's custody ends
    with what it reached, so 0's publications do not wait in 1 for a part cut off, but the origin keeps them for
    2 (not released) and 2 gets them after it is back, in order; only then are they released."""
    harness = LossyHarness([(0, 1), (1, 2)])
    harness.do(0, "local_subscribe", "sub", "a/#", 1)
    harness.do(2, "local_subscribe", "sub", "a/#", 1)
    harness.run(8.0)
    first = publish(harness, 0, 1)
    harness.run(harness.now + 2)
    assert delivered(harness, 2) == first and [p for _, p in harness.released] == first
    harness.cut_link(1, 2)
    made = publish(harness, 0, 4)
    harness.run(harness.now + 6)
    origin = harness.nodes[0]
    assert delivered(harness, 2) == first and [p for _, p in harness.released] == first
    assert len(origin.receivers.awaiting) == 4
    assert not harness.nodes[1].custody.entries  # the hop between holds nothing for the part cut off
    harness.heal(1, 2)
    harness.run(harness.now + 10)
    assert delivered(harness, 2) == first + made
    assert sorted(publication for _, publication in harness.released) == sorted(first + made)
    assert not origin.receivers.awaiting
    quiet(harness)


# ---------------------------------------------------------------- forged copies (issue 22: the long live fuzz)

FAKE = Address("10.9.9.9", 10500)


def forge(kind: str, body: wire.Body, vid: int = 99, announced: Address = FAKE, epoch: int = 1) -> bytes:
    """A packet as a key holder (anyone, in open mode) would send it from a neighbour's address."""
    return wire.encode(kind, wire.Sender(BrokerId(vid, announced), epoch), body)


def test_two_nodes_that_are_each_others_upstream_and_next_hop_do_not_deadlock() -> None:
    """Forged copies can make two neighbours each other's upstream for a (publication, filter), each with a copy
    out to the other: the fuzzed n1 of tests/real/test_fuzz_real.py takes a forged toward-core copy "from
    n0" (another sender named, so n0 is not excluded) and sends it on toward the core through n0; n0 takes
    it from n1 and holds it for want of a core, and once it learns one through n1 sends it back there (rule
    7a: the only way is back). Each copy then comes from the upstream of the entry it reaches: before, each
    node absorbed it as a retransmission and waited for the other's acknowledgement for ever, both
    retransmitting. Now a copy from the upstream settles the copy sent to it (it has the pair), and both
    entries close. The state is built directly here, as those forgeries leave it."""
    harness = Harness([(0, 1)])
    harness.run(5.0)
    message = wire.TopicMessage("a/#", FAKE, 1, 1, wire.MODE_TOWARD_CORE, 1, "a/b", b"x", 1, False, None)
    for index, other in ((0, 1), (1, 0)):
        node = harness.nodes[index]
        node.custody.open(message, address(other))
        node.delivery.track([message], [address(other)])
        node.outbox.send(wire.TOPIC_MESSAGE, message, [address(other)])
        harness.flush(index)
    harness.run(harness.now + 10)
    assert sum(node.counters["retransmissions"] for node in harness.nodes.values()) <= 2
    quiet(harness)


def test_forged_restarts_of_a_neighbour_do_not_speed_up_retransmission() -> None:
    """Every packet from a neighbour's address that names another sender (or a later epoch) says it restarted,
    and its copies go again at once. A key holder can send one in every datagram: each copy still goes at
    most once per `retransmit_timeout_max` more than its backoff sends it. Before, the origin here sent its
    copy about a thousand times in 10 s, once for every forgery."""
    harness = line()
    harness.losing = {(1, 2, wire.TOPIC_ACK)}  # the relay's acknowledgement never reaches the origin
    publish(harness, 2)
    origin = harness.nodes[2]
    started, retransmissions = harness.now, origin.counters["retransmissions"]
    ack = wire.TopicAck("a/#", FAKE, 1, 1)
    forgeries = 0
    while harness.now < started + 10:
        forgeries += 1
        vid = 99 if forgeries % 2 else 1  # a stranger's name, then the relay's own again: "changed" each time
        origin.receive_packet(forge(wire.TOPIC_ACK, ack, vid, address(1) if vid == 1 else FAKE), address(1),
                              harness.now)
        harness.flush(2)
        harness.run(harness.now + 0.01)
    sent = origin.counters["retransmissions"] - retransmissions
    settings = origin.settings
    assert forgeries > 900 and sent <= 2 * 10 / settings.retransmit_timeout_max + 5, sent
    harness.losing = set()
    harness.run(harness.now + 10)
    quiet(harness)


# ---------------------------------------------------------------- the node's interface for its embedder

def test_a_replayed_spool_keeps_its_ids_and_receivers_take_each_once() -> None:
    harness = line()
    harness.losing = {(1, 2, wire.TOPIC_ACK)}
    made = publish(harness, 2, 3)
    harness.run(harness.now + 2)
    assert delivered(harness, 0) == made and harness.released == []
    harness.kill(2)  # it never heard the acknowledgements: its spool replays all three
    harness.losing = set()
    origin = harness.start(2)
    harness.run(harness.now + 8)
    for publication in made:
        assert origin.local_publish("a/b", b"x", 1, False, None, harness.now, publication_id=publication) \
            == publication
    harness.flush(2)
    (fresh,) = publish(harness, 2)
    assert fresh[1] == origin.epoch and fresh[1] > made[0][1]
    harness.run(harness.now + 5)
    assert delivered(harness, 0) == [*made, fresh]
    assert sorted(publication for _, publication in harness.released) == sorted([*made, fresh])
    quiet(harness)


def test_a_restored_receiver_does_not_inject_again_what_its_journal_has() -> None:
    harness = line()
    harness.losing = {(1, 0, wire.TOPIC_MESSAGE)}
    harness.injections_done = False
    made = publish(harness, 2, 2)
    harness.losing = set()
    harness.run(harness.now + 3)
    assert delivered(harness, 0) == made  # retransmitted, then injected; never reported done
    journal = [(injection.publication, injection.filter) for index, injection in harness.delivered if index == 0]
    harness.kill(0)
    harness.injections_done = True
    core = harness.start(0)
    core.restore(injected=[publication for publication, _ in journal],
                 streams={(made[0][0], "a/#"): (made[-1][1], made[-1][2])})
    harness.do(0, "local_subscribe", "sub", "a/#", 1)
    harness.run(harness.now + 15)
    assert delivered(harness, 0) == made  # the relay sent them again; the journal knew them
    assert sorted(publication for _, publication in harness.released) == sorted(made)
    assert core.stream_positions()[(made[0][0], "a/#")] == (made[-1][1], made[-1][2])
    quiet(harness)


# ---------------------------------------------------------------- partitions longer than an announcement lifetime

@pytest.mark.parametrize("quiet_for", [0.0, 30.0])
def test_a_publication_made_deep_into_a_partition_waits_for_the_heal(quiet_for: float) -> None:
    """0 - 1 - 2, the subscriber and core at 0; the link 0 - 1 is cut. The origin 2 loses the core, and once an
    announcement lifetime had passed with nothing held it forgot the filter: a QoS 1 publication read after that
    matched nothing and was released, acknowledged and never delivered (the fault suite's ring partition, when
    backpressure delayed the read). The filter is kept while its core is out of reach: held, then delivered."""
    harness = line()
    harness.cut_link(0, 1)
    lifetime = harness.settings.announcement_lifetime
    harness.run(harness.now + harness.settings.neighbour_dead_after + 2 * lifetime + quiet_for)
    assert harness.nodes[2].mesh.topics["a/#"].core is None
    (publication,) = publish(harness, 2)
    harness.run(harness.now + 2 * lifetime)
    assert harness.released == [] and delivered(harness, 0) == []  # held at the origin, in custody
    harness.heal(0, 1)
    harness.run(harness.now + 10)
    assert delivered(harness, 0) == [publication] and harness.released == [(2, publication)]
    quiet(harness)


def test_a_filter_whose_core_is_reachable_but_silent_is_forgotten_after_a_lifetime() -> None:
    """The other side of the rule: the core's node is back in reach (here: it restarted without its subscriber)
    and claims nothing: the filter has no subscriber left, and a publication on it is released at once."""
    harness = line()
    harness.kill(0)
    harness.run(harness.now + harness.settings.neighbour_dead_after + 1)
    harness.start(0)  # a new life, without the subscription
    lifetime = harness.settings.announcement_lifetime
    harness.run(harness.now + 3 * lifetime)
    assert "a/#" not in harness.nodes[2].mesh.topics
    (publication,) = publish(harness, 2)
    assert harness.released == [(2, publication)]
    quiet(harness)
