"""The broker's sessions as the wrapper follows them: the log's events into the subscription table and the session
ledger, the ledger's `$SYS` rounds back into the table (issue 39, item 1).

Theory of operation: the subscription table (federation.daemon.state) keeps a client's filters while its session may
live; the session ledger (federation.daemon.session_ledger) settles, from the broker's counts, whether an MQTT 5
session outlived its connection. Both must see every event in the order the broker logged it, the ledger before the
table (it needs the filters the table held before the event). `BrokerSessions` is that glue, on the loop's thread:
the runtime hands it each log event and each `$SYS` count as it reads them, and applies nothing itself; what the
ledger settles goes to the table (an ended session's filters, the filters carried into a session the broker no
longer had), and the changes are reported to the caller like the log's own.
"""

from __future__ import annotations

import logging

from federation.daemon.broker_log import (
    ClientConnected,
    ClientGone,
    ClientSubscribed,
    ClientUnsubscribed,
    LogEvent,
)
from federation.daemon.session_ledger import Resolution, SessionLedger
from federation.daemon.state import LocalSubscriptions, SubscriptionSink

log = logging.getLogger("federation.daemon")


class BrokerSessions:
    """The table and the ledger, fed in order (module docstring). `own_client_id`: the wrapper's main connection,
    whose lines change neither count in a way the ledger needs (its session and subscriptions last)."""

    def __init__(self, table: LocalSubscriptions, sink: SubscriptionSink, own_client_id: str) -> None:
        self.table = table
        self.sink = sink
        self.own_client_id = own_client_id
        self.ledger = SessionLedger()
        self._helper_subscriptions: dict[str, int] = {}
        """the wrapper's helper connections (its retained scan) -> the subscriptions each holds"""

    # ------------------------------------------------------------ the log

    def apply(self, event: LogEvent, now: float) -> bool:
        """One log event, to the ledger then the table; True if the table changed."""
        ledger, table = self.ledger, self.table
        if event.own:
            if isinstance(event, ClientConnected) and event.kicker:
                ledger.kicker_connected(event.client, event.clean, table.counted(event.client))
            elif isinstance(event, ClientGone) and event.kicker:
                ledger.kicker_gone(event.client, self._helper_subscriptions.pop(event.client, 0))
                # its session ended with it: this broker has the client no more (the new host has it)
                return table.session_ended(event.client, self.sink, now)
            elif event.client != self.own_client_id:
                self._helper(event)
            return False
        if isinstance(event, ClientConnected):
            ledger.connected_line(event.client, event.clean, table.counted(event.client))
        elif isinstance(event, ClientGone):
            if event.reason == "expired":
                ledger.expired_line(event.client, table.counted(event.client))
            else:
                ledger.gone_line(event.client, event.protocol, event.clean, event.reason == "takeover",
                                 table.counted(event.client))
        elif isinstance(event, (ClientSubscribed, ClientUnsubscribed)):
            ledger.subscription_changed(table.count_effect(event) if ledger.connected.get(event.client) else None)
        return table.apply(event, self.sink, now)

    def _helper(self, event: LogEvent) -> None:
        """A line of a helper connection (the retained scan: clean start, no expiry): its exact effect on the counts."""
        held = self._helper_subscriptions
        if isinstance(event, ClientConnected):
            held[event.client] = 0
            self.ledger.helper(clients=1)
        elif isinstance(event, ClientGone):
            if event.reason != "takeover":
                self.ledger.helper(clients=-1, subscriptions=-held.pop(event.client, 0))
        elif isinstance(event, ClientSubscribed):
            held[event.client] = held.get(event.client, 0) + 1
            self.ledger.helper(subscriptions=1)
        elif isinstance(event, ClientUnsubscribed) and held.get(event.client):
            held[event.client] -= 1
            self.ledger.helper(subscriptions=-1)

    def log_line(self, now: float) -> bool:
        """Any log line: a `$SYS` round before it is complete. True if the table changed."""
        return self._settle(self.ledger.round_ended(), now)

    # ------------------------------------------------------------ the $SYS counts

    def round_started(self, now: float) -> bool:
        """`$SYS/broker/uptime`: a round begins (the one before is complete). True if the table changed."""
        return self._settle(self.ledger.round_started(), now)

    def total_counted(self, total: int) -> None:
        self.ledger.total_counted(total)

    def disconnected_counted(self, count: int) -> None:
        self.ledger.disconnected_counted(count)

    def subscriptions_counted(self, count: int) -> None:
        self.ledger.subscriptions_counted(count)

    def connected(self, session_lost: bool) -> None:
        """The wrapper's connection came (back): lines may have been lost meanwhile; a broker that lost our session
        restarted (without persistence: no session of before is left)."""
        self._helper_subscriptions.clear()
        if session_lost:
            self.ledger.broker_restarted()
        else:
            self.ledger.unsettle()

    def _settle(self, resolutions: list[Resolution], now: float) -> bool:
        changed = False
        for resolution in resolutions:
            if resolution.ended:
                changed = self.table.session_ended(resolution.client, self.sink, now) or changed
            elif resolution.absent:
                changed = self.table.drop_carried(resolution.client, self.sink, now) or changed
        if changed:
            log.debug("the broker's counts settled sessions: %s", resolutions)
        return changed

    def describe(self) -> dict[str, object]:
        """Status `daemon.broker.sessions`."""
        return self.ledger.describe()
