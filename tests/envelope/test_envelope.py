"""The datagram envelope in memory: batching, fragmentation, authentication, replay windows, key rotation.

Envelopes are wired together by hand (`transfer`), time is passed in, and
the last test runs two real protocol nodes through them, so a publication
of 200 KiB crosses as about 150 signed datagrams and is injected whole.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

import pytest

from federation.daemon.config import ConfigError, load_config
from federation.daemon.keys import KeyFileError, generate_key, parse_keys, permission_warning, read_key_file
from federation.envelope.config import EnvelopeConfig, EnvelopeConfigError
from federation.envelope.datagrams import DATAGRAM_REASONS, EVENT_BURST, HEADER, MAX_EPOCH, Envelope, envelope_epoch
from federation.envelope.reassembly import MESSAGE_OVERHEAD, Reassembler
from federation.envelope.replay import ReplayWindow
from federation.protocol import wire
from federation.protocol.node import Node
from federation.protocol.settings import Settings
from federation.protocol.types import Address

A = Address("10.0.0.1", 10500)
B = Address("10.0.0.2", 10500)
KEY = bytes(range(32))
OTHER_KEY = bytes(range(100, 132))
MODES = {"open": EnvelopeConfig(), "mac": EnvelopeConfig(keys=(KEY,)),
         "aead": EnvelopeConfig(keys=(KEY,), encryption="chacha20-poly1305")}


def pair(mode: str, epoch: int = 1, **limits: int | float) -> tuple[Envelope, Envelope]:
    """A sender at A and a receiver at B that know each other's epochs (as after their first exchange)."""
    config = MODES[mode]
    if limits:
        config = EnvelopeConfig(**{**config.__dict__, **limits})
    return introduced(Envelope(A, epoch, config), Envelope(B, 7, config))


def introduced(first: Envelope, second: Envelope) -> tuple[Envelope, Envelope]:
    """Tell each envelope the other's epoch, as the header of one datagram each way would."""
    first.set_peer_epoch(second.address, second.epoch)
    second.set_peer_epoch(first.address, first.epoch)
    return first, second


def transfer(sender: Envelope, receiver: Envelope, now: float = 0.0,
             datagrams: list[bytes] | None = None) -> list[bytes]:
    """Move every queued datagram of `sender` to `receiver`; the packets it hands to its node."""
    if datagrams is None:
        datagrams = [data for data, _ in sender.datagrams_to_send(now)]
    packets: list[bytes] = []
    for data in datagrams:
        packets += receiver.receive_datagram(data, sender.address, now)
    return packets


def sealed(sender: Envelope, packets: list[bytes], to: Address = B) -> list[bytes]:
    for packet in packets:
        sender.send(packet, to)
    return [data for data, _ in sender.datagrams_to_send(0.0)]


# ------------------------------------------------------------------ framing


@pytest.mark.parametrize("mode", sorted(MODES))
def test_small_packets_are_batched_and_arrive_in_order(mode: str) -> None:
    sender, receiver = pair(mode)
    packets = [os.urandom(random.Random(i).randint(1, 120)) for i in range(40)]
    datagrams = sealed(sender, packets)
    assert len(datagrams) < 6, f"40 small packets took {len(datagrams)} datagrams"
    assert all(len(data) <= 1400 for data in datagrams)
    assert sender.counters["datagrams_batched"] == len(datagrams)
    assert transfer(sender, receiver, datagrams=datagrams) == packets
    assert receiver.drops == {}
    assert receiver.counters["datagrams_accepted"] == len(datagrams)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_large_packet_is_fragmented_and_reassembled_even_out_of_order(mode: str) -> None:
    sender, receiver = pair(mode)
    big = os.urandom(256 * 1024)
    small = [b"before", b"after"]
    datagrams = sealed(sender, [small[0], big, small[1]])
    assert all(len(data) <= 1400 for data in datagrams)
    assert len(datagrams) > 190
    shuffled = datagrams[:]
    random.Random(3).shuffle(shuffled)
    got = transfer(sender, receiver, datagrams=shuffled)
    assert sorted(got) == sorted([small[0], big, small[1]])
    assert receiver.counters["packets_reassembled"] == 1
    assert receiver.reassembler.used == 0 and len(receiver.reassembler) == 0


def test_fragments_obey_a_smaller_max_datagram() -> None:
    sender, receiver = pair("mac", max_datagram=576)
    packet = os.urandom(20000)
    datagrams = sealed(sender, [packet])
    assert max(len(data) for data in datagrams) <= 576
    assert transfer(sender, receiver, datagrams=datagrams) == [packet]


