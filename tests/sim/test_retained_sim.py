"""Retained publications on the simulator: every broker of the component gets each one, injected with retain,
over the built-in retained tree (docs/protocol.md rule 10); ordinary publications route as before.

The report's expected-delivery rule expects a retained publication at every other node of the component
(federation.scenario.truth), so a lost, duplicated or unexpected one is an invariant violation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from federation.protocol.modes import RETAINED_FILTER
from federation.protocol.publication_events import expand_all
from federation.scenario.loader import parse_scenario
from federation.sim.runner import Simulation


def line_scenario(events: list[dict[str, Any]], duration: float = 20.0) -> dict[str, Any]:
    return {"name": "retained-line", "duration": duration,
            "nodes": {f"n{i}": {"id": i} for i in range(5)},
            "links": [["n0", "n1"], ["n1", "n2"], ["n2", "n3"], ["n3", "n4"], ["n1", "n3"]],
            "events": events}


def run(data: dict[str, Any], tmp_path: Path) -> tuple[dict[str, Any], list[dict[str, Any]], Simulation]:
    sim = Simulation(parse_scenario(data, "retained.yaml"), seed=1, events_path=str(tmp_path / "events.jsonl"))
    report = sim.run()
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    return report, expand_all(json.loads(line) for line in lines), sim  # runs as one record per publication


def test_a_retained_publication_reaches_every_broker_even_without_subscribers(tmp_path: Path) -> None:
    report, events, _sim = run(line_scenario([
        {"at": 1, "subscribe": {"node": "n4", "client": "s", "filter": "live/#"}},
        {"at": 6, "publish": {"node": "n2", "topic": "status/a", "retain": True, "qos": 1, "count": 3,
                              "interval": 0.5}},
        {"at": 6, "publish": {"node": "n0", "topic": "status/b", "retain": True, "count": 2, "interval": 0.5}},
        {"at": 8, "publish": {"node": "n0", "topic": "live/x", "qos": 1, "count": 3, "interval": 0.2}},
    ]), tmp_path)
    publications = report["publications"]
    assert report["invariants"]["ok"], report["invariants"]["violations"]
    assert (publications["lost"], publications["duplicates"], publications["unexpected"]) == (0, 0, 0)
    # 5 retained publications, each expected at the 4 other nodes; 3 ordinary ones at n4 alone
    assert publications["delivered"] == 5 * 4 + 3
    injected = [e for e in events if e["type"] == "sim_inject"]
    assert sum(1 for e in injected if e["topic"].startswith("status/")) == 20
    originated = [e for e in events if e["type"] == "publication_originated"]
    assert all(e["filters"][0] == RETAINED_FILTER for e in originated if e["retain"])
    assert all(RETAINED_FILTER not in e["filters"] for e in originated if not e["retain"])
    forwarded = [e for e in events if e["type"] == "publication_forwarded"]
    retained_pubs = {e["pub"] for e in originated if e["retain"]}
    copies = sum(len(e["to"]) for e in forwarded if e["pub"] in retained_pubs)
    assert copies == 5 * 4  # one tree: N - 1 copies each


def test_without_retained_publications_nothing_is_sent_for_the_retained_tree(tmp_path: Path) -> None:
    _report, events, sim = run(line_scenario([
        {"at": 1, "subscribe": {"node": "n4", "client": "s", "filter": "live/#"}},
        {"at": 6, "publish": {"node": "n0", "topic": "live/x", "qos": 1, "count": 3, "interval": 0.2}},
    ], duration=10.0), tmp_path)
    assert not any(e.get("filter") == RETAINED_FILTER for e in events)
    for host in sim.network.hosts:
        assert host.node is None or RETAINED_FILTER not in host.node.mesh.topics


def test_the_retained_tree_is_rebuilt_after_a_partition_heals_and_reaches_every_node_again(tmp_path: Path) -> None:
    report, _events, _sim = run(line_scenario([
        {"at": 4, "publish": {"node": "n0", "topic": "status/a", "retain": True, "qos": 1}},
        {"at": 6, "cut": ["n1", "n2"]},
        {"at": 6, "cut": ["n1", "n3"]},
        {"at": 10, "publish": {"node": "n4", "topic": "status/b", "retain": True, "qos": 1}},
        {"at": 12, "heal": ["n1", "n2"]},
        {"at": 12, "heal": ["n1", "n3"]},
        {"at": 20, "publish": {"node": "n4", "topic": "status/c", "retain": True, "qos": 2}},
    ], duration=30.0), tmp_path)
    # status/b, made during the partition, is not in bound (it expects nobody): it crosses the healed links by the
    # stores' anti-entropy (test below); status/c, made after, reaches everyone over the tree.
    assert report["invariants"]["ok"], report["invariants"]["violations"]
    assert report["publications"]["lost"] == 0


def newest(sim: Simulation, topic: str) -> set[tuple[str, tuple[int, int, int, str, int] | None]]:
    """(node, the version its store holds for `topic`) of every node."""
    return {(name, index.retained_versions.get(topic)) for name, index in sim.retained.items()}


def test_after_a_partition_heals_every_node_ends_with_the_newest_retained_value_of_each_topic(
        tmp_path: Path) -> None:
    # Two sides, {n0, n1} and {n2, n3, n4}, each updating the same retained topics with QoS 0 while cut off: no
    # copy of an update crosses the partition. After the heal, the stores' anti-entropy (rd, rs, rr, rv) brings
    # every node the newest version of each topic, whichever side made it.
    report, events, sim = run(line_scenario([
        {"at": 4, "publish": {"node": "n0", "topic": "status/a", "retain": True}},
        {"at": 4, "publish": {"node": "n4", "topic": "status/b", "retain": True}},
        {"at": 6, "cut": ["n1", "n2"]},
        {"at": 6, "cut": ["n1", "n3"]},
        {"at": 8, "publish": {"node": "n4", "topic": "status/a", "retain": True, "count": 3, "interval": 0.2}},
        {"at": 8, "publish": {"node": "n0", "topic": "status/a", "retain": True}},
        {"at": 8, "publish": {"node": "n1", "topic": "status/b", "retain": True, "count": 2, "interval": 0.2}},
        {"at": 9, "publish": {"node": "n2", "topic": "status/c", "retain": True}},
        {"at": 12, "heal": ["n1", "n2"]},
        {"at": 12, "heal": ["n1", "n3"]},
    ], duration=40.0), tmp_path)
    assert report["invariants"]["ok"], report["invariants"]["violations"]
    assert report["publications"]["duplicates"] == 0
    originated = [e for e in events if e["type"] == "publication_originated" and e["retain"]]
    for topic in ("status/a", "status/b", "status/c"):
        versions = []
        for event in originated:
            if event["topic"] == topic:
                host_port, epoch, seq = event["pub"].rsplit("/", 2)
                host, port = host_port.rsplit(":", 1)
                versions.append((0, int(epoch), int(seq), host, int(port)))
        assert len(versions) >= 2 or topic == "status/c"
        assert newest(sim, topic) == {(f"n{i}", max(versions)) for i in range(5)}, topic
    # what crossed came by the exchange, not by the tree
    sent = sim.network.hosts[1].node.sent_by_type
    assert sent["rd"] and sent["rs"] and sent["rv"]


def test_a_node_that_was_down_gets_the_retained_values_published_meanwhile_when_it_restarts(
        tmp_path: Path) -> None:
    report, _events, sim = run(line_scenario([
        {"at": 4, "publish": {"node": "n0", "topic": "status/a", "retain": True}},
        {"at": 6, "kill": "n4"},
        {"at": 8, "publish": {"node": "n0", "topic": "status/a", "retain": True}},
        {"at": 8, "publish": {"node": "n2", "topic": "status/b", "retain": True}},
        {"at": 12, "restart": "n4"},
    ], duration=30.0), tmp_path)
    assert report["invariants"]["ok"], report["invariants"]["violations"]
    assert report["publications"]["duplicates"] == 0
    stores = {name: {topic: index.retained_versions.get(topic) for topic in ("status/a", "status/b")}
              for name, index in sim.retained.items()}
    assert all(store == stores["n0"] for store in stores.values()), stores
    assert stores["n0"]["status/a"] is not None and stores["n0"]["status/a"][2] == 2  # n0's second publication
    node = sim.network.host("n4").node
    assert node is not None and node.counters["retained_values_injected"] == 2
