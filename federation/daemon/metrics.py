"""Prometheus metrics, read from the node when scraped.

Theory of operation: the node already counts everything (packets and bytes
by type, drops by reason, publication counters); keeping Prometheus counters
in step on every packet would tax the hot path for a number read every 15 s.
Instead `SnapshotCollector` asks for one snapshot per scrape. The scrape runs
in prometheus-client's HTTP thread, and the node belongs to the asyncio
thread, so the runtime's `snapshot` callable runs the copy on the loop
(`call_soon_threadsafe`) and waits for it; a scrape never reads the node's
counters while they change. `METRICS` names and documents every family.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger("federation.daemon.metrics")

Snapshot = dict[str, Any]

METRICS: tuple[tuple[str, str, str], ...] = (
    # (name, kind, help); counters are exposed with the `_total` suffix.
    ("federation_info", "gauge", "always 1; labels: address, broker_id, name, version"),
    ("federation_epoch", "gauge", "the node's boot epoch"),
    ("federation_packets_sent", "counter", "datagrams sent, by message type"),
    ("federation_bytes_sent", "counter", "bytes sent, by message type"),
    ("federation_packets_received", "counter", "datagrams received and decoded, by message type"),
    ("federation_bytes_received", "counter", "bytes received and decoded, by message type"),
    ("federation_drops", "counter", "packets and publications dropped, by reason"),
    ("federation_duplicates_suppressed", "counter", "topic messages dropped as already seen"),
    ("federation_publications", "counter",
     "publications by stage: originated (local, sent into the federation), forwarded (copies sent on), "
     "delivered (remote, matched a local subscription)"),
    ("federation_injections", "counter", "remote publications published into the local broker, by result"),
    ("federation_neighbours", "gauge", "neighbours by state (up, down)"),
    ("federation_members", "gauge", "members of the federation table, this node included"),
    ("federation_topics", "gauge", "federated filters with a known topic core"),
    ("federation_is_management_core", "gauge", "1 if this node is the management core"),
    ("federation_local_clients", "gauge", "local clients holding subscriptions"),
    ("federation_local_subscriptions", "gauge", "local (client, filter) subscriptions"),
    ("federation_core_changes", "counter", "core changes seen by this node, by kind (management, topic)"),
    ("federation_events", "counter", "structured events emitted, by type"),
    ("federation_broker_connected", "gauge", "1 while the wrapper is connected to its broker"),
    ("federation_broker_reconnects", "counter", "connections to the broker made after the first"),
    ("federation_broker_log_lines", "counter", "broker log lines read, by outcome"),
    ("federation_udp_send_errors", "counter", "UDP send errors (mostly ICMP port unreachable)"),
)
_HELP = {name: text for name, _kind, text in METRICS}


def _counter(name: str, labels: list[str] | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(name, _HELP[name], labels=labels)


def _gauge(name: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, _HELP[name], labels=labels)


def metric_families(snap: Snapshot) -> list[Metric]:
    """The metric families for one snapshot (see `snapshots.metrics_snapshot` for its keys)."""
    out: list[Metric] = []
    info = _gauge("federation_info", ["address", "broker_id", "name", "version"])
    info.add_metric([snap["address"], snap["broker_id"], snap.get("name") or "", snap["version"]], 1)
    out.append(info)
    epoch = _gauge("federation_epoch")
    epoch.add_metric([], snap["epoch"])
    out.append(epoch)
    for name, key in (("federation_packets_sent", "sent"), ("federation_bytes_sent", "sent_bytes"),
                      ("federation_packets_received", "received"), ("federation_bytes_received", "received_bytes")):
        family = _counter(name, ["type"])
        for kind, value in sorted(snap[key].items()):
            family.add_metric([kind], value)
        out.append(family)
    drops = _counter("federation_drops", ["reason"])
    for reason, value in sorted(snap["drops"].items()):
        drops.add_metric([reason], value)
    out.append(drops)
    counters = snap["counters"]
    duplicates = _counter("federation_duplicates_suppressed")
    duplicates.add_metric([], counters.get("duplicates_dropped", 0))
    out.append(duplicates)
    publications = _counter("federation_publications", ["stage"])
    for stage in ("originated", "forwarded", "delivered"):
        publications.add_metric([stage], counters.get(f"publications_{stage}", 0))
    out.append(publications)
    injections = _counter("federation_injections", ["result"])
    injections.add_metric(["ok"], snap["injected"])
    injections.add_metric(["failed"], snap["inject_failed"])
    out.append(injections)
    neighbours = _gauge("federation_neighbours", ["state"])
    neighbours.add_metric(["up"], snap["neighbours_up"])
    neighbours.add_metric(["down"], snap["neighbours_total"] - snap["neighbours_up"])
    out.append(neighbours)
    for name, key in (("federation_members", "members"), ("federation_topics", "topics"),
                      ("federation_is_management_core", "is_management_core"),
                      ("federation_local_clients", "local_clients"),
                      ("federation_local_subscriptions", "local_subscriptions"),
                      ("federation_broker_connected", "broker_connected")):
        gauge = _gauge(name)
        gauge.add_metric([], float(snap[key]))
        out.append(gauge)
    core_changes = _counter("federation_core_changes", ["kind"])
    core_changes.add_metric(["management"], snap["events"].get("management_core_changed", 0))
    core_changes.add_metric(["topic"], snap["events"].get("topic_core_changed", 0))
    out.append(core_changes)
    events = _counter("federation_events", ["type"])
    for kind, value in sorted(snap["events"].items()):
        events.add_metric([kind], value)
    out.append(events)
    reconnects = _counter("federation_broker_reconnects")
    reconnects.add_metric([], snap["broker_reconnects"])
    out.append(reconnects)
    log_lines = _counter("federation_broker_log_lines", ["outcome"])
    for outcome, value in sorted(snap["log_outcomes"].items()):
        log_lines.add_metric([outcome], value)
    out.append(log_lines)
    send_errors = _counter("federation_udp_send_errors")
    send_errors.add_metric([], snap["udp_send_errors"])
    out.append(send_errors)
    return out
