"""The local broker's subscriptions as the node counts them.

Per client the raw filters it holds and their QoS; per federated filter
(federation.protocol.topic_filter) how many (client, filter) pairs want it,
since when, and an index that matches a topic against them. A federated
filter's first pair and its last one are what the node's other parts hear
of (`Change`): the mesh joins or leaves the filter's mesh. A shared
subscription (`$share/G/F`) makes the broker a member of group G (rule 9):
it is a `Change` too, for the shared groups, never a filter's mesh. The
retained publications' own tree (`RETAINED_FILTER`) is reserved, and a
filter the federation does not carry is ignored. Each pair added or
removed is emitted as an event.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from federation.protocol import events
from federation.protocol.modes import RETAINED_FILTER
from federation.protocol.topic_filter import SHARE_PREFIX, FilterIndex, federated_filter


@dataclass(frozen=True, slots=True)
class Change:
    """A federated filter that local subscribers began (`added`) or stopped wanting, or a shared subscription
    (`shared`: `filter` is `$share/G/F`) made or given up."""

    filter: str
    added: bool
    shared: bool = False


class LocalSubscriptions:
    """Who subscribes to what on the local broker, and since when each federated filter is wanted here."""

    def __init__(self, emit: Callable[..., Any]) -> None:
        """`emit(type, now, **fields)`: an event (the node's outbox)."""
        self._emit = emit
        self.clients: dict[str, dict[str, int]] = {}
        """client -> raw filter -> QoS"""
        self.filter_refs: Counter[str] = Counter()
        """federated filter -> number of (client, filter) pairs"""
        self.index = FilterIndex()
        self.since: dict[str, float] = {}
        """federated filter with local subscribers -> since when (-infinity: since before a restart)"""

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
        self.index.add(federated)
        return [Change(federated, added=True)]

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
        return min((since.get(filter_, float("inf")) for filter_ in self.index.matching(topic)), default=float("inf"))

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
        self.index.discard(federated)
        return [Change(federated, added=False)]
