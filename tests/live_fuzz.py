"""Hostile datagrams for a live wrapper: real captured datagrams and packets, mutated (tests/real/test_fuzz_real.py).

Theory of operation: a fuzzer that only throws random bytes at a wrapper tests its first check and
nothing else. This one starts from what a neighbour really sent (datagrams captured on the wire, and
packets of every type built with the neighbour's identity) and changes one thing at a time, so most of
what it sends is one step away from valid and reaches the stage it is meant to test:

- as an *outsider* (no key): bit flips, truncations and extensions of captured datagrams; every header
  field set to a boundary value (version, kind, key id, epochs 0 / 1 / 2^63 / 2^64-1, sequence numbers,
  the receiver epoch, the sender's length); item fields changed (kinds, lengths, fragment index, count and
  total); captured datagrams replayed verbatim; random bytes; datagrams of 64 KB;
- as a *key holder* (with the key, or anyone in open mode): the packets of captured datagrams and the seed
  packets decoded (msgpack), one value replaced by a boundary value of its kind (ints 0, -1, 2^31, 2^32-1,
  2^63-1, 2^64-1, ...; floats NaN, infinities, 1e308; texts empty, 64 KiB, invalid UTF-8; lists emptied,
  cut, doubled, or grown to 10,000 elements; a value of another type), then sealed properly under the
  fuzzer's own sender name, stamped with the victim's epoch, so the victim's node decodes them; and item
  bodies with boundary fragment fields, sealed.

In open mode a datagram-level mutation is made on a copy renamed to a throwaway sender name first: open
frames are believed, so a flipped epoch under the neighbour's name would lock the neighbour out (and
under the fuzzer's own name, the fuzzer), which is what open mode means (docs/security.md), not a
finding.

`KNOWN_FATAL` lists the mutations that break a wrapper today and need the protocol files (issue 22 part
B); the fuzzer leaves them out and `tests/real/test_fuzz_real.py` checks each in an expected failure.
"""

from __future__ import annotations

import os
import random
import struct
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgpack

from federation.envelope.datagrams import (
    FRAGMENT_ITEM,
    HEADER,
    ITEM_FRAGMENT,
    ITEM_PACKET,
    KIND_OPEN,
    MAGIC,
    PACKET_ITEM,
)
from federation.envelope.keys import TAG_SIZE
from federation.protocol import wire
from federation.protocol.types import BrokerId

U64 = 2**64 - 1
INTS = (0, 1, -1, 2, 127, 128, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1,
        2**63 - 1, 2**63, U64, -2**31, -2**63)
FLOATS = (0.0, -0.0, -1.0, 1e-300, 1e308, -1e308, float("inf"), float("-inf"), float("nan"), 2.0**64)
HEADER_FIELDS = {  # field index in HEADER -> boundary values
    1: (0, 1, 3, 255),  # version
    2: (0, 1, 2, 3, 255),  # kind
    3: (0, 1, 2**32 - 1),  # key id
    4: (0, 1, 2**63, U64),  # sender epoch
    5: (0, 1, 2**63, U64),  # seq
    6: (0, 1, 2**63, U64),  # receiver epoch
    7: (0, 1, 255),  # sender length
}