def test_a_packet_above_max_packet_is_refused_never_truncated() -> None:
    sender, receiver = pair("mac", max_packet=100_000, reassembly_memory=400_000)
    sender.send(os.urandom(100_001), B)
    sender.send(b"next", B)
    assert transfer(sender, receiver) == [b"next"]
    assert sender.drops == {"too_large_to_send": 1}
    assert [e.fields["reason"] for e in sender.events_emitted()] == ["too_large_to_send"]


def test_a_lost_fragment_times_out_and_frees_its_memory() -> None:
    sender, receiver = pair("mac", reassembly_timeout=2.0)
    datagrams = sealed(sender, [os.urandom(50_000)])
    transfer(sender, receiver, now=10.0, datagrams=datagrams[:-1])
    assert receiver.reassembler.used > 49_000
    assert receiver.get_timer() == pytest.approx(12.0)
    receiver.handle_timer(11.9)
    assert receiver.drops == {}
    receiver.handle_timer(12.0)
    assert receiver.drops == {"reassembly_timeout": 1}
    assert receiver.reassembler.used == 0 and receiver.get_timer() is None
    assert transfer(sender, receiver, now=12.1, datagrams=datagrams[-1:]) == []  # a lone last fragment waits
    assert len(receiver.reassembler) == 1


def test_reassembly_memory_is_capped_by_evicting_the_oldest_partial_message() -> None:
    memory = 700_000
    sender, receiver = pair("mac", max_packet=300_000, reassembly_memory=memory)
    for round_ in range(12):  # twelve 200 KB packets, each missing its last fragment
        datagrams = sealed(sender, [os.urandom(200_000)])
        transfer(sender, receiver, now=float(round_) * 0.01, datagrams=datagrams[:-1])
        assert receiver.reassembler.used <= memory
    assert receiver.drops["reassembly_evicted"] >= 9
    assert len(receiver.reassembler) <= 3
    # A complete packet still gets through after the flood.
    whole = os.urandom(200_000)
    assert transfer(sender, receiver, now=1.0, datagrams=sealed(sender, [whole])) == [whole]


def test_the_reassembler_refuses_contradictions_ignores_duplicates_and_caps_each_sender() -> None:
    buffers = Reassembler(max_message=1000, memory=10_000, timeout=5.0, per_sender=2)
    assert buffers.add(("s", 1, 1), 0, 2, 6, b"abc", A, 0.0) == (None, [])
    assert buffers.add(("s", 1, 1), 0, 2, 6, b"abc", A, 0.0) == (None, [])  # a duplicate: ignored
    assert buffers.add(("s", 1, 1), 1, 2, 6, b"def", A, 0.0) == (b"abcdef", [])
    _, dropped = buffers.add(("s", 1, 2), 0, 2, 6, b"abc", A, 0.0)
    _, dropped = buffers.add(("s", 1, 2), 1, 3, 6, b"def", A, 0.0)  # another count than its first fragment
    assert [d.reason for d in dropped] == ["fragment_invalid"] and len(buffers) == 0
    for bad in ((0, 1, 6, b"abc"), (2, 2, 6, b"abc"), (0, 2, 1001, b"abc"), (0, 2, 2, b"abc"), (0, 2, 6, b"")):
        _, dropped = buffers.add(("s", 1, 3), *bad, A, 0.0)
        assert [d.reason for d in dropped] == ["fragment_invalid"], bad
    for message in range(3):  # a third partial message of one sender evicts its first
        _, dropped = buffers.add(("t", 1, message), 0, 2, 6, b"abc", A, 0.0)
    assert [d.reason for d in dropped] == ["reassembly_evicted"] and len(buffers) == 2
    _, dropped = buffers.add(("s", 1, 9), 1, 2, 4, b"abcd", A, 0.0)  # more bytes than declared in all
    _, dropped = buffers.add(("s", 1, 9), 0, 2, 4, b"x", A, 0.0)
    assert [d.reason for d in dropped] == ["fragment_invalid"]
    assert buffers.senders() == 1 and buffers.used == buffers.held_by("t") > 2 * (3 + MESSAGE_OVERHEAD)
    with pytest.raises(ValueError, match="two messages"):
        Reassembler(max_message=1000, memory=1500, timeout=1.0)


# ------------------------------------------------------------------ authentication


