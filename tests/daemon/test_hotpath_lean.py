"""The adapter's lean paho paths (federation/daemon/lean_client.py `LeanClient`) agree with paho's own.

No broker: a Unix socket pair stands in for the TCP connection, so the
bytes paho writes and reads are exactly what a broker would see. The same
bytes, cut into the same reads, go to the adapter driven by a loop (the
lean path) and to one without (paho's `on_message` path); the items handed
over and the bytes written back must be the same.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator, Sequence

import paho.mqtt.client as mqtt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from federation.daemon import publish_packets
from federation.daemon.broker import BrokerAdapter
from federation.daemon.broker_items import BrokerItem, LogLine, Publication, PublicationRun
from federation.daemon.mqtt_runs import append_qos0_run, append_qos0_run_python
from federation.protocol.types import Address, Injection
from suites.bench.hotpath import main as hotpath_main
from suites.bench.hotpath import publish_packet

from mqtt_bytes import acknowledgements, adapter_on_socketpair, one_per_publication, read_all, split_packets

BROKER = Address("127.0.0.1", 1883)


@pytest.fixture
def adapter() -> Iterator[tuple[BrokerAdapter, socket.socket, list[BrokerItem]]]:
    items: list[BrokerItem] = []
    with adapter_on_socketpair("lean-test", one_per_publication(items)) as (adapter, peer):
        yield adapter, peer, items


def _acknowledge(adapter: BrokerAdapter, items: Sequence[BrokerItem]) -> None:
    """What the runtime does once its node has taken a pass's items: acknowledge the QoS 1/2 ones."""
    adapter.acknowledge(acknowledgements(items))


def test_a_burst_of_publishes_in_one_read_yields_every_publication_in_order(adapter) -> None:  # type: ignore[no-untyped-def]
    adapter_, peer, items = adapter
    packets = [publish_packet(f"a/{i}", bytes([i % 256]) * i, i % 2, i + 1) for i in range(300)]
    packets.insert(5, publish_packet("$SYS/broker/log/N", b"line", 0, 0))
    peer.sendall(b"".join(packets))
    adapter_.reading.on_readable()
    while adapter_.client.buffered():  # more than MAX_PACKETS_PER_WAKEUP: the adapter scheduled another pass
        adapter_.reading.on_readable()
    publications = [item for item in items if isinstance(item, Publication)]
    assert [(p.topic, p.payload, p.qos, p.retain, p.properties) for p in publications] == \
        [(f"a/{i}", bytes([i % 256]) * i, i % 2, False, None) for i in range(300)]
    assert items[5] == LogLine("$SYS/broker/log/N", b"line")
    assert read_all(peer) == b""  # acknowledged by the runtime, once its node has taken them
    _acknowledge(adapter_, items)
    acks = read_all(peer)  # a PUBACK (40 02 mid) for every QoS 1 publication, as paho sends them
    assert acks == b"".join(bytes([0x40, 2]) + (i + 1).to_bytes(2, "big") for i in range(300) if i % 2)


def test_a_publish_with_properties_or_qos2_takes_pahos_path(adapter) -> None:  # type: ignore[no-untyped-def]
    adapter_, peer, items = adapter
    properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    properties.ContentType = "text/plain"
    properties.UserProperty = [("k", "v")]
    packed = properties.pack()
    body = (3).to_bytes(2, "big") + b"p/q" + packed + b"payload"
    peer.sendall(bytes([0x31, len(body)]) + body + publish_packet("q/2", b"two", 2, 9))
    adapter_.reading.on_readable()
    assert items == [Publication("p/q", b"payload", 0, True,
                                 {"user_property": [["k", "v"]], "content_type": "text/plain"}),
                     Publication("q/2", b"two", 2, False, None, 9)]  # QoS 2: handed over at its PUBLISH
    assert read_all(peer) == b""  # no PUBREC before the runtime acknowledges it (it spools it first)
    adapter_.acknowledge([(9, 2)])
    assert read_all(peer) == bytes([0x50, 2, 0, 9])  # the PUBREC is the acknowledgement
    peer.sendall(publish_packet("q/2", b"two", 2, 9, dup=True))  # repeated after a reconnection
    adapter_.reading.on_readable()
    assert len(items) == 2  # not handed over again: its PUBREC goes again
    assert read_all(peer) == bytes([0x50, 2, 0, 9])
    peer.sendall(bytes([0x62, 2, 0, 9]))  # PUBREL
    adapter_.reading.on_readable()
    assert read_all(peer) == bytes([0x70, 2, 0, 9])  # PUBCOMP at once
    peer.sendall(publish_packet("q/2", b"again", 2, 9, dup=True))  # a previous run's, repeated: its DUP shows
    adapter_.reading.on_readable()
    assert items[-1] == Publication("q/2", b"again", 2, False, None, 9, True)
    peer.sendall(publish_packet("q/1", b"one", 1, 10, dup=True))  # a QoS 1 repeat leaves the short path
    adapter_.reading.on_readable()
    assert items[-1] == Publication("q/1", b"one", 1, False, None, 10, True)


