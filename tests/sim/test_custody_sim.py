"""Issue 19 on the simulator with the real node: a numbered QoS 1 stream through a line and a 4-ring while a
middle node is killed and restarted, a partition lasts 30 s, or a node is stopped for longer than the
neighbour-down time (modelled as its links cut both ways for that time). The subscriber must get every
publication once and in order; the publisher's custody must release every one of them.

The faults mirror the real-process suite (docs/guarantees.md, `python -m suites.faults`): the
stream is 50 publications/s from a to a subscriber on c, with the project's default protocol settings
(3 s neighbour-down time); a fault starts 2 s into the stream.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from federation.protocol.settings import Settings
from federation.scenario.model import Cut, Heal, Kill, NodeSpec, Publish, Restart, Scenario, ScenarioEvent, Subscribe
from federation.sim.runner import Simulation

TOPIC = "faults/q1"
RATE = 50
STREAM_START = 10.0
STREAM = 12.0
"""seconds of publications"""
FAULT_AT = STREAM_START + 2.0
TOPOLOGIES = {
    "line": (("a", "b"), ("b", "c")),
    "ring": (("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")),
}


def kill_middle(at: float, topology: str) -> list[ScenarioEvent]:
    return [Kill(at, "b"), Restart(at + 6.0, "b")]


def stop_middle(at: float, topology: str) -> list[ScenarioEvent]:
    """SIGSTOP for 6 s: every link of b dead both ways, its state kept."""
    links = [link for link in TOPOLOGIES[topology] if "b" in link]
    return [Cut(at, *link) for link in links] + [Heal(at + 6.0, *link) for link in links]


def partition(at: float, topology: str) -> list[ScenarioEvent]:
    """{a, b} | {c (, d)} for 30 s."""
    links = [("b", "c")] if topology == "line" else [("b", "c"), ("d", "a")]
    return [Cut(at, *link) for link in links] + [Heal(at + 30.0, *link) for link in links]


def kill_subscriber_side(at: float, topology: str) -> list[ScenarioEvent]:
    return [Kill(at, "c"), Restart(at + 6.0, "c")]


def kill_publisher_side(at: float, topology: str) -> list[ScenarioEvent]:
    """The publisher's wrapper dies for 6 s: what it published meanwhile is not published (the broker would
    queue it for the wrapper's session: the daemon's part); what it had not released comes from its spool."""
    return [Kill(at, "a"), Restart(at + 6.0, "a")]


def kill_publisher_while_cut_off(at: float, topology: str) -> list[ScenarioEvent]:
    """The publisher's side is cut off from the core (publications pile up in a's custody and b's), then a's
    wrapper dies; it comes back, replays its spool, and the cut heals."""
    links = [("b", "c")] if topology == "line" else [("b", "c"), ("d", "a")]
    return [Cut(at, *link) for link in links] + [Kill(at + 2.0, "a"), Restart(at + 8.0, "a")] + \
        [Heal(at + 12.0, *link) for link in links]


FAULTS = {"kill_middle": kill_middle, "stop_middle": stop_middle, "partition": partition,
          "kill_subscriber_side": kill_subscriber_side, "kill_publisher_side": kill_publisher_side,
          "kill_publisher_while_cut_off": kill_publisher_while_cut_off}


@dataclass
class Outcome:
    published: list[str]
    delivered: list[str]
    released: int
    simulation: Simulation

    @property
    def lost(self) -> list[str]:
        return sorted(set(self.published) - set(self.delivered))

    @property
    def duplicates(self) -> int:
        return sum(count - 1 for count in Counter(self.delivered).values())

    @property
    def inversions(self) -> int:
        seqs = [(int(text.split("/")[-2]), int(text.split("/")[-1])) for text in dict.fromkeys(self.delivered)]
        return sum(1 for before, after in zip(seqs, seqs[1:], strict=False) if after < before)


def run(topology: str, fault: str, seed: int = 1) -> Outcome:
    events: list[ScenarioEvent] = [Subscribe(1.0, "c", "sub", "faults/#", qos=1)]
    events.append(Publish(STREAM_START, "a", TOPIC, count=int(STREAM * RATE), interval=1.0 / RATE, qos=1))
    events += FAULTS[fault](FAULT_AT, topology)
    names = sorted({name for link in TOPOLOGIES[topology] for name in link})
    scenario = Scenario(name=f"{topology}-{fault}", source="tests/sim/test_custody_sim.py",
                        nodes=tuple(NodeSpec(name, vid=index + 1) for index, name in enumerate(names)),
                        links=TOPOLOGIES[topology], settings=Settings(stats_interval=60.0),
                        duration=FAULT_AT + 30.0 + 40.0, events=tuple(sorted(events, key=lambda e: e.at)))
    simulation = Simulation(scenario, seed=seed)
    simulation.run()
    published = [record.publication for record in simulation.publications if record.topic == TOPIC]
    delivered = [record.publication for record in simulation.deliveries if record.node == "c"]
    stream = {publication for publication, topic in simulation.topics.items() if topic == TOPIC}
    released = len(simulation.released.get("a", set()) & stream)
    return Outcome(published, delivered, released, simulation)


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
@pytest.mark.parametrize("fault", ["kill_middle", "stop_middle", "partition", "kill_subscriber_side"])
def test_a_qos1_stream_loses_nothing_and_keeps_its_order(topology: str, fault: str) -> None:
    outcome = run(topology, fault)
    assert len(outcome.published) == STREAM * RATE
    assert outcome.lost == [], f"{len(outcome.lost)} lost"
    assert outcome.inversions == 0
    assert outcome.duplicates == 0  # the subscriber side's journal keeps it across its restart too
    assert outcome.released == len(outcome.published)  # the publisher's custody let go of every one
    assert not outcome.simulation.violations


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
@pytest.mark.parametrize("fault", ["kill_publisher_side", "kill_publisher_while_cut_off"])
def test_a_restarted_publisher_replays_what_it_had_not_released(topology: str, fault: str) -> None:
    outcome = run(topology, fault)
    # The ones made while a's wrapper was dead were never made (skipped): its broker's part.
    assert len(outcome.published) == STREAM * RATE - 6 * RATE
    assert outcome.lost == [] and outcome.inversions == 0 and outcome.duplicates == 0
    assert outcome.released == len(outcome.published)
    assert not outcome.simulation.violations
