"""Fixtures any test may use. Keep this small: topic-specific helpers live beside their tests."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest


def find_free_port(kind: socket.SocketKind = socket.SOCK_STREAM, host: str = "127.0.0.1") -> int:
    """A port the kernel just reported free on `host` (TCP by default; pass SOCK_DGRAM for UDP).

    Another process can take it before the caller binds it; tests that start
    servers should bind soon after asking.
    """
    with socket.socket(socket.AF_INET, kind) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def free_port() -> Callable[..., int]:
    """Call it for a free loopback port: `free_port()` for TCP, `free_port(socket.SOCK_DGRAM)` for UDP."""
    return find_free_port
