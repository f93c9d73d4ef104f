"""The link-state database exchange with neighbours (`tu` sync, `dd`, `ds`, `dr`).

Theory of operation
-------------------
Flooding (`federation.protocol.table`) carries each new record once, to the
neighbours that are up at that moment. A neighbour that comes up later, or
restarts and forgets, or loses a datagram, needs another way to catch up;
that way lives here, so flooding can stay simple and fast.

*Sync* (docs/protocol.md, rule 1): when a link comes up we send the
neighbour the records of our reachable members as `tu` bundles, and the
current `tc` of every live topic core. Records of unreachable origins stay
behind: they are on their way to expiry. A record left out only because it
is not reachable *yet* (the record linking it to us is still on its way) is
remembered per neighbour and sent as soon as the routes show it reachable;
nothing else would bring it there before the next digest round. A
neighbour that restarts or renames itself is synced again, at most once per
`hello_interval` (a peer announcing a new id on every packet must not get
the whole table for every packet).

*Anti-entropy* (rule 2a): every announce interval each node sends its up
neighbours a digest (`dd`) of its reachable records in buckets. A neighbour
whose digest differs answers with a summary (`ds`) of the differing
buckets; the receiver of a summary requests (`dr`) what it lacks or holds
older, and pushes (`tu`) what it holds newer. Both sides send digests, so
what either misses is repaired within an interval or two.

This part owns no table: it reads the federation table through
`context.TableView` and sends through its outbox, so it never changes what
the node computes, only what its neighbours learn. What a neighbour must
learn of the topic cores comes from the one function the node hands it
(`topic_announcements`, the mesh's claims and ownerships).
"""

from __future__ import annotations

from collections.abc import Callable

from federation.protocol import wire
from federation.protocol.context import IdentityView, NeighboursView, Outbox, TableView
from federation.protocol.neighbours import Neighbour
from federation.protocol.stored_records import StoredRecord
from federation.protocol.types import Address
from federation.protocol.wire_types import DatabaseDigest, DatabaseRequest, DatabaseSummary, TopicCore


