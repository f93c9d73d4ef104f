"""The job's own columnar copy (federation/spark/arrow_blocks.py) reads every line as Spark's parser does.

The blocks pyarrow takes and those it leaves to Spark must give the same rows, counts and corrupt-line texts
as Spark alone: the same log is read both ways, with blocks of a line or two so that every odd line below gets
a block of its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed: pip install -e '.[spark]'")
pytest.importorskip("pyarrow", reason="the spark extra is not installed: pip install -e '.[spark]'")

from federation.scenario.loader import load_scenario  # noqa: E402
from federation.sim import run_scenario  # noqa: E402
from federation.spark import arrow_blocks, reader  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NODE = '"node":"10.0.0.1:10500"'
RUN = f'{{"v":2,"t":7.25,{NODE},"type":"publications_delivered","origin":"10.0.0.2:10500","epoch":1,'
ORIGINATED = f'{{"v":2,"t":7.5,{NODE},"type":"publications_originated","origin":"10.0.0.1:10500","epoch":1,'

# (line, whether pyarrow takes its block): the block of a False line goes to Spark as text
ODD_LINES: list[tuple[bytes, bool]] = [
    (RUN.encode() + b'"seqs":[[1,3]],"topics":["a/x"],"filter":"a/#","hops":1}', True),  # plain
    (RUN.encode() + b'"seqs":[[1,3],[7,7]],"topics":["a/x"],"filter":"a/#"}', True),  # several ranges: Spark's
    (RUN.encode() + b'"seqs":[[4,2]],"topics":["a/x"]}', True),  # first > last: corrupt
    (RUN.encode() + b'"seqs":[[-3,2]],"topics":["a/x"]}', True),  # a negative number: Spark decides
    (RUN.encode() + b'"seqs":[[1,1000001]],"topics":["a/x"]}', True),  # too many publications: corrupt
    (RUN.encode() + b'"seqs":[[1,null]]}', True),
    (RUN.encode() + b'"seqs":[],"topics":["a/x"]}', True),
    (RUN.replace('"origin":"10.0.0.2:10500",', "").encode() + b'"seqs":[[1,2]]}', True),  # no origin
    (ORIGINATED.encode() + b'"seqs":[[1,2]],"topics":["a/x","a/y"],"qos":0}', True),  # a topic each
    (ORIGINATED.encode() + b'"seqs":[[1,3]],"topics":["a/x","a/y"]}', True),  # topics of another length
    (ORIGINATED.encode() + b'"seqs":[[1,3]]}', True),  # no topics
    (b'{"v":1,"t":8.0,' + NODE.encode() + b',"type":"publication_originated","pub":"10.0.0.1:10500/1/9",'
     b'"topic":"a/x","qos":1}', True),
    (b'{"v":1,"t":8.1,' + NODE.encode() + b',"type":"publication_forwarded","pub":"p","filter":"a/#",'
     b'"to":["10.0.0.3:10500"],"mode":"mesh"}', True),
    (b'{"v":1,"t":8.2,' + NODE.encode() + b',"type":"node_started","broker_id":"0@10.0.0.1:10500",'
     b'"epoch":3,"name":"n9","neighbours":[]}', True),  # a detail line: Spark parses it again
    (b'{"v":3,"t":8.3,' + NODE.encode() + b',"type":"future"}', True),
    (b'{"v":-0,"t":8.3,' + NODE.encode() + b',"type":"future"}', True),  # Spark reads "0"
    (b'{"v":2,' + NODE.encode() + b',"type":"publications_forwarded"}', True),  # no t: corrupt
    (b"{}", True),
    (b'{"v":2,"t":8.4,' + NODE.encode() + b',"type":"counters","x":' + b"1" * 1001 + b"}", True),  # Spark: corrupt
    (b'{"v":1,"t":8.5,"node":"sim","type":"sim_inject","pub":"p","topic":"a/x","subscribed":true}', True),  # tallied
    (b'{"v":1, "t":8.6,"node":"sim","type":"sim_inject","pub":"p"}', True),  # not the writers' form: parsed
    (b'{"v":1,"t":8.7,' + NODE.encode() + b',"type":"duplicate_dropped","pub":"p","zz":1,"zz":2}', True),
    (b'{"v":2,"t":8.8,' + NODE.encode() + b',"type":"duplicates_dropped","origin":"o","epoch":1,'
     b'"seqs":[[5,9]],"filter":"a/#","source":"s"}', True),
    (b'{"v":2,"t":8.9,"node":"caf\\u00e9:1","type":"mesh_left","filter":"a/#"}', True),
    (b'{"v":2,"t":NaN,' + NODE.encode() + b',"type":"mesh_left","filter":"a/#"}', True),
    (b'{"v":1,"t":9.0,"node":"sim","type":"sim_inject",}', False),  # tallied, damaged after its type
    (b'{"v":"2","t":9.1,' + NODE.encode() + b',"type":"mesh_left"}', False),  # v as text
    (b'{"v":2,"t":9.2,' + NODE.encode() + b',"type":"mesh_left","epoch":1.5}', False),
    (b'{"v":2,"t":-0,' + NODE.encode() + b',"type":"mesh_left"}', False),  # pyarrow -0.0, Spark 0.0
    (b'{"v":2,"t":9.3,' + NODE.encode() + b',"type":"mesh_left","x":-Inf}', False),  # Spark: corrupt
    (b'{"v":2,"t":9.4,' + NODE.encode() + b',"type":"mesh_left","x":Infinity}', False),
    (b'{"v":2,"t":9.5,' + NODE.encode() + b',"type":"publications_forwarded","x":' + b"1" * 1001 + b"}", False),
    (b'{"v":2,"t":9.6,' + NODE.encode() + b',"type":"publications_forwarded","x":' + b"[" * 1000 + b"]" * 1000
     + b"}", False),
    (b'{"v":2,"t":9.7,' + NODE.encode() + b',"type":"mesh_left","type":"mesh_joined"}', False),
    (b'{"v":2,"t":9.8,"node":"caf\xe9","type":"mesh_left"}', False),  # not UTF-8
    (b'{"v":2,"t":9.9,' + NODE.encode() + b',"type":"publication_retransmitted","to":"10.0.0.3:10500"}', False),
    (b'{"v":2,"t":9.95,' + NODE.encode() + b',"type":"publication_retransmitted","to":["10.0.0.3:10500"]}', True),
    (b'{"v":2,"t":10.0,' + NODE.encode() + b',"type":"mesh_left"} {"v":2}', False),  # two objects
    (b'{"v":2,"t":10.1,' + NODE.encode() + b',"type":"mesh_left"}\r', False),
    (b"null", False),
    (b"[1, 2]", False),
    (b"", False),
    (b"   ", False),
    (b' {"v":2,"t":10.2,' + NODE.encode() + b',"type":"mesh_left"}', False),
    (b"this is not json", False),
    (b'{"v":2,"t":10.3,' + NODE.encode() + b',"type":"mesh_left"', False),  # cut short
]


@pytest.fixture(scope="module")
def simulator_log(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    events = tmp_path_factory.mktemp("sim") / "events.jsonl"
    run_scenario(load_scenario(str(ROOT / "configs" / "topologies" / "wildcards.yaml")), seed=1,
                 events_path=str(events))
    return events.read_bytes().splitlines()


def _read(spark: Any, files: list[Path], arrow: bool, scratch: Path) -> dict[str, Any]:
    """What the job reads of `files`: the summary, and the bulk and detail rows in file order (`seq` is the
    order, not a value both paths share)."""
    log = reader.read_events(spark, [str(f) for f in files], str(scratch), arrow=arrow)
    try:
        def rows(frame: Any) -> list[str]:  # as JSON: NaN equals NaN there
            ordered = sorted(frame.collect(), key=lambda row: (row.file or "", row.seq))
            return [json.dumps({k: v for k, v in row.asDict(recursive=True).items() if k != "seq"}, sort_keys=True)
                    for row in ordered]
        return {"summary": log.summary.as_dict(), "bulk": rows(log.bulk), "details": rows(log.details)}
    finally:
        log.close()


def test_every_odd_line_reads_as_spark_reads_it(spark: Any, simulator_log: list[bytes], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    lines = list(simulator_log)
    step = len(lines) // (len(ODD_LINES) + 1)
    for number, (line, _) in enumerate(ODD_LINES, 1):
        lines.insert(number * step + number - 1, line)
    log = tmp_path / "odd.jsonl"
    log.write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines))  # a byte order mark, and no newline at the end
    monkeypatch.setattr(arrow_blocks, "BLOCK_BYTES", 300)  # a line or two per block
    mine = _read(spark, [log], True, tmp_path / "arrow")
    sparks = _read(spark, [log], False, tmp_path / "spark")
    assert mine["summary"] == sparks["summary"]
    assert mine["bulk"] == sparks["bulk"]
    assert mine["details"] == sparks["details"]
    assert sparks["summary"]["corrupt"] == 19 and sparks["summary"]["unknown_version"] == {"0": 1, "3": 1}
    assert not (tmp_path / "arrow").exists() and not (tmp_path / "spark").exists()


@pytest.mark.parametrize(("line", "taken"), ODD_LINES, ids=[f"line{n}" for n in range(len(ODD_LINES))])
def test_which_blocks_pyarrow_takes(spark: Any, tmp_path: Path, line: bytes, taken: bool) -> None:
    log = tmp_path / "one.jsonl"
    log.write_bytes(line + b"\n")
    copy = arrow_blocks.copy_blocks([str(log)], ["file:" + str(log)], str(tmp_path / "copy"),
                                    reader._block_rules(spark), 1)
    assert (copy.blocks, copy.text_blocks) == (1, 0 if taken else 1)


def test_a_clean_log_is_all_pyarrows_and_its_copy_goes_with_the_job(spark: Any, simulator_log: list[bytes],
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    halves = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    middle = len(simulator_log) // 2
    halves[0].write_bytes(b"\n".join(simulator_log[:middle]) + b"\n")
    halves[1].write_bytes(b"\n".join(simulator_log[middle:]) + b"\n")
    copies: list[arrow_blocks.BlockCopy] = []
    copy_blocks = arrow_blocks.copy_blocks

    def watched(*arguments: Any) -> arrow_blocks.BlockCopy:
        copies.append(copy_blocks(*arguments))
        assert os.listdir(copies[-1].directory)
        return copies[-1]

    monkeypatch.setattr(arrow_blocks, "copy_blocks", watched)
    scratch = tmp_path / "scratch"
    mine = _read(spark, halves, True, scratch)
    assert [(c.blocks, c.text_blocks, c.parsed is not None) for c in copies] == [(2, 0, True)]
    assert copies[0].directory.startswith(str(scratch))
    assert not scratch.exists()  # removed with the job's other scratch files
    sparks = _read(spark, halves, False, tmp_path / "spark")
    assert mine["summary"] == sparks["summary"] and mine["summary"]["corrupt"] == 0
    for kind in ("bulk", "details"):  # Spark numbers two files' lines in another order: compare the rows
        assert sorted(mine[kind]) == sorted(sparks[kind])


def test_lines_as_sparks_text_reader_cuts_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert arrow_blocks.text_lines(b"a\r\nb\rc\n\nd") == [b"a", b"b", b"c", b"", b"d"]
    assert arrow_blocks.text_lines(b"a\n") == [b"a"] and arrow_blocks.text_lines(b"a\r") == [b"a"]
    log = tmp_path / "log.jsonl"
    log.write_bytes(b"\xef\xbb\xbf" + b"x" * 10 + b"\n" + b"y" * 10 + b"\nzz")
    monkeypatch.setattr(arrow_blocks, "BLOCK_BYTES", 4)
    assert list(arrow_blocks.file_blocks(str(log))) == [b"x" * 10 + b"\n", b"y" * 10 + b"\n", b"zz"]


def test_a_log_of_lines_only_counted(spark: Any, tmp_path: Path) -> None:
    log = tmp_path / "counted.jsonl"
    log.write_text('{"v":1,"t":1.0,"node":"sim","type":"sim_inject","pub":"p"}\n'
                   '{"v":1, "t":2.0,"node":"sim","type":"sim_publish","pub":"p"}\n')
    mine = _read(spark, [log], True, tmp_path / "arrow")
    assert mine == _read(spark, [log], False, tmp_path / "spark")
    assert mine["summary"]["by_type"] == {"sim_inject": 1, "sim_publish": 1} and mine["bulk"] == []
