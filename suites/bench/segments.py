"""`python -m suites.bench.segments`: where a publication's latency goes, process by process.

Theory of operation: one paced run (`runner.run_case`) on one setup, while a
child process captures the loopback interface with a raw `AF_PACKET` socket
(root or CAP_NET_RAW) and the kernel's receive timestamps. Every measured
payload starts with its sequence number (`stats.payload_line`), so each TCP
segment or UDP datagram that carries it is matched to it whatever wraps it
(an MQTT PUBLISH, a `tm`; not an encrypted overlay, which the benchmark
setups do not use). A publication's crossings, ordered in time, form its
path; the time between two consecutive crossings is what the process
between them held it: its wake-up, its work and its send. Which process
owns each address comes from `ss`, asked by the capture once the path
carries data. The capture is a process of its own, so it competes with the
measured path for the CPUs like any process, not for the publisher's GIL;
it still costs CPU, so the figures are somewhat above the benchmark's: the
split is the point, not the sum.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from federation.tools.launch import LaunchError
from suites.bench.runner import Case, run_case
from suites.bench.setups import Setup, SetupSpec
from suites.bench.stats import SEQ_DIGITS, STAMP_DIGITS, percentile

ETH_P_ALL = 0x0003
SO_TIMESTAMPNS = 35
"""Linux's socket option (and control message type) for nanosecond receive timestamps"""
PACKET_HOST = 0
"""a frame addressed to this host (on loopback each frame is seen twice: leaving and arriving)"""
ETHERNET_HEADER = 14
CAPTURE_BUFFER = 8 * 1024 * 1024
SOCKETS_AFTER = 200
"""measured crossings captured before the capture asks `ss` who owns which address (every hop is up then)"""
PRESENT_IN = 0.9
"""a flow is part of the path when at least this share of the publications crossed it"""
MEASURED = re.compile(rb"(\d{%d}) \d{%d} " % (SEQ_DIGITS, STAMP_DIGITS))
SS_LINE = re.compile(r'^(tcp|udp)\s+\S+\s+\d+\s+\d+\s+(\S+):(\d+)\s+\S+\s+users:\(\("([^"]+)",pid=(\d+)')

Endpoint = tuple[str, int]
Flow = tuple[str, Endpoint, Endpoint]
"""("tcp" or "udp", source, destination)"""
Crossing = tuple[int, str, Endpoint, Endpoint, int]
"""(kernel timestamp ns, "tcp" or "udp", source, destination, sequence number of the publication)"""


@dataclass(frozen=True)
class Segment:
    """One stretch of the path: who held the publication, and for how long (µs, over the publications)."""

    holder: str
    to: str
    p50: float
    p90: float
    p99: float
    count: int


def parse_frame(frame: bytes) -> tuple[Flow, bytes] | None:
    """The flow and payload of a captured IPv4 TCP or UDP frame (loopback's zero Ethernet header), else None."""
    ip = frame[ETHERNET_HEADER:]
    if len(ip) < 20 or ip[0] >> 4 != 4:
        return None
    header = (ip[0] & 0x0F) * 4
    protocol = ip[9]
    l4 = ip[header:]
    if len(l4) < 8:
        return None
    source_port, destination_port = struct.unpack_from("!HH", l4)
    if protocol == socket.IPPROTO_TCP and len(l4) >= 20:
        kind, payload = "tcp", l4[(l4[12] >> 4) * 4:]
    elif protocol == socket.IPPROTO_UDP:
        kind, payload = "udp", l4[8:]
    else:
        return None
    source = (socket.inet_ntoa(ip[12:16]), source_port)
    destination = (socket.inet_ntoa(ip[16:20]), destination_port)
    return (kind, source, destination), payload


def parse_sockets(text: str) -> dict[Endpoint, tuple[str, int]]:
    """`ss -Htunap` lines: local address -> (process name, pid)."""
    owners: dict[Endpoint, tuple[str, int]] = {}
    for line in text.splitlines():
        match = SS_LINE.match(line)
        if match:
            owners[(match.group(2), int(match.group(3)))] = (match.group(4), int(match.group(5)))
    return owners


