"""The job's own columnar copy of a local log: pyarrow parses and stores the plain rows, Spark the rest.

Theory of operation
-------------------
Parsing the JSON text is most of what reading a log costs, and Spark's
`from_json` parses one line at a time through a Reader, outside its
generated code, then writes the rows through its row-by-row Parquet
writer. pyarrow's JSON reader and Parquet writer (C++, a block at a time)
do the same several times faster. So on a local master, with local files,
the driver cuts every file into blocks of about `BLOCK_BYTES` (at line
ends) and parses them with pyarrow, on as many threads as Spark has cores.

reader.py stays the one full definition of what a line means
(`_classified`). This module stores only *plain* rows itself, those whose
meaning is beyond doubt, in exactly the columns and values reader.py
would store for them: a valid v1 per-publication line or simulator record,
a valid v2 run of one range of sequence numbers, and a tallied line (only
counted, here too). Every other row of a block (a detail line, a run of
several ranges, a line with a problem) is written as Spark's parse would
have given it (`parsed`: the bulk schema's fields, `value`, `path`, `seq`,
`tallied`), and reader.py classifies it. A test runs both paths over the
same odd lines and compares what they store.

A block pyarrow cannot be sure to read as Spark does is written as its
lines' text (`text`: byte for byte, split where Spark's text reader
splits) and Spark parses it as it parses a whole log elsewhere: damaged
lines are counted, with their text, exactly as before, and a damaged line
costs its block the fast path, not the log. A block goes to Spark when:

- pyarrow cannot parse it with the explicit schema (not JSON, a field of
  another type, a field named twice, text around an object: Spark reads
  many of these leniently, or as a corrupt line);
- it holds a carriage return (Spark's reader ends lines there too), a
  line that does not start with `{` and end with `}` (blank lines, top-level
  arrays or scalars, spaces around the object), or invalid UTF-8 (Spark
  reads it with U+FFFD, pyarrow as it is);
- pyarrow's row count is not its line count (two objects on one line);
- a value is `Inf`, `-Inf` or `-NaN` (pyarrow reads them, Spark calls the
  line corrupt), or `t` is the integer `-0` (pyarrow -0.0, Spark 0.0);
- a bulk line is long enough to break a limit of Spark's parser (more
  than 1,000 digits in a number, nesting 1,000 deep, a name of 50,000
  characters: such a line is corrupt for Spark). A detail line is parsed
  again by Spark in full, so those limits apply to it there.

A file's leading UTF-8 byte order mark is dropped, as Spark's reader does.
`seq` is the block's number (counted over the files in order) shifted by
`SEQ_BITS`, plus the line's number in the block: file order within a file,
and the files in the order given. The copy lives in the job's scratch
directory and goes with it.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

# pyarrow ships no type information (and pyarrow-stubs refuses the Python scalars pyarrow takes)
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.json as pa_json  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
from pyspark.sql import types as T

BLOCK_BYTES = 8 << 20
"""bytes of text per block (more up to the next line end): big enough that per-block costs vanish, small
enough that a damaged line sends little text to Spark's slower parser"""
SEQ_BITS = 32
"""`seq` = block number << SEQ_BITS + the line's number in its block"""
LONG_LINE = 1_000
"""bytes: no line this short can break a limit of Spark's JSON parser (1,000 digits, depth 1,000)"""
LONG_NUMBER = r"[-+.eE0-9]{1000}"
MAX_BRACKETS = 1_000
MAX_NAME = 50_000
BOM = b"\xef\xbb\xbf"
LINE_END = re.compile(rb"\r\n|\r|\n")
"""where Spark's text reader ends a line"""
ODD_NUMBERS = r"[:,\[][ \t]*(-?Inf|-NaN)"
"""values pyarrow reads and Spark refuses (a string holding such text sends its block to Spark: harmless)"""
NEGATIVE_ZERO_T = r'"t"[ \t]*:[ \t]*-0[ \t]*[,}]'


