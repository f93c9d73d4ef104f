"""An attacker's tools against real wrappers on loopback, and the probes that watch the victim.

- `spoof` / `Spoofer`: UDP datagrams with any source address (a raw IP socket; root);
- `Capture`: the UDP payloads between two wrappers, read off the loopback interface (a packet socket; root);
- `KeyHolder`: datagrams sealed with the federation key under a sender name of its choosing, stamped with
  the victim's envelope epoch (what a stolen key file allows);
- `ProcessProbe`: a process's resident memory and CPU time, from /proc;
- `Watch`: liveness of a victim while it is attacked: its status answers within a deadline, its neighbours
  keep it up, a publication from its broker still reaches a neighbour's subscriber.

Nothing here sleeps blindly: waits poll a condition until a deadline.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from federation.daemon.keys import generate_key, read_key_file
from federation.envelope.config import EnvelopeConfig
from federation.envelope.datagrams import Envelope
from federation.protocol.types import Address
from federation.tools.launch import LaunchError, LocalFederation, line

from federation_util import FAST_SETTINGS, next_first_address

HOSTILE_SETTINGS: dict[str, Any] = {**FAST_SETTINGS, "hello_interval": 0.5, "dead_intervals": 6}
"""a neighbour is down after 3 s without a hello back, the default bound (1 s × 3), probed twice a second: a
wrapper stalled by an attack is seen down, one slowed by the other jobs on a loaded 2-CPU machine is not"""
ETH_P_IP = 0x0800
PACKET_OUTGOING = 4
WRAPPER_PORT = 10500
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def victim_pair(workdir: Path, keyed: bool) -> Iterator[LocalFederation]:
    """Brokers and wrappers n0 - n1 (n1 the victim), started and converged, with a new federation key in
    `workdir` (its path in `federation.key_file`) or open; stopped after."""
    key_file = None
    if keyed:
        key_file = workdir / "federation.key"
        key_file.write_text(generate_key() + "\n")
        key_file.chmod(0o600)
    with LocalFederation(2, line(["n0", "n1"]), workdir / "federation", HOSTILE_SETTINGS,
                         first_address=next_first_address(), key_file=key_file) as federation:  # started
        federation.wait_converged(timeout=20)
        yield federation


def wrapper_address(federation: LocalFederation, name: str) -> Address:
    return Address(federation.node(name).host, WRAPPER_PORT)


def udp_ip_packet(source: Address, target: Address, payload: bytes) -> bytes:
    udp = struct.pack(">HHHH", source.port, target.port, 8 + len(payload), 0) + payload  # checksum 0: none
    return struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, socket.IPPROTO_UDP, 0,
                       socket.inet_aton(source.host), socket.inet_aton(target.host)) + udp


class Spoofer:
    """One raw socket for many spoofed datagrams (IPv4; a datagram above 65507 bytes is cut to fit)."""

    def __init__(self) -> None:
        self._raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        self._raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 1024 * 1024)

    def send(self, source: Address, target: Address, payload: bytes) -> None:
        packet = udp_ip_packet(source, target, payload[:65507])
        while True:
            try:
                self._raw.sendto(packet, (target.host, 0))
                return
            except BlockingIOError:  # the socket's buffer is full: the kernel frees it as loopback delivers
                continue

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> Spoofer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def spoof(source: Address, target: Address, payload: bytes) -> None:
    """Send one UDP datagram to `target` that claims to come from `source` (IPv4, raw socket)."""
    with Spoofer() as spoofer:
        spoofer.send(source, target, payload)


class Capture:
    """UDP payloads from `source` to `target` seen on the loopback interface while it runs."""

    def __init__(self, source: Address, target: Address) -> None:
        self.source, self.target = source, target
        self.datagrams: list[bytes] = []
        self._socket = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_IP))
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
        self._socket.bind(("lo", 0))
        self._socket.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._take(*self._socket.recvfrom(70000))
            except TimeoutError:
                continue

    def _take(self, packet: bytes, address: tuple[Any, ...]) -> None:
        if address[2] == PACKET_OUTGOING or len(packet) < 28 or packet[9] != socket.IPPROTO_UDP:
            return
        header = (packet[0] & 0x0F) * 4
        sport, dport = struct.unpack_from(">HH", packet, header)
        wanted = (socket.inet_aton(self.source.host), socket.inet_aton(self.target.host))
        if (packet[12:16], packet[16:20]) == wanted and (sport, dport) == (self.source.port, self.target.port):
            self.datagrams.append(bytes(packet[header + 8:]))

    def stop(self) -> list[bytes]:
        self._stop.set()
        self._thread.join(5)
        # What arrived while the thread was not scheduled (a loaded machine) is still in the socket: take it.
        self._socket.setblocking(False)
        try:
            while True:
                self._take(*self._socket.recvfrom(70000))
        except BlockingIOError:
            pass
        self._socket.close()
        return self.datagrams


class KeyHolder:
    """Seals item bodies or packets as `name` with the federation's key (None: open frames), stamped with the
    victim's envelope epoch (a key holder reads it off any datagram of the victim, or asks its status)."""

    def __init__(self, name: Address, key_file: Path | None, victim: Address, victim_epoch: int,
                 epoch: int = 1) -> None:
        keys = read_key_file(key_file) if key_file is not None else ()
        self.victim = victim
        self.envelope = Envelope(name, epoch, EnvelopeConfig(keys=keys, max_datagram=65507, max_packet=1 << 20,
                                                             reassembly_memory=2 << 20))
        self.envelope.set_peer_epoch(victim, victim_epoch)

    def seal_body(self, body: bytes) -> bytes:
        return self.envelope.seal_body(body, self.victim)

    def seal_packets(self, packets: list[bytes]) -> list[bytes]:
        for packet in packets:
            self.envelope.send(packet, self.victim)
        return [data for data, _ in self.envelope.datagrams_to_send()]


