"""Fuzzing a live wrapper: mutated real datagrams, boundary values, replays and floods, keyed and open.

Real Mosquitto brokers and wrappers n0 - n1 on loopback; the victim is n1. The corpus is what n0 really
sent n1 (captured on `lo` while subscriptions, QoS 0 and 1 publications both ways and the anti-entropy
exchange ran) plus one packet of every type built with n0's identity; tests/live_fuzz.py mutates them as
an outsider and as a key holder (with the key; in open mode anyone is one). Most datagrams claim n0's
source address (a raw socket), the rest a stranger's.

Throughout: n1's status answers within 2 s (every 0.2 s), neither wrapper sees the other down (3 s
without a hello back, the default bound), and every 2,000 datagrams a QoS 1 publication from n1's broker
reaches a subscriber on n0's broker. After: n1 holds no more than RSS_BOUND more memory than before, is
back to idle (under half a CPU) within 5 s, and neither wrapper logged a traceback.

The datagrams are sent as fast as n1 reads them (the next 200 once it has read all but 200 of what was
sent). `make test` sends LIVE_FUZZ_DATAGRAMS (default 12,000) per mode; `pytest -m fuzz_long
tests/real/test_fuzz_real.py -s` sends a million per mode. Mutations that break a wrapper today are left
out of the run (tests/live_fuzz.py `known_fatal`); none is today. The zombie record the fuzz found
(a record naming a wrapper with epoch 2^64-1) and the adoption of a huge epoch are checked one by one at
the end (issue 22 part B: docs/protocol.md "Ranges").
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from federation.envelope.datagrams import ITEM_PACKET, PACKET_ITEM
from federation.protocol import wire
from federation.protocol.types import Address, BrokerId
from federation.tools.launch import LocalFederation

from attack_util import Capture, KeyHolder, Spoofer, Watch, neighbour_downs, victim_pair, wrapper_address, wrapper_probe
from broker_util import requires_mosquitto, wait_for
from federation_util import Clients
from federation_util import clients_fixture as clients_fixture  # noqa: F401 - the `clients` fixture
from live_fuzz import U64, LiveFuzzer, items_of, seed_packets

pytestmark = [
    requires_mosquitto,
    pytest.mark.skipif(os.geteuid() != 0, reason="capture and spoofing need packet and raw sockets (root)"),
]

DEFAULT_COUNT = int(os.environ.get("LIVE_FUZZ_DATAGRAMS", "12000"))
DEFAULT_SEED = int(os.environ.get("LIVE_FUZZ_SEED", "1"))
LONG_COUNT = 1_000_000
MiB = 1024 * 1024
RSS_BOUND = 32 * MiB
"""resident memory the victim may grow under the fuzz beside its bulk transfers: its reassembly cap (8 MiB),
the other tables the mutated packets fill (topics, records, caches up to their bounds) and allocator slack. Bulk
transfers (payloads above 64 KiB) may hold up to their own cap more (`transfer_memory`, 64 MiB by default): a
mutated transfer fragment claiming a 16 MiB payload is given its buffer, charged in full against that cap"""
BURST = 200


@pytest.fixture(params=["mac", "open"])
def federation(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalFederation]:
    with victim_pair(tmp_path, keyed=request.param == "mac") as started:
        yield started


def identity(federation: LocalFederation, name: str) -> wire.Sender:
    status = federation.status(name)
    vid, _ = str(status["broker_id"]).split("@")
    return wire.Sender(BrokerId(int(vid), wrapper_address(federation, name)), int(status["epoch"]))


def captured_corpus(federation: LocalFederation, clients: Clients) -> list[bytes]:
    """What n0 sends n1 while subscriptions, publications (QoS 0 and 1, both ways, one of 100 KB) and the
    anti-entropy exchange run."""
    prefix = f"corpus/{uuid.uuid4().hex[:8]}"
    capture = Capture(wrapper_address(federation, "n0"), wrapper_address(federation, "n1"))
    try:
        on_n1 = clients.subscribe(federation, "n1", f"{prefix}/#")
        on_n0 = clients.subscribe(federation, "n0", f"{prefix}/+/x")
        federation.wait_mesh(on_n1.topic_filter)
        federation.wait_mesh(on_n0.topic_filter)
        for qos in (0, 1):
            clients.publish(federation, "n0", f"{prefix}/q{qos}", b"to n1", qos=qos)
            clients.publish(federation, "n1", f"{prefix}/q{qos}/x", b"to n0", qos=qos)
        clients.publish(federation, "n0", f"{prefix}/big", os.urandom(100_000), qos=1)
        on_n1.wait_for_count(3)
        on_n0.wait_for_count(2)

        def kinds() -> set[str]:
            return {wire.packet_type(p) or "?" for d in capture.datagrams for p in items_of(d) or []}

        wait_for(lambda: {wire.HELLO, wire.HELLO_BACK, wire.DATABASE_DIGEST, wire.TOPIC_MESSAGE} <= kinds(), 15,
                 message=lambda: f"the corpus to hold hellos, digests and publications; it has {sorted(kinds())}")
    finally:
        captured = capture.stop()
    return captured


def run_fuzz(federation: LocalFederation, clients: Clients, count: int, seed: int) -> str:
    """Fuzz n1 with `count` datagrams and check its liveness throughout; returns a summary line."""
    rng = random.Random(seed)
    captured = captured_corpus(federation, clients)
    n0, victim = wrapper_address(federation, "n0"), wrapper_address(federation, "n1")
    stranger = Address(federation.node("n0").host.rsplit(".", 1)[0] + ".77", 10500)
    status = federation.status("n1")
    keyed = status["envelope"]["mode"] != "open"
    holder = KeyHolder(Address("fuzzer.example", 10500), federation.key_file, victim, int(status["envelope"]["epoch"]))
    victim_id = identity(federation, "n1")
    fuzzer = LiveFuzzer(rng, captured, seed_packets(identity(federation, "n0"), victim_id.broker_id,
                                                    victim_id.epoch),
                        keyed, holder.seal_body, lambda packet: None)
    prefix = f"fuzz/{uuid.uuid4().hex[:8]}"
    subscriber = clients.subscribe(federation, "n0", f"{prefix}/#")
    federation.wait_mesh(subscriber.topic_filter)
    probe = wrapper_probe(federation, "n1")
    baseline = probe.rss()

    def read() -> int:
        envelope = federation.status("n1")["envelope"]["counters"]
        return int(envelope.get("datagrams_received", 0))

    def wait_read(goal: int) -> None:
        """until n1 has read (or the kernel dropped) `goal` datagrams in all"""
        wait_for(lambda: read() + kernel_drops(federation) >= goal, 30, interval=0.01,
                 message=lambda: f"n1 to read {goal - first} datagrams")

    started = time.monotonic()
    first = read()
    sent = crossed = 0
    with Watch(federation, "n1") as watch, Spoofer() as spoofer:
        while sent < count:
            for _ in range(BURST):
                _, datagram = fuzzer.next()
                spoofer.send(n0 if rng.random() < 0.9 else stranger, victim, datagram)
            sent += BURST
            wait_read(first + sent - BURST)
            if sent // 2000 > crossed:
                crossed = sent // 2000
                clients.publish(federation, "n1", f"{prefix}/{crossed}", b"crossing", qos=1)
                try:
                    subscriber.wait_for_message(f"{prefix}/{crossed}", b"crossing", timeout=15)
                except AssertionError as error:
                    raise AssertionError(f"{error}\nafter {sent} datagrams: {fuzzer.counts}\n"
                                         f"{path_report(federation, subscriber.topic_filter)}") from None
        elapsed = time.monotonic() - started
        peak = max(watch.peak_rss, probe.rss())
    ended = time.monotonic()
    idle = probe.cpu_share(lambda: time.monotonic() < ended + 5, ended + 5)
    status = federation.status("n1")
    summary = (f"{status['envelope']['mode']}: {sent} datagrams in {elapsed:.0f} s ({sent / elapsed:,.0f}/s), "
               f"families {dict(sorted(fuzzer.counts.items()))}, left out {dict(fuzzer.left_out)}; "
               f"accepted {status['envelope']['counters'].get('datagrams_accepted', 0)}; envelope drops "
               f"{dict(sorted(status['envelope']['drops'].items()))}; node drops "
               f"{dict(sorted((k, v) for k, v in status['drops'].items() if k not in status['envelope']['drops']))}; "
               f"RSS {baseline / MiB:.1f} -> peak {peak / MiB:.1f} MiB; CPU after {idle:.0%}; status latency max "
               f"{max(watch.latencies, default=0) * 1000:.0f} ms; publications crossed {crossed}")
    assert watch.problems() == [], f"{summary}\n{watch.problems()}"
    assert neighbour_downs(federation, "n1") == []
    transfer_cap = (status["envelope"].get("transfers") or {}).get("receive_memory", 0)
    assert peak - baseline <= RSS_BOUND + transfer_cap, summary
    assert idle < 0.5, summary
    for name in ("n0", "n1"):
        assert "Traceback" not in federation.node(name).wrapper_log.read_text(), f"{name} logged a traceback"
    clients.publish(federation, "n1", f"{prefix}/after", b"still federating", qos=1)
    try:
        subscriber.wait_for_message(f"{prefix}/after", b"still federating")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{summary}\n{path_report(federation, subscriber.topic_filter)}") from None
    return summary


def path_report(federation: LocalFederation, topic_filter: str) -> str:
    """What each wrapper knows of the path of `topic_filter` (for a publication that did not cross)."""
    lines = []
    for name in ("n1", "n0"):
        status = federation.status(name)
        topics = [t for t in status.get("topics", []) if t.get("filter") == topic_filter]
        changes = [e for e in federation.events(name, ["table_changed", "id_changed", "epoch_changed",
                                                       "management_core_changed", "topic_core_changed"])][-8:]
        lines.append(f"{name}: id {status['broker_id']} epoch {status['epoch']}; neighbours {status['neighbours']}; "
                     f"federation {status['federation']}; management core {status['management_core']}; "
                     f"topic {topics}; pacing {status['pacing']}; reliable {status['reliable']}; "
                     f"drops {status['drops']}; last changes {changes}")
    return "\n".join(lines)


def kernel_drops(federation: LocalFederation) -> int:
    return int(federation.status("n1")["daemon"]["overload"].get("kernel_receive_drops") or 0)


def test_a_live_wrapper_survives_mutated_datagrams(federation: LocalFederation, clients: Clients) -> None:
    print("\n" + run_fuzz(federation, clients, DEFAULT_COUNT, seed=DEFAULT_SEED))


@pytest.mark.fuzz_long
def test_a_live_wrapper_survives_a_million_mutated_datagrams(federation: LocalFederation, clients: Clients) -> None:
    print("\n" + run_fuzz(federation, clients, LONG_COUNT, seed=2))


# ------------------------------------------------------------------ numbers at the edge of their ranges (issue 22)


def send_as_neighbour(federation: LocalFederation, packets: list[bytes]) -> None:
    """`packets` sealed by a key holder (anyone, open) under its own name, from n0's address, to n1."""
    n0, victim = wrapper_address(federation, "n0"), wrapper_address(federation, "n1")
    holder = KeyHolder(Address("fuzzer.example", 10500), federation.key_file, victim,
                       int(federation.status("n1")["envelope"]["epoch"]))
    with Spoofer() as spoofer:
        for packet in packets:
            spoofer.send(n0, victim, holder.seal_body(PACKET_ITEM.pack(ITEM_PACKET, len(packet)) + packet))


