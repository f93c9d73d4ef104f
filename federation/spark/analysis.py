"""The Spark side of the job: everything that grows with the number of events.

Theory of operation
-------------------
Publications, deliveries, forwards and counters are nearly all of a log,
so they never leave Spark: joins and aggregations in the JVM, no Python
UDF, and no Python worker either (the small tables from the driver are
literals, `_table`). What the driver computed from the small share of the
log (phases and their components, subscription intervals, filter regexes;
federation/spark/replay.py) comes back as small broadcast tables or as
CASE expressions over the phases.

Deliveries follow `federation.scenario.report.classify` and the
expected-delivery rule of docs/simulator.md, computed independently from
the node events (v1 per-publication lines and v2 runs alike,
federation/spark/publications.py):

- a publication is `publication_originated` (its time, origin, topic); it
  is *in bound* when its phase has no loss and the phase's last disruption
  is at least `settle` before it;
- expected nodes: every node other than the origin, in the origin's
  component of that phase, with a subscription active at that time, made at
  least `settle` before, whose federated filter matches the topic;
- a delivery is `publication_delivered`; per (publication, node) the first
  one is delivered (expected node), outside bound (a matching subscription
  was active then) or unexpected (the origin, a never-originated
  publication, or no matching subscription); the others are duplicates;
  an expected pair never delivered is lost.

The bulk is shuffled once: originated and delivered rows together, by
publication id; a window hands each delivery its publication's phase and
expected nodes, so lost = expected - delivered per phase without listing
the expected pairs. Latency percentiles are nearest-rank (the value
`percentile_disc` gives), read off a histogram of the distinct latencies.
Control overhead comes from the cumulative `counters` snapshots (and
`node_stopped`): per node incarnation the increase since the previous
snapshot, over the seconds between them, summed per time bucket and
divided by the node-seconds observed in the bucket.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from federation.spark import DATA_TYPES, publications
from federation.spark.clocks import Sample
from federation.spark.reader import SNAPSHOT_SCHEMA
from federation.spark.replay import VIEW_EVENT_TYPES, SubscriptionInterval
from federation.spark.timeline import Phase
from federation.spark.topics import filter_regex

SIM_TIMELINE_TYPES = ("sim_start", "sim_cut", "sim_heal", "sim_kill", "sim_restart", "sim_loss")
HARNESS_TIMELINE_TYPES = ("run_start", "run_cut", "run_heal", "run_kill", "run_restart", "run_loss")
DETECTED_TYPES = ("node_started", "node_stopped", "neighbour_up", "neighbour_down")
PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
CDF_POINTS = 200
INFINITY = float("inf")


# ---------------------------------------------------------------- clocks

def clock_samples(events: DataFrame) -> list[Sample]:
    """The best (smallest error) offset sample per (observer, neighbour) from `neighbour_up` and `counters`."""
    from_up = (events.filter((F.col("type") == "neighbour_up") & F.col("clock_offset").isNotNull())
               .select("node", "neighbour", F.col("clock_offset").alias("offset"),
                       F.coalesce(F.col("clock_error"), F.col("rtt") / 2).alias("error")))
    from_counters = (events.filter((F.col("type") == "counters") & F.col("clocks").isNotNull())
                     .select("node", F.explode("clocks").alias("neighbour", "clock"))
                     .select("node", "neighbour", F.col("clock.offset").alias("offset"),
                             F.coalesce(F.col("clock.error"), F.col("clock.rtt") / 2).alias("error")))
    best = (from_up.unionByName(from_counters)
            .filter(F.col("offset").isNotNull() & F.col("error").isNotNull())
            .groupBy("node", "neighbour")
            .agg(F.min_by(F.struct("offset", "error"), "error").alias("best")))
    return [Sample(row.node, row.neighbour, float(row.best.offset), float(row.best.error))
            for row in best.collect()]


def corrected(events: DataFrame, correction: Mapping[str, float]) -> DataFrame:
    """Events with `t` in the reference clock: t - offset of the event's node (`raw_t` keeps the original)."""
    events = events.withColumn("raw_t", F.col("t"))
    if not correction:
        return events
    offsets = F.create_map(*[item for node, offset in sorted(correction.items())
                             for item in (F.lit(node), F.lit(float(offset)))])
    simulator = F.col("type").startswith("sim_") | F.col("type").startswith("run_")  # the runner's own clock
    return events.withColumn("t", F.when(simulator, F.col("t"))
                             .otherwise(F.col("t") - F.coalesce(offsets[F.col("node")], F.lit(0.0))))


