"""Claims and memberships kept by digests, not refreshed (docs/protocol.md rule 5a): federation.protocol.topic_sync,
federation.protocol.digest_tree."""

from __future__ import annotations

import random
from collections import Counter

from federation.protocol import wire
from federation.protocol.digest_tree import DigestTree, bucket_of, entry_hash
from federation.protocol.settings import Settings
from federation.protocol.types import Address

from node_harness import Harness

FAST = Settings(hello_interval=0.2, announce_interval=1.0, aggregate_fanout=0)
"""timers of the tests' federations; filters federated one by one (the control plane's own cost is measured)"""


# ---------------------------------------------------------------- the digest tree


def test_digest_tree_buckets_agree_with_the_entries_at_every_depth() -> None:
    rng = random.Random(3)
    tree: DigestTree[str] = DigestTree()
    model: dict[str, int] = {}
    for _ in range(20000):
        key = f"k{rng.randrange(5000)}"
        value = None if rng.random() < 0.3 else entry_hash(f"{key}|{rng.randrange(3)}")
        tree.set(key, value)
        if value is None:
            model.pop(key, None)
        else:
            model[key] = value
    assert tree.entries == model
    for depth in (0, 1, 2, 4, 5, 7):
        for path in {bucket_of(value, depth) for value in list(model.values())[:50]}:
            inside = {key for key, value in model.items() if bucket_of(value, depth) == path}
            xor = 0
            for key in inside:
                xor ^= model[key]
            assert tree.digest(depth, path) == (len(inside), xor)
            assert set(tree.keys(depth, path)) == inside
            counts, xors = tree.children(depth, path)
            assert sum(counts) == len(inside)
            for nibble in range(16):
                assert tree.digest(depth + 1, (path << 4) | nibble) == (counts[nibble], xors[nibble])


# ---------------------------------------------------------------- claims and memberships over a line


DIGESTS = {wire.TOPIC_DIGEST, wire.TOPIC_REQUEST, wire.TOPIC_SUBSCRIPTIONS}
"""lost too while a test looks at what a lost packet left (else a digest round may repair it at once)"""


class Losing(Harness):
    """Loses the packets of the kinds in `losing`."""

    losing: set[str] = set()

    def lose(self, data: bytes, source: Address, target: int) -> bool:
        return wire.packet_type(data) in self.losing


def sent(harness: Harness) -> Counter[str]:
    """Packets sent by type, all nodes together."""
    total: Counter[str] = Counter()
    for node in harness.nodes.values():
        total.update(node.sent_by_type)
    return total


def test_an_idle_federation_sends_nothing_per_filter() -> None:
    harness = Losing([(1, 2), (2, 3)], settings=FAST)
    for index in range(300):
        harness.do(3, "local_subscribe", "c", f"dev/{index}/cmd", 0)
    harness.run(10.0)
    assert len(harness.nodes[1].mesh.cores()) == 300
    before = sent(harness)
    harness.run(30.0)  # 20 announce intervals with nothing new
    during = sent(harness) - before
    assert during[wire.TOPIC_CORE] == during[wire.TOPIC_SUBSCRIBE] == 0
    assert during[wire.TOPIC_DIGEST] == 2 * 2 * 3 * 20  # 2 links, both ways, 3 sets, every interval: no more
    assert during[wire.TOPIC_REQUEST] == during[wire.TOPIC_SUBSCRIPTIONS] == 0
    assert sum(during.values()) < 1500  # hellos, their answers and the digests, whatever the number of filters


def test_a_lost_claim_and_a_lost_membership_are_repaired_by_the_digests() -> None:
    harness = Losing([(1, 2), (2, 3)], settings=FAST)
    harness.run(2.0)
    harness.losing = {wire.TOPIC_CORE, wire.TOPIC_SUBSCRIBE, *DIGESTS}
    harness.do(3, "local_subscribe", "c", "a/b", 1)
    harness.run(2.5)
    assert "a/b" not in harness.nodes[1].mesh.cores()  # the claim was lost on its way
    harness.losing = set()
    harness.run(5.0)  # the next digest rounds find it
    assert str(harness.nodes[1].mesh.cores()["a/b"].address) == "10.0.0.3:10500"
    assert harness.nodes[2].mesh.topics["a/b"].children or harness.nodes[3].mesh.topics["a/b"].core == \
        harness.nodes[3].broker_id
    harness.do(1, "local_publish", "a/b", b"x", 1, False, None)
    harness.run(7.0)
    assert [(index, injection.topic) for index, injection in harness.delivered] == [(3, "a/b")]
    assert sum(node.counters["topic_digest_mismatches"] for node in harness.nodes.values()) >= 1


