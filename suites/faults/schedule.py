"""Random fault schedules, each reproducible from its seed (the long variant of the suite).

Theory of operation: one `random.Random(seed)` makes every choice of a run,
in a fixed order: the topology, how long the streams run, how many faults,
and for each fault its kind, its target (a role of the topology), its start
and how long it lasts. The same seed gives the same schedule on any machine
and in any Python (Random's algorithm is fixed), so a failing run is replayed
with `python -m suites.faults random --seed N`; only the timing of
the real processes differs from run to run.

Faults may overlap, but never two on the same process at once (a wrapper is
not killed while it is stopped, two partitions do not overlap), and never on
the publisher's broker: with `persistence false` a killed broker loses what
it had acknowledged and not yet passed on, and that is Mosquitto's contract,
not the federation's. After the last fault heals the streams run for a tail;
then the drain (the liveness phase) must bring every acknowledged
publication to the subscriber.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from suites.faults.catalogue import TOPOLOGIES, Fault, Topology
from suites.faults.runner import Scheduled

STREAM_SECONDS = (20.0, 45.0)
"""range of the streams' length before the tail"""
MAX_FAULTS = 3
SECONDS = {"kill_wrapper": (1.0, 10.0), "kill_broker": (1.0, 8.0), "pause_wrapper": (1.0, 10.0),
           "partition": (2.0, 30.0)}
"""range of each kind's duration, seconds"""
FIRST_AT = 2.0
"""no fault before the streams have run this long (seconds)"""
ATTEMPTS = 50
"""tries to place one fault before it is left out"""


@dataclass(frozen=True)
class RandomCase:
    seed: int
    topology: Topology
    length: float
    """seconds the streams run at least (then `Timing.tail` more after the last healing)"""
    schedule: tuple[Scheduled, ...]

    @property
    def name(self) -> str:
        return f"seed-{self.seed}"


def _targets(kind: str, topology: Topology) -> list[str]:
    roles = sorted(topology.roles)
    if kind == "kill_broker":
        return [role for role in roles if role != "publisher"]
    return roles


def _process(fault: Fault, topology: Topology) -> str:
    """What the fault holds: one process, or the network for a partition."""
    if fault.role is None:
        return "network"
    which = "broker" if fault.kind == "kill_broker" else "wrapper"
    return f"{which} {topology.node(fault.role)}"


def random_case(seed: int) -> RandomCase:
    """The run of `seed`; see the module docstring."""
    chooser = random.Random(seed)
    topology = TOPOLOGIES[chooser.choice(sorted(TOPOLOGIES))]
    length = round(chooser.uniform(*STREAM_SECONDS), 1)
    wanted = chooser.randint(1, MAX_FAULTS)
    placed: list[Scheduled] = []
    for number in range(wanted):
        for _ in range(ATTEMPTS):
            kind = chooser.choice(sorted(SECONDS))
            role = None if kind == "partition" else chooser.choice(_targets(kind, topology))
            seconds = round(chooser.uniform(*SECONDS[kind]), 1)
            latest = length - seconds
            if latest < FIRST_AT:
                continue
            at = round(chooser.uniform(FIRST_AT, latest), 1)
            fault = Fault(f"{number + 1}-{kind.replace('_', '-')}" + (f"-{role}" if role else ""), kind, role,
                          seconds, f"random fault {number + 1} of seed {seed}")
            if not any(_process(other.fault, topology) == _process(fault, topology)
                       and at < other.at + other.fault.seconds and other.at < at + seconds for other in placed):
                placed.append(Scheduled(fault, at))
                break
    return RandomCase(seed, topology, length, tuple(sorted(placed, key=lambda item: item.at)))
