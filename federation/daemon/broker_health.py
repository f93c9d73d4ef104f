"""The broker connection's health, as the wrapper reports it to people.

Theory of operation: the paho connection (`broker.py`) reports its state
changes as broker items (`Connected`, `Subscribed`, `Disconnected`,
`ConnectFailed`, `ConnectRefused`). `BrokerHealth` turns them into the
numbers the status document and the metrics show (connected, connections
made, log lines read) and into log lines a person can act on. None of it
touches the protocol node, so it lives apart from the running wrapper
(running.py), which owns one `BrokerHealth` and hands it every state item
and every log line.

Two reports are timed on purpose. A broker that stays unreachable, refuses
the wrapper's login or fails the TLS handshake is reported once, with what
to fix (broker_auth.py names the setting), and then once per
`BROKER_DOWN_REMINDER` while it lasts (the adapter retries with backoff;
a line per retry would bury everything else); a new kind of failure is
reported at once. And mosquitto without
`log_dest topic` accepts the subscription to `$SYS/broker/log/#` and then
says nothing, which leaves the wrapper blind to local subscriptions: so
`LOG_SILENCE_WARNING_AFTER` seconds after the subscription is acknowledged,
a connection that has sent no log line gets a loud warning saying what to
add to mosquitto.conf. The delay comes from the runtime's loop through the
`call_later` callable given at construction, so this class needs no loop.

One report is advice, not a fault: a broker whose Receive Maximum (its
`max_inflight_messages`; Mosquitto's default is 20) is below
`ADVISED_RECEIVE_MAXIMUM` lets the wrapper have only that many QoS 1/2
publications from other brokers in flight into it, and at full rate that
window, not the CPU, sets how fast they arrive (docs/benchmarks/history.md,
"Sixth pass"). Said once per process, at the first connection that announces it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from federation.daemon.broker import RECONNECT_MAX_DELAY, RECONNECT_MIN_DELAY
from federation.daemon.broker_auth import BrokerAuth, refusal_hint, tls_failure_hint
from federation.daemon.broker_items import (
    BrokerItem,
    Connected,
    ConnectFailed,
    ConnectRefused,
    Disconnected,
    Subscribed,
)
from federation.protocol.types import Address

log = logging.getLogger("federation.daemon")
"""the runtime's logger: these lines are the wrapper's own, filtered and captured under that name"""

LOG_SILENCE_WARNING_AFTER = 5.0
"""seconds after subscribing to $SYS/broker/log/# without a log line before the loud warning"""
BROKER_DOWN_REMINDER = 60.0
"""seconds between repeated warnings while the broker stays unreachable, refuses the login or fails TLS"""
FAILURE_KINDS = ("unreachable", "refused", "tls")
"""why a connection attempt failed: no TCP connection, a CONNACK refusal, a failed TLS handshake"""
ADVISED_RECEIVE_MAXIMUM = 1000
"""the `max_inflight_messages` configs/mosquitto.conf sets; a broker announcing less gets the advice in the log"""
RETRYING = (f"retrying with backoff {RECONNECT_MIN_DELAY:g}-{RECONNECT_MAX_DELAY:g} s (a reminder every "
            f"{BROKER_DOWN_REMINDER:g} s); the overlay keeps running")


class Timer(Protocol):
    """What `call_later` returns (an `asyncio.TimerHandle` in the daemon)."""

    def cancel(self) -> None: ...


CallLater = Callable[[float, Callable[[], None]], Timer]
"""Run a callback after a delay in seconds, on the thread that feeds `BrokerHealth`."""


