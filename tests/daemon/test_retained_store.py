"""The wrapper's retained store and expiry across the federation (federation.daemon.retained): newest wins by
version, tombstones, stale and expired ones not injected, bounds, kept across a restart."""

from __future__ import annotations

from pathlib import Path

from federation.daemon.record_log import RecordLog
from federation.daemon.retained import ORIGIN_TIME, RetainedStore, prepare, stamp
from federation.protocol.types import Address, Injection, PublicationId

A = Address("10.0.0.1", 10500)
B = Address("10.0.0.2", 10500)
WALL = 1_800_000_000.0


def injection(topic: str, payload: bytes, publication: PublicationId, origin_wall: float, retain: bool = True,
              expiry: int | None = None, qos: int = 1) -> Injection:
    properties = {"message_expiry_interval": expiry} if expiry is not None else None
    return Injection(topic, payload, qos, retain, stamp(properties, retain, origin_wall), publication, "f")


def test_only_retained_or_expiring_publications_are_stamped() -> None:
    assert stamp(None, False, WALL) is None
    assert stamp({"content_type": "x"}, False, WALL) == {"content_type": "x"}
    assert stamp(None, True, WALL) == {ORIGIN_TIME: int(WALL * 1000)}
    assert stamp({"message_expiry_interval": 5}, False, WALL) == {"message_expiry_interval": 5,
                                                                   ORIGIN_TIME: int(WALL * 1000)}


def test_the_newest_version_wins_whatever_the_order_of_arrival() -> None:
    store = RetainedStore()
    newer = injection("t", b"v2", (B, 1, 1), WALL + 1)
    older = injection("t", b"v1", (A, 1, 9), WALL)
    kept, dropped = prepare([newer, older], store, WALL + 2)
    assert [i.payload for i in kept] == [b"v2"] and dropped == [((A, 1, 9), False)]
    assert all(ORIGIN_TIME not in (i.properties or {}) for i in kept)  # no client sees the stamp
    # the same origin time: epoch, then seq, then the address
    same = [injection("u", b"a", (A, 1, 2), WALL), injection("u", b"b", (A, 1, 1), WALL),
            injection("u", b"c", (A, 2, 1), WALL)]
    kept, dropped = prepare(same, store, WALL)
    assert [i.payload for i in kept] == [b"a", b"c"] and len(dropped) == 1
    assert store.counts.stale == 2


def test_the_stored_value_again_is_held_already_not_stale() -> None:
    """A restarted wrapper's duplicate cache starts empty, so a neighbour's replay can bring it the very value its
    store (and its broker) holds: not injected again, counted `repeated`, and no drop."""
    store = RetainedStore()
    value = injection("t", b"v", (A, 1, 1), WALL)
    prepare([value], store, WALL)
    kept, dropped = prepare([value], store, WALL + 1)
    assert kept == [] and dropped == [((A, 1, 1), None)]
    assert (store.counts.repeated, store.counts.stale, store.counts.stored) == (1, 0, 1)


def test_a_deletion_is_a_tombstone_that_refuses_the_value_it_deleted() -> None:
    store = RetainedStore()
    prepare([injection("t", b"", (A, 1, 2), WALL + 1)], store, WALL + 1)
    kept, dropped = prepare([injection("t", b"v1", (A, 1, 1), WALL)], store, WALL + 2)
    assert kept == [] and dropped == [((A, 1, 1), False)]
    assert store.reinjections(WALL + 2) == []  # a tombstone is not injected again


def test_expiry_shrinks_with_the_time_in_the_federation_and_expired_ones_are_dropped() -> None:
    store = RetainedStore()
    live = injection("e", b"x", (A, 1, 1), WALL, retain=False, expiry=60)
    late = injection("e", b"y", (A, 1, 2), WALL, retain=False, expiry=2)
    kept, dropped = prepare([live, late], store, WALL + 3.5)
    assert [i.properties for i in kept] == [{"message_expiry_interval": 57}]
    assert dropped == [((A, 1, 2), True)] and store.counts.expired == 1
    plain = Injection("p", b"z", 0, False, None, (A, 1, 3), "f")
    assert prepare([plain], store, WALL)[0] == [plain]


def test_the_store_is_kept_across_a_restart_and_given_back_with_the_expiry_left(tmp_path: Path) -> None:
    path = tmp_path / "retained.log"
    store = RetainedStore(RecordLog(path))
    prepare([injection("a", b"1", (A, 1, 1), WALL), injection("b", b"2", (A, 1, 2), WALL, expiry=100),
             injection("c", b"3", (A, 1, 3), WALL, expiry=1), injection("a", b"4", (B, 1, 1), WALL + 1)],
            store, WALL + 0.5)
    store.close()
    again = RetainedStore(RecordLog(path))
    assert {topic: value.payload for topic, value in again.values.items()} == {"a": b"4", "b": b"2", "c": b"3"}
    given = again.reinjections(WALL + 10)
    assert [(i.topic, i.payload, i.retain, i.properties) for i in given] == [
        ("b", b"2", True, {"message_expiry_interval": 90}), ("a", b"4", True, None)]
    assert given[1].publication == (B, 1, 1)
    again.close()


def test_the_store_is_bounded_tombstones_first_then_the_oldest(tmp_path: Path) -> None:
    store = RetainedStore(RecordLog(tmp_path / "retained.log"), max_topics=3, max_bytes=1000)
    prepare([injection("a", b"1", (A, 1, 1), WALL), injection("b", b"", (A, 1, 2), WALL),
             injection("c", b"3", (A, 1, 3), WALL), injection("d", b"4", (A, 1, 4), WALL)], store, WALL)
    assert list(store.values) == ["a", "c", "d"] and store.counts.evicted == 1
    prepare([injection("e", b"x" * 1000, (A, 1, 5), WALL)], store, WALL)
    assert list(store.values) == ["e"] and store.bytes == 1000
    store.close()
    assert list(RetainedStore(RecordLog(tmp_path / "retained.log")).values) == ["e"]


def test_the_versions_the_node_compares_follow_the_store_through_updates_evictions_and_a_restart(
        tmp_path: Path) -> None:
    """`retained_versions` (what the node's anti-entropy reads, docs/protocol.md rule 10) holds exactly the stored
    topics' versions, and `retained_copy` gives a value as it travels, its stamp kept."""
    path = tmp_path / "retained.log"
    store = RetainedStore(RecordLog(path), max_topics=2)
    prepare([injection("a", b"1", (A, 1, 1), WALL), injection("a", b"2", (B, 1, 1), WALL + 1),
             injection("b", b"", (A, 1, 2), WALL), injection("c", b"3", (A, 1, 3), WALL)], store, WALL + 2)
    assert list(store.values) == ["a", "c"]  # the tombstone evicted first
    expected = {topic: value.version for topic, value in store.values.items()}
    assert {t: store.retained_versions.get(t) for t in ("a", "b", "c")} == {**expected, "b": None}
    assert store.retained_versions.count == 2
    copy = store.retained_copy("a")
    assert copy is not None and (copy.version, copy.payload) == (expected["a"], b"2")
    assert copy.properties == {ORIGIN_TIME: int((WALL + 1) * 1000)}
    assert store.retained_copy("b") is None
    digest = store.retained_versions.digest()
    store.close()
    again = RetainedStore(RecordLog(path), max_topics=2)
    assert again.retained_versions.digest() == digest
    again.close()
