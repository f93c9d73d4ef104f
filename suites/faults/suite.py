"""Running the suite: the cases of a setup one after another on one started setup, the setups side by side.

Theory of operation: a `Job` is one setup (`federation-line`,
`federation-ring`, `bridge-line`) and its cases in order. `run_job` starts
the setup once and runs every case on it (`runner.CaseRun`); between two
cases it brings the setup back to health (`recover`: every process running,
the wrappers converged) and, if that fails, starts the whole setup again, so
one case that leaves a broken federation cannot spoil the next.

`run_jobs` runs the jobs in parallel, one worker process each
(`python -m suites.faults worker JOB RESULT`), because a case spends
most of its time waiting for the fault's clock: three setups take the time of
the longest, not the sum. Each worker runs with this checkout first on
PYTHONPATH (so it and the wrappers it starts run this code), in its own
process group, and dies with its parent; its progress lines are relayed with
the setup's name. Workers use different loopback /24s (`first_subnet` and
up), so they never share an address.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from federation.harness.processes import LaunchError, end_process, spawn
from federation.harness.signals import interrupt_on_sigterm
from federation.tools.launch import REPO_ROOT
from suites.faults.bulk import BulkLoad
from suites.faults.catalogue import AFTER_HEALING, EXTENDED, FOLLOW_UPS, SUITE, TOPOLOGIES, Fault
from suites.faults.runner import STREAM_QOS, CaseResult, CaseRun, Scheduled, Timing
from suites.faults.setups import BridgeSetup, FaultSetup, FederationSetup

SETUPS = ("federation-line", "federation-ring", "bridge-line")
DEFAULT_SETTINGS: dict[str, Any] = {"stats_interval": 1.0}
"""the wrappers' protocol settings: the project's defaults, with a `counters` event every second so the case's
events can be known to be on disk when they are read"""
ALONE_FROM = 20.0
"""seconds: a case whose faults last this long runs in a job of its own (`suite_jobs`)"""
WORKER_SLACK = 120.0
"""seconds a worker may run beyond its cases' longest possible time before it is stopped"""

Progress = Callable[[str], None]


@dataclass(frozen=True)
class CasePlan:
    """One case: its name, its faults (times from the stream's start) and the streams' minimum length."""

    case: str
    schedule: tuple[Scheduled, ...]
    length: float = 0.0
    streams: tuple[int, ...] = STREAM_QOS
    """the QoS of each stream"""
    burst: int | None = None
    """each stream is this many publications at once instead of a paced stream"""
    bulk: BulkLoad | None = None
    """a flood of large publications beside the streams (bulk.py)"""

    @property
    def fault_seconds(self) -> float:
        """How long the faults hold, from the first applied to the last healed (0 without faults)."""
        if not self.schedule:
            return 0.0
        return (max(item.at + item.fault.seconds for item in self.schedule)
                - min(item.at for item in self.schedule))

    def longest(self, timing: Timing) -> float:
        """Seconds the case can take at most (every wait to its deadline)."""
        faults_end = max((item.at + item.fault.seconds for item in self.schedule), default=timing.lead)
        return (timing.probe_timeout + max(faults_end + timing.tail, self.length) + timing.ack_timeout
                + timing.drain_timeout + 60.0)

    def to_json(self) -> dict[str, Any]:
        return {"case": self.case, "length": self.length, "streams": list(self.streams), "burst": self.burst,
                "schedule": [{"fault": item.fault.to_json(), "at": item.at} for item in self.schedule],
                "bulk": None if self.bulk is None else self.bulk.to_json()}

    @staticmethod
    def from_json(document: dict[str, Any]) -> CasePlan:
        bulk = document.get("bulk")
        return CasePlan(document["case"], tuple(Scheduled(Fault.from_json(item["fault"]), item["at"])
                                                for item in document["schedule"]), document["length"],
                        tuple(document["streams"]), document["burst"], None if bulk is None else BulkLoad(**bulk))


