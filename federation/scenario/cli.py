"""Command line: check scenario files, or run one on a backend and judge the report.

Theory of operation: the CLI is the boundary between a person (or CI) and the
backends. It loads and validates the scenario first, so a typo fails in
milliseconds with exit code 2 instead of after a long run. Backends are
looked up by name in `BACKENDS` and imported only when chosen, so `check`
and the simulator work on machines without LXD or network-namespace tools,
and a backend that is missing or broken is reported as "not available"
rather than as a traceback. The backend returns a report dict; the CLI
writes it as JSON, prints a short summary, and turns `invariants.ok` into the
exit status, which is what CI reads.

Exit codes: 0 invariants held; 1 invariants failed; 2 scenario, usage or
backend-availability error; 3 the backend crashed or returned a malformed
report (a bug in the backend, not a finding about the protocol).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from federation.cli_version import add_version_option
from federation.scenario.loader import ScenarioError, load_scenario
from federation.scenario.model import Scenario

PROG = "federation-scenario"
"""the console script; `python -m federation.scenario` in a checkout"""
EXIT_OK = 0
EXIT_INVARIANTS_FAILED = 1
EXIT_USAGE = 2
EXIT_BACKEND_FAILED = 3

BACKENDS: dict[str, str] = {
    "sim": "federation.sim:run_scenario",
    "netns": "federation.netns:run_scenario",
    "lxd": "federation.lxd.backend:run_scenario",
}
"""backend name -> "module:attribute" of `run_scenario(scenario, *, seed, events_path) -> report dict`"""

MAX_VIOLATIONS_SHOWN = 5

Backend = Callable[..., dict[str, Any]]


class UsageError(Exception):
    """Bad arguments or an unavailable backend: exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that prints `error: ...` and leaves exiting to `main`."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}\n{self.format_usage().rstrip()}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Check scenario files or run one on a backend (in a checkout also "
                                            "`python -m federation.scenario`).")
    add_version_option(parser, PROG)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    check = commands.add_parser("check", help="validate scenario files without running them")
    check.add_argument("files", nargs="+", metavar="FILE", help="scenario YAML files")

    run = commands.add_parser("run", help="run one scenario and write its report")
    run.add_argument("file", metavar="FILE", help="scenario YAML file")
    run.add_argument("--backend", choices=sorted(BACKENDS), default="sim",
                     help="where to run it (default: sim, the deterministic simulator)")
    run.add_argument("--seed", type=int, default=1,
                     help="seed of the run's random generator; the same seed replays the same run (default: 1)")
    run.add_argument("--report", metavar="OUT.json", help="write the report here (JSON)")
    run.add_argument("--events", metavar="OUT.jsonl",
                     help="write the structured event trace here (a file for sim; backends may take a directory)")
    run.add_argument("--quiet", action="store_true", help="print no summary; the exit code still tells the result")
    return parser


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    try:
        arguments = build_parser().parse_args(argv)
        if arguments.command == "check":
            return _check(arguments.files, out, err)
        return _run(arguments, out, err)
    except (UsageError, ScenarioError) as error:
        print(f"error: {error}", file=err)
        return EXIT_USAGE


def _check(files: Sequence[str], out: TextIO, err: TextIO) -> int:
    """Validate every file (not only up to the first bad one); exit 2 if any is invalid."""
    status = EXIT_OK
    for path in files:
        try:
            scenario = load_scenario(path)
        except ScenarioError as error:
            print(f"error: {error}", file=err)
            status = EXIT_USAGE
            continue
        print(f"ok: {path} ({_count(len(scenario.nodes), 'node')}, {_count(len(scenario.links), 'link')}, "
              f"{_count(len(scenario.events), 'event')})", file=out)
    return status


def load_backend(name: str) -> Backend:
    """Import the backend's `run_scenario`; UsageError says why it is not available."""
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}; backends are: {', '.join(sorted(BACKENDS))}")
    module_name, _, attribute = BACKENDS[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"backend {name!r} is not available: {error}") from error
    backend = getattr(module, attribute, None)
    if not callable(backend):
        raise UsageError(f"backend {name!r} is not available: {module_name} has no callable {attribute!r}")
    return backend  # type: ignore[no-any-return]


