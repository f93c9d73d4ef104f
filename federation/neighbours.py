"""Neighbour liveness from the hello (`hl`) / hello back (`hb`) exchange.

A neighbour is *up* while hello backs keep arriving: an `hb` echoes one of
our own hellos, so it proves both directions work (a one-way cut takes the
link down on both ends). It is *down* after `dead_intervals` hello intervals
without one. The echo also gives the round-trip time and an estimate of the
peer's clock offset (offset = peer_clock - our_clock, error at most RTT/2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from federation.types import Address, BrokerId


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
    up_since: float | None = None
    flaps: int = 0
    extra: dict[str, float] = field(default_factory=dict)


class NeighbourTable:
    def __init__(self, configured: list[Address], max_neighbours: int) -> None:
        self.max_neighbours = max_neighbours
        self._by_transport: dict[Address, Neighbour] = {
            address: Neighbour(address, configured=True) for address in sorted(set(configured))
        }
        self.refused = 0
        self._up_by_announced: dict[Address, Address] = {}

    def get(self, transport: Address) -> Neighbour | None:
        return self._by_transport.get(transport)

    def add_dynamic(self, transport: Address) -> Neighbour | None:
        """A peer that said hello first; None when the table is full."""
        if len(self._by_transport) >= self.max_neighbours:
            self.refused += 1
            return None
        neighbour = Neighbour(transport, configured=False)
        self._by_transport[transport] = neighbour
        return neighbour

    def remove(self, transport: Address) -> None:
        self._by_transport.pop(transport, None)
        self._reindex()

    def all(self) -> list[Neighbour]:
        return [self._by_transport[key] for key in sorted(self._by_transport)]

    def up(self) -> list[Neighbour]:
        return [n for n in self.all() if n.up and n.announced is not None]

    def record_back(self, neighbour: Neighbour, rtt: float, peer_clock_offset: float, alpha: float,
                    now: float) -> bool:
        """Account for a valid hello back; return True when the neighbour just came up."""
        neighbour.last_back = now
        neighbour.rtt = rtt if neighbour.rtt is None else (1 - alpha) * neighbour.rtt + alpha * rtt
        if neighbour.clock_offset is None or neighbour.rtt is None or rtt <= neighbour.rtt:
            # The sample from the fastest exchange has the smallest error bound.
            neighbour.clock_offset = peer_clock_offset
        if not neighbour.up:
            neighbour.up = True
            neighbour.up_since = now
            self._reindex()
            return True
        return False

    def _reindex(self) -> None:
        self._up_by_announced = {
            n.announced.address: n.transport for n in self.all() if n.up and n.announced is not None
        }

    def expire(self, dead_after: float, now: float) -> list[Neighbour]:
        """Mark neighbours down whose last hello back is too old; return them."""
        gone = []
        for neighbour in self.all():
            if neighbour.up and now >= neighbour.last_back + dead_after:
                neighbour.up = False
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

    def transport_for(self, announced: Address) -> Address | None:
        """Where to send to the up neighbour that announces `announced`."""
        return self._up_by_announced.get(announced)
