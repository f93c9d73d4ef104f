"""Learn which topic filters local clients hold from Mosquitto's `$SYS/broker/log/...` topics.

Theory of operation
-------------------
Mosquitto 2.0 has no API that lists subscriptions. With `log_dest topic` and
`log_type all` in mosquitto.conf it publishes its log lines instead: one
message per line on `$SYS/broker/log/<level>`, and one message per filter on
`$SYS/broker/log/M/subscribe` ("<client> <granted qos> <filter>") and
`$SYS/broker/log/M/unsubscribe` ("<client> <filter>"). The wrapper subscribes
to `LOG_TOPIC_FILTER` and hands every message to `BrokerLogTracker.feed`,
which answers with the events below. Nothing here touches a socket or a
clock: the "<unix seconds>: " prefix of each line is the only time there is.

Three things make this harder than splitting on spaces:

* Client ids and filters may contain spaces (and "(", and anything else), so
  "a b 0 c d" has several readings. The tracker remembers the ids that
  "New client connected ... as <id> (pN, cN, kN)." lines announced and takes
  the longest one that fits; a line from a client it never saw announced (the
  wrapper started later) is split at the first space that fits and counted.
* The broker cuts every payload at 999 bytes without saying so. A subscribe
  line that long may have lost the end of its filter, so the tracker
  subscribes to a superset: the whole levels that arrived, then `#`
  (`widened_filter`: "a/b/cut-lev..." becomes "a/b/#"). Every publication the
  real filter matches reaches the broker, which filters the rest: over-delivery,
  never loss, and counted (`widened`). A cut unsubscribe line cannot say which
  filter went, so the superset stays until the client's session ends; any other
  cut line is dropped and counted (`truncated`). (A client id of ~900+ bytes can
  thereby lose its disconnect line and its filters outlive it: over-delivery
  again.)
* The log says when a *connection* ends, not when a *session* ends: a
  persistent session keeps its subscriptions with no further line until it
  expires ("Expiring client X due to timeout.") or the same id connects with
  the clean flag. In MQTT 5 the clean flag does not say it either (clean start
  1 with a session expiry is a persistent session, and the expiry is not
  logged): such a session's fate is settled by the broker's `$SYS` counts
  (federation.daemon.session_ledger). `filters_end_with_session` and
  `connect_discards_session` hold that policy in one place.

Broker input never raises: every line lands in exactly one outcome counter
(used, ignored, refused, truncated, not understood), so the daemon can say
"the broker sends log lines we cannot read" instead of failing. Log line forms
are Mosquitto 2.0.11's (`strings /usr/sbin/mosquitto`, and live captures in
tests/real/test_broker_log_real.py).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Literal, get_args

from federation.protocol.topic_filter import validate_filter

LOG_TOPIC_FILTER = "$SYS/broker/log/#"
"""Subscribe to this on the local broker (it needs `log_dest topic` and `log_type all`)."""

LOG_TOPIC_PREFIX = "$SYS/broker/log/"
SUBSCRIBE_TOPIC = "$SYS/broker/log/M/subscribe"
UNSUBSCRIBE_TOPIC = "$SYS/broker/log/M/unsubscribe"
TEXT_TOPICS = frozenset({"$SYS/broker/log/E", "$SYS/broker/log/W", "$SYS/broker/log/N", "$SYS/broker/log/I"})
"""Levels whose lines may announce connections and disconnections (2.0.11 uses N and E)."""

MAX_PAYLOAD_BYTES = 999
"""Mosquitto cuts log payloads at this many bytes: a payload this long may be cut."""

DEFAULT_MAX_TRACKED_CLIENTS = 100_000
"""Connected client ids remembered for splitting lines; the oldest is forgotten beyond this."""

GoneReason = Literal["disconnected", "closed", "timeout", "takeover", "error", "expired"]
GONE_REASONS: frozenset[str] = frozenset(get_args(GoneReason))


@dataclass(frozen=True, slots=True)
class ClientConnected:
    """A client (or a bridge from another broker) finished connecting.

    `clean` is the clean-session (v3.x) / clean-start (v5) flag: when True the
    broker discarded any session this id had before (see `connect_discards_session`).
    `protocol` is 1 (MQTT 3.1), 2 (3.1.1) or 5 as the broker logs it.
    """

    client: str
    clean: bool
    protocol: int
    keepalive: int
    username: str | None = None
    bridge: bool = False
    own: bool = False
    """one of the wrapper's own connections (its own id, or a helper's): not a client's"""
    kicker: bool = False
    """(with `own`) the wrapper taking the client id over (federation.daemon.kicker), recognised by its address"""

    def __post_init__(self) -> None:
        if not self.client:
            raise ValueError("ClientConnected needs a non-empty client id")
        if self.protocol < 0 or self.keepalive < 0:
            raise ValueError(f"protocol and keepalive must be >= 0, got {self.protocol}, {self.keepalive}")


