"""Names of the structured events the node emits (one JSON object per line).

The full schema, with every field, is in docs/events.md; the simulator, the
daemon and the Spark job all read and write this one format. Version 2 of the
schema writes what happens to publications one event per run of them
(federation.protocol.publication_events).
"""

from __future__ import annotations

from federation.protocol.types import Address, BrokerId, PublicationId

NODE_STARTED = "node_started"
NODE_STOPPED = "node_stopped"
NEIGHBOUR_UP = "neighbour_up"
NEIGHBOUR_DOWN = "neighbour_down"
TABLE_CHANGED = "table_changed"
MANAGEMENT_CORE_CHANGED = "management_core_changed"
TOPIC_CORE_CHANGED = "topic_core_changed"
MESH_JOINED = "mesh_joined"
MESH_LEFT = "mesh_left"
ID_CHANGED = "id_changed"
EPOCH_CHANGED = "epoch_changed"
SUBSCRIPTION_ADDED = "subscription_added"
SUBSCRIPTION_REMOVED = "subscription_removed"
PUBLICATIONS_ORIGINATED = "publications_originated"
PUBLICATIONS_FORWARDED = "publications_forwarded"
PUBLICATIONS_DELIVERED = "publications_delivered"
PUBLICATION_DROPPED = "publication_dropped"
DUPLICATES_DROPPED = "duplicates_dropped"
PUBLICATION_RETRANSMITTED = "publication_retransmitted"
ORDER_GAP_SKIPPED = "order_gap_skipped"
PACKET_DROPPED = "packet_dropped"
OWNERSHIP_CONFLICT = "ownership_conflict"
TOPIC_TABLE_FULL = "topic_table_full"
COUNTERS = "counters"

ALL = (NODE_STARTED, NODE_STOPPED, NEIGHBOUR_UP, NEIGHBOUR_DOWN, TABLE_CHANGED, MANAGEMENT_CORE_CHANGED,
       TOPIC_CORE_CHANGED, MESH_JOINED, MESH_LEFT, ID_CHANGED, EPOCH_CHANGED, SUBSCRIPTION_ADDED,
       SUBSCRIPTION_REMOVED, PUBLICATIONS_ORIGINATED, PUBLICATIONS_FORWARDED, PUBLICATIONS_DELIVERED,
       PUBLICATION_DROPPED, DUPLICATES_DROPPED, PUBLICATION_RETRANSMITTED, ORDER_GAP_SKIPPED, PACKET_DROPPED,
       OWNERSHIP_CONFLICT, TOPIC_TABLE_FULL, COUNTERS)

PER_PUBLICATION = frozenset({PUBLICATIONS_ORIGINATED, PUBLICATIONS_FORWARDED, PUBLICATIONS_DELIVERED,
                             DUPLICATES_DROPPED})
"""the events that say what happened to every publication at every hop, one per run of publications handled
together (schema version 2: federation.protocol.publication_events), made only when an event log keeps them
(`Node.publication_events`); drops and retransmissions, which are rare, are always made, one per publication,
except the QoS 0 drops of overload shedding, which follow the same switch (federation.daemon.flow_control)"""


def id_text(broker_id: BrokerId | None) -> str | None:
    """A BrokerId as it appears in events and status: "vid@host:port"."""
    return None if broker_id is None else str(broker_id)


def publication_text(publication: PublicationId) -> str:
    """A publication id as a join key: "host:port/epoch/seq"."""
    origin, epoch, seq = publication
    return f"{origin}/{epoch}/{seq}"


def addresses_text(addresses: list[Address] | tuple[Address, ...] | frozenset[Address]) -> list[str]:
    return [str(address) for address in sorted(addresses)]
