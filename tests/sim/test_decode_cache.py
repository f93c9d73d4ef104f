"""The simulator's decode cache gives exactly what `wire.decode` gives: the same packet, or the same drop reason."""

from __future__ import annotations

import random

import msgpack
import pytest

from federation.protocol import wire
from federation.protocol.types import Address, BrokerId
from federation.protocol.wire import DecodeError
from federation.protocol.wire_types import Federate, LinkStateRecord, Packet, Sender, TopologyUpdate
from federation.sim.decode_cache import DecodeCache


def address(index: int) -> Address:
    return Address(f"10.0.{index // 256}.{index % 256}", 10500)


def record(rng: random.Random) -> LinkStateRecord:
    origin = rng.randrange(40)
    neighbours = tuple(sorted({address(rng.randrange(40)) for _ in range(rng.randrange(6))}))
    return LinkStateRecord(BrokerId(rng.randrange(50), address(origin)), rng.randrange(1, 3), rng.randrange(1, 4),
                           rng.randrange(4), rng.choice((0, 0, wire.FLAG_LEAVING)), neighbours)


def outcome(decode: object, data: bytes, max_packet: int, max_neighbours: int) -> Packet | tuple[str, str]:
    try:
        return decode(data, max_packet, max_neighbours)  # type: ignore[operator]
    except DecodeError as error:
        return (error.reason, error.detail)


def mutated(rng: random.Random, data: bytes) -> bytes:
    """A datagram near a valid one: a byte changed, bytes cut or added, or a field of another type."""
    choice = rng.random()
    if choice < 0.35:
        position = rng.randrange(len(data))
        return data[:position] + bytes([rng.randrange(256)]) + data[position + 1:]
    if choice < 0.55:
        return data[:rng.randrange(len(data))]
    if choice < 0.7:
        return data + bytes([rng.randrange(256)])
    value = msgpack.unpackb(data)
    spots = [(value, 1), (value, 2), (value[2], rng.randrange(4))]
    body = value[3]
    if body and isinstance(body[0], list):  # tu: one of its records
        body = body[rng.randrange(len(body))]
    if isinstance(body, list) and len(body) == 8:
        spots.append((body, rng.randrange(8)))
    container, index = rng.choice(spots)
    container[index] = rng.choice((True, -1, 2**64 - 1, -2**63, "x", 1.5, None, [], "é" * 300, 65536))
    if rng.random() < 0.2:
        value.append(0)
    return msgpack.packb(value)


@pytest.mark.parametrize("seed", range(2))
def test_the_cache_decodes_as_wire_decode_does(seed: int) -> None:
    rng = random.Random(seed)
    cache = DecodeCache(capacity=64, record_capacity=32)  # small: entries come and go
    pool = [record(rng) for _ in range(60)]  # records repeat across packets, as in a flood
    checked = 0
    for _ in range(2000):
        sender = Sender(BrokerId(rng.randrange(50), address(rng.randrange(40))), rng.randrange(1, 3))
        if rng.random() < 0.3:
            data = wire.encode(wire.FEDERATE, sender, Federate(rng.choice(pool)))
        else:
            data = wire.encode(wire.TOPOLOGY_UPDATE, sender,
                               TopologyUpdate(tuple(rng.choice(pool) for _ in range(rng.randrange(8)))))
        if rng.random() < 0.4:
            data = mutated(rng, data)
        max_packet = rng.choice((65507, 65507, 40))
        max_neighbours = rng.choice((1024, 1024, 3))
        expected = outcome(wire.decode, data, max_packet, max_neighbours)
        assert outcome(cache, data, max_packet, max_neighbours) == expected, data.hex()
        assert outcome(cache, data, max_packet, max_neighbours) == expected, data.hex()  # from the cache
        checked += 1
    assert cache.record_hits > 1000 and cache.record_misses > 100
    assert checked == 2000
