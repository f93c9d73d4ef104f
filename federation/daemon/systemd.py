"""Readiness, stopping and watchdog notifications to systemd (sd_notify(3)), without libsystemd.

Theory of operation: a `Type=notify` service is started with NOTIFY_SOCKET
naming a datagram socket (a path, or `@name` in the abstract namespace);
each notification is one datagram of newline-separated `KEY=VALUE` lines.
The wrapper says `READY=1` once it runs (its socket bound, the node started,
the broker connection under way: a broker that is down is retried while the
overlay runs, so it does not hold up readiness), `STOPPING=1` when its
shutdown begins, and, when the unit sets `WatchdogSec=` (systemd then
passes WATCHDOG_USEC, and WATCHDOG_PID when the pid matters), `WATCHDOG=1`
at half that interval from the event loop itself: a loop that stops
answering stops the pings and systemd restarts the service.

Outside systemd (no NOTIFY_SOCKET) every call does nothing, so the runtime
calls `service_notifications` unconditionally. A notification that cannot
be sent is logged once and never stops the wrapper.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Iterator, Mapping

log = logging.getLogger("federation.daemon.systemd")


def notify_address(value: str | None) -> str | None:
    """The address to send to for a NOTIFY_SOCKET value: a path, an abstract name with its leading NUL, or
    None (unset, empty, or a kind this module does not speak, such as `vsock:`)."""
    if not value:
        return None
    if value.startswith("@"):
        return "\0" + value[1:]
    return value if value.startswith("/") else None


def watchdog_interval(environ: Mapping[str, str], pid: int) -> float | None:
    """Seconds between watchdog pings (half of WATCHDOG_USEC), or None when no watchdog is asked of `pid`."""
    owner = environ.get("WATCHDOG_PID")
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
        if owner is not None and int(owner) != pid:
            return None
    except ValueError:
        return None
    return usec / 2e6 if usec > 0 else None


class Notifier:
    """Sends notifications to the NOTIFY_SOCKET of `environ` (the process environment by default)."""

    def __init__(self, environ: Mapping[str, str] | None = None, pid: int | None = None) -> None:
        environ = os.environ if environ is None else environ
        self.address = notify_address(environ.get("NOTIFY_SOCKET"))
        self.watchdog_interval = watchdog_interval(environ, os.getpid() if pid is None else pid)
        self._failed = False

    def notify(self, *assignments: str) -> bool:
        """Send `KEY=VALUE` assignments in one datagram; True if it was sent."""
        if self.address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self.address)
                sock.sendall("\n".join(assignments).encode())
        except OSError as error:
            if not self._failed:
                self._failed = True
                log.warning("cannot notify systemd at NOTIFY_SOCKET %s (%s): %s; the wrapper runs on, but a "
                            "Type=notify unit will not see it ready", self.address.replace("\0", "@"),
                            " ".join(assignments), error.strerror or error)
            return False
        return True


@contextlib.contextmanager
def service_notifications(loop: asyncio.AbstractEventLoop,
                          notifier: Notifier | None = None) -> Iterator[Notifier]:
    """`READY=1` on entry, `WATCHDOG=1` from `loop` while inside (if asked), `STOPPING=1` on exit."""
    notifier = notifier or Notifier()
    notifier.notify("READY=1")
    interval = notifier.watchdog_interval
    handle: asyncio.TimerHandle | None = None

    def ping() -> None:
        nonlocal handle
        notifier.notify("WATCHDOG=1")
        assert interval is not None
        handle = loop.call_later(interval, ping)

    if interval is not None:
        handle = loop.call_later(interval, ping)
    try:
        yield notifier
    finally:
        if handle is not None:
            handle.cancel()
        notifier.notify("STOPPING=1")