@dataclass(frozen=True, slots=True)
class ClientSubscribed:
    """The broker granted `client` a subscription to `filter` (one event per filter).

    `filter` is as the broker holds it: a plain filter or `$share/<group>/<filter>`.
    """

    client: str
    filter: str
    qos: int
    own: bool = False

    def __post_init__(self) -> None:
        if not self.client or not self.filter:
            raise ValueError("ClientSubscribed needs a client id and a filter")
        if self.qos not in (0, 1, 2):
            raise ValueError(f"granted qos must be 0, 1 or 2, got {self.qos}")


@dataclass(frozen=True, slots=True)
class ClientUnsubscribed:
    """`client` unsubscribed from `filter` (logged even if it held no such subscription)."""

    client: str
    filter: str
    own: bool = False

    def __post_init__(self) -> None:
        if not self.client or not self.filter:
            raise ValueError("ClientUnsubscribed needs a client id and a filter")


@dataclass(frozen=True, slots=True)
class ClientGone:
    """A connection of `client` ended, or (reason "expired") its stored session did.

    reason: "disconnected" (sent DISCONNECT), "closed" (socket closed without
    DISCONNECT), "timeout" (keepalive exceeded), "takeover" (a new connection
    with the same id replaced this one: its "New client connected" line
    follows), "error" (protocol error, malformed or oversize packet, not
    authorised, kicked, socket error), "expired" (a persistent session ran
    out of session expiry; the connection had ended earlier).
    `clean` is the flag of the connection that ended and `protocol` its MQTT
    version (as the connect line logs it), None if the tracker did not see it
    connect. Whether the client's filters die with it is
    `filters_end_with_session(event)`.
    """

    client: str
    reason: GoneReason
    clean: bool | None = None
    protocol: int | None = None
    own: bool = False
    kicker: bool = False

    def __post_init__(self) -> None:
        if not self.client:
            raise ValueError("ClientGone needs a non-empty client id")
        if self.reason not in GONE_REASONS:
            raise ValueError(f"reason must be one of {sorted(GONE_REASONS)}, got {self.reason!r}")


LogEvent = ClientConnected | ClientSubscribed | ClientUnsubscribed | ClientGone


def filters_end_with_session(gone: ClientGone) -> bool | None:
    """True if the client's subscriptions die with this event, False if the broker keeps them, None when the log
    cannot tell (the caller decides from what it knows of the client).

    An expired session loses them. MQTT 3.x is exact: a clean session (c1) ends with its connection, a c0 one is
    kept. MQTT 5 is not: the session lives as long as its Session Expiry Interval, which the log does not show,
    whatever the clean start flag (c1 with an expiry is a persistent session: paho's default
    `clean_start=FIRST_ONLY`, MQTT.js `clean: true` with `sessionExpiryInterval`), so a v5 session is kept until
    the broker's counts settle its fate (federation.daemon.session_ledger): over-delivery at worst, never a loss.
    A connection the tracker did not see start (protocol None) is None.
    """
    if gone.reason == "expired":
        return True
    if gone.protocol is None:
        return None
    if gone.protocol >= 5:
        return False
    return gone.clean is not False


def connect_discards_session(connected: ClientConnected) -> bool:
    """True if this connection starts with no subscriptions: drop any kept from an earlier session.

    A clean flag (c1) makes the broker discard the stored session of that id
    (v3.x clean session and v5 clean start alike); c0 resumes it, with its
    subscriptions, which the broker does not log again.
    """
    return connected.clean


