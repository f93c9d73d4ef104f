"""The metrics port: `/metrics` for Prometheus, `/healthz` and `/readyz` for whatever watches the wrapper.

Theory of operation: one small HTTP server in its own thread (the standard
library's, as prometheus-client's own `start_http_server` is; written here
because that one answers every path with the metrics, 200 included, so a
health check could not tell anything). It never reads the wrapper itself:
every answer comes from the `Probe` the runtime hands it, whose methods run
the read on the event loop and wait for it with a timeout
(snapshots.py `on_loop`), so a loop that no longer answers is exactly what
`/healthz` reports.

- `/metrics`: 200, the families of one snapshot (text format 0.0.4, or
  OpenMetrics when the scraper asks), and the process collector's `process_*`;
  empty while the wrapper starts.
- `/healthz`: 200 `{"alive": true}` while the event loop answers within
  `PROBE_TIMEOUT`, else 503.
- `/readyz`: 200 `{"ready": true, "reasons": []}` when health.py judges the
  wrapper ready (broker connected, its log flowing, a configured neighbour
  up), else 503 with the reasons (also while it starts).

Anything else is 404 with the list of paths; a method other than GET or
HEAD is 405. Bodies of the health paths are JSON.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import urlsplit

from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from federation.daemon.health import Readiness
from federation.daemon.metrics import Snapshot, metric_families

log = logging.getLogger("federation.daemon.metrics")

PROBE_TIMEOUT = 2.0
"""seconds a request waits for the event loop's answer"""
SHUTDOWN_POLL = 0.05
"""seconds between the server thread's looks at a shutdown request (the default half second would be most of
the wrapper's second to honour SIGTERM)"""
PATHS = ("/metrics", "/healthz", "/readyz")
JSON = "application/json"


class Probe(Protocol):
    """What the server asks the wrapper, from its own thread (each call waits for the event loop)."""

    def metrics_snapshot(self) -> Snapshot | None:
        """The numbers of one scrape; None while the wrapper starts, or when the loop does not answer."""

    def loop_answers(self) -> bool:
        """True when the event loop ran a callback within PROBE_TIMEOUT."""

    def readiness(self) -> Readiness | None:
        """The wrapper's readiness; None while it starts, or when the loop does not answer."""


class SnapshotCollector(Collector):
    """A prometheus-client collector that builds every family from one snapshot per scrape."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    def collect(self) -> Iterator[Metric]:
        snap = self.probe.metrics_snapshot()
        if snap is None:
            return iter(())
        return iter(metric_families(snap))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    probe: Probe
    registry: CollectorRegistry


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        self._answer(send_body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(send_body=False)

    def _answer(self, send_body: bool) -> None:
        path = urlsplit(self.path).path
        probe = self.server.probe
        try:
            if path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                self._send(200, content_type, encoder(self.server.registry), send_body)
            elif path == "/healthz":
                if probe.loop_answers():
                    self._json(200, {"alive": True}, send_body)
                else:
                    self._json(503, {"alive": False, "reason": f"the event loop did not answer within "
                                                               f"{PROBE_TIMEOUT:g} s"}, send_body)
            elif path == "/readyz":
                ready = probe.readiness()
                if ready is None:
                    ready = Readiness(False, ("the wrapper is starting, or its event loop does not answer",))
                self._json(200 if ready.ready else 503, ready.as_dict(), send_body)
            else:
                self._json(404, {"error": f"no such path: {path}", "paths": list(PATHS)}, send_body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away

    def _json(self, status: int, document: dict[str, Any], send_body: bool) -> None:
        self._send(status, JSON, (json.dumps(document) + "\n").encode(), send_body)

    def _send(self, status: int, content_type: str, body: bytes, send_body: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        self._json(405, {"error": "only GET and HEAD", "paths": list(PATHS)}, send_body=True)

    do_PUT = do_DELETE = do_PATCH = do_POST  # noqa: N815

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.debug("%s %s", self.address_string(), format % args)


def start_metrics_server(host: str, port: int, probe: Probe) -> ThreadingHTTPServer:
    """Serve PATHS on host:port in a daemon thread; returns the server (`.shutdown()`, `.server_close()`);
    OSError if the port cannot be bound."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(probe))
    ProcessCollector(registry=registry)  # process_*: CPU, resident memory, file descriptors, start time
    server_class = type("_Server6", (_Server,), {"address_family": socket.AF_INET6}) if ":" in host else _Server
    server = server_class((host, port), _Handler)
    server.probe = probe
    server.registry = registry
    thread = threading.Thread(target=server.serve_forever, args=(SHUTDOWN_POLL,), name="metrics-server", daemon=True)
    thread.start()
    return server
