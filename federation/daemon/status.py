"""`wrapper.py status`: ask a running wrapper what it knows, over its own UDP port.

Theory of operation: the status request is one datagram that starts with
`STATUS_MAGIC` (b"FEDSTATUS1"), sent to the wrapper's overlay port. The
daemon checks for the magic *before* protocol decoding (the node never sees
it) and answers only requests from a loopback address or from one of its
own host's addresses, so the status cannot be read from elsewhere. The reply
is one datagram: a flag byte, then the JSON document:

    b"\\x00" + JSON (UTF-8)            when the JSON is at most 60000 bytes
    b"\\x01" + zlib(JSON)              otherwise

If even the compressed form does not fit a datagram, the bulky lists (topics,
local subscriptions, federation table) are emptied and `"truncated": true`
is set, so a reply always comes. An unanswered request is sent again every
`QUERY_RESEND` seconds until the timeout: a datagram can be lost, on loopback
too when a flood fills the wrapper's receive buffer. The document is `Node.status(now)` plus a
`daemon` section (broker connection, files, uptime). `render` turns it into
aligned tables for people; `--json` prints it as is.
"""

from __future__ import annotations

import json
import socket
import time
import zlib
from collections.abc import Sequence
from typing import Any

STATUS_MAGIC = b"FEDSTATUS1"
STATUS_BRIEF = b" brief"
"""after the magic: the document without its bulky lists (topics, local subscriptions, federation table), built
without them: cheap to ask of a wrapper that holds a hundred thousand subscriptions, as benchmarks do"""
FLAG_JSON = 0
FLAG_ZLIB = 1
COMPRESS_ABOVE = 60000
"""bytes of JSON above which the reply is zlib-compressed"""
MAX_REPLY = 65000
"""bytes: a reply must fit one UDP datagram (65507 at most over IPv4)"""
QUERY_TIMEOUT = 2.0
"""seconds `status` waits for the reply"""
QUERY_RESEND = 0.5
"""seconds after which an unanswered request is sent again (the wrapper answers each request it reads)"""
BULKY_SECTIONS = ("topics", "local_subscriptions", "federation")


class StatusError(Exception):
    """No (valid) answer; the message says what to check."""


def encode_reply(document: dict[str, Any]) -> bytes:
    """The reply datagram for a status document (see the module docstring)."""
    text = json.dumps(document, separators=(",", ":"), default=str).encode("utf-8")
    if len(text) <= COMPRESS_ABOVE:
        return bytes([FLAG_JSON]) + text
    packed = bytes([FLAG_ZLIB]) + zlib.compress(text, 6)
    if len(packed) <= MAX_REPLY:
        return packed
    trimmed = dict(document)
    for section in BULKY_SECTIONS:
        if section in trimmed:
            trimmed[section] = [] if isinstance(trimmed[section], list) else {}
    trimmed["truncated"] = True
    return bytes([FLAG_ZLIB]) + zlib.compress(json.dumps(trimmed, separators=(",", ":"), default=str).encode(), 6)


