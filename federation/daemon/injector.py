"""What the wrapper publishes into its broker: runs of injections, their packet ids, their journal, their end.

Theory of operation: remote publications are injected on the wrapper's one broker connection (broker.py),
so no_local keeps the broker from echoing them back, which is what stops a federated publication from being
federated again. `Injector` does the publishing half of that connection:

- `publish_all` writes a run of QoS 0 publications without properties as one buffer
  (`LeanClient.send_qos0`) and a run of QoS 1/2 ones with `LeanClient.send_reliable`, which gives them paho's
  packet ids and tells the injection journal (`InjectionRecorder`, federation.daemon.injections) before the
  bytes are queued; paho then tracks each until PUBACK or PUBCOMP, also across a reconnection. Anything else
  (QoS 0 with properties, a topic paho must judge, paho's public API) goes through paho's `publish`, whose
  packet id the journal learns only after the write.
- It keeps the unfinished QoS 1/2 injections (`backlog`): `FlowControl` hands over no more than the broker's
  Receive Maximum allows. It hears of each first PUBREC (`on_pubrec`: journaled before paho's PUBREL goes
  out) and completion (`on_completed`; a reason code of 0x80 or more is a refusal), and tells the journal of
  a read pass's completions at once (`flush_finished`).
- At a CONNACK (`connected`): with the session, paho sends the unfinished ones again (same packet id and
  DUP, or the PUBREL of those past PUBREC) and the broker delivers each once; without it, they are taken
  back from paho before it resends anything (a PUBREL would be answered "done" by a broker that never
  delivered the message) and handed to the runtime to publish anew, in order.
- A restarted wrapper gives paho the journal's unfinished injections under their packet ids (`restore`)
  before it connects, so the first CONNACK treats them as above; with paho's public API they are published
  anew at the first connection.

What it tells the node (`take_outcomes`): each QoS 1/2 publication the broker has (its first PUBREC for QoS 2,
else PUBACK / PUBCOMP; a refusal too, which is final) as done, and each one paho refused as failed, so the
node's custody of it ends or its copy goes back to the sender (docs/protocol.md rule 7a).

Retained injections (issue 39, federation.daemon.retained_order): before one is written, `retained` (a
`RetainedWrites`, the runtime's gate) says whether it is still its topic's newest value (a local write read while it
waited is newer: it is then not written, and its custody ends); once the broker has processed it, `applied` is
called, in the order the broker's answers were read: a QoS 1/2 one at its PUBACK or PUBCOMP (Mosquitto stores a QoS
2 retained value at the PUBREL), a QoS 0 one at the PINGRESP to the PINGREQ written after it
(`LeanClient.send_ping`); a QoS 0 one whose answer cannot come (the connection dropped) is applied then.

What it counts (`counts`, plain attributes): `acknowledged` (QoS 1/2 the broker completed), `refused` (completed with a
reason code of 0x80 or more), `written_qos0` (QoS 0 on the socket: those paho still held when the
connection dropped are not), `resent` (sent again in a kept session), `reinjected` (published anew into a
new one); `injected` (handed to paho) and `inject_failed` (paho refused it).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.exception import MQTTException

from federation.daemon.lean_client import LeanClient, PublicClient, ReliableMessage, RestoredMessage
from federation.daemon.mqtt_properties import dict_to_properties
from federation.daemon.mqtt_runs import append_qos0_run
from federation.daemon.state import SHARED_PREFIX
from federation.protocol.histogram import Histogram
from federation.protocol.topic_filter import matches
from federation.protocol.types import Address, Injection, InjectionRun, PublicationId

log = logging.getLogger("federation.daemon.broker")

REFUSED = 0x80
"""reason codes from this one up say the broker refused a publication (MQTT 5 section 2.4)"""
WriteKind = str
RELIABLE_RUN: WriteKind = "reliable run"
QOS0_RUN: WriteKind = "qos0 run"
ALONE: WriteKind = "alone"
"""how `Injector.plan` writes a part of a batch (`Injector.write_planned`)"""

RECENT_RELEASED = 8192
"""QoS 1/2 injections remembered as processed (`Injector.released`): a takeover's handover names those of the
client's topics, so that its new broker gives it no second copy (federation.daemon.roaming)"""

