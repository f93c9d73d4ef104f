"""The whole suite: start each setup once, run every case on it, compare each with the reference.

Theory of operation: the setups are started one after another from the
main thread (a child's PDEATHSIG follows the thread that forked it), each on
a loopback /24 of its own, and each gets a probe client per distinct broker.
The reference (one broker) runs every case first, since the other setups'
settles wait for the reference's counts; then the other setups run their
cases side by side, one thread each (their clients are paho threads, the
waiting is the cases' own), every case on its own topic prefix and client
ids, so one started setup serves them all. Before and after each case the
federation's wrappers are asked for their status, and once everything ran,
their event logs are read, so a case that differs comes with what the
wrappers said about it.

A setup whose processes died is not used further: its remaining cases are
recorded as not run. Everything started is stopped when the suite ends,
also on an exception or Ctrl-C.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from federation.harness.processes import LaunchError
from suites.transparency.compare import Verdict, compare, describe_reference, without_duplicates
from suites.transparency.recorder import ProbeClient, RecordingClient
from suites.transparency.runner import Recording, ScenarioRunner, Timing, prefix_of
from suites.transparency.scenario import Scenario, scenario_names
from suites.transparency.setups import SETUP_KINDS, Setup

Progress = Callable[[str], None]
REFERENCE = "one-broker"


@dataclass
class CaseResult:
    """One case on every setup: the recordings, and each non-reference setup's verdict."""

    name: str
    title: str
    reference: str
    """the reference's matrix cell"""
    recordings: dict[str, Recording] = field(default_factory=dict)
    verdicts: dict[str, Verdict] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "reference": self.reference,
                "recordings": {setup: recording.to_json() for setup, recording in self.recordings.items()},
                "verdicts": {setup: verdict.to_json() for setup, verdict in self.verdicts.items()}}

    @staticmethod
    def from_json(document: dict[str, Any]) -> CaseResult:
        return CaseResult(document["name"], document["title"], document["reference"],
                          {setup: Recording.from_json(item) for setup, item in document["recordings"].items()},
                          {setup: Verdict.from_json(item) for setup, item in document["verdicts"].items()})


@dataclass
class SuiteResult:
    setups: dict[str, str]
    """setup name -> what it is"""
    cases: list[CaseResult]
    started: float
    ended: float
    errors: list[str] = field(default_factory=list)
    """setups that could not start or broke"""
    reference: str = REFERENCE
    """the setup every other is compared with: one broker, or the bridge chain of the policy cases"""

    def case(self, name: str) -> CaseResult:
        for case in self.cases:
            if case.name == name:
                return case
        raise KeyError(f"no case {name!r}; cases are {', '.join(case.name for case in self.cases)}")

    def to_json(self) -> dict[str, Any]:
        return {"setups": self.setups, "started": self.started, "ended": self.ended, "errors": self.errors,
                "reference": self.reference, "cases": [case.to_json() for case in self.cases]}

    @staticmethod
    def from_json(document: dict[str, Any]) -> SuiteResult:
        return SuiteResult(document["setups"], [CaseResult.from_json(item) for item in document["cases"]],
                           document["started"], document["ended"], document.get("errors", []),
                           document.get("reference", REFERENCE))


def connect_probes(setup: Setup, timing: Timing) -> dict[str, ProbeClient]:
    probes: dict[str, ProbeClient] = {}
    for site in setup.probe_sites:
        client = RecordingClient(f"probe-{site}", f"tp-probe-{setup.name}-{site}", time.monotonic())
        host, port = setup.address(site)
        client.connect(host, port, site=site, timeout=timing.connect_timeout)
        probes[site] = ProbeClient(site, client)
    return probes


@dataclass
class _SetupRun:
    setup: Setup
    recordings: dict[str, Recording] = field(default_factory=dict)
    snapshots: dict[str, tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]] = field(
        default_factory=dict)
    error: str | None = None


def _run_cases(run: _SetupRun, scenarios: Sequence[Scenario], timing: Timing,
               expected: dict[str, list[dict[str, int]] | None] | None, progress: Progress) -> None:
    """Every case on one started setup (in the calling thread); errors end up in `run`, never raised."""
    setup = run.setup
    probes: dict[str, ProbeClient] = {}
    try:
        probes = connect_probes(setup, timing)
        runner = ScenarioRunner(setup, probes, timing)
        for scenario in scenarios:
            problems = setup.problems()
            if problems:
                run.error = run.error or f"{setup.name} broke: {'; '.join(problems)}"
                run.recordings[scenario.name] = Recording(scenario.name, setup.name, error=run.error)
                continue
            before = setup.snapshot()
            recording = runner.run(scenario, None if expected is None else expected.get(scenario.name, []))
            run.snapshots[scenario.name] = (before, setup.snapshot())
            run.recordings[scenario.name] = recording
            state = f"error: {recording.error}" if recording.error else f"{recording.seconds:.1f} s"
            progress(f"{setup.name}: {scenario.name} ({state})")
    except LaunchError as error:
        run.error = f"{setup.name}: {error}"
    except Exception as error:  # noqa: BLE001 - a thread must not die silently: the suite reports it
        run.error = f"{setup.name}: {type(error).__name__}: {error}"
    finally:
        for probe in probes.values():
            probe.client.close()
    for scenario in scenarios:
        run.recordings.setdefault(scenario.name, Recording(scenario.name, setup.name, error=run.error or "not run"))


