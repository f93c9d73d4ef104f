"""One wrapper process from start to exit: startup in order, run until a signal, shut down cleanly.

Theory of operation: a wrapper's parts exist only once it runs (the
node, the envelope, the UDP endpoint, the broker connection, the
queues), and each needs others to be built. So they are built together,
once, in `build`: `open_resources` and `boot` (startup.py) take what the
configuration names and boot the node, failing with exit status 2 before
the epoch is advanced or anything is sent; between the two, the look for
another wrapper on the same broker (other_wrappers.py) refuses the start
the same way, unless allowed, and this wrapper's record on the broker is
held from then on until `run` ends; then the UDP endpoint is opened
and one `Running` (running.py) is made of it all, whose fields are never
None. `run` starts it, waits for SIGINT/SIGTERM (or `request_stop`), and
has it shut down: the node announces its departure, the last datagrams and
the state are written, the broker connection is closed.

SIGHUP asks the started wrapper to take up its files again (`Running.reload`:
the event log reopened at its path, the key file and the broker password
file read again); before the wrapper runs, and after, it is ignored, so a
logrotate `postrotate` can never end the process.

`Runtime` itself is the handle a caller holds before, during and after
that: the command line's `Runtime(config).run()`, a test thread's
`request_stop`, and the metrics port (metrics_server.py), which starts
before the node does (its port must fail early too) and reads the wrapper
through the runtime (`metrics_snapshot`, `readiness`, `loop_answers`, each
run on the loop): empty metrics and "starting" until `running` is set.
The node's clock (`Clock`, clock.py) is made with the runtime.
"""

from __future__ import annotations

import asyncio
import signal
import socket

from federation.daemon import other_wrappers
from federation.daemon.clock import Clock
from federation.daemon.config import DaemonConfig, is_wildcard
from federation.daemon.health import Readiness
from federation.daemon.metrics import Snapshot
from federation.daemon.metrics_server import PROBE_TIMEOUT
from federation.daemon.other_wrappers import Presence
from federation.daemon.running import Running
from federation.daemon.snapshots import on_loop
from federation.daemon.startup import StartupError, boot, open_resources
from federation.daemon.systemd import service_notifications
from federation.daemon.udp import LocalAddresses, OverlayProtocol


class Runtime:
    """One wrapper: build it from a config, then `await run()`; returns the exit status."""

    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.clock = Clock()
        self.running: Running | None = None
        """the started wrapper, from `build` on"""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = asyncio.Event()
        self.presence = Presence(config)
        """this wrapper's record on its broker, and the look at other wrappers' (other_wrappers.py)"""

    async def run(self, handle_signals: bool = True) -> int:
        """Run until SIGINT/SIGTERM (or `request_stop`); returns 0 after a clean shutdown.

        `handle_signals=False` lets a test run the runtime outside the main thread.
        """
        loop = self._loop = asyncio.get_running_loop()
        stop = self._stop
        signals = (signal.SIGINT, signal.SIGTERM) if handle_signals else ()
        for signum in signals:  # installed first: a signal during startup still ends in a clean shutdown
            loop.add_signal_handler(signum, stop.set)
        if handle_signals:
            loop.add_signal_handler(signal.SIGHUP, self.reload)
        try:
            running = await self.build()
            try:
                running.start()
                with service_notifications(loop):  # systemd: READY=1, WATCHDOG=1 while running, STOPPING=1
                    await stop.wait()
            finally:
                await running.shutdown()
        finally:
            await loop.run_in_executor(None, self.presence.close)  # the record goes after the wrapper left
            for signum in signals:
                loop.remove_signal_handler(signum)
            if handle_signals:  # SIGHUP stays ignored until the process exits
                loop.remove_signal_handler(signal.SIGHUP)
                signal.signal(signal.SIGHUP, signal.SIG_IGN)
        return 0

    async def build(self) -> Running:
        """Every part of the wrapper, wired and not started (`Running.start`); what the configuration names
        and cannot be had raises what says how to fix it, and nothing is left open then."""
        config = self.config
        loop = asyncio.get_running_loop()
        resources = open_resources(config, self)
        transport: asyncio.DatagramTransport | None = None
        try:
            try:  # another wrapper on this broker? (other_wrappers.py: after the local checks, before the epoch)
                await loop.run_in_executor(None, other_wrappers.check, self.presence, config.allow_other_wrappers)
            except other_wrappers.OtherWrapperError as error:
                raise StartupError(str(error)) from None
            node, envelope, persisted = boot(config, resources.store)
            # Linux reports twice the receive buffer it accepted; bulk transfers may fill half of what it accepted
            envelope.set_receive_window(resources.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4)
            known = {config.announced.host}
            if not is_wildcard(config.bind.host):
                known.add(config.bind.host)
            protocol = OverlayProtocol(LocalAddresses(known), sock=resources.sock)
            transport, _ = await loop.create_datagram_endpoint(lambda: protocol, sock=resources.sock)
            self.running = Running(config, self.clock, loop, resources, node, envelope, persisted, protocol,
                                   transport)
        except BaseException:
            resources.close(transport)
            raise
        return self.running

    def reload(self) -> None:
        """SIGHUP (on the loop's thread): the running wrapper reads its files again; ignored until it runs."""
        if self.running is not None:
            self.running.reload()

    def request_reload(self) -> None:
        """Ask the running wrapper to read its files again, as SIGHUP does (thread-safe)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.reload)

    def request_stop(self) -> None:
        """Ask the runtime to shut down (thread-safe)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    # The metrics port's probe (metrics_server.Probe): called from its thread, answered on the loop.

    def metrics_snapshot(self) -> Snapshot | None:
        """A snapshot taken on the loop; None before the wrapper runs or when the loop does not answer."""
        running = self.running
        return on_loop(running.loop, running.metrics_snapshot, PROBE_TIMEOUT) if running is not None else None

    def readiness(self) -> Readiness | None:
        running = self.running
        return on_loop(running.loop, running.readiness, PROBE_TIMEOUT) if running is not None else None

    def loop_answers(self) -> bool:
        loop = self._loop
        return loop is not None and on_loop(loop, lambda: True, PROBE_TIMEOUT) is True
