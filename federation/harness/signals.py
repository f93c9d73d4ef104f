"""Signals during a real run: unwind like Ctrl-C so that every `finally` cleans up.

Theory of operation: Python turns SIGINT into KeyboardInterrupt, which runs
every `finally` block; SIGTERM and SIGHUP kill the process without that. A
run creates things outside itself (namespaces, containers, processes), so
while it runs SIGTERM and SIGHUP raise `RunInterrupted` in the main thread
instead, and while it cleans up, SIGINT and SIGTERM are ignored, so a second
Ctrl-C cannot leave half of it behind.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


class RunInterrupted(BaseException):
    """SIGTERM or SIGHUP arrived: unwind like Ctrl-C, so every `finally` cleans up."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise RunInterrupted in the main thread (so cleanup runs);
    then restore the previous handlers. SIGINT already raises KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise RunInterrupted(signum)

    previous = {number: signal.signal(number, handler) for number in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ignore SIGINT and SIGTERM while cleaning up, so a second Ctrl-C cannot leave things behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
