"""A running wrapper's neighbours given by name, resolved again every `neighbour_resolve_interval`
(federation.daemon.reconfiguring): a neighbour that moved gets the hellos at its new address at once, and one
whose name stops resolving keeps the address it had. A whole runtime in the test's thread, no broker."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from federation.daemon.config import load_config
from federation.daemon.runtime import Runtime
from federation.protocol.types import Address

from broker_util import wait_for
from runtime_util import RuntimeThread, free_port


def test_a_neighbour_that_moved_is_greeted_at_its_new_address(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="federation.daemon")
    hosts = {"peer.example": "127.0.0.1"}

    def resolver(host: str, port: int, family: int) -> str:
        if host not in hosts:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return hosts[host]

    old = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    new = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    old.bind(("127.0.0.1", 0))
    port = old.getsockname()[1]
    new.bind(("127.0.0.2", port))
    for peer in (old, new):
        peer.settimeout(5)
    path = tmp_path / "wrapper.yaml"
    path.write_text(f"neighbors: ['peer.example:{port}']\nneighbour_resolve_interval: 0.1\n", encoding="utf-8")
    config = load_config({"config": str(path), "bind": f"127.0.0.1:{free_port()}", "broker": "127.0.0.1:1"},
                         resolver=resolver)
    assert config.neighbours == (Address("127.0.0.1", port),)
    thread = RuntimeThread(Runtime(config))
    try:
        wrapper = thread.wrapper
        wrapper.loop.call_soon_threadsafe(setattr, wrapper.reconfiguring, "resolver", resolver)
        old.recv(65536)  # a hello at the old address
        hosts["peer.example"] = "127.0.0.2"
        new.recv(65536)  # ... and, once resolved again, at the new one: greeted at once
        # Read from the test's thread while the loop's thread changes them: waited for, not asserted at once.
        wait_for(lambda: [str(n.transport) for n in wrapper.node.neighbours.all()] == [f"127.0.0.2:{port}"]
                 and wrapper.config.neighbours == (Address("127.0.0.2", port),),
                 timeout=5, message="the old address to be forgotten")
        del hosts["peer.example"]  # the name stops resolving: the address it had stays, with a warning
        wait_for(lambda: f"still using 127.0.0.2:{port}" in caplog.text, timeout=5, message="the warning")
        assert wrapper.config.neighbours == (Address("127.0.0.2", port),)
        assert new.recv(65536)
    finally:
        assert thread.stop() == 0
        old.close()
        new.close()
