"""Which MQTT 5 sessions the broker kept when their connection ended (federation.daemon.session_ledger, issue 39
item 1): the log does not say (clean start 1 with a session expiry is persistent, and the expiry is not logged),
the broker's `$SYS` counts between two rounds do, when exactly one explanation fits both."""

from __future__ import annotations

from federation.daemon.session_ledger import Resolution, SessionLedger


def ledger_at(total: int, subscriptions: int, offline: int = 0) -> SessionLedger:
    """A ledger whose reference counts are known (the retained values read at subscribe time) and calibrated."""
    ledger = SessionLedger()
    ledger.total_counted(total)
    ledger.subscriptions_counted(subscriptions)
    ledger.disconnected_counted(offline)
    return ledger


def round_of(ledger: SessionLedger, total: int | None = None, subscriptions: int | None = None) -> list[Resolution]:
    """One `$SYS` round (uptime, then the counts that changed), ended by the next log line."""
    ledger.round_started()
    if total is not None:
        ledger.total_counted(total)
    if subscriptions is not None:
        ledger.subscriptions_counted(subscriptions)
    return ledger.round_ended()


def connect_and_subscribe(ledger: SessionLedger, client: str, filters: int, clean: bool = True) -> None:
    ledger.connected_line(client, clean, 0)
    for _ in range(filters):
        ledger.subscription_changed(1)


def test_a_clean_start_session_without_expiry_ends_with_its_connection() -> None:
    ledger = ledger_at(10, 20)
    connect_and_subscribe(ledger, "c", 2)
    assert round_of(ledger, total=11, subscriptions=22) == []  # nothing unsure yet
    ledger.gone_line("c", 5, True, takeover=False, filters=2)
    assert list(ledger.unsure()) == ["c"]
    assert round_of(ledger, total=10, subscriptions=20) == [Resolution("c", ended=True)]
    assert list(ledger.unsure()) == [] and ledger.counts.ended == 1


def test_a_clean_start_session_with_an_expiry_is_kept() -> None:
    ledger = ledger_at(10, 20)
    connect_and_subscribe(ledger, "p", 1)
    round_of(ledger, total=11, subscriptions=21)
    ledger.gone_line("p", 5, True, takeover=False, filters=1)
    assert round_of(ledger) == [Resolution("p")]  # neither count changed: the broker kept it
    assert ledger.describe()["kept"] == 1 and ledger.counts.kept == 1


def test_several_sessions_of_one_round_are_told_apart_by_their_filters() -> None:
    ledger = ledger_at(10, 20)
    connect_and_subscribe(ledger, "x", 1)
    connect_and_subscribe(ledger, "y", 2)
    round_of(ledger, total=12, subscriptions=23)
    ledger.gone_line("x", 5, True, takeover=False, filters=1)
    ledger.gone_line("y", 5, True, takeover=False, filters=2)
    assert round_of(ledger, total=11, subscriptions=21) == [Resolution("x"), Resolution("y", ended=True)]


def test_two_explanations_decide_nothing_and_the_filters_stay() -> None:
    """Two sessions with one filter each, one of them ended: either could be it. The safe side: both kept."""
    ledger = ledger_at(10, 20)
    connect_and_subscribe(ledger, "x", 1)
    connect_and_subscribe(ledger, "y", 1)
    round_of(ledger, total=12, subscriptions=22)
    ledger.gone_line("x", 5, True, takeover=False, filters=1)
    ledger.gone_line("y", 5, True, takeover=False, filters=1)
    assert round_of(ledger, total=11, subscriptions=21) == []
    assert sorted(ledger.unsure()) == ["x", "y"] and ledger.counts.undecided == 1


def test_without_the_subscription_count_only_kept_is_concluded() -> None:
    """An end seen in the client count alone could be another session's silent end (a will delay's), or a hidden
    session's: it is not trusted; "nothing changed" still confirms the sessions kept."""
    ledger = ledger_at(10, 20)
    ledger.connected_line("x", True, 0)
    ledger.subscription_changed(None)  # a filter the wrapper cannot place
    round_of(ledger, total=11, subscriptions=21)
    ledger.gone_line("x", 5, True, takeover=False, filters=1)
    ledger.subscription_changed(None)
    assert round_of(ledger, total=10, subscriptions=20) == []
    ledger.connected_line("y", True, 0)
    round_of(ledger, total=11)
    ledger.gone_line("y", 5, True, takeover=False, filters=0)
    ledger.subscription_changed(None)
    assert round_of(ledger) == [Resolution("y")]