def test_lean_qos0_publish_builds_the_bytes_paho_builds(adapter) -> None:  # type: ignore[no-untyped-def]
    adapter_, peer, _items = adapter
    reference = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    ref_ours, ref_peer = socket.socketpair()
    reference._sock = ref_ours  # type: ignore[assignment]
    try:
        cases = [("t", b"", False), ("a/b/c", b"x" * 200, True), ("é/ü", b"\0" * 20000, False)]
        for topic, payload, retain in cases:
            reference.publish(topic, payload, 0, retain)
        expected = read_all(ref_peer)
    finally:
        reference._sock = None
        ref_ours.close()
        ref_peer.close()
    for append in (append_qos0_run, append_qos0_run_python):
        built = bytearray()
        for topic, payload, retain in cases:
            assert append(built, [topic], [payload], retain) == 1
        assert bytes(built) == expected
    adapter_.publish_all([Injection(t, p, 0, r, None, (Address("h", 1), 1, i)) for i, (t, p, r) in enumerate(cases)])
    assert read_all(peer) == expected
    assert adapter_.injected == 3


def test_remembered_topic_fields_stay_exact_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """`publishable_field` (the QoS 1/2 runs' topic fields) remembers each topic's field: the same bytes the
    second time, refusals too, and the memory is emptied when full."""
    monkeypatch.setattr(publish_packets, "TOPIC_FIELD_CACHE", 3)
    monkeypatch.setattr(publish_packets, "_topic_fields", {})
    for _ in range(2):
        first = publish_packets.publishable_field("é/x", b"p")
        assert first == publish_packets.publishable_field("é/x", b"p") == b"\x00\x04" + "é/x".encode()
        for refused in ("a/+", "a/#", ""):
            assert publish_packets.publishable_field(refused, b"p") == b""
    assert len(publish_packets._topic_fields) <= 3


def test_qos0_runs_the_socket_takes_only_in_part_follow_in_order(adapter) -> None:  # type: ignore[no-untyped-def]
    """`send_qos0` writes straight to the socket; what a full socket refuses waits in paho's queue, and a later
    run goes behind it, written when the socket is writable again."""
    adapter_, peer, _items = adapter
    ours = adapter_.client._sock
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    source = (Address("h", 1), 1, 0)
    first = [Injection(f"a/{i}", bytes([i]) * 500, 0, False, None, source) for i in range(200)]
    second = [Injection(f"b/{i}", bytes([i]) * 500, 0, False, None, source) for i in range(50)]
    expected = bytearray()
    for injection in first + second:
        assert append_qos0_run_python(expected, [injection.topic], [injection.payload], False) == 1
    adapter_.client._last_msg_out = 0.0
    adapter_.publish_all(first)
    assert adapter_.client._last_msg_out > 0  # the keepalive knows something was sent
    assert adapter_.client.want_write() and adapter_.output_blocked  # the socket took part of the run
    adapter_.publish_all(second)  # behind the rest of the first, not into the socket ahead of it
    received = bytearray()
    for _ in range(1000):
        received += read_all(peer)
        if not adapter_.client.want_write():
            break
        adapter_._on_writable()
    received += read_all(peer)
    assert bytes(received) == bytes(expected)
    assert not adapter_.output_blocked and adapter_.injected == 250


