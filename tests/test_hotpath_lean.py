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

from federation.bench.hotpath import main as hotpath_main
from federation.bench.hotpath import publish_packet
from federation.daemon.broker import BrokerAdapter
from federation.daemon.broker_items import BrokerItem, LogLine, Publication
from federation.daemon.lean_client import lean_qos0_publish
from federation.types import Address, Injection

BROKER = Address("127.0.0.1", 1883)


@pytest.fixture
def adapter() -> Iterator[tuple[BrokerAdapter, socket.socket, list[BrokerItem]]]:
    loop = asyncio.new_event_loop()
    items: list[BrokerItem] = []
    adapter = BrokerAdapter(Address("127.0.0.1", 1883), "lean-test", items.append, loop=loop)
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    adapter.client._sock = ours  # type: ignore[assignment]  # what paho's reconnect() sets
    adapter._watched = ours
    try:
        yield adapter, peer, items
    finally:
        adapter.client._sock = None
        ours.close()
        peer.close()
        loop.close()


def _read_all(peer: socket.socket) -> bytes:
    peer.setblocking(False)
    data = b""
    try:
        while chunk := peer.recv(1 << 16):
            data += chunk
    except BlockingIOError:
        pass
    return data


def test_a_burst_of_publishes_in_one_read_yields_every_publication_in_order(adapter) -> None:  # type: ignore[no-untyped-def]
    adapter_, peer, items = adapter
    packets = [publish_packet(f"a/{i}", bytes([i % 256]) * i, i % 2, i + 1) for i in range(300)]
    packets.insert(5, publish_packet("$SYS/broker/log/N", b"line", 0, 0))
    peer.sendall(b"".join(packets))
    adapter_._on_readable()
    while adapter_.client.buffered():  # more than MAX_PACKETS_PER_WAKEUP: the adapter scheduled another pass
        adapter_._on_readable()
    publications = [item for item in items if isinstance(item, Publication)]
    assert [(p.topic, p.payload, p.qos, p.retain, p.properties) for p in publications] == \
        [(f"a/{i}", bytes([i % 256]) * i, i % 2, False, None) for i in range(300)]
    assert items[5] == LogLine("$SYS/broker/log/N", b"line")
    acks = _read_all(peer)  # a PUBACK (40 02 mid) for every QoS 1 publication, as paho sends them
    assert acks == b"".join(bytes([0x40, 2]) + (i + 1).to_bytes(2, "big") for i in range(300) if i % 2)


def test_a_publish_with_properties_or_qos2_takes_pahos_path(adapter) -> None:  # type: ignore[no-untyped-def]
    adapter_, peer, items = adapter
    properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    properties.ContentType = "text/plain"
    properties.UserProperty = [("k", "v")]
    packed = properties.pack()
    body = (3).to_bytes(2, "big") + b"p/q" + packed + b"payload"
    peer.sendall(bytes([0x31, len(body)]) + body + publish_packet("q/2", b"two", 2, 9))
    adapter_._on_readable()
    assert items == [Publication("p/q", b"payload", 0, True,
                                 {"user_property": [["k", "v"]], "content_type": "text/plain"})]
    assert _read_all(peer) == bytes([0x50, 2, 0, 9])  # PUBREC: QoS 2 is paho's


def test_lean_qos0_publish_builds_the_bytes_paho_builds(adapter) -> None:  # type: ignore[no-untyped-def]
    adapter_, peer, _items = adapter
    reference = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    ref_ours, ref_peer = socket.socketpair()
    reference._sock = ref_ours  # type: ignore[assignment]
    try:
        cases = [("t", b"", False), ("a/b/c", b"x" * 200, True), ("é/ü", b"\0" * 20000, False)]
        for topic, payload, retain in cases:
            reference.publish(topic, payload, 0, retain)
        expected = _read_all(ref_peer)
    finally:
        reference._sock = None
        ref_ours.close()
        ref_peer.close()
    built = bytearray()
    for topic, payload, retain in cases:
        assert lean_qos0_publish(built, topic, payload, retain)
    assert bytes(built) == expected
    adapter_.publish_all([Injection(t, p, 0, r, None, (Address("h", 1), 1, i)) for i, (t, p, r) in enumerate(cases)])
    assert _read_all(peer) == expected
    assert adapter_.injected == 3


def test_backlog_counts_qos1_until_the_broker_acknowledges(adapter) -> None:  # type: ignore[no-untyped-def]
    adapter_, peer, _items = adapter
    completed: list[bool] = []
    adapter_._on_completed = lambda: completed.append(True)
    adapter_.publish_all([Injection("t", b"p", 1, False, None, (Address("h", 1), 1, i)) for i in range(3)]
                         + [Injection("t", b"p", 0, False, None, (Address("h", 1), 1, 9))])
    assert adapter_.backlog() == 3
    sent = _read_all(peer)  # three QoS 1 PUBLISH (32 07 00 01 't' mid-hi mid-lo 00 'p'), then the QoS 0 one
    mids = [int.from_bytes(sent[i + 5:i + 7], "big") for i in range(0, 3 * 9, 9)]
    assert sent[27:] == bytes([0x30, 5, 0, 1]) + b"t" + b"\0p"
    peer.sendall(b"".join(bytes([0x40, 2]) + mid.to_bytes(2, "big") for mid in mids[:2]))
    adapter_._on_readable()
    assert adapter_.backlog() == 1
    assert completed == [True]


