"""The reassembly buffers under attack: the cap counts the memory really held, shares are fair, work is flat.

`tracemalloc` measures what the buffers hold (pieces, indexes, keys, bookkeeping) and the charge must
cover it for every shape of flood (one-byte fragments, many messages, many senders, large indexes), and
not overcharge full-size fragments. Work is counted, not timed: heap entries looked at per fragment stay
a small constant whatever the number of partial messages held.
"""

from __future__ import annotations

import os
import tracemalloc

import pytest

from federation.envelope.reassembly import Reassembler
from federation.protocol.types import Address

SOURCE = Address("10.0.0.1", 10500)
EPOCH = 1_700_000_000_000_000


def sender_name(index: int) -> str:
    return f"10.{index // 250 % 250}.{index % 250}.1:10500"


def fresh(text: str) -> str:
    """a new string object equal to `text`, as every decoded datagram gives"""
    return "".join(list(text))


def flood(buffers: Reassembler, senders: int, messages: int, fragments: int, size: int, first_index: int = 0,
          now: float = 0.0) -> None:
    """Fragments of messages that never complete (count 65535), each piece a new bytes object, as sliced
    out of its datagram."""
    blob = os.urandom(size + 1)
    for message in range(messages):
        for number in range(senders):
            name = sender_name(number)
            for fragment in range(fragments):
                buffers.add((fresh(name), EPOCH + message, 100_000 + message), first_index + fragment, 65535,
                            buffers.max_message, blob[1:], Address("10.0.0.1", 10500), now)


@pytest.mark.parametrize("shape", [
    # senders, messages per sender, fragments per message, bytes per fragment, first index
    (1, 3000, 1, 1, 0),  # one sender, a new message per one-byte fragment
    (3000, 1, 1, 2, 0),  # a new sender name per fragment
    (50, 20, 20, 8, 0),  # small fragments of many messages
    (20, 5, 100, 1, 1000),  # indexes above the cached small ints
    (10, 4, 40, 1300, 0),  # honest-sized fragments
])
def test_the_charge_covers_the_memory_really_held(shape: tuple[int, int, int, int, int]) -> None:
    senders, messages, fragments, size, first_index = shape
    buffers = Reassembler(max_message=320 * 1024, memory=1 << 40, timeout=1e9, per_sender=10**6)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        flood(buffers, senders, messages, fragments, size, first_index)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert buffers.used >= held, f"charged {buffers.used} bytes, {held} held"
    assert buffers.used <= 2 * held, f"charged {buffers.used} bytes for {held} held: too much"
    if size >= 1000:
        assert buffers.used <= 1.05 * held  # real fragments are charged what they cost


def test_a_flood_of_tiny_fragments_stays_within_the_cap_as_really_held() -> None:
    memory = 2 * 1024 * 1024
    buffers = Reassembler(max_message=320 * 1024, memory=memory, timeout=1e9, per_sender=10**6)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        flood(buffers, 200, 100, 1, 1)  # 20,000 one-byte fragments: 20 KB of payload, 15 MB if held
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert buffers.used <= memory
    assert held <= memory * 1.05, f"{held} bytes held under a cap of {memory}"
    assert buffers.evictions > 10_000


def test_one_sender_flooding_evicts_its_own_messages_not_the_others() -> None:
    buffers = Reassembler(max_message=100_000, memory=400_000, timeout=1e9, per_sender=10**6)
    honest = [(f"honest-{number}:10500", EPOCH, number) for number in range(3)]
    for key in honest:  # three honest packets of 20 fragments each, 19 arrived
        for index in range(19):
            assert buffers.add(key, index, 20, 20 * 1000, os.urandom(1000), SOURCE, 0.0) == (None, [])
    for message in range(2000):  # the flood, under one name, new messages all the time
        buffers.add(("flood:10500", EPOCH, message), 0, 2, 2600, os.urandom(1300), SOURCE, 1.0)
        assert buffers.used <= buffers.memory
    assert buffers.evictions > 1500
    for key in honest:  # none of the honest partial packets was touched: each completes
        flood_held = buffers.held_by("flood:10500")
        whole, dropped = buffers.add(key, 19, 20, 20 * 1000, os.urandom(1000), SOURCE, 2.0)
        assert whole is not None and len(whole) == 20_000
        assert len(dropped) == (buffers.held_by("flood:10500") < flood_held)  # room made at the flood's expense
    assert buffers.held_by("flood:10500") > 0.8 * buffers.memory - 3 * 25_000  # it may use what nobody needs


