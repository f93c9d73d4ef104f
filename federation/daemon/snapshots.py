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
attributes of the `Runtime` each read-out shows. `Runtime.status_document`
and `Runtime.metrics_snapshot` call these functions. A metrics scrape runs
in prometheus-client's HTTP thread: `snapshot_from_thread` has the loop
take the snapshot (`call_soon_threadsafe`) and waits for it, with a timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from federation import __version__
from federation.daemon.metrics import Snapshot

if TYPE_CHECKING:
    from federation.daemon.runtime import Runtime

log = logging.getLogger("federation.daemon")


def status_document(runtime: Runtime, now: float) -> dict[str, Any]:
    """`Node.status(now)` plus the envelope's status and the wrapper's own `daemon` section."""
    node = runtime.node
    assert node is not None
    config = runtime.config
    document = node.status(now)
    broker = runtime.broker
    health = runtime.broker_health
    flow = runtime.flow
    protocol = runtime.protocol
    if runtime.envelope is not None:
        document["envelope"] = runtime.envelope.status()
    document["daemon"] = {
        "version": __version__, "pid": os.getpid(), "uptime_s": round(now - runtime.started_at, 3),
        "bind": str(config.bind), "announced": str(config.announced),
        "broker": {
            "address": str(config.broker), "client_id": config.client_id,
            "connected": health.connected, "reconnects": health.reconnects,
            "log_lines": health.log_lines, "log": runtime.tracker.counters.as_dict(),
            "injected": broker.injected if broker else 0, "inject_failed": broker.inject_failed if broker else 0,
            "backpressure_pauses": flow.backpressure_pauses,
            "reading_paused": broker.reading_paused if broker else False,
            "injection_backlog": len(flow.injection_queue),
            "injection_dropped": dict(sorted(flow.injection_queue.dropped.items())),
        },
        "overload": {
            "receive_backlog": len(runtime.receive_backlog),
            "receive_dropped": dict(sorted(runtime.receive_backlog.dropped.items())),
            "send_paused": protocol.writing_paused if protocol else False,
            "send_pauses": protocol.write_pauses if protocol else 0,
            "send_buffer_bytes": runtime.unsent_bytes(),
            "send_shed_qos0": flow.send_shed,
            "kernel_receive_drops": runtime.read_kernel_receive_drops(),
        },
        "event_log": str(config.event_log) if config.event_log else None,
        "event_log_lines": runtime.event_log.lines if runtime.event_log else 0,
        "state_dir": str(config.state_dir) if config.state_dir else None,
        "metrics": f"{config.metrics_bind}:{config.metrics_port}" if config.metrics_port is not None else None,
        "events": dict(sorted(runtime.event_counts.items())),
        "udp_send_errors": protocol.send_errors if protocol else 0,
    }
    return document


def metrics_snapshot(runtime: Runtime) -> Snapshot:
    """Copies of every number the metrics expose (on the loop thread); `metrics.metric_families` reads it."""
    node = runtime.node
    assert node is not None
    view = node.view()
    neighbours = node.neighbours.all()
    health = runtime.broker_health
    log_counters = runtime.tracker.counters
    broker = runtime.broker
    protocol = runtime.protocol
    return {
        "address": str(node.address), "broker_id": str(node.broker_id), "name": node.name,
        "version": __version__, "epoch": node.epoch,
        "sent": dict(node.sent_by_type), "sent_bytes": dict(node.sent_bytes_by_type),
        "received": dict(node.received_by_type), "received_bytes": dict(node.received_bytes_by_type),
        "drops": dict(node.drops), "counters": dict(node.counters), "events": dict(runtime.event_counts),
        "neighbours_up": sum(1 for n in neighbours if n.up), "neighbours_total": len(neighbours),
        "members": len(view.members), "topics": sum(1 for core in view.topic_cores.values() if core is not None),
        "is_management_core": view.management_core == view.broker_id,
        "local_clients": len(node.clients), "local_subscriptions": sum(len(f) for f in node.clients.values()),
        "broker_connected": health.connected, "broker_reconnects": health.reconnects,
        "log_outcomes": {"used": log_counters.used, "ignored": log_counters.ignored,
                         "refused": log_counters.refused, "truncated": log_counters.truncated,
                         "not_understood": log_counters.not_understood_total},
        "injected": broker.injected if broker else 0,
        "inject_failed": broker.inject_failed if broker else 0,
        "udp_send_errors": protocol.send_errors if protocol else 0,
        "receive_backlog": len(runtime.receive_backlog),
        "send_paused": protocol.writing_paused if protocol else False,
    }


def snapshot_from_thread(loop: asyncio.AbstractEventLoop, take: Callable[[], Snapshot],
                         timeout: float) -> Snapshot | None:
    """From another thread: run `take` on `loop` and wait for its result; None if the loop does not answer
    within `timeout` seconds, is closed, or `take` fails (logged: a scrape must not kill the server thread)."""
    future: concurrent.futures.Future[Snapshot] = concurrent.futures.Future()

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
        log.error("metrics snapshot failed: %s", error)
        return None
