"""The node's per-publication shortcuts give exactly what the general code gives.

Each shortcut on the publication path (the event log's direct JSON lines,
`wire`'s `tm` encoding and decoding, the node's remembered id and header)
is compared here with the general code it stands in for: the event schema
and the wire format are contracts, so "the same" means byte for byte.
"""

from __future__ import annotations

import enum
import gc
import json
import random
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest

from federation.daemon.event_log import CACHE_LIMIT, EventEncoder, EventLog, EventLogError, encode_event
from federation.protocol import events, wire, wire_decode
from federation.protocol.node import Node
from federation.protocol.types import Address, BrokerId, Event
from federation.protocol.wire import DecodeError, Sender, TopicMessage
from suites.bench.hotpath import STAGES, Pipeline

REPO = Path(__file__).resolve().parents[2]
NODE = "127.0.0.10:10500"
PUB = "127.0.0.10:10500/3/17"


def old_line(event: Event) -> str:
    """The encoding the event log used before `encode_event`: json with compact separators, str() for the rest."""
    return json.dumps(event.to_json_dict(), separators=(",", ":"), default=str)


class Level(enum.IntEnum):
    HIGH = 2


class Text(str):
    pass


HOT_EVENTS: list[tuple[str, dict[str, Any]]] = [
    (events.PUBLICATIONS_ORIGINATED, {"origin": NODE, "epoch": 3, "seqs": [[17, 80]], "topics": ["bench/t0"], "qos": 0,
                                      "retain": False, "bytes": 4096, "filters": ["bench/#"]}),
    (events.PUBLICATIONS_ORIGINATED, {"origin": NODE, "epoch": 3, "seqs": [[17, 17], [19, 20]],
                                      "topics": ["a/b", "a/\u00e9", "a/b"], "qos": 2, "retain": True, "bytes": 0,
                                      "filters": []}),
    (events.PUBLICATIONS_FORWARDED, {"origin": NODE, "epoch": 3, "seqs": [[17, 17]], "filter": "bench/#",
                                     "to": ["127.0.0.11:10500", "[::1]:10500"], "mode": "toward_core"}),
    (events.PUBLICATIONS_FORWARDED, {"origin": NODE, "epoch": 3, "seqs": [[1, 2**63 - 1]], "filter": "bench/#",
                                     "to": ["127.0.0.11:10500"], "mode": "mesh"}),
    (events.PUBLICATIONS_DELIVERED, {"origin": NODE, "epoch": 3, "seqs": [[17, 17]], "topics": ["bench/t3"],
                                     "filter": "bench/#", "hops": 1}),
    (events.PUBLICATION_DROPPED, {"pub": PUB, "filter": "bench/#", "reason": "no_route"}),
    (events.PUBLICATION_DROPPED, {"pub": PUB, "filter": "bench/#", "reason": "send_backlog",
                                  "to": ["127.0.0.11:10500"]}),
    (events.PUBLICATION_DROPPED, {"pub": None, "filter": None, "reason": "too_large", "topic": "big", "size": 70000}),
    (events.DUPLICATES_DROPPED, {"origin": NODE, "epoch": 3, "seqs": [[5, 9], [11, 11]], "filter": "bench/#",
                                 "source": "127.0.0.11:10500"}),
    (events.PUBLICATION_RETRANSMITTED, {"pub": PUB, "filter": "bench/#", "to": "127.0.0.11:10500", "attempt": 1}),
    (events.PACKET_DROPPED, {"reason": "wrong_type", "detail": "tm.qos: expected an integer in [0, 2]",
                             "source": "127.0.0.11:10500", "size": 120, "suppressed": 3}),
    (events.COUNTERS, {"sent": {"tm": [10, 1200]}, "received": {}, "drops": {"max_hops": 1}, "counters": {"x": 2},
                       "clocks": {"127.0.0.11:10500": {"rtt": 0.0012, "offset": -0.5, "error": 0.0006}}}),
    (events.NEIGHBOUR_UP, {"neighbour": "127.0.0.11:10500", "neighbour_id": "7@127.0.0.11:10500", "rtt": 0.001,
                           "clock_offset": 1e-07, "clock_error": 0.0005}),
]

