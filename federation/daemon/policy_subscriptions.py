"""The local subscriptions, told to the node as the federation filters the topic policy lets them import.

Theory of operation: the wrapper's table (state.py) and its pseudo clients (broker_subscriptions.py) speak the
broker's namespace: a client subscribed to `sensors/#`. The node speaks the federation's: it joins the mesh of
each filter it is given and injects what matches. With a topic policy (topic_policy.py) the two differ: a
filter maps to the federation filters its `in`/`both` lines cover, perhaps several, perhaps none (then the node
never hears of it, and joins no mesh for a filter it could not inject). `PolicySubscriptions` stands between
them as the table's `SubscriptionSink`: it keeps every (client, local filter, QoS) it is told, and gives the
node, per client, the union of the mapped filters, each at the highest QoS asked (capped by its lines).

When the policy changes (a reload, `set_policy`), every client's filters are mapped again and only the
difference is told: the new filters first, then the ones no longer wanted, so a filter kept by both policies is
never left for a moment. The table itself is untouched: no local subscription is forgotten across a reload.
"""

from __future__ import annotations

from federation.daemon.state import SubscriptionSink
from federation.daemon.topic_policy import TopicPolicy


class PolicySubscriptions:
    """A `SubscriptionSink` that maps what it is told through a `TopicPolicy` before telling `node`."""

    def __init__(self, node: SubscriptionSink, policy: TopicPolicy) -> None:
        self.node = node
        self.policy = policy
        self._local: dict[str, dict[str, int]] = {}
        """client -> local filter -> QoS, as told"""
        self._told: dict[str, dict[str, int]] = {}
        """client -> federation filter -> QoS, as the node has them"""
        self._sources: dict[str, dict[str, dict[str, int]]] = {}
        """client -> federation filter -> the local filters mapped to it -> their QoS capped by the lines"""

    # ------------------------------------------------------------ SubscriptionSink

    def local_subscribe(self, client: str, filter_: str, qos: int, now: float) -> None:
        self._local.setdefault(client, {})[filter_] = qos
        imports = self.policy.import_filters(filter_)
        sources = self._sources.setdefault(client, {})
        told = self._told.setdefault(client, {})
        # Every filter this subscription maps to is told again, as the node was told every SUBSCRIBE before. Only
        # the filters it maps to are looked at: a client may hold a hundred thousand (a gateway, a bench).
        for federated, cap in sorted(imports.items()):
            sources.setdefault(federated, {})[filter_] = min(qos, cap)
            told[federated] = max(sources[federated].values())
            self.node.local_subscribe(client, federated, told[federated], now)
        if not told:
            del self._told[client]
        if not sources:
            del self._sources[client]

    def local_unsubscribe(self, client: str, filter_: str, now: float) -> None:
        filters = self._local.get(client)
        if filters is None or filters.pop(filter_, None) is None:
            return
        if not filters:
            del self._local[client]
        sources = self._sources.get(client, {})
        told = self._told.get(client, {})
        for federated in sorted(self.policy.import_filters(filter_)):
            from_filters = sources.get(federated)
            if from_filters is None or from_filters.pop(filter_, None) is None:
                continue
            if from_filters:
                qos = max(from_filters.values())
                if told.get(federated) != qos:
                    told[federated] = qos
                    self.node.local_subscribe(client, federated, qos, now)
            else:
                del sources[federated]
                told.pop(federated, None)
                self.node.local_unsubscribe(client, federated, now)
        if not told:
            self._told.pop(client, None)
        if not sources:
            self._sources.pop(client, None)

    def local_disconnect(self, client: str, now: float) -> None:
        self._local.pop(client, None)
        self._told.pop(client, None)
        self._sources.pop(client, None)
        self.node.local_disconnect(client, now)

    # ------------------------------------------------------------ the policy

    def set_policy(self, policy: TopicPolicy, now: float) -> int:
        """Map every client's filters through `policy` and tell the node the difference; returns how many
        (client, federation filter) pairs it added or removed."""
        self.policy = policy
        changed = 0
        for client in sorted(set(self._local) | set(self._told)):
            changed += self._tell(client, self._wanted(client), now)
        self._sources = {}
        for client, filters in self._local.items():
            sources = self._sources[client] = {}
            for filter_, qos in filters.items():
                for federated, cap in policy.import_filters(filter_).items():
                    sources.setdefault(federated, {})[filter_] = min(qos, cap)
        return changed

    def not_imported(self) -> list[str]:
        """The local filters (of any client) that import nothing under the policy, sorted: subscribers the
        federation cannot reach here."""
        return sorted({filter_ for filters in self._local.values() for filter_ in filters
                       if not self.policy.import_filters(filter_)})

    @property
    def federated(self) -> int:
        """(client, federation filter) pairs the node has from this table."""
        return sum(len(filters) for filters in self._told.values())

    def _wanted(self, client: str) -> dict[str, int]:
        wanted: dict[str, int] = {}
        for filter_, qos in self._local.get(client, {}).items():
            for federated, cap in self.policy.import_filters(filter_).items():
                wanted[federated] = max(wanted.get(federated, 0), min(qos, cap))
        return wanted

    def _tell(self, client: str, wanted: dict[str, int], now: float, again: dict[str, int] | None = None) -> int:
        """The node gets `wanted` for `client` (a new policy): new or changed filters subscribed (and those in
        `again`), then those no longer wanted unsubscribed. Returns how many were added or removed."""
        told = self._told.get(client, {})
        changed = 0
        for federated, qos in sorted(wanted.items()):
            if told.get(federated) != qos or (again is not None and federated in again):
                changed += federated not in told
                self.node.local_subscribe(client, federated, qos, now)
        for federated in sorted(set(told) - set(wanted)):
            changed += 1
            self.node.local_unsubscribe(client, federated, now)
        if wanted:
            self._told[client] = wanted
        else:
            self._told.pop(client, None)
        return changed
