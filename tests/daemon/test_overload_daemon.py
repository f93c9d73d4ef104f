"""The daemon under overload: control packets before data, bounded receive backlog, QoS 0 shed first
on a backed-up send side, broker reading paused meanwhile (docs/daemon.md "Overload")."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from federation.daemon import clock as clock_module
from federation.daemon.backpressure import InjectionQueue, PacketBacklog, shed_qos0
from federation.daemon.clock import Clock
from federation.daemon.flow_control import BROKER_BACKLOG, INJECTION_BACKLOG, INJECTION_BACKLOG_HIGH, FlowControl
from federation.daemon.receiving import DATA_SLICE
from federation.daemon.running import Running
from federation.daemon.udp import MAX_DATAGRAM_READ, LocalAddresses, OverlayProtocol, kernel_receive_drops
from federation.protocol import wire
from federation.protocol.node import Node
from federation.protocol.types import Address, BrokerId, Injection

from runtime_util import free_port, packets_in, peer_envelope, peer_socket, started_wrapper

ORIGIN = Address("127.0.0.9", 10500)


def tm(seq: int, qos: int = 0, payload: bytes = b"x" * 100, origin: Address = ORIGIN) -> bytes:
    message = wire.TopicMessage("t/#", origin, 1, seq, 1, 0, "t/x", payload, qos, False, None)
    return wire.encode(wire.TOPIC_MESSAGE, wire.Sender(BrokerId(9, origin), 1), message)


def hello(origin: Address, seq: int = 1) -> bytes:
    return wire.encode(wire.HELLO, wire.Sender(BrokerId(9, origin), 1), wire.Hello(seq, 0.0))


# ------------------------------------------------------------ sans-I/O parts


def test_shed_keeps_control_and_reliable_packets_in_order() -> None:
    origin = Address("127.0.0.9", 10500)
    packets = [(hello(origin), "a"), (tm(1, qos=0), "a"), (tm(2, qos=1), "b"), (tm(3, qos=0), "b"),
               (hello(origin, 2), "b")]
    kept, shed = shed_qos0(packets)
    assert kept == [packets[0], packets[2], packets[4]]
    assert shed == [packets[1], packets[3]]


def seq_of(packet: bytes | None) -> int:
    assert packet is not None
    body = wire.decode(packet, len(packet), 1 << 16).body
    assert isinstance(body, wire.TopicMessage)
    return body.seq


def test_receive_backlog_drops_the_oldest_qos0_first_and_stays_bounded() -> None:
    backlog: PacketBacklog[str] = PacketBacklog(max_packets=4, max_bytes=1 << 20)
    for seq, qos in ((1, 1), (2, 0), (3, 1), (4, 0)):
        assert list(backlog.push(tm(seq, qos), "s")) == []
    dropped = backlog.push(tm(5, 1), "s")
    assert [seq_of(p) for p in dropped] == [2]
    dropped = backlog.push(tm(6, 1), "s")
    assert [seq_of(p) for p in dropped] == [4]
    dropped = backlog.push(tm(7, 1), "s")  # no QoS 0 left: the oldest goes (its sender retransmits it)
    assert dropped == [None]
    assert backlog.dropped == {"qos0": 2, "qos12": 1}
    taken = backlog.take(10)
    assert [wire.decode(p, len(p), 1 << 16).body.seq for p, _ in taken] == [3, 5, 6, 7]  # type: ignore[union-attr]
    assert backlog.bytes == 0 and len(backlog) == 0


def test_receive_backlog_bytes_bound() -> None:
    one = len(tm(1, payload=b"y" * 1000))
    backlog: PacketBacklog[str] = PacketBacklog(max_packets=1000, max_bytes=3 * one)
    for seq in range(10):
        backlog.push(tm(seq, payload=b"y" * 1000), "s")
    assert len(backlog) == 3 and backlog.bytes <= 3 * one
    assert backlog.dropped["qos0"] == 7


def test_a_data_slice_is_bounded_in_bytes_too() -> None:
    """`tb` packets carry up to a datagram of publications each: a slice stops at its byte budget (at least
    one packet), so one loop pass does not handle thousands of publications."""
    one = len(tm(1, payload=b"y" * 1000))
    backlog: PacketBacklog[str] = PacketBacklog(max_packets=1000, max_bytes=1 << 20)
    for seq in range(10):
        backlog.push(tm(seq, payload=b"y" * 1000), "s")
    assert len(backlog.take(100, 3 * one)) == 3
    assert len(backlog.take(100, 1)) == 1
    assert len(backlog.take(100)) == 6 and backlog.bytes == 0


# ------------------------------------------------------------ the wrapper with a real socket


class FakeBroker:
    on_loop = True
    injected = 0
    inject_failed = 0
    output_blocked = False
    max_qos = 2
    connected = True
    receive_maximum = 65535
    session_present = True
    sessions_lost = 0
    read_waits = 0

    def __init__(self) -> None:
        self.reading_paused = False
        self.pauses = 0
        self.counts: Counter[str] = Counter()

    def pause_reading(self) -> None:
        self.reading_paused = True
        self.pauses += 1

    def resume_reading(self) -> None:
        self.reading_paused = False

    def backlog(self) -> int:
        return 0

    def injection_window(self) -> int:
        return max(0, self.receive_maximum - self.backlog()) if self.connected else 0

    def publish_all(self, items: Any) -> None:
        pass

    def take_injection_outcomes(self) -> list[Any]:
        return []


def test_hello_is_answered_before_the_queued_data() -> None:
    """More datagrams of `tm` than one slice wait in the socket ahead of a hello: the hello is handled (and
    answered) in the first pass, the data a slice per pass after it."""

    async def scenario() -> None:
        wrapper = await started_wrapper()
        try:
            with peer_socket() as (peer, peer_address):
                peer.setblocking(False)
                envelope = peer_envelope(wrapper, peer_address)
                target = wrapper.config.bind
                count = DATA_SLICE + 200
                for seq in range(1, count + 1):
                    envelope.send(tm(seq, origin=peer_address), target)
                    for data, _ in envelope.datagrams_to_send():
                        peer.sendto(data, (target.host, target.port))
                envelope.send(hello(peer_address), target)
                for data, _ in envelope.datagrams_to_send():
                    peer.sendto(data, (target.host, target.port))
                node = wrapper.node
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 5
                while node.received_by_type[wire.HELLO] == 0 and loop.time() < deadline:
                    await asyncio.sleep(0)
                assert node.received_by_type[wire.HELLO] == 1
                assert node.received_by_type[wire.TOPIC_MESSAGE] <= DATA_SLICE  # the hello did not wait for them
                assert len(wrapper.receive_backlog) > 0
                answered = False
                while not answered and loop.time() < deadline:
                    await asyncio.sleep(0.001)
                    try:
                        data, _ = peer.recvfrom(65535)
                    except BlockingIOError:
                        continue
                    answered = any(wire.packet_type(p) == wire.HELLO_BACK for p in packets_in(data))
                assert answered
                while node.received_by_type[wire.TOPIC_MESSAGE] < count and loop.time() < deadline:
                    await asyncio.sleep(0.001)
                assert node.received_by_type[wire.TOPIC_MESSAGE] == count  # nothing lost, only reordered
                assert len(wrapper.receive_backlog) == 0
        finally:
            wrapper.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("publication_events", [True, False])
def test_backed_up_send_side_sheds_qos0_keeps_hellos_and_pauses_the_broker(publication_events: bool,
                                                                            tmp_path: Path) -> None:
    """The shed publication is always counted, and reported as `publication_dropped` only by a node that
    makes the per-publication events (docs/daemon.md "Overload"). The intake of publications pauses; the broker's
    socket is still read (the acknowledgements of our injections come on it)."""

    async def scenario() -> None:
        wrapper = await started_wrapper(tmp_path / "events.jsonl" if publication_events else None)
        try:
            with peer_socket() as (peer, peer_address):
                node = wrapper.node
                protocol = wrapper.protocol
                assert node.publication_events is publication_events
                broker = FakeBroker()
                wrapper.broker = broker  # type: ignore[assignment]
                neighbour = peer_address
                peer_envelope(wrapper, peer_address)  # as after a first exchange: the wrapper stamps the peer's epoch
                protocol.pause_writing()  # as asyncio does above the write-buffer high-water mark
                message = wire.TopicMessage("t/#", node.address, node.epoch, 1, 1, 0, "t/x", b"p", 0, False, None)
                reliable = dataclasses.replace(message, seq=2, qos=1)
                node.outbox.send(wire.TOPIC_MESSAGE, message, [neighbour])
                node.outbox.send(wire.TOPIC_MESSAGE, reliable, [neighbour])
                node.outbox.send(wire.HELLO, wire.Hello(99, 0.0), [neighbour])
                wrapper._drain_outputs(wrapper.clock.now())
                assert node.drops["send_backlog_qos0"] == 1
                assert wrapper.event_counts["publication_dropped"] == (1 if publication_events else 0)
                assert wrapper.intake_paused and not broker.reading_paused
                overload = wrapper.status_document()["daemon"]["overload"]
                assert overload["send_shed_qos0"] == 1 and overload["kernel_receive_drops"] == 0
                data, _ = peer.recvfrom(65535)  # the hello and the QoS 1 copy went out, batched
                packets = packets_in(data)
                assert [wire.packet_type(p) for p in packets] == [wire.TOPIC_MESSAGE, wire.HELLO]
                assert wire.decode(packets[0], len(packets[0]), 1 << 16).body.qos == 1  # type: ignore[union-attr]
                protocol.resume_writing()  # the buffer drained: take publications again
                assert not wrapper.intake_paused and not broker.reading_paused
                node.outbox.send(wire.TOPIC_MESSAGE, dataclasses.replace(message, seq=3), [neighbour])
                wrapper._drain_outputs(wrapper.clock.now())
                assert node.drops["send_backlog_qos0"] == 1  # not paused: sent
                data, _ = peer.recvfrom(65535)
        finally:
            wrapper.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("publication_events", [True, False])
def test_a_full_receive_backlog_counts_every_drop_and_reports_them_with_the_publication_events(
        publication_events: bool, tmp_path: Path) -> None:
    """Shedding from the receive backlog: each dropped QoS 0 `tm` is counted; it becomes a
    `publication_dropped` event (naming the publication) only on a node that makes the per-publication events."""

    async def scenario() -> None:
        wrapper = await started_wrapper(tmp_path / "events.jsonl" if publication_events else None)
        try:
            node = wrapper.node
            assert node.publication_events is publication_events
            node.events_emitted()
            wrapper.receiving.backlog = PacketBacklog(max_packets=3, max_bytes=1 << 20)
            envelope = peer_envelope(wrapper, ORIGIN)
            for seq in range(1, 9):
                envelope.send(tm(seq), wrapper.config.bind)
            datagrams = [(data, ORIGIN) for data, _ in envelope.datagrams_to_send()]
            wrapper.receiving.receive(datagrams)
            assert len(wrapper.receive_backlog) == 3
            assert node.drops["receive_backlog_qos0"] == 5
            dropped = [e for e in node.events_emitted() if e.type == "publication_dropped"]
            if publication_events:
                assert [(e.fields["pub"], e.fields["reason"]) for e in dropped] == [
                    (f"{ORIGIN}/1/{seq}", "receive_backlog") for seq in range(1, 6)]
            else:
                assert dropped == []
        finally:
            wrapper.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("limit", [1, 5])
def test_read_waiting_takes_at_most_limit(limit: int) -> None:
    async def scenario() -> None:
        wrapper = await started_wrapper()
        try:
            with peer_socket() as (peer, peer_address):
                protocol = wrapper.protocol
                wrapper.transport.pause_reading()  # type: ignore[attr-defined]  # keep asyncio off the socket
                for index in range(8):
                    peer.sendto(b"\xfe" + bytes([index]) * 40, ("127.0.0.1", wrapper.config.bind.port))
                await asyncio.sleep(0.05)
                first = protocol.read_waiting(limit)
                rest = protocol.read_waiting(100)
                assert len(first) == limit and len(first) + len(rest) == 8
                assert protocol.read_waiting(100) == []
        finally:
            wrapper.close()

    asyncio.run(scenario())


def test_an_empty_datagram_first_hides_none_behind_it() -> None:
    """`read_waiting` asks FIONREAD first, which says 0 for an empty datagram as for none: it then reads
    nothing, and what waits behind is read once the empty one is taken (asyncio's read does that)."""
    async def scenario() -> None:
        wrapper = await started_wrapper()
        try:
            with peer_socket() as (peer, _peer_address):
                protocol = wrapper.protocol
                assert protocol.sock is not None
                wrapper.transport.pause_reading()  # type: ignore[attr-defined]  # keep asyncio off the socket
                target = ("127.0.0.1", wrapper.config.bind.port)
                peer.sendto(b"", target)
                for index in range(3):  # on loopback, queued at the receiver when sendto returns
                    peer.sendto(b"\xfe" + bytes([index]) * 40, target)
                assert protocol.read_waiting(100) == []
                assert protocol.sock.recvfrom(MAX_DATAGRAM_READ)[0] == b""
                assert [data[1] for data, _source in protocol.read_waiting(100)] == [0, 1, 2]
        finally:
            wrapper.close()

    asyncio.run(scenario())


def test_the_largest_datagram_arrives_whole_through_asyncio() -> None:
    """asyncio's transport reads with `MAX_DATAGRAM_READ`, not its 256 KiB default; every datagram fits it."""
    async def scenario() -> None:
        received: list[bytes] = []
        arrived = asyncio.Event()

        def on_datagram(data: bytes, _source: Address) -> None:
            received.append(data)
            arrived.set()

        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        protocol = OverlayProtocol(LocalAddresses({"127.0.0.1"}), sock=sock)
        protocol.attach(on_datagram, lambda _addr: None, lambda: None)
        transport, _ = await loop.create_datagram_endpoint(lambda: protocol, sock=sock)
        try:
            assert getattr(transport, "max_size", MAX_DATAGRAM_READ) == MAX_DATAGRAM_READ
            with peer_socket() as (peer, _peer_address):
                peer.sendto(b"\xfe" * 65507, sock.getsockname())  # IPv4's largest UDP payload
                await asyncio.wait_for(arrived.wait(), 5)
            assert [len(data) for data in received] == [65507]
        finally:
            transport.close()

    asyncio.run(scenario())


def test_datagrams_the_kernel_dropped_for_a_full_receive_buffer_are_counted() -> None:
    """What overflows the receive buffer never reaches the wrapper; the kernel's count is how it is seen."""
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel doubles it: a few datagrams
        receiver.bind(("127.0.0.1", 0))
        assert kernel_receive_drops(receiver) == 0
        for _ in range(200):
            sender.sendto(b"x" * 1000, receiver.getsockname())
        assert (kernel_receive_drops(receiver) or 0) > 100  # nothing read: most did not fit
    finally:
        receiver.close()
        sender.close()
    assert kernel_receive_drops(receiver) is None  # closed


class SlowBroker(FakeBroker):
    """A broker that completes nothing: every publication handed over stays in its backlog."""

    def __init__(self) -> None:
        super().__init__()
        self.handed = 0

    def backlog(self) -> int:
        return self.handed

    def publish_all(self, items: Any) -> None:
        self.handed += len(items)


def test_a_backed_up_broker_stops_the_wrapper_taking_new_qos1_copies() -> None:
    """Publications wait for a broker that takes nothing: before the queue must drop any, the node is told
    to leave new QoS 1/2 copies unacknowledged, and told again to take them once the queue empties."""

    async def scenario() -> None:
        wrapper = await started_wrapper()
        try:
            node = wrapper.node
            broker = SlowBroker()
            wrapper.broker = broker  # type: ignore[assignment]
            injection = Injection("a/b", b"x", 1, False, None, (ORIGIN, 1, 1))
            now = wrapper.clock.now()
            node.outbox.injections.extend([injection] * BROKER_BACKLOG)
            wrapper._drain_outputs(now)
            assert broker.handed == BROKER_BACKLOG and len(wrapper.flow.injection_queue) == 0
            node.outbox.injections.extend([injection] * (INJECTION_BACKLOG_HIGH - 1))
            wrapper._drain_outputs(now)
            assert not node.delivery_backlogged
            node.outbox.injections.append(injection)
            wrapper._drain_outputs(now)
            assert len(wrapper.flow.injection_queue) == INJECTION_BACKLOG_HIGH and node.delivery_backlogged
            assert wrapper.flow.injection_queue.dropped["qos12"] == 0
            broker.handed = 0  # the broker caught up
            wrapper._on_broker_completed()
            assert not node.delivery_backlogged
        finally:
            wrapper.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("publication_events", [True, False])
def test_publications_dropped_toward_a_slow_broker_are_counted_and_qos12_always_reported(
        publication_events: bool) -> None:
    """The injection queue full: a dropped QoS 0 publication is an event only with the per-publication events;
    a dropped QoS 1/2 one, acknowledged hop by hop already, is always reported."""
    class BusyBroker(FakeBroker):
        def backlog(self) -> int:
            return BROKER_BACKLOG  # takes nothing now: everything waits in the queue

    node = Node(ORIGIN, [], 1, random.Random(1), publication_events=publication_events)
    flow = FlowControl()
    flow.injection_queue = InjectionQueue(2)
    made = [Injection("t/x", b"p", qos, False, None, (ORIGIN, 1, seq)) for seq, qos in enumerate((1, 0, 1, 1), 1)]
    node.outbox.injections.extend(made)
    flow.inject(node, BusyBroker(), 0.0, node.injections_to_make())  # type: ignore[arg-type]
    assert node.drops["inject_backlog_qos0"] == 1 and node.drops["inject_backlog_qos12"] == 1
    reported = [e.fields["pub"] for e in node.events_emitted() if e.type == "publication_dropped"]
    assert reported == ([f"{ORIGIN}/1/2", f"{ORIGIN}/1/1"] if publication_events else [f"{ORIGIN}/1/1"])


def test_injections_skip_an_empty_queue_and_queue_behind_a_waiting_one() -> None:
    """Nothing waiting and room at the broker: the injections go at once, in order; once some wait, new ones
    go behind them, and the order the broker sees is still arrival order."""
    handed: list[list[Injection]] = []

    class RecordingBroker(FakeBroker):
        def publish_all(self, items: Any) -> None:
            handed.append(list(items))

    broker = RecordingBroker()
    node = Node(ORIGIN, [], 1, random.Random(1))
    flow = FlowControl()
    made = [Injection("t/x", b"p", seq % 2, False, None, (ORIGIN, 1, seq)) for seq in range(1, 7)]
    node.outbox.injections.extend(made[:2])
    flow.inject(node, broker, 0.0, node.injections_to_make())  # type: ignore[arg-type]
    assert handed == [made[:2]] and not len(flow.injection_queue) and not node.delivery_backlogged
    broker.output_blocked = True
    node.outbox.injections.extend(made[2:4])
    flow.inject(node, broker, 0.0, node.injections_to_make())  # type: ignore[arg-type]
    assert len(handed) == 1 and len(flow.injection_queue) == 2
    broker.output_blocked = False
    node.outbox.injections.extend(made[4:])
    flow.inject(node, broker, 0.0, node.injections_to_make())  # type: ignore[arg-type]
    assert handed[1:] == [made[2:]] and not len(flow.injection_queue)


def test_nothing_is_handed_to_a_broker_whose_socket_is_full_and_the_queue_paces() -> None:
    """paho holds bytes the broker's socket refused: the injections wait in the bounded queue (not in paho's
    unbounded one), where the pacing level sees them; all are handed over once the socket drains."""

    async def scenario() -> None:
        wrapper = await started_wrapper()
        handed: list[Injection] = []

        class BlockedBroker(FakeBroker):
            output_blocked = True

            def publish_all(self, items: Any) -> None:
                handed.extend(items)

        broker = BlockedBroker()
        node = wrapper.node
        try:
            wrapper.broker = broker  # type: ignore[assignment]
            count = INJECTION_BACKLOG // 2
            node.outbox.injections.extend(Injection("t/x", b"p", 0, False, None, (ORIGIN, 1, seq))
                                    for seq in range(1, count + 1))
            wrapper._drain_outputs(wrapper.clock.now())
            assert not handed and len(wrapper.flow.injection_queue) == count
            assert wrapper.receiving.backlog_level() == wrapper.receive_backlog.max_packets // 2
            broker.output_blocked = False
            while len(wrapper.flow.injection_queue):
                before = len(handed)
                wrapper._on_broker_completed()  # what the adapter calls once its socket took the bytes
                assert len(handed) > before
            assert len(handed) == count and not node.drops
        finally:
            wrapper.close()

    asyncio.run(scenario())


# ------------------------------------------------------------ clock stamps (the hello exchange's bound)

def test_the_clock_anchors_on_its_tightest_bracketed_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A preemption between the wall and monotonic reads would offset this wrapper's clock from its
    neighbours' on one host; the anchor comes from the try whose monotonic reads are closest."""
    monotonic = iter([10.0, 10.005,  # preempted for 5 ms: not this one
                      20.0, 20.000002, 30.0, 30.001, 40.0, 40.001, 50.0, 50.001])
    walls = iter([1000.0, 2000.0, 3000.0, 4000.0, 5000.0])
    monkeypatch.setattr(clock_module.time, "monotonic", lambda: next(monotonic))
    monkeypatch.setattr(clock_module.time, "time", lambda: next(walls))
    clock = Clock()
    monkeypatch.setattr(clock_module.time, "monotonic", lambda: 20.5)
    assert clock.now() == pytest.approx(2000.0 + 20.5 - 20.000001, abs=1e-9)


class TickingClock:
    """1 ms per reading: shows which reading stamped what."""

    def __init__(self) -> None:
        self.value = 1000.0

    def now(self) -> float:
        self.value += 0.001
        return self.value


def test_a_hello_drained_from_the_socket_is_answered_with_a_time_after_it_was_read() -> None:
    """A hello read from the socket behind another datagram is stamped by a clock reading taken after the
    read; stamped before, a neighbour on the same clock would measure an offset beyond its error bound."""

    async def scenario() -> None:
        wrapper = await started_wrapper()
        try:
            with peer_socket() as (peer, peer_address):
                clock = TickingClock()
                wrapper.clock = clock  # type: ignore[assignment]
                protocol = wrapper.protocol
                read_at: list[float] = []
                read_waiting = protocol.read_waiting

                def recorded_read_waiting(limit: int) -> list[tuple[bytes, Address]]:
                    read_at.append(clock.value)  # no clock reading: the time the socket was read
                    return read_waiting(limit)

                protocol.read_waiting = recorded_read_waiting  # type: ignore[method-assign]
                envelope = peer_envelope(wrapper, peer_address)
                envelope.send(hello(peer_address, seq=7), wrapper.config.bind)
                for data, _ in envelope.datagrams_to_send():
                    peer.sendto(data, (wrapper.config.bind.host, wrapper.config.bind.port))
                deadline = time.monotonic() + 5
                while not _readable(wrapper) and time.monotonic() < deadline:
                    pass  # no await: the loop must not read the hello itself
                assert _readable(wrapper)
                wrapper.receiving.on_datagram(b"not a packet", peer_address)  # the hello waits in the socket behind it
                assert read_at
                data, _ = peer.recvfrom(65535)
                packets = packets_in(data)
                [answer] = [p for p in packets if wire.packet_type(p) == wire.HELLO_BACK]
                body = wire.decode(answer, len(answer), 1 << 16).body
                assert isinstance(body, wire.HelloBack) and body.echo_seq == 7
                assert body.replied_at > read_at[0]
        finally:
            wrapper.close()

    asyncio.run(scenario())


def _readable(wrapper: Running) -> bool:
    """a datagram waits in the wrapper's socket (peeked, not taken)"""
    sock = wrapper.sock
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return False


# ------------------------------------------------------------ QoS 0 pacing (`rb`, federation.protocol.pacing)

def test_a_long_receive_backlog_tells_its_source_rb_and_ready_once_worked_off() -> None:
    async def scenario() -> None:
        wrapper = await started_wrapper()
        try:
            with peer_socket() as (peer, peer_address):
                node = wrapper.node
                node.neighbours.add_dynamic(peer_address)  # known, as a configured neighbour would be
                envelope = peer_envelope(wrapper, peer_address)
                for seq in range(1, node.pacing.high + 1):
                    envelope.send(tm(seq, origin=peer_address), wrapper.config.bind)
                wrapper.receiving.receive([(data, peer_address) for data, _ in envelope.datagrams_to_send()])
                wrapper._drain_outputs(wrapper.clock.now())
                assert node.pacing.busy and len(wrapper.receive_backlog) == node.pacing.high
                assert kinds_received(peer) == [(wire.RECEIVER_BUSY, node.pacing.hold)]
                while len(wrapper.receive_backlog) > 0:  # worked off a slice at a time
                    wrapper.receiving.data_pass(wrapper.clock.now())
                assert not node.pacing.busy
                assert kinds_received(peer) == [(wire.RECEIVER_BUSY, 0.0)]
                assert node.drops["receive_backlog_qos0"] == 0
        finally:
            wrapper.close()

    asyncio.run(scenario())


def kinds_received(peer: socket.socket) -> list[tuple[str, float | None]]:
    """the `rb` (type, hold) in the next datagram the peer receives, other packets by type alone"""
    data, _ = peer.recvfrom(65535)
    out: list[tuple[str, float | None]] = []
    for packet in packets_in(data):
        body = wire.decode(packet, len(packet), 1 << 16).body
        out.append((wire.packet_type(packet) or "?", body.hold if isinstance(body, wire.ReceiverBusy) else None))
    return out


def test_a_paced_wrapper_stops_reading_its_broker_until_the_hold_ends() -> None:
    async def scenario() -> None:
        wrapper = await started_wrapper()
        try:
            node = wrapper.node
            broker = FakeBroker()
            wrapper.broker = broker  # type: ignore[assignment]
            neighbour = Address("127.0.0.1", free_port())
            node.pacing.on_receiver_busy(neighbour, 0.05, wrapper.clock.now())
            wrapper._drain_outputs(wrapper.clock.now())
            assert wrapper.intake_paused and wrapper.flow.backpressure_pauses == 1 and not broker.reading_paused
            deadline = time.monotonic() + 5
            while wrapper.intake_paused and time.monotonic() < deadline:
                await asyncio.sleep(0.01)  # nothing arrives: the hold's end alone wakes the wrapper
            assert not wrapper.intake_paused and node.pacing.paced(wrapper.clock.now()) is None
            node.pacing.on_receiver_busy(neighbour, 5.0, wrapper.clock.now())
            wrapper._drain_outputs(wrapper.clock.now())
            assert wrapper.intake_paused and wrapper.flow.backpressure_pauses == 2
            node.pacing.on_receiver_busy(neighbour, 0.0, wrapper.clock.now())  # ready: take them again at once
            wrapper._drain_outputs(wrapper.clock.now())
            assert not wrapper.intake_paused and not broker.reading_paused
        finally:
            wrapper.close()

    asyncio.run(scenario())


def test_a_paused_intake_holds_what_it_reads_in_order_and_stops_the_socket_only_past_its_bounds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 37: a wrapper whose intake pauses keeps reading its broker's socket (its injections' acknowledgements
    come on it); the publications it reads meanwhile wait, unacknowledged, and reach the node in order when the
    intake resumes; beyond `HELD_MAX` of them the socket pauses too (the broker keeps the rest)."""
    from federation.daemon import running as running_module
    from federation.daemon.broker_items import Publication, PublicationRun

    monkeypatch.setattr(running_module, "HELD_MAX", 5)

    async def scenario() -> None:
        wrapper = await started_wrapper()
        try:
            node = wrapper.node
            broker = FakeBroker()
            wrapper.broker = broker  # type: ignore[assignment]
            taken: list[list[str]] = []
            acknowledged: list[tuple[int, int]] = []
            node.local_publish_run = (  # type: ignore[method-assign]
                lambda run, now, qos=0: taken.append([t for t, _ in run]) or [None] * len(run))
            broker.acknowledge = acknowledged.extend  # type: ignore[attr-defined]
            neighbour = Address("127.0.0.1", free_port())
            node.pacing.on_receiver_busy(neighbour, 5.0, wrapper.clock.now())
            wrapper._drain_outputs(wrapper.clock.now())
            assert wrapper.intake_paused and not broker.reading_paused
            wrapper._on_broker_items([PublicationRun(["a/1", "a/2"], [b"1", b"2"], 1, [1, 2])])
            wrapper._on_broker_items([Publication("a/3", b"3", 1, False, None, 3, False)])
            assert taken == [] and acknowledged == [] and not broker.reading_paused  # held, not acknowledged
            wrapper._on_broker_items([PublicationRun(["a/4", "a/5"], [b"4", b"5"], 1, [4, 5])])
            assert broker.reading_paused  # five held: the socket waits now
            node.pacing.on_receiver_busy(neighbour, 0.0, wrapper.clock.now())  # ready again
            wrapper._drain_outputs(wrapper.clock.now())
            deadline = time.monotonic() + 5
            while not taken and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert [topic for run in taken for topic in run] == ["a/1", "a/2", "a/3", "a/4", "a/5"]
            assert sorted(acknowledged) == [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1)]
            assert not wrapper.intake_paused and not broker.reading_paused
        finally:
            wrapper.close()

    asyncio.run(scenario())