ODD_FIELDS: list[dict[str, Any]] = [
    {"topic": "caf\u00e9/\u6e29\u5ea6/\U0001f600", "filter": "a/\"quoted\"\\back\nline\t\x00"},
    {"topic": Text("subclass"), "to": [Text("x"), "y"]},
    {"level": Level.HIGH, "flag": True, "none": None, "float": 0.1, "big": 2**70, "neg": -3},
    {"to": ["a", 1, None], "nested": [["a"], {"b": 1}], "tuple": ("a", "b"), "empty": []},
    {"bytes": b"\x00\xff", "address": Address("127.0.0.1", 1), "set": frozenset()},
    {"v": 2},  # a field named like the header: it replaces the header's value
    {"type": "other", "node": "elsewhere", "t": 5},
    {"nan": float("nan"), "inf": float("-inf")},
    {},
    {"topic": "\u00e9t\u00e9/\u2603/\ud83d", "to": ["caf\u00e9", "\U0001f600", "a,b", "\"q\"", "back\\slash"]},
    {"topic": "\x00\x01\x1f\x7f\b\f\r\n\t/\u2028\u2029", "filter": "#", "filters": ["\x1b[0m", "\t"]},
    {"topic": "100%s/%d/%%", "percent%s": "%(x)s", "to": ["%s", "%%"], "%": 1},  # the template is a `%`-format
    {"caf\u00e9": "k", "quo\"te": "k", "new\nline": "k", "": "empty name", "%s": "%s"},
    {"to": [Text("x"), "y"], "filters": ["x", Text("y")], "mixed": ["a", 1], "bools": [True, 1, 1.0]},
    {"to": ["a", "b"], "filters": ["a,b"], "pair": ["a", "b"], "lists": [["a"], ["a"]], "set": {"a"}},
    {"qos": True, "size": 1.5, "retain": 0, "hops": Level.HIGH, "flag": False, "none": None, "neg": -0.0},
    {"seqs": [[1, 2], [3, True]], "pairs": [[1, 2, 3]], "floats": [[1, 2.0]], "big": [[-5, 2**70]], "x": [[]]},
    {"seqs": [[1, Level.HIGH]], "mixed": [[1, 2], "a"], "nested": [[[1], 2]], "text": [["a", "b"]]},
]


@pytest.mark.parametrize(("kind", "fields"), HOT_EVENTS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(HOT_EVENTS)])
@pytest.mark.parametrize("time", [1000.25, 1763768723.1234567, 0.0, 12.0000004, -1.5])
def test_hot_event_lines_are_byte_identical(kind: str, fields: dict[str, Any], time: float) -> None:
    event = Event(time, NODE, kind, dict(fields))
    assert encode_event(event) == old_line(event)
    json.loads(encode_event(event))  # and it is one JSON value


@pytest.mark.parametrize("fields", ODD_FIELDS)
@pytest.mark.parametrize("time", [3.5, 7, float("nan"), float("inf"), 1e300])
def test_unusual_events_fall_back_to_the_same_bytes(fields: dict[str, Any], time: float) -> None:
    event = Event(time, NODE, "odd_event", dict(fields))
    assert encode_event(event) == old_line(event)
    odd_node = Event(3.5, "n\u00f6de \"x\"", Text("t\u00ffpe"), dict(fields))
    assert encode_event(odd_node) == old_line(odd_node)


