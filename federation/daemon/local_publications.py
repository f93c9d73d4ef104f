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
to the broker only once the spool holds it. So this collects, per batch,
the packet ids to acknowledge and the spool entries to write, and the
caller writes the entries in one write and then acknowledges (`take`): a
wrapper killed in between loses nothing it acknowledged. A publication the
spool says is in custody since before a restart (the broker sends it again
with DUP) is acknowledged without being originated twice.

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

from federation.daemon.broker_items import Publication, PublicationRun
from federation.daemon.policy_edges import PolicyEdges
from federation.daemon.retained import RetainedStore, stamp
from federation.daemon.retained_order import RetainedOrder
from federation.daemon.spool import Spool, SpooledPublication
from federation.protocol import events
from federation.protocol.node import Node
from federation.protocol.types import Event

log = logging.getLogger("federation.daemon")

REFUSAL_LOG_INTERVAL = 60.0
"""seconds between log lines about publications refused for their size (every one is counted)"""


class LocalPublications:
    """The broker's publications of one batch after another, into the node, the spool and the retained store."""

    def __init__(self, node: Node, spool: Spool | None, retained: RetainedStore,
                 record_event: Callable[[Event], None], edges: PolicyEdges | None = None,
                 order: RetainedOrder | None = None) -> None:
        """`record_event`: counts an event and writes it to the event log (a refusal's); `edges`: the topic policy
        (none: everything leaves as it is); `order`: the retained injections the broker has not processed yet
        (a retained publication's version follows the broker's order: retained_order.py)."""
        self.node = node
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
        self._refused_logged_at = float("-inf")
        self._refused_unlogged = 0

    def add_run(self, item: PublicationRun, now: float) -> None:
        """Plain publications the client read as a run (`LeanClient.lean_run`): they join the run under way."""
        qos = item.qos
        if self.edges.active:
            self._add_run_through_policy(item, now)
            return
        if self._run and qos != self._run_qos:
            self.flush(now)
        self._run += zip(item.topics, item.payloads, strict=True)
        self._run_qos = qos
        if qos:
            self._run_mids += item.mids
            self._acks += zip(item.mids, repeat(qos))

    def _add_run_through_policy(self, item: PublicationRun, now: float) -> None:
        """`add_run` with a topic policy: each publication acknowledged, and asked (it may stay here, change its
        topic or its QoS: a change of QoS ends the run under way)."""
        qos = item.qos
        edges = self.edges
        mids = item.mids if qos else repeat(0)
        for topic, payload, mid in zip(item.topics, item.payloads, mids, strict=False):
            if qos:
                self._acks.append((mid, qos))
            crossing = edges.export(topic, qos)
            if crossing is None:
                continue
            if self._run and crossing.qos != self._run_qos:
                self.flush(now)
            self._run.append((crossing.topic, payload))
            self._run_qos = crossing.qos
            if crossing.qos:
                self._run_mids.append(mid)

    def add(self, item: Publication, now: float) -> None:
        """One publication: it joins the run under way when plain, else goes to the node after that run."""
        qos = item.qos
        if qos:
            self._acks.append((item.mid, qos))
        if self.edges.active:
            crossing = self.edges.export(item.topic, qos)
            if crossing is None:
                return  # acknowledged: it stays on this broker
            # The spool and the node know it by what the policy made of it (a DUP is compared with that too).
            item = Publication(crossing.topic, item.payload, crossing.qos, item.retain, item.properties, item.mid,
                               item.dup)
            qos = item.qos
        if qos:
            spool = self.spool
            if item.dup and spool is not None and spool.redelivery(item.mid, item.topic, item.payload):
                return  # in custody since before a restart: acknowledged now, not originated twice
        if len(item.payload) > self.node.settings.max_publication_bytes:
            self.refuse(item, now)
        elif not item.retain and item.properties is None:
            if self._run and qos != self._run_qos:
                self.flush(now)
            self._run.append((item.topic, item.payload))
            self._run_qos = qos
            if qos:
                self._run_mids.append(item.mid)
        else:
            self.flush(now)
            entry = self.originate(item, now)
            if entry is not None:
                self._spooled.append(entry)

    def acknowledge(self, mid: int, qos: int) -> None:
        """A broker item that is no publication of ours (a log line) still has its packet id acknowledged."""
        self._acks.append((mid, qos))

    def flush(self, now: float) -> None:
        """The run under way to the node (before an item that must come after it, and at the end of a batch)."""
        run = self._run
        if not run:
            return
        qos, mids = self._run_qos, self._run_mids
        self._run, self._run_mids = [], []
        made = self.node.local_publish_run(run, now, qos=qos)
        if not qos or self.spool is None:
            return
        wall = time.time()
        spooled = self._spooled
        for (topic, payload), mid, publication in zip(run, mids, made, strict=True):
            if publication is not None:
                spooled.append(SpooledPublication(publication[1], publication[2], topic, payload, qos, False, None,
                                                  wall, mid))

    def take(self) -> tuple[list[tuple[int, int]], list[SpooledPublication]]:
        """The batch's packet ids to acknowledge and spool entries to write (the spool first); both start anew."""
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

    def originate(self, item: Publication, now: float) -> SpooledPublication | None:
        """A local publication with a QoS, the retain flag or properties, to the node: stamped (version, expiry:
        retained.py), a retained one stored; returns the spool entry to write for a QoS 1/2 one."""
        wall = time.time()
        order_ms = None
        if item.retain:  # after what the broker processed before it, before what it will process after it
            order_ms = self.order.local_ms(item.topic, int(wall * 1000), self.retained.known_ms(item.topic))
        properties = stamp(item.properties, item.retain, wall, order_ms)
        publication = self.node.local_publish(item.topic, item.payload, item.qos, item.retain, properties, now)
        if publication is None:
            return None
        if item.retain:
            self.retained.offer(item.topic, publication, item.qos, item.payload, properties)
        if not item.qos or self.spool is None:
            return None
        return SpooledPublication(publication[1], publication[2], item.topic, item.payload, item.qos, item.retain,
                                  properties, wall, item.mid)

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
