"""The injection journal (federation/daemon/injections.py): what a restarted wrapper finds of its unfinished
injections and of those the broker completed, bounded and compacted."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from federation.daemon import injections as injections_module
from federation.daemon.injections import InjectionJournal
from federation.daemon.record_log import RecordLog
from federation.protocol.types import Address, Injection

ORIGIN = Address("10.0.0.9", 10500)


def injection(seq: int, qos: int = 2, properties: dict[str, object] | None = None) -> Injection:
    return Injection(f"t/{seq}", b"p%d" % seq, qos, seq % 3 == 0, properties, (ORIGIN, 7, seq))


def reopen(path: Path, window: int = 100) -> InjectionJournal:
    return InjectionJournal(RecordLog(path), window)


def test_a_restarted_wrapper_finds_what_was_in_flight_and_how_far(tmp_path: Path) -> None:
    path = tmp_path / "injections.log"
    journal = reopen(path)
    properties = {"user_property": [["k", "v"]], "content_type": "text/plain"}
    journal.started([(1, injection(1)), (2, injection(2, properties=properties)), (3, injection(3, qos=1))])
    journal.released(2)  # PUBREC for 2: only the PUBREL remains
    journal.released(3)  # not QoS 2 in the broker's eyes, but the journal records what it is told
    journal.finished([3])
    journal.close()
    again = reopen(path)
    assert [(entry.mid, entry.injection, entry.released) for entry in again.in_flight()] == [
        (1, injection(1), False), (2, injection(2, properties=properties), True)]
    assert again.recovered == 2
    assert again.is_completed(injection(3).publication) and not again.is_completed(injection(1).publication)


def test_abandoned_ones_are_neither_in_flight_nor_completed(tmp_path: Path) -> None:
    path = tmp_path / "injections.log"
    journal = reopen(path)
    journal.started([(5, injection(5)), (6, injection(6))])
    journal.abandoned([5, 99])  # 99 was never started: nothing to record
    journal.close()
    again = reopen(path)
    assert [entry.mid for entry in again.in_flight()] == [6]
    assert not again.is_completed(injection(5).publication)


def test_a_reused_packet_id_refers_to_its_latest_injection(tmp_path: Path) -> None:
    path = tmp_path / "injections.log"
    journal = reopen(path)
    journal.started([(1, injection(1))])
    journal.finished([1])
    journal.started([(1, injection(2))])  # 16-bit packet ids come round again
    journal.close()
    again = reopen(path)
    assert [(entry.mid, entry.injection) for entry in again.in_flight()] == [(1, injection(2))]
    assert again.is_completed(injection(1).publication) and not again.is_completed(injection(2).publication)


def test_completed_ids_are_kept_for_a_bounded_window(tmp_path: Path) -> None:
    path = tmp_path / "injections.log"
    journal = reopen(path, window=3)
    for seq in range(1, 6):
        journal.started([(seq, injection(seq))])
        journal.finished([seq])
    assert [journal.is_completed(injection(seq).publication) for seq in range(1, 6)] == [False, False, True, True,
                                                                                         True]
    journal.close()
    again = reopen(path, window=3)
    assert [again.is_completed(injection(seq).publication) for seq in range(1, 6)] == [False, False, True, True,
                                                                                       True]


def test_a_torn_tail_and_an_unreadable_record_lose_only_themselves(tmp_path: Path) -> None:
    path = tmp_path / "injections.log"
    journal = reopen(path)
    journal.started([(1, injection(1))])
    journal.log.append([b"\x93\xa1z\x01\x02"])  # a record of a kind this version does not know
    journal.started([(2, injection(2))])
    journal.close()
    with open(path, "ab") as file:
        file.write(b"\x00\x00\x00\x40abc")  # a record cut short by a crash
    again = reopen(path)
    assert [entry.mid for entry in again.in_flight()] == [1, 2]
    assert again.undecodable == 1 and again.log.torn_bytes == 7


def test_compaction_keeps_exactly_the_live_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(injections_module, "COMPACT_MIN_BYTES", 2000)
    path = tmp_path / "injections.log"
    journal = reopen(path, window=10)
    for seq in range(1, 200):
        journal.started([(seq % 60 + 1, injection(seq))])
        if seq % 7:
            journal.released(seq % 60 + 1)
            journal.finished([seq % 60 + 1])
    assert journal.compactions > 0
    assert journal.log.size_bytes < 4 * max(journal.live_bytes(), 2000)
    expected_in_flight = [(entry.mid, entry.injection, entry.released) for entry in journal.in_flight()]
    expected_done = [seq for seq in range(1, 200) if journal.is_completed(injection(seq).publication)]
    journal.close()
    again = reopen(path, window=10)
    assert [(entry.mid, entry.injection, entry.released) for entry in again.in_flight()] == expected_in_flight
    assert [seq for seq in range(1, 200) if again.is_completed(injection(seq).publication)] == expected_done
    assert len(expected_done) == 10 and again.undecodable == 0


def test_a_full_disk_does_not_stop_the_injections(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    journal = reopen(tmp_path / "injections.log")

    def full(payloads: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal.log, "append", full)
    journal.started([(1, injection(1))])
    journal.finished([1])
    assert journal.write_errors == 2 and journal.is_completed(injection(1).publication)
    assert len([r for r in caplog.records if "cannot write the injection journal" in r.getMessage()]) == 1


class FullDisk:
    """A RecordLog's append that refuses everything while `full` (ENOSPC), as a full state directory does."""

    def __init__(self, journal: InjectionJournal) -> None:
        self.full = True
        self._append = journal.log.append

    def __call__(self, payloads: list[bytes]) -> None:
        if self.full:
            raise OSError(28, "No space left on device")
        self._append(payloads)