@dataclass
class LogCounters:
    """What became of the lines fed so far.

    Every line is counted in `lines` and in exactly one outcome: `used`,
    `ignored`, `refused`, `truncated` or `not_understood`. The other fields are
    details of lines already counted in an outcome.
    """

    lines: int = 0
    used: int = 0
    """lines that produced events"""
    ignored: int = 0
    """lines with nothing to learn: other log lines, the wrapper's own, `$` filters, "<unknown>" clients"""
    refused: int = 0
    """subscribe lines whose granted qos is a failure code (128, or a v5 reason code)"""
    truncated: int = 0
    """lines of MAX_PAYLOAD_BYTES or more: possibly cut by the broker, dropped (a cut subscribe line is used,
    widened, instead)"""
    widened: int = 0
    """of `used`, subscribe lines possibly cut by the broker, federated as a superset filter (`widened_filter`)"""
    not_understood: dict[str, int] = field(default_factory=dict)
    """by log topic: lines in no known form (a different Mosquitto version?), or not UTF-8"""
    unknown_client: int = 0
    """subscribe/unsubscribe lines from a client id never announced: split at the first space that fits"""
    ambiguous: int = 0
    """of `unknown_client`, lines where more than one split fits (an id or filter with spaces)"""
    own_client: int = 0
    """lines about the wrapper's own client id (ignored)"""
    dollar_filters: int = 0
    """subscribe/unsubscribe lines for `$SYS/...` and other `$` filters except `$share/` (kept in the table for
    the subscription audit, never federated; a broken `$share/` one ignored)"""
    evicted: int = 0
    """connected ids forgotten because more than the cap were connected"""

    @property
    def not_understood_total(self) -> int:
        return sum(self.not_understood.values())

    def as_dict(self) -> dict[str, object]:
        """Plain values for a `counters` event; `not_understood` sorted by topic."""
        return {
            "lines": self.lines, "used": self.used, "ignored": self.ignored, "refused": self.refused,
            "truncated": self.truncated, "not_understood": dict(sorted(self.not_understood.items())),
            "unknown_client": self.unknown_client, "ambiguous": self.ambiguous,
            "own_client": self.own_client, "dollar_filters": self.dollar_filters, "evicted": self.evicted,
            "widened": self.widened,
        }


# "<unix seconds>: <text>". Matched on bytes so that a line cut inside a UTF-8
# character still yields its time.
_PREFIX = re.compile(rb"(\d{1,12}): ")

# "New client connected from 127.0.0.1:44658 as <id> (p2, c1, k60)." with ", u'<user>'"
# before the ")" when a username was given. The id may hold " (p", so the id is
# greedy: the last " (pN, cN, kN...)." that ends the line wins.
_CONNECTED = re.compile(
    r"New (?P<kind>client|bridge) connected from (?P<address>.+?) as (?P<client>.+)"
    r" \(p(?P<protocol>\d{1,3}), c(?P<clean>[01]), k(?P<keepalive>\d{1,5})(?:, u'(?P<username>.*)')?\)\.",
    re.DOTALL)

# How a connection or session ends, as (pattern over the text, reason). Each
# pattern is anchored at both ends (fullmatch) because ids hold any character;
# forms with a fixed ending come before the two that end in free text.
_GONE_TEXT: tuple[tuple[str, GoneReason], ...] = (
    (r"Client (?P<client>.+) disconnected\.", "disconnected"),
    (r"Client (?P<client>.+) closed its connection\.", "closed"),
    (r"Client (?P<client>.+) has exceeded timeout, disconnecting\.", "timeout"),
    (r"Client (?P<client>.+) already connected, closing old connection\.", "takeover"),
    (r"Expiring client (?P<client>.+) due to timeout\.", "expired"),
    (r"Client (?P<client>.+) disconnected due to malformed packet\.", "error"),
    (r"Client (?P<client>.+) disconnected due to protocol error\.", "error"),
    (r"Client (?P<client>.+) disconnected due to oversize packet\.", "error"),
    (r"Client (?P<client>.+) disconnected due to oversize payload\.", "error"),
    (r"Client (?P<client>.+) disconnected due to out of memory\.", "error"),
    (r"Client (?P<client>.+) disconnected due to QoS too high or retain not supported\.", "error"),
    (r"Client (?P<client>.+) disconnected, not authorised\.", "error"),
    (r"Client (?P<client>.+) been disconnected by administrative action\.", "error"),
    (r"Client (?P<client>.+) disconnected: [^:]*\.", "error"),
    (r"Bad socket read/write on client (?P<client>.+): [^:]*", "error"),
)
_GONE_FORMS = tuple((re.compile(pattern, re.DOTALL), reason) for pattern, reason in _GONE_TEXT)