def test_a_lost_membership_toward_a_core_elsewhere_is_repaired() -> None:
    harness = Losing([(1, 2), (2, 3)], settings=FAST)
    harness.do(1, "local_subscribe", "c", "a/b", 1)  # node 1 is the core
    harness.run(2.0)
    harness.losing = {wire.TOPIC_SUBSCRIBE, *DIGESTS}
    harness.do(3, "local_subscribe", "c", "a/b", 1)  # node 3's `ts` to node 2 is lost
    harness.run(2.5)
    assert not harness.nodes[2].mesh.topics["a/b"].children
    harness.losing = set()
    harness.run(5.0)
    assert set(harness.nodes[2].mesh.topics["a/b"].children) == {Address("10.0.0.3", 10500)}
    assert harness.nodes[2].counters["memberships_repaired"] >= 1
    harness.do(1, "local_publish", "a/b", b"x", 1, False, None)
    harness.run(7.0)
    assert [(index, injection.topic) for index, injection in harness.delivered] == [(3, "a/b")]  # 1's broker has it


def test_a_lost_prune_is_repaired_and_the_parent_stops_sending() -> None:
    harness = Losing([(1, 2), (2, 3)], settings=FAST)
    harness.do(1, "local_subscribe", "c", "a/b", 1)
    harness.do(3, "local_subscribe", "c", "a/b", 1)
    harness.run(3.0)
    harness.losing = {wire.TOPIC_SUBSCRIBE, *DIGESTS}
    harness.do(3, "local_unsubscribe", "c", "a/b")  # its prune is lost
    harness.run(3.2)
    assert harness.nodes[2].mesh.topics["a/b"].children
    harness.losing = set()
    harness.run(6.0)
    assert not harness.nodes[2].mesh.topics["a/b"].children


def test_a_stale_claim_left_by_a_partition_is_withdrawn_by_its_core() -> None:
    harness = Losing([(1, 2), (2, 3)], settings=FAST)
    harness.do(3, "local_subscribe", "c", "a/b", 1)
    harness.run(2.0)
    assert "a/b" in harness.nodes[1].mesh.cores()
    harness.losing = {wire.TOPIC_CORE, *DIGESTS}  # node 3's withdrawal never arrives
    harness.do(3, "local_unsubscribe", "c", "a/b")
    harness.run(2.5)
    assert "a/b" in harness.nodes[1].mesh.cores()  # still believed: nothing refreshes or expires it
    harness.losing = set()
    harness.run(6.0)
    assert all("a/b" not in node.mesh.cores() for node in harness.nodes.values())


def test_hundreds_of_filters_per_node_converge_and_deliver_once() -> None:
    harness = Harness([(1, 2), (2, 3), (3, 4), (4, 1)], settings=FAST)
    for node in (1, 2, 3, 4):
        for index in range(250):
            harness.do(node, "local_subscribe", "c", f"site{node}/dev/{index}", 1)
    harness.run(8.0)
    for node in harness.nodes.values():
        assert len(node.mesh.cores()) == 1000
        assert len(node.mesh.claims) == 1000
    for node in (1, 2, 3, 4):
        harness.do(node % 4 + 1, "local_publish", f"site{node}/dev/249", b"x", 1, False, None)
    harness.run(12.0)
    assert sorted((index, injection.topic) for index, injection in harness.delivered) == \
        [(node, f"site{node}/dev/249") for node in (1, 2, 3, 4)]


def test_a_neighbour_that_comes_up_beside_thousands_of_claims_learns_them_paced() -> None:
    settings = Settings(hello_interval=0.2, announce_interval=1.0, aggregate_fanout=0, max_topics=10000)
    harness = Harness([(1, 2), (2, 3)], settings=settings)
    harness.cut_link(2, 3)
    for index in range(3000):
        harness.do(1, "local_subscribe", "c", f"dev/{index}/cmd", 0)
    harness.run(5.0)
    assert len(harness.nodes[2].mesh.claims) == 3000 and not harness.nodes[3].mesh.claims
    harness.heal(2, 3)
    harness.run(5.5)
    learnt_early = len(harness.nodes[3].mesh.claims)
    assert 0 < learnt_early < 3000  # a second of pacing: not all at once
    harness.run(8.0)
    assert len(harness.nodes[3].mesh.claims) == 3000
    assert harness.nodes[2].counters["topic_entries_paced"] > 0
