"""Federation modes on the simulator: full replication, owned subtrees, hashed core placement.

The shipped scenarios (configs/topologies/mode-*.yaml) also run in
test_sim_scenarios.py, which checks delivery, duplicates and convergence.
Here each one is run step by step and the mode's own promise is checked on
the nodes themselves and in the event trace: who the cores are, how many
copies a publication costs, what moves when a core dies, who reports a
conflict. Replay one by hand:

    python -m federation.scenario run configs/topologies/mode-hash-placement.yaml --backend sim --seed 1
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from federation.protocol.node import Node
from federation.protocol.placement import rendezvous_winner
from federation.protocol.publication_events import expand_all
from federation.protocol.settings import Settings
from federation.protocol.types import BrokerId
from federation.scenario.loader import load_scenario, parse_scenario
from federation.sim.runner import Simulation

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = ROOT / "configs" / "topologies"


def simulation(name: str, tmp_path: Path) -> Simulation:
    sim = Simulation(load_scenario(TOPOLOGIES / f"{name}.yaml"), seed=1, events_path=str(tmp_path / "events.jsonl"))
    sim.start()
    return sim


def node(sim: Simulation, name: str) -> Node:
    found = sim.network.host(name).node
    assert found is not None, f"{name} is not running"
    return found


def alive(sim: Simulation) -> list[str]:
    return [host.name for host in sim.network.alive_hosts()]


def cores(sim: Simulation, filter_: str) -> dict[str, str | None]:
    """Each running node's core for the filter, by node name (None: none known)."""
    names = {str(host.address): host.name for host in sim.network.hosts}
    found = {}
    for name in alive(sim):
        state = node(sim, name).mesh.topics.get(filter_)
        core = state.core if state is not None else None
        found[name] = names[str(core.address)] if core is not None else None
    return found


def name_of(sim: Simulation, broker_id: BrokerId) -> str:
    return next(host.name for host in sim.network.hosts if host.address == broker_id.address)


def finish(sim: Simulation, tmp_path: Path) -> list[dict[str, Any]]:
    """Run to the end, check the report is clean, return the events."""
    sim.run_until(sim.scenario.duration)
    report = sim.finish()
    sim.close()
    publications = report["publications"]
    assert report["invariants"]["ok"], report["invariants"]["violations"]
    assert (publications["lost"], publications["duplicates"], publications["unexpected"]) == (0, 0, 0)
    return expand_all(json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines())


def copies_by_publication(events: list[dict[str, Any]]) -> dict[str, tuple[float, str, int, set[str]]]:
    """pub -> (time, topic, tm copies sent, nodes that sent or received a copy, by address)."""
    found: dict[str, tuple[float, str, int, set[str]]] = {}
    for event in events:
        if event["type"] == "publication_originated":
            found[event["pub"]] = (event["t"], event["topic"], 0, {event["node"]})
    for event in events:
        if event["type"] == "publication_forwarded" and event["pub"] in found:
            t, topic, count, reached = found[event["pub"]]
            found[event["pub"]] = (t, topic, count + len(event["to"]), reached | {event["node"], *event["to"]})
    return found


# ------------------------------------------------------------------ full replication


def test_full_replication_is_one_tree_reaching_every_broker(tmp_path: Path) -> None:
    sim = simulation("mode-full-replication", tmp_path)
    sim.run_until(10.0)
    assert set(cores(sim, "#").values()) == {"n0"}  # the lowest id roots the tree
    for name in alive(sim):
        state = node(sim, name).mesh.topics["#"]
        assert state.member
        assert len(state.parents) == (0 if name == "n0" else 1), (name, state.parents)  # a tree
    sim.run_until(24.0)
    assert set(cores(sim, "#").values()) == {"n1"}  # the root died: the next lowest id
    sim.run_until(40.0)
    assert set(cores(sim, "#").values()) == {"n0"}  # n0 is back: the best node roots the tree again
    events = finish(sim, tmp_path)
    everyone = {str(host.address) for host in sim.network.hosts}
    checked = Counter()
    for t, topic, copies, reached in copies_by_publication(events).values():
        if 8 <= t < 12 or t >= 36:
            assert (copies, reached) == (5, everyone), (t, topic, copies)  # N - 1 copies, all six brokers
            checked[topic] += 1
        elif 20 <= t < 24:
            assert copies == 4 and len(reached) == 5, (t, topic, copies)  # n0 is dead: five brokers
            checked[topic] += 1
    assert checked["nobody/listens"] == 10  # replicated even without a subscriber anywhere
    assert sum(checked.values()) == 70


