"""BrokerHealth without a loop or a broker: state items in, counters and operator warnings out.

The real-broker versions (a broker without `log_dest topic`, a broker down at start) are in
tests/real/test_daemon_broker.py; here the timer is a recorded `call_later` and time is passed in."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from federation.daemon import broker_health
from federation.daemon.broker_auth import BrokerAuth
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
    health.on_state(ConnectRefused("Not authorized"), 0.0)
    health.on_state(Subscribed(refused=("$SYS/broker/log/#: Not authorized",)), 0.0)
    assert "does not accept anonymous clients: give a user of its password_file with broker_username " \
           "(--broker-username)" in caplog.text
    assert "ACL must let its user (anonymous) read $SYS/broker/log/#" in caplog.text


def test_a_refused_login_is_said_once_then_reminded_and_names_the_settings(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="federation.daemon")
    timers = Timers()
    auth = BrokerAuth(username="fed", password="not shown", password_file=Path("/etc/x/broker.password"))
    health = BrokerHealth(BROKER, "wrapper-1", timers.call_later, auth)
    reminder = broker_health.BROKER_DOWN_REMINDER
    for now in (0.0, 0.5, 1.5, 3.5, reminder - 1):  # the adapter's backoff: every attempt refused
        health.on_state(ConnectRefused("Not authorized"), now)
        health.on_state(Disconnected("Protocol error", expected=False), now)  # paho closes after a refusal
    assert len(caplog.records) == 1, caplog.text
    text = caplog.text
    assert "refused the login of 'wrapper-1' as user 'fed' with a password: Not authorized" in text
    assert "user 'fed' with the password in /etc/x/broker.password" in text
    assert "broker_username (--broker-username)" in text and "broker_password_file (--broker-password-file)" in text
    assert "the overlay keeps running" in text and "lost the connection" not in text
    assert "not shown" not in text
    health.on_state(ConnectRefused("Not authorized"), reminder + 0.5)
    assert len(caplog.records) == 2 and "(still, for 60 s)" in caplog.records[1].getMessage()
    assert health.connect_failures == {"unreachable": 0, "refused": 6, "tls": 0}
    assert health.problem is not None and "Not authorized" in health.problem
    # A new kind of failure is said at once; a connection clears the problem.
    health.on_state(ConnectFailed("certificate verify failed: self-signed certificate", tls=True), reminder + 1)
    assert len(caplog.records) == 3 and "TLS with broker" not in caplog.records[2].getMessage()
    health.on_state(Connected(), reminder + 2)
    assert health.problem is None and health.connected


def test_a_failed_tls_handshake_names_the_tls_settings(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="federation.daemon")
    timers = Timers()
    auth = BrokerAuth(tls_ca=Path("/etc/x/ca.crt"))
    health = BrokerHealth(BROKER, "wrapper-1", timers.call_later, auth)
    health.on_state(ConnectFailed("certificate verify failed: self-signed certificate in certificate chain",
                                  tls=True), 0.0)
    health.on_state(ConnectFailed("the broker closed the connection before answering CONNECT", tls=True), 1.0)
    first, second = (record.getMessage() for record in caplog.records)
    assert first.startswith("TLS with broker 127.0.0.1:1883 failed (certificate verify failed")
    assert "not signed by the CA in broker_tls_ca (--broker-tls-ca) (/etc/x/ca.crt)" in first
    assert "may ask for a client certificate: give broker_tls_cert (--broker-tls-cert)" in second


def test_a_small_receive_maximum_gets_the_advice_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="federation.daemon")
    health, _timers = make()
    health.on_state(Connected(receive_maximum=20), 1.0)
    health.on_state(Disconnected("keepalive", expected=False), 2.0)
    health.on_state(Connected(receive_maximum=20), 3.0)
    advice = [record.getMessage() for record in caplog.records if "max_inflight_messages" in record.getMessage()]
    assert len(advice) == 1
    assert "at most 20 unacknowledged" in advice[0]
    assert f"max_inflight_messages {broker_health.ADVISED_RECEIVE_MAXIMUM}" in advice[0]


def test_a_wide_receive_maximum_gets_no_advice(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="federation.daemon")
    health, _timers = make()
    health.on_state(Connected(receive_maximum=broker_health.ADVISED_RECEIVE_MAXIMUM), 1.0)
    health.on_state(Connected(), 2.0)  # no Receive Maximum in the CONNACK: MQTT's 65535
    assert "max_inflight_messages" not in caplog.text
