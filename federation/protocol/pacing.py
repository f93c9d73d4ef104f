"""Pacing of QoS 0 publications between neighbouring wrappers: the `rb` (receiver busy) packet.

Theory of operation
-------------------
QoS 1/2 copies are acknowledged hop by hop, so a wrapper that runs ahead of
the next one stops at its window (docs/daemon.md "Overload"). QoS 0 copies
have no acknowledgement: a wrapper that reads its broker faster than the
next wrapper can handle `tm` fills that wrapper's receive backlog, which
then drops the oldest QoS 0 copies, and under a sustained flood most of
them. `rb` is the missing feedback, best effort and cheap:

- *Busy.* The embedder reports its receive backlog after every read. From
  when it reaches `high` until it falls to `low` the node is busy, and tells
  each neighbour whose `tm` it queues `rb` with a `hold` (seconds), at most
  once per half hold per neighbour: while busy, a neighbour that resumes
  after its hold is told again by the first `tm` it sends.
- *Paced.* A node told `rb` is paced by that neighbour until the hold ends
  or the neighbour says it is ready (`rb` with hold 0). The embedder reads
  no publications from its broker while paced, so the flood waits in the
  broker's queue, as it does for a bridge whose TCP connection is full.
- *Relayed.* A node that forwards a neighbour's `tm` to a neighbour pacing
  it tells the upstream one `rb` too (same limit), so the pace reaches the
  wrapper that reads the publications from its broker, however many hops
  back. Only upstream neighbours whose copies go to a pacing one are told.
- *Ready.* When a node is neither busy nor paced any more, it tells every
  neighbour it told `rb` that it is ready, so they read again at once
  rather than at the end of their hold.

A lost `rb` costs the drops it would have saved; a lost ready costs at
most one hold. A node that does not know `rb` drops it as an unknown type
and is never paced: mixed versions only lose the pacing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from federation.protocol.types import Address

PACE_HIGH = 5000
"""receive backlog (packets) at which a node becomes busy: a quarter of the daemon's bound (20,000), so
the `rb` has time to work before anything is dropped"""
PACE_LOW = 1000
"""receive backlog at which a busy node is ready again: enough left to work on while its neighbours
start sending again"""
PACE_HOLD = 0.2
"""seconds a paced neighbour waits before reading its broker again, unless told ready sooner"""
MAX_PACE_HOLD = 5.0
"""longest hold taken from a neighbour's `rb` (a larger one is cut to this): a peer that stops sending
`rb` (it crashed, or the link broke) releases the wrapper within it"""


class Pacing:
    """One node's receiver-busy state, the neighbours pacing it, and the neighbours it told."""

    __slots__ = ("_send", "high", "low", "hold", "busy", "paced_until", "told", "sent", "received")

    def __init__(self, send: Callable[[Address, float], None], high: int = PACE_HIGH, low: int = PACE_LOW,
                 hold: float = PACE_HOLD) -> None:
        if not 0 <= low < high:
            raise ValueError(f"pacing marks: need 0 <= low < high, got low {low}, high {high}")
        self._send = send
        """sends `rb` with a hold (0: ready) to a neighbour's transport address"""
        self.high = high
        self.low = low
        self.hold = hold
        self.busy = False
        """our receive backlog went over `high` and has not yet fallen to `low`"""
        self.paced_until: dict[Address, float] = {}
        """neighbour transport -> end of the hold it asked for (kept empty when nothing paces us: one
        truth test on the data path). Changed in place, never replaced: the mesh engine reads it to say
        whether a publication went to a neighbour pacing us (`forwarding.Routed.SENT_TO_PACED`)"""
        self.told: dict[Address, float] = {}
        """neighbour transport -> when we last told it `rb` with a hold"""
        self.sent = 0
        """`rb` packets sent (busy and ready)"""
        self.received = 0

    # ------------------------------------------------------------ receiving side

    def on_receive_backlog(self, length: int, sources: Iterable[Address], now: float) -> None:
        """The embedder's receive backlog holds `length` packets after a read that queued `tm` from
        `sources` (empty after a pass that only handled some)."""
        if self.busy:
            if length <= self.low:
                self.busy = False
                self._maybe_ready()
                return
        elif length >= self.high:
            self.busy = True
        else:
            return
        for source in sources:
            self._tell(source, now)

    # ------------------------------------------------------------ sending side

    def on_receiver_busy(self, neighbour: Address, hold: float, now: float) -> None:
        """A neighbour's `rb`: stop sending it new publications for `hold` seconds (0: it is ready)."""
        self.received += 1
        if hold > 0:
            self.paced_until[neighbour] = now + min(hold, MAX_PACE_HOLD)
        elif self.paced_until.pop(neighbour, None) is not None:
            self._maybe_ready()

    def paced(self, now: float) -> float | None:
        """The end of the longest hold on us, or None when no neighbour paces us (expired holds go)."""
        paced_until = self.paced_until
        if not paced_until:
            return None
        for neighbour in [n for n, until in paced_until.items() if until <= now]:
            del paced_until[neighbour]
        if paced_until:
            return max(paced_until.values())
        self._maybe_ready()
        return None

    def relay(self, upstream: Address, now: float) -> None:
        """We forwarded `upstream`'s `tm` to a neighbour pacing us: pace `upstream` too."""
        self._tell(upstream, now)

    def forget(self, neighbour: Address) -> None:
        """The neighbour went down: its hold on us ends, and it needs no ready."""
        self.told.pop(neighbour, None)
        if self.paced_until.pop(neighbour, None) is not None:
            self._maybe_ready()

    # ------------------------------------------------------------ both

    def _tell(self, neighbour: Address, now: float) -> None:
        last = self.told.get(neighbour)
        if last is not None and now - last < self.hold / 2:
            return
        self.told[neighbour] = now
        self.sent += 1
        self._send(neighbour, self.hold)

    def _maybe_ready(self) -> None:
        if self.busy or self.paced_until or not self.told:
            return
        for neighbour in self.told:
            self.sent += 1
            self._send(neighbour, 0.0)
        self.told.clear()
