"""`tq` and `tk`: runs of QoS 1/2 publications and their acknowledgements in one packet (docs/protocol.md rule 7e).

The wire format is strict and its shortcut decodes what the general path decodes; a run handed to the node gives
the same deliveries, custody releases, counters and events as the same publications one at a time, in fewer
packets; a lost run is retransmitted as a run and delivered once; acknowledgements owed together leave together.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import msgpack
import pytest

from federation.daemon.backpressure import is_qos0_publication, qos0_publications
from federation.protocol import events, wire, wire_decode
from federation.protocol.custody import Custody
from federation.protocol.node import Node
from federation.protocol.publication_events import expand_all
from federation.protocol.types import Address, BrokerId
from federation.protocol.wire import DecodeError, Sender, TopicAcks, TopicReliableBatch

from node_harness import Harness, address, converged_line

ORIGIN = Address("127.0.0.10", 10500)
SENDER = Sender(BrokerId(12345, Address("127.0.0.11", 10501)), 4)
RUN = TopicReliableBatch("bench/#", ORIGIN, 3, wire.MODE_IN_MESH, 2, 1,
                         [5, None, "bench/t1", b"x" * 64, 6, 5, "bench/\u6e29", b"", 9, [2, 40], "bench/t1", b"\x00"])
ACKS = TopicAcks("bench/#", ORIGIN, 3, [5, 6, wire.MAX_SEQ])


def decode_or_fault(data: bytes) -> wire.Packet | tuple[str, str]:
    try:
        return wire.decode(data)
    except DecodeError as error:
        return (error.reason, error.detail)


def decode_general(data: bytes, monkeypatch: pytest.MonkeyPatch) -> wire.Packet | tuple[str, str]:
    with monkeypatch.context() as patch:
        patch.delitem(wire_decode._FAST_PATHS, wire.TOPIC_RELIABLE_BATCH)  # the general path alone
        patch.delitem(wire_decode._FAST_PATHS, wire.TOPIC_ACKS)
        return decode_or_fault(data)


# ------------------------------------------------------------ wire


def test_tq_is_the_documented_layout_and_decodes_to_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    data = wire.encode(wire.TOPIC_RELIABLE_BATCH, SENDER, RUN)
    assert data == msgpack.packb(["tq", 5, [12345, "127.0.0.11", 10501, 4], "bench/#", ["127.0.0.10", 10500], 3,
                                  1, 2, 1, RUN.items], use_bin_type=True)
    assert wire.packet_type(data) == wire.TOPIC_RELIABLE_BATCH and wire.TOPIC_RELIABLE_BATCH in wire.DATA_TYPES
    general = decode_general(data, monkeypatch)
    assert general == wire.Packet(wire.TOPIC_RELIABLE_BATCH, SENDER, RUN)
    assert decode_or_fault(data) == general
    assert len(RUN) == 3
    messages = RUN.messages()
    assert [m.publication for m in messages] == [(ORIGIN, 3, 5), (ORIGIN, 3, 6), (ORIGIN, 3, 9)]
    assert [m.prev for m in messages] == [None, (3, 5), (2, 40)]
    assert all(m.qos == 1 and not m.retain and m.properties is None and m.hops == 2 for m in messages)
    assert wire.publication_ids_of(data) == [m.publication for m in messages]
    # Every item's `prev` is as a `tm` writes it: `reliable_items` gives the items back from the messages.
    assert wire.reliable_items(messages) == RUN.items
    assert all(wire.reliable_item_size(m) >= len(msgpack.packb(RUN.items[4 * i:4 * i + 4])) - 1
               for i, m in enumerate(messages))


def test_the_shortcut_decodes_a_plain_run_as_the_general_path_does(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = TopicReliableBatch("bench/#", ORIGIN, 3, 0, 0, 2, [5, None, "bench/t1", b"a", 6, 5, "bench/t1", b"b"])
    data = wire.encode(wire.TOPIC_RELIABLE_BATCH, SENDER, plain)
    general = decode_general(data, monkeypatch)  # fills the filter and topic memo the shortcut needs
    assert wire_decode._fast_reliable_batch(msgpack.unpackb(data, raw=False)) == general
    acks = wire.encode(wire.TOPIC_ACKS, SENDER, ACKS)
    assert decode_general(acks, monkeypatch) == wire.Packet(wire.TOPIC_ACKS, SENDER, ACKS)
    assert wire_decode._fast_topic_acks(msgpack.unpackb(acks, raw=False)) == decode_or_fault(acks)


def good_tq() -> list[Any]:
    return ["tq", 5, [1, "h", 1, 1], "a/#", ["h", 1], 7, 0, 0, 1, [1, None, "a/b", b"p", 2, 1, "a/c", b""]]


BAD_TQ: list[tuple[int, Any, str]] = [
    (3, "a/#/b", "bad_filter"), (3, "$share/g/a/#", "bad_filter"), (4, ["h"], "wrong_type"),
    (5, wire.MAX_EPOCH + 1, "out_of_range"), (6, 2, "out_of_range"), (7, 256, "out_of_range"),
    (8, 0, "out_of_range"), (8, 3, "out_of_range"),
    (9, [], "wrong_length"), (9, [1, None, "a/b"], "wrong_length"), (9, "items", "wrong_type"),
    (9, [-1, None, "a/b", b""], "out_of_range"), (9, [wire.MAX_SEQ + 1, None, "a/b", b""], "out_of_range"),
    (9, [5, 5, "a/b", b""], "wrong_type"), (9, [5, 9, "a/b", b""], "wrong_type"),
    (9, [5, [7, 5], "a/b", b""], "wrong_type"), (9, [5, [wire.MAX_EPOCH + 1, 1], "a/b", b""], "out_of_range"),
    (9, [5, "x", "a/b", b""], "wrong_type"), (9, [1, None, "a/+", b""], "bad_topic"),
    (9, [1, None, "a/b", "text"], "wrong_type"),
]


@pytest.mark.parametrize(("index", "value", "reason"), BAD_TQ)
def test_bad_tq_is_dropped_with_a_reason(index: int, value: Any, reason: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(decode_general(msgpack.packb(good_tq(), use_bin_type=True), monkeypatch), wire.Packet)
    fields = good_tq()
    fields[index] = value
    data = msgpack.packb(fields, use_bin_type=True)
    general = decode_general(data, monkeypatch)
    assert isinstance(general, tuple) and general[0] == reason, general
    assert decode_or_fault(data) == general  # the shortcut refuses it too, and the fault is named the same


def good_tk() -> list[Any]:
    return ["tk", 5, [1, "h", 1, 1], "a/#", ["h", 1], 7, [1, 2, 3], [["h", 2]]]


def test_a_good_tk_names_its_reach() -> None:
    packet = decode_or_fault(msgpack.packb(good_tk(), use_bin_type=True))
    assert isinstance(packet, wire.Packet)
    assert packet.body == TopicAcks("a/#", Address("h", 1), 7, [1, 2, 3], (Address("h", 2),))


@pytest.mark.parametrize(("index", "value", "reason"), [
    (3, "a/#/b", "bad_filter"), (4, "h", "wrong_type"), (5, -1, "out_of_range"), (6, [], "wrong_length"),
    (6, [1, -2], "out_of_range"), (6, [1, "2"], "wrong_type"), (6, 3, "wrong_type"), (7, "h", "wrong_type"),
    (7, [["h", -1]], "out_of_range"), (7, [["h"]], "wrong_type"),
])
def test_bad_tk_is_dropped_with_a_reason(index: int, value: Any, reason: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fields = good_tk()
    fields[index] = value
    data = msgpack.packb(fields, use_bin_type=True)
    general = decode_general(data, monkeypatch)
    assert isinstance(general, tuple) and general[0] == reason, general
    assert decode_or_fault(data) == general


def test_a_tk_may_name_a_shared_filter_as_ta_does() -> None:
    data = msgpack.packb(["tk", 5, [1, "h", 1, 1], "$share/g/a/#", ["h", 1], 7, [4], []], use_bin_type=True)
    packet = decode_or_fault(data)
    assert isinstance(packet, wire.Packet) and packet.body == TopicAcks("$share/g/a/#", Address("h", 1), 7, [4])


def test_a_tq_is_never_shed_as_qos0() -> None:
    data = wire.encode(wire.TOPIC_RELIABLE_BATCH, SENDER, RUN)
    assert not is_qos0_publication(data) and qos0_publications(data) == []


# ------------------------------------------------------------ the node

PLAIN = [(f"f/{'ab'[i % 2]}", f"payload {i}".encode()) for i in range(40)]


def publish(harness: Harness, how: str, qos: int = 1) -> list[Any]:
    node = harness.nodes[1]
    if how == "run":
        ids = node.local_publish_run(list(PLAIN), harness.now, qos=qos)
    else:
        ids = [node.local_publish(topic, payload, qos, False, None, harness.now) for topic, payload in PLAIN]
    harness.flush(1)
    return ids


def line_after(how: str, qos: int = 1) -> tuple[Harness, dict[int, Counter[str]]]:
    harness = converged_line(3, 1)
    before = {i: Counter(node.sent_by_type) for i, node in harness.nodes.items()}
    ids = publish(harness, how, qos)
    assert all(ids) and len(ids) == len(PLAIN)
    harness.run(12.0)
    sent = {i: Counter(node.sent_by_type) - before[i] for i, node in harness.nodes.items()}
    return harness, sent


def outcome(harness: Harness) -> tuple[Any, ...]:
    delivered = [(i, inj.topic, inj.payload, inj.qos, inj.publication) for i, inj in harness.delivered]
    emitted = Counter((e["node"], e["type"], e.get("pub")) for e in expand_all(harness.events))
    counters = {i: ({k: v for k, v in node.counters.items() if k != "acks"}, dict(node.drops))
                for i, node in harness.nodes.items()}
    return delivered, emitted, sorted(harness.released), counters


@pytest.mark.parametrize("qos", [1, 2])
def test_a_reliable_run_gives_what_the_same_publications_one_at_a_time_give(qos: int) -> None:
    by_run, sent_run = line_after("run", qos)
    one_by_one, sent_one = line_after("one at a time", qos)
    assert outcome(by_run) == outcome(one_by_one)
    assert Counter(i for i, _ in by_run.delivered) == {2: 20, 3: 40}
    assert len(by_run.released) == 40  # every publication delivered everywhere: custody released at the origin
    assert all(node.custody.status()["open"] == 0 and not node.reliable.unacked for node in by_run.nodes.values())
    # The same acknowledgements were counted (one per (publication, filter) and hop: f/a publications travel on
    # f/a and f/#); they travelled as `tk` in a few packets.
    acks = sum(n.counters["acks"] for n in by_run.nodes.values())
    assert acks == sum(n.counters["acks"] for n in one_by_one.nodes.values()) and acks >= 100
    assert sent_run[1][wire.TOPIC_RELIABLE_BATCH] >= 1 and sent_run[2][wire.TOPIC_RELIABLE_BATCH] >= 1
    assert sent_run[1][wire.TOPIC_MESSAGE] == sent_run[2][wire.TOPIC_MESSAGE] == 0
    assert sent_one[1][wire.TOPIC_MESSAGE] == 60 and sent_one[1][wire.TOPIC_RELIABLE_BATCH] == 0  # f/a ones twice
    acks_run = sent_run[2][wire.TOPIC_ACK] + sent_run[2][wire.TOPIC_ACKS] + sent_run[3][wire.TOPIC_ACK] \
        + sent_run[3][wire.TOPIC_ACKS]
    assert sent_run[3][wire.TOPIC_ACKS] >= 1 and acks_run <= 10


def test_the_run_is_chained_so_each_receiver_injects_it_in_order() -> None:
    harness = converged_line(3, 1)
    node = harness.nodes[1]
    node.local_publish_run(list(PLAIN), harness.now, qos=1)
    packets = [wire.decode(data).body for data, _ in node.packets_to_send()]
    runs = [body for body in packets if isinstance(body, TopicReliableBatch)]
    assert {run.filter for run in runs} == {"f/a", "f/#"}  # node 2 subscribes f/a, node 3 f/#
    for filter_, count in (("f/#", 40), ("f/a", 20)):
        messages = [m for run in runs if run.filter == filter_ for m in run.messages()]
        assert len(messages) == count and messages[0].prev is None
        for before, after in zip(messages, messages[1:], strict=False):
            assert after.prev == (before.epoch, before.seq)  # each names the one before it on its filter


class LossyHarness(Harness):
    """Loses the first `tq` it sees from node 1."""

    lost = 0

    def lose(self, data: bytes, source: Address, target: int) -> bool:
        if source == address(1) and wire.packet_type(data) == wire.TOPIC_RELIABLE_BATCH and not self.lost:
            self.lost += 1
            return True
        return False


def test_a_lost_run_is_sent_again_as_a_run_and_delivered_once() -> None:
    harness = LossyHarness([(1, 2)])
    harness.do(2, "local_subscribe", "end", "f/#", 1)
    harness.run(10.0)
    harness.do(1, "local_publish", "f/probe", b"probe", 1, False, None)
    harness.run(11.0)
    harness.delivered.clear()
    harness.events.clear()
    before = Counter(harness.nodes[1].sent_by_type)
    harness.nodes[1].local_publish_run(list(PLAIN), harness.now, qos=1)
    harness.flush(1)
    harness.run(20.0)
    assert harness.lost == 1
    assert sorted(inj.payload for _, inj in harness.delivered) == sorted(payload for _, payload in PLAIN)
    origin = harness.nodes[1]
    assert origin.counters["retransmissions"] == 40 and not origin.reliable.unacked
    sent = Counter(origin.sent_by_type) - before
    # The run is cut in two to fit 1400-byte datagrams; the first is lost, and the second's publications wait
    # in the receiver's stream for it (rule 7d), unacknowledged: both are sent again, as runs.
    assert sent[wire.TOPIC_RELIABLE_BATCH] == 4 and sent[wire.TOPIC_MESSAGE] == 0
    end = harness.nodes[2].counters
    assert end["retransmissions_absorbed"] + end["duplicates_dropped"] == 7  # the second run came twice
    retransmitted = [e for e in harness.events if e["type"] == events.PUBLICATION_RETRANSMITTED]
    assert len(retransmitted) == 40


def test_a_repeated_tq_is_acknowledged_and_nothing_is_injected_twice() -> None:
    harness = converged_line(2, 1)
    origin, end = harness.nodes[1], harness.nodes[2]
    origin.local_publish_run(list(PLAIN), harness.now, qos=1)
    packets = [(data, target) for data, target in origin.packets_to_send()]
    runs = [data for data, _ in packets if wire.packet_type(data) == wire.TOPIC_RELIABLE_BATCH]
    for data in runs:
        end.receive_packet(data, origin.address, harness.now)
    harness.flush(2)
    assert len(harness.delivered) == 40
    end.packets_to_send()
    for data in runs:  # the origin sends them again (its acknowledgements were lost, say)
        end.receive_packet(data, origin.address, harness.now)
    again = [wire.decode(data).body for data, _ in end.packets_to_send()]
    assert len(harness.delivered) == 40 and not end.injections_to_make()
    # Acknowledged at once: 40 publications on f/# (node 2's f/a is covered by its f/#: not federated on its own).
    assert sum(len(body.seqs) for body in again if isinstance(body, TopicAcks)) == 40


def receiver_after(runs: list[bytes], first: bytes | None) -> tuple[list[bytes], list[int], dict[str, int]]:
    """Node 2 of a converged line takes `first` (if any), then `runs`: what it injected, the f/# seqs it
    acknowledged, its drops."""
    harness = converged_line(2, 1)
    end = harness.nodes[2]
    for data in ([first] if first is not None else []) + runs:
        end.receive_packet(data, harness.nodes[1].address, harness.now)
    harness.flush(2)  # injected, reported done, and the acknowledgements queued for node 1
    acked = sorted(seq for _at, _n, data, _source, _target in harness.queue
                   if wire.packet_type(data) == wire.TOPIC_ACKS
                   for body in [wire.decode(data).body] if isinstance(body, TopicAcks) and body.filter == "f/#"
                   for seq in body.seqs)
    return [inj.payload for _, inj in harness.delivered], acked, dict(end.drops)


def test_a_run_partly_taken_before_gives_what_a_run_all_new_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    # All new: each run is taken at once. Ten of a run seen before (that `tq` cut short, then the whole): those are
    # acknowledged as repeats and the rest of that run taken one by one. Both end the same way.
    taken_at_once: list[int] = []
    open_run = Custody.open_run
    def counted(self: Custody, messages: list[Any], upstream: Address) -> Any:
        opened = open_run(self, messages, upstream)
        if opened is not None:
            taken_at_once.append(len(opened))
        return opened

    monkeypatch.setattr(Custody, "open_run", counted)
    origin = converged_line(2, 1).nodes[1]
    origin.local_publish_run(list(PLAIN), 11.0, qos=1)
    runs = [data for data, _ in origin.packets_to_send() if wire.packet_type(data) == wire.TOPIC_RELIABLE_BATCH]
    whole = next(body for data in runs for body in [wire.decode(data).body]
                 if isinstance(body, TopicReliableBatch) and body.filter == "f/#")
    short = TopicReliableBatch(whole.filter, whole.origin, whole.epoch, whole.mode, whole.hops, whole.qos,
                               whole.items[:4 * 10])
    first = wire.encode(wire.TOPIC_RELIABLE_BATCH, wire.decode(runs[0]).sender, short)
    all_new = receiver_after(runs, None)
    assert sorted(taken_at_once) == [7, 33]  # f/# cut in two to fit datagrams: each taken at once (f/a is covered)
    taken_at_once.clear()
    partly = receiver_after(runs, first)
    assert sorted(taken_at_once) == [7, 10]  # all but the first f/# run, whose new 23 are taken one by one
    assert sorted(all_new[0]) == sorted(partly[0]) == sorted(payload for _, payload in PLAIN)
    assert all_new[1] == sorted(set(all_new[1])) and len(all_new[1]) == 40
    # The ten came again before their injection ended: their one acknowledgement, still owed, covers both copies.
    assert partly[1] == all_new[1]
    assert all_new[2] == partly[2] == {}


def test_a_tk_naming_copies_we_do_not_wait_for_counts_them_unmatched() -> None:
    node = Node(address(1), [address(2)], 1, random.Random(1))
    node.start(0.0)
    data = wire.encode(wire.TOPIC_ACKS, Sender(BrokerId(2, address(2)), 1), TopicAcks("f/#", address(1), 1, [1, 2]))
    node.receive_packet(data, address(2), 0.1)
    assert node.counters["acks_unmatched"] == 2 and node.counters["acks"] == 0


def test_acknowledgements_owed_together_leave_in_one_tk_cut_to_fit_a_datagram() -> None:
    node = Node(address(1), [address(2)], 1, random.Random(1))
    node.start(0.0)
    node.packets_to_send()
    for seq in range(1, 2001):
        node.outbox.acknowledge(address(2), "f/#", address(3), 7, seq)
    node.outbox.acknowledge(address(2), "g/#", address(3), 7, 5)
    packets = node.packets_to_send()
    bodies = [wire.decode(data).body for data, _ in packets]
    assert all(len(data) <= node.settings.max_datagram - 64 for data, _ in packets)
    tk = [body for body in bodies if isinstance(body, TopicAcks)]
    assert len(tk) >= 2 and [seq for body in tk for seq in body.seqs] == list(range(1, 2001))
    assert bodies[-1] == wire.TopicAck("g/#", address(3), 7, 5)  # one alone is a plain `ta`
