"""Read event logs with an explicit schema, once, and say plainly what was wrong with them.

Theory of operation
-------------------
The events are JSON lines (docs/events.md; plus the simulator's `sim_*`
and the harness's `run_*` records). Schema inference would read every file
twice and guess types from whatever lines it saw, so the schema is written
out here: only the fields the job uses, typed. `previous` and `counters`
change type with the event type (an id or a vid; a map or a whole
snapshot), so they are read as raw JSON text. A line that is not JSON, or
whose fields have the wrong type, lands in `_corrupt` (Spark's PERMISSIVE
mode) and is counted, never fatal, unless every line is corrupt. Lines
without `t`, `node` or `type` count as corrupt too, and so do version 2 run
events whose `seqs` or `topics` cannot be read (below). Lines of another
schema version (`v` other than 1 or 2) are counted and left out, with a
message that says which versions were seen.

Parsing JSON is most of what reading costs, so it happens once: the
parsed rows are written to a columnar copy (Parquet in a temporary
directory on a local master; the cache elsewhere, or Parquet in
`--scratch`), and every later step reads only the columns and rows it
needs from it. Keeping the rows in Spark's cache instead costs more to
build and, for a big log, does not fit a local driver's memory.

On a local master, local files with a local copy are parsed by pyarrow instead
(federation/spark/arrow_blocks.py: C++, several times faster than
`from_json`, which parses one line at a time outside Spark's generated
code), block by block: it stores the rows whose meaning is beyond doubt
itself, and hands Spark every other row (`_classified` below stays the one
definition of what a line means) and every block it cannot be sure to read
as Spark does (Spark parses those from their text, as it parses a log
elsewhere: damaged lines are counted, with their text, as always).

Version 2 (docs/events.md) replaces the
four per-publication types by one *run event* per run of publications
handled together (`RUN_TYPES`): `origin`, `epoch` and `seqs`, a list of
inclusive `[first, last]` ranges, name the publications
(`"<origin>/<epoch>/<seq>"`, the v1 `pub`); `topics` has one topic per
publication or a single one for all. Such a line is corrupt when `origin`,
`epoch` or `seqs` is missing, a range is not two numbers with first <=
last, it holds more than `MAX_RUN_PUBLICATIONS`, or (originated) `topics`
is missing or of another length. federation/spark/publications.py turns
both versions into per-publication rows. Every other type keeps its v1
fields in v2.

Every row keeps its file and its position in the file (`seq`), so events
of one instant replay in the order they were written.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Observation, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from federation.spark import arrow_blocks, inputs
from federation.spark.publications import ORIGINATED

SUPPORTED_VERSIONS = ("1", "2")
MAX_RUN_PUBLICATIONS = 1_000_000
"""a v2 run event naming more publications than this is counted as corrupt (no writer batches that many)"""
PER_PUBLICATION_TYPES = ("publication_originated", "publication_forwarded", "publication_delivered",
                         "duplicate_dropped")
RUN_TYPES = {
    "publications_originated": "publication_originated",
    "publications_forwarded": "publication_forwarded",
    "publications_delivered": "publication_delivered",
    "duplicates_dropped": "duplicate_dropped",
}
"""v2 run event -> the v1 per-publication type it replaces"""
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
    T.StructField("epoch", _LONG),  # the origin's epoch in a v2 run event; node_started's too
    T.StructField("topic", _STR),
    T.StructField("to", _STRS),
    T.StructField("mode", _STR),
    # v2 run events (RUN_TYPES): `epoch`, `filter`, `to` and `mode` are shared with v1
    T.StructField("origin", _STR),
    T.StructField("seqs", T.ArrayType(T.ArrayType(_LONG))),
    T.StructField("topics", _STRS),
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

READ_SCHEMA = EVENT_SCHEMA
"""What the reader parses: every field of schema versions 1 and 2 the job reads (checked against
docs/events.md by tests/docs/test_event_schema.py)."""

BULK_TYPES = (*PER_PUBLICATION_TYPES, *RUN_TYPES, "sim_publish", "sim_inject")
"""Nearly all of a log's lines, and the job reads few of their fields: these are parsed with BULK_SCHEMA
only; every other line is parsed again in full from its text (READ_SCHEMA)."""

COUNTED_TYPES = ("sim_publish", "sim_inject", "duplicate_dropped", "duplicates_dropped")
"""Bulk lines the job only counts (per type; their nodes are not listed): counted while the rest is stored"""

TALLIED_LINE = (r'^\{"v":[12],"t":-?[0-9][-+.eE0-9]*,"node":"[^"\\]*",'
                r'"type":"(sim_publish|sim_inject|duplicate_dropped)"[,}]')
"""A line of a type the job only counts, as the writers write it (header first, no spaces), ending in "}":
counted by its type without being parsed, which is most of what reading a simulator's log costs. Any
other form of such a line is parsed."""

BULK_SCHEMA = T.StructType([f for f in READ_SCHEMA.fields if f.name in (
    "v", "t", "node", "type", "pub", "topic", "filter", "mode", "to", "origin", "epoch", "seqs", "topics", CORRUPT)])
BULK_COLUMNS = ("t", "node", "type", "pub", "topic", "filter", "mode", "to", "origin", "epoch", "seqs", "first_seq",
                "last_seq", "topics", "publications", "file", "seq")
"""what later steps read of a bulk line (`file` only on originated lines: the order of one instant). A v2 run
of one range of sequence numbers (nearly every run) keeps it as `first_seq` and `last_seq`, one of one
topic as `topic`: nested columns cost more to write and to read than flat ones, so `seqs` and `topics` are
only kept for the other runs; `publications` is the number of publications of a run."""

STORED_FIELDS = {
    "pub": ("publication_originated", "publication_delivered"),
    "topic": ("publication_originated",),
    "filter": ("publication_forwarded", "publications_forwarded"),
    "mode": ("publication_forwarded", "publications_forwarded"),
    "to": ("publication_forwarded", "publications_forwarded"),
    "origin": ("publications_originated", "publications_delivered"),
    "epoch": ("publications_originated", "publications_delivered"),
    "seqs": ("publications_originated", "publications_delivered"),  # with first_seq and last_seq
    "topics": ("publications_originated",),
}
"""the bulk types whose field is stored (the others' values are not read again: storing nothing is cheaper)"""

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
    per_publication: dict[str, int] = field(default_factory=dict)
    """v1 per-publication type -> publications it covers, v1 lines and v2 runs together"""

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
                "by_type": dict(sorted(self.by_type.items())),
                "per_publication": dict(sorted(self.per_publication.items())),
                "first_t": self.first, "last_t": self.last,
                "warnings": self.warnings()}


