"""The running wrapper's two read-outs: the status document and the metrics snapshot.

Theory of operation: both are copies of the same state (the node's
counters and tables, the broker connection's health, the overload queues,
the socket), taken on the loop thread that owns it, so neither reads a
number while it changes. They differ in shape and in reader: the status
document (`status_document`) is the node's own `Node.status(now)` plus a
`daemon` section, sent as JSON to `wrapper.py status` (`status.py` encodes
and renders it); the metrics snapshot (`metrics_snapshot`) is a flat dict
of numbers that `metrics.py` turns into Prometheus families at each scrape.

They live here, not in `status.py` or `metrics.py`, because those two read
documents and never see a running wrapper (`status.py` is also the client
side of `wrapper.py status`): this module is the one place that knows which
parts of a running wrapper each read-out shows. It reads them through
`WrapperParts`, the read-only view it declares, which `Running`
(running.py) provides; so it never imports the running wrapper, which calls
these functions. A metrics scrape runs in prometheus-client's HTTP thread:
`on_loop` has the loop take the snapshot
(`call_soon_threadsafe`) and waits for it, with a timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from federation import __version__
from federation.daemon.backpressure import PacketBacklog
from federation.daemon.broker import RECEIVE_MAXIMUM, BrokerAdapter
from federation.daemon.broker_health import BrokerHealth
from federation.daemon.broker_log import BrokerLogTracker
from federation.daemon.broker_sessions import BrokerSessions
from federation.daemon.broker_subscriptions import BrokerSubscriptions
from federation.daemon.config import DaemonConfig
from federation.daemon.event_log import EventLog
from federation.daemon.flow_control import FlowControl
from federation.daemon.health import Readiness, readiness
from federation.daemon.injections import InjectionJournal
from federation.daemon.metrics import Snapshot
from federation.daemon.policy_edges import PolicyEdges
from federation.daemon.policy_subscriptions import PolicySubscriptions
from federation.daemon.reload import Reloads
from federation.daemon.retained import RetainedStore
from federation.daemon.retained_order import RetainedGate
from federation.daemon.retained_scan import RetainedReading
from federation.daemon.roaming import Roaming
from federation.daemon.storage import StorageHealth
from federation.daemon.subscription_fence import UnmatchedHold
from federation.daemon.udp import OverlayProtocol
from federation.envelope.datagrams import Envelope
from federation.protocol.node import Node
from federation.protocol.types import Address

log = logging.getLogger("federation.daemon")
T = TypeVar("T")


class WrapperParts(Protocol):
    """What the read-outs read of a running wrapper (read-only)."""

    @property
    def config(self) -> DaemonConfig: ...
    @property
    def node(self) -> Node: ...
    @property
    def envelope(self) -> Envelope: ...
    @property
    def broker(self) -> BrokerAdapter: ...
    @property
    def broker_health(self) -> BrokerHealth: ...
    @property
    def tracker(self) -> BrokerLogTracker: ...
    @property
    def flow(self) -> FlowControl: ...
    @property
    def journal(self) -> InjectionJournal | None: ...
    @property
    def broker_subscriptions(self) -> BrokerSubscriptions: ...
    @property
    def duplicates_suppressed(self) -> int: ...
    @property
    def retained(self) -> RetainedStore: ...
    @property
    def retained_reading(self) -> RetainedReading: ...
    @property
    def retained_gate(self) -> RetainedGate: ...
    @property
    def sessions(self) -> BrokerSessions: ...
    @property
    def roaming(self) -> Roaming: ...
    @property
    def unmatched(self) -> UnmatchedHold: ...
    @property
    def protocol(self) -> OverlayProtocol: ...
    @property
    def receive_backlog(self) -> PacketBacklog[Address]: ...
    @property
    def event_log(self) -> EventLog | None: ...
    @property
    def event_counts(self) -> Counter[str]: ...
    @property
    def started_at(self) -> float: ...
    @property
    def reloads(self) -> Reloads: ...
    @property
    def edges(self) -> PolicyEdges: ...
    @property
    def subscription_sink(self) -> PolicySubscriptions: ...
    @property
    def storage(self) -> StorageHealth: ...
    @property
    def intake_paused(self) -> bool: ...
    def unsent_bytes(self) -> int: ...
    def read_kernel_receive_drops(self) -> int | None: ...


def status_document(wrapper: WrapperParts, now: float, brief: bool = False) -> dict[str, Any]:
    """`Node.status(now)` plus the envelope's status and the wrapper's own `daemon` section (`brief`: the node's
    without its bulky lists)."""
    config = wrapper.config
    document = wrapper.node.status(now, brief)
    broker = wrapper.broker
    health = wrapper.broker_health
    flow = wrapper.flow
    protocol = wrapper.protocol
    document["envelope"] = wrapper.envelope.status()
    document["daemon"] = {
        "version": __version__, "pid": os.getpid(), "uptime_s": round(now - wrapper.started_at, 3),
        "bind": str(config.bind), "announced": str(config.announced),
        "broker": {
            "address": str(config.broker), "client_id": config.client_id,
            "connected": health.connected, "reconnects": health.reconnects,
            "connect_failures": dict(health.connect_failures), "problem": health.problem,
            "log_lines": health.log_lines, "log": wrapper.tracker.counters.as_dict(),
            "injected": broker.injected, "inject_failed": broker.inject_failed,
            "backpressure_pauses": flow.backpressure_pauses,
            "reading_paused": broker.reading_paused,
            "intake_paused": wrapper.intake_paused,
            "read_waits": broker.read_waits,
            "injection_backlog": len(flow.injection_queue),
            "injection_dropped": dict(sorted(flow.injection_queue.dropped.items())),
            "session": {"present": broker.session_present, "expiry_s": config.broker_session_expiry,
                        "lost": broker.sessions_lost, "receive_maximum": broker.receive_maximum,
                        "announced_receive_maximum": RECEIVE_MAXIMUM},
            "injections": injection_counts(wrapper),
            "journal": wrapper.journal.status() if wrapper.journal is not None else None,
            "retained": {**wrapper.retained.describe(), "order": wrapper.retained_gate.describe()},
            "sessions": wrapper.sessions.describe(),
            "roaming": wrapper.roaming.describe(),
            "retained_scan": dataclasses.asdict(wrapper.retained_reading.counts),
            **wrapper.broker_subscriptions.status(),
            "unmatched_hold": wrapper.unmatched.status(),
        },
        "overload": {
            "receive_backlog": len(wrapper.receive_backlog),
            "receive_dropped": dict(sorted(wrapper.receive_backlog.dropped.items())),
            "send_paused": protocol.writing_paused,
            "send_pauses": protocol.write_pauses,
            "send_buffer_bytes": wrapper.unsent_bytes(),
            "send_shed_qos0": flow.send_shed,
            "kernel_receive_drops": wrapper.read_kernel_receive_drops(),
        },
        "event_log": str(config.event_log) if config.event_log else None,
        "event_log_lines": wrapper.event_log.lines if wrapper.event_log else 0,
        "state_dir": str(config.state_dir) if config.state_dir else None,
        "storage": wrapper.storage.status(now),
        "metrics": f"{config.metrics_bind}:{config.metrics_port}" if config.metrics_port is not None else None,
        "events": dict(sorted(wrapper.event_counts.items())),
        "udp_send_errors": protocol.send_errors,
        "reloads": dataclasses.asdict(wrapper.reloads),
        "config": configuration_status(wrapper),
        "topic_policy": topic_policy_status(wrapper),
        "ready": wrapper_readiness(wrapper).as_dict(),
    }
    return document


NOT_IMPORTED_SHOWN = 50
"""local filters listed at most in status as importing nothing (`topic_policy.subscriptions.not_imported`)"""


def configuration_status(wrapper: WrapperParts) -> dict[str, Any]:
    """The running configuration: its file, the file's hash when it was read, what waits for a restart."""
    config = wrapper.config
    return {"file": str(config.config_file) if config.config_file is not None else None,
            "sha256": config.config_hash, "loaded_at": round(config.loaded_at, 3),
            "pending_restart": list(wrapper.reloads.pending_restart),
            "neighbours": [str(address) for address in config.neighbours],
            "neighbour_resolve_interval": config.neighbour_resolve_interval}


