"""Anti-entropy of the topic cores' claims and the mesh memberships (`td`, `tr`, `tz`: docs/protocol.md rule 5a).

Theory of operation
-------------------
Claims (`tc`) and memberships (`ts`) are sent when they change and never
refreshed, so an idle link carries nothing per filter. What a lost packet,
a restart or a partition leaves different is found by comparing digests
(`federation.protocol.digest_tree`) with each neighbour every announce
interval, and when a link comes up:

- **Claims** (`SET_CLAIMS`): every node of a component should hold the same
  live claims. A node sends each neighbour the digest of its claims' root
  bucket; the receiver compares it bucket by bucket with its own. For each
  child bucket that differs: if one side holds nothing there, the other
  side's claims go over at once (pushed as `tc`, or asked for with `tr`);
  if both hold few (`LEAF` or fewer), the receiver pushes its own and asks
  for the sender's; otherwise it sends the digest of that bucket, and the
  other side descends in turn. Claims that arrive this way are handled as
  any `tc`: the better or newer one wins, an older one is answered.
- **Memberships** (`SET_MEMBERSHIPS`, `SET_RECORDED`): a child is the
  authority on its memberships toward a parent. It sends the parent their
  digest; the parent compares it with its record of that child and, where
  it differs, asks for the child's complete list of that bucket (`tr`) or
  sends the digest of its record one level down (`SET_RECORDED`), which the
  child compares in turn. A child answers with `tz`: its memberships in the
  bucket, complete when they fit one packet, and the parent replaces its
  record of that bucket with them.

Only leaves (a few entries) and the digests on the way down to them travel,
so the cost of a repair follows what differs, not the number of filters.
This part holds no state: the mesh (`TopicSets`) keeps the digests and the
entries, and this part only decides what to send.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from federation.protocol.context import NeighboursView, Outbox
from federation.protocol.digest_tree import CHILDREN, MAX_DEPTH, DigestTree
from federation.protocol.neighbours import Neighbour
from federation.protocol.types import Address
from federation.protocol.wire import (
    SET_CLAIMS,
    SET_MEMBERSHIPS,
    SET_RECORDED,
    TOPIC_CORE,
    TOPIC_DIGEST,
    TOPIC_REQUEST,
    TOPIC_SUBSCRIPTIONS,
    subscription_entry_size,
)
from federation.protocol.wire_types import TopicCore, TopicDigest, TopicRequest, TopicSubscribe, TopicSubscriptions

LEAF = 16
"""a bucket where both sides hold at most this many entries is exchanged whole, not descended into"""
PUSH_RATE = 5000.0
"""entries (claims as `tc`, memberships in `tz`) sent to one neighbour a second at most by the exchange: a
neighbour that comes up beside a hundred thousand filters learns them over twenty seconds, its hellos answered
meanwhile, not in one burst that holds its loop for seconds"""
PUSH_BURST = 1000
"""entries sent to one neighbour at once before `PUSH_RATE` paces the rest"""
PUSH_STEP = 0.05
"""seconds between two paced sends to a neighbour"""


class TopicSets(Protocol):
    """What the mesh (federation.protocol.mesh.MeshEngine) gives this part: the digests and their entries."""

    claims: DigestTree[str]
    memberships: dict[Address, DigestTree[str]]
    recorded: dict[Address, DigestTree[str]]

    def claim_of(self, filter_: str) -> TopicCore | None: ...

    def membership_of(self, filter_: str, parent: Address) -> TopicSubscribe | None: ...

    def replace_recorded(self, child: Address, filters: list[str], entries: tuple[TopicSubscribe, ...],
                         now: float) -> None: ...


_EMPTY: DigestTree[str] = DigestTree()
_SEEN_FROM_HERE = {SET_CLAIMS: 0, SET_MEMBERSHIPS: 2, SET_RECORDED: 1}
"""a set as the other side names it -> its index in `TopicSync._trees` (the same set seen from this side)"""


class TopicSync:
    """The digest exchange of the topic sets with the neighbours (see the module docstring)."""

    def __init__(self, neighbours: NeighboursView, outbox: Outbox, sets: TopicSets) -> None:
        self._neighbours = neighbours
        self._outbox = outbox
        self._sets = sets
        self._budget: dict[Address, tuple[float, float]] = {}
        """neighbour transport -> (entries it may be sent now, when that was last counted)"""
        self._owed: dict[Address, deque[tuple[str, str]]] = {}
        """neighbour transport -> ("claim" or "membership", filter) sent when its budget allows, oldest first"""
        self._now = 0.0

    # ------------------------------------------------------------ the periodic round

    def send_digests(self) -> None:
        """Every announce interval, to every up neighbour: the roots of the three sets it shares with us."""
        for neighbour in self._neighbours.up():
            self.send_digests_to(neighbour)

    def send_digests_to(self, neighbour: Neighbour) -> None:
        """The roots of the claims, of our memberships toward it and of our record of its memberships."""
        announced = _announced(neighbour)
        if announced is None:
            return
        transport = [neighbour.transport]
        for set_, tree in self._trees(announced):
            count, xor = tree.digest(0, 0)
            self._outbox.send(TOPIC_DIGEST, TopicDigest(set_, 0, 0, (count,), (xor,)), transport)

    def _trees(self, announced: Address) -> tuple[tuple[int, DigestTree[str]], ...]:
        """The three sets we share with a neighbour: the claims, our memberships toward it, our record of its."""
        sets = self._sets
        return ((SET_CLAIMS, sets.claims), (SET_MEMBERSHIPS, sets.memberships.get(announced, _EMPTY)),
                (SET_RECORDED, sets.recorded.get(announced, _EMPTY)))

    def ask_claims(self) -> None:
        """A core was lost here: every up neighbour gets the digest of our claims at once, so a claim we turned
        down for the lost one (it lost to it when the lost one was alive), which nothing floods again, comes back
        within a few round trips instead of at the next round."""
        tree = self._sets.claims
        count, xor = tree.digest(0, 0)
        self._outbox.send_up(TOPIC_DIGEST, TopicDigest(SET_CLAIMS, 0, 0, (count,), (xor,)), exclude=None)

    # ------------------------------------------------------------ receiving

    def on_digest(self, digest: TopicDigest, neighbour: Neighbour, now: float) -> None:
        self._now = now
        announced = _announced(neighbour)
        if not neighbour.up or announced is None:
            self._outbox.drop("digest_not_up")
            return
        sets = self._sets
        if len(digest.counts) == 1:
            # A bucket in brief (the periodic round's root): when ours differs, the other side gets our view of its
            # children, as the set is seen from our side (its memberships are our record of them, and the other way).
            answer, tree = self._trees(announced)[_SEEN_FROM_HERE[digest.set]]
            if tree.digest(digest.depth, digest.path) != (digest.counts[0], digest.hashes[0]):
                self._outbox.counters["topic_digest_mismatches"] += 1
                self._send_digest(answer, tree, digest.depth, digest.path, neighbour)
            return
        if digest.set == SET_CLAIMS:
            self._compare_claims(digest, neighbour)
        elif digest.set == SET_MEMBERSHIPS:  # the child's memberships, against our record of them
            self._compare_as_parent(digest, neighbour, sets.recorded.get(announced, _EMPTY), now)
        else:  # SET_RECORDED: the parent's record of our memberships, against them
            self._compare_as_child(digest, neighbour, sets.memberships.get(announced, _EMPTY))

    def on_request(self, request: TopicRequest, neighbour: Neighbour, now: float) -> None:
        self._now = now
        announced = _announced(neighbour)
        if not neighbour.up or announced is None:
            self._outbox.drop("digest_not_up")
            return
        if request.set == SET_CLAIMS:
            self._push_claims(request.depth, request.path, neighbour)
        else:
            self._send_memberships(request.depth, request.path, neighbour,
                                   self._sets.memberships.get(announced, _EMPTY))

    def on_subscriptions(self, body: TopicSubscriptions, neighbour: Neighbour, now: float) -> None:
        """A child's memberships in a bucket: our record of that bucket becomes them (added only, if partial)."""
        announced = _announced(neighbour)
        if not neighbour.up or announced is None:
            self._outbox.drop("digest_not_up")
            return
        recorded = self._sets.recorded.get(announced, _EMPTY)
        filters = sorted(recorded.keys(body.depth, body.path)) if body.complete else []
        self._sets.replace_recorded(announced, filters, body.entries, now)

    # ------------------------------------------------------------ comparing

    def _differing(self, digest: TopicDigest, tree: DigestTree[str]) -> list[tuple[int, int, int]]:
        """The children of the digest's bucket that differ from ours: (nibble, our count, their count)."""
        counts, hashes = tree.children(digest.depth, digest.path)
        if counts == digest.counts and hashes == digest.hashes:
            return []
        self._outbox.counters["topic_digest_mismatches"] += 1
        return [(nibble, counts[nibble], digest.counts[nibble]) for nibble in range(CHILDREN)
                if counts[nibble] != digest.counts[nibble] or hashes[nibble] != digest.hashes[nibble]]

    def _compare_claims(self, digest: TopicDigest, neighbour: Neighbour) -> None:
        tree = self._sets.claims
        depth = digest.depth + 1
        for nibble, ours, theirs in self._differing(digest, tree):
            path = (digest.path << 4) | nibble
            if ours == 0:
                self._request(SET_CLAIMS, depth, path, neighbour)
            elif theirs == 0:
                self._push_claims(depth, path, neighbour)
            elif max(ours, theirs) <= LEAF or depth >= MAX_DEPTH:
                self._push_claims(depth, path, neighbour)
                self._request(SET_CLAIMS, depth, path, neighbour)
            else:
                self._send_digest(SET_CLAIMS, tree, depth, path, neighbour)

    def _compare_as_parent(self, digest: TopicDigest, neighbour: Neighbour, recorded: DigestTree[str],
                           now: float) -> None:
        depth = digest.depth + 1
        announced = _announced(neighbour)
        assert announced is not None
        for nibble, ours, theirs in self._differing(digest, recorded):
            path = (digest.path << 4) | nibble
            if theirs == 0:  # the child has none there: what we record there is gone
                self._sets.replace_recorded(announced, sorted(recorded.keys(depth, path)), (), now)
            elif ours == 0 or max(ours, theirs) <= LEAF or depth >= MAX_DEPTH:
                self._request(SET_MEMBERSHIPS, depth, path, neighbour)
            else:
                self._send_digest(SET_RECORDED, recorded, depth, path, neighbour)

    def _compare_as_child(self, digest: TopicDigest, neighbour: Neighbour, memberships: DigestTree[str]) -> None:
        depth = digest.depth + 1
        for nibble, ours, theirs in self._differing(digest, memberships):
            path = (digest.path << 4) | nibble
            if ours == 0 or theirs == 0 or max(ours, theirs) <= LEAF or depth >= MAX_DEPTH:
                self._send_memberships(depth, path, neighbour, memberships)
            else:
                self._send_digest(SET_MEMBERSHIPS, memberships, depth, path, neighbour)

    # ------------------------------------------------------------ sending

    def _send_digest(self, set_: int, tree: DigestTree[str], depth: int, path: int, neighbour: Neighbour) -> None:
        counts, hashes = tree.children(depth, path)
        self._outbox.send(TOPIC_DIGEST, TopicDigest(set_, depth, path, counts, hashes), [neighbour.transport])

    def _request(self, set_: int, depth: int, path: int, neighbour: Neighbour) -> None:
        self._outbox.send(TOPIC_REQUEST, TopicRequest(set_, depth, path), [neighbour.transport])

    def _push_claims(self, depth: int, path: int, neighbour: Neighbour) -> None:
        """Our claims in a bucket, each as the `tc` that announced it, to the neighbour alone (paced)."""
        filters = sorted(self._sets.claims.keys(depth, path))
        allowed = self._take_budget(neighbour.transport, len(filters))
        for filter_ in filters[:allowed]:
            self._send_claim(filter_, neighbour.transport)
        self._owe(neighbour.transport, "claim", filters[allowed:])

    def _send_claim(self, filter_: str, transport: Address) -> None:
        claim = self._sets.claim_of(filter_)
        if claim is not None:
            self._outbox.counters["claims_pushed"] += 1
            self._outbox.send(TOPIC_CORE, claim, [transport])

    def _send_memberships(self, depth: int, path: int, neighbour: Neighbour, memberships: DigestTree[str]) -> None:
        """Our memberships toward the neighbour in a bucket, as `tz`: complete when they fit one packet and the
        budget; else those the budget allows now, the rest paced, as partial `tz` (the parent only adds them)."""
        announced = _announced(neighbour)
        assert announced is not None
        filters = sorted(memberships.keys(depth, path))
        allowed = self._take_budget(neighbour.transport, len(filters))
        entries = [entry for filter_ in filters[:allowed]
                   if (entry := self._sets.membership_of(filter_, announced)) is not None]
        runs = self._outbox.split(entries, subscription_entry_size, header=32) or [[]]
        complete = len(runs) == 1 and allowed == len(filters)
        for run in runs:
            self._outbox.send(TOPIC_SUBSCRIPTIONS, TopicSubscriptions(depth, path, complete, tuple(run)),
                              [neighbour.transport])
        self._owe(neighbour.transport, "membership", filters[allowed:])

    # ------------------------------------------------------------ pacing

    def _take_budget(self, transport: Address, wanted: int) -> int:
        """How many of `wanted` entries may go to the neighbour now (taken from its budget)."""
        if not wanted:
            return 0
        if self._owed.get(transport):
            return 0  # older ones wait: they go first
        tokens, counted_at = self._budget.get(transport, (float(PUSH_BURST), self._now))
        tokens = min(float(PUSH_BURST), tokens + (self._now - counted_at) * PUSH_RATE)
        allowed = min(wanted, int(tokens))
        self._budget[transport] = (tokens - allowed, self._now)
        return allowed

    def _owe(self, transport: Address, kind: str, filters: list[str]) -> None:
        if filters:
            self._owed.setdefault(transport, deque()).extend((kind, filter_) for filter_ in filters)
            self._outbox.counters["topic_entries_paced"] += len(filters)

    def next_deadline(self) -> float | None:
        """When entries owed to a neighbour are sent (None: none are)."""
        return self._now + PUSH_STEP if self._owed else None

    def on_timer(self, now: float) -> None:
        """Send what the budgets allow of the entries owed, as they are now (a claim or membership gone
        meanwhile is not sent; memberships go as partial `tz` of their own bucket)."""
        self._now = now
        for transport in sorted(self._owed):
            owed = self._owed[transport]
            neighbour = self._neighbours.get(transport)
            if neighbour is None or not neighbour.up or (announced := _announced(neighbour)) is None:
                del self._owed[transport]
                continue
            tokens, counted_at = self._budget.get(transport, (0.0, now))
            tokens = min(float(PUSH_BURST), tokens + (now - counted_at) * PUSH_RATE)
            memberships: list[TopicSubscribe] = []
            while owed and tokens >= 1:
                kind, filter_ = owed.popleft()
                tokens -= 1
                if kind == "claim":
                    self._send_claim(filter_, transport)
                elif (entry := self._sets.membership_of(filter_, announced)) is not None:
                    memberships.append(entry)
            self._budget[transport] = (tokens, now)
            for run in self._outbox.split(memberships, subscription_entry_size, header=32):
                self._outbox.send(TOPIC_SUBSCRIPTIONS, TopicSubscriptions(0, 0, False, tuple(run)), [transport])
            if not owed:
                del self._owed[transport]

    def neighbour_down(self, transport: Address) -> None:
        """What was owed to a neighbour that went down is forgotten (the exchange starts again when it is up)."""
        self._owed.pop(transport, None)
        self._budget.pop(transport, None)


def _announced(neighbour: Neighbour) -> Address | None:
    """The address a neighbour announces (what memberships are recorded by), None before it has said."""
    return neighbour.announced.address if neighbour.announced is not None else None