def test_what_a_full_disk_refused_is_written_first_once_it_has_room(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A completion the disk refused is written later, before anything after it: a restart does not send again a
    QoS 2 injection the broker completed (issue 37: a restart after the subscriber side's full disk doubled
    1-7)."""
    path = tmp_path / "injections.log"
    journal = reopen(path)
    journal.started([(1, injection(1)), (2, injection(2))])
    disk = FullDisk(journal)
    monkeypatch.setattr(journal.log, "append", disk)
    journal.released(1)
    journal.finished([1])  # refused: the broker completed 1, the file does not say so
    journal.started([(3, injection(3))])  # refused too: it must come after the completion
    assert journal.unwritten == 3 and not journal.write_unwritten()
    disk.full = False
    assert journal.write_unwritten() and journal.unwritten == 0
    journal.close()
    again = reopen(path)
    assert [entry.mid for entry in again.in_flight()] == [2, 3]
    assert again.is_completed(injection(1).publication) and again.recovered == 2


def test_the_next_append_carries_the_refused_records_before_its_own(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "injections.log"
    journal = reopen(path)
    journal.started([(1, injection(1))])
    disk = FullDisk(journal)
    monkeypatch.setattr(journal.log, "append", disk)
    journal.finished([1])
    disk.full = False
    journal.started([(1, injection(4))])  # the packet id again: its completion must be read before it
    assert journal.unwritten == 0
    journal.close()
    again = reopen(path)
    assert [(entry.mid, entry.injection) for entry in again.in_flight()] == [(1, injection(4))]
    assert again.is_completed(injection(1).publication)


def test_too_many_refused_records_rewrite_the_file_from_the_tables(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(injections_module, "UNWRITTEN_MAX_BYTES", 200)
    path = tmp_path / "injections.log"
    journal = reopen(path)
    disk = FullDisk(journal)
    monkeypatch.setattr(journal.log, "append", disk)
    rewrite = journal.log.rewrite

    def refused_rewrite(payloads: list[bytes]) -> None:
        if disk.full:
            raise OSError(30, "Read-only file system")
        rewrite(payloads)

    monkeypatch.setattr(journal.log, "rewrite", refused_rewrite)
    told: list[Exception | None] = []
    journal.on_write = told.append
    for seq in range(1, 20):
        journal.started([(seq, injection(seq))])
    journal.finished(range(1, 10))
    assert journal.unwritten == -1 and not journal.write_unwritten()
    assert getattr(told[-1], "errno", None) == 30  # the runtime is told what refused the rewrite
    disk.full = False
    journal.finished([10])  # the next write is the rewrite: the file holds the tables again
    assert journal.unwritten == 0 and journal.compactions == 1
    journal.close()
    again = reopen(path)
    assert [entry.mid for entry in again.in_flight()] == list(range(11, 20))
    assert all(again.is_completed(injection(seq).publication) for seq in range(1, 11))


def test_closing_while_the_disk_is_still_full_says_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    journal = reopen(tmp_path / "injections.log")
    journal.started([(1, injection(1))])
    monkeypatch.setattr(journal.log, "append", FullDisk(journal))
    journal.finished([1])
    journal.close()
    assert journal.unwritten_at_close == 1 and journal.status()["unwritten_at_close"] == 1
    assert [r for r in caplog.records if r.levelname == "ERROR" and "lacks 1 records" in r.getMessage()]


def test_a_pass_of_completions_is_one_record_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "injections.log"
    journal = reopen(path)
    journal.started([(mid, injection(mid, qos=1)) for mid in range(1, 21)])
    journal.finished(range(1, 20))
    journal.finished([20, 99])  # one known, one not: a plain `c` record
    journal.close()
    records = RecordLog(path).loaded()
    assert len(records) == 1 + 2  # one `I` for the run started together, one `C` for 19 completions, one `c`
    again = reopen(path)
    assert not again.in_flight() and all(again.is_completed(injection(mid).publication) for mid in range(1, 21))


def test_a_run_of_several_streams_is_a_record_per_stretch_of_one_and_reads_back_in_order(tmp_path: Path) -> None:
    path = tmp_path / "injections.log"
    journal = reopen(path)
    other = Address("10.0.0.8", 10500)
    started = [(1, Injection("a/1", b"1", 1, False, None, (ORIGIN, 7, 1), "a/#")),
               (2, Injection("a/2", b"2", 2, True, {"content_type": "x"}, (ORIGIN, 7, 2), "a/#")),
               (3, Injection("b/1", b"3", 1, False, None, (other, 4, 1), "b/#")),
               (4, Injection("a/3", b"4", 1, False, None, (ORIGIN, 7, 3), "a/#")),
               (5, Injection("a/4", b"5", 1, False, None, (ORIGIN, 8, 1), "a/#"))]  # a new epoch: another stream
    journal.started(started)
    journal.released(2)
    journal.close()
    kinds = [msgpack.unpackb(record)[0] for record in RecordLog(path).loaded()]
    assert kinds == ["I", "i", "i", "i", "r"]  # a record per stretch of one stream; a stretch of one stays `i`
    again = reopen(path)
    assert [(entry.mid, entry.injection, entry.released) for entry in again.in_flight()] == [
        (mid, each, mid == 2) for mid, each in started]
    assert again.stream_positions() == {(ORIGIN, "a/#"): (8, 1), (other, "b/#"): (4, 1)}
    assert again.live_bytes() > 0


def test_a_compacted_journal_of_an_older_release_still_reads(tmp_path: Path) -> None:
    """Completed ids one per record (`k`), as compaction wrote them before runs, read as they were."""
    path = tmp_path / "injections.log"
    log = RecordLog(path)
    log.append([msgpack.packb(["k", ORIGIN.host, ORIGIN.port, 7, seq, "t/#"]) for seq in (3, 4, 9)])
    log.close()
    journal = reopen(path)
    assert [seq for seq in range(1, 12) if journal.is_completed(injection(seq).publication)] == [3, 4, 9]
    assert journal.stream_positions() == {(ORIGIN, "t/#"): (7, 9)}