def topic_policy_status(wrapper: WrapperParts) -> dict[str, Any]:
    """The topic policy's lines, what it kept out by direction and reason, the subscriptions it maps."""
    sink = wrapper.subscription_sink
    not_imported = sink.not_imported()
    return {**wrapper.edges.status(),
            "subscriptions": {"federated": sink.federated, "not_imported": not_imported[:NOT_IMPORTED_SHOWN],
                              "not_imported_count": len(not_imported)}}


def injection_counts(wrapper: WrapperParts) -> dict[str, int]:
    """What became of the remote publications handed to the broker (docs/daemon.md "Honest counters"):
    `delivered` is what the broker acknowledged (QoS 1/2) plus what was written to its socket (QoS 0)."""
    broker = wrapper.broker
    counts = broker.counts
    return {
        "delivered": counts["acknowledged"] + counts["written_qos0"],
        "acknowledged": counts["acknowledged"], "written_qos0": counts["written_qos0"],
        "refused": counts["refused"], "failed": broker.inject_failed, "unfinished": broker.backlog(),
        "waiting": len(wrapper.flow.injection_queue), "held": len(wrapper.broker_subscriptions.hold.held),
        "unmatched": wrapper.unmatched.held_count,
        "resent": counts["resent"], "reinjected": counts["reinjected"],
        "duplicate_suppressed": wrapper.duplicates_suppressed,
    }