def _has_scheme(pattern: str) -> bool:
    head = pattern.split("/", 1)[0]
    return head.endswith(":") and len(head) > 2  # hdfs:, s3a:, file: (not a Windows drive letter)


def is_local(path: str) -> bool:
    """A path the driver reads itself (no URL scheme, or file:)."""
    return not _has_scheme(path) or path.startswith("file:")


def resolve(patterns: list[str]) -> list[str]:
    """Local patterns expanded and checked (clear errors for missing or empty input); remote ones as given.

    A directory stands for its event logs with their rotated generations (`events.jsonl`, `events.jsonl.1`,
    `events.jsonl.2.gz`: federation/spark/inputs.py), each log's oldest first."""
    files: list[str] = []
    for pattern in patterns:
        if not is_local(pattern):
            files.append(pattern)
            continue
        local = pattern[len("file:"):] if pattern.startswith("file:") else pattern
        matched = inputs.order(glob.glob(local))
        if not matched:
            raise InputError(f"no event file matches {pattern!r} (quote the pattern so the shell does not "
                             "expand it, e.g. --events 'run/*.jsonl')")
        for path in matched:
            if os.path.isdir(path):
                inner = inputs.order(name for name in glob.glob(os.path.join(path, "*"))
                                     if inputs.is_event_file(name) and not os.path.isdir(name))
                if not inner:
                    raise InputError(f"{path} is a directory with no event files in it (*.jsonl, with their "
                                     f"rotated *.jsonl.N and *.jsonl.N.gz)")
                files.extend(os.path.abspath(p) for p in inner)
            else:
                files.append(os.path.abspath(path))
    if all(os.path.exists(f) and os.path.getsize(f) == 0 for f in files if not _has_scheme(f)) and \
            not any(_has_scheme(f) for f in files):
        raise InputError(f"the event files are empty: {', '.join(files[:5])}{' ...' if len(files) > 5 else ''}")
    return files


def _single_range() -> Any:
    """True for a run of one range: Spark evaluates lambda functions row by row without generated code, so
    the expressions below spell out a single range's case (nearly every run) and use them for the others."""
    return F.size("seqs") == 1


