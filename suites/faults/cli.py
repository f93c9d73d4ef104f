"""`python -m suites.faults`: the fault suite on real processes, the federation beside the bridge chain.

    python -m suites.faults                         # every fault, line + ring + bridge chain, side by side
    python -m suites.faults --setups federation-line --faults partition
    python -m suites.faults random --seeds 1-20     # random schedules, each replayable from its seed
    python -m suites.faults burst                   # 2,000 QoS 2 through 3 brokers at Mosquitto's default
    python -m suites.faults extended                # issue 37's cases, counted at every subscribing node
    python -m suites.faults soak                    # 20 min on a ring at 300/s, restarts and kills
    python -m suites.faults cleanup                 # nftables tables left by a run killed with SIGKILL

Theory of operation: the commands build `suite.Job`s (or a burst), run them
(`suite.run_jobs`: one worker process per setup, side by side), print the
table (`report`) and write everything measured to `OUT/faults.json`, with
the tables in `OUT/table.txt` and `OUT/table.md`; every node's logs and every
subscriber's output stay under `OUT/<setup>/`. Exit status: 0 when every
federation stream met the issue-19 target, 1 when one did not, 2 when a
case could not be judged (a setup did not start, a probe never arrived) or
the arguments are wrong. Needs root (nftables) for partitions.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from federation.harness.processes import LaunchError
from federation.harness.signals import interrupt_on_sigterm
from suites.faults import report
from suites.faults.burst import BURST_COUNT, BURST_TIMING, burst_case, burst_job
from suites.faults.catalogue import EXTENDED, FAULTS, FOLLOW_UPS, SUITE
from suites.faults.packet_filter import delete_table, leftover_tables
from suites.faults.runner import CaseResult, Timing
from suites.faults.schedule import random_case
from suites.faults.setups import inflight_template
from suites.faults.soak import SOAK_MINUTES, SOAK_RATE, soak_job, soak_title
from suites.faults.suite import (
    BULK_CASE,
    DEFAULT_SETTINGS,
    SETUPS,
    CasePlan,
    Job,
    extended_jobs,
    merge,
    run_jobs,
    suite_jobs,
    suite_plans,
    worker_main,
)

COMMANDS = ("run", "random", "burst", "extended", "soak", "report", "cleanup", "worker")
EXTENDED_CASES = [*(fault.name for _topology, fault in EXTENDED), BULK_CASE]
BULK_TITLE = "2,000 publications of 100 kB at 500/s (QoS 1) beside the two 100/s streams"
DEFAULT_SUBNET = 200
"""the suite's loopback addresses start at 127.0.<subnet>.10, one /24 per setup"""


def parse_seeds(text: str) -> list[int]:
    """'7' -> [7]; '1-5' -> [1..5]; '1,4,9' -> [1, 4, 9]."""
    seeds: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            seeds += list(range(int(first), int(last) + 1)) if dash else [int(first)]
        except ValueError:
            raise argparse.ArgumentTypeError(f"seeds {text!r}: numbers, ranges (1-5) or lists (1,4,9)") from None
    return seeds