REFUSAL_LOG_INTERVAL = 60.0
"""seconds between log lines about injections the broker refused (every one is counted)"""


class InjectionRecorder(Protocol):
    """Where the injector tells how its QoS 1/2 injections progress (`federation.daemon.injections.InjectionJournal`
    is one): before they are written, at the first PUBREC (before the PUBREL), when the broker completed them,
    and when they are published anew under other packet ids."""

    def started(self, injections: Sequence[tuple[int, Injection]]) -> None: ...

    def released(self, mid: int) -> None: ...

    def finished(self, mids: Sequence[int]) -> None: ...

    def abandoned(self, mids: Sequence[int]) -> None: ...


class RetainedWrites(Protocol):
    """The runtime's gate for retained injections (`federation.daemon.retained_order.RetainedGate` is one)."""

    def admit(self, injection: Injection, exact: bool = True) -> bool: ...


class Injector:
    """The injections of one broker connection; `wrote` is called after paho was handed bytes (the adapter
    watches the socket for writability when paho could not write them all)."""

    def __init__(self, client: LeanClient | PublicClient, broker: Address, max_qos: int,
                 recorder: InjectionRecorder | None, wrote: Callable[[], None]) -> None:
        self.client = client
        self.broker = broker
        self.max_qos = max_qos
        self._recorder = recorder
        self._wrote = wrote
        self.injected = 0
        """QoS 0/1/2 publications handed to paho (written or queued)"""
        self.inject_failed = 0
        self.properties_skipped = 0
        self.acknowledged = 0
        self.refused = 0
        self.written_qos0 = 0
        self.resent = 0
        self.reinjected = 0
        """what became of the injections (see the module docstring; plain numbers: some count per message)"""
        self._unfinished: dict[int, Injection] = {}
        """mid -> the QoS 1/2 injection handed to paho that the broker has not completed (`backlog`), oldest first"""
        self._handed_at: dict[int, float] = {}
        """monotonic time each of `_unfinished` was handed to paho (this run's only)"""
        self.injection_latency = Histogram()
        """seconds from handing a QoS 1/2 publication to the connection to the broker's PUBACK / PUBCOMP"""
        self._finished: list[int] = []
        """mids completed since the last `flush_finished` (one journal write per read pass)"""
        self._refused_pubrec: dict[int, int] = {}
        """mid -> the reason code of a PUBREC that refused it (paho completes it anyway)"""
        self._outcomes: list[tuple[PublicationId, bool]] = []
        """(publication, the broker has it) for QoS 1/2 injections since the last `take_outcomes`"""
        self._done_at_pubrec: set[int] = set()
        """QoS 2 mids whose outcome was told at their PUBREC"""
        self._orphans: list[Injection] = []
        """unfinished injections of a previous run that paho's public API cannot send again under their old
        packet ids (`PublicClient`): published anew at the first connection"""
        self._refusal_logged_at = float("-inf")
        self.retained: RetainedWrites | None = None
        """asked before a retained injection is written (module docstring)"""
        self.applied: Callable[[PublicationId], None] | None = None
        """told, in the order the broker's answers are read, that it processed a retained injection"""
        self._retained_mids: dict[int, PublicationId] = {}
        """QoS 1/2 retained injections in `_unfinished`: applied at their completion"""
        self.released: deque[tuple[PublicationId, str]] = deque(maxlen=RECENT_RELEASED)
        """(publication, topic) of the latest QoS 1/2 injections the broker processes before anything written from
        now on (`released_matching`)"""
        self._pinged: list[tuple[int, list[PublicationId]]] = []
        """(the PINGREQ's number, the QoS 0 retained injections written before it), oldest first"""
        self._unpinged: list[PublicationId] = []
        """QoS 0 retained injections written since the last PINGREQ"""
        if isinstance(client, LeanClient):
            client.pingresp_received = self._on_pingresp

    def take_outcomes(self) -> list[tuple[PublicationId, bool]]:
        """What became of QoS 1/2 injections since the last call: (publication, done) where done is True when the
        broker has it and False when it will not get it from this injection (paho refused it)."""
        outcomes, self._outcomes = self._outcomes, []
        return outcomes

    def backlog(self) -> int:
        """QoS 1/2 publications handed to paho that the broker has not completed yet (in flight or queued)."""
        return len(self._unfinished)

    @property
    def counts(self) -> dict[str, int]:
        """The counts of the module docstring, by name."""
        return {"acknowledged": self.acknowledged, "refused": self.refused, "written_qos0": self.written_qos0,
                "resent": self.resent, "reinjected": self.reinjected}

    # ------------------------------------------------------------ a previous run, a new session

    def restore(self, unfinished: Sequence[tuple[int, Injection, bool]]) -> None:
        """Before the first connection: what a previous run left unfinished (mid, injection, past PUBREC)."""
        if not unfinished:
            return
        client = self.client
        if not isinstance(client, LeanClient):
            self._orphans += [injection for _mid, injection, _released in unfinished]
            if self._recorder is not None:
                self._recorder.abandoned([mid for mid, _injection, _released in unfinished])
            return
        messages: list[RestoredMessage] = []
        for mid, injection, released in unfinished:
            properties, _skipped = dict_to_properties(injection.properties)
            messages.append((mid, injection.topic, injection.payload, min(injection.qos, self.max_qos) or 1,
                             injection.retain, properties, released))
            self._unfinished[mid] = injection
        client.restore(messages)

    def connected(self, session_present: bool) -> tuple[int, list[Injection]]:
        """A CONNACK, before paho sends anything again: (how many paho sends again in the kept session, those to
        publish anew in order, the broker having none of them)."""
        reinjected, self._orphans = self._orphans, []
        self.connection_lost()
        if not session_present:
            self._retained_mids.clear()  # published anew (`reinjected`): asked and tracked again
        resent = 0
        if session_present:
            resent = len(self._unfinished)
        elif self._unfinished:
            self._refused_pubrec.clear()
            self.client.drop_out_messages()
            mids = list(self._unfinished)
            reinjected += self._unfinished.values()
            self._unfinished.clear()
            self._handed_at.clear()
            if self._recorder is not None:
                self._recorder.abandoned(mids)
        self.resent += resent
        self.reinjected += len(reinjected)
        return resent, reinjected

    def connection_lost(self) -> None:
        """The connection ended (or a new one began): the QoS 0 retained injections waiting for a PINGRESP will
        not get one; the broker processed them or never will, and a local write read from now on comes after."""
        waiting = [publication for _number, publications in self._pinged for publication in publications]
        waiting += self._unpinged
        self._pinged, self._unpinged = [], []
        applied = self.applied
        if applied is not None:
            for publication in waiting:
                applied(publication)

    # ------------------------------------------------------------ retained injections

    def _admit_retained(self, injections: Sequence[Injection]) -> Sequence[Injection]:
        """The injections to write: a retained one only while it is still its topic's newest value (a stale one's
        custody ends here: the broker holds something newer)."""
        gate = self.retained
        if gate is None or not any(injection.retain for injection in injections):
            return injections
        kept: list[Injection] = []
        reliable = self.max_qos > 0
        for injection in injections:
            if not injection.retain or gate.admit(injection, reliable and injection.qos > 0):
                kept.append(injection)
            elif injection.qos:
                self._outcomes.append((injection.publication, True))
        return kept

    def _track_retained(self, injection: Injection, mid: int | None) -> None:
        """A retained injection written: QoS 1/2 ones are applied at their completion (`mid`), QoS 0 ones at the
        PINGRESP of the PINGREQ that follows them (`_ping_retained`). Only with a gate (`retained`): nothing else
        asks."""
        if self.applied is None or self.retained is None:
            return
        if mid:
            self._retained_mids[mid] = injection.publication
        else:
            self._unpinged.append(injection.publication)

    def _ping_retained(self) -> None:
        """After a write of QoS 0 retained injections: a PINGREQ, whose PINGRESP says the broker processed them."""
        if not self._unpinged:
            return
        written, self._unpinged = self._unpinged, []
        number = self.client.send_ping()
        if number:
            self._pinged.append((number, written))
        elif self.applied is not None:  # no answer will come (not connected, or paho's public API)
            for publication in written:
                self.applied(publication)

    def _on_pingresp(self, answered: int) -> None:
        pinged = self._pinged
        while pinged and pinged[0][0] <= answered:
            _number, publications = pinged.pop(0)
            if self.applied is not None:
                for publication in publications:
                    self.applied(publication)

    # ------------------------------------------------------------ publishing

    def publish(self, injection: Injection) -> bool:
        """Publish one with paho's `publish`; False if paho refused it (not connected, QoS 0). A QoS 1/2 one is
        told to the recorder after paho has written it (paho's public API gives the packet id only then);
        `publish_all` tells it before."""
        properties, skipped = dict_to_properties(injection.properties) if injection.properties else (None, ())
        if skipped:
            self.properties_skipped += len(skipped)
            log.debug("publication %s: skipped invalid properties %s", injection.publication, skipped)
        qos = min(injection.qos, self.max_qos)
        try:
            info = self.client.publish(injection.topic, injection.payload, qos=qos, retain=injection.retain,
                                       properties=properties)
        except (ValueError, MQTTException) as error:
            log.warning("cannot inject publication on %r: %s", injection.topic, error)
            self.inject_failed += 1
            if injection.qos:
                self._outcomes.append((injection.publication, False))
            return False
        self._wrote()
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS and not (qos > 0 and info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN):
            # QoS 1/2 messages refused for "no connection" are queued by paho and sent after reconnecting.
            self.inject_failed += 1
            if injection.qos:
                self._outcomes.append((injection.publication, False))
            return False
        if injection.retain:
            self._track_retained(injection, info.mid if qos else None)
        if qos:
            if qos == 1:
                self.released.append((injection.publication, injection.topic))
            self._unfinished[info.mid] = injection  # stored by paho until PUBACK / PUBCOMP, also while disconnected
            self._handed_at[info.mid] = time.monotonic()
            if self._recorder is not None:
                self._recorder.started([(info.mid, injection)])
        else:
            self.written_qos0 += 1
            if injection.qos:  # a QoS 1/2 publication the wrapper injects at QoS 0 (max_qos 0): written is all
                self._outcomes.append((injection.publication, True))
        self.injected += 1
        return True

    def publish_all(self, injections: Sequence[Injection]) -> None:
        """Publish several, in order: runs of QoS 0 ones without properties as one buffer, runs of QoS 1/2 ones
        with `LeanClient.send_reliable`; the rest, and everything with paho's public API, with `publish`."""
        self.write_planned(self.plan(injections))

    def plan(self, injections: Sequence[Injection]) -> list[tuple[WriteKind, Sequence[Injection]]]:
        """How `publish_all` writes `injections`, in order: (kind, injections) per write. A run of QoS 1/2 ones
        (`RELIABLE_RUN`: `send_reliable`), a run of QoS 0 ones without properties and of one retain flag
        (`QOS0_RUN`: one buffer), or one alone with paho's `publish` (`ALONE`). One entry: one write, nothing to
        cork around (what `send_reliable` leaves to `publish`, or a topic paho judges, may still take more)."""
        injections = self._admit_retained(injections)
        if not isinstance(self.client, LeanClient):
            return [(ALONE, (injection,)) for injection in injections]
        max_qos = self.max_qos
        planned: list[tuple[WriteKind, Sequence[Injection]]] = []
        index, total = 0, len(injections)
        while index < total:
            injection = injections[index]
            reliable = bool(injection.qos and max_qos)
            if not reliable and injection.properties:
                planned.append((ALONE, (injection,)))
                index += 1
                continue
            retain = injection.retain
            stop = index + 1
            while stop < total:
                following = injections[stop]
                if reliable != bool(following.qos and max_qos) \
                        or (not reliable and (following.properties or following.retain != retain)):
                    break
                stop += 1
            planned.append((RELIABLE_RUN if reliable else QOS0_RUN, injections[index:stop]))
            index = stop
        return planned

    def write_planned(self, planned: list[tuple[WriteKind, Sequence[Injection]]]) -> None:
        """Write what `plan` made, in order (then the PINGREQ that follows QoS 0 retained ones)."""
        client = self.client
        for kind, injections in planned:
            if kind is ALONE or not isinstance(client, LeanClient):
                for injection in injections:
                    self.publish(injection)
            elif kind is RELIABLE_RUN:
                self._send_reliable_run(client, injections)
            else:
                self._write_qos0_injections(client, injections)
        self._ping_retained()

    def _write_qos0_injections(self, client: LeanClient, run: Sequence[Injection]) -> None:
        """A `QOS0_RUN`: built whole (mqtt_runs), but for a topic or size paho judges itself (and refuses)."""
        retain = run[0].retain
        while run:
            count = self._write_qos0_run(client, [each.topic for each in run], [each.payload for each in run], retain)
            # QoS 1/2 publications injected at QoS 0 (max_qos 0): written is all
            self._outcomes += [(each.publication, True) for each in run[:count] if each.qos]
            if retain:
                for each in run[:count]:
                    self._track_retained(each, None)
            if count < len(run):
                self.publish(run[count])
                count += 1
            run = run[count:]

    def publish_runs(self, runs: Sequence[InjectionRun]) -> None:
        """QoS 0 runs (`InjectionRun`), in order: each one buffer of PUBLISH packets, one `send`; what a run holds
        that paho must judge (`append_qos0_run` stops there) goes through `publish_all` with the rest of it."""
        client = self.client
        if not isinstance(client, LeanClient):
            for run in runs:
                self.publish_all(run.injections())
            return
        for run in runs:
            count = self._write_qos0_run(client, run.topics, run.payloads, False)
            if count < len(run):
                self.publish_all(run.injections()[count:])

    def _write_qos0_run(self, client: LeanClient, topics: list[str], payloads: list[bytes], retain: bool) -> int:
        """QoS 0 PUBLISH packets for the leading (topic, payload) pairs `append_qos0_run` takes, built and written
        with one `send`; how many (the next one, if any, is paho's to judge)."""
        packets = bytearray()
        count = append_qos0_run(packets, topics, payloads, retain)
        if count:
            self._send_qos0_run(client, packets, count)
        return count

    def _send_qos0_run(self, client: LeanClient, run: bytearray, count: int) -> None:
        """`count` QoS 0 PUBLISH packets built in `run`, written with one `send`."""
        if client.send_qos0(run, count, self._written_qos0) != MQTTErrorCode.MQTT_ERR_SUCCESS:
            self.inject_failed += count  # not connected: paho refuses QoS 0 publications too
            return
        self.injected += count
        self._wrote()

    def _written_qos0(self, count: int) -> None:
        self.written_qos0 += count

    def _send_reliable_run(self, client: LeanClient, injections: Sequence[Injection]) -> None:
        """QoS 1/2 publications: what `send_reliable` takes, then the rest through `publish`."""
        max_qos = self.max_qos
        messages: list[ReliableMessage] = []
        for injection in injections:
            properties = None
            if injection.properties:
                properties, skipped = dict_to_properties(injection.properties)
                if skipped:
                    self.properties_skipped += len(skipped)
                    log.debug("publication %s: skipped invalid properties %s", injection.publication, skipped)
            qos = injection.qos if injection.qos < max_qos else max_qos
            messages.append((injection.topic, injection.payload, qos, injection.retain, properties))
        unfinished = self._unfinished
        recorder = self._recorder

        def taken(mids: list[int]) -> None:
            # They join `_unfinished`: in paho's `_out_messages` until PUBACK / PUBCOMP, also across a
            # reconnection; the recorder has them before the bytes are queued.
            unfinished.update(zip(mids, injections, strict=False))
            released = self.released
            for mid, injection in zip(mids, injections, strict=False):
                if injection.retain:
                    self._track_retained(injection, mid)
                if injection.qos == 1 or max_qos == 1:
                    released.append((injection.publication, injection.topic))
            if recorder is not None:
                recorder.started(list(zip(mids, injections, strict=False)))

        mids = client.send_reliable(messages, taken)
        if mids:
            self.injected += len(mids)
            self._handed_at.update(dict.fromkeys(mids, time.monotonic()))
            self._wrote()
        for injection in injections[len(mids):]:
            self.publish(injection)

    # ------------------------------------------------------------ what the broker answers

    def on_pubrec(self, mid: int, reason: int) -> None:
        """The first PUBREC of one of our QoS 2 injections; the PUBREL follows when this returns (paho sends it
        also after a refusal, and the broker completes it: the refusal is remembered for the completion)."""
        injection = self._unfinished.get(mid)
        if injection is None:
            return
        if reason >= REFUSED:
            self._refused_pubrec[mid] = reason
        elif mid not in self._done_at_pubrec:  # the broker holds it: it delivers it once, whatever follows
            self._done_at_pubrec.add(mid)
            self._outcomes.append((injection.publication, True))
            # Mosquitto gives a QoS 2 publication to its subscribers at the PUBREL, which paho sends on return.
            self.released.append((injection.publication, injection.topic))
        if self._recorder is not None:
            self._recorder.released(mid)

    def on_completed(self, mid: int, reason: int) -> bool:
        """PUBACK or PUBCOMP; True when it completed one of ours (room for more)."""
        injection = self._unfinished.pop(mid, None)
        if injection is None:
            return False
        retained = self._retained_mids.pop(mid, None) if self._retained_mids else None
        if retained is not None and self.applied is not None:
            self.applied(retained)  # the broker stored it (a refusal stored nothing: it holds what it had)
        handed = self._handed_at.pop(mid, None)
        if handed is not None:
            self.injection_latency.observe(time.monotonic() - handed)
        reason = self._refused_pubrec.pop(mid, reason) if self._refused_pubrec else reason
        if reason >= REFUSED:
            self.refused += 1
            now = time.monotonic()
            if now - self._refusal_logged_at >= REFUSAL_LOG_INTERVAL:
                self._refusal_logged_at = now
                log.warning("broker %s refused an injected publication on %r (reason code 0x%02x): it is not "
                            "delivered there; check the wrapper's ACL (it must be allowed to publish on every "
                            "federated topic). Further refusals are counted (status daemon.broker.injections."
                            "refused) and logged once a minute", self.broker, injection.topic, reason)
        else:
            self.acknowledged += 1
        if mid in self._done_at_pubrec:
            self._done_at_pubrec.discard(mid)
        else:  # a refusal is final too: sending it again would be refused again (it is counted and logged)
            self._outcomes.append((injection.publication, True))
        if self._recorder is not None:
            self._finished.append(mid)
        return True

    def released_matching(self, filters: Iterable[str]) -> dict[Address, list[tuple[int, int]]]:
        """Per origin, the (epoch, seq) of the latest QoS 1/2 injections on a topic one of `filters` (MQTT filters)
        matches that the broker processes before anything written after this call (QoS 1: written; QoS 2: its
        PUBREL written). A takeover's fence is written right after (federation.daemon.roaming): the session it
        reads had these."""
        patterns = [filter_ for filter_ in filters if not filter_.startswith(SHARED_PREFIX)]
        found: dict[Address, list[tuple[int, int]]] = {}
        for (origin, epoch, seq), topic in self.released:
            if any(matches(filter_, topic) for filter_ in patterns):
                found.setdefault(origin, []).append((epoch, seq))
        return found

    def flush_finished(self) -> None:
        """Tell the recorder what completed since the last call (after a read pass: one journal write)."""
        if self._finished:
            finished, self._finished = self._finished, []
            if self._recorder is not None:
                self._recorder.finished(finished)
