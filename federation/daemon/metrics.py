"""Prometheus metrics, read from the node when scraped.

Theory of operation: the node already counts everything (packets and bytes
by type, drops by reason, publication counters); keeping Prometheus counters
in step on every packet would tax the hot path for a number read every 15 s.
Instead the metrics port (metrics_server.py) asks for one snapshot per
scrape, taken on the event loop that owns the numbers
(`snapshots.metrics_snapshot`), and `metric_families` turns it into
families here. `METRICS` names, types, labels and documents every family;
docs/metrics.md is the same table, checked against what a running wrapper
serves (tests/real/test_metrics_real.py).

Two rules make the families usable in alerts:

- a prefix of our own, `mqttfed_`: Prometheus' own "federation" (the
  `/federate` endpoint, recording rules named `federation_...`) would
  clash with `federation_`;
- every label value from the start: a drop reason, a packet type, an event
  type, a failure kind or a configured neighbour that never happened yet is
  exported as 0, not left out, so `rate(...) > 0` and `absent()` alerts see
  numbers instead of "no data" (dynamic neighbours appear once they say hello).

Latency histograms are counted without Prometheus
(federation.protocol.histogram): the round trip of every hello exchange per
neighbour (the per-hop latency that can be measured without a shared clock)
and the time from handing a QoS 1/2 publication to the broker connection to
the broker's acknowledgement.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from federation.daemon import wrapper_events
from federation.daemon.broker_health import FAILURE_KINDS
from federation.daemon.roaming_state import DROP_REASONS as ROAMING_DROP_REASONS
from federation.daemon.roaming_state import RoamingCounts
from federation.daemon.topic_policy import REASONS as POLICY_REASONS
from federation.envelope.datagrams import DROP_REASONS as ENVELOPE_DROP_REASONS
from federation.protocol import events, wire

log = logging.getLogger("federation.daemon.metrics")

Snapshot = dict[str, Any]

NODE_DROP_REASONS = (
    "oversized", "malformed", "unknown_type", "version", "wrong_length", "wrong_type", "out_of_range", "bad_filter",
    "bad_topic", "too_many_neighbours", "own_epoch_exhausted", "unknown_neighbour", "own_address", "forged_own",
    "system_topic",
    "stale_hello_back", "digest_not_up", "core_announcements_full", "topics_full", "topic_table_full",
    "children_evicted",
    "tc_core_unreachable", "ownership_stale", "ts_core_mismatch", "max_hops", "mesh_copy_neighbour_down",
    "shared_no_member", "publication_no_route", "publication_no_core", "publication_hold_overflow", "held_overflow",
    "reroute_topics_full", "replay_abandoned", "replay_evicted", "qos0_late", "reliable_table_full",
    "delivery_backlogged", "inject_backlog_qos0", "inject_backlog_qos12", "receive_backlog_qos0",
    "receive_backlog_qos12", "send_backlog_qos0", "publication_too_large", "no_subscriber_after_broker_restart",
    "resubscribe_hold_full", "spool_expired", "spool_age", "retained_stale", "message_expired",
    "receiver_hold_expired", "receiver_hold_full", "repair_no_route", "storage_unavailable",
    "unmatched_hold_full", "unmatched_fence_timeout",
)
"""drop reasons the node and the daemon count (docs/drops.md; tests/docs/test_drop_reasons.py checks this list
against the code), exported at 0 from the start with the envelope's"""
DROP_REASONS = (*NODE_DROP_REASONS, *ROAMING_DROP_REASONS, *ENVELOPE_DROP_REASONS)
ROAMING_KINDS = (*(field.name for field in dataclasses.fields(RoamingCounts)), "late_forwarded")
"""the roaming counts exported (`mqttfed_roaming_total`; docs/daemon.md "One client id across the federation")"""
PUBLICATION_STAGES = ("originated", "forwarded", "delivered", "not_subscribed")
INJECTION_RESULTS = ("acknowledged", "written", "refused", "failed", "duplicate_suppressed")
INJECTION_KEYS = ("acknowledged", "written_qos0", "refused", "failed", "duplicate_suppressed")
"""the status document's names (snapshots.injection_counts) of `INJECTION_RESULTS`, in order"""
INJECTION_RETRIES = ("resent", "reinjected")
PENDING_STATES = ("unfinished", "waiting", "held", "unmatched")
LOG_OUTCOMES = ("used", "ignored", "refused", "truncated", "not_understood")

