"""The per-publication events, one line per run of publications (event schema version 2, docs/events.md).

Theory of operation
-------------------
An event log the Spark job can replay must say, for every publication, where it was originated, where it went
and where it was delivered. Version 1 of the schema wrote one event per publication and stage, and that cost a
wrapper as much CPU as its data path (docs/benchmarks.md): an `Event`, a field map and a JSON line for every
publication at every hop. But the publications of one input are handled together, at one time, and mostly share
their origin, epoch, filter and next hops. So version 2 writes one event per *run*: the stage, what the run's
publications share, their sequence numbers as `[first, last]` ranges and their topics (one for all when they
share it).

The parts of the node still say what happens to each publication (`originated`, `forwarded`, `delivered`,
`duplicate`, or the `_run` forms for what they handle a run at a time); here that costs a key and an append or
two. The runs become events when the node's events are taken, and before any other event is emitted, so the
lines stay in the order things happened and each run has one time, as the per-publication events it replaces
had. A run event carries exactly what its per-publication events carried, with the per-publication `size`
summed into `bytes`; `expand` gives the per-publication records back (for tools that count by publication).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from federation.protocol import events
from federation.protocol.types import Address, Event
from federation.protocol.wire import MODE_IN_MESH, MODE_TOWARD_CORE

Ranges = list[list[int]]
"""ascending, non-overlapping `[first, last]` pairs of sequence numbers"""


def ranges(seqs: Iterable[int], ascending: bool = False) -> Ranges:
    """The sequence numbers as `[first, last]` ranges (sorted first unless `ascending`; duplicates merged)."""
    ordered = seqs if ascending and isinstance(seqs, list) else sorted(seqs)
    if ordered and ordered[-1] - ordered[0] + 1 == len(ordered) \
            and ordered == list(range(ordered[0], ordered[-1] + 1)):  # the common case, at C speed
        return [[ordered[0], ordered[-1]]]
    out: Ranges = []
    for seq in ordered:
        if out and seq <= out[-1][1] + 1:
            if seq > out[-1][1]:
                out[-1][1] = seq
        else:
            out.append([seq, seq])
    return out


def mode_text(mode: int) -> str:
    """A copy's wire mode as `publications_forwarded` writes it."""
    return "mesh" if mode == MODE_IN_MESH else "toward_core" if mode == MODE_TOWARD_CORE else "to_member"


class _Run:
    """One run being gathered: its sequence numbers and topics in the order they came, and the rest it needs."""

    __slots__ = ("seqs", "topics", "mixed", "ascending", "size", "filters")

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.topics: list[str] = []
        self.mixed = False
        """the topics differ (else `topics` holds one per publication, all equal)"""
        self.ascending = True
        """every seq came after the one before it (the usual case: no sorting needed)"""
        self.size = 0
        self.filters: set[str] = set()

    def add(self, seq: int, topic: str | None) -> None:
        seqs = self.seqs
        if seqs and seq <= seqs[-1]:
            self.ascending = False
        seqs.append(seq)
        if topic is not None:
            topics = self.topics
            if topics and topic != topics[0]:
                self.mixed = True
            topics.append(topic)

    def extend(self, seqs: list[int] | range, topics: list[str] | None) -> None:
        """`add` for several at once, ascending (one topic each, or None)."""
        mine = self.seqs
        if mine and seqs and seqs[0] <= mine[-1]:
            self.ascending = False
        mine += seqs
        if not topics:
            return
        known = self.topics
        first = known[0] if known else topics[0]
        if not self.mixed and topics.count(first) != len(topics):
            self.mixed = True
        known += topics

    def topic_list(self) -> list[str]:
        """`topics` as written: one for all, or one per publication in the order of the expanded ranges."""
        if not self.mixed:
            return self.topics[:1]
        if self.ascending:
            return self.topics
        by_seq = dict(zip(self.seqs, self.topics, strict=True))
        return [by_seq[seq] for seq in sorted(by_seq)]


