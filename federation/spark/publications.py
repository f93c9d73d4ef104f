"""Per-publication rows from version 1 events and version 2 run events alike.

Theory of operation
-------------------
Version 1 writes one line per publication and stage (`publication_originated`,
`publication_delivered`, ...) with the publication's id in `pub`. Version 2
writes one line per run of publications (`publications_originated`, ...,
federation/spark/reader.py) naming them by `origin`, `epoch` and `seqs`, a
list of inclusive ranges. The delivery analysis wants one row per
publication, whichever version wrote it, so a run is expanded in the JVM:
`flatten(transform(seqs, r -> sequence(r[0], r[1])))`, `posexplode`, and the
v1 id rebuilt with `concat` (`"<origin>/<epoch>/<seq>"`); its topic is the
run's single topic or the one at the publication's position. Both versions
can sit in one log (nodes of two releases); the rows are the same either
way, so the report is too.

A run keeps its line's time, node, file and position: its publications
were handled at that instant, and the position orders them against the
records of the same instant (a disruption written after them happened
after them), as the v1 lines of one run, written one after the other, did.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

ORIGINATED = ("publication_originated", "publications_originated")
DELIVERED = ("publication_delivered", "publications_delivered")
FORWARDED = ("publication_forwarded", "publications_forwarded")


def _sequence_numbers() -> Column:
    """The run's sequence numbers: a run of one range is stored as `first_seq` and `last_seq` (no lambda
    function, which Spark evaluates row by row without generated code), the others as `seqs`."""
    return (F.when(F.col("seqs").isNull(), F.sequence("first_seq", "last_seq"))
            .otherwise(F.flatten(F.transform("seqs", lambda pair: F.sequence(pair[0], pair[1])))))


def _expanded(runs: DataFrame, *columns: str, topic: bool = False) -> DataFrame:
    """One row per publication of each run: `pub` (the v1 id) and `columns` (plus `topic` if asked)."""
    exploded = runs.select(*columns, "origin", "epoch", "topic", "topics",
                           F.posexplode(_sequence_numbers()).alias("position", "number"))
    pub = F.concat(F.col("origin"), F.lit("/"), F.col("epoch").cast("string"), F.lit("/"),
                   F.col("number").cast("string")).alias("pub")
    selected: list[Column | str] = [pub, *columns]
    if topic:
        selected.append(F.when(F.col("topics").isNull(), F.col("topic"))  # one topic for the run
                        .when(F.size("topics") == 1, F.col("topics")[0])
                        .otherwise(F.element_at("topics", F.col("position") + 1)).alias("topic"))
    return exploded.select(*selected)


def originated(events: DataFrame) -> DataFrame:
    """pub, origin, sent_at, topic, file, seq: one row per `publication_originated` or publication of a run."""
    v1 = (events.filter(F.col("type") == ORIGINATED[0])
          .select("pub", F.col("node").alias("origin"), F.col("t").alias("sent_at"), "topic", "file", "seq"))
    runs = (events.filter(F.col("type") == ORIGINATED[1])
            .select(F.col("node").alias("writer"), F.col("t").alias("sent_at"), "file", "seq", "origin", "epoch",
                    "seqs", "first_seq", "last_seq", "topic", "topics"))
    v2 = _expanded(runs, "writer", "sent_at", "file", "seq", topic=True)
    return v1.unionByName(v2.select("pub", F.col("writer").alias("origin"), "sent_at", "topic", "file", "seq"))


def delivered(events: DataFrame) -> DataFrame:
    """pub, node, t: one row per `publication_delivered` or publication of a delivered run."""
    v1 = events.filter(F.col("type") == DELIVERED[0]).select("pub", "node", "t")
    runs = (events.filter(F.col("type") == DELIVERED[1])
            .select("node", "t", "origin", "epoch", "seqs", "first_seq", "last_seq", "topic", "topics"))
    return v1.unionByName(_expanded(runs, "node", "t"))


def forwarded(events: DataFrame) -> DataFrame:
    """t, node, filter, mode, to: one row per forwarding line (a v2 run is one forwarding of all its
    publications to the same next hops)."""
    return events.filter(F.col("type").isin(*FORWARDED)).select("t", "node", "filter", "mode", "to")
