"""Shared subscription groups on the simulator with the real node (docs/protocol.md rule 9): each publication
is delivered once per group federation-wide, by the origin's broker when it has a member, else by one member
broker; when a member leaves or its broker is cut off, the next takes over, and QoS 1 is not lost.

The simulator's deliveries are injections into a broker; a broker with a member of the group serves it, so
"delivered once per group" is "injected into exactly one member broker" (or none, when the origin has a
member: its own broker served it).
"""

from __future__ import annotations

from collections import Counter

from federation.protocol.events import publication_text
from federation.protocol.node import Node
from federation.protocol.settings import Settings
from federation.scenario.model import (
    Cut,
    NodeSpec,
    Publish,
    Scenario,
    ScenarioEvent,
    Subscribe,
    Unsubscribe,
)
from federation.sim.runner import Simulation

LINE = (("a", "b"), ("b", "c"), ("c", "d"))
TOPIC = "g/t"
SHARED = "$share/g/g/#"


def run(events: list[ScenarioEvent], duration: float, seed: int = 1) -> Simulation:
    names = sorted({name for link in LINE for name in link})
    scenario = Scenario(name="shared", source="tests/sim/test_shared_groups_sim.py",
                        nodes=tuple(NodeSpec(name, vid=index + 1) for index, name in enumerate(names)),
                        links=LINE, settings=Settings(stats_interval=60.0), duration=duration,
                        events=tuple(sorted(events, key=lambda e: e.at)))
    simulation = Simulation(scenario, seed=seed)
    simulation.run()
    return simulation


def nodes(simulation: Simulation) -> dict[str, Node]:
    return {host.name: host.node for host in simulation.network.hosts if host.node is not None}


def sent_at(simulation: Simulation) -> dict[str, float]:
    return {record.publication: record.sent_at for record in simulation.publications}


def deliveries(simulation: Simulation) -> dict[str, list[str]]:
    """publication -> the nodes it was injected into"""
    stream = {publication_text(publication) for publication, topic in simulation.topics.items() if topic == TOPIC}
    found: dict[str, list[str]] = {publication: [] for publication in stream}
    for record in simulation.deliveries:
        if record.publication in found:
            found[record.publication].append(record.node)
    return found


def test_remote_members_get_each_publication_once_spread_over_their_brokers() -> None:
    events: list[ScenarioEvent] = [Subscribe(1.0, "b", "m_b", SHARED, qos=1),
                                   Subscribe(1.0, "d", "m_d", SHARED, qos=1),
                                   Publish(10.0, "a", TOPIC, count=200, interval=0.01, qos=1)]
    simulation = run(events, 20.0)
    found = deliveries(simulation)
    assert len(found) == 200
    assert all(len(nodes) == 1 for nodes in found.values()), [n for n in found.values() if len(n) != 1][:5]
    spread = Counter(nodes[0] for nodes in found.values())
    assert set(spread) == {"b", "d"} and min(spread.values()) > 60, spread
    assert len(simulation.released.get("a", set())) >= 200  # custody released every one
    assert not simulation.violations
    assert all(node.counters["shared_group_served_twice"] == 0 for node in nodes(simulation).values())


def test_a_member_on_the_publishing_broker_takes_every_publication_there() -> None:
    events: list[ScenarioEvent] = [Subscribe(1.0, "a", "m_a", SHARED, qos=1),
                                   Subscribe(1.0, "c", "m_c", SHARED, qos=1),
                                   Publish(10.0, "a", TOPIC, count=50, interval=0.01, qos=1)]
    found = deliveries(run(events, 15.0))
    assert len(found) == 50 and all(nodes == [] for nodes in found.values())  # a's broker served them


def test_a_plain_subscriber_beside_a_member_is_counted_as_serving_the_group_twice() -> None:
    events: list[ScenarioEvent] = [Subscribe(1.0, "b", "m_b", SHARED, qos=1),
                                   Subscribe(1.0, "d", "m_d", SHARED, qos=1),
                                   Subscribe(1.0, "d", "plain", "g/#", qos=1),
                                   Publish(10.0, "a", TOPIC, count=100, interval=0.01, qos=1)]
    simulation = run(events, 15.0)
    found = deliveries(simulation)
    assert all("d" in nodes and len(nodes) <= 2 for nodes in found.values())
    twice = sum(1 for nodes in found.values() if "b" in nodes)
    assert twice > 20
    assert nodes(simulation)["d"].counters["shared_group_served_twice"] == twice


def test_the_next_member_takes_over_when_a_member_leaves_or_is_cut_off() -> None:
    events: list[ScenarioEvent] = [Subscribe(1.0, "b", "m_b", SHARED, qos=1),
                                   Subscribe(1.0, "c", "m_c", SHARED, qos=1),
                                   Subscribe(1.0, "d", "m_d", SHARED, qos=1),
                                   Publish(10.0, "a", TOPIC, count=1000, interval=0.01, qos=1),
                                   Unsubscribe(12.0, "b", "m_b", SHARED),
                                   Cut(15.0, "c", "d"), Cut(15.0, "d", "c")]
    simulation = run(events, 40.0)
    found = deliveries(simulation)
    assert len(found) == 1000
    lost = [publication for publication, nodes in found.items() if not nodes]
    assert lost == []  # QoS 1 in flight to b or d when they went carried over to the next member
    assert all(len(nodes) == 1 for nodes in found.values())
    late = [sent_at(simulation)[publication] for publication, nodes in found.items() if nodes == ["b"]]
    assert all(at < 12.5 for at in late)
    assert sum(node.counters["shared_failovers"] for node in nodes(simulation).values()) > 0
    assert not simulation.violations


def test_a_member_broker_behind_the_one_that_lost_its_member_takes_over() -> None:
    """Line a-b-c, members on b and c: copies for c pass through b. When c's member leaves, the copies on
    their way to c fail over back to b, which relayed them: b serves them (not a duplicate), none is lost."""
    events: list[ScenarioEvent] = [Subscribe(1.0, "b", "m_b", SHARED, qos=1),
                                   Subscribe(1.0, "c", "m_c", SHARED, qos=1),
                                   Publish(10.0, "a", TOPIC, count=4000, interval=0.0005, qos=1),
                                   Unsubscribe(10.5, "c", "m_c", SHARED)]
    simulation = run(events, 20.0)
    found = deliveries(simulation)
    assert len(found) == 4000
    assert [publication for publication, nodes in found.items() if len(nodes) != 1] == []
    assert nodes(simulation)["c"].counters["shared_failovers"] > 0
    assert not simulation.violations