def test_every_single_byte_change_of_a_signed_datagram_is_refused() -> None:
    sender, receiver = pair("mac")
    (datagram,) = sealed(sender, [b"hello", b"world"])
    reasons = set()
    for position in range(len(datagram)):
        forged = bytearray(datagram)
        forged[position] ^= 0x01
        assert receiver.receive_datagram(bytes(forged), A, 0.0) == []
        reasons |= set(receiver.drops)
    assert receiver.counters["datagrams_accepted"] == 0
    assert reasons <= set(DATAGRAM_REASONS)
    assert receiver.drops["bad_mac"] >= len(datagram) - HEADER.size
    assert transfer(sender, receiver, datagrams=[datagram]) == [b"hello", b"world"]  # the original still passes


def test_aead_hides_the_payload_and_refuses_tampering() -> None:
    secret = b"the secret payload of a publication"
    mac_sender, _ = pair("mac")
    aead_sender, receiver = pair("aead")
    assert secret in sealed(mac_sender, [secret])[0]  # mac: authenticated, readable
    (datagram,) = sealed(aead_sender, [secret])
    assert secret not in datagram
    forged = bytearray(datagram)
    forged[-20] ^= 0x80
    assert receiver.receive_datagram(bytes(forged), A, 0.0) == []
    assert receiver.drops == {"bad_mac": 1}
    assert receiver.receive_datagram(datagram, A, 0.0) == [secret]


def test_a_keyed_wrapper_accepts_both_keyed_kinds_so_encryption_can_be_turned_on_one_by_one() -> None:
    receiver = Envelope(B, 1, MODES["mac"])
    for number, mode in enumerate(("mac", "aead")):
        sender, _ = introduced(Envelope(Address(f"10.0.0.{9 + number}", 10500), 1, MODES[mode]), receiver)
        assert transfer(sender, receiver, datagrams=sealed(sender, [mode.encode()])) == [mode.encode()]


def test_open_and_keyed_wrappers_refuse_each_other() -> None:
    open_sender, open_receiver = pair("open")
    keyed_sender, keyed_receiver = pair("mac")
    assert keyed_receiver.receive_datagram(sealed(open_sender, [b"x"])[0], A, 0.0) == []
    assert keyed_receiver.drops == {"unauthenticated": 1}
    assert open_receiver.receive_datagram(sealed(keyed_sender, [b"x"])[0], A, 0.0) == []
    assert open_receiver.drops == {"no_key": 1}
    bare = wire.encode(wire.HELLO, wire.Sender(wire.BrokerId(1, A), 1), wire.Hello(1, 0.0))
    assert keyed_receiver.receive_datagram(bare, A, 0.0) == []
    assert keyed_receiver.drops["not_envelope"] == 1


def test_a_wrong_key_is_an_unknown_key_and_a_forged_tag_is_a_bad_mac() -> None:
    stranger = Envelope(A, 1, EnvelopeConfig(keys=(OTHER_KEY,)))
    _, receiver = pair("mac")
    receiver.receive_datagram(sealed(stranger, [b"x"])[0], A, 0.0)
    assert receiver.drops == {"unknown_key": 1}
    sender, _ = pair("mac")
    datagram = bytearray(sealed(sender, [b"x"])[0])
    datagram[-16:] = os.urandom(16)
    receiver.receive_datagram(bytes(datagram), A, 0.0)
    assert receiver.drops == {"unknown_key": 1, "bad_mac": 1}


def test_key_rotation_without_downtime() -> None:
    """New key added second everywhere, then first everywhere, then the old one removed."""
    old, new = KEY, OTHER_KEY
    stages = [(old,), (old, new), (new, old), (new,)]
    # At every step of the rotation, a wrapper one stage ahead and one a stage behind understand each other.
    for ahead, behind in zip(stages[1:], stages[:-1], strict=True):
        first, second = introduced(Envelope(A, 1, EnvelopeConfig(keys=ahead)),
                                   Envelope(B, 2, EnvelopeConfig(keys=behind)))
        assert transfer(first, second, datagrams=sealed(first, [b"1"])) == [b"1"], (ahead, behind)
        assert transfer(second, first, datagrams=sealed(second, [b"2"], to=A)) == [b"2"], (ahead, behind)
    # Skipping a stage breaks: a wrapper that signs with the new key is not understood by one that lacks it.
    signer, laggard = introduced(Envelope(A, 1, EnvelopeConfig(keys=(new, old))),
                                 Envelope(B, 2, EnvelopeConfig(keys=(old,))))
    assert transfer(signer, laggard, datagrams=sealed(signer, [b"3"])) == []
    assert laggard.drops == {"unknown_key": 1}


