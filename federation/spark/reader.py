"""Read event logs with an explicit schema, and say plainly what was wrong with them.

Theory of operation
-------------------
The events are JSON lines (docs/protocol.md, "Events"; plus the simulator's
`sim_*` records, docs/simulator.md). Schema inference would read every file
twice and guess types from whatever lines it saw, so the schema is written
out here: only the fields the job uses, typed. `previous` and `counters`
change type with the event type (an id or a vid; a map or a whole
snapshot), so they are read as raw JSON text. A line that is not JSON, or
whose fields have the wrong type, lands in `_corrupt` (Spark's PERMISSIVE
mode) and is counted, never fatal, unless every line is corrupt. Lines
without `t`, `node` or `type` count as corrupt too. Lines of another schema
version (`v` other than 1) are counted and left out, with a message that
says which versions were seen.

Every row keeps its file and its position in the file (`seq`), so events
of one instant replay in the order they were written.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

SUPPORTED_VERSIONS = ("1",)
CORRUPT = "_corrupt"

_STR = T.StringType()
_DBL = T.DoubleType()
_LONG = T.LongType()
_BOOL = T.BooleanType()
_STRS = T.ArrayType(T.StringType())

EVENT_SCHEMA = T.StructType([
    T.StructField("v", _STR),  # raw: "1", or whatever a future writer puts there
    T.StructField("t", _DBL),
    T.StructField("node", _STR),
    T.StructField("type", _STR),
    T.StructField("name", _STR),
    # node_started, id_changed
    T.StructField("broker_id", _STR),
    T.StructField("neighbours", _STRS),
    T.StructField("vid", _LONG),
    # neighbour_up / neighbour_down
    T.StructField("neighbour", _STR),
    T.StructField("rtt", _DBL),
    T.StructField("clock_offset", _DBL),
    T.StructField("clock_error", _DBL),
    # table_changed
    T.StructField("added", _STRS),
    T.StructField("removed", _STRS),
    # core and mesh changes
    T.StructField("core", _STR),
    T.StructField("previous", _STR),  # raw: an id text, or a vid / epoch number
    T.StructField("filter", _STR),
    T.StructField("reason", _STR),
    T.StructField("parents", _STRS),
    # subscriptions
    T.StructField("client", _STR),
    T.StructField("federated", _STR),
    # publications
    T.StructField("pub", _STR),
    T.StructField("topic", _STR),
    T.StructField("to", _STRS),
    T.StructField("mode", _STR),
    # counters / node_stopped
    T.StructField("sent", T.MapType(_STR, T.ArrayType(_LONG))),
    T.StructField("clocks", T.MapType(_STR, T.StructType([
        T.StructField("rtt", _DBL), T.StructField("offset", _DBL), T.StructField("error", _DBL)]))),
    T.StructField("counters", _STR),  # raw: {name: n} in `counters`, the whole snapshot in `node_stopped`
    # simulator records
    T.StructField("nodes", T.MapType(_STR, _STR)),
    T.StructField("links", T.ArrayType(_STRS)),
    T.StructField("a", _STR),
    T.StructField("b", _STR),
    T.StructField("oneway", _BOOL),
    T.StructField("percent", _DBL),
    T.StructField("link", _STRS),
    T.StructField("t0_unix", _DBL),  # run_start (netns/lxd harness)
    T.StructField(CORRUPT, _STR),
])

SNAPSHOT_SCHEMA = T.StructType([T.StructField("sent", T.MapType(_STR, T.ArrayType(_LONG)))])
"""The part of `node_stopped.counters` the job reads."""


class InputError(ValueError):
    """The input cannot be analysed; the message says why and what to do."""


@dataclass
class InputSummary:
    files: list[str]
    lines: int = 0
    corrupt: int = 0
    unknown_version: dict[str, int] = field(default_factory=dict)
    valid: int = 0
    by_type: dict[str, int] = field(default_factory=dict)
    first: float | None = None
    last: float | None = None
    corrupt_examples: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    """addresses of the nodes that wrote valid events (the simulator's own records, node "sim", excluded)"""

    def warnings(self) -> list[str]:
        notes = []
        if self.corrupt:
            examples = "; ".join(repr(e[:80]) for e in self.corrupt_examples)
            notes.append(f"{self.corrupt} of {self.lines} lines are corrupt (not JSON, a field of the wrong type, "
                         f"or no t/node/type) and were skipped; e.g. {examples}")
        if self.unknown_version:
            seen = ", ".join(f"v={v!s}: {n}" for v, n in sorted(self.unknown_version.items()))
            notes.append(f"{sum(self.unknown_version.values())} events have a schema version this job does not "
                         f"read ({seen}); it reads v={', '.join(SUPPORTED_VERSIONS)}. They were skipped: "
                         "use the job from the same release as the nodes that wrote them")
        return notes

    def as_dict(self) -> dict[str, Any]:
        return {"files": self.files, "lines": self.lines, "valid": self.valid, "corrupt": self.corrupt,
                "unknown_version": dict(sorted(self.unknown_version.items())),
                "by_type": dict(sorted(self.by_type.items())), "first_t": self.first, "last_t": self.last,
                "warnings": self.warnings()}


def _has_scheme(pattern: str) -> bool:
    head = pattern.split("/", 1)[0]
    return head.endswith(":") and len(head) > 2  # hdfs:, s3a:, file: (not a Windows drive letter)


def resolve(patterns: list[str]) -> list[str]:
    """Local patterns expanded and checked (clear errors for missing or empty input); remote ones as given."""
    files: list[str] = []
    for pattern in patterns:
        if _has_scheme(pattern) and not pattern.startswith("file:"):
            files.append(pattern)
            continue
        local = pattern[len("file:"):] if pattern.startswith("file:") else pattern
        matched = sorted(glob.glob(local))
        if not matched:
            raise InputError(f"no event file matches {pattern!r} (quote the pattern so the shell does not "
                             "expand it, e.g. --events 'run/*.jsonl')")
        for path in matched:
            if os.path.isdir(path):
                inner = sorted(glob.glob(os.path.join(path, "*.jsonl")))
                if not inner:
                    raise InputError(f"{path} is a directory with no *.jsonl event files in it")
                files.extend(os.path.abspath(p) for p in inner)
            else:
                files.append(os.path.abspath(path))
    if all(os.path.exists(f) and os.path.getsize(f) == 0 for f in files if not _has_scheme(f)) and \
            not any(_has_scheme(f) for f in files):
        raise InputError(f"the event files are empty: {', '.join(files[:5])}{' ...' if len(files) > 5 else ''}")
    return files


def read_events(spark: SparkSession, files: list[str]) -> tuple[DataFrame, InputSummary]:
    """(valid events with `file` and `seq`, cached; the input summary). Raises InputError when nothing is usable."""
    raw = (spark.read.schema(EVENT_SCHEMA)
           .option("mode", "PERMISSIVE")
           .option("columnNameOfCorruptRecord", CORRUPT)
           .json(files))
    raw = raw.select("*", F.col("_metadata.file_path").alias("file"),
                     F.monotonically_increasing_id().alias("seq"))
    incomplete = F.col("t").isNull() | F.col("node").isNull() | F.col("type").isNull() | F.col("v").isNull()
    raw = raw.withColumn("status", F.when(F.col(CORRUPT).isNotNull() | incomplete, F.lit("corrupt"))
                         .when(~F.col("v").isin(*SUPPORTED_VERSIONS), F.concat(F.lit("v="), F.col("v")))
                         .otherwise(F.lit("ok")))
    raw = raw.cache()
    summary = InputSummary(files)
    nodes: set[str] = set()
    for row in raw.groupBy("status", "type", "node").agg(F.count(F.lit(1)).alias("n"), F.min("t").alias("first"),
                                                         F.max("t").alias("last")).collect():
        summary.lines += row.n
        if row.status == "corrupt":
            summary.corrupt += row.n
        elif row.status != "ok":
            version = row.status[2:]
            summary.unknown_version[version] = summary.unknown_version.get(version, 0) + row.n
        else:
            summary.valid += row.n
            if not row.type.startswith(("sim_", "run_")):
                nodes.add(row.node)
            summary.by_type[row.type] = summary.by_type.get(row.type, 0) + row.n
            if row.type.startswith("run_"):
                continue  # the harness's run clock (seconds from its start), not the nodes' clock
            summary.first = row.first if summary.first is None else min(summary.first, row.first)
            summary.last = row.last if summary.last is None else max(summary.last, row.last)
    summary.nodes = sorted(nodes)
    if summary.corrupt:
        summary.corrupt_examples = [row[0] or "" for row in
                                    raw.filter(F.col("status") == "corrupt")
                                    .select(F.coalesce(F.col(CORRUPT), F.to_json(F.struct("v", "t", "node", "type"))))
                                    .limit(3).collect()]
    if summary.lines == 0:
        raw.unpersist()
        raise InputError(f"no events in {', '.join(files[:5])}: the files hold no lines")
    if summary.valid == 0:
        raw.unpersist()
        problems = summary.warnings()
        raise InputError("no usable event in the input: " + " ".join(problems))
    valid = raw.filter(F.col("status") == "ok").drop(CORRUPT, "status")
    return valid, summary