def seed_packets(neighbour: wire.Sender, victim: BrokerId, victim_epoch: int) -> list[bytes]:
    """One packet of every type, as the neighbour would send it to the victim."""
    n0 = neighbour.broker_id
    record = wire.LinkStateRecord(n0, neighbour.epoch, 1000, 0, 0, (victim.address,))
    victim_record = wire.LinkStateRecord(victim, victim_epoch, 3, 1, 0, (n0.address,))
    bodies: list[tuple[str, wire.Body]] = [
        (wire.HELLO, wire.Hello(7, 1.5)),
        (wire.HELLO_BACK, wire.HelloBack(7, 1.5, 1.6)),
        (wire.FEDERATE, wire.Federate(record)),
        (wire.TOPOLOGY_UPDATE, wire.TopologyUpdate((record, victim_record))),
        (wire.DATABASE_DIGEST, wire.DatabaseDigest(2, tuple(range(wire.DIGEST_BUCKETS)))),
        (wire.DATABASE_SUMMARY, wire.DatabaseSummary((wire.SummaryEntry(n0.address, neighbour.epoch, 5),))),
        (wire.DATABASE_REQUEST, wire.DatabaseRequest((n0.address, victim.address))),
        (wire.RECONSIDER, wire.Reconsider(victim, n0)),
        (wire.CORE_ANNOUNCEMENT, wire.CoreAnnouncement(n0, neighbour.epoch, 4, 0)),
        (wire.TOPIC_CORE, wire.TopicCore("fuzz/#", n0, neighbour.epoch, 2, 0, 0)),
        (wire.RECONSIDER_TOPIC_CORE, wire.TopicCore("fuzz/#", n0, neighbour.epoch, 3, 0, 0)),
        (wire.TOPIC_SUBSCRIBE, wire.TopicSubscribe("fuzz/#", n0, 0)),
        (wire.TOPIC_MESSAGE, wire.TopicMessage("fuzz/#", n0.address, neighbour.epoch, 9, wire.MODE_IN_MESH, 0,
                                               "fuzz/a", b"payload", 1, False, None)),
        (wire.TOPIC_ACK, wire.TopicAck("fuzz/#", victim.address, victim_epoch, 1)),
        (wire.RECEIVER_BUSY, wire.ReceiverBusy(0.5)),
        (wire.TOPIC_BATCH, wire.TopicBatch("fuzz/#", n0.address, neighbour.epoch, wire.MODE_IN_MESH, 0,
                                           [10, "fuzz/b", b"x", 11, "fuzz/c", b"y"])),
        # the same kinds about the victim itself: its own record, it as a core, its own publications
        (wire.FEDERATE, wire.Federate(victim_record)),
        (wire.DATABASE_SUMMARY, wire.DatabaseSummary((wire.SummaryEntry(victim.address, victim_epoch, 3),))),
        (wire.CORE_ANNOUNCEMENT, wire.CoreAnnouncement(victim, victim_epoch, 4, 1)),
        (wire.TOPIC_CORE, wire.TopicCore("fuzz/#", victim, victim_epoch, 2, 1, 0)),
        (wire.TOPIC_SUBSCRIBE, wire.TopicSubscribe("fuzz/#", victim, 0)),
        (wire.TOPIC_MESSAGE, wire.TopicMessage("fuzz/#", victim.address, victim_epoch, 9, wire.MODE_IN_MESH, 1,
                                               "fuzz/a", b"payload", 1, False, None)),
    ]
    return [wire.encode(kind, neighbour, body) for kind, body in bodies]


def items_of(datagram: bytes) -> list[bytes] | None:
    """The protocol packets of an open or mac frame (no check), None if it is neither or does not parse."""
    if len(datagram) < HEADER.size + 1 or datagram[0] != MAGIC:
        return None
    fields = HEADER.unpack_from(datagram)
    kind, sender_size = fields[2], fields[7]
    start = HEADER.size + sender_size
    body = datagram[start:] if kind == KIND_OPEN else datagram[start:-TAG_SIZE] if kind == 1 else None
    if body is None:
        return None
    packets, position = [], 0
    while position + PACKET_ITEM.size <= len(body) and body[position] == ITEM_PACKET:
        _, length = PACKET_ITEM.unpack_from(body, position)
        packets.append(body[position + PACKET_ITEM.size:position + PACKET_ITEM.size + length])
        position += PACKET_ITEM.size + length
    return packets


def renamed(datagram: bytes, sender: bytes) -> bytes:
    """An open frame with another sender name (so mutating its header harms nobody but the fuzzer)."""
    fields = list(HEADER.unpack_from(datagram))
    start = HEADER.size + fields[7]
    fields[7] = len(sender)
    return HEADER.pack(*fields) + sender + datagram[start:]