# ---------------------------------------------------------------- what the driver replays

_VIEW_COLUMNS = ("t", "node", "type", "name", "broker_id", "neighbours", "added", "removed", "core", "previous",
                 "filter", "reason", "vid", "client", "federated", "parents", "neighbour")


def view_rows(events: DataFrame) -> Iterator[Any]:
    """The view events, in time order (file order within an instant), streamed to the driver."""
    rows = (events.filter(F.col("type").isin(*VIEW_EVENT_TYPES))
            .select(*_VIEW_COLUMNS, "file", "seq")
            .orderBy("t", "file", "seq"))
    return rows.toLocalIterator(prefetchPartitions=True)


def control_rows(events: DataFrame) -> list[Any]:
    """Starts, stops, neighbour changes and the simulator's timeline records, in time order (one small collect)."""
    return (events.filter(F.col("type").isin(*DETECTED_TYPES, *SIM_TIMELINE_TYPES, *HARNESS_TIMELINE_TYPES))
            .select("t", "node", "type", "name", "neighbours", "neighbour", "nodes", "links", "a", "b", "oneway",
                    "percent", "link", "t0_unix", "file", "seq")
            .orderBy("t", "file", "seq").collect())


def sim_records(rows: Sequence[Any]) -> list[dict[str, Any]]:
    return [row.asDict(recursive=True) for row in rows if row.type in SIM_TIMELINE_TYPES]


def harness_records(rows: Sequence[Any]) -> list[dict[str, Any]]:
    return [row.asDict(recursive=True) for row in rows if row.type in HARNESS_TIMELINE_TYPES]


def detected_rows(rows: Sequence[Any]) -> list[Any]:
    return [row for row in rows if row.type in DETECTED_TYPES]


def node_names(rows: Sequence[Any]) -> dict[str, str]:
    """name -> address from `node_started` (the address itself when a node has no name)."""
    names: dict[str, str] = {}
    for name, address in sorted({(row.name or row.node, row.node) for row in rows if row.type == "node_started"}):
        names.setdefault(name, address)
    return names


# ---------------------------------------------------------------- small tables from the driver

def _phase_of(phases: Sequence[Phase], at: Column, file: Column, seq: Column) -> Column:
    """The index of the phase an event at `at` (written at `file`, `seq`) belongs to, else null.

    A publication at the very instant of a disruption belongs to the phase before it if it was written before
    the disruption's record in the same file (the simulator's execution order). One CASE over the (few)
    phases: no join."""
    def order(position: int) -> tuple[str | None, int | None]:
        announced = phases[position].order if position < len(phases) else None
        return announced if announced is not None else (None, None)

    result: Column = F.lit(None).cast("int")
    for position in range(len(phases) - 1, -1, -1):
        phase = phases[position]
        start_file, start_seq = order(position)
        end_file, end_seq = order(position + 1)
        start, end = F.lit(float(phase.at)), F.lit(float(phase.end))
        same_start = at == start
        if start_file is not None:
            same_start = same_start & ((file != F.lit(start_file)) | (seq > F.lit(start_seq)))
        before_end = at < end
        if end_file is not None:
            before_end = before_end | ((at == end) & (file == F.lit(end_file)) & (seq < F.lit(end_seq)))
        result = F.when(((at > start) | same_start) & before_end, F.lit(phase.index)).otherwise(result)
    return result


def _table(spark: SparkSession, rows: Sequence[tuple[Any, ...]], schema: str) -> DataFrame:
    """A small table from the driver (`schema`: "name TYPE, ..." of STRING, INT, DOUBLE), as literals: no
    Python worker evaluates it (createDataFrame needs one)."""
    types = {"STRING": T.StringType(), "INT": T.IntegerType(), "DOUBLE": T.DoubleType()}
    struct = T.StructType([T.StructField(name, types[kind])
                           for name, kind in (column.split() for column in schema.split(","))])
    if not rows:
        return spark.range(1).select(F.inline(F.array().cast(T.ArrayType(struct))))
    return spark.range(1).select(F.inline(F.array(*[
        F.struct(*[F.lit(value).cast(field.dataType).alias(field.name)
                   for value, field in zip(row, struct.fields, strict=True)])
        for row in rows])))