def _common(parser: argparse.ArgumentParser, rate: float = Timing.rate) -> None:
    parser.add_argument("--out", type=Path, help="where results, logs and client outputs go (default: a new temp dir)")
    parser.add_argument("--subnet", type=int, default=DEFAULT_SUBNET,
                        help=f"first loopback /24: 127.0.SUBNET.10 and up, one /24 per setup "
                             f"(default {DEFAULT_SUBNET})")
    parser.add_argument("--rate", type=float, default=rate,
                        help=f"publications per second of each stream (default {rate:g})")
    parser.add_argument("--quiet", type=float,
                        help=f"drain: seconds without a new arrival that end it (default {Timing.quiet:g}; "
                             f"burst: {BURST_TIMING.quiet:g})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m suites.faults",
                                     description="Fault suite on real Mosquitto brokers: numbered QoS 1 and 2 "
                                                 "streams through a federation and a bridge chain while faults "
                                                 "happen; counts what the subscribers received.")
    commands = parser.add_subparsers(dest="command")
    run = commands.add_parser("run", help="the suite (the default command)")
    _common(run)
    run.add_argument("--setups", nargs="+", choices=SETUPS, default=list(SETUPS))
    run.add_argument("--faults", nargs="+", choices=list(FAULTS), default=[fault.name for fault in SUITE])
    run.add_argument("--serial", action="store_true", help="run the setups one after another in this process")
    run.add_argument("--lead", type=float, default=Timing.lead, help="seconds of stream before the fault")
    run.add_argument("--tail", type=float, default=Timing.tail, help="seconds of stream after the healing")
    run.add_argument("--no-burst", action="store_true", help="leave out the QoS 2 burst (run beside the setups)")
    run.add_argument("--broker-inflight", type=int, metavar="N",
                     help="every broker with `max_inflight_messages N` (default: as configs/mosquitto.conf says; "
                          "the burst always keeps Mosquitto's default)")
    run.add_argument("--qos2-v5", action="store_true",
                     help="the QoS 2 subscriber speaks MQTT v5 (default: 3.1.1, as the QoS 1 one: a persistent v5 "
                          "mosquitto_sub 2.0.11 stops with a protocol error in about 1 of 3 bursts of QoS 2 "
                          "messages, on a single broker too; docs/guarantees.md)")
    randomized = commands.add_parser("random", help="random fault schedules, one federation per seed")
    _common(randomized)
    randomized.add_argument("--seeds", type=parse_seeds, default=parse_seeds("1-10"), help="e.g. 7, 1-20, 3,8")
    randomized.add_argument("--jobs", type=int, default=2, help="seeds run at once (default 2)")
    burst = commands.add_parser("burst", help="QoS 2 burst through 3 brokers with Mosquitto's default inflight limit")
    _common(burst)
    burst.add_argument("--count", type=int, default=BURST_COUNT)
    extended = commands.add_parser("extended", help="issue 37's cases (a split with subscribers on both sides, a "
                                                    "core stopped, two wrappers killed, full disks, a bulk flood)")
    _common(extended)
    extended.add_argument("--cases", nargs="+", choices=EXTENDED_CASES, default=EXTENDED_CASES)
    soak = commands.add_parser("soak", help="a ring under load for a long time, wrappers restarted and killed")
    _common(soak, SOAK_RATE)
    soak.add_argument("--minutes", type=float, default=SOAK_MINUTES, help=f"(default {SOAK_MINUTES:g})")
    again = commands.add_parser("report", help="print the tables of a saved faults.json again")
    again.add_argument("results", type=Path)
    again.add_argument("--markdown", action="store_true", help="the Markdown table (as in docs/guarantees.md)")
    commands.add_parser("cleanup", help="delete nftables tables left by runs that were killed")
    worker = commands.add_parser("worker", help="(internal) run one job file, write its results")
    worker.add_argument("job", type=Path)
    worker.add_argument("result", type=Path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if not arguments or (arguments[0] not in COMMANDS and arguments[0] not in ("-h", "--help")):
        arguments.insert(0, "run")
    options = build_parser().parse_args(arguments)
    if options.command == "worker":
        return worker_main(options.job, options.result)
    if options.command == "cleanup":
        tables = leftover_tables()
        for table in tables:
            delete_table(table)
        print(f"deleted {', '.join(tables)}" if tables else "nothing to delete")
        return 0
    if options.command == "report":
        document = json.loads(options.results.read_text(encoding="utf-8"))
        saved = {name: [CaseResult.from_json(case) for case in cases] for name, cases in document["setups"].items()}
        if options.markdown:
            print(report.markdown_table(saved, document["titles"]))
        else:
            print_report(saved, document["titles"])
        return exit_status(saved)
    out = (options.out or Path(tempfile.mkdtemp(prefix="faults-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    quiet = {} if options.quiet is None else {"quiet": options.quiet}
    timing = Timing(rate=options.rate, **quiet, **({"lead": options.lead, "tail": options.tail}
                                                    if options.command == "run" else {}))
    started = time.time()
    try:
        with interrupt_on_sigterm():
            if options.command == "burst":
                timing = replace(BURST_TIMING, **quiet)
                job = burst_job(out / "burst", f"127.0.{options.subnet}.10", options.count, timing)
                results = {"federation-line": run_jobs([job])[0]}
                titles = {burst_case(options.count): BURST_TITLE.format(count=options.count)}
            elif options.command == "random":
                results, titles = _random(options.seeds, options.jobs, out, options.subnet, timing)
            elif options.command in ("extended", "soak"):
                return _extended(options, out, timing, arguments, started)
            else:
                results, titles = _suite(options, out, timing)
    except LaunchError as error:
        print(f"faults: error: {error}", file=sys.stderr)
        return 2
    seconds = time.time() - started
    write_results(out, results, titles, timing, seconds, arguments)
    print_report(results, titles)
    print(f"\n{seconds:.0f} s; results in {out}/faults.json")
    return exit_status(results)


def _extended(options: argparse.Namespace, out: Path, timing: Timing, arguments: Sequence[str],
              started: float) -> int:
    """Issue 37's cases or the soak: each stream counted at every subscribing node, the wrappers' counters
    against those counts. Exit status as `exit_status`, a disagreeing ledger counting as a miss."""
    subnets = itertools.count(options.subnet)
    if options.command == "soak":
        job = soak_job(out / "soak", f"127.0.{next(subnets)}.10", options.minutes, timing.rate)
        jobs = [job]
        titles = {plan.case: soak_title(plan, timing.rate) for plan in job.cases}
    else:
        cases = list(options.cases)
        alone = [BULK_CASE] if BULK_CASE in cases else []  # the flood measures fairness and memory: alone
        jobs = extended_jobs(out, subnets, timing, cases=[case for case in cases if case not in alone],
                             follow_ups=FOLLOW_UPS)
        titles = {fault.name: fault.title for _topology, fault in EXTENDED} | {BULK_CASE: BULK_TITLE}
    outcomes = run_jobs(jobs) if jobs else []
    if options.command == "extended" and BULK_CASE in options.cases:
        flood = extended_jobs(out, subnets, timing, cases=[BULK_CASE])
        outcomes += run_jobs(flood)
        jobs += flood
    results = merge(jobs, outcomes)
    seconds = time.time() - started
    write_results(out, results, titles, timing, seconds, arguments)
    cases = [result for setup_results in results.values() for result in setup_results]
    print("\n".join(report.extended_lines(cases, titles)))
    for result in cases:
        print("\n".join(report.explain_lines(result)))
        print("\n".join(f"ledger: {problem}" for problem in result.ledger.get("problems", [])))
    print(f"\n{seconds:.0f} s; results in {out}/faults.json")
    if any(result.error is not None for result in cases):
        return 2
    return 0 if all(result.meets(qos) and result.bulk_meets() and not result.ledger.get("problems")
                    for result in cases for qos in result.streams) else 1


def print_report(results: Mapping[str, Sequence[CaseResult]], titles: Mapping[str, str]) -> None:
    print(report.text_table(results, titles))
    print(report.LEGEND)
    notes = report.explanations({name: cases for name, cases in results.items() if name.startswith("federation")})
    if notes:
        print("\nwhere the federation lost or doubled (its wrappers' events and status):")
        print("\n".join(notes))
    notes = report.explanations({name: cases for name, cases in results.items() if name.startswith("bridge")},
                                events=False)
    if notes:
        print("\nthe bridge chain's misses:")
        print("\n".join(notes))


BURST_TITLE = "{count} QoS 2 as one burst, every broker at Mosquitto's default max_inflight_messages (20)"


def _suite(options: argparse.Namespace, out: Path,
           timing: Timing) -> tuple[dict[str, list[CaseResult]], dict[str, str]]:
    plans = suite_plans([FAULTS[name] for name in options.faults], timing.lead)
    template = None
    if options.broker_inflight is not None:
        template = inflight_template(out / f"mosquitto-inflight-{options.broker_inflight}.conf",
                                     options.broker_inflight)
    subnets = itertools.count(options.subnet)
    jobs = suite_jobs(options.setups, plans, out, subnets, timing, template, qos2_v5=options.qos2_v5)
    titles = {name: FAULTS[name].title for name in options.faults}
    if not options.no_burst:
        jobs.append(burst_job(out / "burst", f"127.0.{next(subnets)}.10"))
        titles[burst_case(BURST_COUNT)] = BURST_TITLE.format(count=BURST_COUNT)
    return merge(jobs, run_jobs(jobs, parallel=not options.serial)), titles


def _random(seeds: Sequence[int], parallel: int, out: Path, subnet: int,
            timing: Timing) -> tuple[dict[str, list[CaseResult]], dict[str, str]]:
    merged: dict[str, list[CaseResult]] = {}
    titles: dict[str, str] = {}
    for first in range(0, len(seeds), max(1, parallel)):
        batch = seeds[first:first + max(1, parallel)]
        jobs = []
        for index, seed in enumerate(batch):
            case = random_case(seed)
            plan = CasePlan(case.name, case.schedule, case.length)
            titles[case.name] = f"seed {seed}: {case.topology.name}, " + ", ".join(
                " ".join(filter(None, (item.fault.kind, item.fault.role))) + f" at {item.at:g} s for "
                f"{item.fault.seconds:g} s" for item in case.schedule)
            jobs.append(Job(f"federation-{case.topology.name}", (plan,), out / case.name,
                            f"127.0.{subnet + index}.10", timing))
        for job, cases in zip(jobs, run_jobs(jobs), strict=True):
            merged.setdefault(job.setup, []).extend(cases)
    return merged, titles


def write_results(out: Path, results: Mapping[str, Sequence[CaseResult]], titles: Mapping[str, str],
                  timing: Timing, seconds: float, arguments: Sequence[str]) -> None:
    document: dict[str, Any] = {
        "command": "python -m suites.faults " + shlex.join(arguments),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()},
        "timing": asdict(timing), "settings": DEFAULT_SETTINGS, "seconds": round(seconds, 1), "titles": dict(titles),
        "setups": {name: [result.to_json() for result in cases] for name, cases in results.items()},
    }
    (out / "faults.json").write_text(json.dumps(document, indent=1), encoding="utf-8")
    (out / "table.txt").write_text(report.text_table(results, titles) + "\n", encoding="utf-8")
    (out / "table.md").write_text(report.markdown_table(results, titles) + "\n", encoding="utf-8")


def exit_status(results: Mapping[str, Sequence[CaseResult]]) -> int:
    cases = [result for name, setup_results in results.items() for result in setup_results]
    if any(result.error is not None for result in cases):
        return 2
    federation = [result for name, setup_results in results.items() if name.startswith("federation")
                  for result in setup_results]
    return 0 if all(result.meets(qos) for result in federation for qos in result.streams) else 1


if __name__ == "__main__":
    sys.exit(main())