def _run_size() -> Any:
    """Publications in a v2 run event: the sum of `last - first + 1` over `seqs` (of a valid run)."""
    single = F.col("seqs")[0]
    return (F.when(_single_range(), F.lit(0).cast("long") + single[1] - single[0] + 1)
            .otherwise(F.aggregate("seqs", F.lit(0).cast("long"), lambda total, pair: total + pair[1] - pair[0] + 1)))


def _bad_range(pair: Any) -> Any:
    return (F.size(pair) != 2) | pair[0].isNull() | pair[1].isNull() | (pair[0] > pair[1])


def _run_problem() -> Any:
    """True for a v2 run event the job cannot read (only evaluated on those rows)."""
    bad_pair = F.when(_single_range(), _bad_range(F.col("seqs")[0])).otherwise(F.exists("seqs", _bad_range))
    size = _run_size()
    topics_bad = (F.col("type") == "publications_originated") & (
        F.col("topics").isNull() | ((F.size("topics") != 1) & (F.size("topics") != size)))
    return (F.col("origin").isNull() | F.col("epoch").isNull() | F.col("seqs").isNull() | (F.size("seqs") == 0)
            | F.coalesce(bad_pair, F.lit(True)) | (size > MAX_RUN_PUBLICATIONS) | topics_bad)


def _incomplete() -> Any:
    return (F.col(CORRUPT).isNotNull() | F.col("t").isNull() | F.col("node").isNull() | F.col("type").isNull()
            | F.col("v").isNull())


def _first_status() -> Any:
    """blank (not a line: Spark's JSON reader skips those too), corrupt, v=N (another version), detail (parsed
    again in full later), or ok (a bulk line: BULK_SCHEMA is all the job reads of it)."""
    nothing = (F.col(CORRUPT).isNull() & F.col("t").isNull() & F.col("node").isNull() & F.col("type").isNull()
               & F.col("v").isNull())
    return (F.when(nothing & (F.trim(F.col("value"), F.lit(" \t\r")) == ""), F.lit("blank"))
            .when(_incomplete(), F.lit("corrupt"))
            .when(~F.col("v").isin(*SUPPORTED_VERSIONS), F.concat(F.lit("v="), F.col("v")))
            .when(~F.col("type").isin(*BULK_TYPES), F.lit("detail"))
            .when(F.col("type").isin(*RUN_TYPES) & _run_problem(), F.lit("corrupt"))
            .otherwise(F.lit("ok")))


class EventLog:
    """The parsed events, stored once: every later step reads only the columns and rows it needs.

    `bulk`: the valid per-publication lines (v1 and v2) with BULK_COLUMNS, read from the stored copy;
    `details`: every other valid line with all of READ_SCHEMA's fields (cached: a few percent of a log);
    both with `file` and `seq`. `summary`: what was read. `close()` removes the stored copy.
    """

    def __init__(self, bulk: DataFrame, details: DataFrame, summary: InputSummary, scratch: str | None,
                 cached: list[DataFrame]) -> None:
        self.bulk = bulk
        self.details = details
        self.summary = summary
        self._scratch = scratch
        self._cached = cached

    def close(self) -> None:
        for frame in self._cached:
            frame.unpersist()
        self._cached = []
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


def _store(spark: SparkSession, rows: DataFrame, scratch: str | None) -> tuple[DataFrame, list[DataFrame]]:
    """Write the classified rows once: Parquet in `scratch`, else the cache (a cluster without a shared
    scratch directory)."""
    if scratch is None:
        stored = rows.persist(StorageLevel.MEMORY_AND_DISK)
        stored.count()  # parse now (and count what is not stored)
        return stored, [stored]
    path = os.path.join(scratch, "events.parquet") if "://" not in scratch else scratch.rstrip("/") + "/events.parquet"
    rows.write.mode("overwrite").parquet(path)
    return spark.read.parquet(path), []


_JSON_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
INTEGER_TEXT = ("v",)
"""fields read as text that the writers write as integers (pyarrow reads them as integers)"""
_LINE_COLUMNS = T.StructType([T.StructField("value", _STR), T.StructField("path", _STR),
                              T.StructField("seq", _LONG), T.StructField("tallied", _STR)])
"""what _parsed_text gives besides BULK_SCHEMA's fields"""


