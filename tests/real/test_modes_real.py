"""Federation modes for real: Mosquitto brokers, wrapper daemons, mosquitto_pub and mosquitto_sub.

One or more tests per mode (docs/modes.md): full replication (and its root
chosen by a capability the daemon measures from /proc), owned subtrees (and
a conflicting claim), hashed core placement (and the death of a core). The
modes are set in each wrapper's YAML `settings:` exactly as a user would;
per-node settings (`owned`, `capability`) are written into that node's file
before its wrapper starts. What the clients print is the verdict on
delivery; the wrappers' status adds where the cores are and how many copies
went where.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import yaml

from federation.protocol.placement import rendezvous_winner
from federation.protocol.types import Address, BrokerId
from federation.tools.launch import LocalFederation

from broker_util import requires_mosquitto, wait_for
from federation_util import (
    FAST_SETTINGS,
    Clients,
    clients_fixture,  # noqa: F401 - the `clients` fixture
    flush_event_logs,
    make_federation_fixture,  # noqa: F401 - the `make_federation` fixture
)

pytestmark = requires_mosquitto

MakeFederation = Callable[..., LocalFederation]


def start(make_federation: MakeFederation, count: int, kind: str, settings: dict[str, Any],
          per_node: dict[str, dict[str, Any]] | None = None) -> LocalFederation:
    """Brokers first, then each wrapper's YAML with the common and its own settings, then the wrappers."""
    common = {**FAST_SETTINGS, **settings}
    federation = make_federation(count, kind, settings=common, wrappers=False)
    for name, node in federation.nodes.items():
        merged = {**common, **(per_node or {}).get(name, {})}
        node.wrapper_config.write_text(f"# written by {__name__} for {name}\n"
                                       + yaml.safe_dump({"settings": merged}, sort_keys=True))
    federation.start_wrappers()
    federation.wait_converged(timeout=30)
    return federation


def broker_id(federation: LocalFederation, name: str) -> BrokerId:
    host, port = federation.node(name).address.rsplit(":", 1)
    return BrokerId(federation.vids[name], Address(host, int(port)))


def cores(federation: LocalFederation, filter_: str, names: list[str] | None = None) -> dict[str, str | None]:
    """Each wrapper's core for the filter, as its status shows it ("vid@host:port")."""
    found: dict[str, str | None] = {}
    for name in names or list(federation.nodes):
        rows = federation.status(name).get("topics", [])
        found[name] = next((row.get("core") for row in rows if row.get("filter") == filter_), None)
    return found


def wait_core(federation: LocalFederation, filter_: str, expected: str, names: list[str] | None = None,
              timeout: float = 20.0) -> None:
    wait_for(lambda: set(cores(federation, filter_, names).values()) == {expected}, timeout,
             message=lambda: f"every wrapper to have {expected} as core of {filter_!r}; "
                             f"they have {cores(federation, filter_, names)}")


def tm_received(federation: LocalFederation, name: str) -> int:
    return int(federation.status(name).get("received", {}).get("tm", [0, 0])[0])


def prefix(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:6]}"


# ------------------------------------------------------------------ full replication