# Lines that start like a connection or disconnection but are not one; anything
# else starting with these words is reported as not understood, since it may be
# a disconnect form this module does not know.
_HARMLESS = re.compile(
    r"Client connection from .*|Client .+ connected with too large Will payload"
    r"|Bad client .+ sending multiple CONNECT messages\.", re.DOTALL)
_INTERESTING_START = ("Client ", "New client connected", "New bridge connected", "Expiring client",
                      "Bad socket read/write on client")

_SUBSCRIBE_REST = re.compile(r"(?P<qos>\d{1,3}) (?P<filter>.+)", re.DOTALL)
_UNSUBSCRIBE_REST = re.compile(r"(?P<filter>.+)", re.DOTALL)
_SHARED = re.compile(r"\$share/[^/+#]+/.+", re.DOTALL)

UNKNOWN_CLIENT_ID = "<unknown>"
"""What Mosquitto prints for a connection that ended before it sent CONNECT."""


def widened_filter(cut: str) -> str | None:
    """The superset of a filter the broker's log may have cut after `cut`: its whole levels, then `#`.

    The last level may be cut short, so it goes (`a/b/cd` stands for `a/b/cd...` and becomes `a/b/#`); a cut
    shared subscription keeps its `$share/<group>/` and gets the same treatment after it. None when too little
    arrived to name a valid filter (the cut fell inside a shared subscription's group name)."""
    levels = cut.split("/")[:-1]
    shared = bool(levels) and levels[0] == "$share"
    if shared and (len(levels) < 2 or not levels[1] or any(char in levels[1] for char in "+#")):
        return None
    if levels and "#" in levels[-1]:
        return None  # `#` only ends a filter: this one ended before the cut, which cannot be
    return "/".join([*levels, "#"])


