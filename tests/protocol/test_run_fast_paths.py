"""The run-at-a-time paths of QoS 0 publications (federation.protocol.publications): numbering and sending a run
whose publications share their filters (`_number_run`, `originate_run`), and taking a `tb` whose publications are
all new (`_take_whole_batch`), give exactly what the one-at-a-time loops give: the same deliveries, events,
counters, drops, duplicate caches and order positions, whatever the run holds (duplicates, late publications,
`$` topics, topics wanted here and not)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.protocol import publications as publications_module
from federation.protocol import wire
from federation.protocol.dedup import SeenCache
from federation.protocol.publication_events import expand_all
from federation.protocol.publications import Publications
from federation.protocol.wire import TopicBatch

from node_harness import Harness, converged_line


def state(harness: Harness, index: int) -> tuple[Any, ...]:
    """Everything a node's handling of publications leaves behind."""
    node = harness.nodes[index]
    publications = node.publications
    return (
        [(i, inj.topic, inj.payload, inj.qos, inj.publication, inj.filter) for i, inj in harness.delivered],
        [json.dumps(event, sort_keys=True, default=str) for event in expand_all(harness.events)],
        {i: (dict(n.counters), dict(n.drops)) for i, n in harness.nodes.items()},
        (set(publications.seen), publications.seen.evictions, set(publications.injected)),
        dict(publications.ordering.qos0),
        node.identity.publication_seq,
    )


def one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run paths off: every run takes the loops."""
    monkeypatch.setattr(Publications, "_take_whole_batch", lambda *args: False)
    monkeypatch.setattr(Publications, "_originate_uniform_run", lambda *args: None)
    monkeypatch.setattr(publications_module, "_none_system", lambda topics: False)
    original_add_all = SeenCache.add_all
    monkeypatch.setattr(SeenCache, "add_all", lambda cache, keys: [cache.add(key) for key in keys] and None)
    assert original_add_all is not SeenCache.add_all


def publish_runs(runs: list[list[tuple[str, bytes]]]) -> Harness:
    harness = converged_line(3, 0)
    for run in runs:
        harness.do(1, "local_publish_run", run)
        harness.run(harness.now + 1.0)
    return harness


RUNS = [
    [(f"f/{'bc'[i % 2]}", f"{i}".encode()) for i in range(30)],  # one filter (f/#)
    [("f/a", f"a{i}".encode()) for i in range(25)],  # two filters (f/# and f/a): keys interleaved
    [(f"f/{'ab'[i % 2]}", b"mixed") for i in range(20)],  # filters differ: the loop
    [("f/b", b"x"), ("$SYS/y", b"never"), ("f/c", b"y")],  # a `$` topic: the loop
]


def test_runs_of_our_publications_give_what_the_loops_give(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = publish_runs(RUNS)
    with monkeypatch.context() as patch:
        one_at_a_time(patch)
        slow = publish_runs(RUNS)
    assert [state(fast, i) for i in (1, 2, 3)] == [state(slow, i) for i in (1, 2, 3)]
    delivered = Counter(i for i, _ in fast.delivered)
    assert delivered == {2: 25 + 10, 3: 30 + 25 + 20 + 2}


def test_a_run_past_a_generation_of_the_caches_gives_what_the_loops_give(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs longer than what is left of a cache generation: `add_all` adds one at a time."""
    runs = [[(f"f/{'bc'[i % 2]}", b"p") for i in range(700)] for _ in range(3)]
    monkeypatch.setattr(publications_module.Publications, "__init__", _small_caches(Publications.__init__))
    fast = publish_runs(runs)
    with monkeypatch.context() as patch:
        one_at_a_time(patch)
        slow = publish_runs(runs)
    assert state(fast, 3) == state(slow, 3)
    assert fast.nodes[3].publications.seen.evictions > 0


