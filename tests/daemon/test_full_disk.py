"""A full disk is a state, not a crash (issue 37, federation.daemon.storage): what the spool cannot take stays at the
broker, unacknowledged and not originated, and goes on by itself once the disk takes writes again.

The disk is made full by a file object that refuses writes (ENOSPC) while told to; the spool, the record log and
a real node do the rest (the real-process cases are in tests/real/test_faults_real.py).
"""

from __future__ import annotations

import errno
import logging
import os
import random
from pathlib import Path

import pytest

from federation.daemon.broker_items import Publication, PublicationRun
from federation.daemon.local_publications import LocalPublications
from federation.daemon.record_log import RecordLog
from federation.daemon.retained import RetainedStore
from federation.daemon.spool import Spool, SpooledPublication
from federation.daemon.storage import StorageHealth
from federation.protocol.node import Node
from federation.protocol.types import Address


class Disk:
    """os.write for one file descriptor that fails with ENOSPC while `full`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        self.refused = 0
        real = os.write

        def write(fd: int, data: bytes) -> int:
            if self.full and fd == self.fd:
                self.refused += 1
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data)

        monkeypatch.setattr(os, "write", write)
        self.fd = -1


def started_node() -> Node:
    node = Node(Address("10.0.0.1", 10500), [], 5, random.Random(1))
    node.start(0.0)
    return node


def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[LocalPublications, Spool, Disk, Node]:
    node = started_node()
    log = RecordLog(tmp_path / "spool.log")
    spool = Spool(log)
    disk = Disk(monkeypatch)
    disk.fd = log._fd  # noqa: SLF001 - the test's full disk is that one file
    local = LocalPublications(node, spool, RetainedStore(), lambda event: None, storage=StorageHealth(str(tmp_path)))
    return local, spool, disk, node


def test_what_the_spool_cannot_take_is_neither_acknowledged_nor_originated_and_goes_on_when_the_disk_has_room(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    local, spool, disk, node = setup(tmp_path, monkeypatch)
    local.add_run(PublicationRun(["a/1", "a/2"], [b"1", b"2"], 1, [11, 12]), 1.0)
    local.flush(1.0)
    acks, _ = local.take()
    assert sorted(acks) == [(11, 1), (12, 1)] and node.counters["publications_originated"] == 2
    disk.full = True
    with caplog.at_level(logging.INFO, logger="federation.daemon"):
        local.add_run(PublicationRun(["a/3", "a/4"], [b"3", b"4"], 1, [13, 14]), 2.0)
        local.flush(2.0)
        local.add(Publication("a/5", b"5", 2, False, None, 15, False), 2.0)  # behind it, whatever its QoS
        local.add_run(PublicationRun(["a/6"], [b"6"], 0, []), 2.0)
        local.flush(2.0)
        assert local.stalled and local.take()[0] == []  # nothing acknowledged: the broker keeps them
        assert node.counters["publications_originated"] == 2  # nor originated: no QoS 2 twice after a restart
        assert not local.retry(3.0) and disk.refused >= 2
        assert local.storage.problem is not None and "the disk is full" in local.storage.problem
        disk.full = False
        assert local.retry(4.0) and not local.stalled
        local.storage.recovered(4.0)
    errors = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert len(errors) == 1 and "cannot write the custody spool" in errors[0].getMessage()  # said once
    assert any("can be written again" in record.getMessage() for record in caplog.records)
    acks, _ = local.take()
    assert sorted(acks) == [(13, 1), (14, 1), (15, 2)]
    assert node.counters["publications_originated"] == 6
    # The spool holds them under the ids the node gave them, in their order.
    assert [(entry.seq, entry.topic) for entry in spool.recovered()] == [(1, "a/1"), (2, "a/2"), (3, "a/3"),
                                                                         (4, "a/4"), (5, "a/5")]


def test_a_retained_publication_the_disk_refuses_waits_in_its_place(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """One that goes to the node alone (retained, or with properties) and is the first the disk refuses waits like a
    run does: the plain ones read after it are not originated before it (issue 37: a held block numbered after a
    later publication)."""
    local, spool, disk, node = setup(tmp_path, monkeypatch)
    disk.full = True
    local.add(Publication("r/1", b"1", 1, True, None, 21, False), 1.0)
    assert local.stalled and node.counters["publications_originated"] == 0
    local.add_run(PublicationRun(["a/2", "a/3"], [b"2", b"3"], 1, [22, 23]), 1.0)
    local.flush(1.0)
    assert local.take()[0] == [] and node.counters["publications_originated"] == 0
    disk.full = False
    assert local.retry(2.0)
    assert sorted(local.take()[0]) == [(21, 1), (22, 1), (23, 1)]
    assert [(entry.seq, entry.topic) for entry in spool.recovered()] == [(1, "r/1"), (2, "a/2"), (3, "a/3")]


def test_a_record_log_the_disk_refused_has_no_torn_record_left(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    log = RecordLog(tmp_path / "log")
    log.append([b"first"])
    size = log.size_bytes
    real = os.write
    calls = [0]

    def half_then_full(fd: int, data: bytes) -> int:
        calls[0] += 1
        if calls[0] == 1:
            return real(fd, data[:3])  # the disk filled in the middle of the write
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError):
        log.append([b"second"])
    monkeypatch.setattr(os, "write", real)
    assert os.path.getsize(tmp_path / "log") == size  # cut back: no torn record in the middle
    log.append([b"third"])
    log.close()
    assert RecordLog(tmp_path / "log").loaded() == [b"first", b"third"]


def test_releases_the_disk_refused_are_written_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = RecordLog(tmp_path / "spool.log")
    spool = Spool(log)
    spool.add([SpooledPublication(7, seq, "t", b"p", 1, False, None, 1.0) for seq in (1, 2, 3)])
    disk = Disk(monkeypatch)
    disk.fd = log._fd  # noqa: SLF001
    disk.full = True
    assert spool.release([(7, 1)]) == 1  # forgotten here; its record waits
    assert spool.releases_unwritten == 1
    disk.full = False
    assert spool.write_releases() and spool.releases_unwritten == 0
    log.close()
    assert [entry.seq for entry in Spool(RecordLog(tmp_path / "spool.log")).recovered()] == [2, 3]


def test_the_probe_says_whether_the_directory_takes_writes(tmp_path: Path) -> None:
    health = StorageHealth(str(tmp_path))
    assert health.probe() and not (tmp_path / ".write-probe").exists()
    assert not StorageHealth(str(tmp_path / "missing")).probe()
