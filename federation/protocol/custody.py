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

from federation.protocol.context import Outbox
from federation.protocol.types import Address, PublicationId
from federation.protocol.wire_types import TopicMessage

EntryKey = tuple[PublicationId, str]
"""(publication, filter)"""


class Entry:
    """One (publication, filter) this node has taken and not yet acknowledged."""

    __slots__ = ("message", "upstream", "copies", "held", "inject")

    def __init__(self, message: TopicMessage, upstream: Address | None) -> None:
        self.message = message
        self.upstream = upstream
        """the neighbour (transport) owed the acknowledgement; None at the origin (the spool)"""
        self.copies: set[Address] = set()
        """next hops (transports) whose acknowledgement of our copy we wait for"""
        self.held = 0
        """times the publication is held here (for want of a core or a route)"""
        self.inject = False
        """the local injection is ours to wait for (`Node.injection_done`)"""

    @property
    def done(self) -> bool:
        return not self.copies and not self.held and not self.inject


class Custody:
    """The (publication, filter) entries this node holds in custody, and the origin's releases."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox
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
        entry = Entry(message, upstream)
        key = (message.publication, message.filter)
        assert key not in self.entries, key
        self.entries[key] = entry
        if upstream is None:
            publication = message.publication
            self._origin_open[publication] = self._origin_open.get(publication, 0) + 1
        return entry

    def open_run(self, messages: list[TopicMessage], upstream: Address) -> list[Entry] | None:
        """`open` for each of a run from neighbour `upstream`, if none of them is in custody yet; else None, and
        nothing opened (the caller takes them one by one)."""
        keys = [(message.publication, message.filter) for message in messages]
        entries = self.entries
        if not entries.keys().isdisjoint(keys):
            return None
        opened = [Entry(message, upstream) for message in messages]
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
        """Our own publication that no filter carries: nothing to wait for."""
        if publication not in self._origin_open:
            self.released.append(publication)

    def settle(self, entry: Entry) -> None:
        """Close the entry if it owes nothing any more (after the input that opened or changed it)."""
        self.settle_all([entry])

    def _close(self, entry: Entry) -> None:
        message = entry.message
        publication = message.publication
        del self.entries[(publication, message.filter)]
        outbox = self._outbox
        if entry.upstream is not None:
            outbox.acknowledge(entry.upstream, message.filter, message.origin, message.epoch, message.seq)
            return
        left = self._origin_open[publication] - 1
        if left:
            self._origin_open[publication] = left
        else:
            del self._origin_open[publication]
            self.released.append(publication)
            outbox.counters["custody_released"] += 1

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

    def copy_done(self, transport: Address, publication: PublicationId, filter_: str) -> None:
        """The next hop acknowledged our copy, has the publication itself, or our copy was routed elsewhere
        (after the new copies were added)."""
        entry = self.entries.get((publication, filter_))
        if entry is not None and transport in entry.copies:
            entry.copies.discard(transport)
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

    def status(self) -> dict[str, int]:
        return {"open": len(self.entries), "injecting": len(self.injecting), "own_open": len(self._origin_open)}