def _parsed_text(text: DataFrame) -> DataFrame:
    """Lines (`value`, `path`, `seq`) parsed by Spark: BULK_SCHEMA's fields (a tallied line is not parsed: its
    fields are null), `value`, `path`, `seq` and `tallied` (TALLIED_LINE's type, else "")."""
    value = F.col("value")
    tallied = F.when(value.endswith("}"), F.regexp_extract(value, TALLIED_LINE, 1)).otherwise(F.lit(""))
    parse = F.when(F.col("tallied") == "", F.from_json("value", BULK_SCHEMA, _JSON_OPTIONS))
    return (text.select("value", "path", "seq", tallied.alias("tallied"))
            .select(parse.alias("line"), "value", "path", "seq", "tallied")
            .select("line.*", "value", "path", "seq", "tallied"))


def _no_text(spark: SparkSession) -> DataFrame:
    """No line (`value`, `path`, `seq`)."""
    return spark.range(0).select(F.lit("").alias("value"), F.lit("").alias("path"), F.col("id").alias("seq"))


def _file_path(spark: SparkSession, path: str) -> str:
    """A local file's path as Spark's `_metadata.file_path` writes it (`file:` and the path, quoted as
    java.net.URI quotes)."""
    jvm: Any = spark.sparkContext._jvm
    return str(jvm.java.net.URI("file", None, os.path.abspath(path), None).toString())


def _block_rules(spark: SparkSession) -> arrow_blocks.BlockRules:
    """What federation/spark/arrow_blocks.py must know of this module's rules (it does not import it)."""
    fields = T.StructType([f for f in BULK_SCHEMA.fields if f.name != CORRUPT])
    return arrow_blocks.BlockRules(
        parse_schema=arrow_blocks.arrow_schema(fields, INTEGER_TEXT), integer_text=INTEGER_TEXT,
        parsed_schema=arrow_blocks.arrow_schema(T.StructType(fields.fields + _LINE_COLUMNS.fields)),
        stored_schema=arrow_blocks.arrow_schema(_classified(_parsed_text(_no_text(spark)))[0].schema),
        versions=SUPPORTED_VERSIONS, bulk_types=BULK_TYPES,
        plain_types=tuple(kind for kind in BULK_TYPES if kind not in RUN_TYPES), run_types=tuple(RUN_TYPES),
        originated_run=ORIGINATED[1], file_types=ORIGINATED, stored_fields=STORED_FIELDS,
        counted_types=COUNTED_TYPES, tallied_line=TALLIED_LINE, max_run=MAX_RUN_PUBLICATIONS)


def _arrow_copy(spark: SparkSession, files: list[str], scratch: str | None) -> arrow_blocks.BlockCopy | None:
    """The job's own copy of local logs made by pyarrow (federation/spark/arrow_blocks.py), or None when the
    master, the files or the scratch directory are not local (the driver writes the copy the executors read)."""
    if (scratch is None or "://" in scratch or any(_has_scheme(f) for f in files)
            or not str(spark.sparkContext.master).startswith("local")):
        return None
    os.makedirs(scratch, exist_ok=True)
    copy = arrow_blocks.copy_blocks(files, [_file_path(spark, f) for f in files],
                                    tempfile.mkdtemp(prefix="blocks-", dir=scratch), _block_rules(spark),
                                    min(spark.sparkContext.defaultParallelism, os.cpu_count() or 1))
    return copy if copy.blocks else None


def read_events(spark: SparkSession, files: list[str], scratch: str | None = None, arrow: bool = True) -> EventLog:
    """Parse the logs once, store the rows, parse the few detail lines in full, summarise. Raises InputError
    when nothing is usable (the stored copy is removed then). `arrow`: let pyarrow parse and store what it
    can (local files, a local scratch directory: federation/spark/arrow_blocks.py); else Spark parses every
    line."""
    if scratch is None and str(spark.sparkContext.master).startswith("local"):
        scratch = tempfile.mkdtemp(prefix="federation-spark-")
    removable = scratch if scratch is not None and "://" not in scratch else None
    try:
        stored, classified, figures, cached = _stored_rows(spark, files, scratch, arrow)
    except BaseException:
        if removable is not None:
            shutil.rmtree(removable, ignore_errors=True)
        raise
    full = F.from_json("raw", READ_SCHEMA, _JSON_OPTIONS)
    details = ((classified if classified is not None else stored).filter(F.col("status") == "detail")
               .select(full.alias("line"), "file", "seq", "raw")
               .select("line.*", "file", "seq", "raw")
               .withColumn("status", F.when(_incomplete(), F.lit("corrupt")).otherwise(F.lit("ok")))
               .cache())
    cached.append(details)
    log = EventLog(stored.filter(F.col("status") == "ok").select(*BULK_COLUMNS),
                   details.filter(F.col("status") == "ok").drop(CORRUPT, "status", "raw", "v"),
                   InputSummary(files), removable, cached)
    try:
        _summarise(classified, details, figures, log.summary)
    except InputError:
        log.close()
        raise
    return log