def test_bad_configurations_are_refused_with_the_fix() -> None:
    with pytest.raises(EnvelopeConfigError, match="needs a federation key"):
        Envelope(A, 1, EnvelopeConfig(encryption="chacha20-poly1305"))
    with pytest.raises(EnvelopeConfigError, match="16 to 64 bytes"):
        Envelope(A, 1, EnvelopeConfig(keys=(b"short",)))
    with pytest.raises(EnvelopeConfigError, match="repeats"):
        Envelope(A, 1, EnvelopeConfig(keys=(KEY, KEY)))
    with pytest.raises(EnvelopeConfigError, match="encryption"):
        Envelope(A, 1, EnvelopeConfig(keys=(KEY,), encryption="rot13"))


# ------------------------------------------------------------------ replay protection


@pytest.mark.parametrize("mode", ["mac", "aead"])
def test_a_replayed_datagram_is_refused(mode: str) -> None:
    sender, receiver = pair(mode)
    datagrams = sealed(sender, [b"first"]) + sealed(sender, [b"second"])
    assert transfer(sender, receiver, datagrams=datagrams) == [b"first", b"second"]
    assert transfer(sender, receiver, datagrams=datagrams) == []
    assert receiver.drops == {"replayed": 2}


def test_reordering_within_the_window_is_fine_and_too_old_is_refused() -> None:
    sender, receiver = pair("mac", replay_window=64)
    datagrams = [sealed(sender, [bytes([i])])[0] for i in range(100)]
    assert transfer(sender, receiver, datagrams=[datagrams[50]]) == [bytes([50])]
    assert transfer(sender, receiver, datagrams=[datagrams[10]]) == [bytes([10])]  # 40 behind: inside
    assert transfer(sender, receiver, datagrams=[datagrams[99]]) == [bytes([99])]
    assert transfer(sender, receiver, datagrams=[datagrams[20]]) == []  # 79 behind: outside the window
    assert receiver.drops == {"too_old": 1}


def test_a_restarted_sender_is_believed_at_once_and_its_old_datagrams_never_again() -> None:
    before, receiver = pair("mac", epoch=envelope_epoch(1000, 1000.5))
    old = sealed(before, [b"old life"])
    assert transfer(before, receiver, datagrams=old) == [b"old life"]
    captured = sealed(before, [b"captured, never delivered"])
    after, _ = introduced(Envelope(A, envelope_epoch(1001, 1000.9), MODES["mac"]), receiver)  # restart: new epoch
    assert after.epoch > before.epoch
    assert transfer(after, receiver, datagrams=sealed(after, [b"new life"])) == [b"new life"]
    assert transfer(before, receiver, datagrams=captured + old) == []
    assert receiver.drops == {"stale_epoch": 2}


def test_envelope_epochs_grow_across_restarts_with_or_without_a_state_directory() -> None:
    assert envelope_epoch(1001, 1000.0) > envelope_epoch(1000, 1000.9)  # persisted boot epoch wins
    assert envelope_epoch(1000, 1000.000002) > envelope_epoch(1000, 1000.000001)  # same second, no state
    assert envelope_epoch(2**63, 0.0) == MAX_EPOCH  # saturates (a boot epoch the node never has)


def test_the_replay_window_itself() -> None:
    window = ReplayWindow(8, epoch=5, seq=10)
    assert window.check(5, 10) == "replayed" and window.check(4, 99) == "stale_epoch"
    assert window.check(5, 2) == "too_old" and window.check(5, 3) is None and window.check(6, 1) is None
    window.commit(5, 3)
    assert window.check(5, 3) == "replayed"
    window.commit(5, 1000)
    assert window.check(5, 10) == "too_old" and window.check(5, 999) is None
    window.commit(6, 1)
    assert (window.epoch, window.highest) == (6, 1) and window.check(5, 2000) == "stale_epoch"


def test_forged_datagrams_do_not_move_the_window() -> None:
    sender, receiver = pair("mac")
    datagrams = [sealed(sender, [bytes([i])])[0] for i in range(3)]
    forged = bytearray(datagrams[2])
    forged[-1] ^= 1
    receiver.receive_datagram(bytes(forged), A, 0.0)
    assert receiver.drops == {"bad_mac": 1}
    assert A.__str__() not in receiver.senders  # nothing learnt from a forgery
    assert transfer(sender, receiver, datagrams=datagrams) == [b"\x00", b"\x01", b"\x02"]


