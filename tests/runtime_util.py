"""A started wrapper on a real loopback UDP socket, without a broker, and a socket standing for its neighbour:
for unit tests of the wrapper's data path (tests/daemon/test_overload_daemon.py,
tests/protocol/test_publication_batch.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from collections.abc import Iterator
from pathlib import Path

from federation.daemon.config import DaemonConfig
from federation.daemon.running import Running
from federation.daemon.runtime import Runtime
from federation.envelope.datagrams import Envelope
from federation.protocol.types import Address


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def started_wrapper(event_log: Path | None = None) -> Running:
    """A wrapper on a free loopback port with its node started; its broker connection is built, never started
    (a test may put a fake in `broker`). `close()` it at the end. Its node makes the per-publication events
    only with an `event_log` (that keeps them), as a wrapper's does (`DaemonConfig.publication_events`)."""
    port = free_port()
    config = DaemonConfig(bind=Address("127.0.0.1", port), announced=Address("127.0.0.1", port), neighbours=(),
                          broker=Address("127.0.0.1", 1), client_id="overload-test", event_log=event_log)
    wrapper = await Runtime(dataclasses.replace(config)).build()
    now = wrapper.clock.now()
    wrapper.node.start(now)
    wrapper._drain_outputs(now)
    return wrapper


@contextlib.contextmanager
def peer_socket() -> Iterator[tuple[socket.socket, Address]]:
    """A loopback UDP socket standing for a neighbouring wrapper (blocking, 5 s timeout), closed after."""
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        peer.bind(("127.0.0.1", 0))
        peer.settimeout(5)
        yield peer, Address("127.0.0.1", peer.getsockname()[1])
    finally:
        peer.close()


def packets_in(data: bytes) -> list[bytes]:
    """the protocol packets of one datagram a runtime sent (unsigned envelope)"""
    return Envelope(Address("127.0.0.1", 1), 1).receive_datagram(data, Address("127.0.0.1", 2), 0.0)