def test_the_largest_holder_gives_way_first() -> None:
    buffers = Reassembler(max_message=150_000, memory=300_000, timeout=1e9, per_sender=10**6)
    for index in range(100):  # the big sender: about 140 KB held
        buffers.add(("big", EPOCH, 1), index, 110, 110 * 1300, os.urandom(1300), SOURCE, 0.0)
    for message in range(10):  # smaller ones, one fragment each
        buffers.add((f"small-{message % 5}", EPOCH, message), 0, 2, 2000, os.urandom(1000), SOURCE, 1.0)
    assert buffers.evictions == 0 and buffers.held_by("big") > 130_000
    # A newcomer needs 150 KB: "big" holds the most when the memory runs out, so its packet is evicted.
    reasons = []
    for index in range(109):
        _, dropped = buffers.add(("newcomer", EPOCH, 1), index, 110, 110 * 1300, os.urandom(1300), SOURCE, 2.0)
        reasons += [(gone.reason, gone.detail) for gone in dropped]
    assert reasons == [("reassembly_evicted", "reassembly memory full: the oldest partial packet of the sender "
                                              "holding the most")]
    assert buffers.held_by("big") == 0 and buffers.held_by("newcomer") > 140_000
    assert all(buffers.held_by(f"small-{number}") > 0 for number in range(5))


def test_a_packet_that_needs_more_than_the_rest_leave_is_dropped_when_its_sender_holds_the_most() -> None:
    buffers = Reassembler(max_message=275_000, memory=550_000, timeout=1e9, per_sender=10**6)
    for index in range(190):  # another sender holds about 265 KB
        buffers.add(("other", EPOCH, 1), index, 210, 210 * 1300, os.urandom(1300), SOURCE, 0.0)
    reasons = []
    for index in range(210):
        _, dropped = buffers.add(("greedy", EPOCH, 1), index, 210, 210 * 1300, os.urandom(1300), SOURCE, 1.0)
        reasons += [(gone.reason, gone.detail) for gone in dropped]
        if dropped:
            break
    assert reasons == [("reassembly_evicted", "larger than its sender's share of the reassembly memory")]
    assert buffers.held_by("greedy") == 0 and buffers.held_by("other") > 260_000


@pytest.mark.parametrize("others", [500, 5000])
def test_work_per_fragment_is_flat_whatever_is_held(others: int) -> None:
    """The issue's stall: the memory full of other senders' partial packets, then 3,000 fragments under one
    name, each a new message. Every one costs a heap entry or so, not a scan of what is held; and the name
    that floods ends up evicting its own packets, not the others'."""
    memory = others * 2000
    buffers = Reassembler(max_message=memory // 2, memory=memory, timeout=1e9, per_sender=32)
    flood(buffers, others, 1, 1, 1000)
    held = len(buffers)
    assert buffers.evictions > 0 and held > others // 2  # full
    steps, evictions = buffers.heap_steps, buffers.evictions
    for message in range(3000):
        buffers.add(("one-name:10500", EPOCH, message), 0, 2, 2000, os.urandom(1000), SOURCE, 1.0)
    per_fragment = (buffers.heap_steps - steps) / 3000
    assert buffers.evictions - evictions >= 2990
    assert per_fragment <= 3, f"{per_fragment:.1f} heap entries looked at per fragment with {others} held"
    assert len(buffers) >= held  # the others' packets are all there
    assert buffers.held_by("one-name:10500") < 3 * memory / held  # its share: about what one other holds
