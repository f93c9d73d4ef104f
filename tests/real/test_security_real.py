"""Forged and replayed datagrams against running, keyed wrappers: nothing reaches the broker.

Real mosquitto brokers and real wrappers (`python wrapper.py --key-file`)
on loopback, a real `mosquitto_sub` that must receive nothing forged. The
test plays an attacker on the network: it captures the wrappers' datagrams
on the loopback interface (an AF_PACKET socket) and sends datagrams with the
source address of the neighbouring wrapper (a raw IP socket), so the
attacker's packets look, to the receiving wrapper, exactly like its
neighbour's except for what the envelope checks. Both need root; the tests
are skipped otherwise. A control test sends the same forgery to an *open*
(keyless) federation and sees it delivered: the attack is real, the key is
what stops it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from federation.daemon.keys import generate_key
from federation.envelope.config import EnvelopeConfig
from federation.envelope.datagrams import HEADER, MAX_EPOCH, Envelope
from federation.protocol import wire
from federation.protocol.types import Address, BrokerId
from federation.tools.launch import LocalFederation, line

from attack_util import Capture, spoof
from broker_util import requires_mosquitto, wait_for
from federation_util import FAST_SETTINGS, Clients, Subscriber, next_first_address
from federation_util import clients_fixture as clients_fixture  # noqa: F401 - the `clients` fixture

pytestmark = [
    requires_mosquitto,
    pytest.mark.skipif(os.geteuid() != 0, reason="raw and packet sockets (spoofing, capture) need root"),
]

WRAPPER_PORT = 10500


# ------------------------------------------------------------------ fixtures and helpers


def keyed_line(workdir: Path, key_file: Path | None, encryption: str | None = None) -> LocalFederation:
    workdir.mkdir(parents=True, exist_ok=True)
    federation = LocalFederation(2, line(["n0", "n1"]), workdir, FAST_SETTINGS, first_address=next_first_address(),
                                 key_file=key_file, encryption=encryption)
    try:
        federation.start()
        federation.wait_converged(timeout=20)
    except BaseException:
        federation.stop()
        raise
    return federation


@pytest.fixture(scope="module", params=["none", "chacha20-poly1305"])
def keyed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFederation]:
    """n0 - n1 with a federation key (MAC only, then MAC with encryption)."""
    workdir = tmp_path_factory.mktemp(f"keyed-{request.param}")
    key_file = workdir / "federation.key"
    key_file.write_text(generate_key() + "\n")
    key_file.chmod(0o600)
    federation = keyed_line(workdir / "federation", key_file, request.param)
    yield federation
    federation.stop()
    exits = {name: node.wrapper_exits for name, node in federation.nodes.items()}
    assert all(set(statuses) <= {0} for statuses in exits.values()), f"wrapper exit statuses: {exits}"


def address(federation: LocalFederation, name: str) -> Address:
    return Address(federation.node(name).host, WRAPPER_PORT)


def drops(federation: LocalFederation, name: str) -> dict[str, int]:
    return dict(federation.status(name).get("drops", {}))


def wait_drops(federation: LocalFederation, name: str, expected: dict[str, int]) -> None:
    wait_for(lambda: all(drops(federation, name).get(r, 0) >= n for r, n in expected.items()), 10,
             message=lambda: f"drops {expected} at {name}; it counts {drops(federation, name)}")


def forged_publications(federation: LocalFederation, topic: str, count: int) -> list[bytes]:
    """`tm` packets exactly as n0 would send them to n1, for publications n0 never made."""
    status = federation.status("n0")
    n0 = address(federation, "n0")
    sender = wire.Sender(BrokerId(int(str(status["broker_id"]).split("@")[0]), n0), int(status["epoch"]))
    return [wire.encode(wire.TOPIC_MESSAGE, sender,
                        wire.TopicMessage(topic.rsplit("/", 1)[0] + "/#", n0, sender.epoch, 10**9 + index,
                                          wire.MODE_IN_MESH, 0, topic, f"forged {index}".encode(), 0, False, None))
            for index in range(count)]


def seal(packets: list[bytes], sender: Address, to: Address, epoch: int, config: EnvelopeConfig,
         receiver_epoch: int = 0) -> list[bytes]:
    envelope = Envelope(sender, epoch, config)
    envelope.set_peer_epoch(to, receiver_epoch)
    for packet in packets:
        envelope.send(packet, to)
    return [data for data, _ in envelope.datagrams_to_send()]


def epoch_on_the_wire(federation: LocalFederation, name: str, neighbour: str) -> int:
    """The envelope epoch `name` announces in the header of its datagrams to `neighbour`, read off the wire."""
    capture = Capture(address(federation, name), address(federation, neighbour))
    try:
        wait_for(lambda: capture.datagrams, 10, message=f"a datagram from {name} to {neighbour}")
    finally:
        captured = capture.stop()
    return int(HEADER.unpack_from(captured[0])[4])


def subscribe_and_check_path(federation: LocalFederation, clients: Clients, prefix: str) -> Subscriber:
    subscriber = clients.subscribe(federation, "n1", f"{prefix}/#")
    federation.wait_mesh(subscriber.topic_filter)
    clients.publish(federation, "n0", f"{prefix}/legit", b"from n0's broker")
    subscriber.wait_for_message(f"{prefix}/legit", b"from n0's broker")
    return subscriber


def barrier(federation: LocalFederation, clients: Clients, subscriber: Subscriber, prefix: str) -> None:
    """A genuine publication after the attack: once it arrives, anything the attack let through has too."""
    clients.publish(federation, "n0", f"{prefix}/marker", b"after the attack")
    subscriber.wait_for_message(f"{prefix}/marker", b"after the attack")


# ------------------------------------------------------------------ the tests


def test_forged_datagrams_are_dropped_and_nothing_reaches_the_broker(keyed: LocalFederation,
                                                                     clients: Clients) -> None:
    federation = keyed
    prefix = f"sec/{uuid.uuid4().hex[:8]}"
    subscriber = subscribe_and_check_path(federation, clients, prefix)
    n0, n1 = address(federation, "n0"), address(federation, "n1")
    envelope = federation.status("n0")["envelope"]
    assert envelope["mode"] == ("aead" if envelope["encryption"] == "chacha20-poly1305" else "mac")
    before = drops(federation, "n1")
    packets = forged_publications(federation, f"{prefix}/forged", 3)
    future_epoch = MAX_EPOCH  # newer than n0's, so only the key can stop it
    wrong_key = bytes(range(1, 33))
    forged_tag = [bytearray(d) for d in seal(packets, n0, n1, future_epoch, EnvelopeConfig(keys=(wrong_key,)))]
    our_id = bytes.fromhex(envelope["key_ids"][0])
    for datagram in forged_tag:
        datagram[3:7] = our_id  # claims our key: the tag cannot match
    attacks = {
        "unauthenticated": seal(packets, n0, n1, future_epoch, EnvelopeConfig()),
        "unknown_key": seal(packets, n0, n1, future_epoch, EnvelopeConfig(keys=(wrong_key,))),
        "bad_mac": [bytes(d) for d in forged_tag],
        "not_envelope": packets,  # the bare protocol packets of a wrapper without the envelope
    }
    for datagrams in attacks.values():
        for datagram in datagrams:
            spoof(n0, n1, datagram)
    wait_drops(federation, "n1", {reason: before.get(reason, 0) + len(datagrams)
                                  for reason, datagrams in attacks.items()})
    barrier(federation, clients, subscriber, prefix)
    assert subscriber.received() == [(f"{prefix}/legit", b"from n0's broker"),
                                     (f"{prefix}/marker", b"after the attack")]
    assert all(n["up"] for n in federation.status("n1")["neighbours"]), "the attack cut n1 from n0"
    assert not [e for e in federation.events("n1", ["publication_delivered"]) if "forged" in str(e.get("topic"))]


def test_captured_datagrams_replayed_are_dropped_also_after_the_sender_restarts(keyed: LocalFederation,
                                                                               clients: Clients) -> None:
    federation = keyed
    prefix = f"replay/{uuid.uuid4().hex[:8]}"
    subscriber = subscribe_and_check_path(federation, clients, prefix)
    n0, n1 = address(federation, "n0"), address(federation, "n1")
    secret = b"captured on the wire " + os.urandom(16).hex().encode()
    capture = Capture(n0, n1)
    try:
        clients.publish(federation, "n0", f"{prefix}/captured", secret)
        subscriber.wait_for_message(f"{prefix}/captured", secret)
    finally:
        captured = capture.stop()
    assert captured, "nothing captured from n0 to n1"
    encrypted = federation.status("n0")["envelope"]["mode"] == "aead"
    carrying = [d for d in captured if secret in d]
    if encrypted:
        assert carrying == [], "with encryption the payload must not be readable on the wire"
    else:
        assert carrying, "the publication's datagram was not captured"
    counters_before = federation.status("n1")["counters"]
    before = drops(federation, "n1")
    for _ in range(3):
        for datagram in captured:
            spoof(n0, n1, datagram)
    wait_drops(federation, "n1", {"replayed": before.get("replayed", 0) + 3 * len(captured)})
    barrier(federation, clients, subscriber, prefix)
    assert subscriber.count(f"{prefix}/captured", secret) == 1
    # The envelope refused them: the node's duplicate suppression never even saw them.
    assert federation.status("n1")["counters"].get("duplicates_dropped", 0) == counters_before.get(
        "duplicates_dropped", 0)

    # After n0 restarts (a new epoch), the old datagrams are refused as from an older life.
    federation.stop_wrapper("n0")
    federation.start_wrapper("n0")
    federation.wait_converged(timeout=20)
    federation.wait_mesh(subscriber.topic_filter)
    before = drops(federation, "n1")
    for datagram in captured:
        spoof(n0, n1, datagram)
    wait_drops(federation, "n1", {"stale_epoch": before.get("stale_epoch", 0) + len(captured)})
    clients.publish(federation, "n0", f"{prefix}/after-restart", b"new life")
    subscriber.wait_for_message(f"{prefix}/after-restart", b"new life")
    assert subscriber.count(f"{prefix}/captured", secret) == 1


def test_a_capture_replayed_after_the_receiver_restarts_is_refused(keyed: LocalFederation, clients: Clients) -> None:
    """The issue's attack: capture what n0 sends n1 while publications cross, restart n1 (its replay windows
    start empty), replay the capture from n0's address. Every datagram names n1's old epoch: refused (and the
    QoS 0 publications among them could only have been stopped there)."""
    federation = keyed
    prefix = f"restart/{uuid.uuid4().hex[:8]}"
    subscriber = subscribe_and_check_path(federation, clients, prefix)
    n0, n1 = address(federation, "n0"), address(federation, "n1")
    capture = Capture(n0, n1)
    try:
        for index in range(20):  # QoS 0 and 1: a QoS 1 copy, accepted, might still be stopped by the journal
            clients.publish(federation, "n0", f"{prefix}/captured/{index}", f"once {index}".encode(), qos=index % 2)
        for index in range(20):
            subscriber.wait_for_message(f"{prefix}/captured/{index}", f"once {index}".encode())
    finally:
        captured = capture.stop()
    assert captured, "nothing captured from n0 to n1"
    if federation.status("n0")["envelope"]["mode"] == "mac":  # readable: the capture holds every publication
        assert all(any(f"once {index}".encode() in datagram for datagram in captured) for index in range(20))
    before = drops(federation, "n1")
    for datagram in captured:  # to the same life: the replay windows
        spoof(n0, n1, datagram)
    wait_drops(federation, "n1", {"replayed": before.get("replayed", 0) + len(captured)})

    old_epoch = federation.status("n1")["envelope"]["epoch"]
    federation.stop_wrapper("n1")
    federation.start_wrapper("n1")
    federation.wait_converged(timeout=20)
    federation.wait_mesh(subscriber.topic_filter)
    status = federation.status("n1")
    assert status["envelope"]["epoch"] > old_epoch
    refusals = ("receiver_epoch", "too_old", "replayed", "stale_epoch")
    before = drops(federation, "n1")
    for datagram in captured:
        spoof(n0, n1, datagram)

    def refused() -> int:
        now = drops(federation, "n1")
        return sum(now.get(reason, 0) - before.get(reason, 0) for reason in refusals)

    wait_for(lambda: refused() >= len(captured), 10,
             message=lambda: f"{len(captured)} refusals at n1; it counts {drops(federation, 'n1')}")
    assert drops(federation, "n1").get("receiver_epoch", 0) - before.get("receiver_epoch", 0) > 0
    barrier(federation, clients, subscriber, prefix)
    for index in range(20):
        assert subscriber.count(f"{prefix}/captured/{index}", f"once {index}".encode()) == 1
    assert federation.status("n1")["counters"].get("duplicates_dropped", 0) == status["counters"].get(
        "duplicates_dropped", 0), "the node saw replayed packets: the envelope let them through"


def test_the_same_forgery_gets_through_an_open_overlay(tmp_path: Path, clients: Clients) -> None:
    """The control experiment: without a key, a spoofed datagram publishes into the remote broker."""
    federation = keyed_line(tmp_path / "open", key_file=None)
    try:
        log = federation.node("n1").wrapper_log.read_text()
        assert "NO FEDERATION KEY" in log and "OPEN" in log, "the open overlay must be announced loudly"
        prefix = f"open/{uuid.uuid4().hex[:8]}"
        subscriber = subscribe_and_check_path(federation, clients, prefix)
        n0, n1 = address(federation, "n0"), address(federation, "n1")
        packets = forged_publications(federation, f"{prefix}/forged", 1)
        n1_epoch = epoch_on_the_wire(federation, "n1", "n0")  # the receiver epoch to stamp: in any of its datagrams
        for datagram in seal(packets, n0, n1, MAX_EPOCH, EnvelopeConfig(), receiver_epoch=n1_epoch):
            spoof(n0, n1, datagram)
        subscriber.wait_for_message(f"{prefix}/forged", b"forged 0")
    finally:
        federation.stop()


def test_a_keyed_wrapper_says_how_it_is_protected(keyed: LocalFederation) -> None:
    status: dict[str, Any] = keyed.status("n1")["envelope"]
    log = keyed.node("n1").wrapper_log.read_text()
    assert "NO FEDERATION KEY" not in log
    assert f"ids {status['key_ids'][0]}" in log and "overlay authenticated" in log
    assert "can be read or written by other users" not in log  # the fixture's key file is mode 600