@dataclass(frozen=True)
class Job:
    """One setup and its cases, where its files go, its first loopback address, timing and wrapper settings."""

    setup: str
    cases: tuple[CasePlan, ...]
    workdir: Path
    first_address: str
    timing: Timing = Timing()
    settings: dict[str, Any] | None = None
    """the wrappers' protocol settings (None: DEFAULT_SETTINGS)"""
    mosquitto_template: Path | None = None
    """the brokers' config template (None: configs/mosquitto.conf)"""
    qos2_v5: bool = False
    """the QoS 2 subscriber speaks MQTT v5 (else 3.1.1, as the QoS 1 subscriber)"""
    small_state_dirs: bool = False
    """each wrapper's state directory on a small tmpfs of its own (the full-disk cases: disk.py; needs root)"""

    def to_json(self) -> dict[str, Any]:
        return {"setup": self.setup, "cases": [plan.to_json() for plan in self.cases], "workdir": str(self.workdir),
                "first_address": self.first_address, "timing": asdict(self.timing), "settings": self.settings,
                "mosquitto_template": None if self.mosquitto_template is None else str(self.mosquitto_template),
                "qos2_v5": self.qos2_v5, "small_state_dirs": self.small_state_dirs}

    @staticmethod
    def from_json(document: dict[str, Any]) -> Job:
        template = document["mosquitto_template"]
        return Job(document["setup"], tuple(CasePlan.from_json(plan) for plan in document["cases"]),
                   Path(document["workdir"]), document["first_address"], Timing(**document["timing"]),
                   document["settings"], None if template is None else Path(template), document["qos2_v5"],
                   document.get("small_state_dirs", False))


def make_setup(job: Job) -> FaultSetup:
    """The job's setup (`federation-line`, `federation-ring` or `bridge-line`), not started."""
    kind, _, topology = job.setup.partition("-")
    if topology not in TOPOLOGIES or kind not in ("federation", "bridge"):
        raise ValueError(f"setup {job.setup!r}: one of {', '.join(SETUPS)}")
    workdir = job.workdir / "nodes"
    if kind == "bridge":
        return BridgeSetup(TOPOLOGIES[topology], workdir, job.first_address, job.mosquitto_template)
    return FederationSetup(TOPOLOGIES[topology], workdir, job.first_address,
                           DEFAULT_SETTINGS if job.settings is None else job.settings, job.mosquitto_template,
                           small_state_dirs=job.small_state_dirs)


def suite_plans(faults: Sequence[Fault] = SUITE, lead: float = Timing.lead) -> tuple[CasePlan, ...]:
    """The default suite's cases: one fault each, applied `lead` seconds into the streams."""
    return tuple(CasePlan(fault.name, (Scheduled(fault, lead),)) for fault in faults)


def suite_jobs(setups: Sequence[str], plans: Sequence[CasePlan], out: Path, subnets: Iterator[int], timing: Timing,
               mosquitto_template: Path | None = None, alone_from: float = ALONE_FROM,
               qos2_v5: bool = False) -> list[Job]:
    """The jobs that run `plans` on every setup: one job per setup, except that a case whose faults last
    `alone_from` seconds or more (the 30 s partition) gets a job of its own, beside the others, so the
    suite takes about as long as its longest case plus the short ones, not the sum. Each job takes the
    next loopback /24 of `subnets`; its files go to `out/<setup>` (`out/<setup>-<case>` for a case alone)."""
    jobs = []
    for setup in setups:
        short = tuple(plan for plan in plans if plan.fault_seconds < alone_from)
        groups = ([(setup, short)] if short else []) + [(f"{setup}-{plan.case}", (plan,)) for plan in plans
                                                       if plan.fault_seconds >= alone_from]
        for directory, group in groups:
            jobs.append(Job(setup, group, out / directory, f"127.0.{next(subnets)}.10", timing,
                            mosquitto_template=mosquitto_template, qos2_v5=qos2_v5))
    return jobs


