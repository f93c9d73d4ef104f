"""`python -m suites.bench.stages`: the wrappers' CPU per message stage by stage, inside a real flood.

Theory of operation: `hotpath` times the data path warm, every stage back to
back in one process; the end-to-end benchmark counts each wrapper's whole
CPU. Between them lies what the same code costs where it runs: a pass every
millisecond or two, between the brokers' and the clients' turns on the
same CPUs. This command starts a federation setup whose wrappers load a
probe (suites.bench.stage_probe: a `sitecustomize` module on
their PYTHONPATH, nothing in the wrapper changes), runs one
as-fast-as-possible case (`runner.run_case`), and asks each wrapper for its
stage counters (SIGUSR2) before and after it. It prints, for the first
wrapper (the broker's publications in) and the last (the datagrams in),
each stage's µs of CPU per delivered message and the messages per pass,
then both wrappers' loop against `hotpath`'s warm figure for passes of the
size the first wrapper made.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import federation
from federation.tools.launch import LaunchError
from suites.bench import hotpath, stage_probe
from suites.bench.runner import Case, run_case
from suites.bench.setups import Setup, SetupSpec

Counters = dict[str, list[float]]
"""stage label -> [seconds, calls], as the probe writes them"""

SNAPSHOT_TIMEOUT = 10.0
FIRST_PASS, LAST_PASS = "broker pass", "datagram pass"
"""the stages whose calls are the first and the last wrapper's passes"""


def difference(before: Counters, after: Counters) -> Counters:
    """What happened between two snapshots of one wrapper."""
    out: Counters = {}
    for label, (seconds, calls) in after.items():
        seconds_before, calls_before = before.get(label, [0.0, 0])
        out[label] = [seconds - seconds_before, calls - calls_before]
    return out


def per_message(counters: Counters, messages: int) -> dict[str, float]:
    """µs of CPU per message for each stage."""
    return {label: 1e6 * seconds / messages for label, (seconds, _calls) in counters.items()} if messages else {}


def messages_per_pass(counters: Counters, stage: str, messages: int) -> float:
    calls = counters.get(stage, [0.0, 0])[1]
    return messages / calls if calls else 0.0


def report(first: Counters, last: Counters, messages: int, warm: float | None, burst: int) -> str:
    """The table: each stage's µs per message in both wrappers, passes, and the loops against the warm figure."""
    first_us, last_us = per_message(first, messages), per_message(last, messages)
    lines = [f"{'µs of CPU per message':<28}{'first wrapper':>16}{'last wrapper':>16}"]
    for label in stage_probe.STAGES:
        cells = [f"{values[label]:>16.2f}" if counters.get(label, [0.0, 0])[1] else f"{'-':>16}"  # never called
                 for values, counters in ((first_us, first), (last_us, last))]
        lines.append(f"{label:<28}{cells[0]}{cells[1]}")
    lines.append(f"{'messages per pass':<28}{messages_per_pass(first, FIRST_PASS, messages):>16.0f}"
                 f"{messages_per_pass(last, LAST_PASS, messages):>16.0f}")
    both = first_us.get("loop", 0.0) + last_us.get("loop", 0.0)
    lines.append(f"both wrappers' loops, in the flood: {both:.2f} µs per message")
    if warm is not None and warm > 0:
        lines.append(f"hotpath, warm, passes of {burst}: {warm:.2f} µs per message; in the flood {both / warm:.1f} "
                     f"times that")
    return "\n".join(lines)


def _snapshot(out: Path, pid: int, number: int) -> Counters:
    """Ask one wrapper for its counters (its `number`th snapshot) and read them."""
    os.kill(pid, signal.SIGUSR2)
    path = out / f"stages-{pid}-{number}.json"
    deadline = time.monotonic() + SNAPSHOT_TIMEOUT
    while not path.exists():
        if time.monotonic() > deadline:
            raise LaunchError(f"wrapper {pid} wrote no stage counters within {SNAPSHOT_TIMEOUT:g} s ({path}): did "
                              f"it load the probe (its PYTHONPATH, {stage_probe.ENVIRONMENT})?")
        time.sleep(0.02)
    counters: Counters = json.loads(path.read_text())
    return counters


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suites.bench.stages",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", type=int, default=2, help="brokers in the federation's line")
    parser.add_argument("--qos", type=int, default=0, choices=(0, 1))
    parser.add_argument("--size", type=int, default=64, help="payload bytes")
    parser.add_argument("--count", type=int, default=300_000,
                        help="messages (QoS 1: at most 50,000, docs/benchmarks.md says why)")
    parser.add_argument("--publication-events", choices=("on", "off"), default="off")
    parser.add_argument("--subnet", type=int, default=152, help="the setup uses 127.0.SUBNET.10 and up")
    parser.add_argument("--no-warm", action="store_true", help="do not run hotpath for the warm figure")
    args = parser.parse_args(argv)
    if args.brokers < 2:
        parser.error("--brokers: a federation needs at least 2")
    workdir = Path(tempfile.mkdtemp(prefix="federation-stages-"))
    out = workdir / "counters"
    out.mkdir()
    probe_path = workdir / "probe"
    probe_path.mkdir()
    (probe_path / "sitecustomize.py").write_text(stage_probe.SITECUSTOMIZE)
    source = Path(federation.__file__).resolve().parents[1]  # the wrappers import this checkout's code
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", stage_probe.ENVIRONMENT)}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(probe_path), str(source), saved["PYTHONPATH"]]))
    os.environ[stage_probe.ENVIRONMENT] = str(out)
    spec = SetupSpec.parse(f"federation-{args.brokers}")
    setup = Setup(spec, workdir, args.subnet, publication_events=args.publication_events == "on")
    try:
        setup.start()
        pids = setup.wrapper_pids()
        before = [_snapshot(out, pid, 1) for pid in pids]
        case = Case(args.qos, args.size, None, args.count)
        summary = run_case(setup, case, f"bench/stages/{int(time.time())}", workdir)
        after = [_snapshot(out, pid, 2) for pid in pids]
    except LaunchError as error:
        print(f"stages: {error}", file=sys.stderr)
        return 1
    finally:
        setup.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(workdir, ignore_errors=True)
    first, last = difference(before[0], after[0]), difference(before[-1], after[-1])
    messages = summary.delivered
    if not messages:
        print(f"stages: nothing of the {summary.sent:,} messages was delivered; no figure to give", file=sys.stderr)
        return 1
    burst = max(1, round(messages_per_pass(first, FIRST_PASS, messages)))
    warm = None
    if not args.no_warm:
        stages = hotpath.measure(args.qos, args.size, burst, 5000, 5, args.publication_events == "on")
        warm = sum(stages.values())
    print(f"{spec.name}, QoS {args.qos}, {args.size} B as fast as possible: {summary.delivered:,} of "
          f"{summary.sent:,} delivered at {summary.rate:,.0f} msg/s")
    print(report(first, last, messages, warm, burst), flush=True)
    if args.brokers > 2:
        print(f"(the {args.brokers - 2} wrapper(s) between the first and the last are not shown)")
    print(f"CPU time of each wrapper's loop thread (the probe's clock costs about 0.7 µs a call, two per stage "
          f"call); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
