"""The overlay's UDP endpoint: one socket, large buffers, status requests split off before the node.

Theory of operation: the socket is made and bound here, by hand, so that a
bind failure becomes an error a person can act on (exit status 2) and the
buffers are set before the first datagram: bursts of topic messages must
not be dropped by a 208 KiB default. `SO_REUSEADDR` is deliberately not set:
on Linux it lets a second UDP socket share the port, and then two wrappers
would each get half of the datagrams instead of the second failing to start.
Datagrams that start with `STATUS_MAGIC` are status requests: they go to the
status handler, and only when they come from this host (a loopback address
or an address a socket can bind here); everything else goes to the node,
through the envelope (federation.envelope.datagrams: authentication, replay
protection, reassembly), which the runtime drives.

Reading and writing under load (docs/daemon.md "Overload"): asyncio hands
over one datagram per loop pass, so under a flood a hello would wait behind
every `tm` queued before it. `read_waiting` lets the runtime take every
datagram already waiting (up to a bound) in one pass and handle the control
packets among them first. Toward the network, asyncio buffers without bound
when the socket says EAGAIN; the transport's write-buffer limits make it
call `pause_writing`/`resume_writing`, recorded here (`writing_paused`) for
the runtime, which then sheds QoS 0 publications and stops reading from its
broker.

The envelope reports every refused datagram as a `packet_dropped` event;
`DropReporter` turns them into human log lines without letting a flood of
forgeries flood the log: the first drop of each reason is logged at once,
later ones are summed up at most once a minute. `announce_security` says at
start-up how the overlay is protected, and loudly when it is not.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import fcntl
import ipaddress
import logging
import os
import socket
import termios
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from federation.daemon.keys import permission_warning
from federation.daemon.status import STATUS_BRIEF, STATUS_MAGIC
from federation.envelope.datagrams import Envelope
from federation.protocol.types import Address, Event

log = logging.getLogger("federation.daemon.udp")

SEND_BUFFER_HIGH = 256 * 1024
"""bytes buffered by asyncio (the kernel said EAGAIN) above which writing is paused (QoS 0 shed)"""
SEND_BUFFER_LOW = 64 * 1024
"""bytes below which writing resumes"""
MAX_DATAGRAM_READ = 65535
"""bytes asked for per read: more than any UDP datagram holds"""
SOCKET_BUFFER = 4 * 1024 * 1024
"""bytes requested for SO_RCVBUF and SO_SNDBUF (the kernel caps them at net.core.rmem_max/wmem_max)"""
MAX_LOCAL_CACHE = 1024


PROC_UDP_TABLES = (Path("/proc/net/udp"), Path("/proc/net/udp6"))


def kernel_receive_drops(sock: socket.socket) -> int | None:
    """Datagrams the kernel dropped because this socket's receive buffer was full: the `drops` column of
    /proc/net/udp (or udp6) for the socket's inode. They are publications a neighbour sent faster than
    this wrapper reads (QoS 0 pacing acts on the backlog the wrapper has read, and this loss happens before
    the wrapper sees them), so this is the only way to count them. None if the socket is closed or the
    table cannot be read (not Linux)."""
    try:
        inode = str(os.fstat(sock.fileno()).st_ino)
    except OSError:
        return None
    for table in PROC_UDP_TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
            if len(fields) >= 13 and fields[9] == inode:
                return int(fields[12])
    return None


DROP_SUMMARY_INTERVAL = 60.0
"""seconds between log summaries of envelope drops of one reason"""
SECURITY_REASONS = frozenset({"unauthenticated", "no_key", "unknown_key", "bad_mac", "replayed", "too_old",
                              "stale_epoch", "not_envelope", "envelope_version"})
"""drop reasons logged as warnings (an attack or a misconfiguration); the others (loss, reassembly) at info"""
OPEN_OVERLAY_WARNING = (
    "!!! NO FEDERATION KEY: the overlay on UDP %s is OPEN. Anyone who can send a datagram to this port can "
    "inject publications into broker %s and rewrite the federation's routing; nothing is authenticated or "
    "encrypted. Use this only in a lab. To protect it: `federation-wrapper genkey > federation.key`, "
    "chmod 600, copy the file to every wrapper and start each with --key-file federation.key "
    "(docs/security.md).")


class BindError(Exception):
    """The UDP socket cannot be bound (exit status 2); the message says what to change."""


def open_socket(bind: Address, family: socket.AddressFamily) -> socket.socket:
    """A bound, non-blocking UDP socket with large buffers; BindError with the fix on failure."""
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
            except OSError as error:  # pragma: no cover - Linux caps instead of failing
                log.debug("cannot set socket buffer %s: %s", option, error)
        received = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        if received < SOCKET_BUFFER:  # Linux reports twice the value it accepted
            log.info("UDP receive buffer is %d bytes (asked %d): raise net.core.rmem_max for bursty federations",
                     received, SOCKET_BUFFER)
        sock.bind((bind.host, bind.port))
        sock.setblocking(False)
    except OSError as error:
        sock.close()
        raise BindError(bind_error_text(bind, error)) from None
    return sock


def bind_error_text(bind: Address, error: OSError) -> str:
    where = f"cannot bind UDP {bind}"
    if error.errno == errno.EADDRINUSE:
        return f"{where}: address already in use; another wrapper running? choose --bind HOST:PORT"
    if error.errno == errno.EADDRNOTAVAIL:
        return (f"{where}: {bind.host} is not an address of this host; give one of its addresses "
                f"or 0.0.0.0 with --bind")
    if error.errno == errno.EACCES:
        return f"{where}: permission denied; choose a port above 1023 with --bind or run with the privilege"
    return f"{where}: {error.strerror or error}; check --bind"


class LocalAddresses:
    """Whether a source address belongs to this host: loopback, known, or bindable here (cached)."""

    def __init__(self, known: set[str]) -> None:
        self._cache: dict[str, bool] = {host: True for host in known}

    def __contains__(self, host: object) -> bool:
        if not isinstance(host, str):
            return False
        cached = self._cache.get(host)
        if cached is not None:
            return cached
        try:
            parsed = ipaddress.ip_address(host.split("%")[0])
        except ValueError:
            return False
        if parsed.is_loopback:
            local = True
        else:
            family = socket.AF_INET6 if parsed.version == 6 else socket.AF_INET
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                try:
                    probe.bind((host, 0))
                    local = True
                except OSError:
                    local = False
        if len(self._cache) >= MAX_LOCAL_CACHE:
            self._cache.clear()
        self._cache[host] = local
        return local


def source_address(addr: Any) -> Address:
    """asyncio's (host, port[, flow, scope]) as an Address."""
    return Address(str(addr[0]), int(addr[1]))


