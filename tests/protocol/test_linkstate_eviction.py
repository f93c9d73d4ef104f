"""Eviction from a full federation table: the record it picks, and the work it costs (counted, not timed).

A key holder flooding fake broker records fills the table; from then on every new record evicts one.
The record evicted must be the one a scan of the table would pick (the lowest (received_at, address)
that is not our own), and finding it must not grow with the table: heap entries looked at per record
stay a small constant at 1,000 and at 10,000 records.
"""

from __future__ import annotations

import random

import pytest

from federation.protocol.linkstate import LinkStateDatabase
from federation.protocol.types import Address, BrokerId
from federation.protocol.wire import LinkStateRecord

OWN = Address("10.255.255.1", 10500)


def address(index: int) -> Address:
    return Address(f"10.{index // 65536}.{index // 256 % 256}.{index % 256}", 10500)


def fake(index: int, seq: int = 1, neighbours: tuple[Address, ...] = ()) -> LinkStateRecord:
    return LinkStateRecord(BrokerId(index, address(index)), 1, seq, 0, 0, neighbours)


def scan_choice(db: LinkStateDatabase) -> Address:
    """What the linear scan this replaced evicted."""
    return min((received_at, origin) for origin, received_at in db.received_at.items() if origin != db.own)[1]


def test_eviction_picks_what_a_scan_would_through_refreshes_expiry_and_clocks_going_back() -> None:
    rng = random.Random(7)
    db = LinkStateDatabase(OWN, capacity=50)
    db.store_own(LinkStateRecord(BrokerId(0, OWN), 1, 1, 0, 0, ()), 0.0)
    seqs: dict[int, int] = {}
    now = 0.0
    evictions = 0
    for step in range(5000):
        now += rng.choice((0.0, 0.0, 0.01, 0.5))
        if rng.random() < 0.03:
            now -= rng.random()  # a clock set back: the heap must still be exact
        index = rng.randrange(200)
        action = rng.random()
        if len(db.records) >= db.capacity and index not in seqs:
            expected = scan_choice(db)
            db.accept(fake(index), 1, now)
            assert expected not in db.records, f"step {step}: evicted other than {expected}"
            evictions += 1
            seqs = {i: s for i, s in seqs.items() if address(i) in db.records}
            seqs[index] = 1
        elif action < 0.5:  # a new version, or a first one
            seqs[index] = seqs.get(index, 0) + 1
            db.accept(fake(index, seqs[index]), 1, now)
        elif action < 0.8 and index in seqs:  # the same version again: its clock restarts
            db.accept(fake(index, seqs[index]), 2, now)
        elif action < 0.83:  # expiry, with some reachable records refreshed
            reachable = frozenset(rng.sample(sorted(db.records), k=min(10, len(db.records))))
            for gone in db.expire(rng.choice((5.0, 1000.0, 1000.0)), reachable | {OWN}, now):
                seqs.pop(next(i for i in seqs if address(i) == gone), None)
        seqs = {i: s for i, s in seqs.items() if address(i) in db.records}
    assert OWN in db.records and len(db.records) <= db.capacity
    assert evictions > 500


@pytest.mark.parametrize("capacity", [1000, 10_000])
def test_evictions_cost_the_same_work_whatever_the_table_size(capacity: int) -> None:
    """The issue's flood: a full table, then fake records at 3,000 a second, each evicting one."""
    db = LinkStateDatabase(OWN, capacity)
    db.store_own(LinkStateRecord(BrokerId(0, OWN), 1, 1, 0, 0, ()), 0.0)
    for index in range(capacity - 1):
        db.accept(fake(index), 1, index / 3000)
    now = capacity / 3000
    db.expire(1e9, frozenset({OWN} | {address(i) for i in range(0, capacity, 3)}), now)  # a third refreshed
    before = db.eviction_steps
    for index in range(capacity, capacity + 3000):
        now += 1 / 3000
        assert db.accept(fake(index), 1, now) == "new"
    per_record = (db.eviction_steps - before) / 3000
    assert len(db.records) == capacity
    assert per_record <= 3, f"{per_record:.2f} heap entries per record with {capacity} records"
