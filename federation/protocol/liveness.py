"""The hello exchange that tells which neighbours are up (docs/protocol.md rule 1), as the node runs it.

`NeighbourTable` (federation.protocol.neighbours) keeps what the exchange
measured; this part sends the hellos and reads their answers: a hello to
every neighbour each hello interval (jittered, so neighbours do not fall
into step), a hello back for every hello received (and a hello of ours at
once to a neighbour that is not up yet, so a link comes up in one round
trip), a probe to a watched data parent whose answer is late, and the
neighbours that went silent too long. It says what happened (`HelloBack`
answered, `down`) and emits the neighbour events; what a neighbour
coming up or going down means for the other parts is the node's to
compose.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass

from federation.protocol import events, wire
from federation.protocol.context import Outbox
from federation.protocol.events import id_text
from federation.protocol.neighbours import Neighbour, NeighbourTable
from federation.protocol.settings import Settings
from federation.protocol.types import Address
from federation.protocol.wire_types import Hello, HelloBack


@dataclass(frozen=True, slots=True)
class Answered:
    """A hello back that echoed one of our hellos."""

    was_overdue: bool
    """the neighbour's answers were late before this one"""
    came_up: bool
    """the link is up from now on (`rtt` measured it)"""
    rtt: float


class Liveness:
    """Hellos out, hello backs in, silence timed; the measurements kept in the `NeighbourTable`."""

    def __init__(self, settings: Settings, neighbours: NeighbourTable, outbox: Outbox, rng: random.Random) -> None:
        self.settings = settings
        self.neighbours = neighbours
        self.outbox = outbox
        self.rng = rng
        self.next_hello = float("inf")
        """when the hellos go to every neighbour next"""

    def send_all(self, now: float) -> None:
        for neighbour in self.neighbours.all():
            self.send(neighbour, now)
        # A little jitter keeps neighbours from synchronising their hellos.
        self.next_hello = now + self.settings.hello_interval * (0.9 + 0.1 * self.rng.random())

    def send(self, neighbour: Neighbour, now: float) -> None:
        seq = self.neighbours.hello_sent(neighbour, now)
        self.outbox.send(wire.HELLO, Hello(seq, now), [neighbour.transport])

    def answer(self, hello: Hello, neighbour: Neighbour, now: float) -> None:
        """A hello from `neighbour`: its hello back, and ours at once while the link is not up."""
        self.outbox.send(wire.HELLO_BACK, HelloBack(hello.seq, hello.sent_at, now), [neighbour.transport])
        if not neighbour.up:
            self.send(neighbour, now)  # answer at once: the link comes up in one round trip

    def answered(self, neighbour: Neighbour, body: HelloBack, now: float) -> Answered | None:
        """A hello back: the round trip and clock offset measured; None (counted) when it echoes no hello of
        ours still waiting. A link that comes up is emitted (`NEIGHBOUR_UP`)."""
        sent_at = self.neighbours.hello_answered(neighbour, body.echo_seq, body.echo_sent_at)
        if sent_at is None:
            self.outbox.drop("stale_hello_back")
            return None
        rtt = now - sent_at
        offset = body.replied_at - (sent_at + rtt / 2)
        was_overdue = neighbour.overdue
        came_up = self.neighbours.record_back(neighbour, rtt, offset, self.settings.rtt_smoothing, now)
        if came_up:
            assert neighbour.announced is not None
            self.outbox.emit(events.NEIGHBOUR_UP, now, neighbour=str(neighbour.transport),
                             neighbour_id=id_text(neighbour.announced), rtt=round(rtt, 6),
                             clock_offset=round(offset, 6), clock_error=round(rtt / 2, 6))
        return Answered(was_overdue, came_up, rtt)

    def down(self, neighbour: Neighbour, now: float) -> None:
        """A neighbour silent for `neighbour_dead_after` (`NeighbourTable.expire`) is down: emitted, and forgotten
        when it was not configured."""
        self.outbox.emit(events.NEIGHBOUR_DOWN, now, neighbour=str(neighbour.transport),
                         neighbour_id=id_text(neighbour.announced))
        if not neighbour.configured:
            self.neighbours.remove(neighbour.transport)

    def probe_late(self, now: float, watched: Collection[Address]) -> bool:
        """Ask again the watched neighbours one hello back late; True when one is late twice (rule 6)."""
        probe, late = self.neighbours.check_late(self.settings.hello_interval, now, watched,
                                                 self.settings.announcement_lifetime)
        for neighbour in probe:
            self.send(neighbour, now)  # one hello back late: ask again before calling it late
        return late

    def deadlines(self, watched: Collection[Address], last_input_at: float) -> tuple[float | None, float | None]:
        """When a neighbour may be found silent next, and a watched one late (None: no such time); the hellos'
        own time is `next_hello`."""
        neighbours, settings = self.neighbours, self.settings
        return (neighbours.next_deadline(settings.neighbour_dead_after),
                neighbours.next_overdue(settings.hello_interval, watched, last_input_at))