def _phase_tables(spark: SparkSession, phases: Sequence[Phase], names: Mapping[str, str]) -> tuple[DataFrame, Column]:
    """(phase, node, component) rows; an expression: whether the phase of a column `phase` has loss."""
    component_rows = [(p.index, names[name], index) for p in phases
                      for index, component in enumerate(p.components) for name in component if name in names]
    component_df = _table(spark, component_rows, "phase INT, node STRING, component INT")
    lossy = [p.index for p in phases if p.loss_active]
    return component_df, F.col("phase").isin(*lossy) if lossy else F.lit(False)


def _subscription_tables(spark: SparkSession,
                         subscriptions: Sequence[SubscriptionInterval]) -> tuple[DataFrame, DataFrame]:
    rows = [(s.node, s.federated, float(s.since), INFINITY if s.until is None else float(s.until))
            for s in subscriptions]
    subs = _table(spark, rows, "node STRING, federated STRING, since DOUBLE, until DOUBLE")
    filters = sorted({s.federated for s in subscriptions})
    regex = _table(spark, [(f, filter_regex(f)) for f in filters], "federated STRING, regex STRING")
    return subs, regex


# ---------------------------------------------------------------- deliveries

def deliveries(spark: SparkSession, events: DataFrame, phases: Sequence[Phase], names: Mapping[str, str],
               subscriptions: Sequence[SubscriptionInterval], settle: float) -> dict[str, Any]:
    """Totals, per-phase rows and latency figures (see the module docstring).

    One shuffle of the bulk: the originated and delivered rows together, by publication id, sorted so that
    a publication's first originated row (with its phase and the array of nodes expected to deliver it)
    comes first and every delivery row reads it from there (a window, not a join). Expected pairs are
    never exploded: a delivery is `delivered` when its node is in the array, and per phase
    lost = expected - delivered. Everything is then counted per (phase, latency): latency percentiles
    come from that histogram."""
    component_df, phase_lossy = _phase_tables(spark, phases, names)
    subs, regex = _subscription_tables(spark, subscriptions)
    sent = publications.originated(events)
    # Which federated filters match each topic: a regex per filter, against the distinct topics only.
    matches = (sent.select("topic").distinct().crossJoin(F.broadcast(regex))
               .where(F.expr("topic RLIKE regex")).select("topic", "federated"))
    subscribed = matches.join(F.broadcast(subs), "federated")
    candidates = (subscribed.join(F.broadcast(component_df), "node")
                  .groupBy("topic", "phase")
                  .agg(F.collect_list(F.struct("node", "component", "since", "until")).alias("candidates")))
    watchers = subscribed.groupBy("topic").agg(F.collect_list(F.struct("node", "since", "until")).alias("watchers"))
    origin_components = component_df.select("phase", F.col("node").alias("origin"),
                                            F.col("component").alias("origin_component"))
    expected_nodes = F.array_distinct(F.transform(
        F.filter(F.coalesce(F.col("candidates"), F.array().cast("array<struct<node:string,component:int,"
                                                                  "since:double,until:double>>")),
                 lambda c: (c["node"] != F.col("origin")) & (c["component"] == F.col("origin_component"))
                 & (c["since"] <= F.col("sent_at") - F.lit(settle)) & (c["until"] > F.col("sent_at"))),
        lambda c: c["node"]))
    in_bound = F.coalesce(~phase_lossy & (_last_disruption(phases) <= F.col("sent_at") - F.lit(settle)), F.lit(False))
    originated = (sent.withColumn("phase", _phase_of(phases, F.col("sent_at"), F.col("file"), F.col("seq")))
                  .join(F.broadcast(candidates), ["topic", "phase"], "left")
                  .join(F.broadcast(origin_components), ["phase", "origin"], "left")
                  .select("pub", F.lit(None).cast("string").alias("node"), F.lit(None).cast("double").alias("t"), "seq",
                          F.lit(0).alias("kind"), "origin", "sent_at", "topic", "phase", in_bound.alias("bounded"),
                          F.when(in_bound, expected_nodes).otherwise(F.array().cast("array<string>"))
                          .alias("expected_nodes")))
    about = ("origin", "sent_at", "topic", "phase", "bounded", "expected_nodes")
    copies = (publications.delivered(events)
              .select("pub", "node", "t", F.lit(None).cast("long").alias("seq"), F.lit(1).alias("kind"),
                      *[F.lit(None).cast(originated.schema[name].dataType).alias(name) for name in about]))
    # kind 0 (originated; no node, no time: its origin and sent_at say it) before kind 1 (delivered); of several
    # originated rows (a repeated line), the first; a publication's deliveries by node, then time. The ids' hash
    # leads the sort: ids share their first bytes (the origin), which the sort compares first. One sort serves
    # both windows: per publication (its first originated row) and per (publication, kind, node) (a node's
    # first delivery and its number of copies), so no aggregation over the (publication, node) pairs.
    order = Window.partitionBy("hash", "pub").orderBy("kind", "node", "t", "seq")
    whole = order.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    per_node = Window.partitionBy("hash", "pub", "kind", "node").orderBy("t", "seq")
    rows = (originated.unionByName(copies)
            .withColumn("hash", F.xxhash64("pub"))
            .select("hash", "pub", "node", "t", "kind", F.row_number().over(per_node).alias("position"),
                    F.count(F.lit(1)).over(per_node.rowsBetween(Window.unboundedPreceding,
                                                                Window.unboundedFollowing)).alias("copies"),
                    *[F.first(name).over(whole).alias(name) for name in about]))
    # Per (publication, node): kind 0 is the publication itself (tag: in bound), kind 1 its copies delivered at
    # the node (tag: 0 not expected by rule (origin unknown, or the origin itself), 1 an expected node, 2 neither).
    tag = (F.when(F.col("kind") == 0, F.col("bounded").cast("int"))
           .when(F.col("origin").isNull() | (F.col("node") == F.col("origin")), F.lit(0))
           .when(F.array_contains("expected_nodes", F.col("node")), F.lit(1))
           .otherwise(F.lit(2)))
    pairs = rows.filter(F.col("position") == 1).select(
        "node", "kind", "phase", "sent_at", "topic", "copies", F.col("t").alias("first_at"), tag.alias("tag"),
        F.size("expected_nodes").alias("expecting"))
    was_subscribed = F.exists(F.coalesce(F.col("watchers"), F.array().cast(
        "array<struct<node:string,since:double,until:double>>")),
        lambda w: (w["node"] == F.col("node")) & (w["since"] <= F.col("first_at")) & (w["until"] > F.col("first_at")))
    delivery = F.col("kind") == 1
    label = (F.when(~delivery, F.lit(None))
             .when(F.col("tag") == 1, F.lit("delivered"))
             .when((F.col("tag") == 2) & was_subscribed, F.lit("outside_bound"))
             .otherwise(F.lit("unexpected")))
    pairs = (pairs.join(F.broadcast(watchers), "topic", "left")
             .select("phase", "kind", "tag", "expecting", "copies", label.alias("label"),
                     F.when(delivery & (F.col("tag") == 1), F.col("first_at") - F.col("sent_at")).alias("latency")))

    def count(name: str) -> Any:
        return F.sum((F.col("label") == name).cast("long")).alias(name)

    # One aggregation per (phase, latency): the counts, and the latency histogram the percentiles come from.
    publication = ~delivery
    histogram = (pairs.groupBy("phase", "latency")
                 .agg(F.sum(publication.cast("long")).alias("n"),
                      F.sum((publication & (F.col("tag") == 1)).cast("long")).alias("bounded"),
                      F.sum(F.when(publication, F.col("expecting")).otherwise(0)).alias("expecting"),
                      count("delivered"), count("outside_bound"), count("unexpected"),
                      F.sum(F.when(delivery, F.col("copies") - 1).otherwise(0)).alias("duplicates"))
                 .cache())
    by_phase = {row.phase: row for row in histogram.groupBy("phase").agg(
        *[F.sum(name).alias(name) for name in ("n", "bounded", "expecting", "delivered", "outside_bound",
                                               "unexpected", "duplicates")]).collect()}
    latencies = _latency_figures(histogram.filter(F.col("latency").isNotNull())
                                 .select("phase", "latency", F.col("delivered").alias("n")))
    histogram.unpersist()
    published = {phase: row for phase, row in by_phase.items() if row.n}
    pair_rows = {phase: row for phase, row in by_phase.items()
                 if row.delivered or row.outside_bound or row.unexpected or row.duplicates}

    def row_for(counts: Sequence[Any], sent_rows: Sequence[Any], latency: Mapping[str, Any]) -> dict[str, Any]:
        def number(name: str) -> int:
            return sum(int(getattr(row, name) or 0) for row in counts)
        expected = sum(int(r.expecting or 0) for r in sent_rows)
        return {
            "sent": sum(int(r.n) for r in sent_rows),
            "in_bound": sum(int(r.bounded or 0) for r in sent_rows),
            "expected_deliveries": expected, "delivered": number("delivered"),
            "lost": expected - number("delivered"), "duplicates": number("duplicates"),
            "unexpected": number("unexpected"), "delivered_outside_bound": number("outside_bound"),
            "latency": {name: latency.get(name) for name in ("p50", "p90", "p99", "max")},
        }

    keys = sorted({*published, *pair_rows}, key=lambda k: (k is None, k or 0))
    per_phase = {key: row_for([pair_rows[key]] if key in pair_rows else [],
                              [published[key]] if key in published else [], latencies.get(key, {}))
                 for key in keys}
    totals = row_for(list(pair_rows.values()), list(published.values()), latencies.get(_ALL, {}))
    lost_examples = []
    if totals["lost"]:
        expected_pairs = (rows.filter((F.col("kind") == 0) & (F.col("position") == 1))
                          .select("pub", F.explode("expected_nodes").alias("node")))
        delivered_pairs = rows.filter(F.col("kind") == 1).select("pub", "node")
        lost_examples = [f"{row.pub} -> {row.node}" for row in
                         expected_pairs.join(delivered_pairs, ["pub", "node"], "left_anti").orderBy("pub", "node")
                         .limit(10).collect()]
    cdf = list(latencies.get(_ALL, {}).get("cdf") or [])
    return {"totals": totals, "per_phase": per_phase, "cdf": cdf, "lost_examples": lost_examples}


