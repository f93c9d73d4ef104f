"""Publications read from the local broker, handed to the node: what a wrapper originates.

Theory of operation: the running wrapper (running.py) reads a batch of
broker items and gives each publication here, in the order read, with the
log lines and state changes between them handled by itself. Plain
publications (not retained, without properties) of one QoS in a row are
kept as one run and reach the node in one call (`Node.local_publish_run`:
a `tb` for QoS 0, `tq` runs for QoS 1/2, federation.protocol.publications);
anything else ends the run first, so the order read is the order
originated. A retained publication or one with properties is stamped
(version, expiry: retained.py), and a retained one stored.

Custody (docs/protocol.md rule 7a): a QoS 1/2 publication is acknowledged
to the broker only once the spool holds it, and the spool holds it before
the node has it: a run's (or a publication's) spool entries are written
under the ids the node will give them (`Node.next_publication_ids`), then
the node takes them, and only then do their packet ids join the ones the
caller acknowledges (`take`). A wrapper killed at any point loses nothing
it acknowledged and originates nothing twice: what it had not spooled its
broker still has, unacknowledged, and sends again. A publication the spool
says is in custody since before a restart (the broker sends it again with
DUP) is acknowledged without being originated twice.

A full disk (the spool's write refused) is a state, not an error
(federation.daemon.storage): the run that could not be written and
everything read after it wait here, in order, unacknowledged (`stalled`),
while the caller reads nothing more from its broker; `retry` (every second)
writes and hands them over once the disk takes them again.

A payload above `max_publication_bytes` is refused (`refuse`): it reaches
the broker's own subscribers but is not federated, never truncated; it is
counted, reported as an event and logged at most once a minute.

With a topic policy (policy_edges.py) each publication is asked first: one
no `out`/`both` line allows is acknowledged and goes no further, the others
go on under their federation topic and at the QoS the lines allow at most
(the spool keeps them so: it replays what the node was given).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from itertools import repeat
from typing import Any

from federation.daemon.broker_items import Publication, PublicationRun
from federation.daemon.client_registry import is_record
from federation.daemon.policy_edges import PolicyEdges
from federation.daemon.retained import RetainedStore, stamp
from federation.daemon.retained_order import RetainedOrder
from federation.daemon.spool import Spool, SpooledPublication
from federation.daemon.storage import StorageHealth
from federation.protocol import events
from federation.protocol.node import Node
from federation.protocol.types import Event, PublicationId

log = logging.getLogger("federation.daemon")

Observer = Callable[[list[tuple[PublicationId | None, str, bytes, int, bool, dict[str, Any] | None]]], None]
"""told of local publications the node took: (id, topic, payload, QoS, retain, properties as the client sent them)"""

REFUSAL_LOG_INTERVAL = 60.0
"""seconds between log lines about publications refused for their size (every one is counted)"""


class LocalPublications:
    """The broker's publications of one batch after another, into the node, the spool and the retained store."""

    def __init__(self, node: Node, spool: Spool | None, retained: RetainedStore,
                 record_event: Callable[[Event], None], edges: PolicyEdges | None = None,
                 order: RetainedOrder | None = None, storage: StorageHealth | None = None) -> None:
        """`record_event`: counts an event and writes it to the event log (a refusal's); `edges`: the topic policy
        (none: everything leaves as it is); `order`: the retained injections the broker has not processed yet
        (a retained publication's version follows the broker's order: retained_order.py); `storage`: told when
        the spool cannot be written (a full disk)."""
        self.node = node
        self.storage = storage if storage is not None else StorageHealth(None)
        self.order = order if order is not None else RetainedOrder()
        self.edges = edges if edges is not None else PolicyEdges()
        self.spool = spool
        self.retained = retained
        self._record_event = record_event
        self._acks: list[tuple[int, int]] = []
        """(packet id, QoS) to acknowledge to the broker once the spool holds the batch"""
        self._spooled: list[SpooledPublication] = []
        self._run: list[tuple[str, bytes]] = []
        """plain publications of one QoS in a row, not yet handed to the node"""
        self._run_qos = 0
        self._run_mids: list[int] = []
        self._run_acks: list[tuple[int, int]] = []
        """the packet ids of the run under way: acknowledged once the node has the run (and the spool before it)"""
        self._stalled: list[tuple[int, list[tuple[str, bytes]], list[int], list[tuple[int, int]]]
                            | tuple[Publication, list[tuple[int, int]]]] = []
        """what the spool could not take (a full disk), in order: runs (qos, run, packet ids, acks) and single
        publications (the publication, its acks), not yet handed to the node"""
        self._held: list[Publication | PublicationRun] = []
        """what the broker handed over after that, as it came, unacknowledged (taken after the stalled ones)"""
        self._refused_logged_at = float("-inf")
        self._refused_unlogged = 0
        self.refused_records = 0
        """clients' retained publications on the registry's topics, refused (client_registry.py)"""
        self.observe: Observer | None = None
        """told of the publications the node took, with their ids, when no topic policy maps them (their topics are
        the broker's): roaming watches them while a session it adopted waits for its client (roaming.py)"""

    @property
    def stalled(self) -> bool:
        """Publications wait for the spool to take them (a full disk): read nothing more from the broker."""
        return bool(self._stalled)

    def add_run(self, item: PublicationRun, now: float) -> None:
        """Plain publications the client read as a run (`LeanClient.lean_run`): they join the run under way."""
        if self._stalled:
            self._held.append(item)
            return
        qos = item.qos
        if self.edges.active:
            self._add_run_through_policy(item, now)
            return
        if self._run and qos != self._run_qos:
            self.flush(now)
            if self._stalled:
                self._held.append(item)
                return
        self._run += zip(item.topics, item.payloads, strict=True)
        self._run_qos = qos
        if qos:
            self._run_mids += item.mids
            self._run_acks += zip(item.mids, repeat(qos))

    def _add_run_through_policy(self, item: PublicationRun, now: float) -> None:
        """`add_run` with a topic policy: each publication acknowledged, and asked (it may stay here, change its
        topic or its QoS: a change of QoS ends the run under way)."""
        qos = item.qos
        edges = self.edges
        mids = item.mids if qos else repeat(0)
        for topic, payload, mid in zip(item.topics, item.payloads, mids, strict=False):
            crossing = edges.export(topic, qos)
            if crossing is None:
                if qos:
                    self._acks.append((mid, qos))  # it stays on this broker: nothing to keep
                continue
            if self._run and crossing.qos != self._run_qos:
                self.flush(now)
            if self._stalled:  # the flush found the disk full: this one and the rest wait as they came
                self._held.append(PublicationRun([topic], [payload], qos, [mid] if qos else []))
                continue
            self._run.append((crossing.topic, payload))
            self._run_qos = crossing.qos
            if qos:
                self._run_acks.append((mid, qos))
            if crossing.qos:
                self._run_mids.append(mid)

    def add(self, item: Publication, now: float) -> None:
        """One publication: it joins the run under way when plain, else goes to the node after that run."""
        if self._stalled:
            self._held.append(item)
            return
        acks = [(item.mid, item.qos)] if item.qos else []
        if self.edges.active:
            crossing = self.edges.export(item.topic, item.qos)
            if crossing is None:
                self._acks += acks  # it stays on this broker: nothing to keep
                return
            # The spool and the node know it by what the policy made of it (a DUP is compared with that too).
            item = Publication(crossing.topic, item.payload, crossing.qos, item.retain, item.properties, item.mid,
                               item.dup)
        if item.retain and is_record(item.topic):
            self._acks += acks
            self.refused_records += 1  # a client cannot write the registry of client ids (client_registry.py)
            return
        qos = item.qos
        if qos:
            spool = self.spool
            if item.dup and spool is not None and spool.redelivery(item.mid, item.topic, item.payload):
                self._acks += acks
                return  # in custody since before a restart: acknowledged now, not originated twice
        if len(item.payload) > self.node.settings.max_publication_bytes:
            self._acks += acks
            self.refuse(item, now)
        elif not item.retain and item.properties is None:
            if self._run and qos != self._run_qos:
                self.flush(now)
                if self._stalled:
                    self._stalled.append((item, acks))
                    return
            self._run.append((item.topic, item.payload))
            self._run_qos = qos
            self._run_acks += acks
            if qos:
                self._run_mids.append(item.mid)
        else:
            self.flush(now)
            if self._stalled or not self._originate_spooled(item, acks, now):
                # behind what waits, or refused by the disk itself: it waits, in its place (left out, it would stay
                # unacknowledged at the broker until a reconnection and come after the publications read after it)
                self._stalled.append((item, acks))

    def acknowledge(self, mid: int, qos: int) -> None:
        """A broker item that is no publication of ours (a log line) still has its packet id acknowledged."""
        self._acks.append((mid, qos))

    def flush(self, now: float) -> None:
        """The run under way to the node (before an item that must come after it, and at the end of a batch)."""
        run = self._run
        if not run:
            return
        qos, mids, acks = self._run_qos, self._run_mids, self._run_acks
        self._run, self._run_mids, self._run_acks = [], [], []
        if self._stalled or not self._hand_run(qos, run, mids, acks, now):  # behind what waits: never before it
            self._stalled.append((qos, run, mids, acks))

    def _hand_run(self, qos: int, run: list[tuple[str, bytes]], mids: list[int], acks: list[tuple[int, int]],
                  now: float) -> bool:
        """Spool a run (QoS 1/2) under the ids the node will give it, then hand it to the node and let its packet
        ids be acknowledged; False, and nothing done, when the spool cannot take it (a full disk)."""
        node = self.node
        if qos and self.spool is not None:
            ids = node.next_publication_ids([topic for topic, _payload in run])
            wall = time.time()
            entries = [SpooledPublication(publication[1], publication[2], topic, payload, qos, False, None, wall,
                                          mid)
                       for (topic, payload), mid, publication in zip(run, mids, ids, strict=True)
                       if publication is not None]
            if not self._write(entries, now):
                return False
            made = node.local_publish_run(run, now, qos=qos)
            if made != ids:  # the spool holds them under other ids: a restart would replay them under those
                raise AssertionError(f"the node numbered a run {made[:3]}... not as it said {ids[:3]}...")
        else:
            made = node.local_publish_run(run, now, qos=qos)
        self._acks += acks
        if self.observe is not None and not self.edges.active:
            self.observe([(publication, topic, payload, qos, False, None)
                          for (topic, payload), publication in zip(run, made, strict=True)])
        return True

    def _originate_spooled(self, item: Publication, acks: list[tuple[int, int]], now: float) -> bool:
        """`originate` for a publication the broker waits to have acknowledged: spooled first (QoS 1/2), then
        handed over; False, and nothing done, when the spool cannot take it."""
        wall = time.time()
        properties = self._stamped(item, wall)
        if item.qos and self.spool is not None:
            (publication,) = self.node.next_publication_ids([item.topic])
            if publication is not None:
                entry = SpooledPublication(publication[1], publication[2], item.topic, item.payload, item.qos,
                                           item.retain, properties, wall, item.mid)
                if not self._write([entry], now):
                    return False
        self._publish(item, properties, now)
        self._acks += acks
        return True

    def _write(self, entries: list[SpooledPublication], now: float) -> bool:
        """Into the spool (durable when this returns True); False when the file system refuses it (said once)."""
        if not entries or self.spool is None:
            return True
        try:
            self.spool.add(entries)
        except OSError as error:
            self.storage.failed("the custody spool", error, now)
            return False
        return True

    def retry(self, now: float) -> bool:
        """A full disk's publications to the spool and the node again, in order, then what the broker handed over
        meanwhile; True when nothing waits any more."""
        while self._stalled:
            work = self._stalled[0]
            if len(work) == 4:
                qos, run, mids, acks = work
                done = self._hand_run(qos, run, mids, acks, now)
            else:
                item, acks = work
                done = self._originate_spooled(item, acks, now)
            if not done:
                return False
            self._stalled.pop(0)
        held, self._held = self._held, []
        for read in held:  # as they came: runs and single ones, in order (they may stall again)
            if isinstance(read, PublicationRun):
                self.add_run(read, now)
            else:
                self.add(read, now)
        self.flush(now)
        return not self._stalled

    def take(self) -> tuple[list[tuple[int, int]], list[SpooledPublication]]:
        """The batch's packet ids to acknowledge (of what the node has, spooled: `flush` wrote them) and spool
        entries still to write (none: kept for `originate_held`'s callers); both start anew."""
        acks, spooled = self._acks, self._spooled
        self._acks, self._spooled = [], []
        return acks, spooled

    def originate_held(self, items: list[Publication], now: float) -> int:
        """Publications no client just made (the retained messages the broker held, as the topic policy lets
        them out: retained_scan.py): each refused above the limit or originated, the spool written at once (no
        acknowledgement waits on it). Returns how many were originated."""
        limit = self.node.settings.max_publication_bytes
        spooled: list[SpooledPublication] = []
        originated = 0
        for item in items:
            if item.retain and is_record(item.topic):
                self.refused_records += 1
                continue
            if len(item.payload) > limit:
                self.refuse(item, now)
                continue
            entry = self.originate(item, now)
            originated += 1
            if entry is not None:
                spooled.append(entry)
        if spooled and self.spool is not None:
            self.spool.add(spooled)
        return originated

    def originate_record(self, topic: str, payload: bytes, now: float) -> None:
        """A record of the registry of client ids (federation.daemon.client_registry), this wrapper's own: a
        retained QoS 1 publication of its own, stamped and in custody as a client's would be (not asked of the
        topic policy: every wrapper reads the registry)."""
        entry = self.originate(Publication(topic, payload, 1, True, None), now)
        if entry is not None and self.spool is not None:
            self.spool.add([entry])

    def originate(self, item: Publication, now: float) -> SpooledPublication | None:
        """A local publication with a QoS, the retain flag or properties, to the node: stamped (version, expiry:
        retained.py), a retained one stored; returns the spool entry to write for a QoS 1/2 one (the caller writes
        it: no acknowledgement waits on it)."""
        wall = time.time()
        properties = self._stamped(item, wall)
        publication = self._publish(item, properties, now)
        if publication is None or not item.qos or self.spool is None:
            return None
        return SpooledPublication(publication[1], publication[2], item.topic, item.payload, item.qos, item.retain,
                                  properties, wall, item.mid)

    def _stamped(self, item: Publication, wall: float) -> dict[str, Any] | None:
        """Its properties with the federation's stamps (retained.py): a retained one's version follows its
        broker's order, after what the broker processed before it and before what it will process after it."""
        order_ms = None
        if item.retain:
            order_ms = self.order.local_ms(item.topic, int(wall * 1000), self.retained.known_ms(item.topic))
        return stamp(item.properties, item.retain, wall, order_ms)

    def _publish(self, item: Publication, properties: dict[str, Any] | None, now: float) -> PublicationId | None:
        """Hand it to the node; a retained one goes to the retained store too."""
        publication = self.node.local_publish(item.topic, item.payload, item.qos, item.retain, properties, now)
        if publication is not None and item.retain:
            self.retained.offer(item.topic, publication, item.qos, item.payload, properties)
        if self.observe is not None and not self.edges.active:
            self.observe([(publication, item.topic, item.payload, item.qos, item.retain, item.properties)])
        return publication

    def refuse(self, item: Publication, now: float) -> None:
        """A local publication above max_publication_bytes: not federated (never truncated), counted, logged."""
        node = self.node
        limit = node.settings.max_publication_bytes
        node.drop("publication_too_large")
        self._record_event(Event(now, str(node.address), events.PUBLICATION_DROPPED,
                                 {"pub": None, "filter": None, "reason": "too_large", "topic": item.topic,
                                  "size": len(item.payload)}))
        self._refused_unlogged += 1
        if now - self._refused_logged_at >= REFUSAL_LOG_INTERVAL:
            self._refused_logged_at = now
            others, self._refused_unlogged = self._refused_unlogged - 1, 0
            if others:
                log.warning("%d more publications above max_publication_bytes were refused since the last such "
                            "line (drop publication_too_large: %d in all)", others,
                            node.drops["publication_too_large"])
            log.warning("publication on %r refused: its payload of %d bytes is above max_publication_bytes (%d); "
                        "it reaches this broker's own subscribers but is not federated (set the broker's "
                        "message_size_limit to the same value so the publisher is refused at the source, or raise "
                        "settings.max_publication_bytes and max_packet on every wrapper to allow it; further "
                        "refusals are counted as drop publication_too_large and logged once a minute)",
                        item.topic, len(item.payload), limit)