def test_backlog_counts_qos1_until_the_broker_acknowledges(adapter) -> None:  # type: ignore[no-untyped-def]
    adapter_, peer, _items = adapter
    completed: list[bool] = []
    adapter_._on_completed = lambda: completed.append(True)
    adapter_.publish_all([Injection("t", b"p", 1, False, None, (Address("h", 1), 1, i)) for i in range(3)]
                         + [Injection("t", b"p", 0, False, None, (Address("h", 1), 1, 9))])
    assert adapter_.backlog() == 3
    sent = read_all(peer)  # three QoS 1 PUBLISH (32 07 00 01 't' mid-hi mid-lo 00 'p'), then the QoS 0 one
    mids = [int.from_bytes(sent[i + 5:i + 7], "big") for i in range(0, 3 * 9, 9)]
    assert sent[27:] == bytes([0x30, 5, 0, 1]) + b"t" + b"\0p"
    peer.sendall(b"".join(bytes([0x40, 2]) + mid.to_bytes(2, "big") for mid in mids[:2]))
    adapter_.reading.on_readable()
    assert adapter_.backlog() == 1
    assert completed == [True]


def test_hotpath_command_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert hotpath_main(["--qos", "1", "--burst", "4", "--messages", "40", "--repeat", "1",
                         "--publication-events", "on", "off"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:5] == ["events", "qos", "size", "burst", "paho_receive"]
    cells = out[1].split()
    assert cells[:4] == ["on", "1", "64", "4"] and all(float(c) > 0 for c in cells[4:])
    assert out[2].split()[:4] == ["off", "1", "64", "4"]


# ------------------------------------------------------------------ the lean receive path against paho's own


def _retained(packet: bytes) -> bytes:
    return bytes([packet[0] | 0x01]) + packet[1:]


def _with_properties(topic: str, payload: bytes, qos: int, mid: int) -> bytes:
    properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    properties.ContentType = "text/plain"
    properties.UserProperty = [("k", "v")]
    body = len(topic).to_bytes(2, "big") + topic.encode() + (mid.to_bytes(2, "big") if qos else b"")
    body += properties.pack() + payload
    return bytes([0x30 | qos << 1, len(body)]) + body


def _log_line(payload: bytes, qos: int, mid: int, user_properties: int = 0) -> bytes:
    """A log line as Mosquitto sends it to a v5 client: with the message expiry it gives every one (and
    `user_properties` more, for a property length of more than one byte)."""
    properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    properties.MessageExpiryInterval = 20
    if user_properties:
        properties.UserProperty = [(f"key{i}", "v" * 20) for i in range(user_properties)]
    topic = "$SYS/broker/log/M/subscribe"
    body = len(topic).to_bytes(2, "big") + topic.encode() + (mid.to_bytes(2, "big") if qos else b"")
    body += properties.pack() + payload
    length = len(body)
    encoded = bytearray()
    while True:
        encoded.append((length & 0x7F) | (0x80 if length > 0x7F else 0))
        length >>= 7
        if not length:
            break
    return bytes([0x30 | qos << 1]) + bytes(encoded) + body


PUBREL = 0x62


def _qos2(topic: str, payload: bytes, mid: int) -> bytes:
    """A QoS 2 PUBLISH and the broker's PUBREL that releases it (paho hands it over on the PUBREL)."""
    return publish_packet(topic, payload, 2, mid) + bytes([PUBREL, 2]) + mid.to_bytes(2, "big")


PACKETS = {
    "qos0": publish_packet("a/b", b"zero", 0, 0),
    "qos1": publish_packet("a/c", b"one", 1, 7),
    "retained0": _retained(publish_packet("r/0", b"kept", 0, 0)),
    "retained1": _retained(publish_packet("r/1", b"kept", 1, 8)),
    "empty_payload": publish_packet("e", b"", 1, 9),
    "log_line": publish_packet("$SYS/broker/log/N", b"1700000000: New client connected", 0, 0),
    "other_sys": publish_packet("$SYS/broker/uptime", b"5 seconds", 0, 0),
    "bad_utf8": b"\x30\x06\x00\x02\xff\xfe\x00x",
    "two_length_bytes": publish_packet("big/2", bytes(range(256)) * 2, 1, 10),
    "three_length_bytes": publish_packet("big/3", b"\x07" * 20000, 0, 0),
    "properties": _with_properties("p/q", b"payload", 0, 0),
    "properties1": _with_properties("p/r", b"payload", 1, 11),
    "qos2": _qos2("q/2", b"two", 12),
    "puback_unknown": bytes([0x40, 2, 0, 99]),
    "pingresp": bytes([0xD0, 0]),
    "utf8_topic": publish_packet("é/ü", b"u", 1, 13),
    "log_line_expiry": _log_line(b"1700000000: sub-1 1 dev/1/cmd", 1, 14),
    "log_line_expiry0": _log_line(b"1700000000: sub-1 0 dev/2/cmd", 0, 0),
    "log_line_long_properties": _log_line(b"1700000000: sub-1 1 dev/3/cmd", 1, 15, user_properties=8),
}


def _cut(stream: bytes, cuts: Sequence[int]) -> list[bytes]:
    points = [0, *sorted({c for c in cuts if 0 < c < len(stream)}), len(stream)]
    return [stream[a:b] for a, b in zip(points, points[1:], strict=False)]


def _through_paho(chunks: Sequence[bytes]) -> tuple[list[BrokerItem], bytes]:
    """Items and written bytes of an adapter without a loop: paho's own read path and `on_message`."""
    items: list[BrokerItem] = []
    reference = BrokerAdapter(BROKER, "reference", items.append)
    assert reference.client.lean_publish is None
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    reference.client._sock = ours  # type: ignore[assignment]
    written = b""
    try:
        for chunk in chunks:
            before = len(items)
            peer.sendall(chunk)
            while (rc := reference.client._packet_read()) == MQTTErrorCode.MQTT_ERR_SUCCESS:
                pass
            assert rc == MQTTErrorCode.MQTT_ERR_AGAIN
            _acknowledge(reference, items[before:])
            written += read_all(peer)
    finally:
        reference.client._sock = None
        ours.close()
        peer.close()
    return items, written


def _through_lean(chunks: Sequence[bytes]) -> tuple[list[BrokerItem], bytes, int]:
    """Items and written bytes of the loop-driven adapter, and how many packets paho's `_packet_read` read."""
    loop = asyncio.new_event_loop()
    items: list[BrokerItem] = []
    adapter = BrokerAdapter(BROKER, "lean", one_per_publication(items), loop=loop)
    client = adapter.client
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    client._sock = ours  # type: ignore[assignment]
    adapter.reading.watched = ours
    paho_reads = 0
    original = client._packet_read

    def counting() -> MQTTErrorCode:
        nonlocal paho_reads
        paho_reads += 1
        return original()

    client._packet_read = counting  # type: ignore[method-assign]
    written = b""
    try:
        for chunk in chunks:
            before = len(items)
            peer.sendall(chunk)
            adapter.reading.on_readable()
            while client.buffered():  # what the scheduled retry would read
                adapter.reading.on_readable()
            _acknowledge(adapter, items[before:])
            written += read_all(peer)
    finally:
        client._sock = None
        ours.close()
        peer.close()
        loop.close()
    return items, written, paho_reads


@pytest.mark.parametrize("names", [
    ("qos0", "qos1", "retained0", "retained1", "empty_payload", "utf8_topic"),
    ("log_line", "qos0", "other_sys", "bad_utf8", "qos1"),
    ("two_length_bytes", "three_length_bytes", "qos1"),
    ("qos0", "properties", "qos1", "properties1", "qos1"),
    ("qos1", "qos2", "qos0", "puback_unknown", "pingresp", "retained1"),
    ("log_line_expiry", "qos1", "log_line_long_properties", "log_line_expiry0", "properties1", "log_line_expiry"),
])
def test_the_lean_path_hands_over_and_acknowledges_what_paho_does(names: tuple[str, ...]) -> None:
    stream = b"".join(PACKETS[name] for name in names)
    expected_items, expected_written = _through_paho([stream])
    items, written, _paho_reads = _through_lean([stream])
    assert items == expected_items
    assert written == expected_written
    assert len([i for i in items if isinstance(i, (Publication, LogLine))]) == \
        len([n for n in names if n not in ("other_sys", "bad_utf8", "puback_unknown", "pingresp")])


def test_plain_publishes_never_take_pahos_read_path_and_the_rest_do() -> None:
    plain = ("qos0", "qos1", "retained0", "retained1", "log_line", "two_length_bytes", "three_length_bytes",
             "log_line_expiry", "log_line_expiry0", "log_line_long_properties")  # a `$` topic's properties skipped
    _items, _written, paho_reads = _through_lean([b"".join(PACKETS[name] for name in plain)])
    assert paho_reads == 0
    others = ("properties", "qos2", "pingresp")  # the QoS 2 one is two packets (PUBLISH, PUBREL)
    _items, _written, paho_reads = _through_lean([b"".join(PACKETS[name] for name in ("qos0", *others, "qos1"))])
    assert paho_reads == 4


def test_a_stream_cut_anywhere_gives_what_paho_gives() -> None:
    names = ("qos0", "two_length_bytes", "qos1", "properties", "log_line", "qos2", "retained1")
    stream = b"".join(PACKETS[name] for name in names)
    expected_items, _expected_written = _through_paho([stream])
    for cut in range(1, len(stream)):  # every place one packet can be split across two reads
        chunks = _cut(stream, [cut])
        items, written, _ = _through_lean(chunks)
        # The acknowledgements follow each read (the runtime's, after a pass): compare with paho's on the same.
        assert (items, written) == (expected_items, _through_paho(chunks)[1]), f"cut at byte {cut}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=st.lists(st.sampled_from(sorted(set(PACKETS) - {"three_length_bytes"})), min_size=1, max_size=12),
       cuts=st.lists(st.integers(min_value=1, max_value=3000), max_size=6))
