"""The read side of the wrapper's broker connection, driven by an asyncio loop.

Theory of operation: the loop watches the socket paho connected (by its
descriptor) and, when it is readable, `on_readable` makes one read pass:
every complete packet waiting, at most the pass's budget, FIONREAD saying
when the socket is empty, between the runtime's `hold` and `flush`, so that
a burst reaches the node as one batch. The budget is
`MAX_PACKETS_PER_WAKEUP` for what costs little (publications: a few
microseconds each), and fewer for what costs more, so that a pass, handing
over included, takes about `PASS_SECONDS` (`PassBudget`): a log line the
node learns a subscription from costs far more than a publication, and
passes of 256 of them held the loop 40 ms at the median and up to 390 ms
(a burst of 100,000 on the 2-CPU machine at a load of 10), answering no
hello meanwhile. Packets left in paho's (or TLS's) buffer do not make the
socket readable again, so a pass that leaves some schedules another
(`_schedule_read_retry`). While the broker sends
fast, a pass that emptied the socket is followed by a wait
(federation.daemon.read_coalescing): the socket is not watched for a
millisecond or two, and the next pass takes what gathered meanwhile.
`pause` / `resume` stop and restart the reading for backpressure; the
broker queues for the wrapper meanwhile.

The write side (paho's queue, writability, keepalive) and paho's callbacks
stay in `BrokerAdapter` (federation/daemon/broker.py), which builds this
class, tells it when paho opens and closes its socket, and is called back
after every pass (`after_pass`) to write what the pass caused.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import socket
import ssl
import termios
from collections.abc import Callable
from typing import Any

from federation.daemon import read_coalescing
from federation.daemon.lean_client import LeanClient, PublicClient

MAX_PACKETS_PER_WAKEUP = 256
"""packets read from the broker in one pass before the event loop gets to run other callbacks"""
MIN_PACKETS_PER_WAKEUP = 1
"""the smallest budget of a pass: one packet, when one takes `PASS_SECONDS` or more (a subscription that costs the
node that much; the loop answers its hellos between two)"""
MEASURED_PASS = 16
"""packets a pass must have read, or `PASS_SECONDS` it must have taken, to change the budget: a quick pass of a few
packets is mostly the pass's fixed cost, and says little about theirs"""
PASS_SECONDS = 0.02
"""what a read pass may take, handing over its items included, before the loop answers anything else (hellos,
status, timers): the budget of the next pass is what took that long in the last one"""


BUDGET_GROWTH = 1.25
"""the budget of a pass is at most this times the last one's: it shrinks at once and grows back over a few passes,
because the cost of log lines comes in lumps (a collection of the garbage collector, a covering filter formed)"""


class PassBudget:
    """How many packets the next read pass may take: `PASS_SECONDS` at the cost per packet the last pass had,
    at most `BUDGET_GROWTH` times the last budget, within `MIN_PACKETS_PER_WAKEUP` and `MAX_PACKETS_PER_WAKEUP`.
    Sans-I/O: the reading passes the loop's times."""

    def __init__(self, seconds: float = PASS_SECONDS, smallest: int = MIN_PACKETS_PER_WAKEUP,
                 largest: int = MAX_PACKETS_PER_WAKEUP) -> None:
        self.seconds = seconds
        self.smallest = smallest
        self.largest = largest
        self.packets = largest
        """the budget of the next pass"""
        self.smallest_seen = largest
        """the smallest budget so far (status, tests)"""

    def after_pass(self, read: int, took: float) -> None:
        """A pass read `read` packets in `took` seconds, handing over included. A quick one that read fewer than
        `MEASURED_PASS` says little about their cost (the pass's fixed part dominates): the budget is kept."""
        if read <= 0 or took <= 0 or (read < MEASURED_PASS and took <= self.seconds):
            return
        fits = int(self.seconds * read / took)
        grown = int(self.packets * BUDGET_GROWTH) + 1
        self.packets = max(self.smallest, min(self.largest, fits, grown))
        self.smallest_seen = min(self.smallest_seen, self.packets)


def tls_pending(sock: Any) -> int:
    """Bytes TLS has decrypted and holds for the next read (0 for a plain socket): a TLS record may carry several
    MQTT packets, and what is left of it after a read makes the raw socket neither readable nor FIONREAD > 0."""
    return sock.pending() if isinstance(sock, ssl.SSLSocket) else 0


