"""Custody of QoS 1/2 publications: a node acknowledges a copy only once everything it took on with it is done.

Theory of operation
-------------------
MQTT's QoS 1 and 2 mean that a publication the broker acknowledged to its
client is not lost. Hop-by-hop acknowledgement alone (federation.protocol.reliable)
does not keep that promise: a node that acknowledged a copy on arrival and
then died, or dropped it for want of a route, lost the only copy. So a node
that takes a (publication, filter) copy for the first time from neighbour U
takes on *obligations*, and acknowledges U (`ta`) only when all of them are
done (docs/protocol.md rule 7a, "Custody"):

- one per copy it sends on (each next hop the routing names), done when
  that next hop acknowledges it, which it does only when its own
  obligations are done; so an acknowledgement means "delivered everywhere
  beyond me", recursively;
- one for the injection into its own broker, done when the embedder says
  the broker has it (`Node.injection_done`);
- one while it holds the publication for want of a core or a route.

At the origin the "upstream" is the embedder's spool: when every filter's
obligations are done the publication id goes to `released`, which the
embedder drains (`Node.custody_released`) to let the spool forget it.

An acknowledgement also names the subscribing brokers that have the
publication (its *reach*: the node itself when it has subscribers to the
filter, and the reach of every copy it sent, docs/protocol.md rule 7f), so
the origin learns who has it. An own entry that closes goes to the node's
`own_closed` first (federation.protocol.receivers): when a broker that
subscribed when the publication was made is not in its reach (cut off by a
partition, restarting, not yet in the mesh again), the publication stays
in custody, *awaiting* that broker, and the receivers part repairs it
(a mode 3 copy, whose own entries close through `repair_closed`) and
resolves it later (`own_resolved`): released when every one of those
brokers has it, given up (counted, reported there) when one cannot get it
within `receiver_hold`.

A copy of a (publication, filter) the node took before is acknowledged at
once (it has it, so every copy it must send is sent or owed already),
except (the node decides it: `ReliableDelivery.receive`) a retransmission from
the very neighbour whose acknowledgement is still owed (that one comes with
the obligations done), and a copy sent toward the core through a node that
is no mesh member: in-mesh flooding reaches every mesh neighbour of a node
that has the publication, but a toward-core relay sends to one parent, so
"I have it" there means nothing for where this copy must go; the node
routes it again toward the core, excluding its sender. If the node still
has the (publication, filter) open, the new copies join its obligations and
the sender is acknowledged at once; if not, it opens it again with that
sender upstream.

No deadlock: an entry waits only for copies it sent, and a copy creates a
waiting entry only at a node with no open entry for that (publication,
filter): every waits-for edge goes from an entry to one opened after it (a
copy is received after it is sent), so the relation has no cycle. A forged
copy (an upstream that never sent it) can close a cycle of two: each
neighbour's copy reaches the entry whose upstream it is, and settles the
copy sent the other way (`ReliableDelivery.receive`); longer forged cycles
are only bounded in cost (docs/protocol.md rule 7a). Memory:
an entry lives while one of its copies is unacknowledged (bounded by the
table of reliable forwarding and its refusal of new copies), held (bounded
by `max_held_publications`) or waiting for the embedder (bounded by the
embedder's own queue and `Node.report_delivery_backlog`).

A node that restarts has lost its entries: its upstream neighbours, never
acknowledged, send their copies again, and the node takes them anew.
"""

from __future__ import annotations

from collections.abc import Callable

from federation.protocol.context import NO_REACH, Outbox
from federation.protocol.types import Address, PublicationId
from federation.protocol.wire import MODE_REPAIR
from federation.protocol.wire_types import TopicMessage

EntryKey = tuple[PublicationId, str]
"""(publication, filter)"""
Interested = Callable[[str], bool]
"""does this node have subscribers to the filter (it counts itself in the reach of what it takes)?"""
Targets = Callable[[str], frozenset[Address]]
"""the brokers known to subscribe to a filter (federation.protocol.receivers): what an own entry must reach"""


class Entry:
    """One (publication, filter) this node has taken and not yet acknowledged."""

    __slots__ = ("message", "upstream", "copies", "held", "inject", "reach", "targets", "ack_filter")

    def __init__(self, message: TopicMessage, upstream: Address | None, reach: frozenset[Address] = NO_REACH,
                 targets: frozenset[Address] = NO_REACH) -> None:
        self.message = message
        self.upstream = upstream
        """the neighbour (transport) owed the acknowledgement; None at the origin (the spool)"""
        self.copies: set[Address] = set()
        """next hops (transports) whose acknowledgement of our copy we wait for"""
        self.held = 0
        """times the publication is held here (for want of a core or a route)"""
        self.inject = False
        """the local injection is ours to wait for (`Node.injection_done`)"""
        self.reach = reach
        """the subscribing brokers known to have it: this node (when it subscribes to the filter) and the reach of
        each copy acknowledged (rule 7f)"""
        self.targets = targets
        """an own entry: the brokers known to subscribe to the filter when it was made (what it must reach)"""
        self.ack_filter: str | None = None
        """the filter the acknowledgement names when not the message's (a repair taken here: its repair filter)"""

    @property
    def done(self) -> bool:
        return not self.copies and not self.held and not self.inject


