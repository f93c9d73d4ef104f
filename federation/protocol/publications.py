"""The publication path: our publications numbered and handed to the meshes; received ones checked against
the duplicate caches, delivered to the local broker once, and routed on.

Theory of operation
-------------------
A publication is named by its origin's address, boot epoch and sequence
number (`types.PublicationId`); our own are numbered here
(`Identity.publication_seq`, which starts again with every epoch). Each node
handles a (publication, filter) pair once (the `seen` cache: a copy that
comes back over another link of the mesh is dropped and counted) and gives
the local broker each publication once, whatever the number of filters it
matched (`injected`); both caches are bounded and keyed by ints
(`federation.protocol.dedup`). Every publication is then handed to the mesh
engine's routing (`forwarding.PublicationRouting`), and this part tells the
node where it went (`forwarding.Routed`), which the node needs for pacing.

Injections go out in order (federation.protocol.ordering): our QoS 1/2
publications carry `prev`, the one sent before on the same filter
(`last_sent`) while custody still holds it (once it is released, every
receiver has passed it, so there is nothing to wait for: `prev` is left
off), and a receiver injects a QoS 1/2 publication only once its stream
has passed that one; a QoS 0 publication older than the last one
injected from its stream is dropped. QoS 1/2 publications are in custody
(federation.protocol.custody) from the moment they are taken: ours from
`local_publish` (the node's spool upstream, released when every filter's
copies are done), a neighbour's from the node's receive path; an
injection this part hands out is one more obligation, done when the
embedder says the broker has it.

QoS 0 publications also travel a run at a time (docs/protocol.md rule 7c).
Under load the wrapper reads publications from its broker in bursts, and
each `tm` then costs a whole packet's work for one publication: its header
encoded and decoded, its sender noted, its route looked up, the node
settled. A `tb` carries a run of QoS 0 publications of one origin on one
filter (not retained, no properties: what such a publication's `tm` would
carry beyond its seq, topic and payload is the same for the whole run), so
that work is done once per run and only the duplicate check, the local match
and the injection remain per publication (`originate_run`, `on_batch`). The
outcome is the `tm` rules' exactly: the same duplicate cache entries,
deliveries, drops, counters and per-publication events; where a run cannot
be forwarded whole (no core yet, no route) each publication takes the `tm`
path alone. What changes is the grain of forwarding: one parent is drawn per
run, not per publication, toward the core. A run of one publication goes
out as a plain `tm`, so traffic at a low rate looks as before. Runs are cut
to fit one datagram (`max_datagram`).

The usual run is handled as columns rather than a publication at a time: a
run whose topics all go on the same filters is numbered as one seq range and
cut into `tb`s from its topic and payload lists (`_originate_uniform_run`),
and a `tb` whose publications are all new, none on a `$` topic, and all or
none wanted here is taken with one set operation per cache and given to the
embedder as one `InjectionRun` (`_take_whole_batch`). At the bridge chain's
rate a wrapper has a few microseconds per message in all (docs/benchmarks.md),
and the per-publication loop alone took about one. Anything else goes
through the loop; the two give the same caches, injections, counters and
events (tests/protocol/test_run_fast_paths.py).

This is the data path: per publication it allocates nothing it can avoid
and reads nothing twice (the cache keys of a run are made from one stream
number each, `StreamNumbers.base`).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import add
from typing import Any

from federation.protocol import events
from federation.protocol.context import Identity, Outbox
from federation.protocol.custody import Custody, Entry
from federation.protocol.dedup import SeenCache, StreamBases, StreamNumbers, injected_key, seen_key
from federation.protocol.forwarding import NOT_SENT, PublicationRouting, Routed
from federation.protocol.modes import RETAINED_FILTER
from federation.protocol.ordering import Ordering, Position
from federation.protocol.shared import SharedGroups
from federation.protocol.topic_filter import is_system
from federation.protocol.types import Address, Injection, InjectionRun, PublicationId
from federation.protocol.wire import MODE_TO_MEMBER, MODE_TOWARD_CORE, TOPIC_BATCH, encode
from federation.protocol.wire_types import Sender, TopicBatch, TopicMessage

MAX_SEQ = 2**64

Numbered = tuple[int, str, bytes, list[str]]
"""a local publication of a run, numbered: (seq, topic, payload, the filters it is sent on)"""
"""above every seq: the floor when a stream has passed a later epoch (everything of an earlier one is late)"""
ITEM_OVERHEAD = 17
"""bytes msgpack adds to a run entry at most beyond its topic and payload: seq (9), topic and payload headers"""


def _none_system(topics: set[str]) -> bool:
    """Is none of `topics` a `$` topic (which is never federated)?"""
    return not any(is_system(topic) for topic in topics)


def _same_filters(filters_of: list[list[str]]) -> bool:
    """Are the filters of each topic of a run the same (in the same order)?"""
    first = filters_of[0]
    return all(filters == first for filters in filters_of)


def batch_item_size(item: tuple[int, str, bytes]) -> int:
    """Bytes one publication (seq, topic, payload) adds to a `tb`, at most (for `Outbox.split`)."""
    _seq, topic, payload = item
    return ITEM_OVERHEAD + len(payload) + (len(topic) if topic.isascii() else len(topic.encode()))


class Publications:
    """Our publications and the ones we receive: numbering, duplicate caches, local delivery, routing."""

    def __init__(self, identity: Identity, outbox: Outbox, router: PublicationRouting,
                 local_matching: Callable[[str], list[str]], custody: Custody, ordering: Ordering,
                 shared: SharedGroups) -> None:
        settings = identity.settings
        self._identity = identity
        self._max_hops = settings.max_hops
        self._outbox = outbox
        self._router = router
        self._local_matching = local_matching
        """the federated filters with local subscribers that match a topic"""
        self.unmatched_filter: Callable[[str], bool] | None = None
        """set by `Node.hold_unmatched`: whether a publication on this federated filter that no local subscription
        matches is handed over all the same, marked (`Injection.unmatched_hops`), for the embedder to hold until it
        has read its broker's subscriptions up to a point after it arrived"""
        self.streams = StreamNumbers(settings.duplicate_cache_size)
        """the numbers that make the keys of `seen` and `injected` ints (dedup.seen_key, dedup.injected_key)"""
        self.seen = SeenCache(settings.duplicate_cache_size)
        """(publication, filter) pairs handled"""
        self.injected = SeenCache(settings.duplicate_cache_size)
        """publications given to the local broker (or made there)"""
        self._custody = custody
        self._shared = shared
        """the shared subscription groups federation-wide: mode 2 copies (docs/protocol.md rule 9)"""
        self.ordering = ordering
        self.last_sent: dict[str, Position] = {}
        """filter -> our QoS 1/2 publication sent last on it (the next one's `prev`)"""
        self.parked: list[tuple[PublicationId, str, bytes, int, bool, dict[str, Any] | None]] = []
        """our QoS 1/2 publications waiting for the node to learn the filters, and our retained ones waiting for
        the retained tree to form (`local_publish`)"""
        self.retained_ready_at = float("-inf")
        """when our retained publications may use the retained tree this node made (`_with_retained_tree`)"""

    @property
    def address(self) -> Address:
        """Our own announced address."""
        return self._identity.address

    def _unmatched_wanted(self, filter_: str) -> bool:
        """A publication on `filter_` that no local subscription matches is handed over marked (`unmatched_filter`)."""
        wanted = self.unmatched_filter
        return wanted is not None and wanted(filter_)

    def handled(self, message: TopicMessage) -> bool:
        """Has this (publication, filter) been handled here already?"""
        return seen_key(self.streams, message.origin, message.epoch, message.seq, message.filter) in self.seen

    def seen_key(self, message: TopicMessage) -> int:
        """The duplicate cache's key of a (publication, filter), for `handled_key` and `take`."""
        return seen_key(self.streams, message.origin, message.epoch, message.seq, message.filter)

    # ------------------------------------------------------------ our publications

    def local_publish(self, topic: str, payload: bytes, qos: int, retain: bool, properties: dict[str, Any] | None,
                      now: float, publication: PublicationId | None = None) -> PublicationId | None:
        """A publication made on the local broker; returns its id, or None for a `$` topic (not federated).
        `publication`: the id it was given before (the embedder replays its spool after a restart).

        A QoS 1/2 one that matches no filter while the node is still learning the filters from its neighbours
        (just started) waits until it has learned them (`parked`), and so do the ones after it, in order: a
        restarted wrapper reads its spool and its broker's backlog first thing."""
        if is_system(topic):
            return None
        identity = self._identity
        replayed = publication is not None
        if publication is None:
            identity.publication_seq += 1
            publication = (identity.address, identity.epoch, identity.publication_seq)
        elif publication[1] == identity.epoch and publication[2] > identity.publication_seq:
            identity.publication_seq = publication[2]  # never number a new one the same
        self.injected.add(injected_key(self.streams, *publication))  # the local broker has it already
        router, outbox = self._router, self._outbox
        filters = router.matching(topic)
        if retain:
            filters = self._with_retained_tree(filters, now)
        outbox.counters["publications_originated"] += 1
        if outbox.publication_events:
            outbox.runs.originated(now, publication[0], publication[1], publication[2], topic, qos, retain,
                                   len(payload), filters)
        if ((qos or retain) and self.parked) or (qos and not filters and router.learning(now)) or \
                (retain and now < self.retained_ready_at):
            self.parked.append((publication, topic, payload, qos, retain, properties))
            return publication
        self._send_own(publication, topic, payload, qos, retain, properties, filters, now, replayed)
        return publication

    def next_ids(self, topics: list[str]) -> list[PublicationId | None]:
        """The ids our next local publications on `topics` will get, in this order (None for a `$` topic, which is
        not federated), as `local_publish` and the runs number them, without numbering them."""
        identity = self._identity
        address, epoch, seq = identity.address, identity.epoch, identity.publication_seq
        ids: list[PublicationId | None] = []
        for topic in topics:
            if is_system(topic):
                ids.append(None)
            else:
                seq += 1
                ids.append((address, epoch, seq))
        return ids

    def _with_retained_tree(self, filters: list[str], now: float) -> list[str]:
        """A retained publication's filters: the retained publications' tree first, then the matching ones (used
        while the tree cannot route). The first retained publication a node knows of makes the tree: the mesh
        places its core on the lowest id, every node joins it as it hears of it, and our retained publications
        wait `retained_tree_wait` for them (`parked`)."""
        router = self._router
        if RETAINED_FILTER not in router.topics:
            if router.state(RETAINED_FILTER) is None:
                return filters  # topics full (counted): the matching filters alone
            router.dirty.add(RETAINED_FILTER)
            self.retained_ready_at = now + self._identity.settings.retained_tree_wait
        return [RETAINED_FILTER, *filters]

    def unpark_at(self, learned_at: float) -> float:
        """When the parked publications may go (`learned_at`: when the node has learned the filters)."""
        return max(learned_at, self.retained_ready_at)

    def unpark(self, now: float) -> None:
        """The node has learned the filters: the publications that waited for it go out, in order."""
        parked, self.parked = self.parked, []
        for publication, topic, payload, qos, retain, properties in parked:
            filters = self._router.matching(topic)
            self._send_own(publication, topic, payload, qos, retain, properties,
                           self._with_retained_tree(filters, now) if retain else filters, now, True)

    def _send_own(self, publication: PublicationId, topic: str, payload: bytes, qos: int, retain: bool,
                  properties: dict[str, Any] | None, filters: list[str], now: float, replayed: bool) -> None:
        """Our publication onto every filter that carries it; QoS 1/2 into custody. `replayed`: it may be in
        custody already (an id given again, a parked one)."""
        router, custody, last_sent = self._router, self._custody, self.last_sent
        address, epoch, seq = publication
        position = (epoch, seq)
        messages = []
        for filter_ in router.publication_filters(filters):
            if not self.seen.add(seen_key(self.streams, address, epoch, seq, filter_)) or \
                    (replayed and qos and custody.get(publication, filter_)):
                continue  # replayed, and still here from its first time
            prev = None
            if qos:
                last = last_sent.get(filter_)
                if last is None or last < position:
                    if last is not None and custody.own_open((address, last[0], last[1])):
                        prev = last  # still on its way somewhere: receivers wait for it
                    last_sent[filter_] = position
            messages.append(TopicMessage(filter_, address, epoch, seq, MODE_TOWARD_CORE, 0, topic, payload, qos,
                                         retain, properties, prev))
        shared = self._shared
        to_members = [] if not shared.active else [
            TopicMessage(filter_, address, epoch, seq, MODE_TO_MEMBER, 0, topic, payload, qos, retain, properties,
                         None, target)
            for filter_, target in shared.targets(topic, publication)
            if self.seen.add(seen_key(self.streams, address, epoch, seq, filter_))
            and not (replayed and qos and custody.get(publication, filter_))]
        if not qos:
            for message in messages:
                router.route(router.topics[message.filter], message, None, now)
            for message in to_members:
                shared.route(message, None, now)
            return
        # In custody: every filter's entry is open before any is routed, so the publication is released only
        # when all of them are done.
        entries: list[Entry] = [custody.open(message, None) for message in (*messages, *to_members)]
        for entry in entries:
            if entry.message.mode == MODE_TO_MEMBER:
                shared.route(entry.message, None, now)
            else:
                router.route(router.topics[entry.message.filter], entry.message, None, now)
        for entry in entries:
            custody.settle(entry)
        if not entries:
            custody.release_now(publication)
        if len(self.last_sent) > 2 * len(router.topics) + 64:  # filters long gone
            self.last_sent = {f: p for f, p in self.last_sent.items() if f in router.topics}

    def _number_run(self, run: list[tuple[str, bytes]]) -> tuple[list[PublicationId | None], list[Numbered]]:
        """What originating a run of plain local publications starts with, at any QoS: each but a `$` topic
        numbered (the seqs of a pass are contiguous), marked as already at the local broker, with the filters it
        is sent on. Returns the ids in the order read (None for a `$` topic) and the numbered ones."""
        identity, router = self._identity, self._router
        address, epoch = identity.address, identity.epoch
        injected_base = self.streams.base(address.host, address.port, epoch, None)
        matching, publication_filters = router.matching, router.publication_filters
        seq = identity.publication_seq
        topics = {topic for topic, _payload in run}
        if _none_system(topics):  # the usual run: every one numbered a run at a time
            filters_of = {topic: publication_filters(matching(topic)) for topic in topics}  # read, never changed
            seqs = self._number_range(len(run))
            return ([(address, epoch, seq) for seq in seqs],
                    [(seq, topic, payload, filters_of[topic]) for seq, (topic, payload) in zip(seqs, run, strict=True)])
        injected_add = self.injected.add
        made: list[PublicationId | None] = []
        numbered: list[Numbered] = []
        for topic, payload in run:
            if is_system(topic):
                made.append(None)
                continue
            seq += 1
            made.append((address, epoch, seq))
            injected_add(injected_base | seq)  # the local broker has it already
            numbered.append((seq, topic, payload, publication_filters(matching(topic))))
        self._outbox.counters["publications_originated"] += len(numbered)
        identity.publication_seq = seq
        return made, numbered

    def _number_range(self, count: int) -> range:
        """The next `count` seqs of ours, numbered as `_number_run`'s loop numbers them: each marked as at the local
        broker already, and counted as originated."""
        identity = self._identity
        address = identity.address
        seqs = range(identity.publication_seq + 1, identity.publication_seq + 1 + count)
        injected_base = self.streams.base(address.host, address.port, identity.epoch, None)
        self.injected.add_all([injected_base | seq for seq in seqs])
        self._outbox.counters["publications_originated"] += count
        identity.publication_seq += count
        return seqs

    def _originated_event(self, numbered: list[Numbered], qos: int, now: float) -> None:
        """The run event of the publications `_number_run` numbered (when publication events are on)."""
        outbox = self._outbox
        if not numbered or not outbox.publication_events:
            return
        identity, matching = self._identity, self._router.matching
        topics = [topic for _, topic, _, _ in numbered]
        outbox.runs.originated_run(now, identity.address, identity.epoch, range(numbered[0][0], numbered[-1][0] + 1),
                                   topics, qos, False, sum(len(payload) for _, _, payload, _ in numbered),
                                   {f for topic in set(topics) for f in matching(topic)})

    def originate_run(self, run: list[tuple[str, bytes]], now: float) -> list[PublicationId | None]:
        """QoS 0 publications made on the local broker, neither retained nor with properties, in the order read,
        sent as `tb` runs per filter; returns their ids (None for a `$` topic), as `local_publish` does."""
        made = self._originate_uniform_run(run, now)
        if made is not None:
            return made
        identity, outbox, router = self._identity, self._outbox, self._router
        address, epoch = identity.address, identity.epoch
        made, numbered = self._number_run(run)
        seen_bases = StreamBases(self.streams, address, epoch)  # the cache keys are made a run at a time
        to_groups = self._shared.active  # shared subscription groups known (rule 9)
        runs: dict[str, list[tuple[int, str, bytes]]] = {}
        seen_add = self.seen.add
        for seq, topic, payload, filters in numbered:
            if to_groups:
                self._send_to_members((address, epoch, seq), topic, payload, now)
            for filter_ in filters:
                seen_add(seen_bases[filter_] | seq)
                bucket = runs.get(filter_)
                if bucket is None:
                    bucket = runs[filter_] = []
                bucket.append((seq, topic, payload))
        self._originated_event(numbered, 0, now)
        for filter_, items in runs.items():
            state = router.topics[filter_]
            if len(items) == 1:  # alone on its filter: a plain `tm`
                seq, topic, payload = items[0]
                message = TopicMessage(filter_, address, epoch, seq, MODE_TOWARD_CORE, 0, topic, payload, 0, False,
                                       None)
                router.route(state, message, None, now)
                continue
            header = len(encode(TOPIC_BATCH, Sender(identity.broker_id, epoch),
                                TopicBatch(filter_, address, epoch, MODE_TOWARD_CORE, 255, [])))
            for part in outbox.split(items, batch_item_size, header):
                flat = [field for item in part for field in item]
                router.route_batch(state, TopicBatch(filter_, address, epoch, MODE_TOWARD_CORE, 0, flat), None, now)
        return made

    def _originate_uniform_run(self, run: list[tuple[str, bytes]], now: float) -> list[PublicationId | None] | None:
        """`originate_run` for the usual run, a run at a time: no shared group known, no `$` topic, and every
        topic sent on the same filters. Then the seqs are one range and each filter's `tb`s are cut from the
        topic and payload columns, with the caches, counters, event and packets the loop in `originate_run`
        makes (its keys in its order: by publication, then by filter). None (nothing done) for any other run,
        and for a run of one."""
        if self._shared.active or len(run) < 2:  # one alone goes as a `tm`: the loop's
            return None
        topics = [topic for topic, _payload in run]
        distinct = set(topics)
        if not _none_system(distinct):
            return None
        router = self._router
        matching, publication_filters = router.matching, router.publication_filters
        filters_of = [publication_filters(matching(topic)) for topic in distinct]
        filters = filters_of[0]
        if not _same_filters(filters_of):
            return None
        identity, outbox = self._identity, self._outbox
        address, epoch = identity.address, identity.epoch
        payloads = [payload for _topic, payload in run]
        seqs = self._number_range(len(run))
        seen_bases = StreamBases(self.streams, address, epoch)
        bases = [seen_bases[filter_] for filter_ in filters]
        if len(bases) == 1:
            self.seen.add_all([bases[0] | seq for seq in seqs])
        else:
            self.seen.add_all([base | seq for seq in seqs for base in bases])
        if outbox.publication_events:
            outbox.runs.originated_run(now, address, epoch, seqs, topics, 0, False, sum(map(len, payloads)),
                                       {f for topic in distinct for f in matching(topic)})
        if filters:
            topic_bytes = {topic: len(topic) if topic.isascii() else len(topic.encode()) for topic in distinct}
            sizes = list(map(add, map(topic_bytes.__getitem__, topics), map(len, payloads)))  # + ITEM_OVERHEAD each
            seq_list = list(seqs)
        for filter_ in filters:
            state = router.topics[filter_]
            header = len(encode(TOPIC_BATCH, Sender(identity.broker_id, epoch),
                                TopicBatch(filter_, address, epoch, MODE_TOWARD_CORE, 255, [])))
            for start, stop in outbox.cut(sizes, header, ITEM_OVERHEAD):
                flat: list[Any] = [None] * (3 * (stop - start))
                flat[0::3] = seq_list[start:stop]
                flat[1::3] = topics[start:stop]
                flat[2::3] = payloads[start:stop]
                router.route_batch(state, TopicBatch(filter_, address, epoch, MODE_TOWARD_CORE, 0, flat), None, now)
        return [(address, epoch, seq) for seq in seqs]

    def originate_reliable_run(self, run: list[tuple[str, bytes]], qos: int, now: float) -> list[PublicationId | None]:
        """QoS 1/2 publications made on the local broker, neither retained nor with properties, in the order read:
        each into custody as `local_publish` takes it, sent as `tq` runs per filter (rule 7e); returns their ids
        (None for a `$` topic). The caller has checked that none would be parked and no shared group is known."""
        identity, router, custody = self._identity, self._router, self._custody
        address, epoch = identity.address, identity.epoch
        made, numbered = self._number_run(run)
        seen_bases = StreamBases(self.streams, address, epoch)
        seen_add = self.seen.add
        last_sent, own_open, open_entry = self.last_sent, custody.own_open, custody.open
        runs: dict[str, list[TopicMessage]] = {}
        entries: list[Entry] = []  # opened as each is made: the next one's `prev` asks whether it is still open
        for seq, topic, payload, filters in numbered:
            if not filters:
                custody.release_now((address, epoch, seq))  # no filter carries it: nothing to wait for
                continue
            position = (epoch, seq)
            for filter_ in filters:
                seen_add(seen_bases[filter_] | seq)
                prev = None
                last = last_sent.get(filter_)
                if last is None or last < position:
                    if last is not None and own_open((address, last[0], last[1])):
                        prev = last  # still on its way somewhere: receivers wait for it
                    last_sent[filter_] = position
                message = TopicMessage(filter_, address, epoch, seq, MODE_TOWARD_CORE, 0, topic, payload, qos, False,
                                       None, prev)
                entries.append(open_entry(message, None))
                messages = runs.get(filter_)
                if messages is None:
                    runs[filter_] = [message]
                else:
                    messages.append(message)
        self._originated_event(numbered, qos, now)
        # Every entry is open before any is routed: a publication is released only when all its filters are done.
        route_run, states = router.route_run, router.topics
        for filter_, messages in runs.items():
            route_run(states[filter_], messages, None, now)
        custody.settle_all(entries)
        if len(last_sent) > 2 * len(states) + 64:  # filters long gone
            self.last_sent = {f: p for f, p in last_sent.items() if f in states}
        return made

    def _send_to_members(self, publication: PublicationId, topic: str, payload: bytes, now: float) -> None:
        """A QoS 0 publication of a run to the member broker chosen for each shared group it matches."""
        address, epoch, seq = publication
        for filter_, target in self._shared.targets(topic, publication):
            self.seen.add(seen_key(self.streams, address, epoch, seq, filter_))
            self._shared.route(TopicMessage(filter_, address, epoch, seq, MODE_TO_MEMBER, 0, topic, payload, 0, False,
                                            None, None, target), None, now)

    # ------------------------------------------------------------ publications from neighbours

    def on_message(self, message: TopicMessage, from_announced: Address, now: float) -> Routed:
        """A `tm` from a neighbour (announced address): handled once, delivered once and in order, routed on."""
        if not self.seen.add(seen_key(self.streams, message.origin, message.epoch, message.seq, message.filter)):
            self.duplicate(message, from_announced, now)
            return NOT_SENT
        return self._take(message, from_announced, now)

    def take(self, message: TopicMessage, key: int, from_announced: Address, now: float) -> Routed:
        """A QoS 1/2 `tm` the node found new (its `seen_key` is `key`) and took into custody (its entry is open):
        as `on_message`, its injection joining the entry's obligations."""
        self.seen.add(key)
        return self._take(message, from_announced, now)

    def _take(self, message: TopicMessage, from_announced: Address, now: float) -> Routed:
        outbox = self._outbox
        if is_system(message.topic):
            self._drop_system_topic(message.topic, from_announced, now)
            return NOT_SENT
        if message.mode == MODE_TO_MEMBER:
            return self.to_member(message, from_announced, now)
        matched = message.retain or bool(self._local_matching(message.topic))
        unmatched = not matched and self._unmatched_wanted(message.filter)
        if message.qos:
            key = injected_key(self.streams, message.origin, message.epoch, message.seq)
            want = key not in self.injected and (matched or unmatched)
            if want:
                self._custody.expect_injection(message.publication, message.filter)
            for released in self.ordering.offer(message, want, now):  # this one and what waited for it
                if released is message:
                    self.inject(released, now, key, unmatched)
                else:
                    self.inject(released, now)
        elif matched or unmatched:
            key = injected_key(self.streams, message.origin, message.epoch, message.seq)
            if key not in self.injected and not self.ordering.qos0_late(message.origin, message.filter,
                                                                        message.epoch, message.seq):
                self.inject(message, now, key, unmatched)
        if message.hops + 1 >= self._max_hops:
            outbox.drop("max_hops")
            return NOT_SENT
        router = self._router
        state = router.state(message.filter)
        if state is None:
            outbox.drop("topics_full")
            return NOT_SENT
        return router.route(state, message, from_announced, now)

    def take_repair(self, message: TopicMessage, now: float) -> None:
        """A repair of a publication for us (rule 7f), as a copy of its filter's (`message`) the node took into
        custody: handled once, delivered once and in its stream's order, and not routed on (every receiver the
        origin awaits gets a repair of its own)."""
        self.seen.add(seen_key(self.streams, message.origin, message.epoch, message.seq, message.filter))
        self._outbox.counters["repairs_taken"] += 1
        if is_system(message.topic):
            return
        key = injected_key(self.streams, message.origin, message.epoch, message.seq)
        matched = message.retain or bool(self._local_matching(message.topic))
        unmatched = not matched and self._unmatched_wanted(message.filter)
        want = key not in self.injected and (matched or unmatched)
        if want:
            self._custody.expect_injection(message.publication, message.filter)
        for released in self.ordering.offer(message, want, now):  # this one and what waited for it
            if released is message:
                self.inject(released, now, key, unmatched)
            else:
                self.inject(released, now)

    def take_run(self, messages: list[TopicMessage], from_announced: Address, now: float) -> Routed:
        """QoS 1/2 publications of one `tq` the node found new and took into custody (their entries are open): each
        delivered once and in order as `take` would, then routed on together (one decision for the run)."""
        ordering, custody, injected = self.ordering, self._custody, self.injected
        local_matching = self._local_matching
        first = messages[0]  # one origin and epoch: the injection keys' base once for the run
        injected_base = self.streams.base(first.origin.host, first.origin.port, first.epoch, None)
        unmatched_wanted = self._unmatched_wanted(first.filter)  # one filter for the run
        routed: list[TopicMessage] = []
        for message in messages:
            if is_system(message.topic):
                self._drop_system_topic(message.topic, from_announced, now)
                continue
            key = injected_base | message.seq
            matched = bool(local_matching(message.topic))
            unmatched = unmatched_wanted and not matched
            want = key not in injected and (matched or unmatched)
            if want:
                custody.expect_injection(message.publication, message.filter)
            for released in ordering.offer(message, want, now):  # this one and what waited for it
                if released is message:
                    self.inject(released, now, key, unmatched)
                else:
                    self.inject(released, now)
            routed.append(message)
        if not routed:
            return NOT_SENT
        first = routed[0]
        if first.hops + 1 >= self._max_hops:
            self._outbox.drop("max_hops", len(routed))
            return NOT_SENT
        router = self._router
        state = router.state(first.filter)
        if state is None:
            self._outbox.drop("topics_full", len(routed))
            return NOT_SENT
        return router.route_run(state, routed, from_announced, now)

    def to_member(self, message: TopicMessage, from_announced: Address | None, now: float) -> Routed:
        """A mode 2 copy: on toward its target, or given to our broker when we serve its group."""
        routed = self._shared.route(message, from_announced, now)
        if routed is None:
            self.serve_group(message, now)
            return NOT_SENT
        return routed

    def serve_group(self, message: TopicMessage, now: float) -> None:
        """Give a mode 2 copy to our broker, which serves the group (once per publication, as every injection;
        no stream order across a group's failovers: docs/protocol.md rule 9)."""
        key = injected_key(self.streams, message.origin, message.epoch, message.seq)
        if message.qos and key not in self.injected:
            self._custody.expect_injection(message.publication, message.filter)
        self.inject(message, now, key, False)  # a group's member is chosen, not matched here

    def duplicate(self, message: TopicMessage, from_announced: Address, now: float) -> None:
        """A copy of a (publication, filter) handled here before: counted, reported."""
        outbox = self._outbox
        outbox.counters["duplicates_dropped"] += 1
        if outbox.publication_events:
            outbox.runs.duplicate(now, message.origin, message.epoch, message.seq, message.filter, str(from_announced))

    def inject(self, message: TopicMessage, now: float, key: int | None = None, unmatched: bool | None = None) -> None:
        """Hand a publication to the local broker unless it was already (through another filter). `key`: its
        `injected_key`, when the caller has it; `unmatched`: no local subscription matches it and it is handed
        over marked (`unmatched_filter`), None to find out here (one that waited for its order)."""
        publication = message.publication
        if key is None:
            key = injected_key(self.streams, *publication)
        if not self.injected.add(key):
            return
        if self._shared.local:
            self._shared.note_injected(message)
        outbox = self._outbox
        if unmatched is None:
            unmatched = (self.unmatched_filter is not None and not message.retain
                         and not self._local_matching(message.topic))
        if unmatched:  # counted and evented as delivered only if `Node.settle_unmatched` finds a subscriber
            outbox.injections.append(Injection(message.topic, message.payload, message.qos, message.retain,
                                               message.properties, publication, message.filter, message.hops + 1))
            outbox.counters["publications_unmatched"] += 1
            return
        outbox.injections.append(Injection(message.topic, message.payload, message.qos, message.retain,
                                           message.properties, publication, message.filter))
        outbox.counters["publications_delivered"] += 1
        if outbox.publication_events:
            outbox.runs.delivered(now, message.origin, message.epoch, message.seq, message.topic, message.filter,
                                  message.hops + 1)

    def forget(self, message: TopicMessage) -> None:
        """A (publication, filter) given back unacknowledged: its next arrival is a first one again."""
        self.seen.discard(seen_key(self.streams, *message.publication, message.filter))

    def forget_injection(self, publication: PublicationId) -> None:
        """The embedder could not inject it: a later copy may be injected again."""
        self.injected.discard(injected_key(self.streams, *publication))

    def mark_injected(self, publications: list[PublicationId]) -> None:
        """Publications the local broker already has (the embedder's journal, after a restart)."""
        add, streams = self.injected.add, self.streams
        for publication in publications:
            add(injected_key(streams, *publication))

    def on_batch(self, batch: TopicBatch, from_announced: Address, now: float) -> Routed:
        """A `tb` from a neighbour: each publication as `on_message` would handle its `tm`, routed on as a run."""
        filter_, origin, epoch = batch.filter, batch.origin, batch.epoch
        streams = self.streams  # the cache keys are `dedup.seen_key` and `injected_key`, made a run at a time
        seen_base = streams.base(origin.host, origin.port, epoch, filter_)
        injected_base = streams.base(origin.host, origin.port, epoch, None)
        injected = self.injected
        seen_add, injected_add = self.seen.add, injected.add
        local_matching = self._local_matching
        outbox = self._outbox
        injections = outbox.injections
        events_on = outbox.publication_events
        # QoS 0 order (federation.protocol.ordering): a publication older than the last one injected from this
        # stream is late; within the run the seqs rise.
        qos0 = self.ordering.qos0
        stream = (origin, filter_)
        last = qos0.get(stream)
        floor = -1 if last is None or last[0] < epoch else last[1] if last[0] == epoch else MAX_SEQ
        if self._take_whole_batch(batch, seen_base, injected_base, floor, now):
            return self._route_batch_on(batch, batch.items, from_announced, now)
        unmatched_wanted = self._unmatched_wanted(filter_)
        unmatched_hops = batch.hops + 1
        newest = -1
        late = 0
        delivered = duplicates = unmatched = 0
        kept: list[Any] = []
        duplicate_seqs: list[int] = []
        delivered_seqs: list[int] = []
        delivered_topics: list[str] = []
        items = iter(batch.items)
        for seq, topic, payload in zip(items, items, items, strict=True):
            if not seen_add(seen_base | seq):
                duplicates += 1
                if events_on:
                    duplicate_seqs.append(seq)
                continue
            if is_system(topic):
                self._drop_system_topic(topic, from_announced, now)
                continue
            if local_matching(topic):
                if seq < floor:  # late: injected only if another filter brought it in time
                    late += injected_base | seq not in injected
                elif injected_add(injected_base | seq):
                    newest = seq
                    injections.append(Injection(topic, payload, 0, False, None, (origin, epoch, seq), filter_))
                    delivered += 1
                    if events_on:
                        delivered_seqs.append(seq)
                        delivered_topics.append(topic)
            elif unmatched_wanted and seq >= floor and injected_add(injected_base | seq):
                newest = seq  # handed over marked (`unmatched_filter`): delivered if `Node.settle_unmatched` says so
                injections.append(Injection(topic, payload, 0, False, None, (origin, epoch, seq), filter_,
                                            unmatched_hops))
                unmatched += 1
            kept.append(seq)
            kept.append(topic)
            kept.append(payload)
        counters = outbox.counters
        if duplicate_seqs:
            outbox.runs.duplicates(now, origin, epoch, duplicate_seqs, filter_, str(from_announced))
        if delivered_seqs:
            outbox.runs.delivered_run(now, origin, epoch, delivered_seqs, delivered_topics, filter_, batch.hops + 1)
        if newest >= 0:
            self.ordering.qos0_set(stream, (epoch, newest))
        if late:
            outbox.drop("qos0_late", late)
        if duplicates:
            counters["duplicates_dropped"] += duplicates
        if delivered:
            counters["publications_delivered"] += delivered
        if unmatched:
            counters["publications_unmatched"] += unmatched
        return self._route_batch_on(batch, kept, from_announced, now)

    def _take_whole_batch(self, batch: TopicBatch, seen_base: int, injected_base: int, floor: int,
                          now: float) -> bool:
        """`on_batch` for the usual `tb`, a run at a time: when every publication is new here, none is on a `$`
        topic, and either none has local subscribers or all have, are in time (`floor`) and new to the broker,
        take them all as the loop in `on_batch` would (the same cache entries, injections, counters, events)
        and return True; else change nothing and return False (the loop takes them one at a time)."""
        items = batch.items
        seqs, topics = items[0::3], items[1::3]
        distinct = set(topics)
        if any(is_system(topic) for topic in distinct):
            return False
        local_matching = self._local_matching
        wanted = {bool(local_matching(topic)) for topic in distinct}
        if len(wanted) != 1:
            return False  # some wanted here, some not
        seen_keys = [seen_base | seq for seq in seqs]
        if True not in wanted:
            if self._unmatched_wanted(batch.filter):
                return False  # handed over marked, one at a time
            return self.seen.add_if_all_new(seen_keys)
        if min(seqs) < floor:
            return False
        seen = self.seen
        fresh = seen.all_new(seen_keys)  # both caches take their keys, or neither
        if fresh is None or not self.injected.add_if_all_new([injected_base | seq for seq in seqs]):
            return False
        seen.take_new(fresh)
        filter_, origin, epoch = batch.filter, batch.origin, batch.epoch
        outbox = self._outbox
        outbox.injections.append(InjectionRun(topics, items[2::3], origin, epoch, seqs, filter_))
        if outbox.publication_events:
            outbox.runs.delivered_run(now, origin, epoch, seqs, topics, filter_, batch.hops + 1)
        self.ordering.qos0_set((origin, filter_), (epoch, seqs[-1]))
        outbox.counters["publications_delivered"] += len(seqs)
        return True

    def _route_batch_on(self, batch: TopicBatch, kept: list[Any], from_announced: Address, now: float) -> Routed:
        """The publications of a `tb` that `on_batch` kept (flat), routed on as a run."""
        outbox = self._outbox
        if not kept:
            return NOT_SENT
        if batch.hops + 1 >= self._max_hops:
            outbox.drop("max_hops", len(kept) // 3)
            return NOT_SENT
        router = self._router
        state = router.state(batch.filter)
        if state is None:
            outbox.drop("topics_full", len(kept) // 3)
            return NOT_SENT
        if len(kept) != len(batch.items):
            batch = TopicBatch(batch.filter, batch.origin, batch.epoch, batch.mode, batch.hops, kept)
        return router.route_batch(state, batch, from_announced, now)

    def _drop_system_topic(self, topic: str, from_announced: Address, now: float) -> None:
        """A publication on a `$` topic from a neighbour: never federated, so a peer that sends one is broken."""
        self._outbox.drop("system_topic", event=events.PACKET_DROPPED, now=now, reason="system_topic",
                          detail=topic[:64], source=str(from_announced), size=0)