def test_any_mix_in_any_reads_gives_what_paho_gives(names: list[str], cuts: list[int]) -> None:
    stream = b"".join(PACKETS[name] for name in names)
    chunks = _cut(stream, cuts)
    assert _through_lean(chunks)[:2] == _through_paho(chunks)


def test_reading_publishes_counts_as_hearing_from_the_broker(adapter) -> None:  # type: ignore[no-untyped-def]
    adapter_, peer, items = adapter
    client = adapter_.client
    client._last_bytes_received = 0.0  # paho's keepalive would send PINGREQ, then give up on the connection
    peer.sendall(PACKETS["qos0"] + PACKETS["qos1"])
    adapter_.reading.on_readable()
    assert len(items) == 2
    assert client._last_bytes_received >= mqtt.time_func() - 5  # type: ignore[attr-defined]


def _retained(packet: bytes) -> bytes:
    return bytes([packet[0] | 0x01]) + packet[1:]


def test_pausing_stops_reading_mid_burst_and_resuming_reads_the_rest(adapter) -> None:  # type: ignore[no-untyped-def]
    """Retained publications (not plain: each is its own item), paused after the third."""
    adapter_, peer, items = adapter

    def deliver(item: BrokerItem) -> None:
        items.append(item)
        if len(items) == 3:
            adapter_.pause_reading()  # as the runtime's backpressure would, between two publications

    adapter_._deliver = deliver
    peer.sendall(b"".join(_retained(publish_packet(f"p/{i}", b"x", 1, i + 1)) for i in range(10)))
    adapter_.reading.on_readable()
    assert [item.topic for item in items if isinstance(item, Publication)] == ["p/0", "p/1", "p/2"]
    _acknowledge(adapter_, items)
    assert read_all(peer) == b"".join(bytes([0x40, 2, 0, mid]) for mid in (1, 2, 3))  # only what was taken
    adapter_.reading.on_readable()  # a pending wake-up while paused reads nothing
    assert len(items) == 3
    adapter_.resume_reading()  # schedules a read pass: the rest is in our buffer, the socket is not readable
    loop = adapter_._loop
    loop.run_until_complete(asyncio.sleep(0))
    loop.remove_reader(adapter_._watched)
    assert [item.topic for item in items if isinstance(item, Publication)] == [f"p/{i}" for i in range(10)]
    _acknowledge(adapter_, items[3:])
    assert read_all(peer) == b"".join(bytes([0x40, 2, 0, mid]) for mid in range(4, 11))


