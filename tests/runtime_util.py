"""A wrapper runtime on a real loopback UDP socket, without a broker, and a socket standing for its neighbour:
for unit tests of the runtime's data path (tests/daemon/test_overload_daemon.py,
tests/protocol/test_publication_batch.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import Iterator

from federation.daemon.config import DaemonConfig
from federation.daemon.runtime import Runtime
from federation.envelope.datagrams import Envelope
from federation.protocol.types import Address


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def started_runtime() -> Runtime:
    port = free_port()
    config = DaemonConfig(bind=Address("127.0.0.1", port), announced=Address("127.0.0.1", port), neighbours=(),
                          broker=Address("127.0.0.1", 1), client_id="overload-test")
    runtime = Runtime(dataclasses.replace(config))
    loop = asyncio.get_running_loop()
    runtime._loop = loop
    runtime._open(loop)
    node = runtime._start_node()
    runtime.transport, _ = await loop.create_datagram_endpoint(runtime.protocol_factory, sock=runtime._sock)
    node.start(runtime.clock.now())
    runtime._drain_outputs(runtime.clock.now())
    return runtime


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


PEER_EPOCH = 1
"""the envelope epoch of the test's peers (`peer_envelope`, `packets_in`)"""


def peer_envelope(runtime: Runtime, peer: Address) -> Envelope:
    """An (unsigned) envelope for a peer at `peer`, introduced to the runtime's both ways, as if they had
    exchanged a datagram: the peer stamps the runtime's epoch, the runtime stamps PEER_EPOCH."""
    assert runtime.envelope is not None
    envelope = Envelope(peer, PEER_EPOCH)
    envelope.set_peer_epoch(runtime.config.bind, runtime.envelope.epoch)
    runtime.envelope.set_peer_epoch(peer, PEER_EPOCH)
    return envelope


def packets_in(data: bytes) -> list[bytes]:
    """the protocol packets of one datagram a runtime sent (unsigned envelope) to a peer of PEER_EPOCH"""
    return Envelope(Address("127.0.0.1", 1), PEER_EPOCH).receive_datagram(data, Address("127.0.0.1", 2), 0.0)
