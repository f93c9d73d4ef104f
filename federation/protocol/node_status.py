"""What a running node says about itself: its view, its status document (`wrapper.py status`), its counters.

Read-only: built from the node's parts on request, never kept. The daemon
adds the envelope's and its own sections (federation.daemon.snapshots).
`StatusSource` names what the document reads of a node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from federation.protocol.context import Outbox
from federation.protocol.custody import Custody
from federation.protocol.events import id_text
from federation.protocol.linkstate import Routes
from federation.protocol.mesh import MeshEngine
from federation.protocol.neighbours import NeighbourTable
from federation.protocol.pacing import Pacing
from federation.protocol.publications import Publications
from federation.protocol.receivers import Receivers
from federation.protocol.reliable import ReliableForwarding
from federation.protocol.settings import Settings
from federation.protocol.shared import SharedGroups
from federation.protocol.types import Address, BrokerId


@dataclass(frozen=True)
class NodeView:
    """What the node currently believes, for status displays and convergence checks. Read it at once: its topic
    cores are taken from the node when asked (`cores_source`; a thousand-node simulation built every node's map
    at every change), and `cores_fingerprint` tells two views' cores apart without building them."""

    broker_id: BrokerId
    members: frozenset[Address]
    management_core: BrokerId
    cores_source: Callable[[], Mapping[str, BrokerId]]
    version: int
    cores_fingerprint: int = 0
    """changes when a filter's core does (an XOR of the (filter, core) pairs' hashes, in this process only)"""

    @property
    def topic_cores(self) -> Mapping[str, BrokerId]:
        return self.cores_source()


class StatusSource(Protocol):
    """What `status_document` reads of a node (federation.protocol.node.Node)."""

    address: Address
    name: str | None
    neighbours: NeighbourTable
    mesh: MeshEngine
    shared: SharedGroups
    reliable: ReliableForwarding
    custody: Custody
    receivers: Receivers
    publications: Publications
    pacing: Pacing
    outbox: Outbox
    received_by_type: Counter[str]
    received_bytes_by_type: Counter[str]

    @property
    def broker_id(self) -> BrokerId: ...
    @property
    def epoch(self) -> int: ...
    @property
    def management_core(self) -> BrokerId: ...
    @property
    def routes(self) -> Routes: ...
    @property
    def clients(self) -> dict[str, dict[str, int]]: ...
    @property
    def settings(self) -> Settings: ...

    def local_interest(self) -> dict[str, Any]: ...

    def limits_problem(self, now: float) -> str | None: ...


def counter_snapshot(outbox: Outbox, received: Mapping[str, int], received_bytes: Mapping[str, int]) -> dict[str, Any]:
    """Packets and bytes sent and received by type, drops by reason and the other counters."""
    sent, sent_bytes = outbox.sent_by_type, outbox.sent_bytes_by_type
    return {
        "sent": {k: [sent[k], sent_bytes[k]] for k in sorted(sent)},
        "received": {k: [received[k], received_bytes[k]] for k in sorted(received)},
        "drops": dict(sorted(outbox.drops.items())),
        "counters": dict(sorted(outbox.counters.items())),
    }


def status_document(node: StatusSource, now: float, brief: bool = False) -> dict[str, Any]:
    """Everything a person asks a running wrapper: who it is, its neighbours, the federation it sees, its topics
    and what each part holds, its local subscriptions and counters (`brief`: the topics, local subscriptions and
    federation table left empty, not built: cheap at a hundred thousand subscriptions)."""
    document = _document(node, now, brief)
    if brief:
        document["brief"] = True
    return document


def _document(node: StatusSource, now: float, brief: bool) -> dict[str, Any]:
    routes = node.routes
    pacing = node.pacing
    return {
        "node": str(node.address), "name": node.name, "broker_id": id_text(node.broker_id), "epoch": node.epoch,
        "management_core": id_text(node.management_core),
        "neighbours": [{
            "address": str(n.transport), "id": id_text(n.announced), "up": n.up, "configured": n.configured,
            "rtt_ms": None if n.rtt is None else round(n.rtt * 1000, 3),
            "clock_offset_ms": None if n.clock_offset is None else round(n.clock_offset * 1000, 3),
            "flaps": n.flaps,
        } for n in node.neighbours.all()],
        "federation": [] if brief else [{
            "address": str(a), "id": id_text(routes.ids.get(a)) if a != node.address else id_text(node.broker_id),
            "distance": routes.distance.get(a),
            "next_hops": [str(h) for h in sorted(routes.next_hops.get(a, ()))],
        } for a in sorted(routes.members)],
        "topics": [] if brief else node.mesh.describe(now),
        "topic_table": {"known": len(node.mesh.topics), "limit": node.settings.max_topics,
                        "refused": node.mesh.refused_topics, "latest_refused": node.mesh.last_refused,
                        "problem": node.limits_problem(now)},
        "federated": node.local_interest(),
        "ownership": node.mesh.ownership.status(),
        "shared_groups": node.shared.status(),
        "reliable": node.reliable.status(),
        "custody": node.custody.status(),
        "receivers": node.receivers.status(),
        "order": node.publications.ordering.status(),
        "pacing": {"busy": pacing.busy, "paced_by": sorted(str(n) for n in pacing.paced_until),
                   "told": sorted(str(n) for n in pacing.told), "sent": pacing.sent, "received": pacing.received},
        "local_subscriptions": {} if brief else {client: dict(sorted(filters.items()))
                                                 for client, filters in sorted(node.clients.items())},
        **counter_snapshot(node.outbox, node.received_by_type, node.received_bytes_by_type),
    }
