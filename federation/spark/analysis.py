"""The Spark side of the job: everything that grows with the number of events.

Theory of operation
-------------------
Publications, deliveries, forwards and counters are nearly all of a log,
so they never leave Spark: joins and aggregations in the JVM, no Python
UDF. What the driver computed from the small share of the log (phases and
their components, subscription intervals, filter regexes; federation/spark/replay.py)
comes back as small broadcast tables.

Deliveries follow `federation.scenario.report.classify` and the
expected-delivery rule of docs/simulator.md, computed independently from
the node events:

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

Latency percentiles are nearest-rank (`percentile_disc`), as in the
simulator's report. Control overhead comes from the cumulative `counters`
snapshots (and `node_stopped`): per node incarnation the increase since
the previous snapshot, over the seconds between them, summed per time
bucket and divided by the node-seconds observed in the bucket.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from federation.spark import DATA_TYPES
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

def _phase_tables(spark: SparkSession, phases: Sequence[Phase],
                  names: Mapping[str, str]) -> tuple[DataFrame, DataFrame]:
    def order(position: int) -> tuple[str | None, int | None]:
        announced = phases[position].order if position < len(phases) else None
        return announced if announced is not None else (None, None)

    phase_rows = [(p.index, float(p.at), float(p.end), float(max(d.at for d in p.disruptions)), p.loss_active,
                   *order(position), *order(position + 1)) for position, p in enumerate(phases)]
    phase_df = spark.createDataFrame(phase_rows, "phase INT, start DOUBLE, end DOUBLE, last DOUBLE, loss BOOLEAN, "
                                                 "start_file STRING, start_seq LONG, end_file STRING, end_seq LONG")
    component_rows = [(p.index, names[name], index) for p in phases
                      for index, component in enumerate(p.components) for name in component if name in names]
    component_df = spark.createDataFrame(component_rows, "phase INT, node STRING, component INT")
    return phase_df, component_df


def _subscription_tables(spark: SparkSession,
                         subscriptions: Sequence[SubscriptionInterval]) -> tuple[DataFrame, DataFrame]:
    rows = [(s.node, s.federated, float(s.since), INFINITY if s.until is None else float(s.until))
            for s in subscriptions]
    subs = spark.createDataFrame(rows, "node STRING, federated STRING, since DOUBLE, until DOUBLE")
    filters = sorted({s.federated for s in subscriptions})
    regex = spark.createDataFrame([(f, filter_regex(f)) for f in filters], "federated STRING, regex STRING")
    return subs, regex


# ---------------------------------------------------------------- deliveries

def deliveries(spark: SparkSession, events: DataFrame, phases: Sequence[Phase], names: Mapping[str, str],
               subscriptions: Sequence[SubscriptionInterval], settle: float) -> dict[str, Any]:
    """Totals, per-phase rows and latency figures (see the module docstring)."""
    phase_df, component_df = _phase_tables(spark, phases, names)
    subs, regex = _subscription_tables(spark, subscriptions)
    pubs = (events.filter(F.col("type") == "publication_originated")
            .select("pub", F.col("node").alias("origin"), F.col("t").alias("sent_at"), "topic", "file", "seq")
            .dropDuplicates(["pub"]))
    # A publication at the very instant of a disruption belongs to the phase before it if it was written
    # before the disruption's record in the same file (the simulator's execution order).
    after_start = (F.col("sent_at") > F.col("start")) | (
        (F.col("sent_at") == F.col("start"))
        & (F.col("start_file").isNull() | (F.col("file") != F.col("start_file")) | (F.col("seq") > F.col("start_seq"))))
    before_end = (F.col("sent_at") < F.col("end")) | (
        (F.col("sent_at") == F.col("end")) & (F.col("file") == F.col("end_file")) & (F.col("seq") < F.col("end_seq")))
    pubs = (pubs.join(F.broadcast(phase_df), after_start & before_end, "left")
            .withColumn("in_bound", F.coalesce(~F.col("loss") & (F.col("last") <= F.col("sent_at") - F.lit(settle)),
                                               F.lit(False)))
            .select("pub", "origin", "sent_at", "topic", "phase", "in_bound")
            .cache())
    matches = (pubs.select("topic").distinct().crossJoin(F.broadcast(regex))
               .where(F.expr("topic RLIKE regex")).select("topic", "federated").cache())
    origin_components = component_df.select("phase", F.col("node").alias("origin"),
                                            F.col("component").alias("origin_component"))
    expected = (pubs.filter("in_bound").join(matches, "topic")
                .join(F.broadcast(subs), "federated")
                .where((F.col("node") != F.col("origin")) & (F.col("since") <= F.col("sent_at") - F.lit(settle))
                       & (F.col("until") > F.col("sent_at")))
                .join(F.broadcast(origin_components), ["phase", "origin"])
                .join(F.broadcast(component_df), ["phase", "node"])
                .where(F.col("component") == F.col("origin_component"))
                .select("pub", "node", F.col("phase").alias("expected_phase")).distinct()
                .withColumn("expected", F.lit(True)))
    delivered = (events.filter(F.col("type") == "publication_delivered")
                 .groupBy("pub", "node").agg(F.min("t").alias("first_at"), F.count(F.lit(1)).alias("copies"))
                 .join(pubs, "pub", "left"))
    # Was a matching subscription active at the first delivery? (decides outside bound vs unexpected)
    active = (delivered.join(F.broadcast(matches), "topic", "left")
              .join(F.broadcast(subs.withColumnRenamed("node", "subscriber")),
                    (F.col("subscriber") == F.col("node")) & (subs.federated == matches.federated)
                    & (F.col("since") <= F.col("first_at")) & (F.col("until") > F.col("first_at")), "left")
              .groupBy("pub", "node", "first_at", "copies", "origin", "sent_at", "phase")
              .agg(F.max(F.col("subscriber").isNotNull()).alias("subscribed")))
    pairs = (expected.join(active, ["pub", "node"], "full_outer")
             .withColumn("phase", F.coalesce("expected_phase", "phase"))
             .withColumn("expected", F.coalesce("expected", F.lit(False)))
             .withColumn("kind", F.when(F.col("copies").isNull(), "lost")
                         .when(F.col("origin").isNull() | (F.col("node") == F.col("origin")), "unexpected")
                         .when(F.col("expected"), "delivered")
                         .when(F.coalesce("subscribed", F.lit(False)), "outside_bound")
                         .otherwise("unexpected"))
             .withColumn("latency", F.when(F.col("kind") == "delivered", F.col("first_at") - F.col("sent_at")))
             .select("pub", "node", "phase", "expected", "kind", "copies", "latency")
             .cache())

    def count(kind: str) -> Any:
        return F.sum((F.col("kind") == kind).cast("long")).alias(kind)

    figures = [F.sum(F.col("expected").cast("long")).alias("expected_deliveries"), count("delivered"), count("lost"),
               count("outside_bound"), count("unexpected"),
               F.sum(F.coalesce(F.col("copies") - 1, F.lit(0))).alias("duplicates"), F.max("latency").alias("max"),
               *[F.expr(f"percentile_disc({p}) WITHIN GROUP (ORDER BY latency)").alias(name)
                 for name, p in PERCENTILES]]
    quantiles = [i / CDF_POINTS for i in range(1, CDF_POINTS + 1)]
    overall = pairs.agg(*figures, F.percentile_approx("latency", quantiles, 10000).alias("cdf")).collect()[0]
    pair_rows = {row.phase: row for row in pairs.groupBy("phase").agg(*figures).collect()}
    sent = {row.phase: row for row in pubs.groupBy("phase").agg(
        F.count(F.lit(1)).alias("n"), F.sum(F.col("in_bound").cast("int")).alias("in_bound")).collect()}

    def row_for(counts: Any, published: Any) -> dict[str, Any]:
        def number(name: str) -> int:
            return int(getattr(counts, name) or 0) if counts is not None else 0
        return {
            "sent": int(published.n) if published is not None else 0,
            "in_bound": int(published.in_bound or 0) if published is not None else 0,
            "expected_deliveries": number("expected_deliveries"), "delivered": number("delivered"),
            "lost": number("lost"), "duplicates": number("duplicates"), "unexpected": number("unexpected"),
            "delivered_outside_bound": number("outside_bound"),
            "latency": {name: None if counts is None else getattr(counts, name)
                        for name in ("p50", "p90", "p99", "max")},
        }

    keys = sorted({*sent, *pair_rows}, key=lambda k: (k is None, k or 0))
    per_phase = {key: row_for(pair_rows.get(key), sent.get(key)) for key in keys}
    totals = row_for(overall, None)
    totals["sent"] = sum(row["sent"] for row in per_phase.values())
    totals["in_bound"] = sum(row["in_bound"] for row in per_phase.values())
    lost_examples = []
    if totals["lost"]:
        lost_examples = [f"{row.pub} -> {row.node}" for row in
                         pairs.filter(F.col("kind") == "lost").orderBy("pub", "node").limit(10).collect()]
    cdf = list(overall.cdf or []) if overall.max is not None else []
    result = {"totals": totals, "per_phase": per_phase, "cdf": cdf, "lost_examples": lost_examples}
    for frame in (pubs, matches, pairs):
        frame.unpersist()
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
               .withColumn("packets", F.col("value")[0]).withColumn("bytes", F.col("value")[1]))
    kind_order = Window.partitionBy("node", "life", "kind").orderBy("t", "file", "seq")
    by_type = (by_type
               .withColumn("d_packets", F.col("packets") - F.coalesce(F.lag("packets").over(kind_order), F.lit(0)))
               .withColumn("d_bytes", F.col("bytes") - F.coalesce(F.lag("bytes").over(kind_order), F.lit(0)))
               .cache())
    series = []
    for row in (by_type.groupBy("bucket", "kind").agg(F.sum("d_packets").alias("packets"),
                                                      F.sum("d_bytes").alias("bytes"))
                .orderBy("bucket", "kind").collect()):
        seconds, nodes = node_seconds.get(row.bucket, (0.0, 0))
        series.append({"t": row.bucket, "type": row.kind, "packets": int(row.packets), "bytes": int(row.bytes),
                       "nodes": nodes, "node_seconds": round(seconds, 6),
                       "packets_per_node_s": round(row.packets / seconds, 3) if seconds > 0 else None,
                       "bytes_per_node_s": round(row.bytes / seconds, 3) if seconds > 0 else None})
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

def mesh_edges(spark: SparkSession, events: DataFrame,
               phases: Sequence[Phase]) -> dict[int, list[tuple[str, str, str, str]]]:
    """Per phase: the (from, to, filter, mode) links publications used (`publication_forwarded`; mode
    `mesh` inside the mesh, `toward_core` on the way to it)."""
    if not phases:
        return {}
    phase_df = spark.createDataFrame([(p.index, float(p.at), float(p.end)) for p in phases],
                                     T.StructType([T.StructField("phase", T.IntegerType()),
                                                   T.StructField("start", T.DoubleType()),
                                                   T.StructField("end", T.DoubleType())]))
    rows = (events.filter(F.col("type") == "publication_forwarded")
            .select("t", "node", "filter", "mode", F.explode("to").alias("to"))
            .join(F.broadcast(phase_df), (F.col("t") >= F.col("start")) & (F.col("t") < F.col("end")))
            .select("phase", "node", "to", "filter", "mode").distinct().collect())
    edges: dict[int, list[tuple[str, str, str, str]]] = {}
    for row in sorted(rows, key=lambda r: (r.phase, r.node, r.to, r.filter, r.mode or "")):
        edges.setdefault(row.phase, []).append((row.node, row.to, row.filter, row.mode or "mesh"))
    return edges
