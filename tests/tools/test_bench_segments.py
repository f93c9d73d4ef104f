"""The latency split of `python -m suites.bench.segments`: frames parsed, owners read, the path and its
segments found from the crossings (synthetic ones here; the command itself needs root and is run by hand,
docs/benchmarks.md)."""

from __future__ import annotations

import socket
import struct

from suites.bench.segments import Crossing, parse_frame, parse_sockets, segments


def _frame(protocol: int, source: tuple[str, int], destination: tuple[str, int], payload: bytes) -> bytes:
    if protocol == socket.IPPROTO_TCP:
        l4 = struct.pack("!HHIIBBHHH", source[1], destination[1], 0, 0, 5 << 4, 0x18, 0, 0, 0) + payload
    else:
        l4 = struct.pack("!HHHH", source[1], destination[1], 8 + len(payload), 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(l4), 0, 0, 64, protocol, 0,
                     socket.inet_aton(source[0]), socket.inet_aton(destination[0]))
    return bytes(14) + ip + l4


def test_frames_give_their_flow_and_payload() -> None:
    tcp = _frame(socket.IPPROTO_TCP, ("127.0.0.1", 40000), ("127.0.9.10", 1883), b"publish")
    assert parse_frame(tcp) == (("tcp", ("127.0.0.1", 40000), ("127.0.9.10", 1883)), b"publish")
    udp = _frame(socket.IPPROTO_UDP, ("127.0.9.10", 10500), ("127.0.9.11", 10500), b"tm")
    assert parse_frame(udp) == (("udp", ("127.0.9.10", 10500), ("127.0.9.11", 10500)), b"tm")
    assert parse_frame(bytes(14) + b"\x60" + bytes(60)) is None  # IPv6
    assert parse_frame(_frame(socket.IPPROTO_ICMP, ("127.0.0.1", 0), ("127.0.0.1", 0), b"")) is None
    assert parse_frame(b"\0" * 20) is None


def test_socket_owners_come_from_ss_lines() -> None:
    text = ('tcp   ESTAB  0 0 127.0.9.11:1883 127.0.0.1:40635 users:(("mosquitto",pid=21908,fd=7))\n'
            'udp   UNCONN 0 0 127.0.9.10:10500 0.0.0.0:* users:(("python",pid=21909,fd=7))\n'
            'tcp   LISTEN 0 100 [::1]:1883 [::]:*\n')
    assert parse_sockets(text) == {("127.0.9.11", 1883): ("mosquitto", 21908),
                                   ("127.0.9.10", 10500): ("python", 21909)}


def test_the_path_is_ordered_in_time_and_each_holder_gets_its_gap() -> None:
    publisher, broker_a, wrapper_a = ("127.0.0.1", 50000), ("127.0.9.10", 1883), ("127.0.0.1", 50001)
    udp_a, udp_b = ("127.0.9.10", 10500), ("127.0.9.11", 10500)
    crossings: list[Crossing] = []
    for seq in range(10):
        start = seq * 1_000_000
        crossings += [
            (start + 100_000 + 300_000 + seq, "udp", udp_a, udp_b, seq),  # listed out of order on purpose
            (start, "tcp", publisher, broker_a, seq),
            (start + 100_000, "tcp", broker_a, wrapper_a, seq),
        ]
    crossings.append((5, "tcp", ("127.0.0.1", 1), ("127.0.0.1", 2), 3))  # one stray flow: not the path
    crossings.append((3_050_000, "tcp", publisher, broker_a, 3))  # seen again (a retransmission): the first counts
    label = {broker_a: "broker a", wrapper_a: "wrapper a", udp_b: "wrapper b", publisher: "publisher"}
    rows = segments(crossings, label)
    assert [(row.holder, row.to) for row in rows] == [("broker a", "wrapper a"), ("wrapper a", "wrapper b"),
                                                     ("publisher", "wrapper b")]
    assert rows[0].p50 == 100.0 and rows[0].count == 10
    assert 300.0 <= rows[1].p50 <= 300.01
    assert 400.0 <= rows[2].p50 <= 400.01 and rows[2].count == 10
    assert segments([], label) == []
