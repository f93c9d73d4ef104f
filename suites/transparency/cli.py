"""`python -m suites.transparency`: the same client scenarios on one broker, a federation, a bridge chain.

    python -m suites.transparency                      # every case, prints the matrix, writes JSON
    python -m suites.transparency --cases will no-local --setups federation
    python -m suites.transparency --topology ring      # the federation as a ring a-b-c-d
    python -m suites.transparency --policies            # the topic policy cases: bridge chain vs federation
    python -m suites.transparency report OUT/transparency.json [--markdown]
    python -m suites.transparency list                 # the cases and what their clients do

Theory of operation: builds the cases (`catalogue`), runs them (`suite`),
prints the matrix and the differences (`report`), and writes
`OUT/transparency.json` (every recording, verdict and explanation),
`OUT/matrix.txt` and `OUT/matrix.md`; every broker's and wrapper's files stay
under `OUT/<setup>/`. Exit status: 0 when the federation received what one
broker did in every case, 1 when it did not, 2 when a setup did not start
or the arguments are wrong.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from federation.harness.signals import interrupt_on_sigterm
from suites.transparency import report
from suites.transparency.catalogue import CASES, default_cases
from suites.transparency.policies import POLICY_CASES, case_lines, policy_cases
from suites.transparency.runner import prefix_of
from suites.transparency.scenario import describe_action
from suites.transparency.setups import SETUP_KINDS, TOPOLOGIES
from suites.transparency.suite import REFERENCE, SuiteResult, run_suite

COMMANDS = ("run", "report", "list")
DEFAULT_SUBNET = 210
"""the suite's loopback addresses start at 127.0.<subnet>.10, one /24 per setup"""
RESULTS = "transparency.json"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m suites.transparency",
                                     description="The same MQTT client scenarios on one Mosquitto broker, a "
                                                 "federation and a bridge chain; compares what every subscriber "
                                                 "received.")
    commands = parser.add_subparsers(dest="command")
    run = commands.add_parser("run", help="run the suite (the default command)")
    run.add_argument("--out", type=Path, help="where results and logs go (default: a new temporary directory)")
    run.add_argument("--subnet", type=int, default=DEFAULT_SUBNET,
                     help=f"first loopback /24: 127.0.SUBNET.10 and up, one /24 per setup (default {DEFAULT_SUBNET})")
    run.add_argument("--topology", choices=TOPOLOGIES, default="line",
                     help="the federation's shape: line a-b-c or ring a-b-c-d (the bridge chain is always a line)")
    run.add_argument("--cases", nargs="+", choices=[*CASES, *POLICY_CASES], metavar="CASE",
                     help="only these cases (default: all; `list` names them)")
    run.add_argument("--policies", action="store_true",
                     help="the topic policy cases instead: each on a bridge chain given its topic lines (the "
                          "reference) and on a federation given the same (docs/transparency.md)")
    run.add_argument("--setups", nargs="+", choices=[kind for kind in SETUP_KINDS if kind != REFERENCE],
                     default=[kind for kind in SETUP_KINDS if kind != REFERENCE],
                     help="besides the reference (one broker, always run)")
    run.add_argument("--markdown", action="store_true", help="print the Markdown matrix (as in docs/transparency.md)")
    again = commands.add_parser("report", help="print the matrix of a saved transparency.json again")
    again.add_argument("results", type=Path)
    again.add_argument("--markdown", action="store_true")
    commands.add_parser("list", help="the cases and their actions")
    return parser


def write_results(out: Path, result: SuiteResult, command: Sequence[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    document = result.to_json() | {"command": shlex.join(command)}
    (out / RESULTS).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    (out / "matrix.txt").write_text(report.full_text(result) + "\n", encoding="utf-8")
    (out / "matrix.md").write_text(report.markdown_table(result) + "\n", encoding="utf-8")


def federation_same(result: SuiteResult) -> bool:
    return all(verdict.same for case in result.cases for setup, verdict in case.verdicts.items()
               if setup == "federation")


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if not arguments or (arguments[0] not in COMMANDS and arguments[0] not in ("-h", "--help")):
        arguments.insert(0, "run")
    options = build_parser().parse_args(arguments)
    if options.command == "list":
        for scenario in [*default_cases(), *policy_cases()]:
            print(f"{scenario.name}: {scenario.title}")
            for site, lines in scenario.topics.items():
                print(f"    {site}'s topic lines: {' | '.join(lines)}")
            for action in scenario.actions:
                print(f"    {describe_action(action)}")
        return 0
    if options.command == "report":
        try:
            result = SuiteResult.from_json(json.loads(options.results.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError) as error:
            print(f"transparency: cannot read {options.results}: {error}", file=sys.stderr)
            return 2
        print(report.markdown_table(result) if options.markdown else report.full_text(result))
        return 0
    catalogue = POLICY_CASES if options.policies else CASES
    unknown = [name for name in options.cases or () if name not in catalogue]
    if unknown:
        kind = "a policy case" if options.policies else "a case of the default run"
        print(f"transparency: {', '.join(unknown)}: not {kind} (`list` names them all; --policies runs the policy "
              f"cases)", file=sys.stderr)
        return 2
    scenarios = [catalogue[name] for name in options.cases] if options.cases else list(catalogue.values())
    out = options.out or Path(tempfile.mkdtemp(prefix="transparency-"))
    with interrupt_on_sigterm():
        subnets = [options.subnet + index for index in range(len(SETUP_KINDS))]
        if options.policies:
            result = run_suite(scenarios, out.resolve(), subnets, topology=options.topology,
                               kinds=["bridge-chain", "federation"], reference="bridge-chain",
                               topics=case_lines(scenarios, prefix_of), progress=lambda line: print(line, flush=True))
        else:
            result = run_suite(scenarios, out.resolve(), subnets, topology=options.topology,
                               kinds=options.setups, progress=lambda line: print(line, flush=True))
    write_results(out, result, ["python", "-m", "suites.transparency", *arguments[1:]])
    print()
    print(report.markdown_table(result) if options.markdown else report.full_text(result))
    print(f"\nresults, logs and configs: {out}")
    if result.errors:
        return 2
    return 0 if federation_same(result) else 1
