"""The broker's side of an MQTT session: its QoS 1/2 publications to us and our acknowledgements of them.

Theory of operation: a publication is acknowledged when the caller has
taken it (`acknowledge`: a PUBACK for QoS 1, a PUBREC for QoS 2), so the
broker keeps it until then; QoS 2 ones are handed over at their PUBLISH and
their PUBREL is answered with PUBCOMP at once (`released`). What is kept:

* `awaiting`: packet id -> deliveries not acknowledged yet (a repeat with
  DUP of one still awaiting is not another: `delivered`). An
  acknowledgement for an id not in it (a connection whose session the broker
  lost since: the id may now name another message) is not written
  (`stale`). Its total is what we have unacknowledged, against our Receive
  Maximum.
* `answered`: QoS 2 ids we sent PUBREC for whose PUBREL has not come. A
  PUBLISH again with DUP under such an id is a repeat after a reconnection:
  its PUBREC is sent again, nothing handed over (MQTT 5 section 4.3.3).
* `held`: acknowledgements waiting for an id's PUBREL. Mosquitto 2.0.11
  numbers a message when it queues it and lets more than our Receive
  Maximum into flight, so with more than 65,535 queued an id comes again,
  without DUP, while its previous message waits for its PUBREL; that is a
  new message (federation/daemon/lean_client.py, "reused packet ids"), and
  acknowledged at once it would complete the previous one. It is handed
  over, and its acknowledgement waits for that PUBREL.

A CONNACK without the session forgets all three (MQTT 5 section 4.1.0; a
broker restarted without persistence numbers from 1 again: issue 39); a
closed connection forgets `held` (the broker sends those messages again,
DUP, after the PUBREL of the one before).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence


class Acknowledgements:
    """What we owe the broker for its QoS 1/2 publications (module docstring)."""

    def __init__(self) -> None:
        self.awaiting: dict[int, int] = {}
        self.answered: set[int] = set()
        self.held: dict[int, deque[int]] = {}
        self.unacknowledged = 0
        """deliveries not acknowledged yet, QoS 2 ones until their PUBCOMP"""
        self.stale = 0
        """acknowledgements not written: their packet id is not awaiting one (a lost session's)"""
        self.acks_held = 0
        """acknowledgements held behind a reused packet id (module docstring)"""

    def delivered(self, packet_id: int, dup: bool = False) -> None:
        """A QoS 1/2 publication handed to the caller. One sent again (DUP) while an earlier delivery of it still
        awaits its acknowledgement is the same message: that acknowledgement is its, and the second is stale (else
        it could complete a later message the broker gave the id to)."""
        if dup and packet_id in self.awaiting:
            return
        self.awaiting[packet_id] = self.awaiting.get(packet_id, 0) + 1
        self.unacknowledged += 1

    def delivered_run(self, packet_ids: Sequence[int]) -> None:
        awaiting = self.awaiting
        for packet_id in packet_ids:
            awaiting[packet_id] = awaiting.get(packet_id, 0) + 1
        self.unacknowledged += len(packet_ids)

    def is_repeat(self, packet_id: int, dup: bool) -> bool:
        """A QoS 2 PUBLISH under an id we answered with PUBREC: a repeat when sent again (DUP)."""
        return dup and packet_id in self.answered

    def acknowledge(self, acks: Sequence[tuple[int, int]], out: bytearray) -> int:
        """(packet id, qos) each: a PUBACK or PUBREC into `out`, held behind an unanswered PUBREL of the same id, or
        not written for an id not awaiting one; how many were written or held."""
        awaiting = self.awaiting
        answered = self.answered
        held = self.held
        done = 0
        for packet_id, qos in acks:
            count = awaiting.get(packet_id)
            if not count:
                self.stale += 1
                continue
            if count == 1:
                del awaiting[packet_id]
            else:
                awaiting[packet_id] = count - 1
            done += 1
            if packet_id in answered or packet_id in held:
                held.setdefault(packet_id, deque()).append(qos)
                self.acks_held += 1
                continue
            if qos == 2:
                answered.add(packet_id)
                out += bytes((0x50, 2, packet_id >> 8, packet_id & 0xFF))
            else:
                self.unacknowledged -= 1
                out += bytes((0x40, 2, packet_id >> 8, packet_id & 0xFF))
        return done

    def repeat(self, packet_id: int, out: bytearray) -> None:
        """A QoS 2 repeat (`is_repeat`): its PUBREC again."""
        out += bytes((0x50, 2, packet_id >> 8, packet_id & 0xFF))

    def released(self, packet_id: int, out: bytearray) -> None:
        """The broker's PUBREL: PUBCOMP at once (also for an id we do not know: a previous run's, or sent again after
        a reconnection; unanswered, the broker would keep it in flight for ever), then what was held behind it, up
        to and including the next PUBREC."""
        if packet_id in self.answered:
            self.answered.discard(packet_id)
            self.unacknowledged -= 1
        out += bytes((0x70, 2, packet_id >> 8, packet_id & 0xFF))
        waiting = self.held.get(packet_id)
        if not waiting:
            return
        while waiting:
            qos = waiting.popleft()
            if qos == 2:
                self.answered.add(packet_id)
                out += bytes((0x50, 2, packet_id >> 8, packet_id & 0xFF))
                break
            self.unacknowledged -= 1
            out += bytes((0x40, 2, packet_id >> 8, packet_id & 0xFF))
        if not waiting:
            del self.held[packet_id]

    def connection_lost(self) -> None:
        self.unacknowledged -= sum(len(waiting) for waiting in self.held.values())
        self.held.clear()

    def session_lost(self) -> None:
        self.awaiting.clear()
        self.answered.clear()
        self.held.clear()
        self.unacknowledged = 0
