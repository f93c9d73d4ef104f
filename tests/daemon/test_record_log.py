"""The append-only record file: what it keeps across a killed process, a torn tail and a compaction."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from federation.daemon.record_log import HEADER, RecordLog, RecordLogError, frame


def test_records_come_back_in_order(tmp_path: Path) -> None:
    path = tmp_path / "state" / "log"
    log = RecordLog(path)
    assert log.loaded() == []
    log.append([b"one", b"", b"three"])
    log.append([b"four"])
    log.close()
    again = RecordLog(path)
    assert again.loaded() == [b"one", b"", b"three", b"four"]
    assert again.loaded() == []  # handed over once
    assert again.torn_bytes == 0
    assert again.size_bytes == path.stat().st_size


def test_a_killed_writer_loses_nothing_it_appended(tmp_path: Path) -> None:
    path = tmp_path / "log"
    code = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from federation.daemon.record_log import RecordLog\n"
        "log = RecordLog(Path(sys.argv[1]))\n"
        "for n in range(100):\n"
        "    log.append([str(n).encode()])\n"
        "os.kill(os.getpid(), 9)\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(path)], timeout=60)
    assert result.returncode == -9
    assert RecordLog(path).loaded() == [str(n).encode() for n in range(100)]


def test_a_torn_tail_is_cut_off_and_appends_continue_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "log"
    log = RecordLog(path)
    log.append([b"kept", b"also kept"])
    log.close()
    whole = path.stat().st_size
    with open(path, "ab") as file:
        file.write(frame([b"half written"])[:-3])
    reopened = RecordLog(path)
    assert reopened.loaded() == [b"kept", b"also kept"]
    assert reopened.torn_bytes == HEADER.size + len(b"half written") - 3
    assert path.stat().st_size == whole
    reopened.append([b"after"])
    reopened.close()
    assert RecordLog(path).loaded() == [b"kept", b"also kept", b"after"]


def test_reading_stops_at_a_damaged_record(tmp_path: Path) -> None:
    path = tmp_path / "log"
    log = RecordLog(path)
    log.append([b"good", b"damaged", b"after the damage"])
    log.close()
    data = bytearray(path.read_bytes())
    data[2 * HEADER.size + len(b"good")] ^= 0xFF  # a byte of the second payload
    path.write_bytes(bytes(data))
    reopened = RecordLog(path)
    assert reopened.loaded() == [b"good"]
    assert reopened.torn_bytes == len(data) - HEADER.size - len(b"good")


def test_rewrite_replaces_the_log(tmp_path: Path) -> None:
    path = tmp_path / "log"
    log = RecordLog(path)
    log.append([b"dead"] * 50 + [b"live"])
    log.rewrite([b"live"])
    assert log.size_bytes == HEADER.size + 4
    log.append([b"next"])
    log.close()
    assert RecordLog(path).loaded() == [b"live", b"next"]
    assert [p.name for p in tmp_path.iterdir()] == ["log"]  # no temporary file left


def test_fsync_mode_still_appends(tmp_path: Path) -> None:
    log = RecordLog(tmp_path / "log", fsync=True)
    log.append([b"synced"])
    log.close()
    assert RecordLog(tmp_path / "log").loaded() == [b"synced"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"")
    path.chmod(0)
    with pytest.raises(RecordLogError, match=str(path)):
        RecordLog(path)


def test_unwritable_directory_names_the_file(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the state directory should be")
    with pytest.raises(RecordLogError, match="not-a-directory"):
        RecordLog(blocker / "log")