@dataclass
class ProcessProbe:
    """Resident memory and CPU time of one process, read from /proc."""

    pid: int

    def rss(self) -> int:
        """resident bytes"""
        with open(f"/proc/{self.pid}/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * PAGE_SIZE

    def cpu(self) -> float:
        """user + system CPU seconds so far"""
        with open(f"/proc/{self.pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def cpu_share(self, measure: Callable[[], bool], deadline: float) -> float:
        """CPU seconds per wall second while `measure` keeps returning True (at most until `deadline`)."""
        wall, cpu = time.monotonic(), self.cpu()
        while measure() and time.monotonic() < deadline:
            pass
        return (self.cpu() - cpu) / max(time.monotonic() - wall, 1e-3)


def wrapper_probe(federation: LocalFederation, name: str) -> ProcessProbe:
    process = federation.node(name).wrapper_process
    assert process is not None and process.poll() is None, f"the wrapper of {name} is not running"
    return ProcessProbe(process.pid)


@dataclass
class Watch:
    """Liveness of `victim` in a thread, while an attack runs: every `interval` its status must answer within
    `status_deadline` seconds; the `up` flag of the configured neighbours on both sides is recorded."""

    federation: LocalFederation
    victim: str
    status_deadline: float = 2.0
    interval: float = 0.2
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    down: list[str] = field(default_factory=list)
    peak_rss: int = 0
    reassembly_peak: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Watch:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        probe = wrapper_probe(self.federation, self.victim)
        neighbours = self.federation.node(self.victim).neighbours
        while not self._stop.wait(self.interval):
            started = time.monotonic()
            try:
                status = self.federation.status(self.victim, timeout=self.status_deadline)
            except LaunchError as error:
                self.failures.append(f"{time.strftime('%X')}: {error}")
                continue
            self.latencies.append(time.monotonic() - started)
            self.peak_rss = max(self.peak_rss, probe.rss())
            self.reassembly_peak = max(self.reassembly_peak, int(status["envelope"]["reassembly_bytes"]))
            self.down += [f"{self.victim} sees {n['address']} down" for n in status["neighbours"]
                          if n["configured"] and not n["up"]]  # not the strangers an attacker's hellos added
            for name in neighbours:
                try:
                    other = self.federation.status(name, timeout=self.status_deadline)
                except LaunchError as error:
                    self.failures.append(f"{time.strftime('%X')}: {error}")
                    continue
                victim_address = self.federation.node(self.victim).address
                self.down += [f"{name} sees {self.victim} down" for n in other["neighbours"]
                              if n["address"] == victim_address and not n["up"]]

    def problems(self) -> list[str]:
        return self.failures + sorted(set(self.down))


def neighbour_downs(federation: LocalFederation, victim: str) -> list[dict[str, Any]]:
    """`neighbour_down` events about `victim` in its neighbours' event logs, and its own about them (not about
    the strangers an attacker's hellos made dynamic neighbours)."""
    victim_address = federation.node(victim).address
    neighbours = {federation.node(name).address for name in federation.node(victim).neighbours}
    found = [event for name in federation.node(victim).neighbours
             for event in federation.events(name, ["neighbour_down"]) if event.get("neighbour") == victim_address]
    return found + [event for event in federation.events(victim, ["neighbour_down"])
                    if event.get("neighbour") in neighbours]
