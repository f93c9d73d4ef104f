"""docs/events.md against the code: the kinds, the fields every call gives, the fixed values, Spark's schema.

The node's kinds come from `federation.protocol.events.ALL`, the wrapper's own from
`federation.daemon.wrapper_events.ALL`; everything else is read from the source
(tests/docs/source_scan.py), so a new event, field or value that the docs do not describe fails here.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest
from doc_tables import backticked, names, table
from source_scan import ROOT, WRAPPER_EVENTS_MODULE, EmitSite, Source

from federation.daemon import wrapper_events
from federation.protocol import events

DOC = "events.md"
SECTIONS = {"node": "Node events", "wrapper": "Wrapper events", "sim": "Simulator records",
            "run": "Scenario driver records"}
HEADER = {"v", "t", "node", "type", "name"}

KNOWN_SPARK_MISMATCHES: set[str] = set()
"""Fields whose documented type Spark's schema cannot read (none: `to`, once one string in
`publication_retransmitted`, is a list there as everywhere)."""


@cache
def documented(section: str) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """type -> (fields always given, fields given only sometimes), from one table of docs/events.md."""
    kinds = {}
    for row in table(DOC, SECTIONS[section]):
        (kind,) = backticked(row["type"])
        assert kind not in kinds, f"docs/events.md lists {kind} twice"
        required, optional = names(row["fields"])
        kinds[kind] = (frozenset(required), frozenset(optional))
    return kinds


@cache
def field_types() -> dict[str, set[str]]:
    """field -> its JSON types, from the Fields table."""
    types = {}
    for row in table(DOC, "Fields"):
        (field,) = backticked(row["field"])
        types[field] = {kind.strip() for kind in row["JSON type"].replace(" or ", ",").split(",")}
    return types


@cache
def source() -> Source:
    return Source(["federation"])


def _sites(section: str) -> dict[str, list[EmitSite]]:
    if section == "node":
        found = source().event_sites(events.ALL)
    elif section == "wrapper":
        found = source().event_sites(wrapper_events.ALL, WRAPPER_EVENTS_MODULE)
    else:
        found = source().record_sites(f"{section}_")
    by_kind: dict[str, list[EmitSite]] = defaultdict(list)
    for site in found:
        by_kind[site.kind].append(site)
    return by_kind


def test_the_node_event_kinds_are_the_declared_ones() -> None:
    assert set(documented("node")) == set(events.ALL), \
        "docs/events.md 'Node events' and federation/protocol/events.py ALL differ"


def test_the_wrapper_event_kinds_are_the_declared_ones() -> None:
    assert set(documented("wrapper")) == set(wrapper_events.ALL), \
        "docs/events.md 'Wrapper events' and federation/daemon/wrapper_events.py ALL differ"
    assert not set(events.ALL) & set(wrapper_events.ALL)


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_kind_written_is_documented_and_every_documented_kind_is_written(section: str) -> None:
    written = set(_sites(section))
    assert written == set(documented(section)), (
        f"written but not in docs/events.md: {sorted(written - set(documented(section)))}; "
        f"documented but never written: {sorted(set(documented(section)) - written)}")


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_call_gives_the_documented_fields(section: str) -> None:
    problems = []
    for kind, sites in sorted(_sites(section).items()):
        required, optional = documented(section).get(kind, (frozenset(), frozenset()))
        given: set[str] = set()
        for site in sites:
            given |= site.fields | site.optional
            if extra := (site.fields | site.optional) - required - optional:
                problems.append(f"{site.where}: {kind} gives {sorted(extra)}, not in docs/events.md")
            if site.optional - optional:
                problems.append(f"{site.where}: {kind} sometimes gives {sorted(site.optional - optional)}: "
                                f"write them in [brackets] in docs/events.md")
            if site.closed and (missing := required - site.fields):
                problems.append(f"{site.where}: {kind} lacks {sorted(missing)}, which docs/events.md lists as "
                                f"always there (bracket them if only some events have them)")
        if all(site.closed for site in sites) and (stale := (required | optional) - given):
            problems.append(f"{kind}: docs/events.md lists {sorted(stale)}, which no call gives")
    assert not problems, "\n".join(problems)


def test_every_field_has_one_documented_type() -> None:
    fields = {field for section in SECTIONS for required, optional in documented(section).values()
              for field in required | optional}
    assert fields == set(field_types()), (
        f"fields without a row in 'Fields': {sorted(fields - set(field_types()))}; "
        f"rows for no field: {sorted(set(field_types()) - fields)}")
    vocabulary = {"string", "integer", "number", "boolean", "null", "object", "list of strings",
                  "list of string pairs", "list of integer pairs"}
    odd = {field: types - vocabulary for field, types in field_types().items() if types - vocabulary}
    assert not odd, f"JSON types outside {sorted(vocabulary)}: {odd}"


@pytest.mark.parametrize("row", table(DOC, "Values"), ids=lambda row: "-".join(backticked(row["type"] + row["field"])))
def test_fixed_values_match_what_the_code_passes(row: dict[str, str]) -> None:
    (kind,), (field,) = backticked(row["type"]), backticked(row["field"])
    documented_values, _ = names(row["values"])
    assert source().event_values(kind, field) == set(documented_values)


# ---------------------------------------------------------------- the Spark job's schema

def _spark_accepts(spark_type: object, json_type: str) -> bool:
    """Whether Spark's JSON reader reads a value of `json_type` into a column of `spark_type` without
    marking the line corrupt (a string column takes anything, as raw JSON text)."""
    from pyspark.sql import types as T

    if json_type == "null" or isinstance(spark_type, T.StringType):
        return True
    accepted = {
        "integer": (T.LongType, T.DoubleType),
        "number": (T.DoubleType,),
        "boolean": (T.BooleanType,),
        "object": (T.MapType, T.StructType),
        "list of strings": (T.ArrayType,),
        "list of string pairs": (T.ArrayType,),
        "list of integer pairs": (T.ArrayType,),
    }.get(json_type, ())
    if not isinstance(spark_type, accepted):
        return False
    if isinstance(spark_type, T.ArrayType):
        element = spark_type.elementType
        if json_type == "list of strings":
            return isinstance(element, T.StringType)
        if json_type == "list of integer pairs":
            return isinstance(element, T.ArrayType) and isinstance(element.elementType, T.LongType)
        return isinstance(element, T.ArrayType) and isinstance(element.elementType, T.StringType)
    return True


def test_the_spark_schema_reads_documented_fields_with_their_types() -> None:
    pytest.importorskip("pyspark")
    from federation.spark.reader import CORRUPT, EVENT_SCHEMA

    types = field_types()
    unknown = [f.name for f in EVENT_SCHEMA.fields if f.name not in HEADER | {CORRUPT} and f.name not in types]
    assert not unknown, f"federation/spark/reader.py reads fields docs/events.md does not describe: {unknown}"
    mismatched = {f.name for f in EVENT_SCHEMA.fields if f.name in types
                  and not all(_spark_accepts(f.dataType, json_type) for json_type in types[f.name])}
    assert mismatched == KNOWN_SPARK_MISMATCHES, (
        f"federation/spark/reader.py's types that cannot read every documented type: {sorted(mismatched)} "
        f"(known: {sorted(KNOWN_SPARK_MISMATCHES)})")


def _spark_literals() -> tuple[set[str], set[str]]:
    """(every string literal in spark/*.py, the literals given as column names to col/select/explode)."""
    literals, columns = set(), set()
    for path in sorted(Path(ROOT, "federation", "spark").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                literals.add(node.value)
            elif isinstance(node, ast.Call) and Source.callee(node) in ("col", "select", "explode"):
                columns |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return literals, columns


def test_the_spark_schema_covers_what_the_job_reads() -> None:
    pytest.importorskip("pyspark")
    from federation.spark.analysis import DETECTED_TYPES, HARNESS_TIMELINE_TYPES, SIM_TIMELINE_TYPES
    from federation.spark.reader import EVENT_SCHEMA
    from federation.spark.replay import VIEW_EVENT_TYPES

    kinds = {kind: required | optional for section in SECTIONS for kind, (required, optional)
             in documented(section).items()}
    named = set(DETECTED_TYPES) | set(HARNESS_TIMELINE_TYPES) | set(SIM_TIMELINE_TYPES) | set(VIEW_EVENT_TYPES)
    assert named <= set(kinds), f"the Spark job names undocumented types: {sorted(named - set(kinds))}"
    literals, columns = _spark_literals()
    read = named | (literals & set(kinds))
    schema = {f.name for f in EVENT_SCHEMA.fields}
    missing = {f"{kind}.{field}" for kind in read for field in kinds[kind] & columns if field not in schema}
    assert not missing, f"the job reads these fields by name, but federation/spark/reader.py's schema lacks: {missing}"
