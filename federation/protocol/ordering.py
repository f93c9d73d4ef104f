"""The receiver's order: publications of one origin on one filter injected in the order the origin sent them.

Theory of operation
-------------------
MQTT promises a subscriber the publications of one publisher on one topic in
the order they were published. The federation carries a publication over
per-filter meshes, copies retransmitted, rerouted and held on the way, so
two of them can arrive the wrong way round. The origin therefore writes into
every QoS 1/2 `tm` the publication it sent before on the same *stream*,
(origin, filter, QoS 1/2): `prev`, an (epoch, seq) pair, None for the first
it knows of (docs/protocol.md rule 7d). A receiver keeps, per stream, the
position it has passed (`Stream.last`) and injects a publication only once
its `prev` has been passed: one that comes early waits in the stream's
buffer until its predecessor arrives, or until the stream has not moved for
`reorder_timeout`, when the gap is skipped (counted, and reported as
`order_gap_skipped`): the buffer bounds the wait and the memory, never a
publication's delivery. A gap is not skipped while the stream's origin is
out of the table's reach, up to `receiver_hold`: the origin keeps the
publication for us (rule 7f) and it comes after the healing (a stream that
lost a copy just before a partition delivered it late otherwise); once the
origin is back the wait starts again. Routing is never delayed: a
publication is forwarded when it arrives; only its injection into the local
broker waits.

The wait counts from when the stream last moved, not from when the waiting
publication arrived: after a partition heals, the origin repairs what the
far side missed (rule 7f) oldest first while the mesh brings the newest; the
stream passes a repair after another, and a backlog that takes longer than
`reorder_timeout` to come is not skipped while it keeps coming. One stream
may fill the whole buffer (`reorder_max_stream` is `reorder_max` by
default): after a 30 s partition at 100 publications a second, 3,000 of an
origin's held publications can reach a receiver before the few a relay
held for it, and a bound of 1,000 skipped those few (they came 3 s late).
The buffer never refuses a publication: a refused copy stays in its
sender's table of unacknowledged copies, and a relay whose table fills with
them refuses the very copies that would fill the gap (tried: a healed ring
stalled for 30 s).

Why `prev` and not a counter per stream: a restarted origin replays what
its spool still holds with the original ids, but does not know how far its
streams had got; it sends the first replayed publication of each stream
without `prev`, which a receiver passes at once. That is safe because of
custody (federation.protocol.custody): a publication leaves the spool only
when every receiver has taken it, so whatever came before the first
replayed one on its stream is already passed everywhere, or is itself in
the replay ahead of it. The epoch is part of the position, so the stream
goes on across the origin's restarts.

A stream is followed from the first publication of it that a receiver would
inject (a local subscription matches it): relays that inject nothing keep
no state. A stream starts at the first publication seen (it is injected at
once), unless its first publication names a predecessor not seen: then it
waits for that one, `reorder_start` if the local interest in its topic is
recent (a new subscriber meets a stream mid-way: what came before was never
meant for it) and `reorder_timeout` if it is older than that (an established
subscriber meeting a stream it does not know yet: what came before is on
its way); a node restored after a restart (`Node.restore`) counts as
established. One that arrives later with an earlier position is injected at
once too (counted `order_late`): an earlier publication is never lost for
being late. Every later publication of the stream passes through it, injected
here or not, so the chain of `prev` has no holes made by topics nobody here
subscribed to.

QoS 0 streams never wait: a QoS 0 publication older than the last one
injected from its stream is dropped (`qos0_late`), any other is injected at
once; they are ordered by (epoch, seq), which the origin gives in order.

Memory is bounded by the settings `reorder_max_stream`, `reorder_max`,
`reorder_max_bytes` (waiting publications: beyond them the oldest gap is
skipped) and `max_streams` (streams remembered, least recently used
forgotten first, never one with waiting publications).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from federation.protocol import events
from federation.protocol.context import Outbox
from federation.protocol.events import publication_text
from federation.protocol.settings import Settings
from federation.protocol.types import Address
from federation.protocol.wire_types import TopicMessage

Position = tuple[int, int]
"""(epoch, seq) of a publication: the order of one origin's publications, across its restarts"""
StreamKey = tuple[Address, str]
"""(origin, filter): a reliable (QoS 1/2) stream as a receiver orders it"""

