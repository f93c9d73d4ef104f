"""The fault suite's packet filter on the real kernel: a cut drops UDP or resets TCP between two loopback
addresses and nothing else, and its table is gone afterwards."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator

import pytest

from federation.harness.processes import find_tool
from suites.faults.packet_filter import Cut, PacketFilter

from broker_util import wait_for
from federation_util import next_first_address

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or find_tool("nft") is None,
                                reason="needs root and nftables (apt-get install -y nftables)")
PORT = 10577


@pytest.fixture(name="addresses")
def addresses_fixture() -> tuple[str, str, str]:
    """Three addresses of a /24 of this test's own."""
    base = next_first_address().rsplit(".", 1)[0]
    return f"{base}.10", f"{base}.11", f"{base}.12"


@pytest.fixture(name="packet_filter")
def packet_filter_fixture() -> Iterator[PacketFilter]:
    made = PacketFilter()
    yield made
    made.close()


def tables() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout


def udp_arrives(sender: socket.socket, receiver: socket.socket, payload: bytes) -> bool:
    """Send and wait up to 0.5 s for it (a datagram on loopback takes microseconds)."""
    sender.send(payload)
    receiver.settimeout(0.5)
    try:
        return receiver.recv(100) == payload
    except TimeoutError:
        return False


def test_a_udp_cut_drops_between_the_sides_only(packet_filter: PacketFilter,
                                                addresses: tuple[str, str, str]) -> None:
    a, b, c = addresses
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as from_a, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as from_c:
        receiver.bind((b, PORT))
        from_a.bind((a, PORT))
        from_a.connect((b, PORT))
        from_c.bind((c, PORT))
        from_c.connect((b, PORT))
        assert udp_arrives(from_a, receiver, b"before")
        key = packet_filter.block(Cut((a,), (b,), "udp", PORT))
        assert packet_filter.table in tables()
        assert not udp_arrives(from_a, receiver, b"cut")
        assert udp_arrives(from_c, receiver, b"other side")  # c is not on either side of the cut
        packet_filter.unblock(key)
        assert udp_arrives(from_a, receiver, b"healed")
    packet_filter.close()
    assert packet_filter.table not in tables()


def test_a_tcp_reset_breaks_the_connection_and_refuses_new_ones(packet_filter: PacketFilter,
                                                                 addresses: tuple[str, str, str]) -> None:
    _, b, _ = addresses
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((b, PORT))
        server.listen()
        client = socket.create_connection((b, PORT), timeout=2)
        accepted, _ = server.accept()
        try:
            key = packet_filter.block(Cut((), (b,), "tcp", PORT, "reset"))

            def reset() -> bool:
                try:
                    client.send(b"x")
                    client.settimeout(0.2)
                    client.recv(1)
                except TimeoutError:
                    return False
                except (ConnectionResetError, BrokenPipeError):
                    return True
                return False

            wait_for(reset, timeout=5, message="the established connection to be reset")
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((b, PORT), timeout=2).close()
            packet_filter.unblock(key)
            socket.create_connection((b, PORT), timeout=2).close()
        finally:
            client.close()
            accepted.close()
