"""`Envelope.replace_keys`: a key rotation while the wrapper runs (its SIGHUP, federation/daemon/reload.py)."""

from __future__ import annotations

import pytest

from federation.envelope.config import EnvelopeConfig, EnvelopeConfigError
from federation.envelope.datagrams import Envelope
from federation.protocol.types import Address

A = Address("10.0.0.1", 10500)
B = Address("10.0.0.2", 10500)
OLD = bytes(range(32))
NEW = bytes(range(100, 132))
CIPHERS = ["none", "chacha20-poly1305"]


def delivered(sender: Envelope, receiver: Envelope, packet: bytes) -> list[bytes]:
    sender.set_peer_epoch(receiver.address, receiver.epoch)  # as their first exchange teaches it (receiver epochs)
    sender.send(packet, receiver.address)
    return [received for data, _ in sender.datagrams_to_send(0.0)
            for received in receiver.receive_datagram(data, sender.address, 0.0)]


@pytest.mark.parametrize("encryption", CIPHERS)
def test_the_new_first_key_signs_and_every_key_is_accepted(encryption: str) -> None:
    sender = Envelope(A, 1, EnvelopeConfig(keys=(OLD,), encryption=encryption))
    rotated = Envelope(B, 7, EnvelopeConfig(keys=(OLD,), encryption=encryption))
    laggard = Envelope(Address("10.0.0.3", 10500), 9, EnvelopeConfig(keys=(OLD,), encryption=encryption))
    assert delivered(sender, rotated, b"before") == [b"before"]
    rotated.replace_keys((OLD, NEW))  # step 1: accepts NEW, still signs with OLD
    assert delivered(rotated, laggard, b"step 1") == [b"step 1"]
    sender.replace_keys((NEW, OLD))  # step 2: signs with NEW
    assert sender.key_ids()[0] == rotated.key_ids()[1] and sender.config.keys == (NEW, OLD)
    assert delivered(sender, rotated, b"step 2") == [b"step 2"]
    assert delivered(sender, laggard, b"lost") == [] and laggard.drops == {"unknown_key": 1}
    assert delivered(laggard, sender, b"old still accepted") == [b"old still accepted"]
    sender.replace_keys((NEW,))  # step 3: OLD retired
    assert delivered(laggard, sender, b"refused") == [] and sender.drops == {"unknown_key": 1}


def test_what_cannot_be_used_keeps_the_keys_in_use() -> None:
    keyed = Envelope(A, 1, EnvelopeConfig(keys=(OLD,)))
    for keys, message in (((), "cannot become open"), ((NEW, NEW), "repeats"), ((b"short",), "16 to 64 bytes")):
        with pytest.raises(EnvelopeConfigError, match=message):
            keyed.replace_keys(keys)
        assert keyed.config.keys == (OLD,) and len(keyed.keys) == 1
    with pytest.raises(EnvelopeConfigError, match="started open"):
        Envelope(A, 1).replace_keys((NEW,))
