"""Rewrite a version 1 event log as version 2 (run events), for tests and benchmarks of the Spark job.

    python -m federation.spark.convert IN.jsonl OUT.jsonl

Theory of operation
-------------------
Schema version 2 (docs/events.md) replaces the four per-publication types by one *run
event* per run of publications handled together at one node and one stage:

| v1 (one line per publication) | v2 (one line per run) |
|---|---|
| `publication_originated` | `publications_originated` |
| `publication_forwarded` | `publications_forwarded` |
| `publication_delivered` | `publications_delivered` |
| `duplicate_dropped` | `duplicates_dropped` |

A v1 log does not say which publications were handled together, so this
converter takes the nearest thing it shows: per-publication events of one
node, type, instant (`t`), origin, epoch and stage fields (`filter`, `to`,
`mode`, `hops`, `source`; `qos` and `retain` when originated) that lie in one
*block* of consecutive lines of that instant become one run. A block ends
where `t` changes or at any other line except the simulator's
`sim_publish`/`sim_inject` (which it writes between the events of one
instant), so a run never moves across a disruption record: the job orders
the events of one instant by their place in the file. A run's sequence
numbers must ascend without repeating (the spec's `seqs`), so a
publication whose number is not above the run's last starts a new run.

Every other line is kept as it is, with `"v":2`. The v2 log holds the same
publications as the v1 log, so the Spark job must give the same report for
both (tests/spark/test_spark_v2.py); how many lines it saves depends on
how much the writer batched (the simulator's benchmark log: almost nothing,
every publication has its own instant).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from typing import Any

RUN_TYPES = {
    "publication_originated": "publications_originated",
    "publication_forwarded": "publications_forwarded",
    "publication_delivered": "publications_delivered",
    "duplicate_dropped": "duplicates_dropped",
}
"""v1 per-publication type -> v2 run type"""

STAGE_FIELDS = {
    "publication_originated": ("qos", "retain"),
    "publication_forwarded": ("filter", "to", "mode"),
    "publication_delivered": ("filter", "hops"),
    "duplicate_dropped": ("filter", "source"),
}
"""the fields one run shares, besides node, instant, origin and epoch (v1 names and order)"""

PASS_THROUGH = ("sim_publish", "sim_inject")
"""lines the simulator writes between the per-publication events of one instant: they do not end a block"""


def _compact(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


def _freeze(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


class _Run:
    """One v2 run event being gathered."""

    def __init__(self, record: dict[str, Any], origin: str, epoch: int) -> None:
        self.first = record
        self.origin = origin
        self.epoch = epoch
        self.seqs: list[list[int]] = []
        self.topics: list[str] = []
        self.bytes = 0
        self.filters: set[str] = set()

    def accepts(self, seq: int) -> bool:
        return not self.seqs or seq > self.seqs[-1][1]

    def add(self, record: dict[str, Any], seq: int) -> None:
        if self.seqs and seq == self.seqs[-1][1] + 1:
            self.seqs[-1][1] = seq
        else:
            self.seqs.append([seq, seq])
        if "topic" in record:
            self.topics.append(record["topic"])
        self.bytes += int(record.get("size") or 0)
        self.filters.update(record.get("filters") or ())

    def render(self) -> str:
        kind = self.first["type"]
        out: dict[str, Any] = {"v": 2, "t": self.first["t"], "node": self.first["node"], "type": RUN_TYPES[kind],
                               "origin": self.origin, "epoch": self.epoch, "seqs": self.seqs}
        topics = self.topics if len(set(self.topics)) != 1 else self.topics[:1]
        if kind == "publication_originated":
            out.update(topics=topics, qos=self.first.get("qos"), retain=self.first.get("retain"), bytes=self.bytes,
                       filters=sorted(self.filters))
        elif kind == "publication_delivered":
            out.update(topics=topics)
        for name in STAGE_FIELDS[kind]:
            if name not in out and name in self.first:
                out[name] = self.first[name]
        if "name" in self.first:
            out["name"] = self.first["name"]
        return _compact(out)


def _split_pub(pub: Any) -> tuple[str, int, int] | None:
    """"host:port/epoch/seq" -> (origin, epoch, seq); None when it is not that shape."""
    if not isinstance(pub, str):
        return None
    parts = pub.rsplit("/", 2)
    if len(parts) != 3:
        return None
    try:
        return parts[0], int(parts[1]), int(parts[2])
    except ValueError:
        return None


def _as_v2(line: str) -> str:
    """A line kept as it is, with `"v":2` (a line that is not a v1 JSON object is left alone)."""
    if line.startswith('{"v":1,'):
        return '{"v":2,' + line[len('{"v":1,'):]
    return line


def to_v2(lines: Iterable[str]) -> Iterator[str]:
    """The v2 lines (without newlines) for the v1 `lines` (see the module docstring)."""
    block: list[Any] = []  # rendered lines (str) and runs (_Run), in file order
    runs: dict[tuple[Any, ...], _Run] = {}
    block_t: Any = None

    def flush() -> Iterator[str]:
        for item in block:
            yield item if isinstance(item, str) else item.render()
        block.clear()
        runs.clear()

    for raw in lines:
        line = raw.rstrip("\n")
        kind = None
        record: dict[str, Any] | None = None
        if '"type":"publication_' in line or '"type":"duplicate_dropped"' in line or '"type":"sim_' in line:
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            kind = record.get("type") if isinstance(record, dict) else None
        if record is not None and kind in RUN_TYPES and record.get("v") == 1:
            split = _split_pub(record.get("pub"))
            if split is not None:
                origin, epoch, seq = split
                if record["t"] != block_t:
                    yield from flush()
                    block_t = record["t"]
                key = (record["node"], kind, origin, epoch, record.get("name"),
                       *(_freeze(record.get(name)) for name in STAGE_FIELDS[kind]))
                run = runs.get(key)
                if run is None or not run.accepts(seq):
                    run = runs[key] = _Run(record, origin, epoch)
                    block.append(run)
                run.add(record, seq)
                continue
        if record is not None and kind in PASS_THROUGH and record.get("t") == block_t:
            block.append(_as_v2(line))
            continue
        yield from flush()
        block_t = None
        yield _as_v2(line)
    yield from flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m federation.spark.convert",
                                     description="Rewrite a version 1 event log as version 2 (run events).")
    parser.add_argument("source", help="v1 JSON-lines event log")
    parser.add_argument("target", help="v2 event log to write")
    args = parser.parse_args(argv)
    lines_in = lines_out = 0
    with open(args.source, encoding="utf-8") as source, open(args.target, "w", encoding="utf-8") as target:
        def counted(stream: Iterable[str]) -> Iterator[str]:
            nonlocal lines_in
            for line in stream:
                lines_in += 1
                yield line
        for line in to_v2(counted(source)):
            target.write(line + "\n")
            lines_out += 1
    print(f"{lines_in:,} v1 lines -> {lines_out:,} v2 lines ({args.target})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
