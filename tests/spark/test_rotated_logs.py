"""The Spark job on what the shipped logrotate file leaves (issue 40, item 3), and on input it cannot read.

A simulator run's event log is written in four parts, with the shipped logrotate file (paths moved into the
test's directory) forced between them: `events.jsonl`, the uncompressed `events.jsonl.1` and
`events.jsonl.2.gz`, `events.jsonl.3.gz` (delaycompress). The job given the directory must report what the
simulator reported. A damaged or cut compressed generation, another compression, binary data: exit status 2,
every such file named, and no report.
"""

from __future__ import annotations

import bz2
import gzip
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from federation.spark import inputs

REPO = Path(__file__).resolve().parents[2]
LOGROTATE_FILE = REPO / "packaging" / "logrotate" / "mqtt-federation"
LOGROTATE = shutil.which("logrotate") or ("/usr/sbin/logrotate" if os.path.exists("/usr/sbin/logrotate") else None)
LOG_DIR = "/var/log/mqtt-federation/"
SERVICE_USER = "mqtt-federation"


# ---------------------------------------------------------------- without Spark


def test_rotated_generations_are_event_files_in_the_order_written() -> None:
    names = ["/r/n1/events.jsonl", "/r/n1/events.jsonl.1", "/r/n1/events.jsonl.2.gz", "/r/n1/events.jsonl.10.gz",
             "/r/n0/events.jsonl.1", "/r/n0/events.jsonl"]
    assert inputs.order(names) == ["/r/n0/events.jsonl.1", "/r/n0/events.jsonl", "/r/n1/events.jsonl.10.gz",
                                   "/r/n1/events.jsonl.2.gz", "/r/n1/events.jsonl.1", "/r/n1/events.jsonl"]
    assert inputs.order(["/d/events.jsonl", "/d/events.jsonl-20261207.gz", "/d/events.jsonl-20261206.gz"]) == [
        "/d/events.jsonl-20261206.gz", "/d/events.jsonl-20261207.gz", "/d/events.jsonl"]
    for name in ("events.jsonl", "events.jsonl.1", "events.jsonl.14.gz", "run.jsonl", "events.jsonl-20261207.gz"):
        assert inputs.is_event_file(name), name
    for name in ("events.jsonl.state", "notes.txt", "events.json", "wrapper.log.1"):
        assert not inputs.is_event_file(name), name


def test_compressed_files_are_read_whole_whatever_their_name(tmp_path: Path) -> None:
    text = b'{"v":1,"t":1.0,"node":"a:1","type":"node_started"}\n' * 1000
    (tmp_path / "events.jsonl.2.gz").write_bytes(gzip.compress(text))
    (tmp_path / "renamed.jsonl").write_bytes(bz2.compress(text))
    (tmp_path / "plain.jsonl").write_bytes(text)
    given = [str(tmp_path / name) for name in ("events.jsonl.2.gz", "renamed.jsonl", "plain.jsonl")]
    prepared = inputs.prepare(given, lambda path: True, str(tmp_path / "scratch"))
    try:
        assert prepared.paths[2] == given[2]
        for copy in prepared.paths[:2]:
            assert Path(copy).read_bytes() == text and Path(copy).is_relative_to(tmp_path / "scratch")
        assert Path(prepared.paths[0]).name.endswith("events.jsonl.2")
    finally:
        prepared.close()
    assert not any((tmp_path / "scratch").iterdir()), "the decompressed copies outlived the job"


def test_every_unreadable_file_is_named_and_nothing_is_kept(tmp_path: Path) -> None:
    text = b'{"v":1,"t":1.0,"node":"a:1","type":"node_started"}\n' * 5000
    good = tmp_path / "events.jsonl.2.gz"
    good.write_bytes(gzip.compress(text))
    cut = tmp_path / "events.jsonl.3.gz"
    cut.write_bytes(gzip.compress(text)[:200])
    damaged = tmp_path / "events.jsonl.4.gz"
    whole = bytearray(gzip.compress(text))
    whole[len(whole) // 2] ^= 0xFF
    damaged.write_bytes(bytes(whole))
    zstd = tmp_path / "events.jsonl.5.zst"
    zstd.write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * 20)
    binary = tmp_path / "core.jsonl"
    binary.write_bytes(b'{"v":1}\n\0\0\0')
    missing = tmp_path / "gone.jsonl"
    os.symlink(tmp_path / "nowhere", missing)
    given = [str(path) for path in (good, cut, damaged, zstd, binary, missing)]
    with pytest.raises(inputs.UnreadableInput) as raised:
        inputs.prepare(given, lambda path: True, str(tmp_path / "scratch"))
    message = str(raised.value)
    assert message.startswith("5 of 6 event files cannot be read"), message
    assert f"{cut}: the gzip stream is cut short" in message
    assert f"{damaged}: damaged gzip data" in message or f"{damaged}: the gzip stream" in message
    assert f"{zstd}: compressed with zstd" in message and "zstd -d" in message
    assert f"{binary}: binary data" in message
    assert f"{missing}: cannot read it" in message
    assert str(good) + ":" not in message
    assert not any((tmp_path / "scratch").iterdir())


