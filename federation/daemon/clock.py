"""The wrapper's clock: unix time that never steps backwards.

Theory of operation: the node's clock is unix time, so event traces from
different machines line up, but the node must never see time run backwards.
`Clock` reads wall time once at start and adds monotonic time elapsed since:
a wall-clock step (NTP, an operator) after start does not reach the node; the
cost is that the event times of a long run drift from the wall clock by any
step made after start.
"""

from __future__ import annotations

import time

CLOCK_ANCHOR_TRIES = 5
"""bracketed (monotonic, wall, monotonic) reads at start; the tightest one anchors the clock"""


class Clock:
    """Unix time that never steps backwards: wall time at start plus monotonic time elapsed.

    The wall reading is paired with the monotonic midpoint of the tightest of a few bracketed reads: a
    preemption between two plain reads would shift this wrapper's clock from its neighbours' on the same
    host by the time it was off the CPU, and the event-log clock correction would see a real offset."""

    def __init__(self) -> None:
        best: tuple[float, float, float] | None = None
        for _ in range(CLOCK_ANCHOR_TRIES):
            before = time.monotonic()
            wall = time.time()
            after = time.monotonic()
            if best is None or after - before < best[0]:
                best = (after - before, wall, (before + after) / 2)
        assert best is not None
        _, self._wall_start, self._monotonic_start = best

    def now(self) -> float:
        return self._wall_start + (time.monotonic() - self._monotonic_start)