class BrokerHealth:
    """Connection state, counters and warnings about the wrapper's one broker connection."""

    def __init__(self, broker: Address, client_id: str, call_later: CallLater, auth: BrokerAuth | None = None) -> None:
        self.broker = broker
        self.client_id = client_id
        self.auth = auth or BrokerAuth()
        self._call_later = call_later
        self.connected = False
        self.connections = 0
        """connections made, the first included"""
        self.log_lines = 0
        """broker log lines read, over every connection"""
        self._log_lines_this_connection = 0
        self.connect_failures = dict.fromkeys(FAILURE_KINDS, 0)
        """failed connection attempts by kind (`FAILURE_KINDS`)"""
        self.problem: str | None = None
        """why the connection is down, as last reported (None while connected, and before the first attempt)"""
        self._problem_kind: str | None = None
        """what is reported while it lasts: "unreachable", or the problem's text"""
        self._down_since: float | None = None
        self._down_warned_at = float("-inf")
        self._silence_check: Timer | None = None
        self._window_advised = False

    @property
    def reconnects(self) -> int:
        """Connections made after the first."""
        return max(0, self.connections - 1)

    @property
    def log_flowing(self) -> bool:
        """Connected, and the broker has sent a log line on this connection (its log reaches the wrapper)."""
        return self.connected and self._log_lines_this_connection > 0

    def count_log_line(self) -> None:
        """Count one line read from `$SYS/broker/log/#`."""
        self.log_lines += 1
        self._log_lines_this_connection += 1

    def on_state(self, item: BrokerItem, now: float) -> None:
        """A change of the connection's state: update the counters, tell the operator what to do."""
        broker = self.broker
        if isinstance(item, Connected):
            self.connections += 1
            self.connected = True
            self._log_lines_this_connection = 0
            down_for = "" if self._down_since is None else f" after {now - self._down_since:.1f} s"
            self._down_since = None
            self._down_warned_at = float("-inf")
            self.problem = self._problem_kind = None
            log.info("connected to broker %s as %r %s%s", broker, self.client_id, self.auth.describe(), down_for)
            if item.receive_maximum < ADVISED_RECEIVE_MAXIMUM and not self._window_advised:
                self._window_advised = True
                log.info("broker %s takes at most %d unacknowledged QoS 1/2 publications (its Receive Maximum, "
                         "mosquitto.conf `max_inflight_messages`): at full rate this window limits how fast QoS 1/2 "
                         "publications from other brokers reach its subscribers; `max_inflight_messages %d`, as "
                         "`federation-configs show mosquitto-federation.conf` has, widens it", broker,
                         item.receive_maximum, ADVISED_RECEIVE_MAXIMUM)
        elif isinstance(item, Subscribed):
            if item.refused:
                log.error("broker %s refused subscriptions: %s; the wrapper needs both: the broker's ACL must let "
                          "its user %s read $SYS/broker/log/# and read and write # (`federation-configs show "
                          "mosquitto.acl`)", broker, "; ".join(item.refused),
                          repr(self.auth.username) if self.auth.username is not None else "(anonymous)")
            if self._silence_check is not None:
                self._silence_check.cancel()
            self._silence_check = self._call_later(LOG_SILENCE_WARNING_AFTER, self._check_log_silence)
        elif isinstance(item, Disconnected):
            if not self.connected:
                return  # the end of an attempt that failed (a refused login): reported as that
            self.connected = False
            if not item.expected:
                self._down_since = now
                self._down_warned_at = now
                self._problem_kind = "unreachable"  # said again after the reminder time
                self.problem = f"lost the connection to broker {broker} ({item.reason})"
                log.warning("lost the connection to broker %s (%s); reconnecting with backoff %g-%g s, "
                            "the overlay keeps running", broker, item.reason, RECONNECT_MIN_DELAY,
                            RECONNECT_MAX_DELAY)
        elif isinstance(item, ConnectFailed):
            if item.tls:
                what = "TLS with broker" if self.auth.tls else "the connection to broker"
                self._failed("tls", f"{what} {broker} failed ({item.reason}): "
                                    f"{tls_failure_hint(item.reason, self.auth)}", logging.ERROR, now)
            else:
                because = f" ({item.reason})" if item.reason else ""
                self._failed("unreachable", f"broker {broker} unreachable{because}: is mosquitto running there, "
                                            f"and is broker (--broker) its address?", logging.WARNING, now)
        elif isinstance(item, ConnectRefused):
            self._failed("refused", f"broker {broker} refused the login of {self.client_id!r} "
                                    f"{self.auth.describe()}: {item.reason}; {refusal_hint(item.reason, self.auth)}",
                         logging.ERROR, now)

    def _failed(self, kind: str, problem: str, level: int, now: float) -> None:
        """A failed connection attempt: counted; said at once when its kind is new, else once per reminder time."""
        self.connect_failures[kind] += 1
        if self._down_since is None:
            self._down_since = now
        # the same problem is said again only as a reminder; a broker that went away is unreachable for a while
        key = kind if kind == "unreachable" else problem
        if key != self._problem_kind or now - self._down_warned_at >= BROKER_DOWN_REMINDER:
            still = (f" (still, for {now - self._down_since:.0f} s)"
                     if key == self._problem_kind and now > self._down_since else "")
            self._down_warned_at = now
            log.log(level, "%s%s; %s", problem, still, RETRYING)
        else:
            log.debug("%s (again)", problem)
        self._problem_kind = key
        self.problem = problem

    def close(self) -> None:
        """Cancel the pending log-silence check (at shutdown)."""
        if self._silence_check is not None:
            self._silence_check.cancel()

    def _check_log_silence(self) -> None:
        self._silence_check = None
        if self.connected and self._log_lines_this_connection == 0:
            log.warning(
                "!!! mosquitto at %s sent no log lines within %g s of the wrapper subscribing to "
                "$SYS/broker/log/#: add `log_dest topic` and `log_type all` to its mosquitto.conf (or the "
                "lines of `federation-configs show mosquitto-federation.conf`) and restart it. Until then "
                "the wrapper cannot learn local "
                "subscriptions and nothing is federated to this broker's clients.",
                self.broker, LOG_SILENCE_WARNING_AFTER)