class PublicationRuns:
    """The runs of one input, by what their publications share (kind, time, origin, epoch, and the stage's own
    fields), in the order they began."""

    __slots__ = ("_node", "_runs", "_origin_texts", "_delivered_key", "_delivered")

    def __init__(self, node: str) -> None:
        self._node = node
        self._runs: dict[tuple[Any, ...], _Run] = {}
        self._origin_texts: dict[Address, str] = {}
        self._delivered_key: tuple[Any, ...] = ()
        self._delivered: _Run | None = None
        """the run `delivered` added to last (publications delivered one by one mostly follow each other)"""

    def __bool__(self) -> bool:
        return bool(self._runs)

    def _run(self, key: tuple[Any, ...]) -> _Run:
        run = self._runs.get(key)
        if run is None:
            run = self._runs[key] = _Run()
        return run

    # ------------------------------------------------------------ one publication

    def originated(self, now: float, origin: Address, epoch: int, seq: int, topic: str, qos: int, retain: bool,
                   size: int, filters: list[str]) -> None:
        run = self._run((events.PUBLICATIONS_ORIGINATED, now, origin, epoch, qos, retain))
        run.add(seq, topic)
        run.size += size
        run.filters.update(filters)

    def forwarded(self, now: float, origin: Address, epoch: int, seq: int, filter_: str, to: list[str],
                  mode: int) -> None:
        """Copies sent to `to`, in the wire `mode` they went in."""
        self._run((events.PUBLICATIONS_FORWARDED, now, origin, epoch, filter_, tuple(to), mode)).add(seq, None)

    def delivered(self, now: float, origin: Address, epoch: int, seq: int, topic: str, filter_: str | None,
                  hops: int) -> None:
        key = self._delivered_key
        run = self._delivered
        if run is None or key[1] != now or key[3] != epoch or key[5] != hops or key[4] != filter_ \
                or key[2] != origin:
            key = self._delivered_key = (events.PUBLICATIONS_DELIVERED, now, origin, epoch, filter_, hops)
            run = self._delivered = self._run(key)
        run.add(seq, topic)

    def duplicate(self, now: float, origin: Address, epoch: int, seq: int, filter_: str, source: str) -> None:
        self._run((events.DUPLICATES_DROPPED, now, origin, epoch, filter_, source)).add(seq, None)

    # ------------------------------------------------------------ a run at once

    def originated_run(self, now: float, origin: Address, epoch: int, seqs: list[int] | range, topics: list[str],
                       qos: int, retain: bool, size: int, filters: Iterable[str]) -> None:
        """Our publications of one pass, their seqs ascending."""
        run = self._run((events.PUBLICATIONS_ORIGINATED, now, origin, epoch, qos, retain))
        run.extend(seqs, topics)
        run.size += size
        run.filters.update(filters)

    def forwarded_run(self, now: float, origin: Address, epoch: int, seqs: Iterable[int], filter_: str,
                      to: list[str], mode: int) -> None:
        self._run((events.PUBLICATIONS_FORWARDED, now, origin, epoch, filter_, tuple(to), mode)).extend(list(seqs),
                                                                                                  None)

    def delivered_run(self, now: float, origin: Address, epoch: int, seqs: list[int], topics: list[str],
                      filter_: str, hops: int) -> None:
        self._run((events.PUBLICATIONS_DELIVERED, now, origin, epoch, filter_, hops)).extend(seqs, topics)

    def duplicates(self, now: float, origin: Address, epoch: int, seqs: Iterable[int], filter_: str,
                   source: str) -> None:
        self._run((events.DUPLICATES_DROPPED, now, origin, epoch, filter_, source)).extend(list(seqs), None)

    # ------------------------------------------------------------ the events

    def take(self) -> list[Event]:
        """The runs gathered as events, in the order they began; none are left."""
        runs, self._runs = self._runs, {}
        self._delivered = None
        node, texts = self._node, self._origin_texts
        out = []
        for key, run in runs.items():
            kind, now, origin, epoch = key[0], key[1], key[2], key[3]
            origin_text = texts.get(origin)
            if origin_text is None:
                if len(texts) >= 4096:
                    texts.clear()
                origin_text = texts[origin] = str(origin)
            seqs = ranges(run.seqs, run.ascending)
            if kind == events.PUBLICATIONS_DELIVERED:
                out.append(Event(now, node, events.PUBLICATIONS_DELIVERED, {
                    "origin": origin_text, "epoch": epoch, "seqs": seqs, "topics": run.topic_list(),
                    "filter": key[4], "hops": key[5]}))
            elif kind == events.PUBLICATIONS_FORWARDED:
                out.append(Event(now, node, events.PUBLICATIONS_FORWARDED, {
                    "origin": origin_text, "epoch": epoch, "seqs": seqs, "filter": key[4], "to": list(key[5]),
                    "mode": mode_text(key[6])}))
            elif kind == events.PUBLICATIONS_ORIGINATED:
                out.append(Event(now, node, events.PUBLICATIONS_ORIGINATED, {
                    "origin": origin_text, "epoch": epoch, "seqs": seqs, "topics": run.topic_list(), "qos": key[4],
                    "retain": key[5], "bytes": run.size, "filters": sorted(run.filters)}))
            else:
                out.append(Event(now, node, events.DUPLICATES_DROPPED, {
                    "origin": origin_text, "epoch": epoch, "seqs": seqs, "filter": key[4], "source": key[5]}))
        return out


# ---------------------------------------------------------------- reading them back

PER_PUBLICATION_NAMES = {
    events.PUBLICATIONS_ORIGINATED: "publication_originated",
    events.PUBLICATIONS_FORWARDED: "publication_forwarded",
    events.PUBLICATIONS_DELIVERED: "publication_delivered",
    events.DUPLICATES_DROPPED: "duplicate_dropped",
}
"""each run kind, and the version 1 kind of its per-publication events"""


def expand(record: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """One event line (as parsed JSON) as per-publication records: a run event of version 2 gives one record per
    publication, with the version 1 type and fields (`pub` instead of origin, epoch and seqs; `topic` instead of
    `topics`; no `size`); any other line is given as it is. For tools and tests that count by publication."""
    kind = record.get("type")
    single = PER_PUBLICATION_NAMES.get(kind) if isinstance(kind, str) else None
    if single is None:
        yield dict(record)
        return
    shared = {key: value for key, value in record.items()
              if key not in ("type", "origin", "epoch", "seqs", "topics", "bytes")}
    shared["type"] = single
    topics = record.get("topics")
    origin, epoch = record["origin"], record["epoch"]
    index = 0
    for first, last in record["seqs"]:
        for seq in range(first, last + 1):
            item = dict(shared)
            item["pub"] = f"{origin}/{epoch}/{seq}"
            if topics:
                item["topic"] = topics[0] if len(topics) == 1 else topics[index]
            index += 1
            yield item


def expand_all(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`expand` for every record, in order."""
    return [item for record in records for item in expand(record)]