# ---------------------------------------------------------------- the job on logrotate's files


def rotate(directory: Path, state: Path) -> None:
    """The shipped logrotate file, forced, on `directory` (as root: its service user does not exist here)."""
    assert LOGROTATE is not None
    config = LOGROTATE_FILE.read_text(encoding="utf-8")
    for shipped in (LOG_DIR, f"su {SERVICE_USER} {SERVICE_USER}", f"create 0640 {SERVICE_USER} {SERVICE_USER}"):
        assert shipped in config, f"{LOGROTATE_FILE} no longer holds {shipped!r}"
    config = (config.replace(LOG_DIR, f"{directory}/").replace(f"su {SERVICE_USER} {SERVICE_USER}", "su root root")
              .replace(f"create 0640 {SERVICE_USER} {SERVICE_USER}", "create 0640 root root"))
    (state.parent / "logrotate.conf").write_text(config, encoding="utf-8")
    result = subprocess.run([LOGROTATE, "--force", "--state", str(state), str(state.parent / "logrotate.conf")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def write_rotated(log: Path, directory: Path, parts: int) -> list[str]:
    """The lines of `log` written to directory/events.jsonl in `parts` parts, rotated between them."""
    lines = log.read_text(encoding="utf-8").splitlines(keepends=True)
    directory.mkdir()
    live = directory / "events.jsonl"
    size = -(-len(lines) // parts)
    for part in range(parts):
        with live.open("a", encoding="utf-8") as sink:
            sink.writelines(lines[part * size:(part + 1) * size])
        if part < parts - 1:
            rotate(directory, directory.parent / "logrotate.state")
    return sorted(path.name for path in directory.iterdir())


@pytest.mark.skipif(os.geteuid() != 0 or LOGROTATE is None,
                    reason="needs root and logrotate (apt-get install logrotate: scripts/install-deps.sh)")
def test_the_job_reads_what_logrotate_leaves_and_refuses_a_cut_generation(
        spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("pyspark", reason="the spark extra is not installed: pip install -e '.[spark]'")
    from federation.scenario.loader import load_scenario
    from federation.sim import run_scenario
    from federation.spark.convergence import main as job

    log = tmp_path / "whole.jsonl"
    truth = run_scenario(load_scenario(str(REPO / "configs" / "topologies" / "wildcards.yaml")), seed=1,
                         events_path=str(log))
    rotated = tmp_path / "mqtt-federation"
    assert write_rotated(log, rotated, 4) == ["events.jsonl", "events.jsonl.1", "events.jsonl.2.gz",
                                             "events.jsonl.3.gz"]
    out = tmp_path / "out"
    assert job(["--events", str(rotated), "--out", str(out), "--no-plots"], spark=spark) == 0
    mine = json.loads((out / "report.json").read_text())
    assert mine["input"]["corrupt"] == 0 and mine["input"]["lines"] == len(log.read_text().splitlines())
    assert mine["input"]["files"] == [str(rotated / name) for name in ("events.jsonl.3.gz", "events.jsonl.2.gz",
                                                                       "events.jsonl.1", "events.jsonl")]
    for key in ("sent", "expected_deliveries", "delivered", "lost", "duplicates", "unexpected"):
        assert mine["publications"][key] == truth["publications"][key], key
    assert [(phase["phase"], phase["seconds"] is None) for phase in mine["convergence"]] == \
        [(phase["phase"], phase["seconds"] is None) for phase in truth["convergence"]]
    for got, expected in zip(mine["convergence"], truth["convergence"], strict=True):
        if expected["seconds"] is not None:
            assert got["seconds"] == pytest.approx(expected["seconds"], abs=1e-5), got["phase"]
    capsys.readouterr()

    generation = rotated / "events.jsonl.2.gz"
    generation.write_bytes(generation.read_bytes()[:-40])  # cut, as a copy that stopped early
    refused = tmp_path / "refused"
    assert job(["--events", f"{rotated}/events.jsonl*", "--out", str(refused)], spark=spark) == 2
    message = capsys.readouterr().err
    assert f"{generation}: the gzip stream is cut short" in message and "1 of 4 event files" in message, message
    assert not refused.exists()
