"""MQTT on the wire for tests that play the broker's side: a written stream split into packets, and the
acknowledgements the runtime sends for the items an adapter handed over."""

from __future__ import annotations

from collections.abc import Iterable

from federation.daemon.broker_items import BrokerItem, LogLine, Publication


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
    return [(item.mid, item.qos) for item in items if isinstance(item, (Publication, LogLine)) and item.qos]