INFINITY = float("inf")


@dataclass(slots=True)
class Waiting:
    """A publication that came before its predecessor."""

    position: Position
    prev: Position
    arrived_at: float
    message: TopicMessage
    want: bool
    """injected here when it passes (else its position only passes)"""
    size: int


class Stream:
    """One reliable stream at a receiver: how far it has passed, and what waits for an earlier publication."""

    __slots__ = ("last", "waiting", "deadline", "armed", "since", "start_wait")

    def __init__(self) -> None:
        self.last: Position | None = None
        """None: nothing passed yet (the stream is starting)"""
        self.waiting: list[tuple[Position, Waiting]] = []
        """a heap by position"""
        self.deadline = INFINITY
        """when the gap before the earliest waiting publication is skipped (infinity when none waits)"""
        self.armed = INFINITY
        """the deadline of this stream's entry in `Ordering._deadlines` (infinity: none); at most `deadline`, as
        a stream that moves pushes its deadline later without a new entry (the entry is pushed on when it fires)"""
        self.since = 0.0
        """when the stream last moved (passed a publication) or began to wait, whichever is later"""
        self.start_wait = 0.0
        """seconds the stream's first publications wait for an earlier one while it is starting"""


class Ordering:
    """The receiver's streams: `offer` each QoS 1/2 publication taken, `expire` on the timer, `qos0_late` for
    QoS 0. What they release is returned in order, for the caller to inject."""

    def __init__(self, settings: Settings, outbox: Outbox, interest_since: Callable[[str], float],
                 waiting: Callable[[TopicMessage], None], passed: Callable[[TopicMessage], None],
                 in_reach: Callable[[Address], bool] = lambda origin: True) -> None:
        self._settings = settings
        self._outbox = outbox
        self._interest_since = interest_since
        """when the node's local interest in a topic began (-infinity: established; `Node.local_subscribe`)"""
        self._waiting = waiting
        self._passed = passed
        """custody's `held` and `unheld`: a publication waiting in a stream keeps its (publication, filter) from
        being acknowledged until the stream passes it, so an origin that saw it released knows every receiver
        passed it (the origin then leaves `prev` off the next one: federation.protocol.publications)"""
        self._generation = max(1, settings.max_streams // 2)
        self._newer: dict[StreamKey, Stream] = {}
        self._older: dict[StreamKey, Stream] = {}
        self.qos0: dict[StreamKey, Position] = {}
        """the last QoS 0 publication injected from each stream"""
        self.waiting = 0
        self.waiting_bytes = 0
        self._deadlines: list[tuple[float, StreamKey]] = []
        """(when a stream's longest wait ends, its key): lazily deleted"""
        self._in_reach = in_reach
        """whether the table reaches an origin now (`Node`: its routes' members)"""
        self._cut_off: set[StreamKey] = set()
        """streams whose gap came due while their origin was out of reach: they wait for it (`expire`)"""

    # ------------------------------------------------------------ streams

    def _stream(self, key: StreamKey, create: bool) -> Stream | None:
        stream = self._newer.get(key)
        if stream is not None:
            return stream
        stream = self._older.pop(key, None)
        if stream is None:
            if not create:
                return None
            stream = Stream()
        self._newer[key] = stream
        if len(self._newer) >= self._generation:
            # The older generation is forgotten, but never a stream with publications waiting in it.
            kept = {k: s for k, s in self._older.items() if s.waiting}
            self._older, self._newer = self._newer, kept
        return stream

    def _find(self, key: StreamKey) -> Stream | None:
        """The stream, without making it recently used."""
        stream = self._newer.get(key)
        return stream if stream is not None else self._older.get(key)

    def __len__(self) -> int:
        return len(self._newer) + len(self._older)

    # ------------------------------------------------------------ reliable streams

    def offer(self, message: TopicMessage, want: bool, now: float) -> list[TopicMessage]:
        """A QoS 1/2 publication taken (first arrival of its (publication, filter)); `want`: it is to be injected
        here. Returns what is released now, in order: this one and the ones that waited for it, and any
        publication the bounds made skip a gap (those of other streams included)."""
        key = (message.origin, message.filter)
        stream = self._stream(key, want)
        if stream is None:
            return []  # a stream nobody here injects from: nothing to order
        position = (message.epoch, message.seq)
        last = stream.last
        if last is not None and position <= last:  # an earlier one, after a later one was passed
            if not want:
                return []
            self._outbox.counters["order_late"] += 1
            return [message]
        prev = message.prev
        settings = self._settings
        if prev is None or (last is None and settings.reorder_start <= 0) or (last is not None and prev <= last):
            stream.last = position if last is None or position > last else last
            released = [message] if want else []
            if stream.waiting:
                stream.since = now  # the stream moved: its gap waits `reorder_timeout` from here
                self._release(key, stream, released, now)
                self._rearm(key, stream)
            return released
        # Its predecessor has not been passed here (or the stream is starting: it may be in flight).
        if last is None and not stream.waiting:
            established = now - self._interest_since(message.topic) >= settings.reorder_timeout
            stream.start_wait = settings.reorder_timeout if established else settings.reorder_start
        size = len(message.payload) + len(message.topic) if want else 0
        heapq.heappush(stream.waiting, (position, Waiting(position, prev, now, message, want, size)))
        self._waiting(message)
        self.waiting += 1
        self.waiting_bytes += size
        if len(stream.waiting) == 1:
            stream.since = now
            self._rearm(key, stream)
        released = []
        if len(stream.waiting) > settings.reorder_max_stream:
            self._skip(key, stream, released, "stream_full", now)
        while (self.waiting > settings.reorder_max or self.waiting_bytes > settings.reorder_max_bytes) \
                and self._skip_oldest(released, now):
            pass
        return released

    def _release(self, key: StreamKey, stream: Stream, released: list[TopicMessage], now: float) -> None:
        """Release the waiting publications whose predecessor has been passed, in order."""
        waiting = stream.waiting
        last = stream.last
        assert last is not None
        changed = False
        while waiting and waiting[0][1].prev <= last:
            position, item = heapq.heappop(waiting)
            changed = True
            self.waiting -= 1
            self.waiting_bytes -= item.size
            if position <= last:  # passed meanwhile by a later one (an origin's replay): late, not lost
                if item.want:
                    self._outbox.counters["order_late"] += 1
                    released.append(item.message)
            else:
                last = position
                if item.want:
                    released.append(item.message)
            self._passed(item.message)
        stream.last = last
        if changed:
            stream.since = now
            self._rearm(key, stream)

    def _rearm(self, key: StreamKey, stream: Stream) -> None:
        """The stream moved or began to wait: its gap is skipped `reorder_timeout` (`reorder_start` while the
        stream is starting) after that, unless it moves again."""
        if not stream.waiting:
            stream.deadline = stream.armed = INFINITY  # its entry, if any, is stale now
            return
        wait = stream.start_wait if stream.last is None else self._settings.reorder_timeout
        stream.deadline = deadline = stream.since + wait
        if deadline < stream.armed:  # a later deadline keeps the entry: `expire` pushes it on when it fires
            stream.armed = deadline
            heapq.heappush(self._deadlines, (deadline, key))

    def _skip(self, key: StreamKey, stream: Stream, released: list[TopicMessage], reason: str, now: float) -> None:
        """Give up waiting for the gap before the stream's earliest waiting publication: pass it, and what follows."""
        position, item = heapq.heappop(stream.waiting)
        self.waiting -= 1
        self.waiting_bytes -= item.size
        outbox = self._outbox
        if stream.last is None and reason == "timeout":  # a stream reaching us mid-way: it starts here
            outbox.counters["order_started_midway"] += 1
        else:
            outbox.counters["order_gaps_skipped"] += 1
            origin, filter_ = key
            outbox.emit(events.ORDER_GAP_SKIPPED, now, pub=publication_text((origin, *position)), filter=filter_,
                        reason=reason, seconds=round(now - item.arrived_at, 6))
        stream.last = position
        stream.since = now
        if item.want:
            released.append(item.message)
        self._passed(item.message)
        self._release(key, stream, released, now)
        self._rearm(key, stream)

    def _skip_oldest(self, released: list[TopicMessage], now: float) -> bool:
        """Over the bounds in all: skip the gap that has been waited for longest. False when none waits."""
        while self._deadlines:
            deadline, key = self._deadlines[0]
            stream = self._find(key)
            if stream is None or not stream.waiting or stream.armed != deadline:
                heapq.heappop(self._deadlines)  # stale
                continue
            self._skip(key, stream, released, "buffer_full", now)
            return True
        return False

    def routes_changed(self, now: float) -> None:
        """The table's reach changed: a stream that waited for an origin out of reach and reaches it again waits
        `reorder_timeout` from now (the origin's held publications and repairs are on their way)."""
        for key in sorted(self._cut_off, key=str):
            stream = self._find(key)
            if stream is None or not stream.waiting:
                self._cut_off.discard(key)
            elif self._in_reach(key[0]):
                self._cut_off.discard(key)
                stream.since = max(stream.since, now)
                self._rearm(key, stream)

    def next_deadline(self) -> float | None:
        deadlines = self._deadlines
        while deadlines:
            deadline, key = deadlines[0]
            stream = self._find(key)
            if stream is not None and stream.waiting and stream.armed == deadline:
                return deadline  # the stream's entry (its deadline may be later: woken early, `expire` pushes on)
            heapq.heappop(deadlines)
        return None

    def expire(self, now: float) -> list[TopicMessage]:
        """Skip every gap waited for long enough; returns what that releases, in order."""
        released: list[TopicMessage] = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            deadline, key = heapq.heappop(deadlines)
            stream = self._find(key)
            if stream is None or not stream.waiting or stream.armed != deadline:
                continue  # stale
            stream.armed = INFINITY  # this entry is used up: the next one is pushed anew
            if stream.deadline > now:  # the stream moved since the entry was pushed: it waits on
                stream.armed = stream.deadline
                heapq.heappush(deadlines, (stream.deadline, key))
                continue
            if stream.last is not None and not self._in_reach(key[0]) \
                    and now - stream.since < self._settings.receiver_hold:
                # Its origin is out of reach (a partition, its wrapper down): what it keeps for us comes when it
                # is back (rule 7f), so the gap is not skipped meanwhile; looked at again a timeout later.
                self._cut_off.add(key)
                stream.armed = now + max(self._settings.reorder_timeout, self._settings.hello_interval)
                heapq.heappush(deadlines, (stream.armed, key))
                continue
            self._skip(key, stream, released, "timeout", now)
        return released

    # ------------------------------------------------------------ QoS 0

    def qos0_late(self, origin: Address, filter_: str, epoch: int, seq: int) -> bool:
        """A QoS 0 publication about to be injected: True (and counted) when it is older than the last one injected
        from its stream, else it becomes the last."""
        key = (origin, filter_)
        qos0 = self.qos0
        last = qos0.get(key)
        position = (epoch, seq)
        if last is not None and position < last:
            self._outbox.drop("qos0_late")
            return True
        if last is None and len(qos0) >= self._settings.max_streams:
            qos0.clear()  # best effort: a stream forgotten only lets one late publication through
        qos0[key] = position
        return False

    def qos0_set(self, key: StreamKey, position: Position) -> None:
        """The last QoS 0 publication injected from a stream (a run of them at once: `tb`)."""
        qos0 = self.qos0
        if key not in qos0 and len(qos0) >= self._settings.max_streams:
            qos0.clear()
        qos0[key] = position

    # ------------------------------------------------------------ across a restart

    def restore(self, positions: dict[StreamKey, Position]) -> None:
        """Streams as a journal left them (`Node.restore`): each has passed at least its position."""
        for key, position in positions.items():
            stream = self._stream(key, True)
            assert stream is not None
            if stream.last is None or position > stream.last:
                stream.last = position

    def positions(self) -> dict[StreamKey, Position]:
        """How far every reliable stream has passed (for the embedder to keep across a restart)."""
        found = {key: stream.last for key, stream in self._older.items() if stream.last is not None}
        found.update((key, stream.last) for key, stream in self._newer.items() if stream.last is not None)
        return found

    def status(self) -> dict[str, int]:
        return {"streams": len(self), "waiting": self.waiting, "waiting_bytes": self.waiting_bytes}
