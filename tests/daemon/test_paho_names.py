"""The lean path's private paho names (federation/daemon/lean_client.py `PAHO_PRIVATE_NAMES`) against the installed
paho, and the adapter's fallback to paho's public API when one is missing.

The fallback is exercised as a paho that renamed something would trigger it: the list names one this paho
lacks. No broker: a Unix socket pair stands in for the TCP connection (tests/real/test_daemon_broker_loop.py
runs the fallback against a real Mosquitto).
"""

from __future__ import annotations

import ast
import configparser
import logging
import socket
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from federation.daemon import lean_client
from federation.daemon.broker import BrokerAdapter
from federation.daemon.broker_items import BrokerItem, LogLine, Publication
from federation.daemon.lean_client import (
    PAHO_PRIVATE_NAMES,
    LeanClient,
    PublicClient,
    missing_paho_names,
    stop_network_thread,
)
from federation.protocol.types import Address, Injection
from suites.bench.hotpath import publish_packet

from mqtt_bytes import adapter_on_socketpair, read_all

REPO = Path(__file__).resolve().parents[2]
GONE = "client._renamed_by_a_later_paho"
"""a name the lean path would rely on and this paho lacks"""


def test_the_installed_paho_has_every_name_the_lean_path_uses() -> None:
    assert missing_paho_names() == []


def test_setup_cfg_pins_the_paho_the_names_were_checked_against() -> None:
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg", encoding="utf-8")
    requirements = [line.strip() for line in parser["options"]["install_requires"].splitlines()]
    assert f"paho-mqtt=={metadata.version('paho-mqtt')}" in requirements


def _private_attributes() -> tuple[set[str], set[str]]:
    """Private attribute names lean_client.py reads or writes anywhere, and those its classes define."""
    tree = ast.parse((REPO / "federation" / "daemon" / "lean_client.py").read_text(encoding="utf-8"))
    used: set[str] = set()
    defined: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for statement in node.body:
                if isinstance(statement, ast.FunctionDef):
                    defined.add(statement.name)
                elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                    defined.add(statement.target.id)
                elif isinstance(statement, ast.Assign):
                    defined.update(target.id for target in statement.targets if isinstance(target, ast.Name))

    def private(names: set[str]) -> set[str]:
        return {name for name in names if name.startswith("_") and not name.startswith("__")}

    return private(used), private(defined)


def _pahos() -> tuple[object, ...]:
    return (mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5), mqtt.MQTTMessage(),
            mqtt.MQTTMessageInfo(0))


def test_the_list_names_every_private_paho_name_lean_client_uses() -> None:
    """What lean_client.py reads, writes or overrides of paho's is in the one list the start-up check reads."""
    listed = {entry.split(".", 1)[1] for entry in PAHO_PRIVATE_NAMES}
    used, defined = _private_attributes()
    pahos = _pahos()
    overridden = {name for name in defined if any(hasattr(paho, name) for paho in pahos)}
    assert sorted(((used - defined) | overridden) - listed) == []


def test_the_lean_clients_own_private_names_are_not_pahos() -> None:
    """`LeanClient` keeps state of its own under private names: none may be one of paho's (it would clobber it)."""
    listed = {entry.split(".", 1)[1] for entry in PAHO_PRIVATE_NAMES}
    used, defined = _private_attributes()
    own = (used | defined) - listed
    assert {"_read_data", "_complete_lean"} <= own
    assert [name for name in sorted(own) for paho in _pahos() if hasattr(paho, name)] == []


def test_a_missing_name_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lean_client, "PAHO_PRIVATE_NAMES", (*PAHO_PRIVATE_NAMES, GONE, "module.gone_too"))
    assert missing_paho_names() == [GONE, "module.gone_too"]


# ------------------------------------------------------------------ the fallback


