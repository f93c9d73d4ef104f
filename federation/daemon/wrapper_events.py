"""Names of the events only a wrapper makes (about its broker connection), and the outbox they wait in.

The node's events are `federation.protocol.events`; these are the daemon's own, written to the same event
log in the same format (docs/events.md, "Wrapper events"). `WrapperEvents` collects them, and a publication the
daemon drops, until the runtime drains them with the node's.
"""

from __future__ import annotations

from typing import Any

from federation.protocol.types import Event

BROKER_CONNECTED = "broker_connected"
BROKER_DISCONNECTED = "broker_disconnected"
RESUBSCRIBE_GRACE_STARTED = "resubscribe_grace_started"
RESUBSCRIBE_GRACE_ENDED = "resubscribe_grace_ended"
UNACCOUNTED_SUBSCRIPTIONS = "unaccounted_subscriptions"

ALL = (BROKER_CONNECTED, BROKER_DISCONNECTED, RESUBSCRIBE_GRACE_STARTED, RESUBSCRIBE_GRACE_ENDED,
       UNACCOUNTED_SUBSCRIPTIONS)


class WrapperEvents:
    """The daemon's outbox of events: `emit` adds one, `drain` hands over all (in order)."""

    def __init__(self, node: str) -> None:
        self.node = node
        """the node's address text, which every event carries"""
        self._events: list[Event] = []

    def emit(self, kind: str, now: float, **fields: Any) -> None:
        self._events.append(Event(now, self.node, kind, fields))

    def drain(self) -> list[Event]:
        out, self._events = self._events, []
        return out