METRICS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    # (name, kind, labels, help); counters are exposed with the `_total` suffix, histograms as _bucket/_sum/_count.
    ("mqttfed_info", "gauge", ("address", "broker_id", "name", "version"), "always 1"),
    ("mqttfed_ready", "gauge", (), "1 when the wrapper is ready (/readyz): broker connected, its log flowing, "
                                   "a configured neighbour up"),
    ("mqttfed_epoch", "gauge", (), "the node's boot epoch"),
    ("mqttfed_packets_sent", "counter", ("type",), "protocol packets sent, by message type"),
    ("mqttfed_bytes_sent", "counter", ("type",), "bytes of protocol packets sent, by message type"),
    ("mqttfed_packets_received", "counter", ("type",), "protocol packets received and decoded, by message type"),
    ("mqttfed_bytes_received", "counter", ("type",), "bytes of protocol packets received and decoded, by type"),
    ("mqttfed_drops", "counter", ("reason",), "packets and publications dropped, by reason (docs/drops.md)"),
    ("mqttfed_duplicates_suppressed", "counter", (), "topic messages dropped as already seen"),
    ("mqttfed_shared_group_served_twice", "counter", (),
     "publications this broker gave members of a shared subscription group that another broker served too "
     "(docs/protocol.md rule 9)"),
    ("mqttfed_shared_failovers", "counter", (),
     "copies for a shared subscription group sent on to the next member broker: the chosen one was out of "
     "reach or its member had left"),
    ("mqttfed_publications", "counter", ("stage",),
     "publications by stage: originated (local, sent into the federation), forwarded (copies sent on), "
     "delivered (remote, matched a local subscription), not_subscribed (remote, came on a filter this broker "
     "federates and matched no local subscription once the broker's log was read past it: a covering filter's "
     "over-delivery)"),
    ("mqttfed_injections", "counter", ("result",),
     "remote publications handed to the local broker, by result: acknowledged (QoS 1/2, the broker completed "
     "it), written (QoS 0, on its socket), refused (the broker said no), failed (paho refused it), "
     "duplicate_suppressed (the journal says the broker completed it before)"),
    ("mqttfed_injection_retries", "counter", ("kind",),
     "QoS 1/2 injections sent again: resent (same packet id, the session was kept), reinjected (anew, the broker "
     "lost the session)"),
    ("mqttfed_injections_pending", "gauge", ("state",),
     "remote publications not delivered yet, by state: unfinished (handed over, not acknowledged), waiting (in "
     "the queue toward the broker), held (since the broker restarted, for a subscriber to come back), unmatched "
     "(matching no subscription the wrapper knows yet, until its broker's log is read up to a fence)"),
    ("mqttfed_broker_sessions_lost", "counter", (),
     "times the broker came back without the wrapper's session (it restarted): its subscriptions were gone"),
    ("mqttfed_broker_receive_maximum", "gauge", (), "the broker's Receive Maximum from its last CONNACK"),
    ("mqttfed_broker_read_waits", "counter", (),
     "read passes after which the wrapper let its broker's packets gather (broker_read_coalesce): the broker sent "
     "faster than 20,000 a second"),
    ("mqttfed_unaccounted_subscriptions", "gauge", (),
     "subscriptions the broker holds beyond those the wrapper saw ($SYS/broker/subscriptions/count)"),
    ("mqttfed_over_delivery", "gauge", (),
     "1 while the wrapper delivers every publication to its broker because of unaccounted subscriptions"),
    ("mqttfed_filters_widened", "counter", (),
     "subscriptions whose log line the broker may have cut (999 bytes), federated as a superset filter"),
    ("mqttfed_roaming", "counter", ("kind",),
     "clients that move between brokers (docs/daemon.md \"One client id across the federation\"), by kind: the "
     "status document's daemon.broker.roaming counts"),
    ("mqttfed_roaming_sessions", "gauge", ("state",),
     "sessions being moved here: adopting (taken from another broker, its handover or resubscription awaited), "
     "taking_over (this broker's, for a client that connected elsewhere)"),
    ("mqttfed_roaming_held", "gauge", (), "publications held for adopted sessions until their handover is given"),
    ("mqttfed_injection_latency_seconds", "histogram", (),
     "QoS 1/2 publications from the wrapper handing them to its broker connection to the broker's PUBACK/PUBCOMP"),
    ("mqttfed_neighbours", "gauge", ("state",), "neighbours by state: up, down"),
    ("mqttfed_neighbour_up", "gauge", ("neighbour",), "1 while the neighbour (its address) is up"),
    ("mqttfed_neighbour_rtt_seconds", "gauge", ("neighbour",),
     "smoothed round trip of the hello exchange with the neighbour (NaN until measured)"),
    ("mqttfed_hop_rtt_seconds", "histogram", ("neighbour",),
     "every round trip of the hello exchange with the neighbour: the per-hop latency, both ways, wrappers' "
     "loops included"),
    ("mqttfed_members", "gauge", (), "members of the federation table, this node included"),
    ("mqttfed_topics", "gauge", (), "federated filters with a known topic core"),
    ("mqttfed_is_management_core", "gauge", (), "1 if this node is the management core"),
    ("mqttfed_local_clients", "gauge", (), "local clients holding subscriptions"),
    ("mqttfed_local_subscriptions", "gauge", (), "local (client, filter) subscriptions"),
    ("mqttfed_core_changes", "counter", ("kind",), "core changes seen by this node, by kind: management, topic"),
    ("mqttfed_events", "counter", ("type",), "structured events emitted, by type (docs/events.md)"),
    ("mqttfed_broker_connected", "gauge", (), "1 while the wrapper is connected to its broker"),
    ("mqttfed_broker_reconnects", "counter", (), "connections to the broker made after the first"),
    ("mqttfed_broker_connect_failures", "counter", ("kind",),
     "failed connection attempts to the broker: unreachable, refused (the login), tls (the handshake)"),
    ("mqttfed_broker_log_lines", "counter", ("outcome",), "broker log lines read, by outcome"),
    ("mqttfed_udp_send_errors", "counter", (), "UDP send errors (mostly ICMP port unreachable)"),
    ("mqttfed_receive_backlog", "gauge", (), "received tm/tb packets waiting to be handled (overload)"),
    ("mqttfed_injection_backlog", "gauge", (), "remote publications waiting for a slow local broker (overload)"),
    ("mqttfed_unacked_copies", "gauge", (),
     "QoS 1/2 copies sent to neighbours and not acknowledged yet that a custody entry waits for (replays left out)"),
    ("mqttfed_send_paused", "gauge", (), "1 while the UDP socket's send side is backed up (QoS 0 is shed)"),
    ("mqttfed_broker_reading_paused", "gauge", (), "1 while the wrapper reads nothing from its broker's socket "
                                                   "(what it holds of a paused intake is full)"),
    ("mqttfed_intake_paused", "gauge", (), "1 while publications read from the broker wait in the wrapper instead "
                                           "of entering the federation (backpressure, pacing, a full disk)"),
    ("mqttfed_storage_ok", "gauge", (), "1 while the wrapper can write its state directory (0: a full disk; new "
                                        "QoS 1/2 publications are not acknowledged meanwhile)"),
    ("mqttfed_storage_write_failures", "counter", (), "writes the state directory refused (a full disk)"),
    ("mqttfed_paced", "gauge", (), "1 while a neighbour asks this wrapper to hold its QoS 0 publications (rb)"),
    ("mqttfed_kernel_receive_drops", "counter", (),
     "datagrams the kernel dropped for this wrapper's full UDP receive buffer"),
    ("mqttfed_reloads", "counter", (),
     "SIGHUPs handled (configuration loaded again, event log reopened, key and password files read again)"),
    ("mqttfed_reload_failures", "counter", (),
     "files a SIGHUP could not use, a configuration refused included (the wrapper kept what it had)"),
    ("mqttfed_config_info", "gauge", ("hash",),
     "always 1; hash: the SHA-256 of the configuration file the running settings were read from (empty without "
     "one)"),
    ("mqttfed_config_loaded_timestamp_seconds", "gauge", (),
     "when the running configuration was read (start, or the last SIGHUP that was taken up), unix seconds"),
    ("mqttfed_topic_policy_filtered", "counter", ("direction", "reason"),
     "publications the topic policy kept out: direction export (local, no out/both line allows it, or its mapped "
     "topic is invalid: never sent) or import (from the federation, no in/both line: not injected)"),
)
PROCESS_METRICS: tuple[tuple[str, str, str], ...] = (
    # prometheus-client's process collector, on the same port: (name as exposed, kind, help)
    ("process_cpu_seconds_total", "counter", "CPU time of the wrapper process, user and system, seconds"),
    ("process_resident_memory_bytes", "gauge", "resident memory of the wrapper process"),
    ("process_virtual_memory_bytes", "gauge", "virtual memory of the wrapper process"),
    ("process_open_fds", "gauge", "open file descriptors"),
    ("process_max_fds", "gauge", "the limit of open file descriptors"),
    ("process_start_time_seconds", "gauge", "start time of the process, unix seconds"),
)
_SPECS = {name: (kind, labels, text) for name, kind, labels, text in METRICS}


