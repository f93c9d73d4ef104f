"""`python -m suites.bench`: the federation's data path against Mosquitto bridges and a single broker.

Theory of operation: one invocation measures every setup (`setups.py`) with
the same clients and payloads (`runner.py`), round after round: a round
starts each setup in turn, runs every case on it (QoS x payload size x
offered rate) and stops it, so the machine's background load falls on all
setups alike; the tables quote the median over rounds (`report.py`). Every
run is written to `results.json` as soon as it ends, so an interrupted
benchmark keeps what it measured, and `--report FILE` redraws the tables and
the chart from a saved file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from federation.tools.launch import REPO_ROOT, LaunchError
from suites.bench.report import Results, chart, tables
from suites.bench.runner import Case, run_case
from suites.bench.setups import Setup, SetupSpec
from suites.bench.stats import MIN_PAYLOAD

DEFAULT_SETUPS = ("single", "bridge-2", "federation-2", "bridge-3", "federation-3")
DEFAULT_RATES = ("max", "1000", "10000")


def parse_rates(values: Sequence[str]) -> list[float | None]:
    """'max' -> None (as fast as possible); numbers -> messages per second."""
    rates: list[float | None] = []
    for value in values:
        if value == "max":
            rates.append(None)
            continue
        try:
            rate = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"rate {value!r}: 'max' or messages per second") from None
        if rate <= 0:
            raise argparse.ArgumentTypeError(f"rate {value!r} must be positive")
        rates.append(rate)
    return rates


def cases(qos_levels: Sequence[int], sizes: Sequence[int], rates: Sequence[float | None], count: int,
          seconds: float) -> list[Case]:
    """Every case of a round: as-fast-as-possible runs send `count` messages, paced runs rate x seconds."""
    return [Case(qos, size, rate, count if rate is None else max(1, round(rate * seconds)))
            for qos in qos_levels for size in sizes for rate in rates]


def _command_output(command: Sequence[str]) -> str:
    try:
        result = subprocess.run(list(command), capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (result.stdout or result.stderr).strip().splitlines()[0] if (result.stdout or result.stderr) else "unknown"


def environment(options: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    """Where and how the benchmark ran, for the report."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        paho = metadata.version("paho-mqtt")
    except metadata.PackageNotFoundError:
        paho = "unknown"
    commit = _command_output(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"])
    dirty = _command_output(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"])
    return {
        "command": "python -m suites.bench " + " ".join(argv),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": f"{os.cpu_count()} CPU {cpu}",
        "kernel": platform.release(), "python": platform.python_version(),
        "mosquitto": _command_output([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-h"]),
        "paho": paho, "commit": commit + (" (with uncommitted changes)" if dirty not in ("", "unknown") else ""),
        "rounds": options.rounds, "max_inflight": options.max_inflight, "load_average": [],
    }


def load_average() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def run(options: argparse.Namespace, argv: Sequence[str]) -> int:
    specs = [SetupSpec.parse(name) for name in options.setups]
    round_cases = cases(options.qos, options.sizes, options.rates, options.count, options.seconds)
    out: Path = options.out
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="federation-bench-", dir=options.workdir))
    results = Results(environment(options, argv))
    results_path = out / "results.json"
    started = time.monotonic()
    print(f"bench: {len(specs)} setups x {len(round_cases)} cases x {options.rounds} rounds; "
          f"results in {out}, work files in {workdir}", flush=True)
    try:
        for round_ in range(1, options.rounds + 1):
            for index, spec in enumerate(specs):
                results.environment["load_average"].append({"round": round_, "setup": spec.name,
                                                            "load": load_average()})
                _run_setup(spec, options.subnet + index, workdir, round_, round_cases, results, options)
                results_path.write_text(json.dumps(results.as_json(), indent=1) + "\n")
    except KeyboardInterrupt:
        print("bench: interrupted; the tables below hold what was measured", file=sys.stderr)
    finally:
        if not options.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    results.environment["duration_s"] = round(time.monotonic() - started, 1)
    results_path.write_text(json.dumps(results.as_json(), indent=1) + "\n")
    return _publish_report(results, out, options.chart)


def _run_setup(spec: SetupSpec, subnet: int, workdir: Path, round_: int, round_cases: Sequence[Case],
               results: Results, options: argparse.Namespace) -> None:
    setup = Setup(spec, workdir / f"round{round_}", subnet, options.publication_events == "on",
                  options.max_inflight)
    try:
        setup.start()
    except LaunchError as error:
        print(f"bench: round {round_}: {spec.name} did not start: {error}", file=sys.stderr, flush=True)
        for case in round_cases:
            results.add(spec.name, case.qos, case.size, case.rate, round_, None, f"start: {error}")
        return
    try:
        for case in round_cases:
            topic = f"bench/r{round_}/{spec.name}/{case.label}"
            try:
                summary = run_case(setup, case, topic, workdir / f"round{round_}" / "runs", keep_output=options.keep)
            except (LaunchError, OSError) as error:
                print(f"bench: round {round_} {spec.name} {case.label}: failed: {error}", file=sys.stderr,
                      flush=True)
                results.add(spec.name, case.qos, case.size, case.rate, round_, None, str(error))
                continue
            results.add(spec.name, case.qos, case.size, case.rate, round_, summary)
            print(f"round {round_} {spec.name:13} {case.label:18} delivered {summary.rate:9,.0f} msg/s  "
                  f"lost {summary.lost:6}  dup {summary.duplicates:4}  p50 {summary.p50_ms:8.2f} ms  "
                  f"p99 {summary.p99_ms:8.2f} ms  wrappers {summary.wrapper_cpu_per_1000:.3f} CPU s/1000  "
                  f"idle {100 * summary.idle_fraction:3.0f}%"
                  + "".join(f"  {reason} {count}" for reason, count in summary.wrapper_drops.items()),
                  flush=True)
    finally:
        setup.stop()
        if not options.keep:  # event logs and broker logs of a setup reach hundreds of MB
            shutil.rmtree(setup.brokers.workdir, ignore_errors=True)


def _publish_report(results: Results, out: Path, draw: bool) -> int:
    text = tables(results)
    (out / "tables.md").write_text(text + "\n")
    print()
    print(text)
    if draw:
        try:
            chart(results, out / "chart.png")
            print(f"chart: {out / 'chart.png'}")
        except ImportError:
            print("bench: no chart: matplotlib is missing (pip install -e '.[bench]')", file=sys.stderr)
    failed = sum(1 for run in results.runs if run.get("summary") is None)
    if failed:
        print(f"bench: {failed} runs failed (see `error` in results.json)", file=sys.stderr)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m suites.bench",
        description="Throughput, loss, duplicates and latency of one Mosquitto, Mosquitto bridge chains and "
                    "federated brokers, with the same C clients (mosquitto_pub/mosquitto_sub) on loopback. "
                    "Prints tables with ratios, writes results.json, tables.md and chart.png.")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the tables quote medians (default 3)")
    parser.add_argument("--setups", nargs="+", default=list(DEFAULT_SETUPS),
                        help=f"single, bridge-N, federation-N (default: {' '.join(DEFAULT_SETUPS)})")
    parser.add_argument("--qos", nargs="+", type=int, choices=(0, 1), default=[0, 1])
    parser.add_argument("--sizes", nargs="+", type=int, default=[64, 1024], help="payload bytes (default 64 1024)")
    parser.add_argument("--rates", nargs="+", default=list(DEFAULT_RATES),
                        help="offered msg/s, or max for as fast as possible (default: max 1000 10000)")
    parser.add_argument("--count", type=int, default=20000, help="messages of an as-fast-as-possible run")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds of a paced run (default 5)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="where results go")
    parser.add_argument("--workdir", type=Path, help="parent of the temporary work directory")
    parser.add_argument("--subnet", type=int, default=150,
                        help="setups use 127.0.SUBNET.10 and up, one /24 each (default 150)")
    parser.add_argument("--publication-events", choices=("on", "off"), default="on",
                        help="off: the wrappers' event logs leave out the per-publication events, which the nodes "
                             "then do not make (docs/daemon.md \"Event log\"); default on, as the Spark job needs")
    parser.add_argument("--max-inflight", type=int, metavar="N",
                        help="every setup's brokers get `max_inflight_messages N` (their Receive Maximum) in place "
                             "of the template's (configs/mosquitto.conf); 20 is Mosquitto's default")
    parser.add_argument("--keep", action="store_true", help="keep broker dirs, logs and subscriber output")
    parser.add_argument("--no-chart", dest="chart", action="store_false", help="do not draw chart.png")
    parser.add_argument("--report", type=Path, metavar="RESULTS_JSON",
                        help="only redraw tables and chart from a saved results.json (into --out)")
    options = parser.parse_args(arguments)
    try:
        options.rates = parse_rates(options.rates)
        for name in options.setups:
            SetupSpec.parse(name)
    except (argparse.ArgumentTypeError, ValueError) as error:
        parser.error(str(error))
    if options.report is not None:
        try:
            results = Results.from_json(json.loads(options.report.read_text()))
        except (OSError, ValueError) as error:
            parser.error(f"--report {options.report}: {error}")
        options.out.mkdir(parents=True, exist_ok=True)
        return _publish_report(results, options.out, options.chart)
    if options.rounds < 1 or options.count < 1 or options.seconds <= 0:
        parser.error("--rounds and --count must be at least 1, --seconds positive")
    if options.max_inflight is not None and not 0 <= options.max_inflight <= 65535:
        parser.error("--max-inflight: 0 (Mosquitto's \"no maximum\") to 65535")
    if min(options.sizes) < MIN_PAYLOAD:
        parser.error(f"--sizes: at least {MIN_PAYLOAD} bytes (the sequence number and send time)")
    if not 1 <= options.subnet <= 255 - len(options.setups):
        parser.error("--subnet: 1 to 254, leaving one /24 per setup")
    signal.signal(signal.SIGTERM, _interrupt)  # stop like Ctrl-C: processes stopped, tables of what was measured
    return run(options, arguments)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