def arrow_schema(schema: T.StructType, integer_text: Sequence[str] = ()) -> pa.Schema:
    """The Arrow schema of a Spark schema of strings, doubles, longs and arrays; `integer_text`: string fields
    the writers write as integers (Spark reads them as their text: read as int64, then made text)."""
    def convert(data_type: T.DataType) -> pa.DataType:
        if isinstance(data_type, T.StringType):
            return pa.string()
        if isinstance(data_type, T.DoubleType):
            return pa.float64()
        if isinstance(data_type, T.LongType):
            return pa.int64()
        if isinstance(data_type, T.ArrayType):
            return pa.list_(convert(data_type.elementType))
        raise TypeError(f"no Arrow type for {data_type}")

    return pa.schema([pa.field(f.name, pa.int64() if f.name in integer_text else convert(f.dataType))
                      for f in schema.fields])


@dataclass(frozen=True)
class BlockRules:
    """What reader.py decides, handed to the blocks (this module does not import it)."""

    parse_schema: pa.Schema
    """the bulk schema as pyarrow parses it (`integer_text` fields as integers)"""
    integer_text: tuple[str, ...]
    parsed_schema: pa.Schema
    """the rows Spark classifies: the bulk schema's fields (`integer_text` as text)"""
    stored_schema: pa.Schema
    """the rows stored, as reader.py stores them"""
    versions: tuple[str, ...]
    bulk_types: tuple[str, ...]
    plain_types: tuple[str, ...]
    """bulk types stored as parsed when their header is complete (v1 per-publication lines, sim_*)"""
    run_types: tuple[str, ...]
    originated_run: str
    file_types: tuple[str, ...]
    """bulk types whose rows keep their file (the order of one instant)"""
    stored_fields: Mapping[str, tuple[str, ...]]
    counted_types: tuple[str, ...]
    tallied_line: str
    max_run: int


@dataclass
class Figures:
    """Valid lines of one type and node (node None: a counted type's lines, whose nodes are not listed): how
    many, their first and last time (None: not read), the publications they name."""

    n: int = 0
    first: float | None = None
    last: float | None = None
    publications: int = 0

    def add(self, other: Figures) -> None:
        self.n += other.n
        self.publications += other.publications
        self.first = min((x for x in (self.first, other.first) if x is not None), default=None)
        self.last = max((x for x in (self.last, other.last) if x is not None), default=None)


def add_figures(total: dict[tuple[str, str | None], Figures], more: dict[tuple[str, str | None], Figures]) -> None:
    for key, figures in more.items():
        total.setdefault(key, Figures()).add(figures)


@dataclass
class BlockCopy:
    """Where the blocks went, under `directory`: `stored` (rows stored as reader.py stores them), `parsed`
    (rows Spark classifies), `text` (lines Spark parses: `path`, `seq`, `value`); each None when empty."""

    directory: str
    stored: str | None = None
    parsed: str | None = None
    text: str | None = None
    blocks: int = 0
    text_blocks: int = 0
    figures: dict[tuple[str, str | None], Figures] = field(default_factory=dict)
    """what the rows stored or counted here add to the input's summary, by type and node"""


@dataclass
class _Block:
    stored: pa.Table | None = None
    parsed: pa.Table | None = None
    text: pa.Table | None = None
    figures: dict[tuple[str, str | None], Figures] = field(default_factory=dict)


def file_blocks(path: str) -> Iterator[bytes]:
    """One file's text in blocks of whole lines, about BLOCK_BYTES each (the last one as the file ends)."""
    rest = b""
    with open(path, "rb") as source:
        data = source.read(BLOCK_BYTES)
        if data.startswith(BOM):
            data = data[len(BOM):]
        while data:
            data = rest + data
            cut = data.rfind(b"\n") + 1
            rest = data[cut:]
            if cut:
                yield data[:cut]
            data = source.read(BLOCK_BYTES)
    if rest:
        yield rest


def text_lines(block: bytes) -> list[bytes]:
    """The block's lines as Spark's text reader cuts them."""
    lines = LINE_END.split(block)
    if block.endswith((b"\n", b"\r")):
        lines.pop()  # the empty piece after the last line end: not a line
    return lines