def test_cached_templates_and_texts_follow_every_value() -> None:
    """One encoder, the same node, type and field names, values of changing types: its caches never leak."""
    encoder = EventEncoder()
    shared_time = 1763768723.5
    values: list[Any] = ["a", "\u00e9", 0, 7, True, False, None, 0.5, ["a", "b"], ["a,b"], ["b", "a"], [], ["a", 1],
                         [Text("a"), "b"], [["a"]], {"k": ["a"]}, ("a", "b"), Level.HIGH, 2**70, b"x"]
    for first in values:
        for second in values:
            for time in (shared_time, shared_time, 1763768723.25, -0.0, 0.0, 5):
                event = Event(time, NODE, events.PUBLICATIONS_FORWARDED, {"origin": NODE, "to": first, "mode": second})
                assert encoder.encode(event) == old_line(event)
    mine = Event(1.0, NODE, events.PUBLICATIONS_FORWARDED, {"to": ["a"], "origin": NODE, "mode": "m"})  # reordered
    other = Event(1.0, "127.0.0.11:10500", events.PUBLICATIONS_FORWARDED, {"origin": NODE, "to": ["a"], "mode": "m"})
    assert encoder.encode(mine) == old_line(mine) and encoder.encode(other) == old_line(other)


def test_caches_are_bounded_and_still_exact() -> None:
    encoder = EventEncoder()
    for index in range(3 * CACHE_LIMIT):
        event = Event(float(index), NODE, "odd_event", {f"name{index % (2 * CACHE_LIMIT)}": [f"to{index}", "x"]})
        assert encoder.encode(event) == old_line(event)
        assert len(encoder._templates) <= CACHE_LIMIT and len(encoder._list_texts) <= CACHE_LIMIT


def test_unencodable_events_raise_what_the_json_encoder_raises() -> None:
    circular: list[Any] = ["a"]
    circular.append(circular)
    for fields in ({"to": circular}, {"map": {"to": circular}}):
        with pytest.raises(ValueError, match="Circular reference detected"):
            old_line(Event(1.0, NODE, "odd_event", fields))
        with pytest.raises(ValueError, match="Circular reference detected"):
            encode_event(Event(1.0, NODE, "odd_event", fields))
    for time in (None, "1.0"):
        with pytest.raises(TypeError):
            encode_event(Event(time, NODE, "odd_event", {}))  # type: ignore[arg-type]
    unhashable = Event(1.0, ["n"], "odd_event", {"a": 1})  # type: ignore[arg-type]
    assert encode_event(unhashable) == old_line(unhashable)
    after = Event(1.0, NODE, events.PUBLICATIONS_DELIVERED, {"origin": NODE, "epoch": 3, "seqs": [[1, 1]],
                                                             "topics": ["t"], "filter": "#", "hops": 1})
    assert encode_event(after) == old_line(after)  # nothing stale left behind


def test_event_log_keeps_the_chosen_types_and_counts_lines(tmp_path: Path) -> None:
    kept = [Event(1.0, NODE, events.PUBLICATIONS_DELIVERED, {"origin": NODE, "epoch": 3, "seqs": [[1, 1]],
                                                             "topics": ["t\u00e9"], "filter": "#", "hops": 1}),
            Event(2.0, NODE, events.NODE_STARTED, {})]
    dropped = Event(1.5, NODE, events.PUBLICATIONS_FORWARDED, {"origin": NODE, "epoch": 3, "seqs": [[1, 1]],
                                                               "filter": "#", "to": [], "mode": "mesh"})
    log = EventLog(tmp_path / "sub" / "events.jsonl", frozenset((events.PUBLICATIONS_DELIVERED, events.NODE_STARTED)))
    log.write([kept[0], dropped])
    log.write([])
    log.write([dropped])
    log.write(iter(kept[1:]))
    log.close()
    log.write(kept)  # after close: ignored
    assert (tmp_path / "sub" / "events.jsonl").read_bytes() == "".join(old_line(e) + "\n" for e in kept).encode()
    assert log.lines == 2 and log.errors == 0


def test_an_event_log_that_cannot_be_opened_says_which_and_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(EventLogError, match=r"--event-log: cannot open '.*/file/events.jsonl' for appending: .*; "
                                            r"give a writable file path"):
        EventLog(tmp_path / "file" / "events.jsonl", None)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = subprocess.run([sys.executable, str(REPO / "wrapper.py"), "--bind", f"127.0.0.1:{port}",
                             "--broker", "127.0.0.1:1", "--event-log", str(tmp_path / "file" / "events.jsonl")],
                            capture_output=True, text=True, timeout=20, cwd=REPO)
    assert result.returncode == 2, result.stderr
    assert "cannot open" in result.stderr and "give a writable file path" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("qos", [0, 1])
