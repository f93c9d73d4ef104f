"""The federation table on its own: routes, the change filter that skips route computations, digests."""

from __future__ import annotations

import random
from collections import deque

from federation.protocol.linkstate import LinkStateDatabase, Routes
from federation.protocol.stored_records import RecordPool, bucket_of, entry_hash
from federation.protocol.types import Address, BrokerId
from federation.protocol.wire import DIGEST_BUCKETS, FLAG_LEAVING, LinkStateRecord


def address(index: int) -> Address:
    return Address(f"10.0.{index // 256}.{index % 256}", 10500)


def record(index: int, neighbours: set[int], seq: int, vid: int | None = None, flags: int = 0) -> LinkStateRecord:
    return LinkStateRecord(BrokerId(index if vid is None else vid, address(index)), 1, seq, 0, flags,
                           tuple(sorted(address(n) for n in neighbours)))


def reference_routes(db: LinkStateDatabase) -> tuple[frozenset[Address], dict[Address, int], dict[Address, frozenset]]:
    """The plain breadth-first search the protocol text describes, over every record (two-way rule)."""
    listed = {a: (frozenset() if s.record.flags & FLAG_LEAVING else frozenset(s.record.neighbours))
              for a, s in db.records.items()}
    distance = {db.own: 0}
    hops: dict[Address, frozenset[Address]] = {}
    queue = deque([db.own])
    while queue:
        node = queue.popleft()
        for peer in sorted(listed.get(node, ())):
            if node not in listed.get(peer, ()):
                continue
            via = frozenset([peer]) if node == db.own else hops[node]
            if peer not in distance:
                distance[peer] = distance[node] + 1
                hops[peer] = via
                queue.append(peer)
            elif distance[peer] == distance[node] + 1:
                hops[peer] = hops[peer] | via
    return frozenset(distance), distance, hops


def same_routes(a: Routes, b: Routes) -> bool:
    return a.members == b.members and a.distance == b.distance and a.next_hops == b.next_hops


def test_routes_match_the_reference_and_skipped_computations_are_exact() -> None:
    """Random link changes, deaths and renames: whenever `routes_affected` says no, a fresh computation
    gives the same routes; every computation agrees with the reference search."""
    rng = random.Random(3)
    for trial in range(30):
        count = rng.randint(3, 25)
        links = {(rng.randrange(i), i) for i in range(1, count)}
        links |= {tuple(sorted(rng.sample(range(count), 2))) for _ in range(rng.randint(0, count))}
        heard = {i: {b if a == i else a for a, b in links if i in (a, b)} for i in range(count)}
        seqs = dict.fromkeys(range(count), 1)
        vids = {i: i for i in range(count)}
        db = LinkStateDatabase(address(0), capacity=1000)
        for i in rng.sample(range(count), count):
            db.accept(record(i, heard[i], 1), 1, 0.0)
        routes = db.compute_routes()
        skipped = computed = 0
        for step in range(60):
            node = rng.randrange(count)
            action = rng.random()
            flags = 0
            if action < 0.4:  # hears one more or one fewer neighbour (often one-way for a while)
                other = rng.choice([i for i in range(count) if i != node])
                heard[node] ^= {other}
            elif action < 0.5:
                vids[node] = rng.randrange(100)
            elif action < 0.6:
                flags = FLAG_LEAVING
            elif action < 0.7 and node != 0:
                db.expire(0.0, frozenset(), float(step + 1))  # drops every unreachable record
                continue
            seqs[node] += 1
            db.accept(record(node, heard[node], seqs[node], vids[node], flags), 1, float(step))
            fresh_needed = db.routes_affected(routes)
            fresh = db.compute_routes(routes)  # partial when the changes only added links
            members, distance, hops = reference_routes(db)
            assert (fresh.members, fresh.distance, fresh.next_hops) == (members, distance, hops), (trial, step)
            # The digest kept as records and routes change is the one computed from scratch.
            assert db.digest(fresh.members) == db.digest(set(fresh.members)), (trial, step)
            if fresh_needed:
                computed += 1
            else:
                skipped += 1
                assert same_routes(fresh, routes), (trial, step)
            routes = fresh
        assert computed > 0
        assert db.ids == {a: s.record.origin for a, s in db.records.items()}
        for vid in {s.record.origin.vid for s in db.records.values()} | {-1}:
            assert db.origins_with_vid(vid) == {a for a, s in db.records.items() if s.record.origin.vid == vid}