def test_hotpath_command_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert hotpath_main(["--qos", "1", "--burst", "4", "--messages", "40", "--repeat", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["qos", "size", "burst", "paho_receive"]
    cells = out[1].split()
    assert cells[:3] == ["1", "64", "4"] and all(float(c) > 0 for c in cells[3:])


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
            peer.sendall(chunk)
            while (rc := reference.client._packet_read()) == MQTTErrorCode.MQTT_ERR_SUCCESS:
                pass
            assert rc == MQTTErrorCode.MQTT_ERR_AGAIN
            written += _read_all(peer)
    finally:
        reference.client._sock = None
        ours.close()
        peer.close()
    return items, written


def _through_lean(chunks: Sequence[bytes]) -> tuple[list[BrokerItem], bytes, int]:
    """Items and written bytes of the loop-driven adapter, and how many packets paho's `_packet_read` read."""
    loop = asyncio.new_event_loop()
    items: list[BrokerItem] = []
    adapter = BrokerAdapter(BROKER, "lean", items.append, loop=loop)
    client = adapter.client
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    client._sock = ours  # type: ignore[assignment]
    adapter._watched = ours
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
            peer.sendall(chunk)
            adapter._on_readable()
            while client.buffered():  # what the scheduled retry would read
                adapter._on_readable()
            written += _read_all(peer)
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
    plain = ("qos0", "qos1", "retained0", "retained1", "log_line", "two_length_bytes", "three_length_bytes")
    _items, _written, paho_reads = _through_lean([b"".join(PACKETS[name] for name in plain)])
    assert paho_reads == 0
    others = ("properties", "qos2", "pingresp")  # the QoS 2 one is two packets (PUBLISH, PUBREL)
    _items, _written, paho_reads = _through_lean([b"".join(PACKETS[name] for name in ("qos0", *others, "qos1"))])
    assert paho_reads == 4


def test_a_stream_cut_anywhere_gives_what_paho_gives() -> None:
    names = ("qos0", "two_length_bytes", "qos1", "properties", "log_line", "qos2", "retained1")
    stream = b"".join(PACKETS[name] for name in names)
    expected_items, expected_written = _through_paho([stream])
    for cut in range(1, len(stream)):  # every place one packet can be split across two reads
        items, written, _ = _through_lean(_cut(stream, [cut]))
        assert (items, written) == (expected_items, expected_written), f"cut at byte {cut}"


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
    adapter_._on_readable()
    assert len(items) == 2
    assert client._last_bytes_received >= mqtt.time_func() - 5  # type: ignore[attr-defined]


def test_pausing_stops_reading_mid_burst_and_resuming_reads_the_rest(adapter) -> None:  # type: ignore[no-untyped-def]
    adapter_, peer, items = adapter

    def deliver(item: BrokerItem) -> None:
        items.append(item)
        if len(items) == 3:
            adapter_.pause_reading()  # as the runtime's backpressure would, between two publications

    adapter_._deliver = deliver
    peer.sendall(b"".join(publish_packet(f"p/{i}", b"x", 1, i + 1) for i in range(10)))
    adapter_._on_readable()
    assert [item.topic for item in items if isinstance(item, Publication)] == ["p/0", "p/1", "p/2"]
    assert _read_all(peer) == b"".join(bytes([0x40, 2, 0, mid]) for mid in (1, 2, 3))  # only what was taken
    adapter_._on_readable()  # a pending wake-up while paused reads nothing
    assert len(items) == 3
    adapter_.resume_reading()  # schedules a read pass: the rest is in our buffer, the socket is not readable
    loop = adapter_._loop
    loop.run_until_complete(asyncio.sleep(0))
    loop.remove_reader(adapter_._watched)
    assert [item.topic for item in items if isinstance(item, Publication)] == [f"p/{i}" for i in range(10)]
    assert _read_all(peer) == b"".join(bytes([0x40, 2, 0, mid]) for mid in range(4, 11))


def test_part_of_a_packet_is_left_to_paho_and_schedules_no_read_pass(adapter) -> None:  # type: ignore[no-untyped-def]
    adapter_, peer, items = adapter
    packet = PACKETS["two_length_bytes"]
    peer.sendall(PACKETS["qos0"] + packet[:100])
    adapter_._on_readable()
    assert len(items) == 1
    assert adapter_.client.buffered() == 0  # the rest of the packet waits in the socket, not in our buffer
    assert adapter_._read_retry is None  # so only the socket becoming readable wakes us again
    peer.sendall(packet[100:])
    adapter_._on_readable()
    assert [item.topic for item in items if isinstance(item, Publication)] == ["a/b", "big/2"]