def test_pipeline_events_and_event_log_file_match_the_old_encoding(qos: int, tmp_path: Path) -> None:
    """The events two real nodes emit for real publications, through `EventLog` into a file."""
    pipeline = Pipeline(qos, b"x" * 64)
    emitted: list[Event] = []
    pipeline.event_sink = emitted.extend  # type: ignore[assignment]
    try:
        for _ in range(3):
            pipeline.run_burst(8, {stage: 0.0 for stage in STAGES})
    finally:
        pipeline.close()
    assert {e.type for e in emitted} >= {events.PUBLICATIONS_ORIGINATED, events.PUBLICATIONS_FORWARDED,
                                         events.PUBLICATIONS_DELIVERED}
    log = EventLog(tmp_path / "events.jsonl", None)
    log.write(emitted)
    log.close()
    written = (tmp_path / "events.jsonl").read_text(encoding="utf-8")
    assert written == "".join(old_line(e) + "\n" for e in emitted)
    assert log.lines == len(emitted)

@pytest.mark.parametrize("qos", [0, 1])
def test_without_publication_events_every_publication_still_arrives_once(qos: int) -> None:
    """`Node.publication_events` off: the same deliveries and counters, none of the per-publication events."""
    counters = []
    kinds = []
    for wanted in (True, False):
        pipeline = Pipeline(qos, b"x" * 16, publication_events=wanted)
        emitted: list[Event] = []
        pipeline.event_sink = emitted.extend  # type: ignore[assignment]
        before = pipeline.b.counters["publications_delivered"]  # the probe that showed the nodes converged
        try:
            for _ in range(4):
                pipeline.run_burst(8, {stage: 0.0 for stage in STAGES})  # raises unless B injects all 8
        finally:
            pipeline.close()
        counters.append({key: (pipeline.a.counters[key], pipeline.b.counters[key])
                         for key in ("publications_originated", "publications_forwarded", "publications_delivered",
                                     "duplicates_dropped")})
        kinds.append({e.type for e in emitted})
        assert pipeline.b.counters["publications_delivered"] - before == 4 * 8
    assert counters[0] == counters[1]
    assert kinds[0] | {events.DUPLICATES_DROPPED} >= events.PER_PUBLICATION
    assert not kinds[1] & events.PER_PUBLICATION


@pytest.mark.parametrize("qos", [0, 1])
def test_remembered_publication_ids_are_not_tracked_by_the_garbage_collector(qos: int) -> None:
    """The duplicate and injection caches hold a node's largest set of long-lived objects; tracked, they would
    make every full collection walk 2 x duplicate_cache_size keys (dedup.seen_key)."""
    pipeline = Pipeline(qos, b"x" * 16)
    try:
        for burst in (1, 8):
            pipeline.run_burst(burst, {stage: 0.0 for stage in STAGES})
    finally:
        pipeline.close()
    gc.collect()
    for node in (pipeline.a, pipeline.b):
        keys = [*node.publications.seen, *node.publications.injected]
        assert len(keys) >= 2 * 9
        assert not [key for key in keys if gc.is_tracked(key)]



# ------------------------------------------------------------ wire: `tm`

ORIGIN = Address("127.0.0.10", 10500)
SENDER = Sender(BrokerId(12345, Address("127.0.0.11", 10501)), 4)


def general_encode(kind: str, sender: Sender, body: TopicMessage) -> bytes:
    """The `tm` layout of docs/protocol.md, built field by field as `wire.encode` did before its shortcut."""
    return msgpack.packb([kind, wire.PROTOCOL_VERSION, [sender.broker_id.vid, sender.broker_id.address.host,
                                                        sender.broker_id.address.port, sender.epoch],
                          body.filter, [body.origin.host, body.origin.port], body.epoch, body.seq, body.mode,
                          body.hops, general_prev(body), body.topic, body.payload, body.qos, body.retain,
                          body.properties],
                         use_bin_type=True)


