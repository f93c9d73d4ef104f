"""Real Mosquitto brokers and client processes on loopback, for tests that need the real thing.

    broker = start_broker(tmp_path)          # waits until it accepts connections
    request.addfinalizer(broker.stop)        # or: with start_broker(tmp_path) as broker:
    processes = Processes(); request.addfinalizer(processes.close)
    sub = processes.start(mosquitto_sub(broker.port, "-i", "c1", "-t", "a/#"))
    wait_for(lambda: "c1" in seen, timeout=5, message="c1 to connect")

Each broker gets its own directory under the test's tmp_path with its config
(`mosquitto.conf`), its log (`broker.log`, line-buffered) and whatever it
writes at the console before the log opens (`console.log`); `broker.diagnostics()`
shows the ends of both, for failure messages. By default the broker also
publishes its log on `$SYS/broker/log/#` (`log_dest topic`, `log_type all`, as
the federation wrapper needs) and queues without limit (`max_queued_messages 0`).

Started as root, Mosquitto drops to user `mosquitto` and then cannot write to
pytest's root-only tmp dirs; `user root` keeps it root (it warns, harmlessly).
Pass your own `user ...` line in `extra_conf_lines` to test the drop.

Nothing here sleeps blindly: waits poll a condition until a deadline.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self, TypeVar

import pytest

from federation.tools.launch import LaunchError, poll

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
MOSQUITTO_SUB = shutil.which("mosquitto_sub") or "/usr/bin/mosquitto_sub"
MOSQUITTO_PUB = shutil.which("mosquitto_pub") or "/usr/bin/mosquitto_pub"
HAVE_MOSQUITTO = all(os.access(path, os.X_OK) for path in (MOSQUITTO, MOSQUITTO_SUB, MOSQUITTO_PUB))

requires_mosquitto = pytest.mark.skipif(
    not HAVE_MOSQUITTO, reason="needs mosquitto, mosquitto_sub and mosquitto_pub: apt-get install mosquitto "
                               "mosquitto-clients")



def mosquitto_version() -> tuple[int, ...]:
    """The installed broker's version, from `mosquitto -h` ("mosquitto version 2.0.11"); (0,) when it says none."""
    try:
        text = subprocess.run([MOSQUITTO, "-h"], capture_output=True, text=True, check=False, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return (0,)
    found = re.search(r"mosquitto version (\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(part) for part in found.groups()) if found else (0,)


REORDERS_AFTER_HELD_ACKS = HAVE_MOSQUITTO and mosquitto_version() < (2, 0, 13)
"""Mosquitto before 2.0.13 sends some QoS 1/2 publications ahead of those it had queued for a client that
acknowledged a held window at once (eclipse/mosquitto#2306, fixed by 330bf6e; tests/real/test_broker_order_real.py
shows it): a wrapper that held its intake (a full disk) gets, and numbers, them in that order."""

HOST = "127.0.0.1"
BASE_CONF = ("allow_anonymous true", "log_dest topic", "log_type all", "max_queued_messages 0", "persistence false")
"""Config lines every broker gets after its listener; `extra_conf_lines` come after these."""

T = TypeVar("T")

_RUNNING = re.compile(r"^\d+: mosquitto version \S+ running$", re.MULTILINE)


def free_port(host: str = HOST) -> int:
    """A TCP port the kernel just reported free on `host`; bind it soon (another process may take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for(predicate: Callable[[], T], timeout: float = 5.0, interval: float = 0.02,
             message: str | Callable[[], str] = "the condition") -> T:
    """Call `predicate` until it returns something truthy and return that; fail after `timeout` seconds.

    `message` says what was awaited; make it a callable to build it (with the
    state seen at the deadline) only on failure.
    """
    try:
        return poll(predicate, timeout, message, interval)
    except LaunchError as error:
        raise AssertionError(str(error)) from None


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(none)"


class Broker:
    """One mosquitto process with a fixed port and directory; start, stop, kill and restart it at will."""

    def __init__(self, workdir: Path, port: int, extra_conf_lines: Sequence[str] = (), host: str = HOST) -> None:
        self.workdir = workdir
        self.port = port
        self.host = host
        self.conf_path = workdir / "mosquitto.conf"
        self.log_path = workdir / "broker.log"
        self.console_path = workdir / "console.log"
        self.process: subprocess.Popen[bytes] | None = None
        lines = [f"listener {port} {host}", *BASE_CONF, f"log_dest file {self.log_path}"]
        if os.geteuid() == 0 and not any(line.split()[:1] == ["user"] for line in extra_conf_lines):
            lines.append("user root")
        lines.extend(extra_conf_lines)
        workdir.mkdir(parents=True, exist_ok=True)
        self.conf_path.write_text("".join(line + "\n" for line in lines))

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 5.0) -> None:
        """Start the broker and return once it accepts connections; raise with its log if it does not."""
        if self.running:
            raise RuntimeError(f"broker on port {self.port} is already running")
        log_size = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.console_path, "ab") as console:
            self.process = subprocess.Popen([MOSQUITTO, "-c", str(self.conf_path)], stdin=subprocess.DEVNULL,
                                            stdout=console, stderr=subprocess.STDOUT)
        process = self.process

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"mosquitto exited with {process.returncode} at start:\n{self.diagnostics()}")
            # "mosquitto version X running" is logged once the listeners accept
            # connections; polling the log instead of connecting keeps probe
            # connections out of the broker's log (and out of `$SYS/broker/log`).
            return _RUNNING.search(self._log_since(log_size)) is not None

        try:
            wait_for(ready, timeout, message=lambda: f"mosquitto on port {self.port} to start:\n{self.diagnostics()}")
        except BaseException:
            self.kill()
            raise

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (a clean shutdown, saving persistence if enabled), then SIGKILL after `timeout`. Idempotent."""
        self._end(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL: a crash, nothing saved. Idempotent."""
        self._end(signal.SIGKILL, 5.0)

    def restart(self, timeout: float = 5.0) -> None:
        """Stop cleanly and start again on the same port with the same directory."""
        self.stop(timeout)
        self.start(timeout)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def diagnostics(self) -> str:
        return (f"config {self.conf_path}:\n{self.conf_path.read_text()}\nconsole:\n{_tail(self.console_path)}\n"
                f"log:\n{_tail(self.log_path)}")

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def _end(self, how: signal.Signals, timeout: float) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(how)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Broker({self.host}:{self.port}, {'running' if self.running else 'stopped'}, {self.workdir})"


def start_broker(tmp_path: Path, port: int | None = None, extra_conf_lines: Sequence[str] = (),
                 name: str | None = None, timeout: float = 5.0) -> Broker:
    """Start a broker on loopback in `tmp_path/<name>` and return it running.

    With `port=None` a free port is chosen, and chosen again (twice at most)
    if another process takes it first. Stop it with `.stop()`, a `with`
    block, or a fixture finalizer.
    """
    attempts = 3 if port is None else 1
    for attempt in range(attempts):
        chosen = port if port is not None else free_port()
        broker = Broker(tmp_path / (name or f"broker-{chosen}"), chosen, extra_conf_lines)
        try:
            broker.start(timeout)
            return broker
        except RuntimeError:
            if attempt + 1 == attempts or "Address already in use" not in broker.diagnostics():
                raise
    raise AssertionError("unreachable")


def mosquitto_sub(port: int, *arguments: str, host: str = HOST) -> list[str]:
    """Command line for the real `mosquitto_sub` against a broker on `host:port`."""
    return [MOSQUITTO_SUB, "-h", host, "-p", str(port), *arguments]


def mosquitto_pub(port: int, *arguments: str, host: str = HOST) -> list[str]:
    """Command line for the real `mosquitto_pub` against a broker on `host:port`."""
    return [MOSQUITTO_PUB, "-h", host, "-p", str(port), *arguments]


class Processes:
    """Client processes started by a test; `close()` (in a finalizer) kills every one still running."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, command: Sequence[str], stdout: int | IO[Any] = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE)
        self.started.append(process)
        return process

    @staticmethod
    def end(process: subprocess.Popen[bytes], how: signal.Signals = signal.SIGTERM, timeout: float = 5.0) -> int:
        """Send `how` and wait for the exit; SIGKILL if it outlives `timeout`. Returns the exit status."""
        if process.poll() is None:
            process.send_signal(how)
            try:
                return process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
        return process.wait()

    def close(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.wait()
            if process.stderr is not None:
                process.stderr.close()
        self.started.clear()


class LoopThread:
    """An asyncio loop in a daemon thread; `call` runs a function on it and returns its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self.thread.start()

    def call(self, function: Callable[[], T], timeout: float = 5.0) -> T:
        async def run() -> T:
            return function()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture(name="loop_thread")
def loop_thread_fixture() -> Iterator[LoopThread]:
    """A `LoopThread`, closed after the test (import it as `loop_thread_fixture  # noqa: F401`)."""
    running = LoopThread()
    yield running
    running.close()