BULK_CASE = "bulk-flood"
BULK_LOAD = BulkLoad(rate=500.0, size=100_000, seconds=4.0)
"""the default run's flood: 2,000 publications of 100 kB (200 MB) at 500/s beside the plain streams"""


def extended_jobs(out: Path, subnets: Iterator[int], timing: Timing, bulk: BulkLoad = BULK_LOAD,
                  cases: Sequence[str] | None = None, follow_ups: Mapping[str, Fault] = FOLLOW_UPS) -> list[Job]:
    """The jobs of issue 37's cases (`catalogue.EXTENDED` and the bulk flood): one per topology they need, the
    full-disk cases on a setup of their own with small state directories. `cases`: only these (names);
    `follow_ups`: the second fault of a case, `AFTER_HEALING` after its first heals."""
    wanted = None if cases is None else set(cases)
    groups: dict[tuple[str, bool], list[CasePlan]] = {}
    for topology, fault in EXTENDED:
        if wanted is None or fault.name in wanted:
            schedule = [Scheduled(fault, timing.lead)]
            follow_up = follow_ups.get(fault.name)
            if follow_up is not None:
                schedule.append(Scheduled(follow_up, timing.lead + fault.seconds + AFTER_HEALING))
            plan = CasePlan(fault.name, tuple(schedule))
            groups.setdefault((topology, fault.kind == "disk_full"), []).append(plan)
    if wanted is None or BULK_CASE in wanted:
        groups.setdefault(("line", False), []).append(CasePlan(BULK_CASE, (), length=bulk.seconds + 2.0, bulk=bulk))
    jobs = []
    for (topology, small), plans in groups.items():
        name = f"federation-{topology}"
        directory = f"{name}-disk" if small else f"{name}-extended"
        jobs.append(Job(name, tuple(plans), out / directory, f"127.0.{next(subnets)}.10", timing,
                        small_state_dirs=small))
    return jobs


def merge(jobs: Sequence[Job], results: Sequence[list[CaseResult]]) -> dict[str, list[CaseResult]]:
    """The results of `run_jobs` by setup name (in the order setups first appear), each setup's cases in the
    order of its jobs."""
    merged: dict[str, list[CaseResult]] = {}
    for job, cases in zip(jobs, results, strict=True):
        merged.setdefault(job.setup, []).extend(cases)
    return merged


def summary_line(result: CaseResult) -> str:
    if result.error is not None:
        return f"{result.case}: not judged: {result.error.splitlines()[0]}"
    parts = []
    for qos, count in sorted(result.streams.items()):
        verdict = "ok" if count.meets(qos) else "FAIL"
        parts.append(f"QoS {qos} {verdict} (lost {count.lost}, dup {count.duplicated}, late {count.late} "
                     f"of {count.acknowledged})")
    return f"{result.case}: " + "; ".join(parts) + f" [{result.ended - result.started:.0f} s]"


def run_job(job: Job, progress: Progress = print,
            on_result: Callable[[list[CaseResult]], None] | None = None) -> list[CaseResult]:
    """Run every case of the job on one setup; see the module docstring. Never raises for a case's failure:
    a case that could not be judged has `error` set. `on_result` gets the results so far after every case."""
    setup = make_setup(job)
    clients = job.workdir / "clients"
    clients.mkdir(parents=True, exist_ok=True)
    token = f"r{int(time.time()) % 100000}"
    results: list[CaseResult] = []
    started = False
    try:
        for plan in job.cases:
            try:
                if not started:
                    setup.start()
                    started = True
                else:
                    _recover(setup, progress)
            except LaunchError as error:
                results.append(CaseResult(setup.name, plan.case, [], error=f"setup: {error}"))
                progress(summary_line(results[-1]))
                if on_result is not None:
                    on_result(results)
                setup.stop()
                started = False
                continue
            result = CaseRun(setup, plan.case, list(plan.schedule), job.timing, clients, token, plan.length,
                             plan.streams, plan.burst, job.qos2_v5, plan.bulk).run()
            results.append(result)
            progress(summary_line(result))
            if on_result is not None:
                on_result(results)
    finally:
        setup.stop()
    return results