def decode_reply(data: bytes) -> dict[str, Any]:
    if not data:
        raise StatusError("empty status reply")
    flag, body = data[0], data[1:]
    if flag == FLAG_ZLIB:
        try:
            body = zlib.decompress(body)
        except zlib.error as error:
            raise StatusError(f"bad compressed status reply: {error}") from None
    elif flag != FLAG_JSON:
        raise StatusError(f"unknown status reply flag {flag}")
    try:
        document = json.loads(body)
    except ValueError as error:
        raise StatusError(f"status reply is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise StatusError("status reply is not a JSON object")
    return document


def query(host: str, port: int, timeout: float = QUERY_TIMEOUT, brief: bool = False) -> dict[str, Any]:
    """Send a status request to host:port and return the decoded document (`brief`: without the bulky lists);
    StatusError on silence."""
    try:
        infos = socket.getaddrinfo(host, port, 0, socket.SOCK_DGRAM)
    except OSError as error:
        raise StatusError(f"cannot resolve {host!r}: {error.strerror or error}") from None
    family, kind, proto, _name, target = infos[0]
    deadline = time.monotonic() + timeout
    with socket.socket(family, kind, proto) as probe:
        try:
            probe.connect(target)
            while True:
                probe.send(STATUS_MAGIC + (STATUS_BRIEF if brief else b""))
                probe.settimeout(max(0.001, min(QUERY_RESEND, deadline - time.monotonic())))
                try:
                    data = probe.recv(65536)
                    break
                except TimeoutError:
                    if time.monotonic() >= deadline:
                        raise
        except (TimeoutError, ConnectionRefusedError, OSError) as error:
            reason = "no reply" if isinstance(error, TimeoutError) else (
                "connection refused" if isinstance(error, ConnectionRefusedError) else str(error))
            raise StatusError(
                f"no wrapper answered at {host}:{port} within {timeout:g} s ({reason}): is it running? "
                f"Check the address with --node HOST:PORT (its --bind); status is answered only to this "
                f"host's own addresses") from None
    return decode_reply(data)


# ------------------------------------------------------------------ tables for people


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Aligned columns; numbers right-aligned, everything else left-aligned; "-" for None."""
    cells = [[_cell(value) for value in row] for row in rows]
    numeric = [all(isinstance(row[i], (int, float)) and not isinstance(row[i], bool) or row[i] is None
                   for row in rows) and bool(rows) for i in range(len(headers))]
    widths = [max([len(headers[i])] + [len(row[i]) for row in cells]) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        parts = [value.rjust(widths[i]) if numeric[i] else value.ljust(widths[i]) for i, value in enumerate(values)]
        return "  ".join(parts).rstrip()

    out = [line(headers), line(["-" * width for width in widths])]
    out.extend(line(row) for row in cells)
    return "\n".join(out)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) if value else "-"
    return str(value)


def _client_name(client: str) -> str:
    """A client id for the table; the wrapper's pseudo clients (their ids start with U+0000) in parentheses."""
    return f"({client[1:]})" if client.startswith("\x00") else client


def render(document: dict[str, Any]) -> str:
    """The status document as sections of aligned tables."""
    out: list[str] = []
    daemon = document.get("daemon", {})
    name = f" ({document['name']})" if document.get("name") else ""
    out.append(f"wrapper {document.get('node')}{name}  id {document.get('broker_id')}  epoch {document.get('epoch')}")
    core = document.get("management_core")
    own = " (this node)" if core == document.get("broker_id") else ""
    out.append(f"management core: {core}{own}")
    if daemon:
        broker = daemon.get("broker", {})
        state = "connected" if broker.get("connected") else "NOT CONNECTED"
        out.append(f"broker: {broker.get('address')} {state} as {broker.get('client_id')!r}; "
                   f"log lines {broker.get('log_lines', 0)}, reconnects {broker.get('reconnects', 0)}")
        session = broker.get("session") or {}
        if session:
            out.append(f"broker session: present {session.get('present')}, lost {session.get('lost', 0)} times, "
                       f"receive maximum {session.get('receive_maximum')}")
        injections = broker.get("injections") or {}
        if injections:
            out.append("injections: " + ", ".join(f"{key} {value}" for key, value in injections.items()))
        grace = broker.get("resubscribe_grace") or {}
        if grace.get("active"):
            out.append(f"BROKER RESTARTED: holding {grace.get('held')} publications for "
                       f"{len(grace.get('pending_filters') or [])} filters until their subscribers come back")
        count = broker.get("subscription_count") or {}
        if count.get("over_delivery"):
            out.append(f"OVER-DELIVERY: the broker holds {count.get('unaccounted_subscriptions')} subscriptions the "
                       f"wrapper never saw; every publication is delivered to it")
        out.append(f"uptime {daemon.get('uptime_s', 0):.0f} s, pid {daemon.get('pid')}, "
                   f"version {daemon.get('version')}")
        config = daemon.get("config") or {}
        if config:
            loaded = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(config.get("loaded_at") or 0))
            digest = config.get("sha256")
            out.append(f"configuration: {config.get('file') or 'command line only'}"
                       + (f", sha256 {digest[:16]}..." if digest else "") + f", loaded {loaded}"
                       + (f"; WAITING FOR A RESTART: {', '.join(config['pending_restart'])}"
                          if config.get("pending_restart") else ""))
        policy = daemon.get("topic_policy") or {}
        if policy:
            filtered = policy.get("filtered") or {}
            kept = ", ".join(f"{direction} {reason} {count}" for direction, reasons in filtered.items()
                             for reason, count in reasons.items() if count)
            out.append(f"topic policy: {' | '.join(policy.get('lines') or [])}"
                       + (f"; kept out: {kept}" if kept else ""))
            missing = (policy.get("subscriptions") or {}).get("not_imported") or []
            if missing:
                out.append(f"local subscriptions no in/both line imports: {', '.join(missing[:10])}"
                           + (" ..." if len(missing) > 10 else ""))
        ready = daemon.get("ready")
        if isinstance(ready, dict):
            out.append("ready" if ready.get("ready") else "NOT READY: " + "; ".join(ready.get("reasons", [])))
    if document.get("truncated"):
        out.append("(reply truncated: too large for one datagram; topics, subscriptions and table omitted)")

    neighbours = document.get("neighbours", [])
    out += ["", f"Neighbours ({sum(1 for n in neighbours if n.get('up'))} up of {len(neighbours)})"]
    out.append(table(["address", "id", "state", "rtt ms", "clock offset ms", "flaps", "configured"], [
        [n.get("address"), n.get("id"), "up" if n.get("up") else "down", n.get("rtt_ms"), n.get("clock_offset_ms"),
         n.get("flaps"), n.get("configured")] for n in neighbours]))

    federation = document.get("federation", [])
    out += ["", f"Federation table ({len(federation)} members)"]
    out.append(table(["address", "id", "distance", "next hops"], [
        [m.get("address"), m.get("id"), m.get("distance"), m.get("next_hops")] for m in federation]))

    topics = document.get("topics", [])
    out += ["", f"Topic cores and meshes ({len(topics)} filters)"]
    out.append(table(["filter", "core", "own core", "distance", "member", "parents", "children", "local subs",
                      "held"], [
        [t.get("filter"), t.get("core"), t.get("own_core"), t.get("distance"), t.get("member"), t.get("parents"),
         t.get("children"), t.get("local_subscribers"), t.get("held")] for t in topics]))

    subscriptions = document.get("local_subscriptions", {})
    rows = [[_client_name(client), filter_, qos] for client, filters in subscriptions.items()
            for filter_, qos in filters.items()]
    out += ["", f"Local subscriptions ({len(rows)})"]
    out.append(table(["client", "filter", "qos"], rows))

    sent, received = document.get("sent", {}), document.get("received", {})
    kinds = sorted(set(sent) | set(received))
    out += ["", "Packets"]
    out.append(table(["type", "sent", "sent bytes", "received", "received bytes"], [
        [kind, *sent.get(kind, [0, 0]), *received.get(kind, [0, 0])] for kind in kinds]))
    counters = document.get("counters", {})
    drops = document.get("drops", {})
    out += ["", "Counters"]
    out.append(table(["counter", "value"], [[k, v] for k, v in counters.items()]
                     + [[f"drop: {k}", v] for k, v in drops.items()]))
    return "\n".join(out) + "\n"