_ALL = -1
"""the phase key of the figures over every phase"""


def _latency_figures(histogram: DataFrame) -> dict[int, dict[str, Any]]:
    """phase (and _ALL) -> p50, p90, p99, max and (_ALL only) the CDF, from (phase, latency, n) rows.

    Nearest rank, as `percentile_disc` (the value at 1-based position ceil(p * n) of the sorted latencies),
    computed on the histogram of distinct latencies with a running count: no sort of the deliveries
    themselves."""
    overall = histogram.groupBy("latency").agg(F.sum("n").alias("n")).select(F.lit(_ALL).alias("phase"), "latency",
                                                                           "n")
    both = histogram.unionByName(overall)
    running = Window.partitionBy("phase").orderBy("latency").rowsBetween(Window.unboundedPreceding, 0)
    both = (both.withColumn("through", F.sum("n").over(running))
            .withColumn("total", F.sum("n").over(Window.partitionBy("phase"))))

    def at(fraction: float) -> Column:
        rank = F.greatest(F.ceil(F.col("total") * F.lit(fraction)), F.lit(1))
        return F.min(F.when(F.col("through") >= rank, F.col("latency")))

    quantiles = [i / CDF_POINTS for i in range(1, CDF_POINTS + 1)]
    rows = both.groupBy("phase").agg(
        *[at(fraction).alias(name) for name, fraction in PERCENTILES], F.max("latency").alias("max"),
        F.array(*[at(q) for q in quantiles]).alias("cdf")).collect()
    return {row.phase: {"p50": row.p50, "p90": row.p90, "p99": row.p99, "max": row.max,
                        "cdf": row.cdf if row.phase == _ALL else None} for row in rows}


