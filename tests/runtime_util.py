"""A started wrapper on a real loopback UDP socket, without a broker, and a socket standing for its neighbour:
for unit tests of the wrapper's data path (tests/daemon/test_overload_daemon.py,
tests/protocol/test_publication_batch.py); and a whole runtime in a thread of the test, for tests with a real
broker (`RuntimeThread`, `runtime_config`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


PEER_EPOCH = 1
"""the envelope epoch of the test's peers (`peer_envelope`, `packets_in`)"""


def peer_envelope(wrapper: Running, peer: Address) -> Envelope:
    """An (unsigned) envelope for a peer at `peer`, introduced to the wrapper's both ways, as if they had
    exchanged a datagram: the peer stamps the wrapper's epoch, the wrapper stamps PEER_EPOCH."""
    envelope = Envelope(peer, PEER_EPOCH)
    envelope.set_peer_epoch(wrapper.config.bind, wrapper.envelope.epoch)
    wrapper.envelope.set_peer_epoch(peer, PEER_EPOCH)
    return envelope


def packets_in(data: bytes) -> list[bytes]:
    """the protocol packets of one datagram a runtime sent (unsigned envelope) to a peer of PEER_EPOCH"""
    return Envelope(Address("127.0.0.1", 1), PEER_EPOCH).receive_datagram(data, Address("127.0.0.1", 2), 0.0)


class RuntimeThread:
    """A Runtime on its own loop in a daemon thread (the wrapper in the test's process, with a real broker);
    `wrapper` is what it started, `stop()` shuts it down cleanly and returns its status."""

    def __init__(self, runtime: Runtime) -> None:
        from broker_util import wait_for

        self.runtime = runtime
        self.result: list[int | BaseException] = []
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()
        wait_for(lambda: self.result or (runtime.running is not None and runtime.running.node.started_at is not None),
                 timeout=10, message="the runtime to start")
        if self.result:
            raise AssertionError(f"runtime failed to start: {self.result[0]!r}")
        assert runtime.running is not None
        self.wrapper: Running = runtime.running

    def _main(self) -> None:
        try:
            self.result.append(asyncio.run(self.runtime.run(handle_signals=False)))
        except BaseException as error:  # noqa: BLE001 - reported by the test thread
            self.result.append(error)

    def stop(self) -> int | BaseException:
        self.runtime.request_stop()
        self.thread.join(10)
        assert not self.thread.is_alive(), "runtime did not stop"
        return self.result[0]


def runtime_config(broker_port: int, host: str = "127.0.0.1", **changes: Any) -> DaemonConfig:
    """A wrapper's config on a free UDP port of `host`, for the broker at 127.0.0.1:`broker_port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind((host, 0))
        port = int(probe.getsockname()[1])
    config = DaemonConfig(bind=Address(host, port), announced=Address(host, port), neighbours=(),
                          broker=Address("127.0.0.1", broker_port), client_id=f"federation-wrapper-{host}-{port}")
    return dataclasses.replace(config, **changes)