class Mutator:
    """Values of a decoded msgpack packet, one replaced at a time."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def value(self, original: Any) -> Any:
        rng = self.rng
        if rng.random() < 0.1:  # another type altogether
            return rng.choice((None, True, 0, -1, U64, 1.5, float("nan"), "", b"", [], {}, "x" * 300))
        if isinstance(original, bool):
            return not original
        if isinstance(original, int):
            return rng.choice(INTS) if rng.random() < 0.8 else original + rng.choice((-1, 1))
        if isinstance(original, float):
            return rng.choice(FLOATS)
        if isinstance(original, str):
            return rng.choice(("", "#", "+", "$SYS/x", "a/#/b", "\u0000", "é" * 40, "x" * 65536,
                               original * 2, original[:len(original) // 2], "127.0.0.1", "::1"))
        if isinstance(original, bytes):
            return rng.choice((b"", b"\xff\xfe", os.urandom(70000), original * 2, original[:1]))
        if isinstance(original, list):
            choice = rng.random()
            if choice < 0.25:
                return []
            if choice < 0.5:
                return original[:rng.randrange(len(original) + 1)]
            if choice < 0.7:
                return original + original
            if choice < 0.8 and original:
                return [original[0]] * 10_000  # a huge count
            return original + [rng.choice((0, "", None, []))]
        if isinstance(original, dict):
            return {} if original else {"content_type": "x", 1: 2}
        return rng.choice(INTS)

    def packet(self, packet: bytes) -> bytes | None:
        """`packet` with one value changed somewhere (None when it cannot be re-encoded)."""
        try:
            tree = msgpack.unpackb(packet, raw=False, strict_map_key=False)
        except Exception:  # noqa: BLE001 - a seed that is not msgpack: nothing to mutate
            return None
        tree = self._replace(tree, depth=0)
        try:
            return bytes(msgpack.packb(tree, use_bin_type=True))
        except (OverflowError, ValueError, TypeError):
            return None

    def _replace(self, node: Any, depth: int) -> Any:
        if isinstance(node, list) and node and (depth == 0 or self.rng.random() < 0.75):
            index = self.rng.randrange(len(node)) if depth else self.rng.randrange(1, len(node))  # keep the type
            copy = list(node)
            copy[index] = self._replace(node[index], depth + 1)
            return copy
        return self.value(node)


KnownFatal = Callable[[bytes], "str | None"]


class LiveFuzzer:
    """Mutated datagrams for a victim, from a captured corpus and seed packets; `next()` -> (family, bytes).

    `seal(body)` seals an item body under the fuzzer's own sender name with the key (or as an open frame),
    stamped with the victim's epoch; `keyed` says whether the victim has a key; `known_fatal(packet)` names
    a mutation that breaks the victim today (it is left out and counted)."""

    FAMILIES = (("bitflip", 12), ("resize", 6), ("header", 10), ("items", 6), ("replay", 6), ("random", 4),
                ("jumbo", 1), ("packet", 40), ("fragments", 10), ("burst", 1))
    BURST = 20
    """datagrams of one `burst`"""

    def __init__(self, rng: random.Random, captured: list[bytes], seeds: list[bytes], keyed: bool,
                 seal: Callable[[bytes], bytes], known_fatal: KnownFatal) -> None:
        self.rng = rng
        self.keyed = keyed
        self.seal = seal
        self.known_fatal = known_fatal
        self.captured = captured
        packets = [packet for datagram in captured for packet in items_of(datagram) or []]
        self.packets = seeds + packets
        self.mutator = Mutator(rng)
        self.families = [name for name, weight in self.FAMILIES for _ in range(weight)]
        self.counts: Counter[str] = Counter()
        self.left_out: Counter[str] = Counter()
        self._pending: list[bytes] = []

    def next(self) -> tuple[str, bytes]:
        if self._pending:
            self.counts["burst"] += 1
            return "burst", self._pending.pop()
        family = self.rng.choice(self.families)
        data = getattr(self, f"_{family}")()
        if data is None:
            return self.next()
        self.counts[family] += 1
        return family, data

    # ------------------------------------------------------------ outsider: datagram level

    def _frame(self) -> bytearray:
        datagram = self.rng.choice(self.captured)
        if not self.keyed:  # a name of its own each time: a mutated epoch locks out no name that matters
            datagram = renamed(datagram, f"m{self.rng.randrange(10**6)}.example:10500".encode())
        return bytearray(datagram)

    def _bitflip(self) -> bytes:
        out = self._frame()
        for _ in range(self.rng.choice((1, 1, 2, 3, 8))):
            out[self.rng.randrange(len(out))] ^= 1 << self.rng.randrange(8)
        return bytes(out)

    def _resize(self) -> bytes:
        out = self._frame()
        if self.rng.random() < 0.6:
            return bytes(out[:self.rng.randrange(len(out))])
        return bytes(out) + os.urandom(self.rng.randint(1, 2000))

    def _header(self) -> bytes:
        out = self._frame()
        fields = list(HEADER.unpack_from(out))
        index = self.rng.choice(sorted(HEADER_FIELDS))
        fields[index] = self.rng.choice(HEADER_FIELDS[index])
        return HEADER.pack(*fields) + bytes(out[HEADER.size:])

    def _items(self) -> bytes:
        """The first item's kind or length set to a boundary value (outsiders: the tag no longer matches)."""
        out = self._frame()
        start = HEADER.size + out[HEADER.size - 1]
        if start + PACKET_ITEM.size > len(out):
            return bytes(out)
        if self.rng.random() < 0.4:
            out[start] = self.rng.choice((0, 1, 2, 3, 255))
        else:
            rest = len(out) - start - PACKET_ITEM.size
            struct.pack_into(">H", out, start + 1, self.rng.choice((0, 1, rest - 1, rest, rest + 1, 65535)) & 0xFFFF)
        return bytes(out)

    def _replay(self) -> bytes:
        return self.rng.choice(self.captured)

    def _random(self) -> bytes:
        size = self.rng.choice((0, 1, 24, 33, 100, 1400))
        data = bytearray(os.urandom(size))
        if data and self.rng.random() < 0.5:
            data[0] = MAGIC
        return bytes(data)

    def _jumbo(self) -> bytes:
        return bytes([MAGIC]) + os.urandom(65506)

    # ------------------------------------------------------------ key holder: packets and items, sealed

    def _packet(self) -> bytes | None:
        packet = self.mutator.packet(self.rng.choice(self.packets))
        if packet is None:
            return None
        reason = self.known_fatal(packet)
        if reason is not None:
            self.left_out[reason] += 1
            return None
        if PACKET_ITEM.size + len(packet) + 400 > 65507:  # too big for one datagram: a fragment of it
            return self.seal(FRAGMENT_ITEM.pack(ITEM_FRAGMENT, self.rng.randrange(2**32), 0, 2,
                                                len(packet) + 1, 60_000) + packet[:60_000])
        return self.seal(PACKET_ITEM.pack(ITEM_PACKET, len(packet)) + packet)

    def _fragments(self) -> bytes:
        rng = self.rng
        items = []
        for _ in range(rng.randint(1, 4)):
            piece = os.urandom(rng.choice((1, 64, 1300, 5000)))
            count = rng.choice((0, 1, 2, 3, 255, 65535))
            index = rng.choice((0, 1, count - 1 if count else 0, count, 65535))
            total = rng.choice((0, 1, len(piece), 327680, 327681, 2**32 - 1))
            length = len(piece) if rng.random() < 0.8 else rng.choice((0, len(piece) + 1, 65535))
            items.append(FRAGMENT_ITEM.pack(ITEM_FRAGMENT, rng.randrange(16), index & 0xFFFF, count, total, length)
                         + piece)
        return self.seal(b"".join(items))

    def _burst(self) -> bytes | None:
        """The same valid packet many times over (a flood of one kind), each in its own sealed datagram."""
        packet = self.rng.choice(self.packets)
        if self.known_fatal(packet) is not None:
            return None
        self._pending = [self.seal(PACKET_ITEM.pack(ITEM_PACKET, len(packet)) + packet) for _ in range(self.BURST)]
        return self._pending.pop()