class _Positions:
    """0, 1, 2, ... as an Arrow array, grown as needed (one per thread)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def first(self, count: int) -> pa.Array:
        known: pa.Array | None = getattr(self._local, "array", None)
        if known is None or len(known) < count:
            known = pa.array(range(max(count, 2 * len(known) if known is not None else count)), pa.int64())
            self._local.array = known
        return known.slice(0, count)


def _parse(block: bytes, rules: BlockRules) -> tuple[pa.Table, pa.Array] | None:
    """The block's rows and its lines' text, or None when Spark must parse the block (module doc)."""
    if b"\r" in block:
        return None
    lines = pc.split_pattern(pa.array([block], pa.large_binary()), b"\n").flatten()
    if block.endswith(b"\n"):
        lines = lines.slice(0, len(lines) - 1)
    if not pc.all(pc.starts_with(lines, b"{")).as_py() or not pc.all(pc.ends_with(lines, b"}")).as_py():
        return None
    try:
        text = lines.cast(pa.large_string())  # checks UTF-8
        table = pa_json.read_json(pa.BufferReader(block),
                                  read_options=pa_json.ReadOptions(use_threads=False, block_size=len(block) + 1),
                                  parse_options=pa_json.ParseOptions(explicit_schema=rules.parse_schema,
                                                                     unexpected_field_behavior="ignore"))
    except pa.ArrowException:  # whatever pyarrow refuses, Spark reads
        return None
    if table.num_rows != len(lines):
        return None
    table = table.combine_chunks()
    if (b"Inf" in block or b"NaN" in block) and pc.any(pc.match_substring_regex(text, ODD_NUMBERS)).as_py():
        return None
    zero = pc.fill_null(pc.equal(table.column("t").combine_chunks(), 0.0), False)
    if pc.any(zero).as_py() and pc.any(pc.match_substring_regex(text.filter(zero), NEGATIVE_ZERO_T)).as_py():
        return None
    long_bulk = pc.and_(pc.greater(pc.binary_length(lines), LONG_LINE),
                        _is(table.column("type").combine_chunks(), rules.bulk_types))
    if pc.any(long_bulk).as_py():
        suspect = text.filter(long_bulk)
        brackets = pc.add(pc.count_substring(suspect, "{"), pc.count_substring(suspect, "["))
        if (pc.any(pc.greater(pc.binary_length(suspect), MAX_NAME)).as_py()
                or pc.any(pc.greater_equal(brackets, MAX_BRACKETS)).as_py()
                or pc.any(pc.match_substring_regex(suspect, LONG_NUMBER)).as_py()):
            return None
    return table, text


def _is(values: pa.Array, choices: Sequence[str]) -> pa.Array:
    """Whether each value is one of `choices` (null: no); a dictionary array is tested on its few values."""
    choices = pa.array(list(choices), pa.string())
    if isinstance(values, pa.DictionaryArray):
        return pc.fill_null(pc.is_in(values.dictionary, choices).take(values.indices), False)
    return pc.fill_null(pc.is_in(values, choices), False)


def _valid(*arrays: pa.Array) -> pa.Array:
    result = pc.is_valid(arrays[0])
    for array in arrays[1:]:
        result = pc.and_(result, pc.is_valid(array))
    return result


def _first_items(lists: pa.Array, where: pa.Array) -> pa.Array:
    """The first item of each list where `where` holds (those lists are not empty), null elsewhere: taken by
    offset (if_else over nested lists is slow)."""
    return lists.values.take(pc.if_else(where, lists.offsets.slice(0, len(lists)), None))


def _single_range(seqs: pa.Array, candidates: pa.Array) -> tuple[pa.Array, pa.Array]:
    """(first, last) of the runs among `candidates` whose `seqs` is one range of two numbers; null elsewhere."""
    one = pc.and_(candidates, pc.fill_null(pc.equal(pc.list_value_length(seqs), 1), False))
    pair = _first_items(seqs, one)
    two = pc.fill_null(pc.equal(pc.list_value_length(pair), 2), False)
    start = pc.if_else(two, pair.offsets.slice(0, len(pair)), None)
    return pair.values.take(start), pair.values.take(pc.add(start, 1))


def _classify(table: pa.Table, text: pa.Array, uri: str, seq0: int, rules: BlockRules,
              positions: _Positions) -> _Block:
    """Plain rows stored, the others handed to Spark, the counted lines counted (module doc; reader.py's
    `_classified` and `_first_status` define what every row means)."""
    count = table.num_rows

    def column(name: str) -> pa.Array:
        return table.column(name).combine_chunks()

    kind = pc.dictionary_encode(column("type"))  # a few types: tested on the dictionary
    is_tallied = pc.match_substring_regex(text, rules.tallied_line)  # its type is the parsed one (no key twice)
    version = pc.cast(column("v"), pa.string())
    header = pc.and_(_valid(column("t"), column("node"), kind, version), _is(version, rules.versions))
    run = pc.and_(header, _is(kind, rules.run_types))
    first, last = _single_range(column("seqs"), run)
    size = pc.add(pc.subtract(last, first), 1)
    originated_run = _is(kind, (rules.originated_run,))
    topic_count = pc.list_value_length(column("topics"))
    topics_fit = pc.or_(pc.invert(originated_run), pc.fill_null(
        pc.or_(pc.equal(topic_count, 1), pc.equal(topic_count, size)), False))
    good_run = pc.fill_null(pc.and_(
        pc.and_(_valid(column("origin"), column("epoch"), first, last), pc.greater_equal(first, 0)),
        pc.and_(pc.less_equal(first, last), pc.less(pc.subtract(last, first), rules.max_run))), False)
    plain_run = pc.and_(pc.and_(run, good_run), topics_fit)
    plain = pc.or_(pc.or_(is_tallied, pc.and_(header, _is(kind, rules.plain_types))), plain_run)
    counted = pc.and_(plain, _is(kind, rules.counted_types))
    seq = pc.add(positions.first(count), seq0)
    summary = pa.table({"type": kind, "node": pc.if_else(counted, None, column("node")),
                        "t": pc.if_else(is_tallied, None, column("t")),
                        "publications": pc.if_else(plain_run, size, 1)}).filter(plain)
    block = _Block(figures={(row["type"], row["node"]): Figures(row["count_all"], row["t_min"], row["t_max"],
                                                                row["publications_sum"])
                            for row in summary.group_by(["type", "node"]).aggregate(
                                [([], "count_all"), ("t", "min"), ("t", "max"), ("publications", "sum")]).to_pylist()})
    store = pc.and_(plain, pc.invert(counted))
    if pc.any(store).as_py():
        block.stored = _stored(table.filter(store), kind.filter(store), first.filter(store), last.filter(store),
                               size.filter(store), plain_run.filter(store), seq.filter(store), uri, rules)
    rest = pc.invert(plain)
    if pc.any(rest).as_py():
        parsed = table.filter(rest)
        detail = pc.invert(_is(parsed.column("type"), rules.bulk_types))
        columns = {name: parsed.column(name) for name in parsed.column_names}
        columns.update(value=pc.if_else(detail, text.filter(rest), None), seq=seq.filter(rest),
                       path=pa.nulls(len(parsed), pa.string()).fill_null(uri),
                       tallied=pa.nulls(len(parsed), pa.string()).fill_null(""))
        block.parsed = pa.table([pc.cast(columns[target.name], target.type) for target in rules.parsed_schema],
                                schema=rules.parsed_schema)
    return block


def _stored(rows: pa.Table, kind: pa.Array, first: pa.Array, last: pa.Array, size: pa.Array, run: pa.Array,
            seq: pa.Array, uri: str, rules: BlockRules) -> pa.Table:
    """The plain rows in the stored columns, with the values reader.py's `_classified` gives them."""
    count = rows.num_rows
    topics = rows.column("topics").combine_chunks()
    originated_run = _is(kind, (rules.originated_run,))
    topic_count = pc.list_value_length(topics)
    one_topic = pc.fill_null(pc.equal(topic_count, 1), False)
    several = pc.and_(_is(kind, rules.stored_fields["topics"]), pc.invert(one_topic))

    def where(keep: pa.Array, values: pa.Array) -> pa.Array:
        """`values` where `keep` holds, else null (if_else only when some value goes: slow on lists)."""
        return values if not pc.any(pc.and_(pc.is_valid(values), pc.invert(keep))).as_py() else \
            pc.if_else(keep, values, None)

    def kept(name: str, values: pa.Array) -> pa.Array:
        return where(_is(kind, rules.stored_fields[name]), values)

    derived = {
        "type": pc.cast(kind, pa.string()),
        "topic": pc.if_else(originated_run, _first_items(topics, pc.and_(originated_run, one_topic)),
                            kept("topic", rows.column("topic"))),
        "seqs": None,  # a plain run has one range: first_seq and last_seq
        "first_seq": kept("seqs", first),
        "last_seq": kept("seqs", last),
        "topics": where(several, topics) if pc.any(several).as_py() else None,
        "publications": pc.if_else(run, size, None),
        "file": pc.if_else(_is(kind, rules.file_types), pa.scalar(uri), None),
        "seq": seq,
        "status": pa.nulls(count, pa.string()).fill_null("ok"),
    }
    columns = []
    for target in rules.stored_schema:
        if target.name in derived:
            values = derived[target.name]
        elif target.name in rules.stored_fields:
            values = kept(target.name, rows.column(target.name))
        elif target.name in rows.column_names:
            values = rows.column(target.name)
        else:
            values = None  # raw, _corrupt: a plain row has neither
        columns.append(pa.nulls(count, target.type) if values is None else pc.cast(values, target.type))
    return pa.table(columns, schema=rules.stored_schema)


