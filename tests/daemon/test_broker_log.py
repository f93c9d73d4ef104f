"""Unit tests of federation.daemon.broker_log: Mosquitto 2.0 log lines in, client and subscription events out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.daemon.broker_log import (
    LOG_TOPIC_PREFIX,
    MAX_PAYLOAD_BYTES,
    SUBSCRIBE_TOPIC,
    UNSUBSCRIBE_TOPIC,
    BrokerLogTracker,
    ClientConnected,
    ClientGone,
    ClientSubscribed,
    ClientUnsubscribed,
    LogCounters,
    connect_discards_session,
    filters_end_with_session,
    widened_filter,
)
from federation.protocol.topic_filter import matches as topic_matches

OWN = "fed-wrapper"
N = "$SYS/broker/log/N"
E = "$SYS/broker/log/E"
W = "$SYS/broker/log/W"
I = "$SYS/broker/log/I"  # noqa: E741  (the broker's name for the level)
SUB = SUBSCRIBE_TOPIC
UNSUB = UNSUBSCRIBE_TOPIC


def line(text: str, seconds: int = 1795277416) -> bytes:
    return f"{seconds}: {text}".encode()


def connect_text(client: str, clean: int = 1, protocol: int = 2, extra: str = "") -> str:
    return f"New client connected from 127.0.0.1:44658 as {client} (p{protocol}, c{clean}, k60{extra})."


def feed_all(tracker: BrokerLogTracker, lines: list[tuple[str, str]]) -> list[object]:
    events: list[object] = []
    for topic, text in lines:
        events.extend(tracker.feed(topic, line(text)))
    return events


def assert_outcomes_add_up(counters: LogCounters) -> None:
    outcomes = (counters.used + counters.ignored + counters.refused + counters.truncated
                + counters.not_understood_total)
    assert outcomes == counters.lines, counters


# Every line of /work/shared/reference/mosquitto-2.0.md, in its order.
REFERENCE_LINES = [
    (N, "1795277416: New connection from 127.0.0.1:44658 on port 18831."),
    (N, "1795277416: New client connected from 127.0.0.1:44658 as s1-v311 (p2, c1, k60)."),
    (SUB, "1795277416: s1-v311 0 a/b"),
    (N, "1795277417: Client s1-v311 disconnected."),
    (SUB, "1795277419: s3-multi 2 a/+/c"),
    (SUB, "1795277419: s3-multi 2 x/#"),
    (SUB, "1795277502: sh-v5 1 $share/grp/s/t"),
    (UNSUB, "1795277425: s8-unsub u/1"),
    (N, "1795277427: Client s9-killed closed its connection."),
    (N, "1795277522: Client s30-stopped has exceeded timeout, disconnecting."),
    (E, "1795277440: Client s12-dup already connected, closing old connection."),
    (N, "1795278824: New client connected from 127.0.0.1:52910 as with-user (p2, c1, k60, u'alice')."),
    (N, "1795277441: New client connected from 127.0.0.1:43236 as auto-D20CE36F-0ED1-D1E7-0CA8-B11C5D2EA4CD "
        "(p2, c1, k60)."),
    (N, "1795277443: New client connected from 127.0.0.1:43252 as has space (p2, c1, k60)."),
    (SUB, "1795277443: has space 0 sp ace/x"),
]


def test_every_reference_line() -> None:
    tracker = BrokerLogTracker(OWN)
    events = [event for topic, payload in REFERENCE_LINES for event in tracker.feed(topic, payload.encode())]
    assert events == [
        ClientConnected("s1-v311", True, 2, 60, None),
        ClientSubscribed("s1-v311", "a/b", 0),
        ClientGone("s1-v311", "disconnected", True, 2),
        ClientSubscribed("s3-multi", "a/+/c", 2),
        ClientSubscribed("s3-multi", "x/#", 2),
        ClientSubscribed("sh-v5", "$share/grp/s/t", 1),
        ClientUnsubscribed("s8-unsub", "u/1"),
        ClientGone("s9-killed", "closed", None),
        ClientGone("s30-stopped", "timeout", None),
        ClientGone("s12-dup", "takeover", None),
        ClientConnected("with-user", True, 2, 60, "alice"),
        ClientConnected("auto-D20CE36F-0ED1-D1E7-0CA8-B11C5D2EA4CD", True, 2, 60, None),
        ClientConnected("has space", True, 2, 60, None),
        ClientSubscribed("has space", "sp ace/x", 0),
    ]
    counters = tracker.counters
    assert counters.lines == len(REFERENCE_LINES)
    assert counters.ignored == 1  # "New connection from"
    assert counters.not_understood == {}
    assert counters.unknown_client == 4  # s3-multi x2, sh-v5, s8-unsub: never announced
    assert counters.ambiguous == 0
    assert tracker.last_line_time == 1795277443
    assert tracker.connected_clients == {"with-user", "auto-D20CE36F-0ED1-D1E7-0CA8-B11C5D2EA4CD", "has space"}
    assert_outcomes_add_up(counters)


@pytest.mark.parametrize(("text", "expected"), [
    ("New client connected from 127.0.0.1:1 as c (p2, c0, k30).", ClientConnected("c", False, 2, 30)),
    ("New client connected from 127.0.0.1:1 as c (p5, c1, k0).", ClientConnected("c", True, 5, 0)),
    ("New client connected from 127.0.0.1:1 as c (p1, c1, k65535).", ClientConnected("c", True, 1, 65535)),
    ("New client connected from 127.0.0.1:1 as c (p2, c1, k60, u'alice').",
     ClientConnected("c", True, 2, 60, "alice")),
    ("New client connected from 127.0.0.1:1 as c (p2, c1, k60, u'').", ClientConnected("c", True, 2, 60, "")),
    ("New client connected from 127.0.0.1:1 as c (p2, c1, k60, u'o'brien (x)').",
     ClientConnected("c", True, 2, 60, "o'brien (x)")),
    ("New bridge connected from 10.0.0.2:5 as host-b.to-a (p2, c0, k60).",
     ClientConnected("host-b.to-a", False, 2, 60, None, bridge=True)),
    ("New bridge connected from 10.0.0.2:5 as host-b.to-a (p2, c0, k60, u'br').",
     ClientConnected("host-b.to-a", False, 2, 60, "br", bridge=True)),
    # Client ids with spaces, "(" and the very suffix the broker appends (observed on 2.0.11).
    ("New client connected from 127.0.0.1:1 as has space (p2, c1, k60).", ClientConnected("has space", True, 2, 60)),
    ("New client connected from 127.0.0.1:59000 as v5(p2, c1, k60) (p5, c1, k60).",
     ClientConnected("v5(p2, c1, k60)", True, 5, 60)),
    ("New client connected from 127.0.0.1:1 as x (p2, c0, k9). (p5, c1, k60).",
     ClientConnected("x (p2, c0, k9).", True, 5, 60)),
    ("New client connected from 127.0.0.1:1 as a as b (p2, c1, k60).", ClientConnected("a as b", True, 2, 60)),
    ("New client connected from ::1:4000 as v6 (p2, c1, k60).", ClientConnected("v6", True, 2, 60)),
    ("New client connected from 127.0.0.1:1 as ünïcode/☃ (p2, c1, k60).", ClientConnected("ünïcode/☃", True, 2, 60)),
])
def test_connected_forms(text: str, expected: ClientConnected) -> None:
    tracker = BrokerLogTracker(OWN)
    assert tracker.feed(N, line(text)) == [expected]
    assert tracker.connected_clients == {expected.client}


# Every way Mosquitto 2.0.11 says a connection or session ended (`strings /usr/sbin/mosquitto`).
GONE_LINES = [
    (N, "Client {} disconnected.", "disconnected"),
    (N, "Client {} closed its connection.", "closed"),
    (N, "Client {} has exceeded timeout, disconnecting.", "timeout"),
    (E, "Client {} already connected, closing old connection.", "takeover"),
    (N, "Expiring client {} due to timeout.", "expired"),
    (N, "Client {} disconnected due to malformed packet.", "error"),
    (N, "Client {} disconnected due to protocol error.", "error"),
    (N, "Client {} disconnected due to oversize packet.", "error"),
    (N, "Client {} disconnected due to oversize payload.", "error"),
    (N, "Client {} disconnected due to out of memory.", "error"),
    (N, "Client {} disconnected due to QoS too high or retain not supported.", "error"),
    (N, "Client {} disconnected, not authorised.", "error"),
    (N, "Client {} been disconnected by administrative action.", "error"),
    (N, "Client {} disconnected: Connection reset by peer.", "error"),
    (N, "Bad socket read/write on client {}: Connection timed out", "error"),
]


@pytest.mark.parametrize(("topic", "form", "reason"), GONE_LINES)
@pytest.mark.parametrize("client", ["c1", "has space", "paren (p2, c1, k60)", "Client x disconnected."])
def test_gone_forms(topic: str, form: str, reason: str, client: str) -> None:
    tracker = BrokerLogTracker(OWN)
    tracker.feed(N, line(connect_text(client, clean=0)))
    assert tracker.feed(topic, line(form.format(client))) == [ClientGone(client, reason, False, 2)]  # type: ignore[arg-type]
    assert tracker.connected_clients == frozenset()


@pytest.mark.parametrize(("topic", "form", "reason"), GONE_LINES)
def test_gone_forms_for_unknown_clients(topic: str, form: str, reason: str) -> None:
    tracker = BrokerLogTracker(OWN)
    assert tracker.feed(topic, line(form.format("never seen"))) == [ClientGone("never seen", reason, None)]  # type: ignore[arg-type]


def test_takeover_ends_the_old_session_and_announces_the_new() -> None:
    # Order observed on 2.0.11: E line first, then the new connection's lines.
    tracker = BrokerLogTracker(OWN)
    events = feed_all(tracker, [
        (N, "New connection from 127.0.0.1:53712 on port 18999."),
        (N, connect_text("dup", clean=0)),
        (SUB, "dup 1 d"),
        (N, "New connection from 127.0.0.1:53714 on port 18999."),
        (E, "Client dup already connected, closing old connection."),
        (N, connect_text("dup", clean=1)),
        (SUB, "dup 0 d2"),
    ])
    assert events == [
        ClientConnected("dup", False, 2, 60),
        ClientSubscribed("dup", "d", 1),
        ClientGone("dup", "takeover", False, 2),
        ClientConnected("dup", True, 2, 60),
        ClientSubscribed("dup", "d2", 0),
    ]
    gone, new = events[2], events[3]
    assert isinstance(gone, ClientGone) and isinstance(new, ClientConnected)
    assert not filters_end_with_session(gone)  # a persistent session may carry over...
    assert connect_discards_session(new)  # ...but the new clean connection discards it
    assert tracker.connected_clients == {"dup"}


def test_subscribe_prefers_the_longest_connected_id() -> None:
    tracker = BrokerLogTracker(OWN)
    feed_all(tracker, [(N, connect_text("a")), (N, connect_text("a 0 b")), (N, connect_text("a 0 b 1 c"))])
    # "a 0 b 1 c" is connected but "a 0 b 1 c" + " d/e" has no qos: the next longest, "a 0 b", fits.
    assert tracker.feed(SUB, line("a 0 b 1 c d/e")) == [ClientSubscribed("a 0 b", "c d/e", 1)]
    assert tracker.feed(SUB, line("a 2 x")) == [ClientSubscribed("a", "x", 2)]
    assert tracker.feed(UNSUB, line("a 0 b 1 c d/e")) == [ClientUnsubscribed("a 0 b 1 c", "d/e")]
    assert tracker.feed(UNSUB, line("a 0 b")) == [ClientUnsubscribed("a", "0 b")]  # "a 0" is no id
    assert tracker.counters.unknown_client == 0


def test_ids_and_filters_with_spaces() -> None:
    tracker = BrokerLogTracker(OWN)
    events = feed_all(tracker, [
        (N, connect_text("id with space")),
        (SUB, "id with space 0 a/+/c"),
        (SUB, "id with space 0 x/#"),
        (SUB, "id with space 1 sp ace/x "),
        (UNSUB, "id with space u 2/x"),
        (N, "Client id with space disconnected."),
    ])
    assert events == [
        ClientConnected("id with space", True, 2, 60),
        ClientSubscribed("id with space", "a/+/c", 0),
        ClientSubscribed("id with space", "x/#", 0),
        ClientSubscribed("id with space", "sp ace/x ", 1),
        ClientUnsubscribed("id with space", "u 2/x"),
        ClientGone("id with space", "disconnected", True, 2),
    ]
    assert tracker.counters.unknown_client == 0


def test_unknown_ids_fall_back_to_the_first_space_that_fits() -> None:
    tracker = BrokerLogTracker(OWN)  # started after these clients connected
    assert tracker.feed(SUB, line("plain 0 a/b")) == [ClientSubscribed("plain", "a/b", 0)]
    assert (tracker.counters.unknown_client, tracker.counters.ambiguous) == (1, 0)
    # "has" + "space 0 ..." has no qos; "has space" is the first split that fits, and the only one.
    assert tracker.feed(SUB, line("has space 0 sp ace/x")) == [ClientSubscribed("has space", "sp ace/x", 0)]
    assert (tracker.counters.unknown_client, tracker.counters.ambiguous) == (2, 0)
    # Two readings: ("a", "b 1 c") and ("a 0 b", "c"). The first space wins, and it is counted.
    assert tracker.feed(SUB, line("a 0 b 1 c")) == [ClientSubscribed("a", "b 1 c", 0)]
    assert (tracker.counters.unknown_client, tracker.counters.ambiguous) == (3, 1)
    assert tracker.feed(UNSUB, line("plain a/b")) == [ClientUnsubscribed("plain", "a/b")]
    assert tracker.feed(UNSUB, line("u f g")) == [ClientUnsubscribed("u", "f g")]
    assert (tracker.counters.unknown_client, tracker.counters.ambiguous) == (5, 2)
    assert_outcomes_add_up(tracker.counters)


def test_refused_subscriptions_are_counted_not_emitted() -> None:
    tracker = BrokerLogTracker(OWN)
    tracker.feed(N, line(connect_text("c")))
    assert tracker.feed(SUB, line("c 128 denied/x")) == []  # 0x80, v3.1.1
    assert tracker.feed(SUB, line("c 135 denied/x")) == []  # 0x87 not authorised, v5
    assert tracker.feed(SUB, line("c 1 allowed/x")) == [ClientSubscribed("c", "allowed/x", 1)]
    assert tracker.counters.refused == 2
    assert_outcomes_add_up(tracker.counters)


def test_own_client_is_ignored_entirely() -> None:
    for own in (OWN, "fed wrapper 0"):
        tracker = BrokerLogTracker(own)
        assert feed_all(tracker, [
            (N, connect_text(own)),
            (SUB, f"{own} 0 $SYS/broker/log/#"),
            (SUB, f"{own} 1 some/topic"),
            (UNSUB, f"{own} some/topic"),
            (N, f"Client {own} closed its connection."),
            (E, f"Client {own} already connected, closing old connection."),
        ]) == [  # marked own: only what they do to the broker's counts matters (session_ledger)
            ClientConnected(own, True, 2, 60, own=True), ClientSubscribed(own, "$SYS/broker/log/#", 0, own=True),
            ClientSubscribed(own, "some/topic", 1, own=True), ClientUnsubscribed(own, "some/topic", own=True),
            ClientGone(own, "closed", own=True), ClientGone(own, "takeover", own=True)]
        assert tracker.counters.own_client == 6
        assert tracker.counters.ignored == 6
        assert tracker.connected_clients == frozenset()
    # Another client whose id starts with the wrapper's: the longest connected id still wins.
    tracker = BrokerLogTracker("w")
    tracker.feed(N, line(connect_text("w 0 x")))
    assert tracker.feed(SUB, line("w 0 x 1 t")) == [ClientSubscribed("w 0 x", "t", 1)]


def test_dollar_filters_are_kept_for_the_count_and_broken_shared_ones_ignored() -> None:
    """`$SYS/#` and the like never federate (the node leaves them out), but the broker counts them among its
    subscriptions, so the table keeps them for the subscription audit."""
    tracker = BrokerLogTracker(OWN)
    tracker.feed(N, line(connect_text("c", protocol=5)))
    assert feed_all(tracker, [
        (SUB, "c 0 $SYS/#"),
        (SUB, "c 0 $SYS/broker/clients/connected"),
        (SUB, "c 0 $other/x"),
        (UNSUB, "c $SYS/#"),
        (SUB, "c 0 $share/grp"),
    ]) == [ClientSubscribed("c", "$SYS/#", 0), ClientSubscribed("c", "$SYS/broker/clients/connected", 0),
           ClientSubscribed("c", "$other/x", 0), ClientUnsubscribed("c", "$SYS/#")]
    assert tracker.counters.dollar_filters == 5 and tracker.counters.ignored == 1
    assert feed_all(tracker, [(SUB, "c 1 $share/grp/s/t"), (SUB, "c 0 $share/g/#"), (UNSUB, "c $share/grp/s/t")]) == [
        ClientSubscribed("c", "$share/grp/s/t", 1),
        ClientSubscribed("c", "$share/g/#", 0),
        ClientUnsubscribed("c", "$share/grp/s/t"),
    ]
    assert_outcomes_add_up(tracker.counters)


def test_lines_the_broker_may_have_cut_are_widened_or_dropped() -> None:
    tracker = BrokerLogTracker(OWN)
    tracker.feed(N, line(connect_text("c")))
    head = line("c 0 f/")
    fits = head + b"x" * (MAX_PAYLOAD_BYTES - 1 - len(head))
    assert len(fits) == MAX_PAYLOAD_BYTES - 1
    assert tracker.feed(SUB, fits) == [ClientSubscribed("c", "f/" + "x" * (len(fits) - len(head)), 0)]
    cut = head + b"x" * (MAX_PAYLOAD_BYTES - len(head))  # what 2.0.11 sends for a 1200-byte filter
    assert tracker.feed(SUB, cut) == [ClientSubscribed("c", "f/#", 0)]  # a superset: over-delivery, never loss
    deeper = line("c 1 a/b/") + b"c" * 2000
    assert tracker.feed(SUB, deeper[:MAX_PAYLOAD_BYTES]) == [ClientSubscribed("c", "a/b/#", 1)]
    assert tracker.feed(SUB, (line("c 2 ") + b"z" * 2000)[:MAX_PAYLOAD_BYTES]) == [ClientSubscribed("c", "#", 2)]
    shared = (line("c 1 $share/g/k/") + b"m" * 2000)[:MAX_PAYLOAD_BYTES]
    assert tracker.feed(SUB, shared) == [ClientSubscribed("c", "$share/g/k/#", 1)]
    assert tracker.counters.widened == 4
    assert tracker.feed(SUB, (line("c 1 $share/") + b"g" * 2000)[:MAX_PAYLOAD_BYTES]) == []  # cut in the group
    assert tracker.feed(UNSUB, line("c ") + b"y" * 1200) == []  # which filter went cannot be told
    # Cut inside a UTF-8 character (observed for an id of 600 x "ü"): the id is cut, nothing to learn.
    assert tracker.feed(SUB, (line("c 0 ") + "ü".encode() * 600)[:MAX_PAYLOAD_BYTES]) == [
        ClientSubscribed("c", "#", 0)]
    long_id = "L" * 950
    assert tracker.feed(N, line(connect_text(long_id))[:MAX_PAYLOAD_BYTES]) == []
    assert tracker.feed(SUB, line("L" * 990)[:MAX_PAYLOAD_BYTES]) == []  # cut inside an unknown client id
    assert tracker.counters.truncated == 4
    assert tracker.feed(I, line("Opening listen socket on " + "x" * 1000)) == []  # long, but nothing to learn
    assert tracker.feed("$SYS/broker/log/D", line("x" * 1000)) == []
    assert (tracker.counters.truncated, tracker.counters.ignored) == (4, 2)
    assert tracker.last_line_time == 1795277416
    assert_outcomes_add_up(tracker.counters)


@pytest.mark.parametrize(("cut", "widened"), [
    ("a/b/cd", "a/b/#"), ("a/b/", "a/b/#"), ("abc", "#"), ("a/+/c", "a/+/#"), ("+/x", "+/#"),
    ("$share/g/a/b", "$share/g/a/#"), ("$share/g/", "$share/g/#"), ("$share/g", None), ("$share/", None),
    ("$share/g+/x", None), ("a/#", "a/#"), ("a/#/b", None),
])
def test_widened_filter_is_a_superset_of_every_filter_the_cut_could_have_been(cut: str, widened: str | None) -> None:
    assert widened_filter(cut) == widened
    if widened is not None:
        plain = widened.split("/", 2)[2] if widened.startswith("$share/") else widened
        cut_plain = cut.split("/", 2)[2] if cut.startswith("$share/") else cut
        for completion in ("", "x", "/more/levels", "x/y"):
            complete = cut_plain + completion
            if "#" not in complete and complete:
                topic = complete.replace("+", "any")
                assert topic_matches(plain, topic), (plain, topic)


def test_garbage_never_raises() -> None:
    tracker = BrokerLogTracker(OWN)
    junk: list[tuple[str, bytes | str]] = [
        (N, b"\xff\xfe\x00garbage"),
        (N, b""),
        (N, b"no prefix here"),
        (N, b"17952: "),
        (N, "1795277416: Client \udcff disconnected."),  # lone surrogate in a str payload
        (SUB, b"1795277416: \xc3("),
        (SUB, b"1795277416: nospace"),
        (SUB, b"1795277416: c notaqos a/b"),
        (SUB, b"1795277416: c 0"),
        (SUB, b"1795277416:  0 a/b"),
        (SUB, b"1795277416: c 1234 a/b"),
        (UNSUB, b"1795277416: onlyid"),
        (UNSUB, b"1795277416: "),
        (N, b"1795277416: New client connected from 127.0.0.1:1 as c (p2, c7, k60)."),
        (N, b"1795277416: Client c did something new."),
        (E, b"1795277416: \x00\x01\x02"),
        ("$SYS/broker/log/D", b"anything"),
        ("$SYS/broker/log/WS", b"1795277416: lws stuff"),
        ("$SYS/broker/log/M/other", b"1795277416: x"),
        ("not/a/log/topic", b"1795277416: Client c disconnected."),
        ("", b""),
    ]
    for topic, payload in junk:
        assert tracker.feed(topic, payload) == [], (topic, payload)
    assert_outcomes_add_up(tracker.counters)
    assert tracker.counters.not_understood == {N: 6, SUB: 6, UNSUB: 2, "(not a log topic)": 2}
    assert tracker.counters.ignored == 5  # "17952: ", the E control bytes, D, WS, M/other


def test_quiet_lines_are_ignored_not_errors() -> None:
    tracker = BrokerLogTracker(OWN)
    quiet = [
        (N, "New connection from 127.0.0.1:44658 on port 18831."),
        (N, "New connection from ::1:44658 on port 18831."),
        (N, "Client <unknown> closed its connection."),  # a TCP connection that never sent CONNECT
        (N, "Client <unknown> disconnected due to protocol error."),
        (N, "Client connection from 10.0.0.1 denied: max_connections exceeded."),
        (N, "Client connection from 10.0.0.1 failed: error:0A000418."),
        (N, "Client c connected with too large Will payload"),
        (N, "Bad client c sending multiple CONNECT messages."),
        (I, "mosquitto version 2.0.11 terminating"),
        (I, "Opening ipv4 listen socket on port 1883."),
        (W, "Outgoing messages are being dropped for client c."),
        (W, "Warning: Mosquitto should not be run as root/administrator."),
        (E, "Error: Address already in use"),
    ]
    assert feed_all(tracker, quiet) == []
    assert tracker.counters.ignored == len(quiet)
    assert tracker.counters.not_understood == {}


def test_tracked_ids_are_bounded() -> None:
    tracker = BrokerLogTracker(OWN, max_tracked_clients=2)
    feed_all(tracker, [(N, connect_text("a 0 b")), (N, connect_text("c")), (N, connect_text("a 0 b"))])
    feed_all(tracker, [(N, connect_text("e"))])  # evicts "c", the oldest once "a 0 b" reconnected
    assert tracker.connected_clients == {"a 0 b", "e"}
    assert tracker.counters.evicted == 1
    assert tracker.feed(SUB, line("a 0 b 1 t")) == [ClientSubscribed("a 0 b", "t", 1)]
    feed_all(tracker, [(N, connect_text("g"))])  # evicts "a 0 b": its lines fall back to the first space
    assert tracker.connected_clients == {"e", "g"}
    assert tracker.feed(SUB, line("a 0 b 1 t")) == [ClientSubscribed("a", "b 1 t", 0)]
    assert (tracker.counters.evicted, tracker.counters.unknown_client, tracker.counters.ambiguous) == (2, 1, 1)
    with pytest.raises(ValueError):
        BrokerLogTracker(OWN, max_tracked_clients=0)


def test_last_line_time_follows_the_prefix() -> None:
    tracker = BrokerLogTracker(OWN)
    assert tracker.last_line_time is None
    tracker.feed(N, line("New connection from 127.0.0.1:1 on port 1.", seconds=100))
    assert tracker.last_line_time == 100
    tracker.feed(N, b"no prefix")
    assert tracker.last_line_time == 100
    tracker.feed(I, line("anything", seconds=250))
    assert tracker.last_line_time == 250


@pytest.mark.parametrize(("reason", "clean", "ends"), [
    ("disconnected", True, True), ("disconnected", False, False),
    ("closed", True, True), ("closed", False, False), ("timeout", False, False),
    ("error", True, True), ("error", False, False), ("takeover", True, True), ("takeover", False, False),
    ("expired", False, True), ("expired", None, True), ("expired", True, True),
])
def test_filters_end_with_session_in_mqtt_3(reason: str, clean: bool | None, ends: bool) -> None:
    """MQTT 3.x says it in the connect line: a clean session ends with its connection, a c0 one is kept."""
    assert filters_end_with_session(ClientGone("c", reason, clean, 4)) is ends  # type: ignore[arg-type]


@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize("reason", ["disconnected", "closed", "timeout", "error", "takeover"])
def test_an_mqtt_5_session_outlives_its_connection_whatever_its_clean_start(reason: str, clean: bool) -> None:
    """Issue 39: clean start 1 with a session expiry is a persistent session, and the log does not show the
    expiry: the filters stay until the broker's counts settle the session's fate (federation.daemon.session_ledger)
    or an "Expiring client" line comes."""
    assert filters_end_with_session(ClientGone("c", reason, clean, 5)) is False  # type: ignore[arg-type]
    assert filters_end_with_session(ClientGone("c", "expired", clean, 5)) is True


def test_a_connection_not_seen_starting_is_left_to_the_caller() -> None:
    assert filters_end_with_session(ClientGone("c", "closed")) is None


def test_persistent_session_lifecycle() -> None:
    tracker = BrokerLogTracker(OWN)
    events = feed_all(tracker, [
        (N, connect_text("pers", clean=0, protocol=5)),
        (SUB, "pers 1 p/q"),
        (N, "Client pers disconnected."),
        (N, connect_text("pers", clean=0, protocol=5)),  # resumes: nothing re-logged
        (N, "Client pers closed its connection."),
        (N, "Expiring client pers due to timeout."),
    ])
    assert events == [
        ClientConnected("pers", False, 5, 60),
        ClientSubscribed("pers", "p/q", 1),
        ClientGone("pers", "disconnected", False, 5),
        ClientConnected("pers", False, 5, 60),
        ClientGone("pers", "closed", False, 5),
        ClientGone("pers", "expired", None),
    ]
    assert [filters_end_with_session(event) for event in events if isinstance(event, ClientGone)] == [
        False, False, True]
    assert [connect_discards_session(event) for event in events if isinstance(event, ClientConnected)] == [
        False, False]


def test_events_validate_their_fields() -> None:
    with pytest.raises(ValueError):
        ClientSubscribed("c", "t", 3)
    with pytest.raises(ValueError):
        ClientSubscribed("c", "", 0)
    with pytest.raises(ValueError):
        ClientGone("c", "vanished")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ClientConnected("", True, 2, 60)
    with pytest.raises(ValueError):
        ClientUnsubscribed("c", "")


def test_counters_as_dict() -> None:
    tracker = BrokerLogTracker(OWN)
    tracker.feed(SUB, b"junk")
    tracker.feed(N, b"junk")
    assert tracker.counters.as_dict() == {
        "lines": 2, "used": 0, "ignored": 0, "refused": 0, "truncated": 0,
        "not_understood": {N: 1, SUB: 1}, "unknown_client": 0, "ambiguous": 0,
        "own_client": 0, "dollar_filters": 0, "evicted": 0, "widened": 0,
    }


_FRAGMENTS = st.sampled_from([
    "Client ", "New client connected from ", "127.0.0.1:1", " as ", " (p2, c1, k60)", " (p5, c0, k5, u'x')",
    ".", " disconnected", " closed its connection", " 0 ", " 128 ", " 2 ", "$share/g/", "$SYS/#", "a/b", " ",
    "(", "ü", "Expiring client ", " due to timeout", ": ", "already connected, closing old connection",
])
_TEXTS = st.lists(st.one_of(_FRAGMENTS, st.text(max_size=5)), max_size=12).map("".join)
_PAYLOADS = st.one_of(
    st.binary(max_size=40),
    st.builds(lambda text, size: (f"1795277416: {text} ".encode() * 1000)[:size], _TEXTS.filter(bool),
              st.integers(MAX_PAYLOAD_BYTES - 2, MAX_PAYLOAD_BYTES + 2)),
    st.builds(lambda seconds, text: f"{seconds}: {text}".encode("utf-8", "surrogatepass"),
              st.integers(0, 10**13), _TEXTS),
    _TEXTS,
)
_TOPICS = st.one_of(st.sampled_from([N, E, W, I, SUB, UNSUB, LOG_TOPIC_PREFIX + "D", "x"]), st.text(max_size=20))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_TOPICS, _PAYLOADS), max_size=20))
def test_any_input_is_counted_and_never_raises(messages: list[tuple[str, bytes | str]]) -> None:
    tracker = BrokerLogTracker(OWN, max_tracked_clients=3)
    for topic, payload in messages:
        for event in tracker.feed(topic, payload):
            assert isinstance(event, (ClientConnected, ClientSubscribed, ClientUnsubscribed, ClientGone))
            if isinstance(event, (ClientSubscribed, ClientUnsubscribed)):
                assert not event.filter.startswith("$") or event.filter.startswith("$share/")
                assert event.client != OWN
    assert tracker.counters.lines == len(messages)
    assert len(tracker.connected_clients) <= 3
    assert_outcomes_add_up(tracker.counters)


def test_payload_types() -> None:
    tracker = BrokerLogTracker(OWN)
    assert tracker.feed(SUB, bytearray(line("c 0 a"))) == [ClientSubscribed("c", "a", 0)]
    assert tracker.feed(SUB, "1795277416: c 1 ü/b") == [ClientSubscribed("c", "ü/b", 1)]