@pytest.mark.parametrize("field", ["epoch", "seq"])
def test_one_record_with_a_maximal_number_about_the_victim_leaves_it_working(
        federation: LocalFederation, clients: Clients, field: str) -> None:
    """The issue's zombie: a record naming the victim's own address with epoch 2^64-1 (or seq 2^64-1) made it
    jump to epoch 2^64 (or number its next record 2^64): every encode after raised OverflowError in msgpack,
    the wrapper sent nothing and its subscribers received nothing. Now the record is out of range: dropped at
    decode (`out_of_range`), the victim's epoch unchanged, and it keeps delivering."""
    prefix = f"zombie/{uuid.uuid4().hex[:8]}"
    subscriber = clients.subscribe(federation, "n0", f"{prefix}/#")
    federation.wait_mesh(subscriber.topic_filter)
    victim = identity(federation, "n1")
    record = wire.LinkStateRecord(victim.broker_id, U64 if field == "epoch" else victim.epoch,
                                  U64 if field == "seq" else 1, 0, 0, (wrapper_address(federation, "n0"),))
    send_as_neighbour(federation, [wire.encode(wire.FEDERATE, identity(federation, "n0"), wire.Federate(record))])
    wait_for(lambda: federation.status("n1")["drops"].get("out_of_range", 0) > 0, 10,
             message="n1 to drop the record as out_of_range")
    clients.publish(federation, "n1", f"{prefix}/after", b"still federating", qos=1)
    subscriber.wait_for_message(f"{prefix}/after", b"still federating", timeout=15)
    assert "Traceback" not in federation.node("n1").wrapper_log.read_text(), "n1 logged a traceback"
    assert federation.status("n1")["epoch"] == victim.epoch
    assert neighbour_downs(federation, "n1") == [] and neighbour_downs(federation, "n0") == []