def _run(arguments: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    scenario = load_scenario(arguments.file)
    backend = load_backend(arguments.backend)
    report_path = Path(arguments.report) if arguments.report else None
    if report_path is not None and report_path.is_dir():
        raise UsageError(f"--report {report_path} is a directory; give a file name such as {report_path}/report.json")
    try:
        report = backend(scenario, seed=arguments.seed, events_path=arguments.events)
    except ScenarioError:
        raise
    except Exception as error:  # noqa: BLE001 - a crashing backend is reported with its traceback (exit 3)
        traceback.print_exc(file=err)
        print(f"error: backend {arguments.backend!r} failed on {scenario.source} with seed {arguments.seed}: "
              f"{type(error).__name__}: {error}", file=err)
        return EXIT_BACKEND_FAILED
    invariants_ok = _invariants_ok(report)
    if report_path is not None:
        try:
            report_path.parent.mkdir(parents=True, exist_ok=True)
            report_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        except (OSError, TypeError, ValueError) as error:
            print(f"error: cannot write the report to {report_path}: {error}", file=err)
            return EXIT_BACKEND_FAILED if isinstance(error, (TypeError, ValueError)) else EXIT_USAGE
    if invariants_ok is None:
        print(f"error: backend {arguments.backend!r} returned a report without a boolean invariants.ok", file=err)
        return EXIT_BACKEND_FAILED
    if not arguments.quiet:
        for line in summary_lines(scenario, report, backend=arguments.backend, seed=arguments.seed):
            print(line, file=out)
    return EXIT_OK if invariants_ok else EXIT_INVARIANTS_FAILED


def _invariants_ok(report: Any) -> bool | None:
    if not isinstance(report, dict):
        return None
    invariants = report.get("invariants")
    if not isinstance(invariants, dict) or not isinstance(invariants.get("ok"), bool):
        return None
    return bool(invariants["ok"])


def summary_lines(scenario: Scenario, report: dict[str, Any], *, backend: str, seed: int) -> list[str]:
    """A few lines a person reads first; the JSON report (schema in docs/simulator.md) has the rest."""
    lines = [f"scenario {scenario.name} ({scenario.source}) on {backend}, seed {seed}"]
    publications = report.get("publications")
    if isinstance(publications, dict):
        lines.append(
            "publications: "
            + ", ".join(f"{label} {publications.get(key, '?')}" for label, key in _PUBLICATION_COUNTS)
        )
        latency = publications.get("latency")
        if isinstance(latency, dict) and latency.get("p50") is not None:
            lines.append("latency: " + ", ".join(
                f"{key} {_seconds(latency.get(key))}" for key in ("p50", "p90", "p99", "max")))
    convergence = report.get("convergence")
    for phase in convergence if isinstance(convergence, list) else []:
        if not isinstance(phase, dict):
            continue
        label = phase.get("phase", phase.get("label", "?"))
        seconds = phase.get("seconds")
        settled = f"converged in {_seconds(seconds)}" if seconds is not None else "did NOT converge"
        lines.append(f"convergence: {label} (at {_seconds(phase.get('at'))}): {settled}")
    invariants = report.get("invariants", {})
    if invariants.get("ok"):
        lines.append("invariants: ok")
    else:
        violations = list(invariants.get("violations") or [])
        lines.append(f"invariants: FAILED ({_count(len(violations), 'violation')})")
        for violation in violations[:MAX_VIOLATIONS_SHOWN]:
            lines.append(f"  {violation}")
        if len(violations) > MAX_VIOLATIONS_SHOWN:
            lines.append(f"  ... {len(violations) - MAX_VIOLATIONS_SHOWN} more in the report")
    return lines


_PUBLICATION_COUNTS = (
    ("sent", "sent"),
    ("expected", "expected_deliveries"),
    ("delivered", "delivered"),
    ("lost", "lost"),
    ("duplicates", "duplicates"),
    ("unexpected", "unexpected"),
    ("outside bound", "delivered_outside_bound"),
)
"""(printed label, report key) of `report["publications"]`, in print order"""


def _seconds(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.3f}s"
    return "?"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"