def test_partial_update_after_added_links_equals_a_full_search() -> None:
    """Links appear in batches of 1-5 (nodes join, far ends connect): the routes updated from the previous
    ones must equal the reference search each time, distances, members and every next-hop set."""
    rng = random.Random(8)
    for trial in range(40):
        count = rng.randint(5, 60)
        wanted = {(rng.randrange(i), i) for i in range(1, count)}
        wanted |= {tuple(sorted(rng.sample(range(count), 2))) for _ in range(rng.randint(0, 2 * count))}
        order = sorted(wanted)
        rng.shuffle(order)
        heard: dict[int, set[int]] = {i: set() for i in range(count)}
        seqs = dict.fromkeys(range(count), 1)
        db = LinkStateDatabase(address(0), capacity=1000)
        for i in range(count):
            db.accept(record(i, set(), 1), 1, 0.0)
        routes = db.compute_routes()
        position = 0
        while position < len(order):
            batch = order[position:position + rng.randint(1, 5)]
            position += len(batch)
            for a, b in batch:
                heard[a].add(b)
                heard[b].add(a)
            for node in sorted({n for link in batch for n in link}):
                seqs[node] += 1
                db.accept(record(node, heard[node], seqs[node]), 1, 0.0)
            assert all(confirmed for _, _, confirmed in db.changed_links)
            routes = db.compute_routes(routes)
            members, distance, hops = reference_routes(db)
            assert (routes.members, routes.distance, routes.next_hops) == (members, distance, hops), (trial, position)


def test_updates_after_links_went_and_came_together_equal_a_full_search() -> None:
    """Several records change between two computations (links made and broken, nodes leaving, coming back,
    expiring): the routes updated from the previous ones equal the reference search each time."""
    rng = random.Random(9)
    for trial in range(60):
        count = rng.randint(4, 40)
        links = {(rng.randrange(i), i) for i in range(1, count)}
        links |= {tuple(sorted(rng.sample(range(count), 2))) for _ in range(rng.randint(0, 2 * count))}
        heard = {i: {b if a == i else a for a, b in links if i in (a, b)} for i in range(count)}
        seqs = dict.fromkeys(range(count), 1)
        db = LinkStateDatabase(address(0), capacity=1000)
        for i in range(count):
            db.accept(record(i, heard[i], 1), 1, 0.0)
        routes = db.compute_routes()
        for step in range(40):
            for _ in range(rng.randint(1, 6)):
                node = rng.randrange(count)
                flags = 0
                action = rng.random()
                if action < 0.7:  # a link made or broken, seen by one end or both
                    other = rng.choice([i for i in range(count) if i != node])
                    heard[node] ^= {other}
                    if rng.random() < 0.6:
                        heard[other] ^= {node}
                        seqs[other] += 1
                        db.accept(record(other, heard[other], seqs[other]), 1, float(step))
                elif action < 0.8:
                    flags = FLAG_LEAVING
                elif action < 0.85 and node != 0:
                    db.expire(0.0, routes.members, float(step + 1))  # unreachable records go
                    continue
                seqs[node] += 1
                db.accept(record(node, heard[node], seqs[node], flags=flags), 1, float(step))
            routes = db.compute_routes(routes)
            members, distance, hops = reference_routes(db)
            assert (routes.members, routes.distance, routes.next_hops) == (members, distance, hops), (trial, step)
            assert routes.ids == db.ids


def test_links_between_unreachable_or_equidistant_nodes_need_no_computation() -> None:
    # 0 - 1 - 2 and 0 - 3 - 2: 1 and 3 are both at distance 1; 4 - 5 hang off nowhere.
    db = LinkStateDatabase(address(0), capacity=100)
    for index, heard in {0: {1, 3}, 1: {0, 2}, 2: {1, 3}, 3: {0, 2}, 4: set(), 5: set()}.items():
        db.accept(record(index, heard, 1), 1, 0.0)
    routes = db.compute_routes()
    assert routes.next_hops[address(2)] == {address(1), address(3)}
    db.accept(record(4, {5}, 2), 1, 0.0)
    db.accept(record(5, {4}, 2), 1, 0.0)  # a link 4-5: both unreachable
    assert not db.routes_affected(routes)
    db.accept(record(1, {0, 2, 3}, 2), 1, 0.0)
    db.accept(record(3, {0, 2, 1}, 2), 1, 0.0)  # a link 1-3: same distance, on no shortest path
    assert not db.routes_affected(routes)
    db.accept(record(2, {1, 3, 4}, 2), 1, 0.0)  # 2 lists 4, but 4 does not list 2 yet: one-way
    assert not db.routes_affected(routes)
    db.accept(record(4, {5, 2}, 3), 1, 0.0)  # now two-way: 4 and 5 become reachable
    assert db.routes_affected(routes)
    routes = db.compute_routes()
    assert routes.distance[address(5)] == 4 and routes.next_hops[address(5)] == {address(1), address(3)}


