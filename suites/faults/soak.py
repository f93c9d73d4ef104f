"""The soak: a ring under steady load for twenty minutes, a wrapper restarted cleanly every two and one killed every
five (issue 37), every stream counted at every subscribing node.

Theory of operation: one case (`soak_plan`) on the ring with subscribers on both sides of it (`RING_SPLIT`: on b and
on c, the core), QoS 1 and QoS 2 streams from a at `SOAK_RATE` each. Every `restart_every` seconds a wrapper is
stopped with SIGTERM (it leaves the overlay cleanly: a core hands its filters over, the withdrawal window of issue
37) and started again `RESTART_SECONDS` later, the roles in turn, the core's first; every `kill_every` seconds one
is killed with SIGKILL and started again `KILL_SECONDS` later, the roles in turn, half-way between two restarts so
that no process is hit twice at once. Then the streams drain and the case is judged as any other
(`runner.CaseRun`): 0 lost, in order, QoS 2 once at each subscriber, and the wrappers' counters against those
counts (`ledger.py`).
"""

from __future__ import annotations

import math
from pathlib import Path

from suites.faults.catalogue import Fault
from suites.faults.runner import Scheduled, Timing
from suites.faults.suite import CasePlan, Job

SOAK_CASE = "soak"
SOAK_SETUP = "federation-ring-split"
SOAK_MINUTES = 20.0
SOAK_RATE = 300.0
"""publications per second of each stream"""
RESTART_EVERY = 120.0
KILL_EVERY = 300.0
RESTART_SECONDS = 2.0
"""a wrapper stopped cleanly is started again this much later"""
KILL_SECONDS = 6.0
"""a wrapper killed is started again this much later (past the 3 s neighbour-down time, as in the suite)"""
RESTART_ROLES = ("subscriber", "publisher", "middle", "bypass")
KILL_ROLES = ("middle", "subscriber", "bypass", "publisher")


def soak_plan(minutes: float = SOAK_MINUTES, restart_every: float = RESTART_EVERY,
              kill_every: float = KILL_EVERY) -> CasePlan:
    """The soak's case: restarts at `restart_every`, 2 x `restart_every`, ...; a kill in the middle of the restart
    interval that holds each multiple of `kill_every`; every fault healed before the streams end."""
    length = minutes * 60.0
    schedule: list[Scheduled] = []
    for number in range(int(length // restart_every)):
        at = restart_every * (number + 1)
        role = RESTART_ROLES[number % len(RESTART_ROLES)]
        if at + RESTART_SECONDS < length:
            schedule.append(Scheduled(Fault(f"restart-{number + 1}-{role}", "stop_wrapper", role, RESTART_SECONDS,
                                            f"SIGTERM the {role} wrapper, start it {RESTART_SECONDS:g} s later"),
                                      at))
    for number in range(int(length // kill_every)):
        at = math.floor(kill_every * (number + 1) / restart_every) * restart_every + restart_every / 2
        role = KILL_ROLES[number % len(KILL_ROLES)]
        if at + KILL_SECONDS < length:
            schedule.append(Scheduled(Fault(f"kill-{number + 1}-{role}", "kill_wrapper", role, KILL_SECONDS,
                                            f"kill -9 the {role} wrapper, restart after {KILL_SECONDS:g} s"), at))
    return CasePlan(SOAK_CASE, tuple(sorted(schedule, key=lambda item: item.at)), length)


def soak_job(workdir: Path, first_address: str, minutes: float = SOAK_MINUTES, rate: float = SOAK_RATE) -> Job:
    """The soak as a job of its own (`suite.run_job`, `run_jobs`)."""
    return Job(SOAK_SETUP, (soak_plan(minutes),), workdir, first_address, Timing(rate=rate))


def soak_title(plan: CasePlan, rate: float) -> str:
    restarts = sum(1 for item in plan.schedule if item.fault.kind == "stop_wrapper")
    kills = len(plan.schedule) - restarts
    return (f"{plan.length / 60:g} min at {rate:g}/s a stream on the ring (subscribers on b and c, c the core): "
            f"{restarts} clean restarts, {kills} kills")