def test_capability_roots_the_replicated_tree_and_modes_mix_per_filter(tmp_path: Path) -> None:
    sim = simulation("mode-per-filter", tmp_path)
    sim.run_until(10.0)
    assert set(cores(sim, "alerts/#").values()) == {"n3"}  # highest capability, not the lowest id
    members = [node(sim, name).broker_id for name in alive(sim)]
    assert set(cores(sim, "metrics/cpu").values()) == {name_of(sim, rendezvous_winner("metrics/cpu", members))}
    assert set(cores(sim, "chat/#").values()) == {"n2"}  # interest-based: the lowest-id subscriber
    sim.run_until(20.0)
    assert set(cores(sim, "alerts/#").values()) == {"n1"}  # n1 and n4 tie at 3000: the lower id
    events = finish(sim, tmp_path)
    for t, topic, copies, reached in copies_by_publication(events).values():
        if topic.startswith("alerts/"):
            assert copies == len(reached) - 1 and len(reached) == (6 if t < 12 else 5), (t, topic, copies)


# ------------------------------------------------------------------ hashed placement


def test_hashed_cores_are_the_rendezvous_winners_and_a_failure_moves_only_theirs(tmp_path: Path) -> None:
    sim = simulation("mode-hash-placement", tmp_path)
    filters = ["sensors/0/#", "sensors/1/#", "sensors/3/#", "sensors/4/#", "sensors/7/#", "sensors/8/#"]

    def expected() -> dict[str, str]:
        members = [node(sim, name).broker_id for name in alive(sim)]
        winners = {f: rendezvous_winner(f, members) for f in filters}
        return {f: name_of(sim, winner) for f, winner in winners.items() if winner is not None}

    def placed() -> dict[str, str]:
        found = {}
        for filter_ in filters:
            seen = set(cores(sim, filter_).values())
            assert len(seen) == 1 and None not in seen, (filter_, cores(sim, filter_))
            found[filter_] = str(seen.pop())
        return found

    sim.run_until(10.0)
    before = placed()
    assert before == expected()
    assert before["sensors/0/#"] == before["sensors/8/#"] == "n3"
    assert node(sim, "n3").local_count("sensors/0/#") == 0  # a core without subscribers
    sim.run_until(20.0)
    after = placed()
    assert after == expected()
    assert {f for f in filters if after[f] != before[f]} == {"sensors/0/#", "sensors/8/#"}
    sim.run_until(45.0)
    assert placed() == before  # n3 is back: it wins its two filters again, nothing else moved
    events = finish(sim, tmp_path)
    moves = defaultdict(set)
    for event in events:  # a node learning a core (previous None, e.g. after its restart) is no move
        if event["type"] == "topic_core_changed" and event["previous"] is not None and event["t"] > 2:
            moves[event["filter"]].add(event["name"])
    assert set(moves) == {"sensors/0/#", "sensors/8/#"}  # after start-up, no other filter's core ever changed


def test_hashed_cores_spread_where_election_piles_them_up() -> None:
    """Thirty filters, each subscribed on four random nodes of ten: cores per node under each placement."""
    import random

    rng = random.Random(3)
    names = [f"n{i}" for i in range(10)]
    subscriptions = [{"at": 1, "subscribe": {"node": name, "client": f"c{k}-{name}", "filter": f"t/{k}/#"}}
                     for k in range(30) for name in rng.sample(names, 4)]
    loads = {}
    for placement in ("election", "hash"):
        scenario = parse_scenario({
            "duration": 8, "settings": {"core_placement": placement},
            "nodes": {name: {"id": i} for i, name in enumerate(names)},
            "links": [[names[i], names[(i + 1) % 10]] for i in range(10)] + [["n0", "n5"], ["n2", "n7"]],
            "events": subscriptions}, f"inline-{placement}")
        sim = Simulation(scenario, seed=1)
        sim.start()
        sim.run_until(8.0)
        load = Counter(str(cores(sim, f"t/{k}/#")["n0"]) for k in range(30))
        assert "None" not in load
        loads[placement] = load
        sim.close()
    # Election: the lowest id among four subscribers is n0 for 40% of the filters; hashing: about 3 each.
    assert max(loads["election"].values()) >= 9, loads["election"]
    assert max(loads["hash"].values()) <= 7 and len(loads["hash"]) == 10, loads  # deterministic (SHA-256): 7 at most


# ------------------------------------------------------------------ owned subtrees


def test_owner_is_core_of_its_subtree_and_overlapping_filters_are_elected(tmp_path: Path) -> None:
    sim = simulation("mode-owned-subtrees", tmp_path)
    sim.run_until(10.0)
    assert set(cores(sim, "kitchen/#").values()) == {"n2"}  # not n0, the lowest-id subscriber
    assert set(cores(sim, "kitchen/oven/temp").values()) == {"n2"}
    assert set(cores(sim, "garage/+/door").values()) == {"n5"}  # n5 subscribes to nothing
    assert set(cores(sim, "+/light").values()) == {"n1"}  # overlaps kitchen/#, not inside: elected
    for name in alive(sim):
        owners = node(sim, name).mesh.ownership.status()["owners"]
        assert name in ("n2", "n5") or {o["subtree"] for o in owners} == {"kitchen/#", "garage/#"}
    sim.run_until(20.0)
    fallback = cores(sim, "kitchen/oven/temp")
    assert set(fallback.values()) == {"n4"}  # the owner is dead: its subscriber is elected meanwhile
    sim.run_until(40.0)
    assert set(cores(sim, "kitchen/#").values()) == {"n2"}  # back: it owns them again
    assert set(cores(sim, "kitchen/oven/temp").values()) == {"n2"}
    finish(sim, tmp_path)