def wrapper_readiness(wrapper: WrapperParts) -> Readiness:
    """health.py's judgement on the running wrapper: broker connected, its log flowing, a neighbour up when
    neighbours are configured, every federated filter served (the topic table not full)."""
    health = wrapper.broker_health
    up = sum(1 for neighbour in wrapper.node.neighbours.all() if neighbour.up)
    limits = wrapper.node.limits_problem(wrapper.node.last_input_at)
    problems = tuple(problem for problem in (limits, wrapper.storage.problem) if problem is not None)
    return readiness(wrapper.config.broker, health.connected, health.log_flowing, health.problem,
                     len(wrapper.config.neighbours), up, problems)


def metrics_snapshot(wrapper: WrapperParts, now: float) -> Snapshot:
    """Copies of every number the metrics expose (on the loop thread); `metrics.metric_families` reads it."""
    node = wrapper.node
    view = node.view()
    neighbours = node.neighbours.all()
    health = wrapper.broker_health
    log_counters = wrapper.tracker.counters
    broker = wrapper.broker
    protocol = wrapper.protocol
    return {
        "address": str(node.address), "broker_id": str(node.broker_id), "name": node.name,
        "version": __version__, "epoch": node.epoch,
        "sent": dict(node.sent_by_type), "sent_bytes": dict(node.sent_bytes_by_type),
        "received": dict(node.received_by_type), "received_bytes": dict(node.received_bytes_by_type),
        "drops": dict(node.drops), "counters": dict(node.counters), "events": dict(wrapper.event_counts),
        "members": len(view.members), "topics": sum(1 for core in view.topic_cores.values() if core is not None),
        "is_management_core": view.management_core == view.broker_id,
        "local_clients": len(node.clients), "local_subscriptions": sum(len(f) for f in node.clients.values()),
        "broker_connected": health.connected, "broker_reconnects": health.reconnects,
        "log_outcomes": {"used": log_counters.used, "ignored": log_counters.ignored,
                         "refused": log_counters.refused, "truncated": log_counters.truncated,
                         "not_understood": log_counters.not_understood_total},
        "injected": broker.injected,
        "inject_failed": broker.inject_failed,
        "injections": injection_counts(wrapper),
        "broker_sessions_lost": broker.sessions_lost,
        "broker_receive_maximum": broker.receive_maximum,
        "broker_read_waits": broker.read_waits,
        "unaccounted_subscriptions": wrapper.broker_subscriptions.audit.unaccounted,
        "over_delivery": wrapper.broker_subscriptions.audit.over_delivery,
        "filters_widened": log_counters.widened,
        "udp_send_errors": protocol.send_errors,
        "receive_backlog": len(wrapper.receive_backlog),
        "send_paused": protocol.writing_paused,
        "ready": wrapper_readiness(wrapper).ready,
        "connect_failures": dict(health.connect_failures),
        "neighbours": [{"address": str(n.transport), "up": n.up, "rtt": n.rtt,
                        "rtt_histogram": (n.rtt_histogram.cumulative(), n.rtt_histogram.total)} for n in neighbours],
        "injection_latency": (broker.injection_latency.cumulative(), broker.injection_latency.total),
        "injection_backlog": len(wrapper.flow.injection_queue),
        "unacked_copies": node.unacked_copies,
        "reading_paused": broker.reading_paused,
        "intake_paused": wrapper.intake_paused,
        "storage_ok": wrapper.storage.ok,
        "storage_write_failures": wrapper.storage.write_failures,
        "paced": any(until > now for until in node.pacing.paced_until.values()),  # read only: not paced_until()
        "kernel_receive_drops": wrapper.read_kernel_receive_drops() or 0,
        "reloads": wrapper.reloads.signals,
        "reload_failures": wrapper.reloads.failures,
        "config_hash": wrapper.config.config_hash or "",
        "config_loaded_at": wrapper.config.loaded_at,
        "topic_policy_filtered": {direction: dict(counts) for direction, counts in wrapper.edges.filtered.items()},
        "roaming": wrapper.roaming.describe(),
    }


def on_loop(loop: asyncio.AbstractEventLoop, take: Callable[[], T], timeout: float) -> T | None:
    """From another thread: run `take` on `loop` and wait for its result; None if the loop does not answer
    within `timeout` seconds, is closed, or `take` fails (logged: a request must not kill the server thread)."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def fill() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(take())
        except Exception as error:  # noqa: BLE001 - handed to the waiting thread
            future.set_exception(error)

    try:
        loop.call_soon_threadsafe(fill)
        return future.result(timeout)
    except (RuntimeError, concurrent.futures.TimeoutError):
        future.cancel()
        return None
    except Exception as error:  # noqa: BLE001 - a scrape must not kill the server thread
        log.error("reading the wrapper for the metrics port failed: %s", error)
        return None