def _stored_rows(spark: SparkSession, files: list[str], scratch: str | None, arrow: bool) -> tuple[
        DataFrame, DataFrame | None, dict[tuple[str, str | None], arrow_blocks.Figures], list[DataFrame]]:
    """Every line classified and stored (`_classified`), by pyarrow where it can (its figures for the
    summary come with it), by Spark otherwise: all stored rows, those Spark classified, the figures of the
    lines not in those (pyarrow's, and the lines only counted), what is cached."""
    copy = _arrow_copy(spark, files, scratch) if arrow else None
    lines: list[DataFrame] = []
    if copy is None:
        lines.append(_parsed_text(spark.read.text(files).select(
            "value", F.col("_metadata.file_path").alias("path"), F.monotonically_increasing_id().alias("seq"))))
    else:
        if copy.text is not None:
            lines.append(_parsed_text(spark.read.parquet(copy.text)
                                      .select(F.col("value").cast("string"), "path", "seq")))
        if copy.parsed is not None:
            lines.append(spark.read.parquet(copy.parsed).withColumn(CORRUPT, F.lit(None).cast("string")))
        if not lines and copy.stored is None:  # only lines that are counted: no row to store, but a table
            lines.append(_parsed_text(_no_text(spark)))
    classified: DataFrame | None = None
    figures: dict[tuple[str, str | None], arrow_blocks.Figures] = {}
    cached: list[DataFrame] = []
    if lines:
        rows, observation = _classified(lines[0] if len(lines) == 1 else lines[0].unionByName(lines[1]))
        classified, cached = _store(spark, rows, scratch)
        observed = observation.get
        figures = {(kind, None): arrow_blocks.Figures(observed[f"{kind}:n"], observed[f"{kind}:first"],
                                                      observed[f"{kind}:last"], observed[f"{kind}:publications"])
                   for kind in COUNTED_TYPES if observed[f"{kind}:n"]}
    if copy is not None:
        for kind in ("parsed", "text"):  # read once: the stored rows are what the job reads now
            shutil.rmtree(os.path.join(copy.directory, kind), ignore_errors=True)
        arrow_blocks.add_figures(figures, copy.figures)
    if copy is None or copy.stored is None:
        assert classified is not None
        return classified, classified, figures, cached
    stored = spark.read.parquet(copy.stored)
    return (stored if classified is None else stored.unionByName(classified)), classified, figures, cached


def _classified(lines: DataFrame) -> tuple[DataFrame, Observation]:
    """The rows to store (each line's status and what later steps read of it), and the counts of the lines
    only counted (COUNTED_TYPES), taken while the rows are stored."""
    lines = (lines.withColumn("type", F.when(F.col("tallied") != "", F.col("tallied")).otherwise(F.col("type")))
             .withColumn("status", F.when(F.col("tallied") != "", F.lit("ok")).otherwise(_first_status())))
    needs_file = ~F.col("type").isin(*BULK_TYPES) | F.col("type").isin(*ORIGINATED)
    ok = F.col("status") == "ok"
    stored_field = {name: F.col("type").isin(*STORED_FIELDS[name]) for name in STORED_FIELDS}
    single = ok & _single_range()
    one_topic = ok & (F.size("topics") == 1)
    derived = {
        "topic": F.when(F.col("type") == "publications_originated", F.when(one_topic, F.col("topics")[0]))
        .when(stored_field["topic"], F.col("topic")),
        "seqs": F.when(stored_field["seqs"] & ~single, F.col("seqs")),
        "first_seq": F.when(stored_field["seqs"] & single, F.col("seqs")[0][0]),
        "last_seq": F.when(stored_field["seqs"] & single, F.col("seqs")[0][1]),
        "topics": F.when(stored_field["topics"] & ~one_topic, F.col("topics")),
        "publications": F.when(ok & F.col("type").isin(*RUN_TYPES), _run_size()),
    }
    kept = [derived[name].alias(name) if name in derived
            else F.when(stored_field[name], F.col(name)).alias(name) if name in STORED_FIELDS
            else F.col(name) for name in BULK_COLUMNS if name not in ("file", "seq")]
    # Lines only counted (COUNTED_TYPES) are counted on the way and not stored: `counted` numbers their type
    # (1, 2, ...; 0 for every other line), and the counts are taken once the row holds only what is stored
    # (counting on the wide row, text included, made Spark copy every line once more).
    counted_kind = F.when(F.col("status") == "ok", F.array_position(F.array(*map(F.lit, COUNTED_TYPES)), F.col("type")))
    narrow = lines.select(*kept, F.when(needs_file, F.col("path")).alias("file"), "seq", "status",
                          F.when(F.col("status") == "detail", F.col("value")).alias("raw"), CORRUPT,
                          F.coalesce(counted_kind, F.lit(0)).alias("counted"))
    counted = Observation("counted")
    narrow = narrow.observe(counted, *[metric for number, kind in enumerate(COUNTED_TYPES, 1) for metric in (
        F.count_if(F.col("counted") == number).alias(f"{kind}:n"),
        F.min(F.when(F.col("counted") == number, F.col("t"))).alias(f"{kind}:first"),
        F.max(F.when(F.col("counted") == number, F.col("t"))).alias(f"{kind}:last"),
        F.sum(F.when(F.col("counted") == number, F.col("publications") if kind in RUN_TYPES else F.lit(1)))
        .alias(f"{kind}:publications"))])
    return narrow.filter((F.col("counted") == 0) & (F.col("status") != "blank")).drop("counted"), counted


