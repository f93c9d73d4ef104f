"""One measured run: a paced publisher feeding `mosquitto_pub -l`, `mosquitto_sub` writing to a file.

Theory of operation: the clients are Mosquitto's own C tools, so they are not
what is measured (the `single` setup shows their ceiling). This process only
writes lines into `mosquitto_pub -l`'s stdin at the offered rate, each line
stamped with the time it is written (`stats.payload_line`); the subscriber
prints each message with its receive time (`-F '%U %p'`) straight into a
file, which is parsed after the run. Both use TCP_NODELAY (`--nodelay`).

A run has three phases:

1. probe: a probe line every `PROBE_INTERVAL` until the subscriber has one
   (bridges connect, the federation learns the subscription and builds the
   mesh), then a last "fence" probe whose arrival proves that every earlier
   probe has arrived or never will (the path is FIFO); the probes seen are
   counted, so the measured lines can be counted by file size alone;
2. measure: `count` messages at `rate` per second (None: as fast as the pipe
   takes them), with the CPU time of the brokers, wrappers, clients and the
   whole machine read before;
3. drain: wait until every message arrived, or no line came for `SETTLE`
   seconds (the rest is lost), then read the CPU times again (the
   publisher's when it has exited, before it is reaped).

Each run uses its own topic, so a straggler of one run is never counted in
another; a stray sequence number would show as `unexpected`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from federation.tools.launch import BROKER_PORT, LaunchError, die_with_parent, poll
from suites.bench.setups import Setup, cpu_seconds, find_client, machine_cpu_seconds
from suites.bench.stats import RunSummary, output_line_size, parse_output, payload_line, probe_line, summarize

PROBE_INTERVAL = 0.02
"""seconds between probes while the path is not yet up"""
PROBE_TIMEOUT = 30.0
"""seconds the path gets to carry a first probe"""
SETTLE = 5.0
"""seconds without a new line after which the messages still missing count as lost (long enough for a
wrapper descheduled on a loaded machine to catch up)"""
GRACE = 0.2
"""seconds waited after the last expected line, to count late duplicates"""
BURST = 256
"""lines written at once when the rate is unlimited"""
PACE_TICK = 0.0005
"""seconds the paced publisher sleeps when it is ahead of schedule"""
PUBLISHER_EXIT_TIMEOUT = 120.0
"""seconds `mosquitto_pub` gets to send what it was given and exit (QoS 1 waits for every PUBACK)"""


@dataclass(frozen=True)
class Case:
    """What one run offers: QoS, payload bytes, messages per second (None: as fast as possible), how many."""

    qos: int
    size: int
    rate: float | None
    count: int

    @property
    def label(self) -> str:
        rate = "max" if self.rate is None else f"{self.rate:g}"
        return f"q{self.qos}-{self.size}B-{rate}"


class FileLines:
    """Counts complete lines of a growing file of fixed-size lines by its size (no reading)."""

    def __init__(self, path: Path, line_size: int) -> None:
        self.path = path
        self.line_size = line_size

    def count(self) -> int:
        try:
            return self.path.stat().st_size // self.line_size
        except FileNotFoundError:
            return 0


def run_case(setup: Setup, case: Case, topic: str, workdir: Path, keep_output: bool = False) -> RunSummary:
    """Run one case on a started setup; LaunchError if the path never works or a process dies."""
    workdir.mkdir(parents=True, exist_ok=True)
    tag = topic.replace("/", "-")
    output = workdir / f"{tag}.out"
    output.unlink(missing_ok=True)
    common = ["-p", str(BROKER_PORT), "-t", topic, "-q", str(case.qos), "--nodelay"]
    sub_command = [find_client("mosquitto_sub"), "-h", setup.subscribe_host, *common, "-F", "%U %p",
                   "-i", f"{tag}-sub"]
    pub_command = [find_client("mosquitto_pub"), "-h", setup.publish_host, *common, "-l", "-i", f"{tag}-pub"]
    errors = workdir / f"{tag}.clients.log"
    setup.begin_case(topic, case.qos)
    with open(output, "wb") as sink, open(errors, "wb") as error_sink:
        subscriber = subprocess.Popen(sub_command, stdin=subprocess.DEVNULL, stdout=sink, stderr=error_sink,
                                      process_group=0, preexec_fn=die_with_parent)
        publisher = subprocess.Popen(pub_command, stdin=subprocess.PIPE, stdout=error_sink, stderr=error_sink,
                                     process_group=0, preexec_fn=die_with_parent)
    try:
        assert publisher.stdin is not None
        pipe = publisher.stdin.fileno()
        lines = FileLines(output, output_line_size(case.size))
        probes_seen = _probe(setup, case, pipe, output, lines, subscriber, publisher, errors)
        pids = setup.wrapper_pids(), setup.broker_pids()
        cpu_before = [sum(cpu_seconds(pid) for pid in group) for group in pids]
        clients_before = cpu_seconds(publisher.pid) + cpu_seconds(subscriber.pid)
        machine_before = machine_cpu_seconds()
        drops_before = setup.wrapper_drops()
        first_send_ns = time.time_ns()
        publish_seconds = _publish(pipe, case)
        publisher.stdin.close()
        publisher_cpu = _wait_publisher(publisher, errors)
        _drain(lines, probes_seen + case.count)
        cpu_after = [sum(cpu_seconds(pid) for pid in group) for group in pids]
        clients_after = publisher_cpu + cpu_seconds(subscriber.pid)
        machine_after = machine_cpu_seconds()
        drops = {reason: count - drops_before.get(reason, 0) for reason, count in setup.wrapper_drops().items()}
    finally:
        for process in (publisher, subscriber):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in (publisher, subscriber):
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if publisher.stdin is not None and not publisher.stdin.closed:
            publisher.stdin.close()
        setup.end_case()
    received, bad = parse_output(output.read_bytes().splitlines())
    if not keep_output:
        output.unlink(missing_ok=True)
        errors.unlink(missing_ok=True)
    machine_all = machine_after[1] - machine_before[1]
    summary = summarize(received, case.count, first_send_ns, cpu_wrappers_s=cpu_after[0] - cpu_before[0],
                        cpu_brokers_s=cpu_after[1] - cpu_before[1], bad_lines=bad,
                        publish_seconds=publish_seconds, cpu_clients_s=clients_after - clients_before,
                        idle_fraction=1.0 - (machine_after[0] - machine_before[0]) / machine_all if machine_all > 0
                        else math.nan)
    return dataclasses.replace(summary, wrapper_drops={reason: count for reason, count in sorted(drops.items())
                                                       if count})


def _probe(setup: Setup, case: Case, pipe: int, output: Path, lines: FileLines, subscriber: subprocess.Popen[bytes],
           publisher: subprocess.Popen[bytes], errors: Path) -> int:
    """Probe until the subscriber gets one, then fence; the number of probe lines in the output."""
    sent = [0]

    def clients_alive() -> None:
        for name, process in (("mosquitto_sub", subscriber), ("mosquitto_pub", publisher)):
            if process.poll() is not None:
                raise LaunchError(f"{name} exited with status {process.returncode}: "
                                  f"{errors.read_text(errors='replace').strip()[-500:]}")

    def arrived() -> bool:
        clients_alive()
        if lines.count() > 0:
            return True
        setup.check_running()
        os.write(pipe, probe_line(sent[0], case.size))
        sent[0] += 1
        return False

    poll(arrived, PROBE_TIMEOUT, lambda: f"a first probe from {setup.publish_host} to reach the subscriber on "
                                         f"{setup.subscribe_host} ({sent[0]} sent):\n{setup.diagnostics()}",
         interval=PROBE_INTERVAL)
    fence = probe_line(sent[0], case.size)
    os.write(pipe, fence)
    fence_text = fence.rstrip(b"\n")

    def fenced() -> int | None:
        clients_alive()
        data = output.read_bytes()
        return data.count(b"\n") if fence_text in data else None

    return poll(fenced, PROBE_TIMEOUT, "the fence probe to reach the subscriber", interval=0.005)


def _publish(pipe: int, case: Case) -> float:
    """Write the `count` measured lines, stamped with the time they are written, at `rate` per second;
    the seconds it took."""
    size, count, rate = case.size, case.count, case.rate
    seq = 0
    start = time.perf_counter()
    while seq < count:
        if rate is None:
            due = min(count, seq + BURST)
        else:
            elapsed = time.perf_counter() - start
            due = min(count, int(elapsed * rate) + 1)
            if due <= seq:  # ahead of schedule: sleep until the next line is due (at most one tick)
                time.sleep(min(PACE_TICK, seq / rate - elapsed))
                continue
        now = time.time_ns()
        os.write(pipe, b"".join(payload_line(number, now, size) for number in range(seq, due)))
        seq = due
    return time.perf_counter() - start


def _wait_publisher(publisher: subprocess.Popen[bytes], errors: Path) -> float:
    """Wait for `mosquitto_pub` to exit; its CPU seconds, read while it is a zombie (once reaped, /proc forgets)."""
    deadline = time.monotonic() + PUBLISHER_EXIT_TIMEOUT
    while os.waitid(os.P_PID, publisher.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            raise LaunchError(f"mosquitto_pub did not finish within {PUBLISHER_EXIT_TIMEOUT:g} s")
        time.sleep(0.005)
    cpu = cpu_seconds(publisher.pid)
    status = publisher.wait()
    if status != 0:
        raise LaunchError(f"mosquitto_pub exited with status {status}: "
                          f"{errors.read_text(errors='replace').strip()[-500:]}")
    return cpu


def _drain(lines: FileLines, expected: int) -> None:
    """Wait for `expected` lines, or until none came for SETTLE seconds (the rest is lost)."""
    last_count, last_change = lines.count(), time.monotonic()
    while last_count < expected:
        time.sleep(0.01)
        current, now = lines.count(), time.monotonic()
        if current != last_count:
            last_count, last_change = current, now
        elif now - last_change >= SETTLE:
            return
    time.sleep(GRACE)  # every expected line is in; a late duplicate gets this long to show up
