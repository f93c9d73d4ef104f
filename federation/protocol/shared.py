"""Shared subscription groups across the federation: which brokers have members of a group, and which one
serves a publication for it (docs/protocol.md rule 9).

Theory of operation
-------------------
A shared subscription `$share/G/F` is load balancing: of the members of
group (G, F), exactly one gets each matching publication. Mosquitto does
that among its own clients; the federation must do it among brokers, or
every broker with a member serves the group (once per member broker).

So a shared subscription does not federate F (that would put its broker in
F's mesh, which carries every publication to every member). Instead each
broker floods the set of groups it has members of (`sg`, one announcement
per broker, replaced whole, refreshed every `announce_interval`, forgotten
`expire_intervals` of them after the last refresh), and every node knows
the member brokers of every group; a *live* member broker is one the
routes reach.

For a publication P and a group (G, F) with F matching P's topic, exactly
one broker serves the group:

- the origin, when its broker has a member: its broker delivered P to it
  already (Mosquitto serves each local group once), and no copy goes out
  for that group;
- else the *choice*: the live member broker with the highest rendezvous
  weight (SHA-256 of the shared filter, P's id and the broker's address).
  Every node that knows the same members computes the same ranking, so the
  origin's choice, a failover's next choice and a receiver's judgement of
  "was it me?" agree; over many publications the weights spread them
  evenly across the member brokers.

The origin sends P to the choice as a mode 2 `tm` (its `filter` the shared
filter, its `target` the chosen broker) along the unicast routes, hop by
hop, with the custody of rule 7a: a QoS 1/2 copy is acknowledged only when
the target's broker has it. A node that holds such a copy fails over to
the next broker of the ranking when the target is out of reach (not in its
routes), and the target itself does when its member has left (it no longer
counts itself a member); QoS 1/2 custody carries the copy across the
failover. A group whose members are all out of reach ends the copy there
(`shared_no_member`), as a filter whose core withdrew.

What cannot be helped: Mosquitto gives an injected publication to every
matching subscription of the broker, shared ones included. A broker that
receives P for a plain subscriber therefore also serves its members of
every group matching P, chosen or not; so does a broker chosen for one
group serve its members of another. A node counts each such delivery
(`shared_group_served_twice`) when it injects P into a broker with a member
of a group whose serving broker (as it computes it) is another.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from federation.protocol import events
from federation.protocol.context import IdentityView, NeighboursView, Outbox, TableView
from federation.protocol.events import publication_text
from federation.protocol.forwarding import NOT_SENT, SENT, Routed
from federation.protocol.topic_filter import SHARE_PREFIX, FilterIndex
from federation.protocol.types import Address, PublicationId
from federation.protocol.wire import MODE_TO_MEMBER, SHARED_GROUPS, TOPIC_MESSAGE
from federation.protocol.wire_types import SharedGroups as Announcement
from federation.protocol.wire_types import TopicMessage

TrackCopies = Callable[[list[TopicMessage], list[Address]], None]
"""QoS 1/2 copies sent (or kept for next hops that are down): retransmitted until acknowledged, in custody"""
Group = tuple[str, str]
"""(group name, filter)"""


def shared_filter(group: Group) -> str:
    return f"{SHARE_PREFIX}{group[0]}/{group[1]}"


def split_shared(text: str) -> Group:
    """`$share/G/F` -> (G, F)."""
    group, _, filter_ = text[len(SHARE_PREFIX):].partition("/")
    return group, filter_


def weight(shared: str, publication: PublicationId, member: Address) -> int:
    """The rendezvous weight of `member` for `publication` in the group `shared` (`$share/G/F`)."""
    origin, epoch, seq = publication
    text = f"{shared}\0{origin.host}:{origin.port}/{epoch}/{seq}\0{member.host}:{member.port}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


@dataclass
class Stored:
    announcement: Announcement
    expires_at: float


class SharedGroups:
    """The groups with members federation-wide, and the routing of a publication to a group's member broker."""

    def __init__(self, identity: IdentityView, table: TableView, neighbours: NeighboursView,
                 outbox: Outbox, track: TrackCopies) -> None:
        self._identity = identity
        self._table = table
        self._neighbours = neighbours
        self._outbox = outbox
        self._track = track
        self.local: Counter[Group] = Counter()
        """groups with members on our broker -> local subscriptions"""
        self.remote: dict[Address, Stored] = {}
        """other brokers' announcements, by origin"""
        self._members: dict[Group, set[Address]] = {}
        """group -> the other brokers that announce members of it"""
        self._index = FilterIndex()
        """the filters of every group known, ours included"""
        self._seq = 0
        self._announced = False
        """our last announcement listed groups (so an empty one must say they are gone)"""

    # ------------------------------------------------------------ our members

    def local_add(self, group: Group) -> None:
        self.local[group] += 1
        if self.local[group] == 1:
            self._index.add(group[1])
            self.announce()

    def local_remove(self, group: Group) -> None:
        if self.local[group] <= 1:
            self.local.pop(group, None)
            if not self._known(group[1]):
                self._index.discard(group[1])
            self.announce()
        else:
            self.local[group] -= 1

    def _own(self) -> Announcement:
        identity = self._identity
        return Announcement(identity.address, identity.epoch, self._seq, tuple(sorted(self.local)))

    def announce(self, withdraw: bool = False) -> None:
        """Flood our groups (a new seq); an empty set only to withdraw what we (`withdraw`: an earlier life of
        ours) announced before."""
        if not self.local and not self._announced and not withdraw:
            return
        self._seq += 1
        self._announced = bool(self.local)
        self._outbox.send_up(SHARED_GROUPS, self._own(), None)

    def leave(self) -> None:
        """A clean shutdown: our groups withdrawn at once rather than after their expiry."""
        self.local.clear()
        self.announce()

    # ------------------------------------------------------------ other brokers' members

    def on_announcement(self, body: Announcement, sender: Address, now: float) -> None:
        """An `sg` from neighbour `sender` (transport): kept and flooded on when newer than what we have."""
        if body.origin == self._identity.address:
            # Our own, back: ours is the newer. An earlier life's (a neighbour kept it for us) is replaced at
            # once by what this life has, even nothing, rather than left to expire.
            if body.epoch < self._identity.epoch and body.groups != tuple(sorted(self.local)):
                self.announce(withdraw=True)
            return
        stored = self.remote.get(body.origin)
        if stored is not None and stored.announcement.freshness >= body.freshness:
            return
        if stored is not None:
            self._unindex(stored.announcement)
        settings = self._identity.settings
        self.remote[body.origin] = Stored(body, now + settings.expire_intervals * settings.announce_interval)
        for group in body.groups:
            self._members.setdefault(group, set()).add(body.origin)
            self._index.add(group[1])
        self._outbox.send_up(SHARED_GROUPS, body, sender)

    def _unindex(self, announcement: Announcement) -> None:
        for group in announcement.groups:
            members = self._members.get(group)
            if members is not None:
                members.discard(announcement.origin)
                if not members:
                    del self._members[group]
            if not self._known(group[1]):
                self._index.discard(group[1])

    def _known(self, filter_: str) -> bool:
        return any(group[1] == filter_ for group in (*self.local, *self._members))

    def periodic(self, now: float) -> None:
        """Every announce interval: refresh ours, forget the announcements nobody refreshed."""
        if self.local:
            self.announce()
        for origin in [origin for origin, stored in self.remote.items() if stored.expires_at <= now]:
            self._unindex(self.remote.pop(origin).announcement)

    def neighbour_up(self, transport: Address) -> None:
        """A neighbour came up: it learns every group we know of (the database exchange of rule 1)."""
        if self.local:
            self._outbox.send(SHARED_GROUPS, self._own(), [transport])
        for origin in sorted(self.remote):
            announcement = self.remote[origin].announcement
            if announcement.groups:
                self._outbox.send(SHARED_GROUPS, announcement, [transport])

    # ------------------------------------------------------------ who serves a publication

    @property
    def active(self) -> bool:
        """Any group known at all (else nothing here has work to do)."""
        return bool(self._index)

    def ranking(self, group: Group, publication: PublicationId, exclude: Iterable[Address] = ()) -> list[Address]:
        """The live member brokers of `group` (us included when we have a member), best first for `publication`."""
        reachable = self._table.routes.members
        own = self._identity.address
        members = {member for member in self._members.get(group, ()) if member in reachable}
        if group in self.local:
            members.add(own)
        members.difference_update(exclude)
        shared = shared_filter(group)
        return sorted(members, key=lambda member: (-weight(shared, publication, member), member))

    def _origin_serves(self, group: Group, origin: Address) -> bool:
        if origin == self._identity.address:
            return group in self.local
        stored = self.remote.get(origin)
        return stored is not None and group in stored.announcement.groups

    def groups_for(self, topic: str) -> list[Group]:
        """The groups whose filter matches `topic`, sorted."""
        return sorted(group for filter_ in self._index.matching(topic)
                      for group in {*self._members, *self.local} if group[1] == filter_)

    def targets(self, topic: str, publication: PublicationId) -> list[tuple[str, Address]]:
        """Where our new publication goes for each group (shared filter, chosen broker); none for the groups our
        own broker has members of (it served them) or that have no live member."""
        targets = []
        for group in self.groups_for(topic):
            if group in self.local:
                continue
            ranking = self.ranking(group, publication)
            if ranking:
                targets.append((shared_filter(group), ranking[0]))
        return targets

    def note_injected(self, message: TopicMessage) -> None:
        """We give `message` to our broker, which serves our members of every group matching it: count those
        some other broker serves too (`shared_group_served_twice`)."""
        own = self._identity.address
        for group in self.groups_for(message.topic):
            if group not in self.local:
                continue
            if message.mode == MODE_TO_MEMBER and message.filter == shared_filter(group):
                continue  # the copy for this very group
            if self._origin_serves(group, message.origin):
                self._outbox.counters["shared_group_served_twice"] += 1
                continue
            ranking = self.ranking(group, message.publication)
            if ranking and ranking[0] != own:
                self._outbox.counters["shared_group_served_twice"] += 1

    # ------------------------------------------------------------ moving mode 2 copies

    def route(self, message: TopicMessage, from_announced: Address | None, now: float) -> Routed | None:
        """Send a mode 2 `tm` on toward its target; None when this broker is to serve the group (the caller
        injects it). A target out of reach, or ourselves without a member any more, fails over to the next
        member broker of the ranking."""
        own = self._identity.address
        group = split_shared(message.filter)
        target = message.target
        assert target is not None
        if target == own and group in self.local:
            return None
        routes = self._table.routes
        failed: list[Address] = []
        if target == own or target not in routes.members or not self._reachable(target, from_announced):
            failed.append(target)
        if failed:
            ranking = [member for member in self.ranking(group, message.publication, failed)
                       if member == own or self._reachable(member, from_announced)]
            if not ranking:
                self._outbox.drop("shared_no_member", event=events.PUBLICATION_DROPPED, now=now,
                                  pub=publication_text(message.publication), filter=message.filter,
                                  reason="no_member")
                return NOT_SENT
            self._outbox.counters["shared_failovers"] += 1
            target = ranking[0]
            if target == own:
                return None
        hops = message.hops + 1 if from_announced is not None else message.hops
        if hops >= self._identity.settings.max_hops:
            self._outbox.drop("max_hops")
            return NOT_SENT
        outgoing = TopicMessage(message.filter, message.origin, message.epoch, message.seq, MODE_TO_MEMBER, hops,
                                message.topic, message.payload, message.qos, message.retain, message.properties,
                                None, target)
        transport = self._next_hop(target, from_announced)
        if transport is None:  # only next hops that are down: kept for them, routed again with the routes
            if outgoing.qos:
                self._track([outgoing], self._hops_down(target)[:1])
            else:
                self._outbox.drop("publication_no_route", event=events.PUBLICATION_DROPPED, now=now,
                                  pub=publication_text(message.publication), filter=message.filter,
                                  reason="no_route")
            return NOT_SENT
        outbox = self._outbox
        if outgoing.qos:
            self._track([outgoing], [transport])
        outbox.send(TOPIC_MESSAGE, outgoing, [transport])
        outbox.counters["shared_copies_forwarded"] += 1
        if outbox.publication_events:
            outbox.runs.forwarded(now, message.origin, message.epoch, message.seq, message.filter, [str(transport)],
                                  MODE_TO_MEMBER)
        return SENT

    def _next_hop(self, target: Address, from_announced: Address | None) -> Address | None:
        """The transport of the first up next hop toward `target` (not back where the copy came from, unless
        that is the only way)."""
        hops = sorted(self._table.routes.next_hops.get(target, ()))
        transport_for = self._neighbours.transport_for
        for hop in sorted(hops, key=lambda hop: hop == from_announced):
            transport = transport_for(hop)
            if transport is not None:
                return transport
        return None

    def _reachable(self, target: Address, from_announced: Address | None) -> bool:
        return self._next_hop(target, from_announced) is not None or bool(self._hops_down(target))

    def _hops_down(self, target: Address) -> list[Address]:
        hops = self._table.routes.next_hops.get(target, frozenset())
        return sorted(n.transport for n in self._neighbours.all()
                      if n.announced is not None and n.announced.address in hops)

    def status(self) -> dict[str, object]:
        return {"local": [shared_filter(group) for group in sorted(self.local)],
                "members": {shared_filter(group): sorted(str(member) for member in members)
                            for group, members in sorted(self._members.items())}}