def test_plain_publications_come_as_runs_and_a_pause_stops_between_runs(adapter) -> None:  # type: ignore[no-untyped-def]
    """Plain QoS 1 publications are handed over a run at a time (`PublicationRun`), the runs cut by anything not
    plain (a retained one) and by a change of QoS; a pause takes effect before the next item."""
    adapter_, peer, _items = adapter
    taken: list[BrokerItem] = []

    def deliver(item: BrokerItem) -> None:
        taken.append(item)
        adapter_.pause_reading()

    adapter_._deliver = deliver
    packets = [publish_packet(f"p/{i}", b"x", 1, i + 1) for i in range(10)]
    packets[5] = _retained(packets[5])
    packets += [publish_packet("p/q0", b"y", 0, 0)]
    peer.sendall(b"".join(packets))
    adapter_.reading.on_readable()
    assert taken == [PublicationRun([f"p/{i}" for i in range(5)], [b"x"] * 5, 1, [1, 2, 3, 4, 5])]
    _acknowledge(adapter_, taken)
    assert read_all(peer) == b"".join(bytes([0x40, 2, 0, mid]) for mid in (1, 2, 3, 4, 5))
    for expected in (Publication("p/5", b"x", 1, True, None, 6),
                     PublicationRun([f"p/{i}" for i in range(6, 10)], [b"x"] * 4, 1, [7, 8, 9, 10]),
                     PublicationRun(["p/q0"], [b"y"], 0, [])):
        adapter_.resume_reading()
        adapter_.reading.on_readable()
        assert taken[-1] == expected
    assert len(taken) == 4 and not adapter_.client.buffered()


