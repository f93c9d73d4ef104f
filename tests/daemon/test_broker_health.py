"""BrokerHealth without a loop or a broker: state items in, counters and operator warnings out.

The real-broker versions (a broker without `log_dest topic`, a broker down at start) are in
tests/real/test_daemon_broker.py; here the timer is a recorded `call_later` and time is passed in."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from federation.daemon import broker_health
from federation.daemon.broker_health import BrokerHealth
from federation.daemon.broker_items import Connected, ConnectFailed, ConnectRefused, Disconnected, Subscribed
from federation.protocol.types import Address

BROKER = Address("127.0.0.1", 1883)


class FakeTimer:
    def __init__(self, delay: float, callback: Callable[[], None]) -> None:
        self.delay = delay
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    """A recorded `call_later`: the test fires the callbacks itself."""

    def __init__(self) -> None:
        self.started: list[FakeTimer] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(delay, callback)
        self.started.append(timer)
        return timer


def make() -> tuple[BrokerHealth, Timers]:
    timers = Timers()
    return BrokerHealth(BROKER, "wrapper-1", timers.call_later), timers


def test_connections_and_log_lines_are_counted() -> None:
    health, _timers = make()
    assert (health.connected, health.connections, health.reconnects) == (False, 0, 0)
    health.on_state(Connected(), 1.0)
    health.count_log_line()
    health.on_state(Disconnected("keepalive", expected=False), 2.0)
    assert not health.connected
    health.on_state(Connected(), 3.0)
    health.count_log_line()
    assert (health.connected, health.connections, health.reconnects, health.log_lines) == (True, 2, 1, 2)


def test_a_silent_broker_gets_one_loud_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="federation.daemon")
    health, timers = make()
    health.on_state(Connected(), 0.0)
    health.on_state(Subscribed(refused=()), 0.1)
    [check] = timers.started
    assert check.delay == broker_health.LOG_SILENCE_WARNING_AFTER
    check.callback()
    assert "log_dest topic" in caplog.text and "log_type all" in caplog.text and str(BROKER) in caplog.text


def test_no_warning_once_a_log_line_arrived(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="federation.daemon")
    health, timers = make()
    health.on_state(Connected(), 0.0)
    health.on_state(Subscribed(refused=()), 0.1)
    health.count_log_line()
    timers.started[0].callback()
    assert "log_dest topic" not in caplog.text


def test_a_new_subscription_replaces_the_pending_check_and_close_cancels_it() -> None:
    health, timers = make()
    health.on_state(Connected(), 0.0)
    health.on_state(Subscribed(refused=()), 0.1)
    health.on_state(Subscribed(refused=()), 0.2)
    first, second = timers.started
    assert first.cancelled and not second.cancelled
    health.close()
    assert second.cancelled


def test_an_unreachable_broker_is_reported_once_a_reminder_interval(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="federation.daemon")
    health, _timers = make()
    reminder = broker_health.BROKER_DOWN_REMINDER
    for now in (0.0, 1.0, reminder - 1.0, reminder, reminder + 1.0):
        health.on_state(ConnectFailed(), now)
    assert caplog.text.count("unreachable") == 2
    caplog.clear()
    caplog.set_level(logging.INFO, logger="federation.daemon")
    health.on_state(Connected(), reminder + 5.0)
    assert f"after {reminder + 5.0:.1f} s" in caplog.text  # down since the first failure


def test_refusals_say_what_to_check(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="federation.daemon")
    health, _timers = make()
    health.on_state(ConnectRefused("not authorised"), 0.0)
    health.on_state(Subscribed(refused=("$SYS/broker/log/#: not authorised",)), 0.0)
    assert "authentication settings" in caplog.text and "ACLs" in caplog.text