@pytest.mark.parametrize("federation", ["mac"], indirect=True)
def test_an_adopted_huge_epoch_cannot_reopen_replay_across_restarts(federation: LocalFederation,
                                                                    clients: Clients) -> None:
    """Before the ranges, a record naming the victim with epoch 2^50 was adopted (2^50 + 1, saved); at the next
    starts envelope_epoch(boot epoch × 10^6) saturated at 2^64-1, the receiver epoch stopped changing between
    restarts and a capture of one life was accepted by the next. Now the highest epoch a record can push the
    victim to is the jump limit, whose envelope epoch still grows at every restart."""
    victim = identity(federation, "n1")
    record = wire.LinkStateRecord(victim.broker_id, wire.MAX_JUMP_EPOCH - 1, 1, 0, 0,
                                  (wrapper_address(federation, "n0"),))
    send_as_neighbour(federation, [wire.encode(wire.FEDERATE, identity(federation, "n0"), wire.Federate(record))])
    wait_for(lambda: federation.status("n1")["epoch"] == wire.MAX_JUMP_EPOCH, 10, message="n1 to jump past it")
    envelope_epochs = [int(federation.status("n1")["envelope"]["epoch"])]
    for _ in range(2):  # the first start after it saturated; a capture of that life, replayed after the next
        federation.stop_wrapper("n1")
        federation.start_wrapper("n1")
        federation.wait_converged(timeout=20)
        envelope_epochs.append(int(federation.status("n1")["envelope"]["epoch"]))
    assert envelope_epochs == sorted(set(envelope_epochs)), f"envelope epochs {envelope_epochs} must grow"
    prefix = f"saturated/{uuid.uuid4().hex[:8]}"
    subscriber = clients.subscribe(federation, "n1", f"{prefix}/#")
    federation.wait_mesh(subscriber.topic_filter)
    capture = Capture(wrapper_address(federation, "n0"), wrapper_address(federation, "n1"))
    try:
        # QoS 0: of a QoS 1/2 copy, the journal of the copies the broker completed would stop a second one
        clients.publish(federation, "n0", f"{prefix}/once", b"once", qos=0)
        subscriber.wait_for_message(f"{prefix}/once", b"once")
    finally:
        captured = capture.stop()
    federation.stop_wrapper("n1")
    federation.start_wrapper("n1")
    federation.wait_converged(timeout=20)
    federation.wait_mesh(subscriber.topic_filter)
    with Spoofer() as spoofer:
        for datagram in captured:
            spoofer.send(wrapper_address(federation, "n0"), wrapper_address(federation, "n1"), datagram)
    clients.publish(federation, "n0", f"{prefix}/marker", b"marker", qos=1)
    subscriber.wait_for_message(f"{prefix}/marker", b"marker")
    assert subscriber.count(f"{prefix}/once", b"once") == 1
