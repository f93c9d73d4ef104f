"""`python -m suites.bench.hotpath`: CPU per message through each stage of a wrapper's data path.

Theory of operation: a federated publication costs one wrapper (A) a paho
receive, `Node.local_publish_run` (a burst as one run, as the runtime hands
it over: sent as `tb` at QoS 0, as `tq` with each publication in custody at
QoS 1) and the envelope's batching, and the next wrapper (B) the envelope's checks,
`Node.receive_packet` (with `Node.injection_done` for QoS 1, whose
acknowledgements wait for it) and a paho publish; both write events to the
event log. The end-to-end benchmark
(`python -m suites.bench`) shows the sum, and a whole-process profile
mixes in the event loop and the brokers. This command runs every stage in
one process, on two real `Node`s joined in memory (converged first: B
subscribed to `bench/#`, A publishes `bench/...`) and a real
`BrokerAdapter` whose paho client talks over a Unix socket pair instead of a
broker (so the system calls paho makes per packet are counted too). Each
stage is timed alone with process CPU time (`time.process_time`, so other
processes competing for the CPU inflate it less than wall-clock time), on
bursts of `--burst` messages as the runtime hands them over, repeated
`--repeat` times; the median is printed in microseconds per message.
`--profile STAGE` runs that stage under cProfile instead.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import random
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any

from federation.daemon.broker import BrokerAdapter
from federation.daemon.broker_items import BrokerItem, Publication, PublicationRun
from federation.envelope.datagrams import Envelope
from federation.protocol.node import Node
from federation.protocol.types import Address, Event, Injection, expand_runs, only_runs

A = Address("127.0.0.10", 10500)
B = Address("127.0.0.11", 10500)
FILTER = "bench/#"
STAGES = ("paho_receive", "node_originate", "envelope_send", "envelope_receive", "node_receive", "paho_publish",
          "acknowledgements", "event_log")


def publish_packet(topic: str, payload: bytes, qos: int, mid: int, dup: bool = False) -> bytes:
    """An MQTT v5 PUBLISH as the broker sends it (no properties; `dup`: sent again after a reconnection)."""
    topic_bytes = topic.encode("utf-8")
    body = len(topic_bytes).to_bytes(2, "big") + topic_bytes
    if qos:
        body += mid.to_bytes(2, "big")
    body += b"\x00" + payload
    length = len(body)
    header = bytearray([0x30 | (qos << 1) | (0x08 if dup else 0)])
    while True:
        byte, length = length & 0x7F, length >> 7
        header.append(byte | (0x80 if length else 0))
        if not length:
            break
    return bytes(header) + body


@dataclass
class Pipeline:
    """Two converged nodes, their envelopes, and a paho-backed adapter on a socket pair."""

    qos: int
    payload: bytes
    publication_events: bool = True
    now: float = 1000.0
    items: list[BrokerItem] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.a = Node(A, [B], 1, random.Random(1), name="a", publication_events=self.publication_events)
        self.b = Node(B, [A], 1, random.Random(2), name="b", publication_events=self.publication_events)
        self.env_a = Envelope(A, 1)
        self.env_b = Envelope(B, 1)
        for node in (self.a, self.b):
            node.start(self.now)
        self.b.local_subscribe("bench-sub", FILTER, 2, self.now)
        self._converge()
        self.loop = asyncio.new_event_loop()  # never run: the adapter only needs it to pick the loop-driven path
        # No read coalescing: the bench sets the size of each pass itself (--burst).
        self.adapter = BrokerAdapter(Address("127.0.0.1", 1883), "hotpath", self.items.append, loop=self.loop,
                                     read_coalesce=0)
        self.mqtt_side, self.peer = socket.socketpair()
        for sock in (self.mqtt_side, self.peer):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.mqtt_side.setblocking(False)
        self.adapter.client._sock = self.mqtt_side  # type: ignore[assignment]  # what reconnect() would set
        reading = self.adapter.reading
        assert reading is not None  # the loop-driven adapter
        reading.watched = self.mqtt_side
        self.reading = reading
        self.seq = 0

    def _converge(self) -> None:
        """Exchange datagrams with a simulated clock until a publication from A reaches B."""
        for _ in range(200):
            self.now += 0.05
            for node in (self.a, self.b):
                node.handle_timer(self.now)
            self._exchange()
            if self.a.mesh.topics.get(FILTER) is not None and self._probe():
                self.a.events_emitted()
                self.b.events_emitted()
                return
        raise RuntimeError("the two in-memory nodes did not converge; the benchmark cannot run")

    def _exchange(self) -> None:
        for _ in range(20):
            moved = False
            for node, env, other_node, other_env in ((self.a, self.env_a, self.b, self.env_b),
                                                     (self.b, self.env_b, self.a, self.env_a)):
                for data, to in node.packets_to_send():
                    env.send(data, to, self.now)
                for data, _to in env.datagrams_to_send(self.now):
                    moved = True
                    for packet in other_env.receive_datagram(data, node.address, self.now):
                        other_node.receive_packet(packet, node.address, self.now)
            if not moved:
                return

    def _probe(self) -> bool:
        self.a.local_publish("bench/probe", b"p", 0, False, None, self.now)
        self._exchange()
        return bool(self.b.injections_to_make())

    # ------------------------------------------------------------ stages, one burst each

    def run_burst(self, burst: int, timed: dict[str, float]) -> None:
        clock = time.process_time
        qos, payload = self.qos, self.payload
        # Broker -> paho on A.
        packets = b"".join(publish_packet(f"bench/t{i % 4}", payload, qos, (self.seq + i) % 65535 + 1)
                           for i in range(burst))
        self.seq += burst
        self.peer.sendall(packets)
        self.items.clear()
        start = clock()
        self.reading.on_readable()
        # What the runtime does with them (Running._on_broker_items): one run of (topic, payload) for the node,
        # and the pass's QoS 1 ones acknowledged in one write.
        run: list[tuple[str, bytes]] = []
        mqtt_acks: list[tuple[int, int]] = []
        for item in self.items:
            if isinstance(item, PublicationRun):
                run += zip(item.topics, item.payloads, strict=True)
                mqtt_acks += zip(item.mids, repeat(item.qos))
            elif isinstance(item, Publication):
                run.append((item.topic, item.payload))
                mqtt_acks.append((item.mid, item.qos))
        if qos:
            self.adapter.acknowledge(mqtt_acks)
        timed["paho_receive"] += clock() - start
        self._drain_peer()
        if len(run) != burst:
            raise RuntimeError(f"paho delivered {len(run)} of {burst} publications")
        # Node A: originate.
        now = self.now
        a, b = self.a, self.b
        start = clock()
        a.local_publish_run(run, now, qos=qos)  # as the runtime hands a run of plain publications of one QoS
        datagrams = a.packets_to_send()
        events_a = a.events_emitted()
        timed["node_originate"] += clock() - start
        # Envelope A.
        start = clock()
        for data, to in datagrams:
            self.env_a.send(data, to, now)
        out = self.env_a.datagrams_to_send(now)
        timed["envelope_send"] += clock() - start
        # Envelope B, node B.
        start = clock()
        opened = [(packet, A) for data, _to in out for packet in self.env_b.receive_datagram(data, A, now)]
        timed["envelope_receive"] += clock() - start
        start = clock()
        for packet, source in opened:
            b.receive_packet(packet, source, now)
        made = b.injections_and_runs_to_make()
        runs = only_runs(made)  # as the runtime: runs whole only when the pass holds nothing else
        injections = [] if runs else expand_runs(made)
        if qos:  # custody: the acknowledgements leave once the broker has the publications (here: at once)
            for injection in injections:
                b.injection_done(injection.publication, now)
        acks = b.packets_to_send()
        events_b = b.events_emitted()
        timed["node_receive"] += clock() - start
        made_count = len(injections) if injections else sum(map(len, runs))
        if made_count != burst:
            raise RuntimeError(f"node B made {made_count} injections of {burst}")
        # paho publish on B (into the socket pair), as the runtime does: runs whole when all are runs.
        start = clock()
        if injections:
            self.adapter.publish_all(injections)
        else:
            self.adapter.publish_runs(runs)
        timed["paho_publish"] += clock() - start
        self._drain_peer()
        # Event log (JSON lines) on both wrappers.
        start = clock()
        self.event_sink(events_a)
        self.event_sink(events_b)
        timed["event_log"] += clock() - start
        # B's acknowledgements back to A (QoS 1/2: custody ends there), envelopes included.
        start = clock()
        for data, to in acks:
            self.env_b.send(data, to, now)
        for data, _to in self.env_b.datagrams_to_send(now):
            for packet in self.env_a.receive_datagram(data, B, now):
                a.receive_packet(packet, B, now)
        a.packets_to_send()
        a.events_emitted()
        released = a.custody_released()
        timed["acknowledgements"] += clock() - start
        if qos and len(released) != burst:
            raise RuntimeError(f"node A released {len(released)} of {burst} publications")
        # Untimed: completing paho's QoS 1/2 exchanges.
        self._ack_paho(injections)
        self.now += 0.001

    event_sink: Callable[[list[Event]], None] = staticmethod(lambda batch: None)  # type: ignore[assignment]

    def _drain_peer(self) -> None:
        self.peer.setblocking(False)
        try:
            while self.peer.recv(1 << 20):
                pass
        except BlockingIOError:
            pass

    def _ack_paho(self, injections: Sequence[Injection]) -> None:
        """The broker's side of QoS 1/2: PUBACK / PUBREC+PUBCOMP for every message paho holds."""
        client: Any = self.adapter.client
        mids = list(client._out_messages)
        if not mids:
            return
        acks = bytearray()
        for mid in mids:
            qos = client._out_messages[mid].qos
            acks += bytes([0x40 if qos == 1 else 0x50, 2]) + mid.to_bytes(2, "big")
        self.peer.sendall(bytes(acks))
        self.reading.on_readable()
        self._drain_peer()
        if any(client._out_messages[mid].qos == 2 for mid in mids if mid in client._out_messages):
            self.peer.sendall(b"".join(bytes([0x70, 2]) + mid.to_bytes(2, "big")
                                       for mid in list(client._out_messages)))
            self.reading.on_readable()
            self._drain_peer()

    def close(self) -> None:
        self.adapter.client._sock = None
        self.mqtt_side.close()
        self.peer.close()
        self.loop.close()


