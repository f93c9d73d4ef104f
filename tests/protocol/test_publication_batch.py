"""`tb`, a run of QoS 0 publications in one packet (federation.protocol.publications, docs/protocol.md rule 7c).

The wire format is strict and its shortcut decodes what the general path decodes; a run handed to the node
gives the same deliveries, counters and per-publication events as the same publications one at a time; runs
fit a datagram; shedding counts every publication a `tb` carried. The shipped scenario
configs/topologies/bursts.yaml runs bursts through cuts and a restart on the simulator
(tests/sim/test_sim_scenarios.py).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import msgpack
import pytest

from federation.daemon.backpressure import is_qos0_publication, qos0_publications
from federation.daemon.broker_items import LogLine, Publication
from federation.daemon.flow_control import report_shed
from federation.protocol import events, wire, wire_decode
from federation.protocol.node import Node
from federation.protocol.publication_events import expand_all
from federation.protocol.publications import batch_item_size
from federation.protocol.types import Address, BrokerId
from federation.protocol.wire import DecodeError, Sender, TopicBatch

from node_harness import Harness, converged_line
from runtime_util import started_wrapper

ORIGIN = Address("127.0.0.10", 10500)
SENDER = Sender(BrokerId(12345, Address("127.0.0.11", 10501)), 4)
BATCH = TopicBatch("bench/#", ORIGIN, 3, wire.MODE_IN_MESH, 2,
                   [5, "bench/t1", b"x" * 64, 6, "bench/\u6e29", b"", wire.MAX_SEQ, "bench/t1", b"\x00\xff"])


def decode_or_fault(data: bytes) -> wire.Packet | tuple[str, str]:
    try:
        return wire.decode(data)
    except DecodeError as error:
        return (error.reason, error.detail)


def decode_general(data: bytes, monkeypatch: pytest.MonkeyPatch) -> wire.Packet | tuple[str, str]:
    with monkeypatch.context() as patch:
        patch.delitem(wire_decode._FAST_PATHS, wire.TOPIC_BATCH)  # the general path alone
        return decode_or_fault(data)


# ------------------------------------------------------------ wire


def test_tb_is_the_documented_layout_and_decodes_to_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    data = wire.encode(wire.TOPIC_BATCH, SENDER, BATCH)
    assert data == msgpack.packb(["tb", 5, [12345, "127.0.0.11", 10501, 4], "bench/#", ["127.0.0.10", 10500], 3,
                                  1, 2, BATCH.items], use_bin_type=True)
    assert wire.packet_type(data) == wire.TOPIC_BATCH and wire.TOPIC_BATCH in wire.DATA_TYPES
    general = decode_general(data, monkeypatch)  # fills the filter and topic memo the shortcut needs
    assert general == wire.Packet(wire.TOPIC_BATCH, SENDER, BATCH)
    assert wire_decode._fast_topic_batch(msgpack.unpackb(data, raw=False)) == general
    assert decode_or_fault(data) == general
    assert len(BATCH) == 3
    assert [m.publication for m in BATCH.messages()] == [(ORIGIN, 3, 5), (ORIGIN, 3, 6), (ORIGIN, 3, wire.MAX_SEQ)]
    assert all(m.qos == 0 and not m.retain and m.properties is None and m.hops == 2 for m in BATCH.messages())
    assert wire.publication_ids_of(data) == [m.publication for m in BATCH.messages()]


def test_publication_ids_of_data_packets_only() -> None:
    message = wire.TopicMessage("a/#", ORIGIN, 7, 9, 0, 0, "a/b", b"", 1, False, None)
    assert wire.publication_ids_of(wire.encode(wire.TOPIC_MESSAGE, SENDER, message)) == [(ORIGIN, 7, 9)]
    assert wire.publication_ids_of(wire.encode(wire.HELLO, SENDER, wire.Hello(1, 2.0))) == []
    assert wire.publication_ids_of(b"\x99\xa2tb garbage") == []


def good_fields() -> list[Any]:
    return ["tb", 5, [1, "h", 1, 1], "a/#", ["h", 1], 0, 0, 0, [1, "a/b", b"p", 2, "a/c", b""]]


BAD: list[tuple[int, Any, str]] = [
    (3, "a/#/b", "bad_filter"), (3, "$SYS/#", "bad_filter"), (4, ["h"], "wrong_type"), (5, -1, "out_of_range"),
    (5, wire.MAX_EPOCH + 1, "out_of_range"), (6, 2, "out_of_range"), (7, 256, "out_of_range"),
    (8, [], "wrong_length"), (8, [1, "a/b"], "wrong_length"),
    (8, "items", "wrong_type"), (8, [-1, "a/b", b""], "out_of_range"),
    (8, [wire.MAX_SEQ + 1, "a/b", b""], "out_of_range"), (8, [True, "a/b", b""], "wrong_type"),
    (8, [1, "a/+", b""], "bad_topic"), (8, [1, 5, b""], "wrong_type"), (8, [1, "a/b", "text"], "wrong_type"),
    (8, [1, "a/b", b"", 2, "a/b", None], "wrong_type"),
]


@pytest.mark.parametrize(("index", "value", "reason"), BAD)
def test_bad_tb_is_dropped_with_a_reason(index: int, value: Any, reason: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(decode_general(msgpack.packb(good_fields(), use_bin_type=True), monkeypatch), wire.Packet)
    fields = good_fields()
    fields[index] = value
    data = msgpack.packb(fields, use_bin_type=True)
    general = decode_general(data, monkeypatch)
    assert isinstance(general, tuple) and general[0] == reason, general
    assert decode_or_fault(data) == general  # the shortcut refuses it too, and the fault is named the same


def test_tb_of_the_wrong_length_is_refused() -> None:
    for fields in (good_fields()[:-1], [*good_fields(), None]):
        assert decode_or_fault(msgpack.packb(fields, use_bin_type=True)) == (
            "wrong_length", f"tb: expected 6 body fields, got {len(fields) - 3}")


def test_a_topic_not_seen_before_is_validated_by_the_general_path() -> None:
    fields = good_fields()
    fields[8] = [1, "fresh/topic/never/seen", b""]
    packet = decode_or_fault(msgpack.packb(fields, use_bin_type=True))
    assert isinstance(packet, wire.Packet) and isinstance(packet.body, TopicBatch)
    assert packet.body.items == [1, "fresh/topic/never/seen", b""]


# ------------------------------------------------------------ shedding


def test_a_tb_is_shed_as_qos0_and_every_publication_in_it_is_counted() -> None:
    data = wire.encode(wire.TOPIC_BATCH, SENDER, BATCH)
    assert wire.plain_topic_message_qos(data) == 0 and is_qos0_publication(data)
    assert qos0_publications(data) == [(m.publication, "bench/#") for m in BATCH.messages()]
    node = Node(ORIGIN, [], 1, random.Random(1))
    node.start(0.0)
    node.events_emitted()
    report_shed(node, "send_buffer_qos0", "send_buffer", data, 1.0)
    assert node.drops["send_buffer_qos0"] == 3
    dropped = [e for e in node.events_emitted() if e.type == events.PUBLICATION_DROPPED]
    assert [e.fields["pub"] for e in dropped] == [events.publication_text(m.publication) for m in BATCH.messages()]
    quiet = Node(ORIGIN, [], 1, random.Random(1), publication_events=False)
    quiet.start(0.0)
    quiet.events_emitted()
    report_shed(quiet, "send_buffer_qos0", "send_buffer", data, 1.0)
    assert quiet.drops["send_buffer_qos0"] == 3 and not quiet.events_emitted()


# ------------------------------------------------------------ the node


RUN = [(f"f/{'ab'[i % 2]}", f"payload {i}".encode()) for i in range(40)]
RUN.insert(7, ("$SYS/broker/x", b"never federated"))


def line_after(publish: str) -> tuple[Harness, list[tuple[bytes, Address, int]]]:
    """RUN published on node 1 of a line of three, as one run or one publication at a time."""
    harness = converged_line(3, 0)
    before = {i: Counter(node.sent_by_type) for i, node in harness.nodes.items()}
    if publish == "run":
        ids = harness.do(1, "local_publish_run", list(RUN))
    else:
        ids = [harness.do(1, "local_publish", topic, payload, 0, False, None) for topic, payload in RUN]
    assert isinstance(ids, list) and ids[7] is None and all(ids[:7]) and all(ids[8:])
    sent: list[tuple[bytes, Address, int]] = []
    original_flush = harness.flush

    def recording_flush(index: int) -> None:
        sent.extend((data, source, target) for _, _, data, source, target in harness.queue)
        original_flush(index)

    sent.extend((data, source, target) for _, _, data, source, target in harness.queue)
    harness.flush = recording_flush  # type: ignore[method-assign]
    harness.run(12.0)
    for i, node in harness.nodes.items():
        node.sent_by_type.subtract(before[i])
    return harness, [item for item in dict.fromkeys(sent)]


def outcome(harness: Harness) -> tuple[Any, ...]:
    delivered = [(i, inj.topic, inj.payload, inj.publication) for i, inj in harness.delivered]
    emitted = Counter((e["node"], e["type"], e.get("pub")) for e in expand_all(harness.events))
    counters = {i: (dict(node.counters), dict(node.drops)) for i, node in harness.nodes.items()}
    return delivered, emitted, counters


def test_a_run_gives_what_the_same_publications_one_at_a_time_give() -> None:
    by_run, _ = line_after("run")
    one_by_one, _ = line_after("one at a time")
    assert outcome(by_run) == outcome(one_by_one)
    delivered = Counter(i for i, _ in by_run.delivered)
    assert delivered == {2: 20, 3: 40}
    assert any(e["type"] == events.PUBLICATIONS_FORWARDED for e in by_run.events)
    for harness, data_type in ((one_by_one, wire.TOPIC_MESSAGE), (by_run, wire.TOPIC_BATCH)):
        sent = {i: +Counter({k: v for k, v in node.sent_by_type.items() if k in wire.DATA_TYPES})
                for i, node in harness.nodes.items()}
        assert set(sent[1]) == set(sent[2]) == {data_type}, sent  # both hops carried runs, or `tm` only
    assert by_run.nodes[1].sent_by_type[wire.TOPIC_BATCH] < 10 <= one_by_one.nodes[1].sent_by_type[wire.TOPIC_MESSAGE]


def test_a_repeated_tb_is_all_duplicates() -> None:
    harness, sent = line_after("run")
    data, source, _target = next(item for item in sent if wire.packet_type(item[0]) == wire.TOPIC_BATCH
                                 and item[2] == 3)
    carried = len(wire.publication_ids_of(data))
    end = harness.nodes[3]
    before = end.counters["duplicates_dropped"]
    harness.delivered.clear()
    harness.events.clear()
    end.receive_packet(data, source, harness.now)
    harness.flush(3)
    assert not harness.delivered
    assert end.counters["duplicates_dropped"] - before == carried > 1
    assert [e["type"] for e in harness.events] == [events.DUPLICATES_DROPPED]  # one event for the run
    assert [e["type"] for e in expand_all(harness.events)] == ["duplicate_dropped"] * carried


def test_runs_are_cut_to_fit_a_datagram_and_a_single_publication_goes_as_tm() -> None:
    harness = converged_line(2, 0)
    first = harness.nodes[1]
    run = [("f/big", bytes([i]) * 200) for i in range(50)] + [("f/huge", b"h" * 5000)]
    first.local_publish_run(run, harness.now)
    out = [data for data, _ in first.packets_to_send()]
    assert {wire.packet_type(d) for d in out} == {wire.TOPIC_BATCH}
    budget = first.settings.max_datagram - 64
    assert all(len(d) <= budget for d in out[:-1]) and len(out) >= 8
    assert wire.decode(out[-1], 1 << 20).body.items == [first.identity.publication_seq, "f/huge", b"h" * 5000]  # alone
    assert sum(len(wire.publication_ids_of(d, 1 << 20)) for d in out) == 51
    first.local_publish_run([("f/one", b"1")], harness.now)
    assert [wire.packet_type(d) for d, _ in first.packets_to_send()] == [wire.TOPIC_MESSAGE]


def test_on_loopback_a_run_of_hundreds_travels_in_one_datagram() -> None:
    """max_datagram 0: nodes whose addresses are all loopback cut runs to 64 KiB, not to 1400 bytes."""
    here, there = Address("127.0.0.1", 10500), Address("127.0.0.2", 10500)
    node = Node(here, [there], 1, random.Random(1), vid=1)
    assert node.settings.max_datagram == 65507
    run = [(f"f/{i % 4}", bytes(64)) for i in range(600)]
    budget = node.settings.max_datagram - 64
    parts = node.outbox.split([(i, topic, payload) for i, (topic, payload) in enumerate(run)], batch_item_size, 100)
    assert len(parts) == 1 and sum(map(batch_item_size, parts[0])) <= budget
    elsewhere = Node(here, [Address("10.0.0.2", 10500)], 1, random.Random(1), vid=1)
    assert elsewhere.settings.max_datagram == 1400
    assert len(elsewhere.outbox.split([(i, t, p) for i, (t, p) in enumerate(run)], batch_item_size, 100)) > 30


def test_the_runtime_hands_plain_runs_of_one_qos_over_in_order() -> None:
    """Plain publications of one QoS in a row are one run (QoS 1/2 ones too: `tq`, rule 7e); a change of QoS,
    retained and property-carrying publications and log lines end a run: order is kept."""

    async def scenario() -> list[tuple[Any, ...]]:
        wrapper = await started_wrapper()
        calls: list[tuple[Any, ...]] = []
        node = wrapper.node
        node.local_publish_run = (  # type: ignore[method-assign]
            lambda run, now, qos=0: calls.append(("run", qos, [t for t, _ in run])) or [None] * len(run))
        node.local_publish = (  # type: ignore[method-assign]
            lambda topic, payload, qos, retain, properties, now: calls.append(("one", topic)))
        try:
            wrapper._on_broker_items([
                Publication("a/1", b"", 0, False, None), Publication("a/2", b"", 0, False, None),
                Publication("a/3", b"", 1, False, None, mid=1), Publication("a/4", b"", 0, False, None),
                Publication("a/5", b"", 0, True, None), Publication("a/6", b"", 0, False, {"content_type": "x"}),
                Publication("a/7", b"", 0, False, None), LogLine("$SYS/broker/log/N", b"x"),
                Publication("a/8", b"", 0, False, None), Publication("a/9", b"", 0, False, None),
                Publication("a/10", b"", 1, False, None, mid=2), Publication("a/11", b"", 1, False, None, mid=3),
                Publication("a/12", b"", 2, False, None, mid=4),
            ])
        finally:
            wrapper.close()
        return calls

    assert asyncio.run(scenario()) == [("run", 0, ["a/1", "a/2"]), ("run", 1, ["a/3"]), ("run", 0, ["a/4"]),
                                       ("one", "a/5"), ("one", "a/6"), ("run", 0, ["a/7"]),
                                       ("run", 0, ["a/8", "a/9"]), ("run", 1, ["a/10", "a/11"]),
                                       ("run", 2, ["a/12"])]