def test_digest_depends_on_versions_only_and_names_the_differing_bucket() -> None:
    records = [record(i, {i - 1, i + 1} - {-1, 40}, seq=3) for i in range(40)]
    first = LinkStateDatabase(address(0), capacity=100)
    second = LinkStateDatabase(address(0), capacity=100)
    for r in records:
        first.accept(r, 1, 0.0)
    for r in reversed(records):
        second.accept(r, 3, 5.0)  # other order, other distances and times
    members = frozenset(address(i) for i in range(40))
    assert first.digest(members) == second.digest(members)
    count, buckets = first.digest(members)
    assert count == 40 and len(buckets) == DIGEST_BUCKETS
    second.accept(record(17, {16, 18}, seq=4), 1, 6.0)
    count_after, buckets_after = second.digest(members)
    differing = {i for i in range(DIGEST_BUCKETS) if buckets[i] != buckets_after[i]}
    assert count_after == 40 and differing == {bucket_of(address(17))}
    assert buckets_after[bucket_of(address(17))] == (buckets[bucket_of(address(17))]
                                                      ^ entry_hash(address(17), 1, 3) ^ entry_hash(address(17), 1, 4))
    summary = second.summary(members, frozenset(differing))
    assert [entry.origin for entry in summary] == sorted(a for a in members if bucket_of(a) in differing)
    assert {(e.origin, e.seq) for e in summary if e.origin == address(17)} == {(address(17), 4)}
    # Only the members count: a record of an unreachable node changes nothing.
    assert first.digest(members - {address(39)}) != first.digest(members)
    assert first.digest(members | {address(99)}) == first.digest(members)


def test_hashes_are_the_documented_ones() -> None:
    """docs/protocol.md: BLAKE2b-64 of "host|port|epoch|seq", big-endian; bucket: first byte of
    BLAKE2b-64 of "host|port", modulo 16. Another implementation must get these values."""
    import hashlib

    expected = int.from_bytes(hashlib.blake2b(b"10.0.0.1|10500|7|9", digest_size=8).digest(), "big")
    assert entry_hash(Address("10.0.0.1", 10500), 7, 9) == expected
    assert bucket_of(Address("10.0.0.1", 10500)) == hashlib.blake2b(b"10.0.0.1|10500", digest_size=8).digest()[0] % 16


def test_reachable_records_do_not_expire_unreachable_ones_do() -> None:
    db = LinkStateDatabase(address(0), capacity=100)
    db.store_own(record(0, {1}, 1), 0.0)
    db.accept(record(1, {0}, 1), 1, 0.0)
    db.accept(record(2, set(), 1), 1, 0.0)
    routes = db.compute_routes()
    assert db.expire(15.0, routes.members, 10.0) == []
    assert db.expire(15.0, routes.members, 16.0) == [address(2)]  # unreachable, not received for 16 s
    assert db.expire(15.0, routes.members, 100.0) == []  # reachable: its clock restarted at every pass
    db.accept(record(1, set(), 2), 1, 100.0)  # 1 stops listing 0: unreachable from now
    routes = db.compute_routes()
    assert address(1) not in routes.members
    assert db.expire(15.0, routes.members, 110.0) == []
    assert db.expire(15.0, routes.members, 116.0) == [address(1)]
    assert address(1) not in db.ids and address(1) not in db.received_at and db.peers(address(1)) == []


def test_a_pool_shares_equal_records_between_tables_and_changes_nothing_they_compute() -> None:
    """Two tables given one `RecordPool` store the same object for equal records (canonical addresses inside);
    their routes, digests and ids are those of tables that make their own."""
    pool = RecordPool()
    shared = [LinkStateDatabase(address(0), 100, pool), LinkStateDatabase(address(1), 100, pool)]
    alone = [LinkStateDatabase(address(0), 100), LinkStateDatabase(address(1), 100)]
    ring = {i: {(i - 1) % 8, (i + 1) % 8} for i in range(8)}
    for db in shared + alone:
        for i in range(8):
            db.accept(record(i, ring[i], 1), 1, 0.0)
        db.accept(record(3, ring[3] | {6}, 2), 2, 1.0)
        db.accept(record(6, ring[6] | {3}, 2), 1, 1.0)
    assert shared[0].records[address(5)] is shared[1].records[address(5)]  # same record, same distance
    assert shared[0].records[address(5)].record.neighbours[0] is shared[1].records[address(4)].record.origin.address
    for with_pool, without in zip(shared, alone, strict=True):
        routes, reference = with_pool.compute_routes(), without.compute_routes()
        assert (routes.members, routes.distance, routes.next_hops) == \
            (reference.members, reference.distance, reference.next_hops)
        assert with_pool.digest(routes.members) == without.digest(reference.members)
        assert with_pool.ids == without.ids and with_pool.received_at == without.received_at
    assert pool.made < pool.made + pool.shared and pool.shared >= 8