def test_full_replication_reaches_every_broker_once_over_one_tree(make_federation: MakeFederation,
                                                                  clients: Clients) -> None:
    federation = start(make_federation, 4, "ring", {"replication": "full"})
    root = str(broker_id(federation, "n0"))
    wait_core(federation, "#", root)  # the lowest id roots the tree
    federation.wait_mesh("#")
    for name in federation.nodes:
        row = next(r for r in federation.status(name)["topics"] if r["filter"] == "#")
        assert row["member"] and row["mode"] == "full"
        assert len(row["parents"]) == (0 if name == "n0" else 1), (name, row)  # a tree, not a mesh
    label = prefix("full")
    far = clients.subscribe(federation, "n2", f"{label}/#")
    near = clients.subscribe(federation, "n1", f"{label}/a")
    federation.wait_mesh(f"{label}/#")
    # The subscribers' connections are claimed in the registry of client ids (a retained record each, over the
    # same kind of tree: federation.daemon.client_registry): counted before, not among the five.
    wait_for(lambda: all(federation.status(name)["daemon"]["broker"]["retained"]["registry"]["records"] >= 2
                         for name in federation.nodes), 10, message="the subscribers' records at every wrapper")
    before = {name: tm_received(federation, name) for name in federation.nodes}
    for number in range(3):
        clients.publish(federation, "n3", f"{label}/a", f"m{number}".encode())
    for number in range(2):
        clients.publish(federation, "n3", f"nobody-{label}/x", f"n{number}".encode())
    far.wait_for_count(3)
    near.wait_for_count(3)
    # Every other broker receives each of the five publications exactly once: N - 1 copies, a tree.
    others = ["n0", "n1", "n2"]
    wait_for(lambda: all(tm_received(federation, n) - before[n] >= 5 for n in others), 10,
             message=lambda: f"five tm at each of {others}: "
                             f"{ {n: tm_received(federation, n) - before[n] for n in others} }")
    flush_event_logs(federation)
    assert {n: tm_received(federation, n) - before[n] for n in others} == {n: 5 for n in others}
    assert sorted(far.received()) == sorted((f"{label}/a", f"m{k}".encode()) for k in range(3))
    assert sorted(near.received()) == sorted((f"{label}/a", f"m{k}".encode()) for k in range(3))


def test_capability_measured_by_the_daemon_chooses_the_root(make_federation: MakeFederation,
                                                             clients: Clients) -> None:
    # n1 gives no capability: its daemon measures C = a·L + b·M from /proc (far above these numbers).
    per_node = {"n0": {"capability": 10}, "n2": {"capability": 20}}
    federation = start(make_federation, 3, "line", {"replication": "full", "replication_root": "capability"},
                       per_node)
    wait_core(federation, "#", str(broker_id(federation, "n1")))
    label = prefix("cap")
    subscriber = clients.subscribe(federation, "n2", f"{label}/#")
    federation.wait_mesh("#")
    clients.publish(federation, "n0", f"{label}/x", b"to the root and beyond")
    assert subscriber.wait_for_message(f"{label}/x", b"to the root and beyond").qos == 0
    flush_event_logs(federation)
    assert subscriber.received() == [(f"{label}/x", b"to the root and beyond")]


# ------------------------------------------------------------------ owned subtrees


def test_owner_is_the_core_of_its_subtree_without_subscribers(make_federation: MakeFederation,
                                                               clients: Clients) -> None:
    label = prefix("kitchen")
    federation = start(make_federation, 4, "line", {}, {"n2": {"owned": [f"{label}/#"]}})
    owner = str(broker_id(federation, "n2"))
    wide = clients.subscribe(federation, "n0", f"{label}/#")  # n0 has the lowest id: it would be elected
    narrow = clients.subscribe(federation, "n3", f"{label}/oven/temp")
    overlapping = clients.subscribe(federation, "n1", "+/light")  # overlaps, is not inside: elected
    wait_core(federation, f"{label}/#", owner)
    wait_core(federation, f"{label}/oven/temp", owner)
    wait_core(federation, "+/light", str(broker_id(federation, "n1")))
    federation.wait_mesh(f"{label}/#")
    federation.wait_mesh(f"{label}/oven/temp")
    federation.wait_mesh("+/light")
    clients.publish(federation, "n1", f"{label}/oven/temp", b"21.5")
    clients.publish(federation, "n3", f"{label}/light", b"on")
    wide.wait_for_count(2)
    narrow.wait_for_message(f"{label}/oven/temp", b"21.5")
    overlapping.wait_for_message(f"{label}/light", b"on")
    flush_event_logs(federation)
    assert sorted(wide.received()) == [(f"{label}/light", b"on"), (f"{label}/oven/temp", b"21.5")]
    assert narrow.received() == [(f"{label}/oven/temp", b"21.5")]
    assert overlapping.received() == [(f"{label}/light", b"on")]
    assert federation.status("n2")["ownership"]["owned"] == [f"{label}/#"]
    assert federation.status("n2")["local_subscriptions"] == {}