def _summarise(classified: DataFrame | None, details: DataFrame,
               figures: dict[tuple[str, str | None], arrow_blocks.Figures], summary: InputSummary) -> None:
    """The summary of what was read: Spark's classified rows and the detail lines, counted here, and the
    `figures` of every other line (stored by pyarrow, or only counted)."""
    nodes: set[str] = set()
    publications = F.when(F.col("type").isin(*RUN_TYPES), F.col("publications")).otherwise(F.lit(1))
    aggregates = [F.count(F.lit(1)).alias("n"), F.min("t").alias("first"), F.max("t").alias("last"),
                  F.sum(F.when(F.col("status") == "ok", publications)).alias("publications")]
    rows = details.groupBy("status", "type", "node").agg(*aggregates[:3], F.lit(None).alias("publications")).collect()
    if classified is not None:
        rows += classified.filter(F.col("status") != "detail").groupBy("status", "type", "node").agg(
            *aggregates).collect()
    rows += [Row(status="ok", type=kind, node=node, n=item.n, first=item.first, last=item.last,
                 publications=item.publications) for (kind, node), item in sorted(figures.items(), key=str)]
    for row in rows:
        summary.lines += row.n
        if row.status == "corrupt":
            summary.corrupt += row.n
        elif row.status != "ok":
            version = row.status[2:]
            summary.unknown_version[version] = summary.unknown_version.get(version, 0) + row.n
        else:
            summary.valid += row.n
            if row.node is not None and not row.type.startswith(("sim_", "run_")):
                nodes.add(row.node)
            summary.by_type[row.type] = summary.by_type.get(row.type, 0) + row.n
            kind = RUN_TYPES.get(row.type, row.type)
            if kind in PER_PUBLICATION_TYPES:
                summary.per_publication[kind] = summary.per_publication.get(kind, 0) + int(row.publications or 0)
            if row.type.startswith("run_"):
                continue  # the harness's run clock (seconds from its start), not the nodes' clock
            if row.first is not None:  # None: only tallied lines (TALLIED_LINE), whose time is not read
                summary.first = row.first if summary.first is None else min(summary.first, row.first)
                summary.last = row.last if summary.last is None else max(summary.last, row.last)
    summary.nodes = sorted(nodes)
    if summary.corrupt and classified is not None:
        header = F.to_json(F.struct("t", "node", "type"))
        summary.corrupt_examples = [row[0] or "" for row in
                                    classified.filter(F.col("status") == "corrupt")
                                    .select(F.coalesce(F.col(CORRUPT), header).alias(CORRUPT), "seq")
                                    .unionByName(details.filter(F.col("status") == "corrupt")
                                                 .select(F.coalesce(F.col(CORRUPT), F.col("raw")).alias(CORRUPT),
                                                         "seq"), allowMissingColumns=True)
                                    .orderBy("seq").limit(3).collect()]
    if summary.lines == 0:
        raise InputError(f"no events in {', '.join(summary.files[:5])}: the files hold no lines")
    if summary.valid == 0:
        raise InputError("no usable event in the input: " + " ".join(summary.warnings()))