def test_overlapping_ownership_is_reported_by_both_and_delivery_goes_on(tmp_path: Path) -> None:
    sim = simulation("mode-owned-conflict", tmp_path)
    sim.run_until(10.0)
    assert set(cores(sim, "kitchen/oven/temp").values()) == {"n3"}  # owned by both: the lowest id
    assert set(cores(sim, "kitchen/#").values()) == {"n3"}
    for name, own, other in (("n3", "kitchen/#", "kitchen/oven/#"), ("n4", "kitchen/oven/#", "kitchen/#")):
        status = node(sim, name).status(sim.now)
        assert [(c["subtree"], c["other_subtree"]) for c in status["ownership"]["conflicts"]] == [(own, other)]
        assert status["counters"]["ownership_conflicts"] == 1
    for name in ("n0", "n1", "n2"):
        assert node(sim, name).status(sim.now)["ownership"]["conflicts"] == []
    events = finish(sim, tmp_path)
    reported = sorted((e["name"], e["subtree"], e["other_subtree"]) for e in events
                      if e["type"] == "ownership_conflict")
    assert reported == [("n3", "kitchen/#", "kitchen/oven/#"), ("n4", "kitchen/oven/#", "kitchen/#")]


# ------------------------------------------------------------------ random fault schedules, per mode

MODE_VARIANTS: dict[str, tuple[dict[str, Any], dict[str, dict[str, Any]]]] = {
    # name: (settings for every node, per-node settings)
    "full": ({"replication": "full"}, {}),
    "hash": ({"core_placement": "hash"}, {}),
    "owned": ({}, {"n1": {"owned": ["a/#"]}, "n2": {"owned": ["x/#"]}}),
    "mixed": ({"replication": {"x/#": "full"}, "replication_root": "capability", "core_placement": {"a/+": "hash"}},
              {"n0": {"owned": ["a/b/#"]}, "n1": {"capability": 5}, "n3": {"capability": 9}}),
}
MODE_SEEDS = 15
SLOW_MODE_SEEDS = 300


def moded(seed: int, variant: str) -> Any:
    """The random fault schedule (federation.sim.random_faults) for `seed`, with a mode variant."""
    import dataclasses

    from federation.sim.random_faults import random_scenario

    common, per_node = MODE_VARIANTS[variant]
    scenario = random_scenario(seed)
    base = {name: getattr(scenario.settings, name) for name in scenario.settings.__dataclass_fields__}
    settings = Settings.from_mapping({**base, **common})
    nodes = tuple(dataclasses.replace(spec, settings=per_node.get(spec.name, {})) for spec in scenario.nodes)
    return dataclasses.replace(scenario, settings=settings, nodes=nodes, name=f"{scenario.name}-{variant}")


@pytest.mark.parametrize("variant", sorted(MODE_VARIANTS))
@pytest.mark.parametrize("seed", range(MODE_SEEDS), ids=lambda seed: f"seed{seed}")
def test_random_fault_schedule_in_each_mode(seed: int, variant: str) -> None:
    """After random faults and `settle` quiet seconds: every publication reaches every matching subscriber
    broker exactly once, nothing loops, and each component agrees on its cores (the end-of-run check)."""
    check_moded_case(seed, variant)


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(MODE_VARIANTS))
@pytest.mark.parametrize("seed", range(MODE_SEEDS, SLOW_MODE_SEEDS), ids=lambda seed: f"seed{seed}")
def test_random_fault_schedule_in_each_mode_slow(seed: int, variant: str) -> None:
    check_moded_case(seed, variant)


def check_moded_case(seed: int, variant: str) -> None:
    from federation.sim.random_faults import Timeline

    simulation = Simulation(moded(seed, variant), seed=seed)
    report = simulation.run()
    replay = f"seed {seed}, {variant}"
    assert simulation.aborted is None, replay
    quiet = [record for record in simulation.publications if record.sent_at >= Timeline().quiet_from]
    assert quiet and all(record.in_bound for record in quiet), replay
    received = Counter((d.publication, d.node) for d in simulation.deliveries
                       if d.publication in {record.publication for record in quiet})
    problems = [f"{record.publication} {record.topic!r} from {record.origin}: {name} got "
                f"{received[(record.publication, name)]}" for record in quiet for name in sorted(record.expected)
                if received[(record.publication, name)] != 1]
    problems += [f"{pub} delivered {copies} times to {name}" for (pub, name), copies in received.items() if copies > 1]
    problems += report["invariants"]["violations"]
    assert not problems, f"{replay}:\n" + "\n".join(problems)
