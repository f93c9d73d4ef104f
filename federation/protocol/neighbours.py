"""Neighbour liveness from the hello (`hl`) / hello back (`hb`) exchange.

A neighbour is *up* while hello backs keep arriving: an `hb` echoes one of
our own hellos, so it proves both directions work (a one-way cut takes the
link down on both ends). It is *down* after `dead_intervals` hello intervals
without one.

Under load the hellos wait in the same queues as the data, so a busy but
healthy link could miss three in a row. Any other packet that echoes one
of ours proves the same two-way path, so it counts too: a `ta` that
acknowledges a `tm` we sent and still wait for (`record_echo`; it keeps an
up neighbour up, only a hello back brings one up, because only it measures
the clocks). A `tm` or `hl` from the neighbour proves nothing of the
direction toward it and does not count: a one-way cut must still take the
link down at both ends.

The echo also measures the clocks, NTP-style: our hello left at t1 (our
clock), the peer stamped its answer t2 = t3 (its clock: it answers in the
step that received the hello), the answer arrived at t4. Then
rtt = t4 - t1 and offset = ((t2 - t1) + (t3 - t4)) / 2 = t3 - (t1 + rtt/2)
is the peer's clock minus ours, wrong by at most rtt/2 whatever the two
one-way delays are. Like NTP's clock filter, the estimate is the sample with
the smallest round trip among the last CLOCK_SAMPLES: a queueing delay in
one direction only skews a slow sample, and old samples age out, so a
drifting clock is followed. The Spark job (spark/clocks.py) reads the
estimates from `neighbour_up` and `counters` events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from federation.protocol.histogram import Histogram
from federation.protocol.types import Address, BrokerId

CLOCK_SAMPLES = 8
"""hello exchanges the clock estimate is chosen from (the one with the smallest round trip)"""


@dataclass
class Neighbour:
    transport: Address
    """where datagrams for this neighbour are sent (and come from)"""
    configured: bool
    announced: BrokerId | None = None
    """the id the neighbour announces in its packets (may differ from transport, e.g. NAT)"""
    up: bool = False
    last_back: float = float("-inf")
    rtt: float | None = None
    clock_offset: float | None = None
    """the peer's clock minus ours, from the fastest of the recent exchanges"""
    clock_error: float | None = None
    """bound on the error of `clock_offset`: half the round trip of its exchange"""
    clock_samples: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=CLOCK_SAMPLES))
    """(rtt, offset) of the last exchanges"""
    up_since: float | None = None
    flaps: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    rtt_histogram: Histogram = field(default_factory=Histogram)
    """every round trip measured by the hello exchange (the daemon exports it: the per-hop latency)"""
    last_hello: float = float("-inf")
    """when we last sent it a hello"""
    probed: bool = False
    """the hello back of a hello was late, and we sent another (`NeighbourTable.check_late`)"""
    overdue: bool = False
    """up, but the hello backs of two hellos in a row are late (`NeighbourTable.check_late`): the mesh lets a
    standby parent carry publications beside it until it answers or goes down"""
    quiet_until: float = float("-inf")
    """not watched for late hello backs before this (it gave a false alarm lately)"""


HELLO_WINDOW = 64
"""hellos remembered for their answers: a hello back to an older one is stale"""