def test_part_of_a_packet_is_left_to_paho_and_schedules_no_read_pass(adapter) -> None:  # type: ignore[no-untyped-def]
    adapter_, peer, items = adapter
    packet = PACKETS["two_length_bytes"]
    peer.sendall(PACKETS["qos0"] + packet[:100])
    adapter_.reading.on_readable()
    assert len(items) == 1
    assert adapter_.client.buffered() == 0  # the rest of the packet waits in the socket, not in our buffer
    assert adapter_.reading._read_retry is None  # so only the socket becoming readable wakes us again
    peer.sendall(packet[100:])
    adapter_.reading.on_readable()
    assert [item.topic for item in items if isinstance(item, Publication)] == ["a/b", "big/2"]


# ------------------------------------------------------------------ the lean QoS 1 publish path against paho's own


QOS1_CASES = [("t", b"", False), ("a/b/c", b"x" * 200, True), ("é/ü", b"\0" * 20000, False), ("z", b"p", False),
              ("y", b"q", True)]
CONNACK_SESSION_PRESENT = bytes([0x20, 3, 1, 0, 0])


def _injections(cases: Sequence[tuple[str, bytes, bool]], qos: int = 1, first: int = 0) -> list[Injection]:
    return [Injection(t, p, qos, r, None, (Address("h", 1), 1, first + i)) for i, (t, p, r) in enumerate(cases)]


def _puback(*mids: int) -> bytes:
    return b"".join(bytes([0x40, 2]) + mid.to_bytes(2, "big") for mid in mids)


class _Side:
    """An adapter on a socket pair: the lean one (driven by a loop) or paho's (`publish` per injection)."""

    def __init__(self, lean: bool) -> None:
        self.loop = asyncio.new_event_loop() if lean else None
        self.items: list[BrokerItem] = []
        self.adapter = BrokerAdapter(BROKER, "side", one_per_publication(self.items), loop=self.loop)
        self.client = self.adapter.client
        self.completed: list[int] = []
        recorded = self.client.publish_completed
        assert recorded is not None

        def completed(mid: int, reason: int) -> None:
            self.completed.append(mid)
            recorded(mid, reason)

        self.client.publish_completed = completed
        self.socks: list[socket.socket] = []
        self.peer = self._connect()
        self.paho_publishes = 0
        original = self.client.publish

        def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.paho_publishes += 1
            return original(*args, **kwargs)

        self.client.publish = counting  # type: ignore[method-assign]

    def _connect(self) -> socket.socket:
        ours, peer = socket.socketpair()
        ours.setblocking(False)
        self.socks += [ours, peer]
        self.client._sock = ours  # type: ignore[assignment]
        if self.adapter.reading is not None:  # the loop-driven adapter reads it
            self.adapter.reading.watched = ours
        return peer

    def publish(self, injections: Sequence[Injection]) -> bytes:
        if self.loop is not None:
            self.adapter.publish_all(injections)
        else:
            for injection in injections:
                assert self.adapter.publish(injection)
        return read_all(self.peer)

    def receive(self, data: bytes) -> bytes:
        """The broker sends `data`; what the client writes back."""
        self.peer.sendall(data)
        if self.loop is not None:
            self.adapter.reading.on_readable()
        else:
            while self.client._packet_read() == MQTTErrorCode.MQTT_ERR_SUCCESS:
                pass
        return read_all(self.peer)

    def reconnect(self) -> bytes:
        """The connection drops and a new one is made (what paho's `reconnect` does to the kept session), the
        broker accepts it with the session present; what the client writes then."""
        self.client._sock = None
        self.client._out_packet.clear()
        self.client._messages_reconnect_reset()
        self.peer = self._connect()
        return self.receive(CONNACK_SESSION_PRESENT)

    def close(self) -> None:
        self.client._sock = None
        for sock in self.socks:
            sock.close()
        if self.loop is not None:
            self.loop.close()


@pytest.fixture
def sides() -> Iterator[tuple[_Side, _Side]]:
    lean, paho = _Side(True), _Side(False)
    try:
        yield lean, paho
    finally:
        lean.close()
        paho.close()