class BrokerLogTracker:
    """Feed it every `$SYS/broker/log/#` message of one broker; it returns the events each line means.

    `own_client_id` is the wrapper's own connection to that broker: its lines
    (including its subscription to the log) are ignored, and so are those of
    `helper_client_ids`, the wrapper's other connections (its retained scan).
    """

    def __init__(self, own_client_id: str, max_tracked_clients: int = DEFAULT_MAX_TRACKED_CLIENTS,
                 helper_client_ids: tuple[str, ...] = ()) -> None:
        if max_tracked_clients < 1:
            raise ValueError(f"max_tracked_clients must be >= 1, got {max_tracked_clients}")
        self.own_client_id = own_client_id
        self.own_client_ids = frozenset((own_client_id, *helper_client_ids))
        self.max_tracked_clients = max_tracked_clients
        self.counters = LogCounters()
        self.last_line_time: int | None = None
        """unix seconds of the last line that had a "<seconds>: " prefix"""
        self._connected: dict[str, tuple[bool, int]] = {}
        """connected client id -> its clean flag and MQTT version, oldest connection first"""
        self._kicker_addresses: set[str] = set()
        """"host:port" of the wrapper's takeover connections (`add_kicker`: any thread)"""
        self._kicking: dict[str, bool] = {}
        """client id -> clean start of the wrapper's connection that holds it now (a takeover under way)"""
        self._kicker_lock = threading.Lock()

    def add_kicker(self, address: str) -> None:
        """The wrapper's takeover connection from `address` ("host:port") is about to send its CONNECT (any thread):
        its lines are the wrapper's own (federation.daemon.kicker)."""
        with self._kicker_lock:
            self._kicker_addresses.add(address)

    def is_connected(self, client: str) -> bool:
        """A connection of `client` (not one of the wrapper's takeovers) is on the broker, as far as the log says."""
        return client in self._connected

    def kicking(self, client: str) -> bool:
        """A takeover connection of the wrapper's holds `client` now."""
        return client in self._kicking

    @property
    def connected_clients(self) -> frozenset[str]:
        """Ids the tracker believes are connected now (bounded by max_tracked_clients)."""
        return frozenset(self._connected)

    def feed(self, topic: str, payload: bytes | bytearray | str) -> list[LogEvent]:
        """Read one log message (the payload as paho gives it); never raises on what the broker sends."""
        counters = self.counters
        counters.lines += 1
        raw = payload.encode("utf-8", "surrogatepass") if isinstance(payload, str) else bytes(payload)
        if not topic.startswith(LOG_TOPIC_PREFIX):
            return self._not_understood("(not a log topic)")
        prefix = _PREFIX.match(raw)
        if prefix is not None:
            self.last_line_time = int(prefix.group(1))
        if topic not in TEXT_TOPICS and topic not in (SUBSCRIBE_TOPIC, UNSUBSCRIBE_TOPIC):
            counters.ignored += 1  # D, WS and any level a later version adds
            return []
        if prefix is None:
            return self._not_understood(topic)
        if len(raw) >= MAX_PAYLOAD_BYTES:
            # Possibly cut: a subscription becomes a superset of itself; a connection or disconnection line
            # that long cannot be trusted; any other long line is just ignored.
            if topic == SUBSCRIBE_TOPIC:
                return self._cut_subscribe(topic, raw[prefix.end():].decode("utf-8", "ignore"))
            start = raw[prefix.end():prefix.end() + 40].decode("utf-8", "ignore")
            if topic in TEXT_TOPICS and not start.startswith(_INTERESTING_START):
                counters.ignored += 1
            else:
                counters.truncated += 1
            return []
        try:
            text = raw[prefix.end():].decode("utf-8")
        except UnicodeDecodeError:
            return self._not_understood(topic)
        if topic == SUBSCRIBE_TOPIC:
            return self._subscribe(topic, text)
        if topic == UNSUBSCRIBE_TOPIC:
            return self._unsubscribe(topic, text)
        return self._text_line(topic, text)

    # Line forms.

    def _text_line(self, topic: str, text: str) -> list[LogEvent]:
        if not text.startswith(_INTERESTING_START):
            self.counters.ignored += 1
            return []
        connected = _CONNECTED.fullmatch(text)
        if connected is not None:
            return self._connected_line(connected)
        for pattern, reason in _GONE_FORMS:
            gone = pattern.fullmatch(text)
            if gone is not None:
                return self._gone_line(gone.group("client"), reason)
        if _HARMLESS.fullmatch(text):
            self.counters.ignored += 1
            return []
        return self._not_understood(topic)

    def _connected_line(self, match: re.Match[str]) -> list[LogEvent]:
        client = match.group("client")
        clean = match.group("clean") == "1"
        protocol = int(match.group("protocol"))
        with self._kicker_lock:
            kicker = match.group("address") in self._kicker_addresses
            if kicker:
                self._kicker_addresses.discard(match.group("address"))
        if kicker:
            self._connected.pop(client, None)
            self._kicking[client] = clean
            return self._own(ClientConnected(client, clean, protocol, int(match.group("keepalive")), own=True,
                                             kicker=True))
        if client in self.own_client_ids:
            return self._own(ClientConnected(client, clean, protocol, int(match.group("keepalive")), own=True))
        self._connected.pop(client, None)  # a reconnect moves the id to the newest end
        self._connected[client] = (clean, protocol)
        while len(self._connected) > self.max_tracked_clients:
            del self._connected[next(iter(self._connected))]
            self.counters.evicted += 1
        self.counters.used += 1
        return [ClientConnected(client, clean, protocol, int(match.group("keepalive")),
                                match.group("username"), match.group("kind") == "bridge")]

    def _gone_line(self, client: str, reason: GoneReason) -> list[LogEvent]:
        if client in self._kicking and reason != "expired":
            clean = self._kicking.pop(client)
            return self._own(ClientGone(client, reason, clean, 5, own=True, kicker=True))
        if client in self.own_client_ids:
            return self._own(ClientGone(client, reason, own=True))
        if client == UNKNOWN_CLIENT_ID and client not in self._connected:
            self.counters.ignored += 1  # a connection that never sent CONNECT
            return []
        connection = self._connected.pop(client, None)
        self.counters.used += 1
        if connection is None:
            return [ClientGone(client, reason)]
        return [ClientGone(client, reason, connection[0], connection[1])]

    def _subscribe(self, topic: str, text: str) -> list[LogEvent]:
        split = self._split(text, _SUBSCRIBE_REST)
        if split is None:
            return self._not_understood(topic)
        client, rest = split
        qos = int(rest.group("qos"))
        if client in self.own_client_ids or client in self._kicking:
            return self._own(ClientSubscribed(client, rest.group("filter"), qos, own=True) if qos <= 2 else None)
        if qos > 2:
            self.counters.refused += 1  # 0x80 (v3.1.1) or a v5 reason code: no subscription was made
            return []
        topic_filter = rest.group("filter")
        if not self._federable(topic_filter):
            return []
        self.counters.used += 1
        return [ClientSubscribed(client, topic_filter, qos)]

    def _cut_subscribe(self, topic: str, text: str) -> list[LogEvent]:
        """A subscribe line the broker may have cut: subscribe to the superset of what arrived."""
        split = self._split(text, _SUBSCRIBE_REST)
        if split is None:  # cut inside the client id: nothing to learn
            self.counters.truncated += 1
            return []
        client, rest = split
        if client in self.own_client_ids:
            return self._own()
        qos = int(rest.group("qos"))
        topic_filter = widened_filter(rest.group("filter"))
        if qos > 2 or topic_filter is None:
            self.counters.truncated += 1
            return []
        if not self._federable(topic_filter):
            return []
        self.counters.used += 1
        self.counters.widened += 1
        return [ClientSubscribed(client, topic_filter, qos)]

    def _unsubscribe(self, topic: str, text: str) -> list[LogEvent]:
        split = self._split(text, _UNSUBSCRIBE_REST)
        if split is None:
            return self._not_understood(topic)
        client, rest = split
        if client in self.own_client_ids:
            return self._own(ClientUnsubscribed(client, rest.group("filter"), own=True))
        topic_filter = rest.group("filter")
        if not self._federable(topic_filter):
            return []
        self.counters.used += 1
        return [ClientUnsubscribed(client, topic_filter)]

    # Helpers.

    def _split(self, text: str, rest_form: re.Pattern[str]) -> tuple[str, re.Match[str]] | None:
        """Split "<client> <rest>": at the longest connected id that fits, else at the first space that fits."""
        spaces = [index for index, char in enumerate(text) if char == " "]
        for index in reversed(spaces):
            client = text[:index]
            if client in self._connected or client in self.own_client_ids or client in self._kicking:
                rest = rest_form.fullmatch(text, index + 1)
                if rest is not None:
                    return client, rest
        fits = [(index, rest) for index in spaces
                if index > 0 and (rest := rest_form.fullmatch(text, index + 1)) is not None]
        if not fits:
            return None
        self.counters.unknown_client += 1
        if len(fits) > 1:
            self.counters.ambiguous += 1
        index, rest = fits[0]
        return text[:index], rest

    def _federable(self, topic_filter: str) -> bool:
        """False (and counted as ignored) for a `$` filter that is no valid filter; `$share/...` passes, and so
        do `$SYS/...` and other `$` filters (counted in `dollar_filters`): they never federate (the node
        leaves them out), but the broker counts them among its subscriptions, and so must the table for the
        subscription audit (federation.daemon.broker_subscriptions) not to take them for unseen ones."""
        if topic_filter.startswith("$") and not _SHARED.fullmatch(topic_filter):
            self.counters.dollar_filters += 1
            if topic_filter.startswith("$share/") or validate_filter(topic_filter) is not None:
                self.counters.ignored += 1
                return False
        return True

    def _own(self, event: LogEvent | None = None) -> list[LogEvent]:
        """A line of the wrapper's own connections: ignored for the subscriptions (counted `own_client`), handed
        over marked `own` for what it does to the broker's counts (federation.daemon.session_ledger)."""
        self.counters.own_client += 1
        self.counters.ignored += 1
        return [event] if event is not None else []

    def _not_understood(self, topic: str) -> list[LogEvent]:
        counts = self.counters.not_understood
        counts[topic] = counts.get(topic, 0) + 1
        return []