class DatabaseSync:
    """What our neighbours learn of our table: the sync of a neighbour that comes up, anti-entropy digests."""

    def __init__(self, identity: IdentityView, table: TableView, neighbours: NeighboursView, outbox: Outbox,
                 topic_announcements: Callable[[], list[TopicCore]]) -> None:
        self._identity = identity
        self._settings = identity.settings
        self._table = table
        self._neighbours = neighbours
        self._outbox = outbox
        self._topic_announcements = topic_announcements
        """what a neighbour that just came up must learn of the topic cores (the mesh's claims, ownerships)"""
        self.left_out: dict[Address, tuple[float, set[Address]]] = {}
        """neighbour transport -> (when synced, origins of the records we held but left out of that
        database exchange as unreachable): sent to it when routes show them reachable"""
        self.deferred: dict[Address, tuple[Neighbour, float]] = {}
        """neighbour transport -> (that neighbour, when its deferred resync is due); kept here rather than
        on the neighbours so that `next_deadline`, asked after every input, need not walk them all"""

    # ------------------------------------------------------------ sync of a neighbour (`tu`)

    def sync(self, neighbour: Neighbour, now: float) -> None:
        """Teach a neighbour that just came up what we know (the `tu` database exchange): the records
        of our reachable members. Unreachable ones stay behind: they are on their way to expiry (after
        a partition, the other side's stale records; the neighbour has the current ones)."""
        own = self._identity.address
        neighbour.extra["synced_at"] = now
        # Our own record goes too, unless a newer one is about to be originated (it will follow as `fd`):
        # the stale one would only flood everywhere for nothing.
        pending_own = self._table.origination_due is not None
        records = self._table.lsdb.records
        members = self._table.routes.members
        self._outbox.send_records([records[address] for address in sorted(members)
                                   if address in records and not (pending_own and address == own)],
                                  [neighbour.transport])
        # A record left out only because it is not reachable *yet* (the record linking it to us is
        # still on its way, or routes are about to be recomputed) follows when it is (rule 1):
        # it was flooded before this neighbour was up, so nothing else would bring it there
        # before the next anti-entropy round, an announce interval later.
        left_out = {address for address in records if address not in members and address != own}
        if left_out:
            self.left_out[neighbour.transport] = (now, left_out)
        else:
            self.left_out.pop(neighbour.transport, None)
        for announcement in self._topic_announcements():
            self._outbox.send(wire.TOPIC_CORE, announcement, [neighbour.transport])

    def resync(self, neighbour: Neighbour, now: float) -> None:
        """Send a neighbour the database again, at most once per `hello_interval`: a key holder that
        announced a new id on every packet would otherwise get the whole table for every packet it sends."""
        hello_interval = self._settings.hello_interval
        last = neighbour.extra.get("synced_at")
        if last is None or now - last >= hello_interval:
            self.deferred.pop(neighbour.transport, None)
            self.sync(neighbour, now)
        elif not self._deferred(neighbour):
            self.deferred[neighbour.transport] = (neighbour, last + hello_interval)
            self._outbox.counters["resyncs_deferred"] += 1

    def _deferred(self, neighbour: Neighbour) -> bool:
        entry = self.deferred.get(neighbour.transport)
        return entry is not None and entry[0] is neighbour

    def due_resyncs(self, now: float) -> None:
        if not self.deferred:
            return
        neighbours = self._neighbours
        for transport, (neighbour, _) in list(self.deferred.items()):
            if neighbours.get(transport) is not neighbour:
                del self.deferred[transport]  # removed from the table since: its resync went with it
        for neighbour in neighbours.all():  # in the table's order, as every other pass over the neighbours
            entry = self.deferred.get(neighbour.transport)
            if entry is not None and now >= entry[1]:
                del self.deferred[neighbour.transport]
                if neighbour.up:
                    self.sync(neighbour, now)

    def next_deadline(self) -> float | None:
        """When the earliest deferred resync is due (None: none is)."""
        if not self.deferred:
            return None
        neighbours = self._neighbours
        return min((due for transport, (neighbour, due) in self.deferred.items()
                    if neighbours.get(transport) is neighbour), default=None)

    # ------------------------------------------------------------ records left out of a sync

    def members_added(self, added: frozenset[Address]) -> None:
        """Send the neighbours synced while these records were unreachable the ones now reachable."""
        if not added or not self.left_out:
            return
        for transport, (_, origins) in sorted(self.left_out.items()):
            now_reachable = origins & added
            if not now_reachable:
                continue
            origins -= now_reachable
            if not origins:
                del self.left_out[transport]
            records = self._table.lsdb.records
            self._outbox.send_records([records[a] for a in sorted(now_reachable) if a in records], [transport])

    def neighbour_down(self, transport: Address) -> None:
        self.left_out.pop(transport, None)

    def expire_left_out(self, now: float) -> None:
        lifetime = self._settings.announcement_lifetime
        for transport, (synced_at, _) in list(self.left_out.items()):
            if now - synced_at > lifetime:  # still unreachable: on their way to expiry
                del self.left_out[transport]

    # ------------------------------------------------------------ anti-entropy (`dd`, `ds`, `dr`)

    def _digest(self) -> tuple[int, tuple[int, ...]]:
        """The digest of our reachable members' records (the table keeps it up to date)."""
        return self._table.lsdb.digest(self._table.routes.members)

    def send_digests(self) -> None:
        count, buckets = self._digest()
        self._outbox.send_up(wire.DATABASE_DIGEST, DatabaseDigest(count, buckets), exclude=None)

    def on_digest(self, digest: DatabaseDigest, neighbour: Neighbour) -> None:
        """A neighbour's periodic digest: where it differs from ours, send our summary of those buckets."""
        outbox = self._outbox
        if not neighbour.up:
            outbox.drop("digest_not_up")
            return
        count, buckets = self._digest()
        if count == digest.count and buckets == digest.buckets:
            return
        differing = frozenset(i for i in range(wire.DIGEST_BUCKETS) if buckets[i] != digest.buckets[i])
        entries = self._table.lsdb.summary(self._table.routes.members,
                                           differing or frozenset(range(wire.DIGEST_BUCKETS)))
        outbox.counters["digest_mismatches"] += 1
        for run in outbox.split(entries, wire.summary_entry_size):
            outbox.send(wire.DATABASE_SUMMARY, DatabaseSummary(tuple(run)), [neighbour.transport])

    def on_summary(self, summary: DatabaseSummary, neighbour: Neighbour) -> None:
        """Request what the neighbour has newer; send it what we have newer."""
        outbox = self._outbox
        records = self._table.lsdb.records
        wanted: list[Address] = []
        push: list[StoredRecord] = []
        for entry in summary.entries:
            held = records.get(entry.origin)
            if held is None or held.record.freshness < entry.freshness:
                wanted.append(entry.origin)
            elif held.record.freshness > entry.freshness:
                push.append(held)
        if push:
            outbox.send_records(push, [neighbour.transport])
        for run in outbox.split(sorted(set(wanted)), wire.address_size):
            outbox.send(wire.DATABASE_REQUEST, DatabaseRequest(tuple(run)), [neighbour.transport])

    def on_request(self, request: DatabaseRequest, neighbour: Neighbour) -> None:
        records = self._table.lsdb.records
        self._outbox.send_records([records[a] for a in sorted(set(request.origins)) if a in records],
                                  [neighbour.transport])