@pytest.fixture
def fallback(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
             ) -> Iterator[tuple[BrokerAdapter, socket.socket, list[BrokerItem]]]:
    """A loop-driven adapter built while the lean path lacks a name, on a socket pair."""
    monkeypatch.setattr(lean_client, "PAHO_PRIVATE_NAMES", (*PAHO_PRIVATE_NAMES, GONE))
    caplog.set_level(logging.WARNING, logger="federation.daemon.broker")
    items: list[BrokerItem] = []
    with adapter_on_socketpair("fallback-test", items.append) as (adapter, peer):
        yield adapter, peer, items


def test_a_missing_name_makes_the_adapter_use_pahos_public_path_with_one_warning(
        fallback: tuple[BrokerAdapter, socket.socket, list[BrokerItem]], caplog: pytest.LogCaptureFixture) -> None:
    adapter, _peer, _items = fallback
    assert type(adapter.client) is PublicClient and not isinstance(adapter.client, LeanClient)
    warnings = [record.getMessage() for record in caplog.get_records("setup") if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert GONE in warnings[0] and "public API" in warnings[0] and "paho-mqtt==2.2.0" in warnings[0]


def test_the_public_path_hands_over_and_acknowledges_a_burst(
        fallback: tuple[BrokerAdapter, socket.socket, list[BrokerItem]]) -> None:
    adapter, peer, items = fallback
    packets = [publish_packet(f"a/{index}", bytes([index]) * index, index % 2, index + 1) for index in range(40)]
    packets.insert(3, publish_packet("$SYS/broker/log/N", b"line", 0, 0))
    peer.sendall(b"".join(packets))
    adapter.reading.on_readable()
    assert [(p.topic, p.payload, p.qos) for p in items if isinstance(p, Publication)] == \
        [(f"a/{index}", bytes([index]) * index, index % 2) for index in range(40)]
    assert items[3] == LogLine("$SYS/broker/log/N", b"line")
    assert read_all(peer) == b"".join(bytes([0x40, 2]) + (index + 1).to_bytes(2, "big")
                                       for index in range(40) if index % 2)


def test_the_public_path_injects_what_pahos_publish_writes_and_completes_qos1(
        fallback: tuple[BrokerAdapter, socket.socket, list[BrokerItem]]) -> None:
    adapter, peer, _items = fallback
    origin = Address("10.0.0.9", 10500)
    injections = [Injection(f"fed/{index}", b"p%d" % index, index % 2, False, None, (origin, 1, index))
                  for index in range(6)]
    adapter.publish_all(injections)
    reference = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    ours, theirs = socket.socketpair()
    reference._sock = ours  # type: ignore[assignment]
    try:
        for injection in injections:
            reference.publish(injection.topic, injection.payload, injection.qos, injection.retain)
        expected = read_all(theirs)
    finally:
        reference._sock = None
        ours.close()
        theirs.close()
    assert read_all(peer) == expected
    assert adapter.injected == 6 and adapter.backlog() == 3
    mids = sorted(adapter.injector._unfinished)
    peer.sendall(b"".join(bytes([0x40, 2]) + mid.to_bytes(2, "big") for mid in mids))  # the broker's PUBACKs
    adapter.reading.on_readable()
    assert adapter.backlog() == 0


class _EndsWhenCompared:
    """Stands in for paho's network thread, ending (as `_thread_main`'s `finally` does: `_thread = None`) at the
    moment `loop_stop` compares it with the current thread: between its check and its join."""

    def __init__(self, client: mqtt.Client) -> None:
        self.client = client

    def __ne__(self, other: object) -> bool:
        self.client._thread = None  # type: ignore[assignment]
        return True

    def join(self) -> None:
        raise AssertionError("the thread had ended: nothing to join")


def test_stopping_the_network_thread_as_it_ends_is_not_an_error() -> None:
    """The fault suite's run died once of it (a client closed right after DISCONNECT): paho's own loop_stop
    raises AttributeError when its thread ends between the check and the join; `stop_network_thread` does not."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client._thread = _EndsWhenCompared(client)  # type: ignore[assignment]
    with pytest.raises(AttributeError):
        client.loop_stop()
    client._thread = _EndsWhenCompared(client)  # type: ignore[assignment]
    stop_network_thread(client)
    assert client._thread is None