def _unattached(*_arguments: Any) -> None:
    """What a datagram, a status request or a resumption meets before `OverlayProtocol.attach` (nothing is
    read before it, where the transport can pause reading)."""


def _reading(transport: Any, method: str) -> None:
    """Pause or resume reading where the transport can. CPython's datagram transports can from 3.11.3 on;
    before (Debian 12's python3 is 3.11.2) the method is ReadTransport's, which raises NotImplementedError:
    then reading is never paused, and nothing is lost, as the runtime attaches the handlers before the loop
    runs again (runtime.py)."""
    call = getattr(transport, method, None)
    if call is not None:
        with contextlib.suppress(NotImplementedError):
            call()


class OverlayProtocol(asyncio.DatagramProtocol):
    """Routes each datagram: status requests to `on_status`, the rest to `on_datagram`.

    The endpoint is made before what handles its datagrams (which needs the transport): reading starts
    paused, and `attach` names the handlers and starts it; datagrams wait in the socket until then."""

    def __init__(self, local: LocalAddresses, sock: socket.socket | None = None) -> None:
        self.on_datagram: Callable[[bytes, Address], None] = _unattached
        self.on_status: Callable[[Any, bool], None] = _unattached
        self.on_resume_writing: Callable[[], None] = _unattached
        self._attached = False
        self.local = local
        self.sock = sock
        """the transport's own (non-blocking) socket, read directly by `read_waiting`"""
        self.transport: asyncio.DatagramTransport | None = None
        self.send_errors = 0
        self.status_refused = 0
        self.writing_paused = False
        self.write_pauses = 0
        self._waiting = array.array("i", [0])
        """FIONREAD's answer: the size of the next datagram waiting, 0 when none"""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)
        if hasattr(transport, "max_size"):
            # asyncio's selector transport reads each datagram into a fresh 256 KiB buffer, which the
            # allocator maps and unmaps every time: 39 against 6 µs a read (with the send) here, per datagram
            # at low rates. No datagram is larger than this.
            cast(Any, transport).max_size = MAX_DATAGRAM_READ
        set_limits = getattr(transport, "set_write_buffer_limits", None)  # asyncio's; not in the typed ABC
        if set_limits is not None:
            set_limits(high=SEND_BUFFER_HIGH, low=SEND_BUFFER_LOW)
        if not self._attached:
            _reading(transport, "pause_reading")

    def attach(self, on_datagram: Callable[[bytes, Address], None], on_status: Callable[[Any, bool], None],
               on_resume_writing: Callable[[], None]) -> None:
        """Hand datagrams to `on_datagram` and status requests (their source, and whether the brief document is
        asked: `STATUS_BRIEF`) to `on_status` from now on, and
        call `on_resume_writing` when the send side drains; starts reading."""
        self.on_datagram = on_datagram
        self.on_status = on_status
        self.on_resume_writing = on_resume_writing
        self._attached = True
        _reading(self.transport, "resume_reading")

    def pause_writing(self) -> None:
        self.writing_paused = True
        self.write_pauses += 1

    def resume_writing(self) -> None:
        self.writing_paused = False
        self.on_resume_writing()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        if self._for_node(data, addr):
            self.on_datagram(data, source_address(addr))

    def _for_node(self, data: bytes, addr: Any) -> bool:
        """False for a status request (handled here), True for a datagram for the node."""
        if data.startswith(STATUS_MAGIC):
            if addr[0] in self.local:
                self.on_status(addr, data[len(STATUS_MAGIC):] == STATUS_BRIEF)
            else:
                self.status_refused += 1
                log.debug("status request from %s refused: not from this host", addr[0])
            return False
        return True

    def read_waiting(self, limit: int) -> list[tuple[bytes, Address]]:
        """Up to `limit` more datagrams for the node that are already waiting in the socket (never blocks)."""
        out: list[tuple[bytes, Address]] = []
        sock = self.sock
        if sock is None:
            return out
        try:  # the usual case at low rates, nothing more: a cheap ioctl instead of a read that raises EAGAIN
            fcntl.ioctl(sock.fileno(), termios.FIONREAD, self._waiting)
        except OSError:
            return out  # closed
        if self._waiting[0] <= 0:
            return out  # (an empty datagram shows as 0 too: asyncio's read takes it, the socket stays readable)
        for _attempt in range(limit):
            try:
                data, addr = sock.recvfrom(MAX_DATAGRAM_READ)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as error:  # an ICMP error queued on the socket (as asyncio's error_received), or closed
                self.error_received(error)
                if self.transport is None or self.transport.is_closing():
                    break
                continue
            if self._for_node(data, addr):
                out.append((data, source_address(addr)))
        return out

    def error_received(self, exc: Exception) -> None:
        # ICMP errors (port unreachable: the neighbour's wrapper is down) come back here;
        # the hello exchange already notices a dead neighbour, so only count them.
        self.send_errors += 1
        log.debug("UDP error: %s", exc)