def test_the_sender_table_is_bounded() -> None:
    receiver = Envelope(B, 1, EnvelopeConfig(keys=(KEY,), max_senders=16))
    for index in range(100):  # a key holder inventing senders
        fake, _ = introduced(Envelope(Address(f"10.1.{index // 250}.{index % 250}", 10500), 1, MODES["mac"]),
                             receiver)
        assert transfer(fake, receiver, datagrams=sealed(fake, [b"x"])) == [b"x"]
    assert len(receiver.senders) == 16
    assert receiver.counters["senders_evicted"] == 84


# ------------------------------------------------------------------ events and counters


def test_drops_are_events_rate_limited_per_reason_and_counted_exactly() -> None:
    sink: list[str] = []
    _, receiver = pair("mac")
    receiver = Envelope(B, 1, MODES["mac"], drop_sink=sink.append)
    for index in range(50):
        receiver.receive_datagram(b"\x93junk", A, 0.5)
        receiver.receive_datagram(bytes([0xFE, 9]) + bytes(40), A, 0.5 + index / 1000)
    emitted = receiver.events_emitted()
    assert [e.fields["reason"] for e in emitted].count("not_envelope") == EVENT_BURST
    assert [e.fields["reason"] for e in emitted].count("envelope_version") == EVENT_BURST
    assert receiver.drops == {"not_envelope": 50, "envelope_version": 50}
    assert len(sink) == 100
    first = emitted[0]
    assert first.type == "packet_dropped" and first.node == str(B)
    assert set(first.fields) == {"reason", "detail", "source", "size"}
    assert "unframed" in first.fields["detail"]
    receiver.receive_datagram(b"\x93junk", A, 2.0)  # a new second: the next event says how many were not reported
    (later,) = receiver.events_emitted()
    assert later.fields["suppressed"] == 40


# ------------------------------------------------------------------ keys and configuration


def test_key_files_hex_base64_comments_and_errors(tmp_path: Path) -> None:
    text = f"# federation keys\n\n{KEY.hex()}\n  {__import__('base64').b64encode(OTHER_KEY).decode()}  \n"
    assert parse_keys(text, "f") == (KEY, OTHER_KEY)
    assert parse_keys(generate_key(), "f")[0].__len__() == 32
    for bad, message in (("", "no key"), ("s3cret!" * 5, "not a key"), ("00" * 8 + "0", "not a key"),
                         ("00" * 10, "10 bytes"), (f"{KEY.hex()}\n{KEY.hex()}", "repeats")):
        with pytest.raises(KeyFileError, match=message) as raised:
            parse_keys(bad, "f")
        assert "s3cret" not in str(raised.value)  # the line is never echoed
    path = tmp_path / "federation.key"
    with pytest.raises(KeyFileError, match="genkey"):
        read_key_file(path)
    path.write_text(KEY.hex() + "\n")
    path.chmod(0o644)
    assert read_key_file(path) == (KEY,)
    assert "chmod 600" in (permission_warning(path) or "")
    path.chmod(0o600)
    assert permission_warning(path) is None


def test_genkey_prints_a_key_the_wrapper_accepts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from federation.daemon.cli import main

    assert main(["genkey"]) == 0
    first = capsys.readouterr().out
    assert main(["genkey"]) == 0
    second = capsys.readouterr().out
    assert first != second and len(first.strip()) == 64
    path = tmp_path / "federation.key"
    path.write_text(first)
    assert load_config({"bind": "127.0.0.1:10500", "key_file": str(path)}).keys == (bytes.fromhex(first.strip()),)


def test_the_config_reads_the_key_file_and_checks_encryption(tmp_path: Path) -> None:
    path = tmp_path / "federation.key"
    path.write_text(f"{OTHER_KEY.hex()}\n{KEY.hex()}\n")
    flags = {"bind": "127.0.0.1:10500", "key_file": str(path), "encryption": "chacha20-poly1305"}
    config = load_config(flags)
    assert config.keys == (OTHER_KEY, KEY) and config.encryption == "chacha20-poly1305"
    assert KEY.hex() not in repr(config)
    with pytest.raises(ConfigError, match="--key-file: key file .* not found"):
        load_config({**flags, "key_file": str(tmp_path / "missing")})
    with pytest.raises(ConfigError, match="needs a federation key"):
        load_config({"bind": "127.0.0.1:10500", "encryption": "chacha20-poly1305"})
    with pytest.raises(ConfigError, match="expected one of none, chacha20-poly1305"):
        load_config({**flags, "encryption": "aes"})
    assert load_config({"bind": "127.0.0.1:10500"}).keys == ()