def general_prev(body: TopicMessage) -> Any:
    """`tm.prev` as docs/protocol.md gives it: nil, the seq of the same epoch, or [epoch, seq]."""
    if body.prev is None:
        return None
    return body.prev[1] if body.prev[0] == body.epoch else list(body.prev)


MESSAGES = [
    TopicMessage("bench/#", ORIGIN, 1, 5, 0, 0, "bench/t1", b"x" * 64, 0, False, None),
    TopicMessage("bench/#", ORIGIN, wire.MAX_EPOCH, wire.MAX_SEQ, 1, 255, "bench/\u6e29", b"", 2, True, None),
    TopicMessage("a/+/c", Address("::1", 1), 0, 0, 1, 3, "a/b/c", b"\x00" * 300, 1, False,
                 {"content_type": "text/plain", "user_property": [["k", "v"]], "message_expiry": 5}),
    TopicMessage("#", Address("h" * 255, 65535), 7, 9, 0, 1, "x", b"p", 0, True, {}),
    TopicMessage("bench/#", ORIGIN, 3, 5, 0, 0, "bench/t1", b"x", 1, False, None, (3, 4)),
    TopicMessage("bench/#", ORIGIN, 3, 5, 1, 2, "bench/t1", b"x", 2, False, None, (2, wire.MAX_SEQ)),
    TopicMessage("bench/#", ORIGIN, 3, 5, 1, 2, "bench/t1", b"x", 1, False, {"content_type": "a"}, (3, 0)),
]


@pytest.mark.parametrize("message", MESSAGES)
def test_tm_encoding_is_the_documented_layout(message: TopicMessage) -> None:
    assert wire.encode(wire.TOPIC_MESSAGE, SENDER, message) == general_encode(wire.TOPIC_MESSAGE, SENDER, message)


def decode_general(data: bytes, monkeypatch: pytest.MonkeyPatch) -> wire.Packet | tuple[str, str]:
    with monkeypatch.context() as patch:
        patch.delitem(wire_decode._FAST_PATHS, wire.TOPIC_MESSAGE)  # the general path alone
        return decode_or_fault(data)


def decode_or_fault(data: bytes) -> wire.Packet | tuple[str, str]:
    try:
        return wire.decode(data)
    except DecodeError as error:
        return (error.reason, error.detail)


@pytest.mark.parametrize("message", MESSAGES)
def test_tm_decoding_matches_the_general_path(message: TopicMessage, monkeypatch: pytest.MonkeyPatch) -> None:
    data = wire.encode(wire.TOPIC_MESSAGE, SENDER, message)
    general = decode_general(data, monkeypatch)  # also fills the filter/topic memo the shortcut needs
    assert general == wire.Packet(wire.TOPIC_MESSAGE, SENDER, message)
    assert decode_or_fault(data) == general
    shortcut = wire_decode._fast_topic_message(msgpack.unpackb(data, raw=False))
    applies = message.properties is None and (message.prev is None or message.prev[0] == message.epoch)
    assert shortcut == (general if applies else None)  # taken when it applies


def _tm_fields() -> list[Any]:
    return msgpack.unpackb(general_encode(wire.TOPIC_MESSAGE, SENDER, MESSAGES[0]), raw=False)


BAD_VALUES: list[tuple[int, Any]] = [
    (1, 1), (1, True), (2, [1, "h", 1]), (2, [-1, "h", 1, 1]), (2, [1, "h", 70000, 1]), (2, [1, 5, 1, 1]),
    (2, [1, "h" * 256, 1, 1]), (2, [1, "h", 1, -5]), (3, "bad/#/filter"), (3, "a/+x"), (3, 7), (4, ["h"]),
    (4, ["h", -1]), (4, [1, 1]), (5, -1), (5, 1.0), (6, -2**63), (7, 2), (7, True), (8, 256),
    (9, -1), (9, 5), (9, 6), (9, "4"), (9, [1]), (9, [1, 2, 3]), (9, [2, 7]), (9, [1, -1]), (9, 1.0),
    (10, "a/#"), (10, "a/\x00"), (10, b"a/b"), (11, "text"), (12, 3), (12, False), (13, 1), (14, {"bad": 1.5}),
    (14, []),
]