class NeighbourTable:
    def __init__(self, configured: list[Address], max_neighbours: int) -> None:
        self.max_neighbours = max_neighbours
        self._by_transport: dict[Address, Neighbour] = {
            address: Neighbour(address, configured=True) for address in sorted(set(configured))
        }
        self._ordered: list[Neighbour] | None = None
        """`all()`, until the table changes"""
        self.refused = 0
        """dynamic neighbours refused because the table was full"""
        self.forgotten = 0
        """dynamic neighbours forgotten because they never came up"""
        self._up_by_announced: dict[Address, Address] = {}
        self.hello_seq = 0
        """the seq of our latest hello (one sequence for all neighbours)"""
        self.hellos_sent: dict[int, tuple[Address, float]] = {}
        """our last HELLO_WINDOW hellos: seq -> (neighbour, when sent). A hello back is timed from here, not from
        the time it echoes: a forged echo would poison the round trip, and with it timeouts and claims"""

    def get(self, transport: Address) -> Neighbour | None:
        return self._by_transport.get(transport)

    def add_dynamic(self, transport: Address, now: float = 0.0) -> Neighbour | None:
        """A peer that said hello first; None when the table is full. One that never comes up (never
        answers our hello) is forgotten by `expire` after the dead interval, so fake sources cannot keep
        the table full."""
        if len(self._by_transport) >= self.max_neighbours:
            self.refused += 1
            return None
        neighbour = Neighbour(transport, configured=False)
        neighbour.extra["added_at"] = now
        self._by_transport[transport] = neighbour
        self._ordered = None
        return neighbour

    def remove(self, transport: Address) -> None:
        self._by_transport.pop(transport, None)
        self._ordered = None
        self._reindex()

    def set_configured(self, wanted: Iterable[Address]) -> tuple[list[Neighbour], list[Neighbour]]:
        """The configured neighbours are now `wanted` (the embedder reloaded its configuration): those not in the
        table are added, a dynamic one listed now becomes configured (keeping what was measured of it), and the
        configured ones not listed any more become dynamic. Returns (added, no longer configured), for the node to
        greet the first and take the second down."""
        listed = set(wanted)
        added = []
        for transport in sorted(listed):
            neighbour = self._by_transport.get(transport)
            if neighbour is None:
                neighbour = self._by_transport[transport] = Neighbour(transport, configured=True)
                self._ordered = None
                added.append(neighbour)
            neighbour.configured = True
        unlisted = [n for n in self.all() if n.configured and n.transport not in listed]
        for neighbour in unlisted:
            neighbour.configured = False
        return added, unlisted

    def take_down(self, neighbour: Neighbour) -> None:
        """Mark an up neighbour down at once, as `expire` does after its silence, but not counted as a flap: the
        embedder no longer lists it."""
        neighbour.up = False
        neighbour.overdue = neighbour.probed = False
        neighbour.quiet_until = float("-inf")
        neighbour.up_since = None
        self._reindex()

    def all(self) -> list[Neighbour]:
        """Every neighbour, in transport order (kept until the table changes: asked for by every flood)."""
        ordered = self._ordered
        if ordered is None:
            ordered = self._ordered = [self._by_transport[key] for key in sorted(self._by_transport)]
        return ordered

    def up(self) -> list[Neighbour]:
        return [n for n in self.all() if n.up and n.announced is not None]

    def record_back(self, neighbour: Neighbour, rtt: float, peer_clock_offset: float, alpha: float,
                    now: float) -> bool:
        """Account for a valid hello back; return True when the neighbour just came up."""
        neighbour.last_back = now
        neighbour.probed = neighbour.overdue = False
        neighbour.rtt = rtt if neighbour.rtt is None else (1 - alpha) * neighbour.rtt + alpha * rtt
        neighbour.rtt_histogram.observe(rtt)
        neighbour.clock_samples.append((rtt, peer_clock_offset))
        fastest_rtt, neighbour.clock_offset = min(neighbour.clock_samples, key=lambda sample: sample[0])
        neighbour.clock_error = fastest_rtt / 2
        if not neighbour.up:
            neighbour.up = True
            neighbour.up_since = now
            self._reindex()
            return True
        return False

    def record_echo(self, neighbour: Neighbour, now: float) -> None:
        """Another echo of our traffic (a matching `ta`): an up neighbour stays up, as after a hello back."""
        if neighbour.up:
            neighbour.last_back = max(neighbour.last_back, now)

    # ------------------------------------------------------------ late hello backs (a hint, not liveness)

    def hello_sent(self, neighbour: Neighbour, now: float) -> int:
        """A hello to `neighbour` goes out now: its seq."""
        self.hello_seq += 1
        sent = self.hellos_sent
        sent[self.hello_seq] = (neighbour.transport, now)
        sent.pop(self.hello_seq - HELLO_WINDOW, None)
        neighbour.last_hello = now
        return self.hello_seq

    def hello_answered(self, neighbour: Neighbour, seq: int, echoed_sent_at: float) -> float | None:
        """When we sent the hello a hello back from `neighbour` answers (it must echo the seq and send time of
        one of our last HELLO_WINDOW hellos to it, and only its first answer counts); None for a stale one."""
        if self.hellos_sent.get(seq) != (neighbour.transport, echoed_sent_at):
            return None
        del self.hellos_sent[seq]  # one answer each: a replayed or forged second one is stale
        return echoed_sent_at

    @staticmethod
    def overdue_after(neighbour: Neighbour, hello_interval: float) -> float:
        """How long after a hello its hello back is late: a quarter of the hello interval, or 4 round trips if
        more (a hello back waits behind nothing: hellos are handled ahead of the data)."""
        return max(hello_interval / 4, 4 * (neighbour.rtt or 0.0))

    def _awaited(self, watched: Collection[Address], now: float) -> list[Neighbour]:
        """The up neighbours among `watched` (announced addresses) whose answer to our last hello is awaited,
        not marked late already, and not given a false alarm lately."""
        by_transport = self._by_transport
        found = []
        for announced in sorted(watched):
            transport = self._up_by_announced.get(announced)
            neighbour = by_transport.get(transport) if transport is not None else None
            if neighbour is not None and not neighbour.overdue and neighbour.last_hello > neighbour.last_back \
                    and now >= neighbour.quiet_until:
                found.append(neighbour)
        return found

    def next_overdue(self, hello_interval: float, watched: Collection[Address], now: float) -> float | None:
        """When the hello back of the next of the `watched` neighbours becomes late (None: none is awaited)."""
        if not watched:
            return None
        deadlines = [n.last_hello + self.overdue_after(n, hello_interval) for n in self._awaited(watched, now)]
        return min(deadlines) if deadlines else None

    def check_late(self, hello_interval: float, now: float, watched: Collection[Address],
                   quiet: float) -> tuple[list[Neighbour], bool]:
        """The `watched` up neighbours whose hello back is late: those not probed yet are returned, to be sent a
        hello at once (a lost datagram is not a failure); those whose probe is late too are marked `overdue`
        (True when one was). One that then answers after all gave a false alarm: it is not watched for `quiet`
        seconds (a lossy link)."""
        probe, marked = [], False
        for neighbour in self._awaited(watched, now):
            if now >= neighbour.last_hello + self.overdue_after(neighbour, hello_interval):
                if neighbour.probed:
                    neighbour.overdue = marked = True
                    neighbour.quiet_until = now + quiet  # in effect once it answers (`record_back`)
                else:
                    neighbour.probed = True
                    probe.append(neighbour)
        return probe, marked

    def is_overdue(self, announced: Address) -> bool:
        """Is the up neighbour announcing `announced` late with its hello back?"""
        transport = self._up_by_announced.get(announced)
        neighbour = self._by_transport.get(transport) if transport is not None else None
        return neighbour is not None and neighbour.overdue

    def clock_report(self) -> dict[str, dict[str, Any]]:
        """Per up neighbour (transport address): smoothed `rtt`, clock `offset` and its `error` bound, seconds."""
        return {
            str(n.transport): {"rtt": round(n.rtt, 6), "offset": round(n.clock_offset, 6),
                               "error": round(n.clock_error, 6)}
            for n in self.up() if n.rtt is not None and n.clock_offset is not None and n.clock_error is not None
        }

    def _reindex(self) -> None:
        self._up_by_announced = {
            n.announced.address: n.transport for n in self.all() if n.up and n.announced is not None
        }

    def expire(self, dead_after: float, now: float) -> list[Neighbour]:
        """Mark neighbours down whose last hello back is too old; return them."""
        gone = []
        for neighbour in self.all():
            if not neighbour.configured and not neighbour.up and neighbour.up_since is None and \
                    neighbour.flaps == 0 and now >= neighbour.extra.get("added_at", now) + dead_after:
                del self._by_transport[neighbour.transport]  # said hello, never answered ours
                self._ordered = None
                self.forgotten += 1
                continue
            if neighbour.up and now >= neighbour.last_back + dead_after:
                neighbour.up = False
                neighbour.overdue = neighbour.probed = False
                neighbour.quiet_until = float("-inf")  # the alarm was right
                neighbour.up_since = None
                neighbour.flaps += 1
                gone.append(neighbour)
        if gone:
            self._reindex()
        return gone

    def next_deadline(self, dead_after: float) -> float | None:
        deadlines = [n.last_back + dead_after for n in self._by_transport.values() if n.up]
        return min(deadlines) if deadlines else None

    def set_announced(self, neighbour: Neighbour, announced: BrokerId) -> bool:
        """Record the id a neighbour announces; True when it changed (a restart or a new vid)."""
        if neighbour.announced == announced:
            return False
        neighbour.announced = announced
        self._reindex()
        return True

    @property
    def up_index(self) -> dict[Address, Address]:
        """Announced address -> transport of every up neighbour. Never changed in place, only replaced, so
        a cache may keep it and compare identity (`federation.protocol.forwarding`)."""
        return self._up_by_announced

    def transport_for(self, announced: Address) -> Address | None:
        """Where to send to the up neighbour that announces `announced`."""
        return self._up_by_announced.get(announced)
