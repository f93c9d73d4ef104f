"""Large publications across real brokers: bulk transfers, signed, delivered intact at QoS 0/1/2; too large refused.

A line of three real Mosquitto brokers with their wrappers, keyed (a
generated federation key), with the default limits (max_datagram chosen:
65507 bytes, as every address is on loopback; max_publication_bytes 16 MiB, bulk_threshold 64 KiB).
`mosquitto_pub` publishes at one end, `mosquitto_sub` at the other end prints what arrives, byte for byte.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from federation.daemon.keys import generate_key
from federation.envelope.datagrams import MESSAGE_REASONS
from federation.tools.launch import LocalFederation, line

from broker_util import requires_mosquitto, wait_for
from federation_util import FAST_SETTINGS, Clients, next_first_address
from federation_util import clients_fixture as clients_fixture  # noqa: F401 - the `clients` fixture

pytestmark = requires_mosquitto

LIMIT = 16 * 1024 * 1024
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def keyed_line(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFederation]:
    workdir = tmp_path_factory.mktemp("large")
    key_file = workdir / "federation.key"
    key_file.write_text(generate_key() + "\n")
    key_file.chmod(0o600)
    names = ["n0", "n1", "n2"]
    federation = LocalFederation(names, line(names), workdir / "federation", FAST_SETTINGS,
                                 first_address=next_first_address(), key_file=key_file)
    try:
        federation.start()
        federation.wait_converged(timeout=20)
        yield federation
    finally:
        federation.stop()


@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("size", [200 * 1024, MIB, LIMIT], ids=["200KiB", "1MiB", "16MiB"])
def test_large_publications_cross_a_three_broker_line_intact(keyed_line: LocalFederation, clients: Clients,
                                                              size: int, qos: int) -> None:
    federation = keyed_line
    prefix = f"large/{uuid.uuid4().hex[:8]}"
    subscriber = clients.subscribe(federation, "n2", f"{prefix}/#", qos=2)
    federation.wait_mesh(subscriber.topic_filter)
    before = federation.status("n2")["envelope"]["counters"].get("packets_reassembled", 0)
    payload = os.urandom(size)
    clients.publish(federation, "n0", f"{prefix}/blob", payload, qos=qos)
    message = subscriber.wait_for_message(f"{prefix}/blob", payload, timeout=60)
    assert len(message.payload) == size and message.payload == payload
    envelope = federation.status("n2")["envelope"]
    assert envelope["counters"]["packets_reassembled"] >= before + 1
    assert envelope["mode"] == "mac" and envelope["partial_messages"] == 0
    relay = federation.status("n1")["envelope"]
    assert relay["max_datagram"] == 65507  # chosen on loopback
    wait_for(lambda: federation.status("n1")["envelope"]["transfers"].get("transfers_sent", 0) >= 1, 10,
             message=lambda: f"n1's transfer to n2 to end: {federation.status('n1')['envelope']['transfers']}")
    given_up = set(MESSAGE_REASONS)  # a packet or a transfer given up (not a first contact's refused datagram)
    assert not given_up & set(relay["drops"]) and not given_up & set(envelope["drops"]), (relay, envelope)
    assert subscriber.received() == [(f"{prefix}/blob", payload)]


def test_a_publication_above_the_limit_is_refused_counted_and_logged(keyed_line: LocalFederation,
                                                                     clients: Clients) -> None:
    federation = keyed_line
    prefix = f"toolarge/{uuid.uuid4().hex[:8]}"
    subscriber = clients.subscribe(federation, "n2", f"{prefix}/#", qos=1)
    local = clients.subscribe(federation, "n0", f"{prefix}/#", qos=1)
    federation.wait_mesh(subscriber.topic_filter)
    refused_before = federation.status("n0")["drops"].get("publication_too_large", 0)
    too_large = os.urandom(LIMIT + 1)
    clients.publish(federation, "n0", f"{prefix}/blob", too_large, qos=1)
    wait_for(lambda: federation.status("n0")["drops"].get("publication_too_large", 0) == refused_before + 1, 20,
             message=lambda: f"the refusal to be counted at n0: {federation.status('n0')['drops']}")
    # The broker's own subscribers still get it; the federation does not carry it, and says why.
    local.wait_for_message(f"{prefix}/blob", too_large, timeout=20)
    clients.publish(federation, "n0", f"{prefix}/after", b"small", qos=1)
    subscriber.wait_for_message(f"{prefix}/after", b"small")
    assert subscriber.received() == [(f"{prefix}/after", b"small")]
    log = federation.node("n0").wrapper_log.read_text()
    assert f"publication on '{prefix}/blob' refused: its payload of {LIMIT + 1} bytes" in log
    assert f"max_publication_bytes ({LIMIT})" in log
    wait_for(lambda: [e for e in federation.events("n0", ["publication_dropped"])
                      if e.get("topic") == f"{prefix}/blob" and e.get("reason") == "too_large"], 10,
             message="the publication_dropped event of the refusal")