def run_suite(scenarios: Sequence[Scenario], workdir: Path, subnets: Sequence[int], *, topology: str = "line",
              kinds: Sequence[str] = SETUP_KINDS, timing: Timing | None = None,
              progress: Progress | None = None, reference: str = REFERENCE,
              topics: Mapping[str, Sequence[str]] | None = None) -> SuiteResult:
    """Run `scenarios` on the setups `kinds` (the `reference` always, first) and compare; see the module
    docstring. Setup i uses the loopback addresses 127.0.<subnets[i]>.10 and up. `topics`: topic policy lines by
    site for every setup (the policy cases, whose reference is the bridge chain: policies.py)."""
    say = progress or (lambda line: None)
    timing = timing or Timing()
    scenario_names(scenarios)
    kinds = [reference, *[kind for kind in kinds if kind != reference]]
    if len(subnets) < len(kinds) or len(set(subnets)) != len(subnets):
        raise ValueError(f"{len(kinds)} setups need as many distinct subnets, got {list(subnets)}")
    setups = [Setup(kind, workdir, f"127.0.{subnets[index]}.10", topology if kind == "federation" else "line",
                    topics=topics) for index, kind in enumerate(kinds)]  # the topology is the federation's
    runs = {setup.name: _SetupRun(setup) for setup in setups}
    started = time.time()
    try:
        for setup in setups:
            say(f"starting {setup.describe()}")
            try:
                setup.start()
            except LaunchError as error:
                message = f"{setup.name} did not start: {error}"
                runs[setup.name].error = message
                say(message)
        first = runs[reference]
        if first.error is None:
            _run_cases(first, scenarios, timing, None, say)
        # A case whose reference delivers duplicates has no counts to wait for (they include the duplicates).
        expected: dict[str, list[dict[str, int]] | None] = {
            scenario.name: None if scenario.bridge_duplicates else first.recordings[scenario.name].settle_counts
            for scenario in scenarios if scenario.name in first.recordings}
        threads = []
        for run in runs.values():
            if run.setup.name == reference:
                continue
            if run.error is not None:
                run.recordings = {scenario.name: Recording(scenario.name, run.setup.name, error=run.error)
                                  for scenario in scenarios}
                continue
            thread = threading.Thread(target=_run_cases, args=(run, scenarios, timing, expected, say),
                                      name=f"transparency-{run.setup.name}", daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
        ended = time.time()
        for run in runs.values():
            run.setup.wait_events(ended)
            for scenario in scenarios:
                if scenario.name in run.snapshots:
                    recording = run.recordings[scenario.name]
                    before, after = run.snapshots[scenario.name]
                    recording.explanation = run.setup.explain(prefix_of(scenario), recording.started,
                                                              recording.ended, before, after)
                    if recording.explanation and recording.probes:
                        recording.explanation.append(
                            "(the publications counted include the suite's probes on the case's topics: "
                            + ", ".join(f"{count} from {site}" for site, count in sorted(recording.probes.items()))
                            + ")")
    finally:
        for setup in reversed(setups):
            setup.stop()
    return SuiteResult({setup.name: setup.describe() for setup in setups},
                       judge(scenarios, {name: run.recordings for name, run in runs.items()}, reference), started,
                       time.time(), [error for error in (run.error for run in runs.values()) if error is not None],
                       reference)


def judge(scenarios: Sequence[Scenario], recordings: dict[str, dict[str, Recording]],
          reference_setup: str = REFERENCE) -> list[CaseResult]:
    """Each case's recordings compared with the reference's (with its duplicates left out where the case says
    the bridge chain delivers some twice: compare.without_duplicates)."""
    results = []
    for scenario in scenarios:
        reference = recordings.get(reference_setup, {}).get(scenario.name) or Recording(
            scenario.name, reference_setup, error="not run")
        if scenario.bridge_duplicates and reference_setup != REFERENCE and not reference.error:
            reference = without_duplicates(scenario, reference)
        case = CaseResult(scenario.name, scenario.title, describe_reference(scenario, reference))
        for setup, by_case in recordings.items():
            recording = by_case.get(scenario.name) or Recording(scenario.name, setup, error="not run")
            case.recordings[setup] = recording
            if setup != reference_setup:
                case.verdicts[setup] = compare(scenario, reference, recording)
        results.append(case)
    return results

