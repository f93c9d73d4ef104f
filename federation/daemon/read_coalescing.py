"""When to let the broker's packets gather before the wrapper reads them again.

Theory of operation: a read pass has a fixed cost (the event loop's
wake-up, the hand-off to the node, one datagram out per filter and hop, the
receiving wrapper's pass over that datagram) on top of its cost per
packet, and at full rate the fixed part is most of it. In one process
(`hotpath`) the two wrappers' QoS 0 path costs 10.4 µs per publication in
passes of 16 and 3.0 in passes of 256; in a flood the sending wrapper's
passes took about 45, and both wrappers spent 7.7 µs per publication
(docs/benchmarks/history.md, "Seventh pass"). So once the broker sends faster than
`min_rate` packets a second, in passes of at least `min_packets`, the
adapter stops watching its socket for `seconds` after each pass that
emptied it: the next pass takes what gathered meanwhile. This is interrupt
coalescing as network cards do it: it costs up to `seconds` of latency,
only at those rates. Below them no pass waits, whatever it read (the
benchmark's latency rates, 1,000 and 10,000 a second, are below).

The rate is measured from the start of one pass to the start of the next,
wait included, so a wait does not feed itself: after it the pass is larger,
but so is the time it covers, and the waits stop as soon as the broker
sends less than `min_rate`.

Sans-I/O: the broker connection's read side (federation/daemon/broker_reading.py)
passes the loop's time and what each pass read, and does the waiting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_SECONDS = 0.002
"""the wait after a pass, at full rate; the event loop's epoll sleeps whole milliseconds"""
MAX_SECONDS = 0.05
"""the longest wait the configuration accepts (`broker_read_coalesce`)"""
MIN_RATE = 20_000.0
"""packets a second from the broker below which passes never wait: well above the rates whose latency the
benchmark reports (1,000 and 10,000 a second), under a federation's full rate (about 50,000 at QoS 0)"""
MIN_PACKETS = 16
"""packets a pass must have read to be followed by a wait: a pass of a few packets close after the previous one is
a burst, not a rate"""


@dataclass
class ReadCoalescing:
    """The wait after each read pass (`after_pass`); `seconds` 0 turns it off."""

    seconds: float = DEFAULT_SECONDS
    min_rate: float = MIN_RATE
    min_packets: int = MIN_PACKETS
    waits: int = 0
    """passes followed by a wait so far"""
    _last_start: float | None = field(default=None, repr=False)

    def after_pass(self, started: float, read: int, emptied: bool) -> float:
        """Seconds to wait before the next pass, for a pass that began at `started` (the loop's clock), read
        `read` packets and stopped because the socket was empty (`emptied`; False: it stopped at its budget, and
        more is waiting now). 0: read again as soon as the socket is readable."""
        last, self._last_start = self._last_start, started
        if not self.seconds or not emptied or read < self.min_packets or last is None:
            return 0.0
        interval = started - last
        if interval > 0 and read < self.min_rate * interval:
            return 0.0
        self.waits += 1
        return self.seconds
