"""The local broker's subscriptions as the node counts them, and the filters it federates for them.

Per client the raw filters it holds and their QoS; per raw federated filter
(federation.protocol.topic_filter) how many (client, filter) pairs want it,
since when, and which of them match a topic (which publications the local
broker gets: `aggregation.matching`). The filters the node federates are not
always the raw ones: `federation.protocol.aggregation` federates a covering
filter for many raw ones (`dev/+/cmd` for ten thousand `dev/<id>/cmd`), and
nothing more for a raw filter another one of this broker covers. `wanted` is
what the mesh reads: the federated filters and, for a moment, the ones being
replaced. A federated filter that enters or leaves is what the node's other
parts hear of (`Change`): the mesh joins or leaves the filter's mesh.

The mesh hears of a change of the federated filters at once when none came
in the last `aggregate_delay`, else when that spell ends: a burst of
subscriptions (a device fleet reconnecting, a wrapper reading a backlog of
log lines) is judged whole, so the aggregation's passing states (the first
filters of a prefix, before the fan-out passes) do not become claims that
are withdrawn a moment later, and a lone subscription waits for nothing.

A federated filter replaced by others (the aggregation changed its mind:
a fan-out passed, a covering wildcard came or went) stays wanted until the
meshes of the filters that replace it are ready (`release_replaced`, asked
after every input with the mesh's judgement), at most `aggregate_linger`
seconds: a publication must never fall between the old mesh and the new.

A shared subscription (`$share/G/F`) makes the broker a member of group G
(rule 9): it is a `Change` too, for the shared groups, never a filter's
mesh. The retained publications' own tree (`RETAINED_FILTER`) is reserved,
and a filter the federation does not carry is ignored. Each pair added or
removed is emitted as an event.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from federation.protocol import events
from federation.protocol.aggregation import Aggregation
from federation.protocol.modes import RETAINED_FILTER
from federation.protocol.topic_filter import SHARE_PREFIX, federated_filter

COVER_ALL = "#"
"""what a node federates for the filters its topic table has no room for (`max_topics`): over-delivery, not loss"""


@dataclass(frozen=True, slots=True)
class Change:
    """A federated filter that local subscribers began (`added`) or stopped wanting, or a shared subscription
    (`shared`: `filter` is `$share/G/F`) made or given up."""

    filter: str
    added: bool
    shared: bool = False


class LocalSubscriptions:
    """Who subscribes to what on the local broker, and since when each federated filter is wanted here."""

    def __init__(self, emit: Callable[..., Any], aggregate_fanout: int = 0, aggregate_linger: float = 0.0,
                 aggregate_delay: float = 0.0) -> None:
        """`emit(type, now, **fields)`: an event (the node's outbox); `aggregate_fanout`, `aggregate_linger`,
        `aggregate_delay`: the settings of that name (0: no covering filters, only the covered ones left out;
        no lingering; changes told at once)."""
        self._emit = emit
        self.clients: dict[str, dict[str, int]] = {}
        """client -> raw filter -> QoS"""
        self.filter_refs: Counter[str] = Counter()
        """raw federated filter -> number of (client, filter) pairs"""
        self.since: dict[str, float] = {}
        """raw federated filter with local subscribers -> since when (-infinity: since before a restart)"""
        self.aggregation = Aggregation(aggregate_fanout)
        self.wanted: dict[str, int] = {}
        """the filters the node federates (-> 1): the aggregation's, and those being replaced (the mesh's local
        interest)"""
        self.replaced: dict[str, tuple[float, tuple[str, ...]]] = {}
        """federated filter being replaced -> (until when at most, the filters replacing it)"""
        self._linger = aggregate_linger
        self._delay = aggregate_delay
        self.refused: set[str] = set()
        """federated filters the mesh had no room for (`max_topics`): `COVER_ALL` is wanted in their place"""
        self._touched: set[str] = set()
        """federated filters that entered or left the aggregation's effective set since the last flush"""
        self._flush_at: float | None = None
        self._flushed_at = float("-inf")

    def subscribe(self, client: str, filter_: str, qos: int, now: float, restored: bool) -> list[Change] | None:
        """A client subscribed: what changed for the other parts (empty: a further pair of a wanted filter); None
        when nothing did (a QoS changed, a filter the federation ignores). `restored`: the subscription is the
        earlier life's, replayed as the node starts (rule 7d)."""
        federated = federated_filter(filter_)
        if federated is None or federated == RETAINED_FILTER:  # reserved: the retained publications' tree
            return None
        filters = self.clients.setdefault(client, {})
        known = filter_ in filters
        filters[filter_] = qos
        if known:
            return None
        if filter_.startswith(SHARE_PREFIX):  # a group's member: announced, not a filter's mesh (rule 9)
            self._emit(events.SUBSCRIPTION_ADDED, now, client=client, filter=filter_, federated=filter_, qos=qos)
            return [Change(filter_, added=True, shared=True)]
        self._emit(events.SUBSCRIPTION_ADDED, now, client=client, filter=filter_, federated=federated, qos=qos)
        self.filter_refs[federated] += 1
        if self.filter_refs[federated] > 1:
            return []
        self.since[federated] = float("-inf") if restored else now
        self.aggregation.add(federated)
        return self._federated_changes(now)

    def unsubscribe(self, client: str, filter_: str, now: float) -> list[Change] | None:
        """A client unsubscribed: what changed for the other parts; None when it held no such subscription."""
        filters = self.clients.get(client)
        if filters is None or filter_ not in filters:
            return None
        del filters[filter_]
        if not filters:
            del self.clients[client]
        return self._release(client, filter_, now)

    def disconnect(self, client: str, now: float) -> list[Change]:
        """A client's session ended: all its subscriptions go, in filter order."""
        changes: list[Change] = []
        for filter_ in sorted(self.clients.pop(client, {})):
            changes += self._release(client, filter_, now)
        return changes

    def interest_since(self, topic: str) -> float:
        """Since when a local subscription matches `topic` (the oldest that does)."""
        since = self.since
        return min((since.get(filter_, float("inf")) for filter_ in self.aggregation.matching(topic)),
                   default=float("inf"))

    def _release(self, client: str, filter_: str, now: float) -> list[Change]:
        federated = federated_filter(filter_)
        if federated is None or federated == RETAINED_FILTER:
            return []
        if filter_.startswith(SHARE_PREFIX):
            self._emit(events.SUBSCRIPTION_REMOVED, now, client=client, filter=filter_, federated=filter_)
            return [Change(filter_, added=False, shared=True)]
        self._emit(events.SUBSCRIPTION_REMOVED, now, client=client, filter=filter_, federated=federated)
        self.filter_refs[federated] -= 1
        if self.filter_refs[federated] > 0:
            return []
        del self.filter_refs[federated]
        self.since.pop(federated, None)
        self.aggregation.remove(federated)
        return self._federated_changes(now)

    # ------------------------------------------------------------ the federated filters

    def _federated_changes(self, now: float) -> list[Change]:
        """The federated filters that entered or left: told at once after a quiet spell of `aggregate_delay`, else
        when it ends (a burst of subscriptions is judged whole: the aggregation's passing states never reach the
        mesh, and a lone subscription is not delayed)."""
        for batch in self.aggregation.take_changes():
            self._touched.update(batch.added)
            self._touched.update(batch.removed)
        if not self._touched:
            return []
        if self._flush_at is None and now - self._flushed_at >= self._delay:
            return self.flush(now)  # the first change after a quiet spell goes at once: a lone subscription waits not
        if self._flush_at is None:
            self._flush_at = self._flushed_at + self._delay
        return []

    def flush(self, now: float) -> list[Change]:
        """What the federated filters touched since the last flush mean for `wanted`: filters that enter, filters
        that leave at once (nothing replaces them) and filters kept until their replacements are ready."""
        touched, self._touched = sorted(self._touched), set()
        self._flush_at = None
        self._flushed_at = now
        effective = self.aggregation.effective
        wanted = self.wanted
        changes: list[Change] = []
        added: list[str] = []
        for filter_ in touched:
            if filter_ in effective:
                self.replaced.pop(filter_, None)
                if filter_ not in wanted:
                    wanted[filter_] = 1
                    added.append(filter_)
                    changes.append(Change(filter_, added=True))
        for filter_ in touched:
            if filter_ in effective or filter_ not in wanted or filter_ in self.replaced:
                continue
            if added and self._linger > 0:
                self.replaced[filter_] = (now + self._linger, tuple(added))
            else:
                del wanted[filter_]
                changes.append(Change(filter_, added=False))
        return changes

    def cover_refused(self, refused: list[str]) -> list[Change]:
        """Filters the mesh had no room for: they are served by `COVER_ALL` (every publication comes here and the
        broker keeps what its subscribers match), never silently not at all."""
        wanted = [filter_ for filter_ in refused if filter_ in self.wanted and filter_ != COVER_ALL]
        if not wanted:
            return []
        self.refused.update(wanted)
        if COVER_ALL in self.wanted:
            self.replaced.pop(COVER_ALL, None)
            return []
        self.wanted[COVER_ALL] = 1
        return [Change(COVER_ALL, added=True)]

    def retry_refused(self, now: float, accepted: Callable[[str], bool]) -> list[Change]:
        """The refused filters the mesh takes now (`accepted(filter)`), or that are no longer wanted, leave the
        list; when none is left, `COVER_ALL` goes once those it covered are joined (as a filter replaced)."""
        if not self.refused:
            return []
        taken = []
        for filter_ in sorted(self.refused):
            if filter_ not in self.wanted or accepted(filter_):
                self.refused.discard(filter_)
                taken.append(filter_)
        if self.refused or COVER_ALL not in self.wanted or COVER_ALL in self.aggregation.effective:
            return []
        replacements = tuple(filter_ for filter_ in taken if filter_ in self.wanted)
        if replacements and self._linger > 0:
            self.replaced[COVER_ALL] = (now + self._linger, replacements)
            return []
        del self.wanted[COVER_ALL]
        return [Change(COVER_ALL, added=False)]

    def next_flush(self) -> float | None:
        """When the federated filters touched lately are told (None: none waits)."""
        return self._flush_at

    def release_replaced(self, now: float, ready: Callable[[str], bool]) -> list[Change]:
        """Federated filters being replaced whose replacements are all ready (`ready(filter)`: the mesh joined
        them), or that waited `aggregate_linger`: they leave now."""
        if not self.replaced:
            return []
        changes: list[Change] = []
        effective = self.aggregation.effective
        for filter_, (until, replacements) in sorted(self.replaced.items()):
            # A replacement replaced in turn counts once it has left (its own replacements were ready).
            if now >= until or all(ready(other) if other in effective else other not in self.wanted
                                   for other in replacements):
                del self.replaced[filter_]
                if filter_ not in effective and self.wanted.pop(filter_, None) is not None:
                    changes.append(Change(filter_, added=False))
        return changes

    def next_release(self) -> float | None:
        """When the earliest filter being replaced leaves at the latest (None: none is)."""
        return min((until for until, _ in self.replaced.values()), default=None)
