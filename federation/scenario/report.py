"""The scenario report: one JSON document per run, whatever ran it.

Theory of operation
-------------------
Backends (the simulator, real processes, containers) reduce a run to plain
records: publications with their expected subscriber nodes, deliveries
(injections) with whether the node was subscribed at that moment,
convergence phases, the final state of every node, and traffic totals.
`build_report` turns those records into the documented JSON schema
(docs/simulator.md, "Report"), classifies every delivery and adds the
delivery invariants, so every backend counts lost, duplicate and unexpected
deliveries the same way.

Per (publication, node) pair: the first delivery to an expected node is
`delivered`; the first delivery to any other node is `delivered_outside_bound`
if the node had a matching subscription at that moment, else `unexpected`
(deliveries to the origin are always unexpected: its broker has the message
already); every further delivery of the pair is a duplicate. An expected pair
with no delivery by the end of the run is `lost`. For in-bound publications
(made while the network was quiet), lost, duplicate and unexpected pairs are
invariant violations.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_LISTED = 20
"""Violations of one kind listed in full before the rest is summarised."""


@dataclass(frozen=True)
class PublicationRecord:
    publication: str
    """"host:port/epoch/seq" (federation.protocol.events.publication_text)"""
    origin: str
    """node name"""
    topic: str
    sent_at: float
    in_bound: bool
    """the network was quiet at publish time (the expected-delivery rule applies)"""
    expected: frozenset[str] = frozenset()
    """node names that must receive it exactly once"""


@dataclass(frozen=True)
class DeliveryRecord:
    publication: str
    node: str
    at: float
    subscribed: bool
    """the node had an active subscription matching the topic at delivery time"""


@dataclass(frozen=True)
class PhaseRecord:
    label: str
    at: float
    settled_at: float | None
    resolution: float = 0.0
    """how much earlier the views may have come to agree than `settled_at`: the simulator sees every change
    (0); a real backend only sees them when it polls, so a settled phase spans two rounds of status queries"""


@dataclass(frozen=True)
class NodeRecord:
    name: str
    alive: bool
    broker_id: str | None = None
    management_core: str | None = None
    topic_cores: Mapping[str, str] = field(default_factory=dict)
    members: int = 0


@dataclass(frozen=True)
class TrafficRecord:
    control_by_type: Mapping[str, tuple[int, int]]
    """packet type -> (packets, bytes), every type except `tm`"""
    data_packets: int
    data_bytes: int
    node_seconds: float
    """sum over nodes of the seconds each was alive (the per-node-per-second denominator)"""


@dataclass
class DeliveryOutcome:
    sent: int = 0
    expected_deliveries: int = 0
    delivered: int = 0
    lost: int = 0
    duplicates: int = 0
    unexpected: int = 0
    delivered_outside_bound: int = 0
    latencies: list[float] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)


def _listed(kind: str, items: list[str]) -> list[str]:
    if len(items) <= MAX_LISTED:
        return items
    return items[:MAX_LISTED] + [f"... and {len(items) - MAX_LISTED} more {kind}"]


def classify(publications: Sequence[PublicationRecord], deliveries: Iterable[DeliveryRecord]) -> DeliveryOutcome:
    """Count every (publication, node) pair; see the module docstring for the rules."""
    outcome = DeliveryOutcome(sent=len(publications))
    by_id = {record.publication: record for record in publications}
    received: dict[str, dict[str, list[DeliveryRecord]]] = defaultdict(lambda: defaultdict(list))
    for delivery in deliveries:
        received[delivery.publication][delivery.node].append(delivery)
    lost: list[str] = []
    duplicated: list[str] = []
    unexpected: list[str] = []
    for record in publications:
        outcome.expected_deliveries += len(record.expected)
        got = received.get(record.publication, {})
        missing = sorted(name for name in record.expected if name not in got)
        outcome.lost += len(missing)
        if missing and record.in_bound:
            lost.append(f"{_describe(record)} was not delivered to {', '.join(missing)}")
    for publication in sorted(received):
        record_or_none = by_id.get(publication)
        for node, copies in sorted(received[publication].items()):
            copies = sorted(copies, key=lambda d: d.at)
            first = copies[0]
            extra = len(copies) - 1
            outcome.duplicates += extra
            if record_or_none is None:
                outcome.unexpected += 1
                unexpected.append(f"publication {publication} (never sent) was delivered to {node}")
                continue
            record = record_or_none
            if node == record.origin:
                outcome.unexpected += 1
                if record.in_bound:
                    unexpected.append(f"{_describe(record)} was delivered back to its origin")
            elif node in record.expected:
                outcome.delivered += 1
                outcome.latencies.append(first.at - record.sent_at)
            elif first.subscribed:
                outcome.delivered_outside_bound += 1
            else:
                outcome.unexpected += 1
                if record.in_bound:
                    unexpected.append(f"{_describe(record)} was delivered to {node}, "
                                      f"which had no matching subscription at {first.at:.6f}s")
            if extra and record.in_bound:
                duplicated.append(f"{_describe(record)} was delivered {len(copies)} times to {node}")
    outcome.violations = _listed("lost", lost) + _listed("duplicated", duplicated) + \
        _listed("unexpected", unexpected)
    return outcome


def _describe(record: PublicationRecord) -> str:
    return f"publication {record.publication} ({record.topic!r} from {record.origin} at {record.sent_at:.6f}s)"


def percentile(sorted_values: Sequence[float], percent: float) -> float | None:
    """Nearest-rank percentile of an ascending sequence; None when empty."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(percent / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def build_report(*, scenario: str, seed: int, backend: str, duration: float,
                 publications: Sequence[PublicationRecord], deliveries: Iterable[DeliveryRecord],
                 phases: Sequence[PhaseRecord], nodes: Iterable[NodeRecord], traffic: TrafficRecord,
                 violations: Sequence[str] = (), wall_seconds: float = 0.0) -> dict[str, Any]:
    """The report dict (JSON-ready, keys in a fixed order); `violations` come from the backend's own checks."""
    outcome = classify(publications, deliveries)
    latencies = sorted(outcome.latencies)
    control_packets = sum(packets for packets, _ in traffic.control_by_type.values())
    control_bytes = sum(size for _, size in traffic.control_by_type.values())
    node_seconds = traffic.node_seconds
    all_violations = list(violations) + outcome.violations
    return {
        "scenario": scenario,
        "seed": seed,
        "backend": backend,
        "duration": duration,
        "publications": {
            "sent": outcome.sent,
            "expected_deliveries": outcome.expected_deliveries,
            "delivered": outcome.delivered,
            "lost": outcome.lost,
            "duplicates": outcome.duplicates,
            "unexpected": outcome.unexpected,
            "delivered_outside_bound": outcome.delivered_outside_bound,
            "latency": {
                "p50": _round(percentile(latencies, 50)),
                "p90": _round(percentile(latencies, 90)),
                "p99": _round(percentile(latencies, 99)),
                "max": _round(latencies[-1] if latencies else None),
            },
        },
        "convergence": [
            {
                "phase": phase.label,
                "at": _round(phase.at),
                "seconds": _round(None if phase.settled_at is None else phase.settled_at - phase.at),
                "settled_at": _round(phase.settled_at),
                "resolution": _round(phase.resolution),
            }
            for phase in phases
        ],
        "final": {
            node.name: {
                "alive": node.alive,
                "broker_id": node.broker_id,
                "management_core": node.management_core,
                "topic_cores": dict(sorted(node.topic_cores.items())),
                "members": node.members,
            }
            for node in sorted(nodes, key=lambda n: n.name)
        },
        "control": {
            "packets": control_packets,
            "bytes": control_bytes,
            "by_type": {kind: {"packets": packets, "bytes": size}
                        for kind, (packets, size) in sorted(traffic.control_by_type.items())},
            "per_node_per_second": {
                "packets": _round(control_packets / node_seconds if node_seconds > 0 else 0.0, 3),
                "bytes": _round(control_bytes / node_seconds if node_seconds > 0 else 0.0, 3),
            },
        },
        "data": {
            "packets": traffic.data_packets,
            "bytes": traffic.data_bytes,
            "copies_per_publication": _round(traffic.data_packets / outcome.sent if outcome.sent else 0.0, 3),
        },
        "invariants": {"ok": not all_violations, "violations": all_violations},
        "wall_seconds": round(wall_seconds, 3),
    }