def _last_disruption(phases: Sequence[Phase]) -> Column:
    """The time of the last disruption of the phase in column `phase` (null outside every phase)."""
    result: Column = F.lit(None).cast("double")
    for phase in phases:
        result = F.when(F.col("phase") == F.lit(phase.index),
                        F.lit(float(max(d.at for d in phase.disruptions)))).otherwise(result)
    return result


# ---------------------------------------------------------------- control overhead


def overhead(events: DataFrame, bucket: float) -> dict[str, Any]:
    """Control traffic (every type but `tm` and `tb`) per node per second, per time bucket and type; totals."""
    snapshots = (events.filter(F.col("type").isin("node_started", "counters", "node_stopped"))
                 .select("node", "t", "type", "file", "seq",
                         F.when(F.col("type") == "node_stopped",
                                F.from_json("counters", SNAPSHOT_SCHEMA).getField("sent"))
                         .otherwise(F.col("sent")).alias("sent")))
    order = Window.partitionBy("node").orderBy("t", "file", "seq")
    snapshots = (snapshots
                 .withColumn("life", F.sum((F.col("type") == "node_started").cast("int")).over(order))
                 .withColumn("previous_t", F.lag("t").over(Window.partitionBy("node", "life")
                                                           .orderBy("t", "file", "seq"))))
    snapshots = (snapshots.filter(F.col("type") != "node_started")
                 .withColumn("interval", F.col("t") - F.col("previous_t"))
                 .withColumn("bucket", F.floor(F.col("t") / F.lit(bucket)) * F.lit(bucket))
                 .cache())
    node_seconds = {row.bucket: (row.seconds or 0.0, row.nodes) for row in
                    snapshots.filter(F.col("interval") > 0).groupBy("bucket")
                    .agg(F.sum("interval").alias("seconds"), F.countDistinct("node").alias("nodes")).collect()}
    by_type = (snapshots.select("node", "life", "t", "file", "seq", "bucket", F.explode("sent").alias("kind", "value"))
               .withColumn("packets", F.col("value")[0]).withColumn("octets", F.col("value")[1]))
    kind_order = Window.partitionBy("node", "life", "kind").orderBy("t", "file", "seq")
    by_type = (by_type
               .withColumn("d_packets", F.col("packets") - F.coalesce(F.lag("packets").over(kind_order), F.lit(0)))
               .withColumn("d_octets", F.col("octets") - F.coalesce(F.lag("octets").over(kind_order), F.lit(0)))
               .cache())
    series = []
    for row in (by_type.groupBy("bucket", "kind").agg(F.sum("d_packets").alias("packets"),
                                                      F.sum("d_octets").alias("octets"))
                .orderBy("bucket", "kind").collect()):
        seconds, nodes = node_seconds.get(row.bucket, (0.0, 0))
        series.append({"t": row.bucket, "type": row.kind, "packets": int(row.packets), "bytes": int(row.octets),
                       "nodes": nodes, "node_seconds": round(seconds, 6),
                       "packets_per_node_s": round(row.packets / seconds, 3) if seconds > 0 else None,
                       "bytes_per_node_s": round(row.octets / seconds, 3) if seconds > 0 else None})
    totals: dict[str, dict[str, int]] = {}
    for item in series:
        total = totals.setdefault(item["type"], {"packets": 0, "bytes": 0})
        total["packets"] += item["packets"]
        total["bytes"] += item["bytes"]
    totals = dict(sorted(totals.items()))
    observed = sum(seconds for seconds, _ in node_seconds.values())
    control = {kind: value for kind, value in totals.items() if kind not in DATA_TYPES}
    packets = sum(v["packets"] for v in control.values())
    size = sum(v["bytes"] for v in control.values())
    snapshots.unpersist()
    by_type.unpersist()
    return {
        "bucket_seconds": bucket, "series": series, "by_type": totals,
        "control": {"packets": packets, "bytes": size, "node_seconds_observed": round(observed, 6),
                    "per_node_per_second": {
                        "packets": round(packets / observed, 3) if observed > 0 else None,
                        "bytes": round(size / observed, 3) if observed > 0 else None}},
    }


# ---------------------------------------------------------------- mesh edges for the pictures

def mesh_edges(events: DataFrame, phases: Sequence[Phase]) -> dict[int, list[tuple[str, str, str, str]]]:
    """Per phase: the (from, to, filter, mode) links publications used (`publication_forwarded`; mode
    `mesh` inside the mesh, `toward_core` on the way to it)."""
    if not phases:
        return {}
    at = F.col("t")
    phase: Column = F.lit(None).cast("int")
    for item in reversed(phases):
        inside = (at >= F.lit(float(item.at))) & (at < F.lit(float(item.end)))
        phase = F.when(inside, F.lit(item.index)).otherwise(phase)
    rows = (publications.forwarded(events)
            .select(phase.alias("phase"), "node", "to", "filter", "mode")
            .filter(F.col("phase").isNotNull()).distinct()
            .select("phase", "node", F.explode("to").alias("to"), "filter", "mode").distinct().collect())
    edges: dict[int, list[tuple[str, str, str, str]]] = {}
    for row in sorted(rows, key=lambda r: (r.phase, r.node, r.to, r.filter, r.mode or "")):
        edges.setdefault(row.phase, []).append((row.node, row.to, row.filter, row.mode or "mesh"))
    return edges