class BrokerReading:
    """Reading the broker's socket on `loop`: passes, retries, waits, pauses (the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client: LeanClient | PublicClient,
                 after_pass: Callable[[], None], hold: Callable[[], None] | None = None,
                 flush: Callable[[], None] | None = None,
                 read_coalesce: float = read_coalescing.DEFAULT_SECONDS) -> None:
        self._loop = loop
        self._client = client
        self._after_pass = after_pass
        """called at the end of each pass, before `flush`: write what the pass caused"""
        self._hold = hold
        """called before each pass (`flush` follows: nothing need be scheduled)"""
        self._flush = flush
        """called after each pass, to hand its items over at once"""
        self.watched: socket.socket | None = None
        """paho's connected socket, None between connections"""
        self.paused = False
        self.coalescing = read_coalescing.ReadCoalescing(read_coalesce)
        """how long to let packets gather after a pass (federation.daemon.read_coalescing)"""
        self.budget = PassBudget()
        """how many packets a pass takes (`PassBudget`)"""
        self._available = array.array("i", [0])
        self._read_retry: asyncio.Handle | None = None
        """a pending pass for packets already in our buffer (`_schedule_read_retry`)"""
        self._read_wait: asyncio.TimerHandle | None = None
        """the end of a wait after a pass, while the socket is not watched"""

    # ------------------------------------------------------------ what the adapter tells

    def watch(self, sock: socket.socket) -> None:
        """paho connected `sock`: read it (once not paused)."""
        self.watched = sock
        if not self.paused:
            self._watch_reads(sock)

    def forget(self, sock: Any) -> bool:
        """paho is about to close `sock`: stop watching it first, so its descriptor number can be reused. False
        if it was not the watched socket (nothing done)."""
        watched = self.watched
        if sock is None or sock is not watched:
            return False
        self._cancel_read_wait()
        self._unwatch_reads(watched)
        self.watched = None
        return True

    def pause(self) -> None:
        """Stop reading (backpressure): the broker queues for us meanwhile."""
        if self.paused:
            return
        self.paused = self._client.paused = True
        if self._read_retry is not None:
            self._read_retry.cancel()
            self._read_retry = None
        self._cancel_read_wait()
        if self.watched is not None:
            self._unwatch_reads(self.watched)

    def resume(self) -> None:
        if not self.paused:
            return
        self.paused = self._client.paused = False
        if self.watched is not None:
            self._watch_reads(self.watched)
            if self._client.buffered() or tls_pending(self.watched):
                self._schedule_read_retry()  # what we read before the pause does not make the socket readable

    def stop(self) -> None:
        self._cancel_read_wait()

    # ------------------------------------------------------------ passes

    def on_readable(self) -> None:
        """Read every complete packet waiting (at most the budget, and none once paused), then send what they
        caused; at a high rate, let the next packets gather a while (`_wait_before_reading`)."""
        if self._hold is not None:
            self._hold()
        loop = self._loop
        started = loop.time()
        budget = self.budget.packets
        read = 0
        try:
            read = self._read_pass(budget)
        finally:
            if self._flush is not None:
                self._flush()
        self.budget.after_pass(read, loop.time() - started)
        emptied = read < budget and self._read_retry is None and not self.paused
        wait = self.coalescing.after_pass(started, read, emptied)
        if wait and self.watched is not None and self._read_wait is None:
            self._wait_before_reading(self.watched, wait)

    def _read_pass(self, packets: int = MAX_PACKETS_PER_WAKEUP) -> int:
        """One pass over the socket, of at most `packets`; the number of packets read."""
        client = self._client
        sock = self.watched
        fileno = sock.fileno() if sock is not None else -1
        budget = packets if fileno >= 0 else 0
        while budget > 0 and not self.paused:
            read = client.read_packets(budget)
            if read <= 0 or client.socket() is not sock:
                break  # nothing (more) now, or the connection is gone
            budget -= read
            if client.buffered() or tls_pending(sock):
                continue  # complete packets may wait in the client's (or TLS's) read buffer: the socket may be empty
            try:
                fcntl.ioctl(fileno, termios.FIONREAD, self._available)
            except OSError:
                break
            if self._available[0] <= 0:
                break
        if (client.buffered() or tls_pending(sock)) and client.socket() is sock:
            self._schedule_read_retry()  # the socket may not wake us for what we hold already
        self._after_pass()
        return packets - budget if fileno >= 0 else 0

    def _schedule_read_retry(self) -> None:
        """Read again soon: complete packets wait in our buffer. At most one retry is pending, or a flood
        would add one more pass per loop iteration and starve the timers and the UDP socket."""
        if self._read_retry is None and not self.paused:
            self._read_retry = self._loop.call_soon(self._retry_read)

    def _retry_read(self) -> None:
        self._read_retry = None
        if not self.paused and self.watched is not None:
            self.on_readable()

    # ------------------------------------------------------------ waits

    def _wait_before_reading(self, sock: socket.socket, seconds: float) -> None:
        """Stop watching `sock` for `seconds`, then read what gathered meanwhile (federation.daemon.read_coalescing):
        one pass for what would have taken several."""
        self._unwatch_reads(sock)
        self._read_wait = self._loop.call_later(seconds, self._end_read_wait, sock)

    def _end_read_wait(self, sock: socket.socket) -> None:
        self._read_wait = None
        if self.paused or self.watched is not sock:
            return  # paused meanwhile (`resume` watches it again), or the connection is gone
        self._watch_reads(sock)
        self.on_readable()  # what gathered: the loop would only find the socket readable one pass later

    def _cancel_read_wait(self) -> None:
        if self._read_wait is not None:
            self._read_wait.cancel()
            self._read_wait = None

    def _watch_reads(self, sock: socket.socket) -> None:
        """Have the loop call `on_readable` when `sock` is readable. By its descriptor, not the socket: asyncio
        first looks the descriptor up, and when it is not watched yet raises and catches a KeyError whose message
        formats the object, and a socket's repr asks the kernel for both its addresses (two system calls at
        every resume and every read wait)."""
        self._loop.add_reader(sock.fileno(), self.on_readable)

    def _unwatch_reads(self, sock: socket.socket) -> None:
        self._loop.remove_reader(sock.fileno())
