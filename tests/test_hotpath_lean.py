"""The adapter's lean paho paths (federation/daemon/broker.py `_LeanClient`) agree with paho's own.

No broker: a Unix socket pair stands in for the TCP connection, so the
bytes paho writes and reads are exactly what a broker would see.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from federation.bench.hotpath import main as hotpath_main
from federation.bench.hotpath import publish_packet
from federation.daemon.broker import BrokerAdapter, BrokerItem, LogLine, Publication, lean_qos0_publish
from federation.types import Address, Injection


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