def _family(name: str) -> Any:
    kind, labels, text = _SPECS[name]
    cls = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "histogram": HistogramMetricFamily}[kind]
    return cls(name, text, labels=list(labels))


def _by_label(name: str, known: tuple[str, ...], counts: dict[str, Any]) -> Metric:
    """A family with one sample per known label value (0 when not counted yet) and per other value counted."""
    family = _family(name)
    for value in sorted(set(known) | set(counts)):
        family.add_metric([value], counts.get(value, 0))
    return family


def _single(name: str, value: float) -> Metric:
    family = _family(name)
    family.add_metric([], float(value))
    return family


def _buckets(cumulative: list[tuple[float, int]]) -> list[tuple[str, float]]:
    return [("+Inf" if math.isinf(bound) else repr(bound), float(count)) for bound, count in cumulative]


def metric_families(snap: Snapshot) -> list[Metric]:
    """The metric families for one snapshot (see `snapshots.metrics_snapshot` for its keys)."""
    out: list[Metric] = []
    info = _family("mqttfed_info")
    info.add_metric([snap["address"], snap["broker_id"], snap.get("name") or "", snap["version"]], 1)
    out += [info, _single("mqttfed_ready", snap["ready"]), _single("mqttfed_epoch", snap["epoch"])]
    types = wire.MESSAGE_TYPES
    out += [_by_label("mqttfed_packets_sent", types, snap["sent"]),
            _by_label("mqttfed_bytes_sent", types, snap["sent_bytes"]),
            _by_label("mqttfed_packets_received", types, snap["received"]),
            _by_label("mqttfed_bytes_received", types, snap["received_bytes"]),
            _by_label("mqttfed_drops", DROP_REASONS, snap["drops"])]
    counters = snap["counters"]
    out.append(_single("mqttfed_duplicates_suppressed", counters.get("duplicates_dropped", 0)))
    out.append(_single("mqttfed_shared_group_served_twice", counters.get("shared_group_served_twice", 0)))
    out.append(_single("mqttfed_shared_failovers", counters.get("shared_failovers", 0)))
    out.append(_by_label("mqttfed_publications", PUBLICATION_STAGES,
                         {stage: counters.get(f"publications_{stage}", 0) for stage in PUBLICATION_STAGES}))
    counts = snap["injections"]
    out.append(_by_label("mqttfed_injections", INJECTION_RESULTS,
                         {result: counts[key] for result, key in zip(INJECTION_RESULTS, INJECTION_KEYS, strict=True)}))
    out.append(_by_label("mqttfed_injection_retries", INJECTION_RETRIES,
                         {kind: counts[kind] for kind in INJECTION_RETRIES}))
    out.append(_by_label("mqttfed_injections_pending", PENDING_STATES,
                         {state: counts[state] for state in PENDING_STATES}))
    latency = _family("mqttfed_injection_latency_seconds")
    buckets, total = snap["injection_latency"]
    latency.add_metric([], _buckets(buckets), total)
    out.append(latency)
    neighbours = snap["neighbours"]
    up = sum(1 for neighbour in neighbours if neighbour["up"])
    out.append(_by_label("mqttfed_neighbours", ("up", "down"), {"up": up, "down": len(neighbours) - up}))
    neighbour_up, rtt, hops = (_family(name) for name in ("mqttfed_neighbour_up", "mqttfed_neighbour_rtt_seconds",
                                                          "mqttfed_hop_rtt_seconds"))
    for neighbour in neighbours:
        label = [neighbour["address"]]
        neighbour_up.add_metric(label, float(neighbour["up"]))
        rtt.add_metric(label, math.nan if neighbour["rtt"] is None else neighbour["rtt"])
        buckets, total = neighbour["rtt_histogram"]
        hops.add_metric(label, _buckets(buckets), total)
    out += [neighbour_up, rtt, hops]
    for name, key in (("mqttfed_members", "members"), ("mqttfed_topics", "topics"),
                      ("mqttfed_is_management_core", "is_management_core"),
                      ("mqttfed_local_clients", "local_clients"),
                      ("mqttfed_local_subscriptions", "local_subscriptions"),
                      ("mqttfed_broker_connected", "broker_connected"),
                      ("mqttfed_broker_reconnects", "broker_reconnects"),
                      ("mqttfed_udp_send_errors", "udp_send_errors"),
                      ("mqttfed_receive_backlog", "receive_backlog"),
                      ("mqttfed_injection_backlog", "injection_backlog"),
                      ("mqttfed_unacked_copies", "unacked_copies"),
                      ("mqttfed_send_paused", "send_paused"),
                      ("mqttfed_broker_reading_paused", "reading_paused"),
                      ("mqttfed_intake_paused", "intake_paused"),
                      ("mqttfed_storage_ok", "storage_ok"),
                      ("mqttfed_storage_write_failures", "storage_write_failures"),
                      ("mqttfed_paced", "paced"),
                      ("mqttfed_kernel_receive_drops", "kernel_receive_drops"),
                      ("mqttfed_reloads", "reloads"),
                      ("mqttfed_reload_failures", "reload_failures"),
                      ("mqttfed_broker_sessions_lost", "broker_sessions_lost"),
                      ("mqttfed_broker_receive_maximum", "broker_receive_maximum"),
                      ("mqttfed_broker_read_waits", "broker_read_waits"),
                      ("mqttfed_unaccounted_subscriptions", "unaccounted_subscriptions"),
                      ("mqttfed_over_delivery", "over_delivery"),
                      ("mqttfed_filters_widened", "filters_widened")):
        out.append(_single(name, snap[key]))
    events_counted = snap["events"]
    out.append(_by_label("mqttfed_core_changes", ("management", "topic"),
                         {"management": events_counted.get("management_core_changed", 0),
                          "topic": events_counted.get("topic_core_changed", 0)}))
    out.append(_by_label("mqttfed_events", events.ALL + wrapper_events.ALL, events_counted))
    out.append(_by_label("mqttfed_broker_connect_failures", FAILURE_KINDS, snap["connect_failures"]))
    out.append(_by_label("mqttfed_broker_log_lines", LOG_OUTCOMES, snap["log_outcomes"]))
    roaming = snap["roaming"]
    out.append(_by_label("mqttfed_roaming", ROAMING_KINDS, {kind: roaming[kind] for kind in ROAMING_KINDS}))
    out.append(_by_label("mqttfed_roaming_sessions", ("adopting", "taking_over"),
                         {state: roaming[state] for state in ("adopting", "taking_over")}))
    out.append(_single("mqttfed_roaming_held", roaming["held"]))
    config = _family("mqttfed_config_info")
    config.add_metric([snap["config_hash"]], 1)
    out += [config, _single("mqttfed_config_loaded_timestamp_seconds", snap["config_loaded_at"])]
    filtered = _family("mqttfed_topic_policy_filtered")
    for direction, reasons in POLICY_REASONS.items():
        counts = snap["topic_policy_filtered"].get(direction, {})
        for reason in sorted(set(reasons) | set(counts)):
            filtered.add_metric([direction, reason], counts.get(reason, 0))
    out.append(filtered)
    return out