def _text_block(block: bytes, uri: str, seq0: int) -> pa.Table:
    lines = text_lines(block)
    return pa.table({"path": pa.array([uri] * len(lines), pa.string()),
                     "seq": pa.array(range(seq0, seq0 + len(lines)), pa.int64()),
                     "value": pa.array(lines, pa.binary())})


class _Writers:
    """One Parquet file per thread and kind of rows, a row group per block. Few files make Spark's later
    reads faster: with 16 times as many (files of 16 blocks), the deliveries step of the benchmark took
    26.1-26.3 s against 21.4-22.9 s."""

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[pq.ParquetWriter] = []
        self.kinds: set[str] = set()

    def write(self, kind: str, table: pa.Table) -> None:
        mine: dict[str, pq.ParquetWriter] = self._local.__dict__.setdefault("writers", {})
        if kind not in mine:
            with self._lock:
                place = os.path.join(self._directory, kind)
                os.makedirs(place, exist_ok=True)
                mine[kind] = pq.ParquetWriter(os.path.join(place, f"part-{len(self._open):05d}.parquet"),
                                              table.schema)
                self._open.append(mine[kind])
                self.kinds.add(kind)
        mine[kind].write_table(table, row_group_size=max(1, table.num_rows))

    def close(self) -> None:
        for writer in self._open:
            writer.close()


