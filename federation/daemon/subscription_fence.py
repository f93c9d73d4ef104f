"""Publications that match no subscription the wrapper knows yet, held until it has read its broker up to a fence.

Theory of operation
-------------------
The wrapper learns its broker's subscriptions from the broker's log (federation.daemon.broker_log), and under load
its reading lags the broker by over a second (issue 36's churn: 129 of 25,970 probes missed, each one reaching the
subscriber's wrapper before it had read the subscribe line the broker logged before the client's SUBACK). A
publication that comes on a filter the broker federates and matches no subscription the wrapper has read may be for
such a client. So the node hands it over marked (`Node.hold_unmatched`, `Injection.unmatched_hops`) and
`UnmatchedHold` keeps it until a fence published after it arrived comes back on the broker connection; then the node
matches it again (`Node.settle_unmatched`): injected if a subscription was learnt meanwhile, else counted as not
subscribed here (`publications_not_subscribed`): what a covering filter brings to a broker where that device has no
subscriber (docs/protocol.md "Aggregation"), the normal case, so neither a drop nor an event.

The fence is a QoS 1 publication, empty, to a topic of the wrapper's own under `$federation/handover/<client id>/`
(the connection subscribes to those for the takeovers' fences, federation.daemon.roaming), published after the
publication arrived: the broker took every subscription made before that arrival earlier, so it queued their log
lines (QoS 1) to the wrapper before the fence (QoS 1), and delivers one client's QoS 1 messages in order; the
runtime hands the wrapper's log lines and fences to its loop in the order they were read. Not a PINGREQ: the broker
answers one at once, while it sends QoS 1 messages only as the wrapper's Receive Maximum (1,024 unacknowledged)
allows, so when the reading lags by more than that a PINGRESP overtakes the log lines it had to follow.

A fence covers every publication held before it was published, so one is published for all that arrived since the
last, and no sooner than `FENCE_SPACING` after it: while unmatched publications keep coming, at most one fence per
`FENCE_SPACING` (four packets and a few log lines each), none otherwise; each such publication waits for the log's
lag and `FENCE_SPACING` at most. With one fence in flight at a time, one that arrived just after a fence was
published waited for two lags: under the churn of issue 36 (a lag of 2-3 s at times) that made probes arrive after
their subscriber had left. Order: a later injection of a held publication's stream
(origin, filter) waits behind it (it matched: it is not matched again). Bounds: beyond `MAX_HELD` held or
`MAX_HELD_BYTES`, the oldest is settled at once with what the wrapper knows (dropped `unmatched_hold_full` if still
unmatched; one held only for its stream's order is injected); a fence not back within `FENCE_TIMEOUT` (a broker whose
ACL refuses the fence topic, a lost connection) settles what waited for it the same way (`unmatched_fence_timeout`).

Sans-I/O: time comes in as arguments, the node's settling as a callable; the runtime publishes the fences and reads
them back (federation.daemon.running).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from federation.protocol import events
from federation.protocol.types import Address, Injection, InjectionRun

MAX_HELD = 10000
"""publications (a run's each) held at most; beyond, the oldest is settled at once"""
MAX_HELD_BYTES = 64 * 1024 * 1024
"""and payload bytes"""
FENCE_TIMEOUT = 10.0
"""seconds a fence may take to come back before what waits for it is settled without it: well above the log's lag
under load (1.5 s measured), so a slow reading is waited for"""
FULL_REASON = "unmatched_hold_full"
TIMEOUT_REASON = "unmatched_fence_timeout"
FENCE_SPACING = 0.1
"""seconds at least between two fences"""
FENCE_NAME = "subscriptions-"
"""a fence's topic is the connection's fence prefix, this and its number (the takeovers' are `<pid>-<n>`)"""

Made = Injection | InjectionRun
Stream = tuple[Address, str | None]
Settle = Callable[[Injection, float, bool], bool]
"""`Node.settle_unmatched`: True to inject a marked injection (a subscription matches it now)"""


class DropReport(Protocol):
    """How a dropped publication is counted and evented (`Node.drop`)."""

    def __call__(self, reason: str, /, count: int = 1, *, event: str | None = None, now: float = 0.0,
                 **fields: Any) -> None: ...


def _stream(item: Made) -> Stream:
    if type(item) is InjectionRun:
        return item.origin, item.filter
    return item.publication[0], item.filter  # type: ignore[union-attr]  # an Injection


def _size(item: Made) -> int:
    if type(item) is InjectionRun:
        return sum(map(len, item.payloads))
    return len(item.payload)  # type: ignore[union-attr]  # an Injection


def _marked(item: Made) -> bool:
    return type(item) is Injection and item.unmatched_hops is not None


@dataclass(slots=True)
class _Held:
    item: Made
    fence: int
    """the fence it waits for (0: none, it waits only for its stream's order)"""
    stream: Stream
    size: int


class UnmatchedHold:
    """The marked injections and those of their streams behind them, and the fences (module docstring)."""

    def __init__(self, settle: Settle, drop: DropReport, max_held: int = MAX_HELD,
                 max_held_bytes: int = MAX_HELD_BYTES, timeout: float = FENCE_TIMEOUT,
                 spacing: float = FENCE_SPACING) -> None:
        self.settle = settle
        self.drop = drop
        self.spacing = spacing
        self.max_held = max_held
        self.max_held_bytes = max_held_bytes
        self.timeout = timeout
        self._held: deque[_Held] = deque()
        self._streams: Counter[Stream] = Counter()
        """stream -> how many of `_held` are of it"""
        self.held_count = 0
        """publications held (a run counts its publications)"""
        self.held_bytes = 0
        self.published = 0
        """the number of the last fence published"""
        self.read = 0
        """the number of the last fence read back (or given up on)"""
        self._unread: deque[tuple[int, float]] = deque()
        """(number, published at) of the fences published and not read back, oldest first"""
        self._uncovered = False
        """a publication is held that no fence published yet covers"""
        self.fences = 0
        self.timeouts = 0
        self.injected = 0
        """marked injections a fence found a subscriber for"""
        self.not_subscribed = 0
        self.dropped = 0

    @property
    def holding(self) -> bool:
        return bool(self._held)

    @property
    def in_flight(self) -> bool:
        return bool(self._unread)

    def admit(self, made: list[Made], now: float) -> list[Made]:
        """The node's injections (and runs) that go on now, in order: the marked ones are held, and with them any
        later one of a stream that has one held; beyond the bounds, the oldest are settled (and given first)."""
        if not self._held and not any(type(item) is Injection and item.unmatched_hops is not None for item in made):
            return made  # the common case, once per pass: no copy
        out: list[Made] = []
        streams = self._streams
        for item in made:
            stream = _stream(item)
            if _marked(item):
                self._add(_Held(item, self.published + 1, stream, _size(item)))
                self._uncovered = True
            elif streams[stream]:
                self._add(_Held(item, 0, stream, _size(item)))
            else:
                out.append(item)
        if self.held_count <= self.max_held and self.held_bytes <= self.max_held_bytes:
            return out
        overflowed: list[Made] = []
        while self.held_count > self.max_held or self.held_bytes > self.max_held_bytes:
            oldest = self._held.popleft()
            self._forget(oldest)
            self._settle(oldest, now, FULL_REASON, overflowed)
        return overflowed + self._release(now, None) + out  # and what waited only behind those, in order

    def _add(self, held: _Held) -> None:
        self._held.append(held)
        self._streams[held.stream] += 1
        self.held_count += len(held.item.seqs) if type(held.item) is InjectionRun else 1
        self.held_bytes += held.size

    def _forget(self, held: _Held) -> None:
        streams = self._streams
        streams[held.stream] -= 1
        if not streams[held.stream]:
            del streams[held.stream]
        self.held_count -= len(held.item.seqs) if type(held.item) is InjectionRun else 1
        self.held_bytes -= held.size

    def _settle(self, held: _Held, now: float, reason: str | None, out: list[Made]) -> None:
        """`reason`: why it is settled without its fence (None: the fence came back)."""
        item = held.item
        if isinstance(item, InjectionRun) or item.unmatched_hops is None:
            out.append(item)  # held for its stream's order only
        elif self.settle(item, now, reason is None):
            self.injected += 1
            out.append(replace(item, unmatched_hops=None))
        elif reason is None:
            self.not_subscribed += 1
        else:
            self.dropped += 1
            self.drop(reason, event=events.PUBLICATION_DROPPED, now=now, pub=events.publication_text(item.publication),
                      filter=item.filter, reason=reason)

    def fence_due(self, now: float) -> float | None:
        """When the next fence is to be published (None: nothing held waits for one not published yet)."""
        if not self._uncovered:
            return None
        if not self._unread:
            return now
        return max(now, self._unread[-1][1] + self.spacing)

    def fence_to_publish(self, now: float) -> int | None:
        """The number of a fence to publish now, if one is due (`fence_due`)."""
        due = self.fence_due(now)
        if due is None or due > now:
            return None
        return self._publish(now)

    def _publish(self, now: float) -> int:
        self.published += 1
        self._unread.append((self.published, now))
        self._uncovered = False
        self.fences += 1
        return self.published

    def republish(self, now: float) -> int | None:
        """The broker connection is back: the fences in flight may be lost with the old one; a new one, published
        after everything held arrived, covers it all (None when nothing waits)."""
        if not self._unread and not self._uncovered:
            return None
        self._unread.clear()
        return self._publish(now)

    def fence_read(self, number: int, now: float) -> list[Made]:
        """Fence `number` came back: the wrapper has read every subscription its broker took before it. What it
        releases, settled, in order (a stream's held ones stay behind the first one still waiting)."""
        if number <= self.read or number > self.published:
            return []  # one given up on, or of an earlier run
        self.read = number
        unread = self._unread
        while unread and unread[0][0] <= number:
            unread.popleft()
        return self._release(now, None)

    def tick(self, now: float) -> list[Made]:
        """Once a second: a fence in flight for longer than `timeout` is given up on; what waited for it is settled
        with what the wrapper knows, in order."""
        if not self._unread or now - self._unread[0][1] < self.timeout:
            return []
        self.read = self.published  # the later ones went the same way
        self._unread.clear()
        self.timeouts += 1
        return self._release(now, TIMEOUT_REASON)

    def _release(self, now: float, reason: str | None) -> list[Made]:
        out: list[Made] = []
        kept: deque[_Held] = deque()
        blocked: set[Stream] = set()
        read = self.read
        for held in self._held:
            if held.fence > read or held.stream in blocked:
                blocked.add(held.stream)
                kept.append(held)
                continue
            self._forget(held)
            self._settle(held, now, reason, out)
        self._held = kept
        return out

    def status(self) -> dict[str, object]:
        return {"held": self.held_count, "held_bytes": self.held_bytes, "fence_in_flight": self.in_flight,
                "fences": self.fences, "fence_timeouts": self.timeouts, "injected": self.injected,
                "not_subscribed": self.not_subscribed, "dropped": self.dropped}


def fence_number(topic: str, prefix: str) -> int | None:
    """The number of an unmatched hold's fence topic (`prefix` + `FENCE_NAME` + number), None for another topic."""
    if not topic.startswith(prefix):
        return None
    number = topic[len(prefix):]
    return int(number) if number.isdigit() else None