def test_overlapping_ownership_is_reported_by_both_owners(make_federation: MakeFederation,
                                                          clients: Clients) -> None:
    label = prefix("clash")
    per_node = {"n0": {"owned": [f"{label}/#"]}, "n2": {"owned": [f"{label}/oven/#"]}}
    federation = start(make_federation, 3, "line", {}, per_node)
    expected = {"n0": (f"{label}/#", f"{label}/oven/#", str(broker_id(federation, "n2"))),
                "n2": (f"{label}/oven/#", f"{label}/#", str(broker_id(federation, "n0")))}

    def reported() -> dict[str, list[tuple[str, str, str]]]:
        return {name: [(c["subtree"], c["other_subtree"], c["other"])
                       for c in federation.status(name)["ownership"]["conflicts"]] for name in federation.nodes}

    wait_for(lambda: reported() == {"n0": [expected["n0"]], "n1": [], "n2": [expected["n2"]]}, 15,
             message=lambda: f"both owners to report the conflict; status: {reported()}")
    flush_event_logs(federation)
    for name in ("n0", "n2"):
        events = federation.events(name, ["ownership_conflict"])
        assert [(e["subtree"], e["other_subtree"], e["other"]) for e in events] == [expected[name]]
    # Delivery goes on; the filter both cover belongs to the lower id meanwhile.
    subscriber = clients.subscribe(federation, "n1", f"{label}/oven/temp")
    wait_core(federation, f"{label}/oven/temp", str(broker_id(federation, "n0")))
    federation.wait_mesh(f"{label}/oven/temp")
    clients.publish(federation, "n2", f"{label}/oven/temp", b"hot")
    subscriber.wait_for_message(f"{label}/oven/temp", b"hot")


# ------------------------------------------------------------------ hashed placement


def test_hashed_cores_are_rendezvous_winners_and_move_only_when_theirs_dies(make_federation: MakeFederation,
                                                                           clients: Clients) -> None:
    federation = start(make_federation, 5, "ring", {"core_placement": "hash"})
    label = prefix("hash")
    ids = {name: broker_id(federation, name) for name in federation.nodes}
    # Filters subscribed on n0 only, whose rendezvous winner is another node: their cores have no subscriber.
    filters = []
    for number in range(200):
        candidate = f"{label}/{number}/#"
        if rendezvous_winner(candidate, ids.values()) != ids["n0"]:
            filters.append(candidate)
        if len(filters) == 6:
            break
    winners = {f: rendezvous_winner(f, ids.values()) for f in filters}
    victim = next(name for name, bid in ids.items() if bid == winners[filters[0]])
    subscribers = [clients.subscribe(federation, "n0", f) for f in filters]
    for filter_ in filters:
        wait_core(federation, filter_, str(winners[filter_]))
        federation.wait_mesh(filter_)
    publisher = next(name for name in ("n3", "n2", "n1") if name != victim)
    for filter_ in filters:
        clients.publish(federation, publisher, filter_.replace("#", "t"), b"before")
    for filter_, sub in zip(filters, subscribers, strict=True):
        sub.wait_for_message(filter_.replace("#", "t"), b"before")

    # The core of the first filter dies (SIGKILL: no goodbye); only its filters move, to their next winner.
    federation.stop_wrapper(victim, kill=True)
    alive = [name for name in federation.nodes if name != victim]
    federation.wait_converged(timeout=30, names=alive)
    survivors = [ids[name] for name in alive]
    for filter_ in filters:
        expected = winners[filter_] if winners[filter_] != ids[victim] else rendezvous_winner(filter_, survivors)
        assert expected is not None
        wait_core(federation, filter_, str(expected), names=alive)
        federation.wait_mesh(filter_, names=alive)
    for filter_ in filters:
        clients.publish(federation, publisher, filter_.replace("#", "t"), b"after")
    for filter_, sub in zip(filters, subscribers, strict=True):
        sub.wait_for_message(filter_.replace("#", "t"), b"after")
    flush_event_logs(federation, alive)
    for filter_, sub in zip(filters, subscribers, strict=True):
        topic = filter_.replace("#", "t")
        assert sorted(sub.received()) == [(topic, b"after"), (topic, b"before")], sub
