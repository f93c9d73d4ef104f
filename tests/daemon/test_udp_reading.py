"""The overlay socket on a CPython whose datagram transports cannot pause reading (before 3.11.3; Debian 12's
python3 is 3.11.2): there `pause_reading` and `resume_reading` are ReadTransport's, which raise
NotImplementedError, and the wrapper died at start in its first container image (issue 40)."""

from __future__ import annotations

import asyncio
import socket
from asyncio import selector_events

import pytest

from federation.daemon.udp import LocalAddresses, OverlayProtocol
from federation.protocol.types import Address


@pytest.mark.parametrize("can_pause", [True, False])
def test_datagrams_reach_the_handler_whether_or_not_reading_can_pause(monkeypatch: pytest.MonkeyPatch,
                                                                       can_pause: bool) -> None:
    if not can_pause:  # as CPython 3.11.2 has them
        monkeypatch.setattr(selector_events._SelectorTransport, "pause_reading", asyncio.ReadTransport.pause_reading)
        monkeypatch.setattr(selector_events._SelectorTransport, "resume_reading",
                            asyncio.ReadTransport.resume_reading)

    async def scenario() -> list[bytes]:
        received: list[bytes] = []
        arrived = asyncio.Event()

        def on_datagram(data: bytes, _source: Address) -> None:
            received.append(data)
            arrived.set()

        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        protocol = OverlayProtocol(LocalAddresses({"127.0.0.1"}), sock=sock)
        # As the runtime does: the endpoint first (reading paused where it can be), then the handlers.
        transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(lambda: protocol, sock=sock)
        protocol.attach(on_datagram, lambda _addr: None, lambda: None)
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sender.sendto(b"\xfehello", sock.getsockname())
            await asyncio.wait_for(arrived.wait(), 5)
        finally:
            sender.close()
            transport.close()
        return received

    assert asyncio.run(scenario()) == [b"\xfehello"]