def _prefixed(progress: Progress, name: str) -> Progress:
    return lambda line: progress(f"{name}: {line}")


def _recover(setup: FaultSetup, progress: Progress) -> None:
    try:
        setup.recover()
    except LaunchError as error:
        progress(f"did not recover ({str(error).splitlines()[0]}); starting the setup again")
        setup.stop()
        setup.start()


def run_jobs(jobs: Sequence[Job], parallel: bool = True, progress: Progress = print) -> list[list[CaseResult]]:
    """Every job's results, in the order of `jobs`: in worker processes side by side, or one after another here."""
    if not parallel:
        return [run_job(job, _prefixed(progress, job.setup)) for job in jobs]
    workers = [_Worker(job) for job in jobs]
    try:
        for worker in workers:
            worker.start()
        while any(worker.running for worker in workers):
            for worker in workers:
                worker.relay(progress)
                worker.enforce_deadline()
            time.sleep(0.2)  # relaying progress; each worker's end is checked on every pass
        for worker in workers:
            worker.relay(progress)
        return [worker.results() for worker in workers]
    finally:
        for worker in workers:
            worker.stop()


class _Worker:
    """One job in its own process (`python -m suites.faults worker JOB RESULT`)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        job.workdir.mkdir(parents=True, exist_ok=True)
        self.job_file = job.workdir / "job.json"
        self.result_file = job.workdir / "result.json"
        self.log = job.workdir / "worker.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.deadline = 0.0
        self._offset = 0

    def start(self) -> None:
        self.job_file.write_text(json.dumps(self.job.to_json(), indent=1), encoding="utf-8")
        with contextlib.suppress(FileNotFoundError):
            self.result_file.unlink()
        path = os.environ.get("PYTHONPATH", "")
        environment = {"PYTHONPATH": str(REPO_ROOT) + (os.pathsep + path if path else "")}
        self.process = spawn([sys.executable, "-m", "suites.faults", "worker", str(self.job_file),
                              str(self.result_file)], self.log, env=environment)
        self.deadline = time.monotonic() + sum(plan.longest(self.job.timing) for plan in self.job.cases) \
            + WORKER_SLACK

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def relay(self, progress: Progress) -> None:
        """Pass on the complete lines the worker logged since the last call, prefixed with its setup's name."""
        try:
            with open(self.log, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return
        complete = data[:data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            progress(f"{self.job.setup} ({self.job.workdir.name}): {line}" if self.job.workdir.name != self.job.setup
                     else f"{self.job.setup}: {line}")

    def enforce_deadline(self) -> None:
        if self.running and time.monotonic() > self.deadline:
            end_process(self.process)

    def stop(self) -> None:
        end_process(self.process)

    def results(self) -> list[CaseResult]:
        try:
            document = json.loads(self.result_file.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            code = None if self.process is None else self.process.returncode
            raise LaunchError(f"the worker of {self.job.setup} exited with status {code} without results; its log "
                              f"{self.log}:\n{self.log.read_text(errors='replace')[-3000:]}") from None
        return [CaseResult.from_json(case) for case in document["cases"]]


def worker_main(job_file: Path, result_file: Path) -> int:
    """The worker process: run the job, write its results (also the cases done when it is interrupted)."""
    job = Job.from_json(json.loads(job_file.read_text(encoding="utf-8")))

    def write(results: list[CaseResult]) -> None:
        partial = result_file.with_suffix(".partial")
        partial.write_text(json.dumps({"setup": job.setup, "cases": [result.to_json() for result in results]},
                                      indent=1), encoding="utf-8")
        partial.replace(result_file)

    with interrupt_on_sigterm():
        write(run_job(job, lambda line: print(line, flush=True), write))
    return 0