@pytest.mark.parametrize("last_mid", [100, 65533])  # the second wraps around: 65534, 65535, 1, 2, 3
def test_a_run_of_qos1_injections_writes_what_pahos_publish_writes(sides, last_mid: int) -> None:  # type: ignore[no-untyped-def]
    lean, paho = sides
    lean.client._last_mid = paho.client._last_mid = last_mid
    injections = _injections(QOS1_CASES)
    expected = paho.publish(injections)
    assert lean.publish(injections) == expected
    assert lean.paho_publishes == 0  # one run, built by `send_qos1`
    assert list(lean.client._out_messages) == list(paho.client._out_messages)
    assert lean.client._inflight_messages == paho.client._inflight_messages == len(QOS1_CASES)
    for mid, message in lean.client._out_messages.items():
        reference = paho.client._out_messages[mid]
        assert (message.topic, message.payload, message.qos, message.retain, message.dup, message.state,
                message.properties) == (reference.topic, reference.payload, reference.qos, reference.retain,
                                        reference.dup, reference.state, reference.properties)
    assert lean.adapter.backlog() == paho.adapter.backlog() == len(QOS1_CASES)
    assert lean.adapter.injected == len(QOS1_CASES)


def test_pubacks_complete_the_lean_qos1_injections(sides) -> None:  # type: ignore[no-untyped-def]
    lean, _paho = sides
    lean.publish(_injections(QOS1_CASES))
    mids = list(lean.client._out_messages)
    assert lean.adapter.backlog() == len(mids)
    assert lean.receive(_puback(*mids[:2])) == b""
    assert lean.completed == mids[:2] and lean.adapter.backlog() == len(mids) - 2
    lean.receive(_puback(*mids[2:]) + _puback(*mids[:1]))  # a repeated PUBACK changes nothing
    assert lean.completed == mids
    assert lean.adapter.backlog() == 0
    assert not lean.client._out_messages and lean.client._inflight_messages == 0


def test_pubacks_read_on_the_lean_path_leave_what_pahos_handler_leaves(sides) -> None:  # type: ignore[no-untyped-def]
    lean, paho = sides
    injections = _injections(QOS1_CASES)
    lean.publish(injections)
    paho.publish(injections)
    mids = list(lean.client._out_messages)
    assert mids == list(paho.client._out_messages)
    paho_reads = 0
    original = lean.client._packet_read

    def counting() -> MQTTErrorCode:
        nonlocal paho_reads
        paho_reads += 1
        return original()

    lean.client._packet_read = counting  # type: ignore[method-assign]
    with_reason = bytes([0x40, 3]) + mids[2].to_bytes(2, "big") + b"\x10"  # "no matching subscribers": paho's
    stream = _puback(*mids[:2]) + with_reason + _puback(*mids[3:]) + _puback(mids[0]) + bytes([0x40, 2, 0, 99])
    assert lean.receive(stream) == paho.receive(stream) == b""
    assert paho_reads == 1  # the PUBACK with a reason code; the plain ones, repeated and unknown included, are not
    assert lean.completed == paho.completed == mids
    for side in (lean, paho):
        assert not side.client._out_messages and side.client._inflight_messages == 0
        assert side.adapter.backlog() == 0


def test_a_puback_is_left_to_paho_when_it_keeps_an_in_flight_limit(sides) -> None:  # type: ignore[no-untyped-def]
    lean, _paho = sides
    lean.client.max_inflight_messages_set(2)
    lean.publish(_injections(QOS1_CASES))
    assert lean.client._inflight_messages == 2  # the rest wait in paho's queue
    lean.receive(_puback(*list(lean.client._out_messages)[:2]))
    assert len(lean.completed) == 2 and lean.client._inflight_messages == 2  # paho sent two more on the PUBACKs


