"""Child processes a launcher must never leave behind, and waiting for conditions with a deadline.

Theory of operation: every launcher in this project (the loopback federation
in `federation.tools.launch`, the network-namespace backend, the demo) starts
brokers, wrappers and MQTT clients as children and must stop them however
it ends. So every child is started the same way: in its own process group
(a Ctrl-C on the terminal reaches only the launcher, which then stops its
children in order) and with PR_SET_PDEATHSIG, so the kernel sends it SIGTERM
if the launcher dies without cleaning up, even by SIGKILL. PDEATHSIG follows
the *thread* that forked: spawn from the main thread only.

Waits never sleep blindly: `poll` calls a predicate until it holds or a
deadline passes, and the error says what was awaited and what was seen.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

STOP_TIMEOUT = 5.0
"""seconds a process gets to exit after SIGTERM before SIGKILL"""
POLL_INTERVAL = 0.05
"""seconds between two calls of a `poll` predicate"""

_PR_SET_PDEATHSIG = 1
T = TypeVar("T")


class LaunchError(Exception):
    """Something a person can fix (missing mosquitto, address in use) or a process that did not come up."""


try:
    _PRCTL: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # pragma: no cover - not Linux
    _PRCTL = None


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask the kernel to send SIGTERM to this child when the launching process dies (Linux).

    Pass it as `preexec_fn` (with `process_group=0`) to any child a launcher
    must not leave behind, even when the launcher is killed with SIGKILL.
    """
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def spawn(command: Sequence[str], output: Path, *, before_exec: Callable[[], None] | None = None,
          env: Mapping[str, str] | None = None, stdin_pipe: bool = False) -> subprocess.Popen[bytes]:
    """Start `command` with stdout and stderr appended to `output`, in its own process group, dying with us.

    `before_exec` runs in the child after `die_with_parent` (the netns
    backend enters the node's network namespace there). With `stdin_pipe`
    the caller writes the child's stdin (`process.stdin`), else it is /dev/null.
    """

    def prepare() -> None:  # pragma: no cover - runs in the child
        die_with_parent()
        if before_exec is not None:
            before_exec()

    environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(output, "ab") as sink:
        stdin = subprocess.PIPE if stdin_pipe else subprocess.DEVNULL
        return subprocess.Popen(list(command), stdin=stdin, stdout=sink, stderr=subprocess.STDOUT,
                                process_group=0, preexec_fn=prepare, env=environment)


def end_process(process: subprocess.Popen[bytes] | None, kill: bool = False,
                timeout: float = STOP_TIMEOUT) -> int | None:
    """SIGTERM (or SIGKILL) and wait; SIGKILL after `timeout`. The exit status, None if it was not running."""
    if process is None:
        return None
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def end_all(processes: Sequence[subprocess.Popen[bytes]], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM every running process first, then wait for all: N processes cost one timeout, not N."""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
    wait_all(processes, timeout)


def wait_all(processes: Sequence[subprocess.Popen[bytes]], timeout: float) -> None:
    """Wait for every process within one shared `timeout`; kill those still running after it."""
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log file for an error message; "(none)" if it does not exist."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) or "(empty)"
    except FileNotFoundError:
        return "(none)"


def poll(predicate: Callable[[], T | None], timeout: float, message: str | Callable[[], str],
         interval: float = POLL_INTERVAL) -> T:
    """Call `predicate` until it returns something truthy and return it; LaunchError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise LaunchError(f"timed out after {timeout:g} s waiting for {text}")
        time.sleep(interval)


def find_tool(name: str) -> str | None:
    """The path of an executable on PATH or in the sbin directories (root tools), or None."""
    found = shutil.which(name)
    if found:
        return found
    for directory in ("/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin", "/bin"):
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def find_mosquitto() -> str:
    """The mosquitto executable, or LaunchError telling how to install it."""
    found = find_tool("mosquitto")
    if found is None:
        raise LaunchError("mosquitto is not installed (not on PATH, not in /usr/sbin): run `make install` "
                          "(or `apt-get install -y mosquitto mosquitto-clients`)")
    return found