def copy_blocks(files: Sequence[str], uris: Sequence[str], directory: str, rules: BlockRules,
                threads: int) -> BlockCopy:
    """Parse the local `files` (`uris`: their paths as Spark names them) block by block into `directory`."""
    copy = BlockCopy(directory)
    positions = _Positions()
    writers = _Writers(directory)

    def work(index: int, text: bytes, uri: str) -> _Block:
        seq0 = index << SEQ_BITS
        parsed = _parse(text, rules)
        block = _Block(text=_text_block(text, uri, seq0)) if parsed is None else \
            _classify(*parsed, uri, seq0, rules, positions)
        for kind in ("stored", "parsed", "text"):
            table = getattr(block, kind)
            if table is not None:
                writers.write(kind, table)
        return block

    def settle(pending: list[Future[_Block]], keep: int) -> None:
        while len(pending) > keep:
            block = pending.pop(0).result()
            copy.text_blocks += block.text is not None
            add_figures(copy.figures, block.figures)

    try:
        with ThreadPoolExecutor(max(1, threads)) as pool:
            pending: list[Future[_Block]] = []
            for path, uri in zip(files, uris, strict=True):
                for text in file_blocks(path):
                    settle(pending, 2 * threads)  # at most this many blocks in memory
                    pending.append(pool.submit(work, copy.blocks, text, uri))
                    copy.blocks += 1
            settle(pending, 0)
    finally:
        writers.close()
    for kind in sorted(writers.kinds):
        setattr(copy, kind, os.path.join(directory, kind))
    return copy