def test_unacknowledged_lean_injections_are_sent_again_with_dup_after_reconnecting(sides) -> None:  # type: ignore[no-untyped-def]
    lean, paho = sides
    injections = _injections(QOS1_CASES)
    first = lean.publish(injections)
    assert first == paho.publish(injections)
    mids = list(lean.client._out_messages)
    for side in (lean, paho):
        side.receive(_puback(mids[1], mids[3]))
    again = lean.reconnect()
    assert again == paho.reconnect()
    assert lean.completed == paho.completed == [mids[1], mids[3]]
    # SUBSCRIBE (on_connect), then the three unacknowledged PUBLISH packets again, flagged DUP (0x08).
    packets = split_packets(first)
    resent = b"".join(bytes([packet[0] | 0x08]) + packet[1:] for mid, packet in zip(mids, packets, strict=True)
                      if mid not in (mids[1], mids[3]))
    assert again.endswith(resent) and again[0] & 0xF0 == 0x80
    assert lean.adapter.backlog() == 3
    lean.receive(_puback(*(mid for mid in mids if mid not in (mids[1], mids[3]))))
    assert lean.adapter.backlog() == 0 and sorted(lean.completed) == sorted(mids)


def test_max_inflight_bounds_the_lean_path_and_queued_messages_keep_their_order(sides) -> None:  # type: ignore[no-untyped-def]
    lean, paho = sides
    for side in (lean, paho):
        side.client.max_inflight_messages_set(2)
    first, second = _injections(QOS1_CASES), _injections(QOS1_CASES[:2], first=10)
    assert lean.publish(first) == paho.publish(first)  # two in flight, three queued by paho
    assert lean.paho_publishes == 3 and lean.client._inflight_messages == 2
    mids = list(lean.client._out_messages)
    assert lean.receive(_puback(mids[0])) == paho.receive(_puback(mids[0]))  # paho sends the third
    assert lean.publish(second) == paho.publish(second) == b""  # behind the queued ones, not ahead
    assert lean.paho_publishes == 5
    order = list(lean.client._out_messages)
    assert order == list(paho.client._out_messages)
    while order:
        mid = order.pop(0)
        assert lean.receive(_puback(mid)) == paho.receive(_puback(mid))
    assert lean.adapter.backlog() == paho.adapter.backlog() == 0
    assert lean.completed == paho.completed
    assert lean.publish(second) == paho.publish(second) != b""  # nothing queued any more: the lean path again
    assert lean.paho_publishes == 5


def test_a_qos1_run_mixed_with_others_keeps_the_order_paho_gives(sides) -> None:  # type: ignore[no-untyped-def]
    lean, paho = sides
    with_properties = Injection("p/q", b"x", 1, False, {"content_type": "text/plain"}, (Address("h", 1), 1, 20))
    mixed = [*_injections(QOS1_CASES[:2]), *_injections(QOS1_CASES[2:3], qos=0, first=2), with_properties,
             *_injections(QOS1_CASES[3:], qos=2, first=4), *_injections(QOS1_CASES[:1], first=6),
             Injection("bad/#", b"w", 1, False, None, (Address("h", 1), 1, 7)), *_injections(QOS1_CASES[1:2], first=8)]
    expected = paho.publish([i for i in mixed if "#" not in i.topic])
    written = lean.publish(mixed)  # the wildcard topic is refused (paho raises), not sent
    assert lean.adapter.inject_failed == 1
    # The same packets in the same order; the mids differ: paho uses up one per QoS 0 publication, the lean
    # QoS 0 path none.
    assert [_without_mid(p) for p in split_packets(written)] == [_without_mid(p) for p in split_packets(expected)]
    assert len(split_packets(written)) == 8
    assert [m.topic for m in lean.client._out_messages.values()] == ["t", "a/b/c", "p/q", "z", "y", "t", "a/b/c"]
    assert lean.adapter.backlog() == 7


def _without_mid(packet: bytes) -> bytes:
    """A PUBLISH with its packet id zeroed (QoS 1/2)."""
    if packet[0] & 0xF0 != 0x30 or not packet[0] & 0x06:
        return packet
    start = 1
    while packet[start] & 0x80:
        start += 1
    topic_end = start + 3 + int.from_bytes(packet[start + 1:start + 3], "big")
    return packet[:topic_end] + b"\0\0" + packet[topic_end + 2:]


def test_without_a_loop_publish_all_takes_the_lean_qos1_path_too(sides) -> None:  # type: ignore[no-untyped-def]
    lean, paho = sides
    injections = _injections(QOS1_CASES)
    expected = paho.publish(injections)
    threaded = _Side(False)
    try:
        threaded.adapter.publish_all(injections)
        assert read_all(threaded.peer) == expected
        assert threaded.paho_publishes == 0 and threaded.adapter.backlog() == len(QOS1_CASES)
        threaded.receive(_puback(*threaded.client._out_messages))
        assert threaded.adapter.backlog() == 0 and len(threaded.completed) == len(QOS1_CASES)
    finally:
        threaded.close()