def _small_caches(init: Any) -> Any:
    def small(self: Publications, *args: Any) -> None:
        init(self, *args)
        self.seen = SeenCache(1024)
        self.injected = SeenCache(1024)
    return small


def a_tb_from_node_2(harness: Harness) -> tuple[wire.Packet, Any]:
    """A `tb` node 2 sent node 3 (its sender and filter, to forge others like it)."""
    run = [(f"f/{'bc'[i % 2]}", b"p") for i in range(8)]
    sent: list[tuple[bytes, Any]] = []
    original = harness.flush

    def recording(index: int) -> None:
        node = harness.nodes.get(index)
        if index == 2 and node is not None:
            packets = node.packets_to_send()
            sent.extend(packets)
            node.outbox.packets.extend(packets)
        original(index)
    harness.flush = recording  # type: ignore[method-assign]
    harness.do(1, "local_publish_run", run)
    harness.run(harness.now + 1.0)
    harness.flush = original  # type: ignore[method-assign]
    end = harness.nodes[3].address
    data = next(d for d, target in sent if wire.packet_type(d) == wire.TOPIC_BATCH and target == end)
    return wire.decode(data), harness.nodes[2].address


TOPICS = ["f/b", "f/a", "g/x", "$SYS/x", "f/c"]
BATCHES = st.lists(st.lists(st.tuples(st.integers(1, 40), st.sampled_from(TOPICS)), min_size=1, max_size=12),
                   min_size=1, max_size=6)


def feed(batches: list[list[tuple[int, str]]], fast: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    harness = converged_line(3, 0)
    packet, source = a_tb_from_node_2(harness)
    harness.delivered.clear()
    harness.events.clear()
    with monkeypatch.context() as patch:
        if not fast:
            one_at_a_time(patch)
        end = harness.nodes[3]
        base: TopicBatch = packet.body
        for batch in batches:
            items = [field for seq, topic in batch for field in (seq + 1000, topic, topic.encode())]
            body = TopicBatch(base.filter, base.origin, base.epoch, base.mode, base.hops, items)
            end.receive_packet(wire.encode(wire.TOPIC_BATCH, packet.sender, body), source, harness.now)
            harness.flush(3)
            harness.now += 0.01
    return state(harness, 3)


@settings(max_examples=40, deadline=None)
@given(BATCHES)
def test_any_tb_gives_what_the_loop_gives(batches: list[list[tuple[int, str]]]) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert feed(batches, True, monkeypatch) == feed(batches, False, monkeypatch)


def test_the_usual_tb_takes_the_run_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """New publications wanted here, in time: taken whole (and a repeat of them goes to the loop, all
    duplicates)."""
    taken: list[bool] = []
    original = Publications._take_whole_batch

    def recording(self: Publications, *args: Any) -> bool:
        taken.append(original(self, *args))
        return taken[-1]
    monkeypatch.setattr(Publications, "_take_whole_batch", recording)
    batch = [(seq, "f/b") for seq in range(1, 10)]
    result = feed([batch, batch, [(seq, "g/x") for seq in range(20, 25)]], True, monkeypatch)
    assert taken[-3:] == [True, False, True]  # (before them: the set-up's own runs)
    delivered, emitted = result[0], result[1]
    assert len(delivered) == 9
    assert Counter(json.loads(event)["type"] for event in emitted)["duplicate_dropped"] == 9


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3000), max_size=80), st.integers(0, 200), st.integers(0, 40))
def test_cut_finds_the_runs_split_finds(sizes: list[int], header: int, each: int) -> None:
    """`Outbox.cut` (a running sum and binary searches) cuts where `Outbox.split` (an item at a time) does, an item
    larger than a datagram alone in its run."""
    outbox = converged_line(2, 0).nodes[1].outbox
    items = list(enumerate(sizes))
    runs = outbox.split(items, lambda item: item[1] + each, header)
    assert [[index for index, _size in run] for run in runs] == \
        [list(range(start, stop)) for start, stop in outbox.cut(sizes, header, each)]
