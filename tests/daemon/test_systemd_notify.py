"""sd_notify without libsystemd (federation.daemon.systemd): what reaches a NOTIFY_SOCKET, and when nothing does."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from federation.daemon.systemd import Notifier, notify_address, service_notifications, watchdog_interval


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket standing for systemd's notification socket, and its NOTIFY_SOCKET value."""
    path = tmp_path / "notify"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(path))
    receiver.settimeout(5)
    try:
        yield receiver, str(path)
    finally:
        receiver.close()


def received(receiver: socket.socket) -> list[str]:
    """Every datagram waiting on `receiver`, decoded, without blocking."""
    messages = []
    receiver.setblocking(False)
    try:
        while True:
            messages.append(receiver.recv(4096).decode())
    except BlockingIOError:
        return messages
    finally:
        receiver.settimeout(5)


def test_notify_address_forms() -> None:
    assert notify_address("/run/systemd/notify") == "/run/systemd/notify"
    assert notify_address("@abstract/name") == "\0abstract/name"
    assert notify_address(None) is None
    assert notify_address("") is None
    assert notify_address("vsock:2:1234") is None


def test_watchdog_interval_is_half_of_watchdog_usec_for_this_pid() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}, pid=7) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "7"}, pid=7) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "8"}, pid=7) is None
    assert watchdog_interval({}, pid=7) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}, pid=7) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}, pid=7) is None


def test_one_datagram_per_notification(notify_socket: tuple[socket.socket, str]) -> None:
    receiver, path = notify_socket
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.notify("READY=1", "STATUS=running")
    assert receiver.recv(4096) == b"READY=1\nSTATUS=running"


def test_abstract_socket(tmp_path: Path) -> None:
    name = f"mqtt-federation-test-{os.getpid()}-{tmp_path.name}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind("\0" + name)
        receiver.settimeout(5)
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).notify("READY=1")
        assert receiver.recv(4096) == b"READY=1"


def test_without_notify_socket_nothing_is_sent() -> None:
    notifier = Notifier({})
    assert notifier.address is None and notifier.watchdog_interval is None
    assert not notifier.notify("READY=1")


def test_an_unreachable_socket_is_logged_once_and_never_raises(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    with caplog.at_level(logging.WARNING, logger="federation.daemon.systemd"):
        assert not notifier.notify("READY=1")
        assert not notifier.notify("STOPPING=1")
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and "NOTIFY_SOCKET" in warnings[0] and "READY=1" in warnings[0], warnings


def test_service_notifications_ready_watchdog_stopping(notify_socket: tuple[socket.socket, str]) -> None:
    receiver, path = notify_socket
    # WATCHDOG_USEC 40 ms: a ping every 20 ms from the loop.
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "40000", "WATCHDOG_PID": str(os.getpid())})

    async def run() -> None:
        loop = asyncio.get_running_loop()
        with service_notifications(loop, notifier):
            assert receiver.recv(4096) == b"READY=1"
            deadline = loop.time() + 5
            pings = 0
            while pings < 3:
                assert loop.time() < deadline, f"only {pings} watchdog pings in 5 s"
                await asyncio.sleep(0.01)  # the loop must run for its pings to be sent
                pings += received(receiver).count("WATCHDOG=1")

    asyncio.run(run())
    assert received(receiver)[-1:] == ["STOPPING=1"]


def test_stopping_is_sent_when_the_body_raises(notify_socket: tuple[socket.socket, str]) -> None:
    receiver, path = notify_socket

    async def run() -> None:
        with service_notifications(asyncio.get_running_loop(), Notifier({"NOTIFY_SOCKET": path})):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        asyncio.run(run())
    assert received(receiver) == ["READY=1", "STOPPING=1"]