@pytest.mark.parametrize(("index", "value"), BAD_VALUES)
def test_bad_tm_faults_are_named_as_before(index: int, value: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    good = msgpack.packb(_tm_fields(), use_bin_type=True)
    assert isinstance(decode_general(good, monkeypatch), wire.Packet)  # the filter and topic are remembered
    fields = _tm_fields()
    fields[index] = value
    data = msgpack.packb(fields, use_bin_type=True)
    general = decode_general(data, monkeypatch)
    assert not isinstance(general, wire.Packet) or index == 14
    assert decode_or_fault(data) == general


def test_tm_of_the_wrong_length_is_refused_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    for fields in (_tm_fields()[:-1], [*_tm_fields(), None]):
        data = msgpack.packb(fields, use_bin_type=True)
        general = decode_general(data, monkeypatch)
        assert general == ("wrong_length", f"tm: expected 12 body fields, got {len(fields) - 3}")
        assert decode_or_fault(data) == general


# ------------------------------------------------------------ node: remembered id and header


def test_sent_header_follows_id_and_epoch_changes() -> None:
    a, b = Address("127.0.0.10", 10500), Address("127.0.0.11", 10500)
    node = Node(a, [b], 1, random.Random(1), vid=5)
    node.start(0.0)
    first = node.broker_id
    assert first == BrokerId(5, a) and node.broker_id is first
    node.packets_to_send()
    message = TopicMessage("x/#", a, 1, 1, 0, 0, "x/y", b"p", 0, False, None)
    node.outbox.send(wire.TOPIC_MESSAGE, message, [b])
    assert wire.decode(node.packets_to_send()[0][0]).sender == Sender(BrokerId(5, a), 1)
    node.identity.renumber(9)  # as the table does after an id collision
    node.identity.jump_epoch(3)  # and when an older life announced a newer epoch
    assert node.broker_id == BrokerId(9, a)
    node.outbox.send(wire.TOPIC_MESSAGE, message, [b])
    assert wire.decode(node.packets_to_send()[0][0]).sender == Sender(BrokerId(9, a), 3)
    assert node.view().broker_id == BrokerId(9, a)


def test_originated_and_forwarded_tm_carry_mode_and_hops() -> None:
    """A's `tm` for a local publication goes toward the core with hops 0, as the message it made."""
    pipeline = Pipeline(0, b"x" * 8)
    try:
        pipeline.a.local_publish("bench/one", b"payload", 0, False, None, pipeline.now)
        sent = pipeline.a.packets_to_send()
        emitted = pipeline.a.events_emitted()
    finally:
        pipeline.close()
    assert len(sent) == 1
    packet = wire.decode(sent[0][0])
    body = packet.body
    assert isinstance(body, TopicMessage)
    assert (body.filter, body.mode, body.hops, body.topic, body.payload) == \
        ("bench/#", wire.MODE_TOWARD_CORE, 0, "bench/one", b"payload")
    assert packet.sender == Sender(pipeline.a.broker_id, pipeline.a.epoch)
    assert [e.type for e in emitted] == [events.PUBLICATIONS_ORIGINATED, events.PUBLICATIONS_FORWARDED]
    seq = body.seq
    assert emitted[0].fields == {"origin": str(pipeline.a.address), "epoch": pipeline.a.epoch, "seqs": [[seq, seq]],
                                 "topics": ["bench/one"], "qos": 0, "retain": False, "bytes": 7,
                                 "filters": ["bench/#"]}
    assert emitted[1].fields == {"origin": str(pipeline.a.address), "epoch": pipeline.a.epoch, "seqs": [[seq, seq]],
                                 "filter": "bench/#", "to": [str(sent[0][1])], "mode": "toward_core"}