def test_a_first_connection_of_an_id_decides_nothing_while_the_broker_may_hold_sessions_unseen() -> None:
    ledger = ledger_at(10, 20, offline=3)  # three offline sessions the wrapper never saw
    assert not ledger.calibrated
    connect_and_subscribe(ledger, "x", 1)
    round_of(ledger, total=11, subscriptions=21)
    ledger.gone_line("x", 5, True, takeover=False, filters=1)
    ledger.connected_line("new", False, 0)  # perhaps one of the three, resumed (0), perhaps new (+1)
    assert round_of(ledger, total=10, subscriptions=20) == []
    ledger.disconnected_counted(1)  # now the broker holds only the one the wrapper knows
    assert ledger.calibrated


def test_a_reconnection_settles_a_session_left_unsure() -> None:
    """Clean start 0 to a session the broker no longer had: one client id more (session present 0): the filters
    carried from before go; to one it kept: no change."""
    ledger = ledger_at(10, 20)
    connect_and_subscribe(ledger, "x", 1)
    connect_and_subscribe(ledger, "y", 1)
    round_of(ledger, total=12, subscriptions=22)
    ledger.gone_line("x", 5, True, takeover=False, filters=1)
    ledger.gone_line("y", 5, True, takeover=False, filters=1)
    round_of(ledger, total=11, subscriptions=21)  # one of them ended: undecided, the equation kept
    assert sorted(ledger.unsure()) == ["x", "y"]
    ledger.connected_line("x", False, 1)
    # x's session was gone (one client id more): so x was the one that ended, and y was kept
    assert round_of(ledger, total=12) == [Resolution("x", absent=True), Resolution("y")]
    assert list(ledger.unsure()) == []
    ledger.connected_line("y", False, 1)
    assert round_of(ledger) == []  # settled already: its return resumes it, as expected


def test_an_expiry_settles_the_other_sessions_of_an_undecided_round() -> None:
    ledger = ledger_at(10, 20)
    connect_and_subscribe(ledger, "x", 1)
    connect_and_subscribe(ledger, "y", 1)
    round_of(ledger, total=12, subscriptions=22)
    ledger.gone_line("x", 5, True, takeover=False, filters=1)
    ledger.gone_line("y", 5, True, takeover=False, filters=1)
    round_of(ledger, total=11, subscriptions=21)  # one ended
    ledger.expired_line("y", 1)  # y was kept until now: x is the one that ended
    assert round_of(ledger, total=10, subscriptions=20) == [Resolution("x", ended=True)]


def test_an_expiry_line_ends_an_unsure_session_and_the_wrappers_scan_is_counted() -> None:
    ledger = ledger_at(10, 20)
    connect_and_subscribe(ledger, "x", 1)
    round_of(ledger, total=11, subscriptions=21)
    ledger.gone_line("x", 5, False, takeover=False, filters=1)
    ledger.expired_line("x", 1)
    ledger.helper(clients=1, subscriptions=2)  # the retained scan connected and subscribed
    assert round_of(ledger, total=11, subscriptions=22) == []  # nothing unsure left: the counts just follow
    assert list(ledger.unsure()) == []


def test_mqtt_3_needs_no_counts() -> None:
    ledger = ledger_at(10, 20)
    connect_and_subscribe(ledger, "v3", 1, clean=False)
    ledger.gone_line("v3", 4, False, takeover=False, filters=1)
    assert list(ledger.unsure()) == [] and ledger.describe()["kept"] == 1
    ledger.connected_line("v3c", True, 0)
    ledger.gone_line("v3c", 4, True, takeover=False, filters=0)
    assert round_of(ledger, total=11, subscriptions=21) == []


def test_lost_lines_make_the_next_round_explain_nothing() -> None:
    ledger = ledger_at(10, 20)
    connect_and_subscribe(ledger, "x", 1)
    round_of(ledger, total=11, subscriptions=21)
    ledger.gone_line("x", 5, True, takeover=False, filters=1)
    ledger.unsettle()  # the wrapper was away from the log
    assert round_of(ledger, total=10, subscriptions=20) == []
    assert list(ledger.unsure()) == ["x"]
