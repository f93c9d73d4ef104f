"""Anti-entropy of the retained stores between neighbours (`rd`, `rs`, `rr`, `rv`: docs/protocol.md rule 10).

Theory of operation
-------------------
Retained publications reach every broker over the `//retained//` tree, but only the brokers of the component
the origin is in at that moment: a QoS 0 one made on one side of a partition never reaches the other side, and
a broker that was down misses what was published meanwhile. The stores themselves (topic -> newest value, with
its version) are the embedder's state (federation.daemon.retained); this part compares them with a neighbour's
and carries over what differs, as rule 2a does for the federation table, so every broker of a component ends
with the newest value of every topic once its links are up.

The embedder hands the node a `RetainedIndex`: the versions of what it stores, kept in buckets by
`RetainedVersions` (the embedder updates it as it stores and forgets; the node only reads it), and the value
of one topic on demand. The node never writes the store: a value it receives becomes an `Injection` with
retain, as a retained publication would, and the embedder's newest-wins check decides whether it is stored
and injected. Values travel with their original version (origin time, epoch, seq, origin address), so
newest-wins gives the same answer whichever way a value came.

The exchange, between up neighbours only, every announce interval and when a link comes up:

- `rd` (digest): the number of topics and the XOR of their entry hashes in 16 buckets. Sent by a node whose
  store holds anything; a node with an empty store answers a differing digest with its own (empty) one, so
  the other side learns it lacks everything (an empty store never starts an exchange: a federation without
  retained publications sends nothing for them).
- `rs` (summary): the (topic, version) of the sender's topics in the buckets that differed, at most
  `MAX_SUMMARY` per digest received, starting after where the previous summary to that neighbour ended.
- `rr` (request): the topics whose version in the summary is newer than ours or that we lack; `rv` (values):
  our copies of the topics we hold newer than the summary says, and the answer to a request. At most
  `MAX_VALUES` topics per summary or request received.

Everything is sent in answer to a digest, and a digest goes to each neighbour once per announce interval (and
at link up), so the exchange costs at most a summary, a request and `2 * MAX_VALUES` values per neighbour and
interval. Values propagate hop by hop: a value that crosses a healed link reaches the far side of the
component in one announce interval per hop, or at once over the tree for publications made after the heal.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Protocol

from federation.protocol import wire
from federation.protocol.context import Outbox
from federation.protocol.neighbours import Neighbour
from federation.protocol.types import Address, Injection, PublicationId
from federation.protocol.wire_types import (
    RetainedCopy,
    RetainedDigest,
    RetainedEntry,
    RetainedRequest,
    RetainedSummary,
    RetainedValues,
    RetainedVersion,
)

MAX_SUMMARY = 512
"""topic versions sent in the summaries answering one digest"""
MAX_VALUES = 64
"""values sent in answer to one summary or one request, and topics requested per summary"""
_MASK = 2**64 - 1


def bucket_of(topic: str) -> int:
    """The bucket of a topic: the first byte of the 8-byte BLAKE2b digest of its UTF-8 text, modulo 16."""
    return hashlib.blake2b(topic.encode(), digest_size=8).digest()[0] % wire.DIGEST_BUCKETS


def entry_hash(topic: str, version: RetainedVersion) -> int:
    """The 8-byte BLAKE2b digest of `topic|origin_ms|epoch|seq|host|port`, read as a big-endian integer."""
    origin_ms, epoch, seq, host, port = version
    text = f"{topic}|{origin_ms}|{epoch}|{seq}|{host}|{port}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def publication_of(version: RetainedVersion) -> PublicationId:
    _origin_ms, epoch, seq, host, port = version
    return (Address(host, port), epoch, seq)


class RetainedVersions:
    """topic -> version of every value (and tombstone) a store holds, by bucket, with the digest kept as it
    changes (XOR in, XOR out): the part of a retained store the node reads. The embedder calls `put` and
    `remove` as its store changes."""

    def __init__(self) -> None:
        self.by_bucket: list[dict[str, RetainedVersion]] = [{} for _ in range(wire.DIGEST_BUCKETS)]
        self.hashes = [0] * wire.DIGEST_BUCKETS
        self.count = 0

    def get(self, topic: str) -> RetainedVersion | None:
        return self.by_bucket[bucket_of(topic)].get(topic)

    def put(self, topic: str, version: RetainedVersion) -> None:
        bucket = bucket_of(topic)
        topics = self.by_bucket[bucket]
        old = topics.get(topic)
        if old is not None:
            self.hashes[bucket] ^= entry_hash(topic, old)
        else:
            self.count += 1
        topics[topic] = version
        self.hashes[bucket] ^= entry_hash(topic, version)

    def remove(self, topic: str) -> None:
        bucket = bucket_of(topic)
        old = self.by_bucket[bucket].pop(topic, None)
        if old is not None:
            self.hashes[bucket] ^= entry_hash(topic, old)
            self.count -= 1

    def digest(self) -> RetainedDigest:
        return RetainedDigest(self.count, tuple(self.hashes))

    def entries(self, buckets: frozenset[int]) -> list[RetainedEntry]:
        """The (topic, version) of the topics in these buckets, sorted by topic."""
        found = [RetainedEntry(topic, version) for bucket in sorted(buckets)
                 for topic, version in self.by_bucket[bucket].items()]
        found.sort(key=lambda entry: entry.topic)
        return found


class RetainedIndex(Protocol):
    """What the node reads of its embedder's retained store (federation.daemon.retained.RetainedStore,
    `MemoryRetainedIndex`)."""

    @property
    def retained_versions(self) -> RetainedVersions: ...

    def retained_copy(self, topic: str) -> RetainedCopy | None: ...


class MemoryRetainedIndex:
    """A retained store in memory, newest wins, unbounded: the simulator's and the tests' embedder."""

    def __init__(self) -> None:
        self.retained_versions = RetainedVersions()
        self.copies: dict[str, RetainedCopy] = {}

    def retained_copy(self, topic: str) -> RetainedCopy | None:
        return self.copies.get(topic)

    def offer(self, copy: RetainedCopy) -> bool:
        """Store `copy` if it is newer than what the topic holds; True if it was."""
        held = self.copies.get(copy.topic)
        if held is not None and copy.version <= held.version:
            return False
        self.copies[copy.topic] = copy
        self.retained_versions.put(copy.topic, copy.version)
        return True


class RetainedSync:
    """The retained stores' anti-entropy with the neighbours (see the module docstring)."""

    def __init__(self, outbox: Outbox, mark_injected: Callable[[list[PublicationId]], None]) -> None:
        self._outbox = outbox
        self._mark_injected = mark_injected
        """tells the node's injection cache that a publication was given to the embedder: a late `tm` copy of
        it is then not injected again"""
        self.index: RetainedIndex | None = None
        """the embedder's store (`Node.attach_retained`); None: no exchange at all"""
        self.cursor: dict[Address, str] = {}
        """neighbour transport -> the last topic of the summary sent to it (the next one starts after it)"""
        self.queued: dict[str, RetainedVersion] = {}
        """topic -> the version given to the embedder and maybe not yet in its store (not given again); forgotten
        every announce interval, when the embedder has long taken what it was given"""

    # ------------------------------------------------------------ digests

    def send_digests(self) -> None:
        """Every announce interval: our digest to every up neighbour, if our store holds anything."""
        self.queued.clear()
        index = self.index
        if index is None or not index.retained_versions.count:
            return
        self._outbox.send_up(wire.RETAINED_DIGEST, index.retained_versions.digest(), exclude=None)

    def neighbour_up(self, neighbour: Neighbour) -> None:
        index = self.index
        if index is not None and index.retained_versions.count:
            self._outbox.send(wire.RETAINED_DIGEST, index.retained_versions.digest(), [neighbour.transport])

    def neighbour_down(self, transport: Address) -> None:
        self.cursor.pop(transport, None)

    def on_digest(self, digest: RetainedDigest, neighbour: Neighbour) -> None:
        """A neighbour's digest: where it differs, our summary of those buckets (an empty store: its digest)."""
        index, outbox = self.index, self._outbox
        if index is None:
            return
        if not neighbour.up:
            outbox.drop("digest_not_up")
            return
        versions = index.retained_versions
        ours = versions.digest()
        if ours == digest:
            return
        outbox.counters["retained_digest_mismatches"] += 1
        transport = neighbour.transport
        if not ours.count:
            outbox.send(wire.RETAINED_DIGEST, ours, [transport])
            return
        differing = frozenset(i for i in range(wire.DIGEST_BUCKETS) if ours.buckets[i] != digest.buckets[i])
        entries = versions.entries(differing or frozenset(range(wire.DIGEST_BUCKETS)))
        if len(entries) > MAX_SUMMARY:  # a window, moved on at each digest, so every topic comes round
            after = self.cursor.get(transport, "")
            start = next((i for i, entry in enumerate(entries) if entry.topic > after), 0)
            entries = (entries[start:] + entries[:start])[:MAX_SUMMARY]
            self.cursor[transport] = entries[-1].topic
        for run in outbox.split(entries, wire.retained_entry_size):
            outbox.send(wire.RETAINED_SUMMARY, RetainedSummary(tuple(run)), [transport])

    # ------------------------------------------------------------ summaries, requests, values

    def on_summary(self, summary: RetainedSummary, neighbour: Neighbour) -> None:
        """Request what the neighbour holds newer; send it what we hold newer."""
        index = self.index
        if index is None or not neighbour.up:
            return
        versions = index.retained_versions
        wanted: list[str] = []
        push: list[str] = []
        for entry in summary.entries:
            held = versions.get(entry.topic)
            if held is None or held < entry.version:
                if self._not_queued(entry.topic, entry.version) and len(wanted) < MAX_VALUES:
                    wanted.append(entry.topic)
            elif held > entry.version and len(push) < MAX_VALUES:
                push.append(entry.topic)
        self._send_values(index, push, neighbour.transport)
        outbox = self._outbox
        for run in outbox.split(wanted, wire.retained_topic_size):
            outbox.send(wire.RETAINED_REQUEST, RetainedRequest(tuple(run)), [neighbour.transport])

    def on_request(self, request: RetainedRequest, neighbour: Neighbour) -> None:
        index = self.index
        if index is None or not neighbour.up:
            return
        self._send_values(index, sorted(set(request.topics))[:MAX_VALUES], neighbour.transport)

    def _send_values(self, index: RetainedIndex, topics: list[str], transport: Address) -> None:
        copies = [copy for copy in map(index.retained_copy, topics) if copy is not None]
        outbox = self._outbox
        for run in outbox.split(copies, wire.retained_value_size):
            outbox.send(wire.RETAINED_VALUES, RetainedValues(tuple(run)), [transport])
        if copies:
            outbox.counters["retained_values_sent"] += len(copies)

    def on_values(self, values: RetainedValues, neighbour: Neighbour) -> None:
        """Values a neighbour holds newer than we did: each newer than our store becomes an injection with retain
        (the embedder's newest-wins check stores it, or refuses it if its store moved on meanwhile)."""
        index = self.index
        if index is None or not neighbour.up:
            return
        versions = index.retained_versions
        outbox = self._outbox
        given: list[PublicationId] = []
        for copy in values.values:
            held = versions.get(copy.topic)
            if (held is not None and held >= copy.version) or not self._not_queued(copy.topic, copy.version):
                outbox.counters["retained_values_stale"] += 1
                continue
            publication = publication_of(copy.version)
            self.queued[copy.topic] = copy.version
            outbox.injections.append(Injection(copy.topic, copy.payload, copy.qos, True, copy.properties,
                                               publication, None))
            given.append(publication)
        if given:
            outbox.counters["retained_values_injected"] += len(given)
            self._mark_injected(given)

    def _not_queued(self, topic: str, version: RetainedVersion) -> bool:
        queued = self.queued.get(topic)
        return queued is None or queued < version
