"""Random fault schedules on small federations, for the simulator: a seeded generator of scenarios.

A seed gives a topology of 4-10 nodes (a random spanning tree plus random extra links), random
subscriptions and publications, and a fault phase of random cuts (one- and two-way), heals, kills,
restarts and loss. At `Timeline.fault_end` every link heals, loss stops and dead nodes restart; a burst
of publications follows after `settle` quiet seconds. About half the publications are QoS 1; their QoS
is drawn from a generator of its own, so the rest of a seed's schedule is what it was before QoS 1 came
in; so are up to two bursts during the faults (5-30 publications at one instant, mostly QoS 1: the node
takes each as one run, `tb` or `tq`). `tests/sim/test_sim_random_faults.py` judges the runs; the golden
traces (`tests/golden_traces.py`) replay some of them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from federation.protocol.settings import Settings
from federation.scenario.model import (
    Cut,
    Heal,
    Kill,
    LinkDefaults,
    Loss,
    NodeSpec,
    Publish,
    Restart,
    Scenario,
    ScenarioEvent,
    Subscribe,
    Unsubscribe,
)

FAST_SETTINGS = Settings(hello_interval=0.2, dead_intervals=3, announce_interval=1.0, expire_intervals=3,
                         stats_interval=60.0)
FILTERS = ("a/#", "a/+", "a/b", "+/b", "a/b/c", "$share/g/a/b", "x/#")
TOPICS = ("a/b", "a/c", "z/b", "a/b/c", "x/y")


@dataclass(frozen=True)
class Timeline:
    fault_start: float = 2.0
    fault_end: float = 8.0
    settle: float = 5.0
    burst: float = 1.5
    """seconds of quiet-phase publications"""
    tail: float = 1.5
    """seconds after the last publication for deliveries to land"""

    @property
    def quiet_from(self) -> float:
        return self.fault_end + self.settle + 0.5

    @property
    def duration(self) -> float:
        return self.quiet_from + self.burst + self.tail


def random_scenario(seed: int, min_nodes: int = 4, max_nodes: int = 10, timeline: Timeline = Timeline()) -> Scenario:
    rng = random.Random(f"random-faults:{seed}")
    count = rng.randint(min_nodes, max_nodes)
    names = [f"n{index}" for index in range(count)]
    links: set[tuple[str, str]] = set()
    for index in range(1, count):
        links.add((names[rng.randrange(index)], names[index]))
    for _ in range(rng.randint(0, count)):
        a, b = rng.sample(names, 2)
        if (b, a) not in links:
            links.add((a, b))
    link_list = sorted(links)
    events: list[ScenarioEvent] = []
    subscriptions: list[tuple[str, str, str]] = []
    for number in range(rng.randint(1, 6)):
        node, topic_filter = rng.choice(names), rng.choice(FILTERS)
        at = round(rng.uniform(0.0, timeline.fault_end), 3)
        client = f"c{number}"
        events.append(Subscribe(at, node, client, topic_filter, qos=rng.choice((0, 1))))
        subscriptions.append((node, client, topic_filter))
    for node, client, topic_filter in subscriptions:
        if rng.random() < 0.2:
            events.append(Unsubscribe(round(rng.uniform(timeline.fault_start, timeline.fault_end), 3), node,
                                      client, topic_filter))
    qos_rng = random.Random(f"random-faults-qos:{seed}")
    for _ in range(rng.randint(0, 4)):
        events.append(Publish(round(rng.uniform(1.0, timeline.fault_end), 3), rng.choice(names),
                              rng.choice(TOPICS), count=rng.randint(1, 3), interval=0.1, qos=qos_rng.choice((0, 1))))
    burst_rng = random.Random(f"random-faults-bursts:{seed}")  # its own stream: the rest of the seed unchanged
    for _ in range(burst_rng.randint(0, 2)):  # read from a broker together: `tb` and `tq` runs (rules 7c, 7e)
        events.append(Publish(round(burst_rng.uniform(1.0, timeline.fault_end), 3), burst_rng.choice(names),
                              burst_rng.choice(TOPICS), count=burst_rng.randint(5, 30), interval=0.0,
                              qos=burst_rng.choice((0, 1, 1))))
    faults: list[ScenarioEvent] = []
    for _ in range(rng.randint(1, 8)):
        at = round(rng.uniform(timeline.fault_start, timeline.fault_end - 0.5), 3)
        kind = rng.choice(("cut", "cut", "oneway", "heal", "kill", "restart", "loss", "loss_all"))
        a, b = rng.choice(link_list)
        if kind == "cut":
            faults.append(Cut(at, a, b))
        elif kind == "oneway":
            faults.append(Cut(at, a, b, oneway=True) if rng.random() < 0.5 else Cut(at, b, a, oneway=True))
        elif kind == "heal":
            faults.append(Heal(at, a, b))
        elif kind == "kill":
            faults.append(Kill(at, rng.choice(names)))
        elif kind == "restart":
            faults.append(Restart(at, rng.choice(names)))
        elif kind == "loss":
            faults.append(Loss(at, rng.choice((5.0, 20.0, 50.0)), (a, b)))
        else:
            faults.append(Loss(at, rng.choice((2.0, 10.0))))
    faults.sort(key=lambda event: event.at)
    dead: set[str] = set()
    for fault in faults:
        if isinstance(fault, Kill):
            dead.add(fault.node)
        elif isinstance(fault, Restart):
            dead.discard(fault.node)
    end = timeline.fault_end
    repair: list[ScenarioEvent] = [Heal(end, a, b) for a, b in link_list]
    repair.append(Loss(end, 0.0))
    repair.extend(Restart(end, node) for node in sorted(dead))
    quiet: list[ScenarioEvent] = []
    for _ in range(rng.randint(2, 5)):
        at = round(timeline.quiet_from + rng.uniform(0.0, timeline.burst), 3)
        quiet.append(Publish(at, rng.choice(names), rng.choice(TOPICS), count=rng.randint(1, 3), interval=0.05,
                             qos=qos_rng.choice((0, 1))))
    model = LinkDefaults(latency=rng.choice((0.001, 0.003, 0.01)), jitter=rng.choice((0.0, 0.0, 0.002)),
                         duplicate=rng.choice((0.0, 0.0, 1.0)))
    everything = sorted(events + faults + repair + quiet, key=lambda event: event.at)
    return Scenario(
        name=f"random-faults-{seed}", source=f"federation.sim.random_faults seed {seed}",
        nodes=tuple(NodeSpec(name) for name in names), links=tuple(link_list), settings=FAST_SETTINGS,
        duration=timeline.duration, events=tuple(everything), link_model=model, settle=timeline.settle,
    )