def _no_targets(filter_: str) -> frozenset[Address]:
    return NO_REACH


class Custody:
    """The (publication, filter) entries this node holds in custody, and the origin's releases."""

    def __init__(self, outbox: Outbox, me: Address, interested: Interested) -> None:
        self._outbox = outbox
        self._me = frozenset((me,))
        self._interested = interested
        self.targets: Targets = _no_targets
        """the receivers part's `targets` (bound by the node)"""
        self.own_closed: Callable[[Entry], bool] = lambda entry: False
        """the receivers part's answer when an own entry closed: True while the publication awaits a target"""
        self.repair_closed: Callable[[Entry], None] = lambda entry: None
        """the receivers part's, when an own repair copy's entry closed"""
        self._gave_up: set[PublicationId] = set()
        """own publications some target will not get (given up): released without counting `custody_released`"""
        self.entries: dict[EntryKey, Entry] = {}
        self.injecting: dict[PublicationId, Entry] = {}
        """publications whose injection some entry waits for, by publication"""
        self._origin_open: dict[PublicationId, int] = {}
        """our own publications: entries (filters) still open"""
        self.released: list[PublicationId] = []
        """our own publications delivered everywhere (drained by the embedder: `Node.custody_released`)"""

    # ------------------------------------------------------------ opening and closing

    def get(self, publication: PublicationId, filter_: str) -> Entry | None:
        return self.entries.get((publication, filter_))

    def open(self, message: TopicMessage, upstream: Address | None) -> Entry:
        """Take a (publication, filter) into custody, owing its acknowledgement to `upstream` (None: we originated
        it). The caller routes it (which adds the obligations) and then calls `settle`."""
        if upstream is not None:
            entry = Entry(message, upstream, self._me if self._interested(message.filter) else NO_REACH)
        elif message.mode == MODE_REPAIR:
            entry = Entry(message, None)  # our repair copy: the awaiting publication keeps it open
        else:
            entry = Entry(message, None, NO_REACH, self.targets(message.filter))
        key = (message.publication, message.filter)
        assert key not in self.entries, key
        self.entries[key] = entry
        if upstream is None and message.mode != MODE_REPAIR:
            publication = message.publication
            self._origin_open[publication] = self._origin_open.get(publication, 0) + 1
        return entry

    def open_repair(self, message: TopicMessage, upstream: Address, ack_filter: str) -> Entry:
        """A repair for us (rule 7f), taken as a copy of its filter's (`message`, in mode 1) from `upstream`, whose
        acknowledgement names `ack_filter` (the repair filter the copy came with)."""
        entry = self.open(message, upstream)
        entry.ack_filter = ack_filter
        return entry

    def open_run(self, messages: list[TopicMessage], upstream: Address) -> list[Entry] | None:
        """`open` for each of a run from neighbour `upstream`, if none of them is in custody yet; else None, and
        nothing opened (the caller takes them one by one)."""
        keys = [(message.publication, message.filter) for message in messages]
        entries = self.entries
        if not entries.keys().isdisjoint(keys):
            return None
        reach = self._me if messages and self._interested(messages[0].filter) else NO_REACH  # one filter: `tq`
        opened = [Entry(message, upstream, reach) for message in messages]
        entries.update(zip(keys, opened, strict=True))
        return opened

    def settle_all(self, opened: list[Entry]) -> None:
        """`settle` for each (the entries of a run, after it was routed: one call for the run)."""
        entries = self.entries
        for entry in opened:
            if entry.done:
                message = entry.message
                if entries.get(((message.origin, message.epoch, message.seq), message.filter)) is entry:
                    self._close(entry)

    def release_now(self, publication: PublicationId) -> None:
        """Our own publication that no filter carries: nothing to wait for (every subscribing broker, none, has
        it: counted as released)."""
        if publication not in self._origin_open:
            self.released.append(publication)
            self._outbox.counters["custody_released"] += 1

    def settle(self, entry: Entry) -> None:
        """Close the entry if it owes nothing any more (after the input that opened or changed it)."""
        self.settle_all([entry])

    def _close(self, entry: Entry) -> None:
        message = entry.message
        publication = message.publication
        del self.entries[(publication, message.filter)]
        outbox = self._outbox
        if entry.upstream is not None:
            outbox.acknowledge(entry.upstream, entry.ack_filter or message.filter, message.origin, message.epoch,
                               message.seq, entry.reach)
            return
        if message.mode == MODE_REPAIR:
            self.repair_closed(entry)
            return
        if self.own_closed(entry):
            return  # it awaits a broker that subscribed when it was made (rule 7f): `own_resolved` ends that
        self._own_done(publication)

    def own_resolved(self, publication: PublicationId, given_up: bool) -> None:
        """A publication of ours no longer awaits the brokers one of its entries did not reach: they have it now,
        or (`given_up`) one of them will not get it (the receivers part counted and reported that)."""
        if given_up:
            self._gave_up.add(publication)
        if publication in self._origin_open:
            self._own_done(publication)

    def _own_done(self, publication: PublicationId) -> None:
        left = self._origin_open[publication] - 1
        if left:
            self._origin_open[publication] = left
            return
        del self._origin_open[publication]
        self.released.append(publication)
        if publication in self._gave_up:
            self._gave_up.discard(publication)
            self._outbox.counters["custody_given_up"] += 1
        else:
            self._outbox.counters["custody_released"] += 1

    def abandon(self, publication: PublicationId, filter_: str) -> Entry | None:
        """Give an entry up without acknowledging it (its upstream still holds the publication and sends it
        again); returns it, so the caller can forget what it took (its copies become untracked by custody)."""
        entry = self.entries.pop((publication, filter_), None)
        if entry is None:
            return None
        if entry.inject and self.injecting.get(publication) is entry:
            del self.injecting[publication]
        if entry.upstream is None:  # ours: the spool keeps it (not released)
            left = self._origin_open.get(publication, 1) - 1
            if left > 0:
                self._origin_open[publication] = left
            else:
                self._origin_open.pop(publication, None)
        return entry

    def own_open(self, publication: PublicationId) -> bool:
        """Is this publication of ours still in custody (not yet delivered everywhere)?"""
        return publication in self._origin_open

    def take_released(self) -> list[PublicationId]:
        out, self.released = self.released, []
        return out

    # ------------------------------------------------------------ obligations

    def copies_sent_all(self, messages: list[TopicMessage], transports: list[Address]) -> list[bool]:
        """Copies of these (publication, filter)s were sent to `transports`: for each, obligations of its entry if
        it is open (True), else copies nobody waits for (False: a replay of a publication already delivered)."""
        entries, owned = self.entries, []
        for message in messages:
            entry = entries.get(((message.origin, message.epoch, message.seq), message.filter))
            if entry is None:
                owned.append(False)
            else:
                entry.copies.update(transports)
                owned.append(True)
        return owned

    def copy_done(self, transport: Address, publication: PublicationId, filter_: str,
                  reach: frozenset[Address] = NO_REACH) -> None:
        """The next hop acknowledged our copy (and `reach` have it, rule 7f), has the publication itself, or our copy
        was routed elsewhere (after the new copies were added)."""
        entry = self.entries.get((publication, filter_))
        if entry is not None and transport in entry.copies:
            entry.copies.discard(transport)
            if reach and not reach <= entry.reach:
                entry.reach = entry.reach | reach
            if entry.done:
                self._close(entry)

    def held(self, message: TopicMessage) -> None:
        entry = self.entries.get((message.publication, message.filter))
        if entry is not None:
            entry.held += 1

    def unheld(self, message: TopicMessage) -> None:
        """A held publication was routed on (its copies added first) or given up."""
        entry = self.entries.get((message.publication, message.filter))
        if entry is not None and entry.held:
            entry.held -= 1
            if entry.done:
                self._close(entry)

    def expect_injection(self, publication: PublicationId, filter_: str) -> None:
        """The (publication, filter) just taken will be injected here: unless another filter's entry waits for
        that already, this one does."""
        if publication in self.injecting:
            return
        entry = self.entries.get((publication, filter_))
        if entry is not None:
            entry.inject = True
            self.injecting[publication] = entry

    def injection_done(self, publication: PublicationId) -> bool:
        """The embedder's broker has the publication; False when no entry waited for it (QoS 0, or unknown)."""
        entry = self.injecting.pop(publication, None)
        if entry is None:
            return False
        entry.inject = False
        message = entry.message
        if entry.done and self.entries.get((publication, message.filter)) is entry:
            self._close(entry)
        return True

    def reach_of(self, filter_: str) -> frozenset[Address]:
        """The reach of a copy this node has (a duplicate, acknowledged at once): itself if it subscribes."""
        return self._me if self._interested(filter_) else NO_REACH

    def status(self) -> dict[str, int]:
        return {"open": len(self.entries), "injecting": len(self.injecting), "own_open": len(self._origin_open)}