def announce_security(envelope: Envelope, bind: Address, broker: Address, key_file: Any) -> None:
    """Log how the overlay is protected: loudly when it is open, with the key ids when it is not."""
    if envelope.mode == "open":
        log.warning(OPEN_OVERLAY_WARNING, bind, broker)
        return
    cipher = "ChaCha20-Poly1305 encryption" if envelope.mode == "aead" else "keyed BLAKE2b MACs, no encryption"
    log.info("overlay authenticated (%s): %d key(s) from %s, ids %s; the first signs", cipher,
             len(envelope.keys), key_file, ", ".join(envelope.key_ids()))
    if key_file is not None:
        warning = permission_warning(key_file)
        if warning:
            log.warning("%s", warning)


class DropReporter:
    """Human log lines for envelope drops: the first of each reason at once, then a summary a minute."""

    def __init__(self, interval: float = DROP_SUMMARY_INTERVAL) -> None:
        self.interval = interval
        self._pending: dict[str, int] = {}
        self._last_logged: dict[str, float] = {}

    def report(self, dropped: list[Event], now: float) -> None:
        for event in dropped:
            if event.type != "packet_dropped":
                continue
            reason = str(event.fields.get("reason"))
            count = 1 + int(event.fields.get("suppressed", 0))
            last = self._last_logged.get(reason)
            if last is not None and now - last < self.interval:
                self._pending[reason] = self._pending.get(reason, 0) + count
                continue
            earlier = self._pending.pop(reason, 0)
            self._last_logged[reason] = now
            level = logging.WARNING if reason in SECURITY_REASONS else logging.INFO
            more = f" ({earlier} more of this reason since the last report)" if earlier else ""
            log.log(level, "dropped a datagram from %s: %s: %s%s", event.fields.get("source"), reason,
                    event.fields.get("detail"), more)