# ------------------------------------------------------------------ two real nodes through envelopes


@pytest.mark.parametrize("mode", ["mac", "aead"])
def test_two_nodes_federate_a_200k_publication_through_their_envelopes(mode: str) -> None:
    settings = Settings(hello_interval=0.2)
    nodes = {address: Node(address, [other], 1, random.Random(str(address)), settings, vid=index)
             for index, (address, other) in enumerate(((A, B), (B, A)), start=1)}
    envelopes = {address: Envelope(address, 1, EnvelopeConfig.from_settings(node.settings, (KEY,),
                                                                            MODES[mode].encryption))
                 for address, node in nodes.items()}
    sizes: list[int] = []

    def pump(now: float) -> None:
        for _ in range(20):
            moved = False
            for address, node in nodes.items():
                for data, to in node.packets_to_send():
                    envelopes[address].send(data, to, now)
                for datagram, to in envelopes[address].datagrams_to_send(now):
                    sizes.append(len(datagram))
                    moved = True
                    for packet in envelopes[to].receive_datagram(datagram, address, now):
                        nodes[to].receive_packet(packet, address, now)
            if not moved:
                return

    now = 0.0
    for node in nodes.values():
        node.start(now)
    nodes[B].local_subscribe("client", "big/#", 0, now)
    while now < 5.0:
        now += 0.05
        for node in nodes.values():
            node.handle_timer(now)
        pump(now)
    payload = os.urandom(200 * 1024)
    nodes[A].local_publish("big/blob", payload, 1, False, None, now)
    pump(now)
    injected = nodes[B].injections_to_make()
    assert [(i.topic, i.payload) for i in injected] == [("big/blob", payload)]
    assert max(sizes) <= nodes[A].settings.max_datagram
    # Nothing lost but the first hello, sent before its sender heard the other: refused, but it taught its epoch.
    assert sum((envelope.drops for envelope in envelopes.values()), Counter()) == {"receiver_epoch": 1}
    assert envelopes[B].counters["packets_reassembled"] == 1


# ------------------------------------------------------------------ the interop vectors of docs/protocol.md

VECTOR_PACKET = bytes.fromhex("95a2686c019401aa3132372e302e302e3130cd29040101cb3fe0000000000000")
VECTOR_HEADER = "0000000000000001" + "0000000000000001" + "0000000000000002" + "10" + "3132372e302e302e31303a3130353030"
VECTORS = {
    "open": "fe0200" + "00000000" + VECTOR_HEADER + "010020" + VECTOR_PACKET.hex(),
    "mac": "fe0201" + "be4bc9eb" + VECTOR_HEADER + "010020" + VECTOR_PACKET.hex()
           + "0186a431418fffdf136f5c7ca24083ea",
    "aead": "fe0202" + "be4bc9eb" + VECTOR_HEADER
            + "28529c15df029cb7729f1a7d4f14706419eb80bd6bfc8fdce7e345c0795a6f1fc82a706e2321a1637372b47b375ed596b1da69",
}


@pytest.mark.parametrize("mode", sorted(VECTORS))
def test_the_documented_test_vectors(mode: str) -> None:
    """Key 00 01 .. 1f, sender 127.0.0.10:10500, epoch 1, first datagram, to a receiver of epoch 2: exactly the
    bytes in docs/protocol.md."""
    vector = VECTORS[mode]
    keys = () if mode == "open" else (bytes(range(32)),)
    config = EnvelopeConfig(keys=keys, encryption="chacha20-poly1305" if mode == "aead" else "none")
    sender = Envelope(Address("127.0.0.10", 10500), 1, config)
    receiver = Envelope(Address("127.0.0.11", 10500), 2, config)
    sender.set_peer_epoch(receiver.address, receiver.epoch)
    assert sealed(sender, [VECTOR_PACKET], to=receiver.address) == [bytes.fromhex(vector)]
    assert receiver.receive_datagram(bytes.fromhex(vector), Address("127.0.0.10", 10500), 0.0) == [VECTOR_PACKET]
    docs = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    assert vector in docs.replace("\n", "").replace(" ", ""), f"docs/protocol.md lacks the {mode} vector"