def _event_log_sink(path: Path) -> tuple[Callable[[list[Event]], None], Callable[[], None]]:
    from federation.daemon.event_log import EventLog
    log = EventLog(path, None)
    return log.write, log.close


def measure(qos: int, size: int, burst: int, messages: int, repeat: int,
            publication_events: bool = True) -> dict[str, float]:
    """Median µs per message for every stage."""
    per_stage: dict[str, list[float]] = {stage: [] for stage in STAGES}
    pipeline = Pipeline(qos, b"x" * size, publication_events)
    write, close = _event_log_sink(Path(os.devnull))
    pipeline.event_sink = write  # type: ignore[assignment]
    try:
        for _ in range(max(1, 2000 // burst)):  # warm-up: caches, allocator, paho's first packets
            pipeline.run_burst(burst, {stage: 0.0 for stage in STAGES})
        for _ in range(repeat):
            timed = {stage: 0.0 for stage in STAGES}
            for _ in range(max(1, messages // burst)):
                pipeline.run_burst(burst, timed)
            count = max(1, messages // burst) * burst
            for stage in STAGES:
                per_stage[stage].append(timed[stage] / count * 1e6)
    finally:
        close()
        pipeline.close()
    return {stage: statistics.median(values) for stage, values in per_stage.items()}


def profile(stage: str, qos: int, size: int, burst: int, messages: int, lines: int,
            publication_events: bool = True) -> str:
    pipeline = Pipeline(qos, b"x" * size, publication_events)
    write, close = _event_log_sink(Path(os.devnull))
    pipeline.event_sink = write  # type: ignore[assignment]
    profiler = cProfile.Profile()
    timed = {s: 0.0 for s in STAGES}
    try:
        for _ in range(max(1, 2000 // burst)):
            pipeline.run_burst(burst, timed)
        profiler.enable()
        for _ in range(max(1, messages // burst)):
            pipeline.run_burst(burst, timed)
        profiler.disable()
    finally:
        close()
        pipeline.close()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(lines)
    return out.getvalue()


def compare_events(qos: int, size: int, burst: int, messages: int, repeat: int) -> tuple[list[float], list[float]]:
    """Total µs per message without and with the publication events, each repetition running both pipelines one
    after the other (so a machine whose speed drifts, as a shared one does, affects both alike): the totals per
    repetition, off and on."""
    pipelines = {wanted: Pipeline(qos, b"x" * size, wanted) for wanted in (False, True)}
    sinks = {wanted: _event_log_sink(Path(os.devnull)) for wanted in pipelines}
    for wanted, pipeline in pipelines.items():
        pipeline.event_sink = sinks[wanted][0]  # type: ignore[assignment]
    totals: dict[bool, list[float]] = {False: [], True: []}
    try:
        for pipeline in pipelines.values():
            for _ in range(max(1, 2000 // burst)):
                pipeline.run_burst(burst, {stage: 0.0 for stage in STAGES})
        for index in range(repeat):
            for wanted in ((False, True) if index % 2 == 0 else (True, False)):
                timed = {stage: 0.0 for stage in STAGES}
                for _ in range(max(1, messages // burst)):
                    pipelines[wanted].run_burst(burst, timed)
                totals[wanted].append(sum(timed.values()) / (max(1, messages // burst) * burst) * 1e6)
    finally:
        for wanted, pipeline in pipelines.items():
            sinks[wanted][1]()
            pipeline.close()
    return totals[False], totals[True]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suites.bench.hotpath",
                                     description=__doc__.split("\n\n")[0])
    # Not QoS 2: paho hands a received QoS 2 PUBLISH over only after the broker's PUBREL, which the
    # stand-in broker here does not send.
    parser.add_argument("--qos", type=int, nargs="+", default=[0, 1], choices=(0, 1))
    parser.add_argument("--size", type=int, nargs="+", default=[64], help="payload bytes")
    parser.add_argument("--burst", type=int, nargs="+", default=[1, 32],
                        help="messages read from the broker in one pass (1: paced traffic; 32: a burst)")
    parser.add_argument("--messages", type=int, default=5000, help="messages per repetition")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions; the median is printed")
    parser.add_argument("--profile", choices=STAGES + ("all",), help="run under cProfile and print the top functions")
    parser.add_argument("--publication-events", nargs="+", choices=("on", "off"), default=["on"],
                        help="the per-publication events (off: as a wrapper whose event log does not keep them)")
    parser.add_argument("--compare-events", action="store_true",
                        help="alternate the same runs without and with the publication events and print the totals "
                             "and their ratio (medians over --repeat)")
    args = parser.parse_args(argv)
    if args.compare_events:
        print(f"{'qos':>5} {'size':>5} {'burst':>5} {'off µs':>10} {'on µs':>10} {'on / off':>10}")
        for qos in args.qos:
            for size in args.size:
                for burst in args.burst:
                    off, on = compare_events(qos, size, burst, args.messages, args.repeat)
                    ratio = statistics.median(b / a for a, b in zip(off, on, strict=True))
                    print(f"{qos:>5} {size:>5} {burst:>5} {statistics.median(off):>10.1f} "
                          f"{statistics.median(on):>10.1f} {ratio:>10.3f}", flush=True)
        print(f"µs of process CPU per message, both wrappers, every stage; medians of {args.repeat} alternated "
              f"repetitions of {args.messages} messages; load average {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} CPUs", file=sys.stderr)
        return 0
    if args.profile:
        print(profile(args.profile, args.qos[0], args.size[0], args.burst[0], args.messages, 40,
                      args.publication_events[0] == "on"))
        return 0
    header = ["events", "qos", "size", "burst", *STAGES, "total"]
    print(" ".join(f"{h:>16}" if i >= 4 else f"{h:>6}" if i == 0 else f"{h:>5}" for i, h in enumerate(header)))
    for events_wanted in args.publication_events:
        for qos in args.qos:
            for size in args.size:
                for burst in args.burst:
                    result = measure(qos, size, burst, args.messages, args.repeat, events_wanted == "on")
                    cells = [f"{events_wanted:>6}", f"{qos:>5}", f"{size:>5}", f"{burst:>5}"]
                    cells += [f"{result[stage]:>16.1f}" for stage in STAGES]
                    cells.append(f"{sum(result.values()):>16.1f}")
                    print(" ".join(cells), flush=True)
    print(f"µs of process CPU per message, median of {args.repeat} x {args.messages} messages; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
