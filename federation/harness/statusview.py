"""Reading wrapper status documents: readiness, convergence, meshes, and views for the ground truth.

Theory of operation: every real backend learns what the wrappers believe the
same way, by asking each one for its status document (`wrapper.py status`,
docs/daemon.md) over whatever path reaches it (loopback, a socket inside a
network namespace, `lxc exec`). The judgements made from those documents do
not depend on the path, so they live here as functions of plain documents:

* `ready_problem`: a wrapper is ready once it is connected to its broker and
  receives its log lines (before that, a SUBSCRIBE would go unnoticed);
* `convergence_problems` / `mesh_problems`: the loopback launcher's checks
  (agreement among the nodes it is given);
* `view_of`: the (broker id, members, management core, topic cores) a node
  reports, as protocol values, for the scenario driver's comparison with the
  ground truth (`federation.scenario.truth.ConvergenceTracker`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from federation.protocol.aggregation import covers
from federation.protocol.types import Address, BrokerId

StatusDocument = dict[str, Any]


def ready_problem(document: StatusDocument | None) -> str | None:
    """Why the wrapper is not ready yet (no reply, broker not connected, no log lines); None when it is."""
    if document is None:
        return "no status reply yet"
    broker = document.get("daemon", {}).get("broker", {})
    if broker.get("connected") and broker.get("log_lines", 0) > 0:
        return None
    return f"broker connected={broker.get('connected')}, log lines={broker.get('log_lines')}"


def convergence_problems(documents: Mapping[str, StatusDocument | None],
                         addresses: Mapping[str, str]) -> list[str]:
    """Why the nodes of `documents` have not converged among themselves; empty when they have.

    Converged: each node's federation table holds exactly the given nodes'
    addresses (`addresses`: name -> "host:port"), all agree on the management
    core, and all agree on the topic cores, with a core for every filter that
    has a local subscriber.
    """
    problems = [f"{name}: no status reply" for name, document in documents.items() if document is None]
    if problems:
        return problems
    expected = sorted(addresses[name] for name in documents)
    cores: dict[str, set[str | None]] = {"management": set()}
    topic_views: dict[str, dict[str, str | None]] = {}
    subscribed: set[str] = set()
    for name, document in documents.items():
        assert document is not None
        members = sorted(str(member.get("address")) for member in document.get("federation", []))
        if members != expected:
            problems.append(f"{name}: members {members}, expected {expected}")
        cores["management"].add(document.get("management_core"))
        view: dict[str, str | None] = {}
        for topic in document.get("topics", []):
            view[str(topic["filter"])] = topic.get("core")
            if topic.get("local_subscribers"):
                subscribed.add(str(topic["filter"]))
        topic_views[name] = view
    if len(cores["management"]) != 1 or None in cores["management"]:
        problems.append(f"management cores differ: {sorted(map(str, cores['management']))}")
    for filter_ in sorted({f for view in topic_views.values() for f in view} | subscribed):
        seen = {view.get(filter_) for view in topic_views.values()}
        if filter_ in subscribed and None in seen:
            problems.append(f"filter {filter_!r} has subscribers but no core at "
                            f"{[n for n, v in topic_views.items() if v.get(filter_) is None]}")
        elif len(seen - {None}) > 1 or (len(seen) > 1 and filter_ in subscribed):
            problems.append(f"filter {filter_!r}: cores differ: "
                            f"{ {n: v.get(filter_) for n, v in topic_views.items()} }")
    return problems


def serving_filter(documents: Mapping[str, StatusDocument | None], filter_: str) -> str:
    """The filter whose mesh carries publications for a subscription to `filter_`: itself when the nodes know it,
    else one every node knows that covers it (a broker federates nothing more for a filter its own covering
    filter serves, nor for a fleet's filters past `aggregate_fanout`: federation.protocol.aggregation)."""
    known = [{t.get("filter") for t in document.get("topics", [])} for document in documents.values()
             if document is not None]
    if not known or all(filter_ in filters for filters in known):
        return filter_
    # A broker that federates the filter itself is served by its own mesh, not yet known everywhere: another
    # broker's wider filter that every node knows (a `#` subscriber elsewhere) brings it nothing, and taking that
    # would call the mesh ready before it is (the live fuzz's QoS 0 publication, sent meanwhile, went nowhere).
    if any(filter_ in ((document.get("federated") or {}).get("federated_filters") or ())
           for document in documents.values() if document is not None):
        return filter_
    common = set.intersection(*known)
    covering = sorted(other for other in common if isinstance(other, str) and covers(other, filter_))
    return covering[0] if covering else filter_


def mesh_problems(documents: Mapping[str, StatusDocument | None], addresses: Mapping[str, str],
                  filter_: str) -> list[str]:
    """Why the mesh of `filter_` cannot yet carry a publication to every subscriber; empty when it can.

    Ready: the nodes agree on a core for the filter, every member other than
    the core has parents, and each parent is a member that lists it as a child.
    """
    rows: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    filter_ = serving_filter(documents, filter_)
    for name, document in documents.items():
        if document is None:
            problems.append(f"{name}: no status reply")
            continue
        row = next((t for t in document.get("topics", []) if t.get("filter") == filter_), None)
        if row is None:
            problems.append(f"{name}: does not know filter {filter_!r}")
        else:
            rows[addresses[name]] = row
    if problems:
        return problems
    core_ids = {row.get("core") for row in rows.values()}
    if len(core_ids) != 1 or None in core_ids:
        return [f"filter {filter_!r}: cores {sorted(map(str, core_ids))}"]
    for address, row in sorted(rows.items()):
        if not row.get("member") or row.get("own_core"):
            continue
        parents = row.get("parents") or []
        if not parents:
            problems.append(f"{address} is a member of {filter_!r} without parents")
        for parent in parents:
            parent_row = rows.get(parent)
            if parent_row is None or not parent_row.get("member") or address not in (
                    parent_row.get("children") or []):
                problems.append(f"{address}'s parent {parent} does not list it as a child")
    return problems


def parse_broker_id(text: str) -> BrokerId:
    """"vid@host:port" (as in status documents and events) -> BrokerId; ValueError if malformed."""
    vid, separator, address = text.partition("@")
    if not separator or not vid.lstrip("-").isdigit():
        raise ValueError(f"not a broker id (vid@host:port): {text!r}")
    return BrokerId(int(vid), Address.parse(address, 0))


@dataclass(frozen=True)
class StatusView:
    """What one node reports, as protocol values (what the ground truth compares)."""

    broker_id: BrokerId
    epoch: int | None
    members: frozenset[Address]
    management_core: BrokerId
    topic_cores: Mapping[str, BrokerId]


def view_of(document: StatusDocument) -> StatusView | None:
    """The node's view from its status document; None if the document lacks an id or a management core."""
    try:
        broker_id = parse_broker_id(str(document["broker_id"]))
        core_text = document.get("management_core")
        if core_text is None:
            return None
        members = frozenset(Address.parse(str(row["address"]), 0) for row in document.get("federation", []))
        cores = {str(row["filter"]): parse_broker_id(str(row["core"]))
                 for row in document.get("topics", []) if row.get("core")}
    except (KeyError, TypeError, ValueError):
        return None
    epoch = document.get("epoch")
    return StatusView(broker_id, epoch if isinstance(epoch, int) else None, members,
                      parse_broker_id(str(core_text)), cores)