def capture(out: str, ready: Any, stop: Any) -> None:
    """The child process: capture until `stop` is set, then write the crossings and the socket owners to `out`."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CAPTURE_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.bind(("lo", 0))
    sock.settimeout(0.1)
    crossings: list[Crossing] = []
    owners = ""
    ready.set()
    while not stop.is_set():
        try:
            frame, ancillary, _flags, address = sock.recvmsg(1 << 16, 64)
        except (TimeoutError, InterruptedError):
            continue
        if address[2] != PACKET_HOST:
            continue
        parsed = parse_frame(frame)
        if parsed is None or not parsed[1]:
            continue
        (kind, source, destination), payload = parsed
        stamp = next((struct.unpack_from("qq", data) for level, kind_, data in ancillary
                      if level == socket.SOL_SOCKET and kind_ == SO_TIMESTAMPNS), None)
        if stamp is None:
            continue
        for match in MEASURED.finditer(payload):
            crossings.append((stamp[0] * 1_000_000_000 + stamp[1], kind, source, destination, int(match.group(1))))
        if not owners and len(crossings) >= SOCKETS_AFTER:
            owners = subprocess.run(["ss", "-Htunap"], capture_output=True, text=True, check=False).stdout
    sock.close()
    Path(out).write_text(json.dumps({"crossings": crossings, "sockets": owners}))


def segments(crossings: Sequence[Crossing], label: dict[Endpoint, str]) -> list[Segment]:
    """The path the publications took (the flows most of them crossed, in time order) and the time each
    holder kept them; the last row is the whole path, first crossing to last."""
    first_seen: dict[int, dict[Flow, int]] = defaultdict(dict)
    for stamp, kind, source, destination, seq in crossings:
        first_seen[seq].setdefault((kind, source, destination), stamp)
    publications = list(first_seen.values())
    if not publications:
        return []
    counts: dict[Flow, int] = defaultdict(int)
    for flows in publications:
        for flow in flows:
            counts[flow] += 1
    path = [flow for flow, count in counts.items() if count >= PRESENT_IN * len(publications)]
    path.sort(key=lambda flow: statistics.median(flows[flow] - min(flows.values())
                                                 for flows in publications if flow in flows))

    def name(endpoint: Endpoint) -> str:
        return label.get(endpoint, f"{endpoint[0]}:{endpoint[1]}")

    rows: list[Segment] = []
    for before, after in zip(path, path[1:], strict=False):
        rows.append(_segment(name(before[2]), name(after[2]), [
            flows[after] - flows[before] for flows in publications if before in flows and after in flows]))
    if len(path) > 1:
        rows.append(_segment(name(path[0][1]), name(path[-1][2]), [
            flows[path[-1]] - flows[path[0]] for flows in publications if path[0] in flows and path[-1] in flows]))
    return rows


def _segment(holder: str, to: str, gaps_ns: list[int]) -> Segment:
    gaps = sorted(gap / 1000 for gap in gaps_ns)
    return Segment(holder, to, percentile(gaps, 0.50), percentile(gaps, 0.90), percentile(gaps, 0.99), len(gaps))


def labels(owners: dict[Endpoint, tuple[str, int]], setup: Setup) -> dict[Endpoint, str]:
    """Address -> "broker a", "wrapper b", "publisher", "subscriber", from the owners' pids and names."""
    roles: dict[int, str] = {}
    for node_name, node in setup.brokers.nodes.items():
        if node.broker_process is not None:
            roles[node.broker_process.pid] = f"broker {node_name}"
        if node.wrapper_process is not None:
            roles[node.wrapper_process.pid] = f"wrapper {node_name}"
    clients = {"mosquitto_pub": "publisher", "mosquitto_sub": "subscriber"}
    return {endpoint: roles.get(pid, clients.get(process, f"{process} {pid}"))
            for endpoint, (process, pid) in owners.items()}


def report(rows: Sequence[Segment]) -> str:
    lines = [f"{'held by':<14} {'until it reaches':<16} {'p50 µs':>8} {'p90 µs':>8} {'p99 µs':>8} {'n':>6}"]
    for index, row in enumerate(rows):
        if index == len(rows) - 1:
            lines.append(f"{'whole path, ' + row.holder + ' to ' + row.to:<31} {row.p50:>8.1f} {row.p90:>8.1f} "
                         f"{row.p99:>8.1f} {row.count:>6}")
        else:
            lines.append(f"{row.holder:<14} {row.to:<16} {row.p50:>8.1f} {row.p90:>8.1f} {row.p99:>8.1f} "
                         f"{row.count:>6}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suites.bench.segments",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--setup", default="federation-2", help="single, bridge-N or federation-N")
    parser.add_argument("--rate", type=float, default=1000.0, help="offered msg/s")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--qos", type=int, default=0, choices=(0, 1))
    parser.add_argument("--size", type=int, default=64, help="payload bytes")
    parser.add_argument("--publication-events", choices=("on", "off"), default="off")
    parser.add_argument("--subnet", type=int, default=151, help="the setup uses 127.0.SUBNET.10 and up")
    args = parser.parse_args(argv)
    try:
        probe = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    except PermissionError:
        print("segments needs a raw socket on the loopback interface: run it as root (or with CAP_NET_RAW)",
              file=sys.stderr)
        return 2
    probe.close()
    if shutil.which("ss") is None:
        print("segments needs `ss` (Debian package iproute2) to tell which process owns which address",
              file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="federation-segments-"))
    setup = Setup(SetupSpec.parse(args.setup), workdir, args.subnet, publication_events=args.publication_events == "on")
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    out = workdir / "capture.json"
    child = context.Process(target=capture, args=(str(out), ready, stop), daemon=True)
    try:
        setup.start()
        child.start()
        if not ready.wait(10):
            raise LaunchError("the capture process did not start within 10 s")
        case = Case(args.qos, args.size, args.rate, max(1, round(args.rate * args.seconds)))
        summary = run_case(setup, case, f"bench/segments/{int(time.time())}", workdir)  # what the bridges carry
        stop.set()
        child.join(10)
        captured: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {"crossings": [], "sockets": ""}
        names = labels(parse_sockets(captured["sockets"]), setup)
    except LaunchError as error:
        print(f"segments: {error}", file=sys.stderr)
        return 1
    finally:
        stop.set()
        if child.is_alive():
            child.terminate()
        setup.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    crossings: list[Crossing] = [
        (int(stamp), str(kind), (str(source[0]), int(source[1])), (str(destination[0]), int(destination[1])), int(seq))
        for stamp, kind, source, destination, seq in captured["crossings"]]
    rows = segments(crossings, names)
    print(f"{args.setup}, QoS {args.qos}, {args.size} B at {args.rate:g} msg/s: {summary.delivered} of "
          f"{summary.sent} delivered, end to end p50 {summary.p50_ms:.3f} ms (the benchmark's clock, not the "
          f"capture's)")
    print(report(rows) if rows else "no measured payload was captured")
    print(f"µs between a publication's consecutive crossings of the loopback interface (kernel timestamps); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", file=sys.stderr)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
