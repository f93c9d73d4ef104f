"""The origin's custody spool: kept across a restart, released, bounded, compacted."""

from __future__ import annotations

from pathlib import Path

import msgpack

from federation.daemon.record_log import RecordLog
from federation.daemon.spool import COMPACT_MIN_BYTES, Spool, SpooledPublication, SpoolLimits


def publication(seq: int, payload: bytes = b"x", epoch: int = 7, properties: dict[str, object] | None = None,
                received_at: float = 1000.0) -> SpooledPublication:
    return SpooledPublication(epoch, seq, f"t/{seq}", payload, 1 + seq % 2, seq % 3 == 0, properties, received_at)


def open_spool(path: Path, limits: SpoolLimits | None = None) -> Spool:
    return Spool(RecordLog(path), limits or SpoolLimits())


def test_live_entries_survive_a_restart_in_order_with_their_ids(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool")
    taken = [publication(n, properties={"user_property": [["k", "v"]]} if n == 2 else None) for n in range(1, 6)]
    spool.add(taken)
    assert spool.release([(7, 2), (7, 4), (7, 99)]) == 2
    spool.log.close()
    again = open_spool(tmp_path / "spool")
    assert again.recovered() == [taken[0], taken[2], taken[4]]
    assert again.recovered_count == 3
    assert again.status()["publications"] == 3


def test_reading_pauses_over_the_high_water_mark_and_resumes_below_the_low_one(tmp_path: Path) -> None:
    size = publication(1, b"p" * 936).size  # 1000 bytes each
    spool = open_spool(tmp_path / "spool", SpoolLimits(max_bytes=10 * size, high_water=0.75, low_water=0.5))
    spool.add([publication(n, b"p" * 936) for n in range(1, 8)])
    assert not spool.paused
    spool.add([publication(8, b"p" * 936)])
    assert spool.paused
    spool.release([(7, 1), (7, 2)])
    assert spool.paused  # 6 left: above the low-water mark
    spool.release([(7, 3)])
    assert not spool.paused


def test_age_and_message_expiry_are_due_to_drop(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool", SpoolLimits(max_age=100.0))
    spool.add([publication(1, received_at=1000.0), publication(2, received_at=1095.0, properties={
        "message_expiry_interval": 3}), publication(3, received_at=1099.0)])
    due = spool.due_to_drop(now_wall=1101.0)
    assert [(entry.seq, reason) for entry, reason in due] == [(1, "spool_age"), (2, "spool_expired")]


def test_the_file_is_compacted_when_mostly_dead(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool")
    payload = b"y" * 4096
    count = COMPACT_MIN_BYTES // 4096 + 10
    spool.add([publication(n, payload) for n in range(count)])
    spool.release((7, n) for n in range(count - 1))
    assert spool.log.size_bytes < 2 * 4096
    spool.log.close()
    assert [entry.seq for entry in open_spool(tmp_path / "spool").recovered()] == [count - 1]


def test_an_undecodable_record_is_counted_and_skipped(tmp_path: Path) -> None:
    log = RecordLog(tmp_path / "spool")
    log.append([b"\xc1 not msgpack", publication(1).encode()])
    log.close()
    spool = open_spool(tmp_path / "spool")
    assert spool.undecodable == 1
    assert [entry.seq for entry in spool.recovered()] == [1]


def test_a_dup_redelivery_of_a_recovered_entry_is_recognised_once(tmp_path: Path) -> None:
    """Killed after the spool write, before the PUBACK reached the broker: the broker sends it again (DUP, same
    packet id) and the restarted wrapper must not originate it a second time."""
    spool = open_spool(tmp_path / "spool")
    spooled = SpooledPublication(7, 1, "t/a", b"one", 2, False, None, 1000.0, mid=41)
    spool.add([spooled, SpooledPublication(7, 2, "t/a", b"two", 1, False, None, 1000.0, mid=42)])
    assert spool.redelivery(41, "t/a", b"one") is None  # nothing recovered yet: this run took it
    spool.log.close()
    again = open_spool(tmp_path / "spool")
    assert again.redelivery(41, "t/a", b"other") is None  # the packet id reused for another publication
    assert again.redelivery(41, "t/a", b"one") == spooled
    assert again.redelivery(41, "t/a", b"one") is None  # once per entry
    assert again.redeliveries_recognised == 1
    again.release([(7, 2)])
    assert again.redelivery(42, "t/a", b"two") is None  # released: custody over, a new publication


def test_a_record_written_before_packet_ids_were_kept_still_reads(tmp_path: Path) -> None:
    log = RecordLog(tmp_path / "spool")
    log.append([msgpack.packb(["p", 7, 1, "t/a", b"x", 1, False, None, 1000.0], use_bin_type=True)])
    log.close()
    spool = open_spool(tmp_path / "spool")
    assert [(entry.key, entry.mid) for entry in spool.recovered()] == [((7, 1), 0)]
    assert spool.undecodable == 0


def test_releases_of_one_pass_are_one_record_per_epoch(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool")
    taken = [publication(n) for n in range(1, 11)] + [publication(n, epoch=8) for n in range(1, 4)]
    spool.add(taken)
    assert spool.release([(7, n) for n in range(1, 9)] + [(8, 1), (8, 2), (9, 1)]) == 10
    spool.log.close()
    records = RecordLog(tmp_path / "spool").loaded()
    assert [msgpack.unpackb(r)[0] for r in records if msgpack.unpackb(r)[0] in "dD"] == ["D", "D"]
    again = open_spool(tmp_path / "spool")
    assert [entry.key for entry in again.recovered()] == [(7, 9), (7, 10), (8, 3)]


def test_plain_publications_taken_together_are_one_record_and_read_back_whole(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool")
    run = [SpooledPublication(7, seq, f"r/{seq % 3}", b"p%d" % seq, 1, False, None, 1000.0, 100 + seq)
           for seq in range(1, 41)]
    retained = SpooledPublication(7, 41, "r/x", b"kept", 1, True, None, 1000.0, 141)
    spool.add([*run[:20], retained, *run[20:]])
    spool.log.close()
    records = RecordLog(tmp_path / "spool").loaded()
    assert [msgpack.unpackb(r)[0] for r in records] == ["P", "p", "P"]
    again = open_spool(tmp_path / "spool")
    assert again.recovered() == [*run[:20], retained, *run[20:]]
    assert again.redelivery(125, "r/1", b"p25") == run[24]  # the packet ids came back too
