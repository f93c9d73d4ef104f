"""MQTT on the wire for tests that play the broker's side: a written stream split into packets, the
acknowledgements the runtime sends for the items an adapter handed over, and a loop-driven adapter on a socket
pair whose other end is the test's."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterable, Iterator

from federation.daemon.broker import BrokerAdapter
from federation.daemon.broker_items import BrokerItem, LogLine, Publication, PublicationRun
from federation.protocol.types import Address


def split_packets(stream: bytes) -> list[bytes]:
    """The MQTT packets of `stream`, whole, in order."""
    packets = []
    pos = 0
    while pos < len(stream):
        length, shift, start = 0, 0, pos + 1
        while True:
            byte = stream[start]
            start += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        packets.append(stream[pos:start + length])
        pos = start + length
    return packets


def acknowledgements(items: Iterable[BrokerItem]) -> list[tuple[int, int]]:
    """(mid, qos) of every QoS 1/2 publication and log line among `items`: what `Running` acknowledges once its
    node has taken them (`BrokerAdapter.acknowledge`)."""
    acks: list[tuple[int, int]] = []
    for item in items:
        if isinstance(item, PublicationRun):
            acks += [(mid, item.qos) for mid in item.mids]
        elif isinstance(item, (Publication, LogLine)) and item.qos:
            acks.append((item.mid, item.qos))
    return acks


def one_per_publication(items: list[BrokerItem], runs: list[PublicationRun] | None = None
                        ) -> Callable[[BrokerItem], None]:
    """An adapter's `deliver` for tests that compare its publications one by one with paho's: every item into
    `items`, a `PublicationRun` as its `Publication`s (and itself into `runs`, when given)."""
    def deliver(item: BrokerItem) -> None:
        if isinstance(item, PublicationRun):
            items.extend(item.publications())
            if runs is not None:
                runs.append(item)
        else:
            items.append(item)
    return deliver


def read_all(peer: socket.socket) -> bytes:
    """Everything the adapter has written to the test's end so far."""
    peer.setblocking(False)
    data = b""
    try:
        while chunk := peer.recv(1 << 16):
            data += chunk
    except BlockingIOError:
        pass
    return data


@contextlib.contextmanager
def adapter_on_socketpair(client_id: str, deliver: Callable[[BrokerItem], None]
                          ) -> Iterator[tuple[BrokerAdapter, socket.socket]]:
    """A loop-driven adapter (never connected: its socket set as paho's reconnect() sets it) and the test's end
    of its socket pair; everything closed after."""
    loop = asyncio.new_event_loop()
    adapter = BrokerAdapter(Address("127.0.0.1", 1883), client_id, deliver, loop=loop)
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    adapter.client._sock = ours  # type: ignore[assignment]  # what paho's reconnect() sets
    adapter.reading.watched = ours
    try:
        yield adapter, peer
    finally:
        adapter.client._sock = None
        ours.close()
        peer.close()
        loop.close()
