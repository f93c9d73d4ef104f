"""The run loops of the MQTT data path (federation/daemon/mqtt_runs.py): the C extension and the Python reference
give the same answers, and those answers are what paho reads and writes."""

from __future__ import annotations

import socket

import paho.mqtt.client as mqtt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paho.mqtt.enums import CallbackAPIVersion

from federation.daemon import mqtt_runs
from federation.daemon.mqtt_runs import append_qos0_run_python, parse_plain_run_python
from suites.bench.hotpath import publish_packet

from mqtt_bytes import read_all

PARSERS = [pytest.param(parse_plain_run_python, id="python")]
BUILDERS = [pytest.param(append_qos0_run_python, id="python")]
if mqtt_runs.NATIVE:
    from federation.daemon import _mqtt_runs  # type: ignore[attr-defined]
    PARSERS.append(pytest.param(_mqtt_runs.parse_plain_run, id="c"))
    BUILDERS.append(pytest.param(_mqtt_runs.append_qos0_run, id="c"))


def test_the_extension_is_built_in_the_checkout() -> None:
    """`make test` installs the package, which builds the extension (setup.py): the wrapper uses it."""
    assert mqtt_runs.NATIVE
    assert mqtt_runs.parse_plain_run is not parse_plain_run_python


@pytest.mark.parametrize("parse", PARSERS)
def test_a_run_of_plain_publishes_is_read_whole(parse) -> None:  # type: ignore[no-untyped-def]
    packets = [publish_packet(f"a/{i}", bytes([i]) * (i * 37), 1, i + 1) for i in range(40)]
    data = b"".join(packets)
    assert parse(data, 0, 1000) == (len(data), 1, [f"a/{i}" for i in range(40)],
                                    [bytes([i]) * (i * 37) for i in range(40)], list(range(1, 41)))


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize("stopper", [
    publish_packet("$SYS/broker/log/N", b"line", 0, 0),  # the broker's own topic
    publish_packet("q/2", b"x", 2, 5),  # QoS 2
    publish_packet("q/1", b"x", 1, 5, dup=True),  # sent again
    bytes([0x31, 5, 0, 1, 0x74, 0, 0x78]),  # retained
    bytes([0x30, 9, 0, 1, 0x74, 3, 0x03, 0, 0x61, 0x78, 0x79]),  # properties (a content type)
    bytes([0x30, 4, 0, 0, 0, 0x78]),  # an empty topic (an alias)
    bytes([0x30, 5, 0, 1, 0xFF, 0, 0x78]),  # a topic that is not UTF-8
    bytes([0x40, 2, 0, 7]),  # a PUBACK
    bytes([0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]),  # a length of five bytes (malformed)
], ids=["sys", "qos2", "dup", "retain", "properties", "alias", "not-utf8", "puback", "malformed"])
def test_a_run_stops_before_anything_not_plain(parse, stopper: bytes) -> None:  # type: ignore[no-untyped-def]
    head = b"".join(publish_packet(f"a/{i}", b"p", 0, 0) for i in range(3))
    assert parse(head + stopper + head, 0, 1000) == (len(head), 0, ["a/0", "a/1", "a/2"], [b"p"] * 3, [])
    assert parse(stopper + head, 0, 1000)[:3] == (0, 0, [])


@pytest.mark.parametrize("parse", PARSERS)
def test_a_run_is_of_one_qos(parse) -> None:  # type: ignore[no-untyped-def]
    qos1 = publish_packet("q/1", b"x", 1, 9)
    qos0 = publish_packet("q/0", b"y", 0, 0)
    assert parse(qos1 + qos1 + qos0, 0, 10) == (2 * len(qos1), 1, ["q/1", "q/1"], [b"x", b"x"], [9, 9])
    assert parse(qos0 + qos1, 0, 10) == (len(qos0), 0, ["q/0"], [b"y"], [])


@pytest.mark.parametrize("parse", PARSERS)
def test_a_packet_not_all_read_and_the_limit_end_the_run(parse) -> None:  # type: ignore[no-untyped-def]
    packets = [publish_packet(f"a/{i}", b"x" * 300, 0, 0) for i in range(4)]
    data = b"".join(packets)
    for cut in range(len(packets[0]) * 3, len(data)):
        end, _qos, topics, _payloads, _mids = parse(data[:cut], 0, 1000)
        assert len(topics) == (3 if cut < len(data) else 4) and end == len(packets[0]) * len(topics)
    assert parse(data, len(packets[0]), 2)[:3] == (len(packets[0]) * 3, 0, ["a/1", "a/2"])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 20), st.integers(0, 50))
def test_the_c_and_python_readers_agree_on_any_bytes(data: bytes, pos: int, limit: int) -> None:
    if not mqtt_runs.NATIVE:
        pytest.skip("the C extension is not built")
    assert _mqtt_runs.parse_plain_run(data, pos, limit) == parse_plain_run_python(data, pos, limit)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0x30, 0x32, 0x31, 0x38, 0x34]), st.text(max_size=6),
                          st.binary(max_size=40), st.integers(1, 65535)), max_size=12),
       st.integers(0, 15))
def test_the_c_and_python_readers_agree_on_publish_streams(packets: list[tuple[int, str, bytes, int]],
                                                           limit: int) -> None:
    if not mqtt_runs.NATIVE:
        pytest.skip("the C extension is not built")
    stream = b"".join(bytes([command]) + publish_packet(topic, payload, (command >> 1) & 3, mid)[1:]
                      for command, topic, payload, mid in packets)
    assert _mqtt_runs.parse_plain_run(stream, 0, limit) == parse_plain_run_python(stream, 0, limit)


def _paho_bytes(cases: list[tuple[str, bytes, bool]]) -> bytes:
    """What paho writes for QoS 0 publications without properties."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    ours, peer = socket.socketpair()
    client._sock = ours  # type: ignore[assignment]  # what reconnect() would set
    try:
        for topic, payload, retain in cases:
            client.publish(topic, payload, 0, retain)
        return read_all(peer)
    finally:
        client._sock = None
        ours.close()
        peer.close()


@pytest.mark.parametrize("build", BUILDERS)
@pytest.mark.parametrize("retain", [False, True])
def test_a_qos0_run_is_built_as_paho_builds_it(build, retain: bool) -> None:  # type: ignore[no-untyped-def]
    cases = [("t", b"", retain), ("a/b/c", b"x" * 200, retain), ("é/ü", b"\0" * 20000, retain),
             ("x" * 300, b"y" * 130, retain)]
    out = bytearray(b"before")
    assert build(out, [c[0] for c in cases], [c[1] for c in cases], retain) == len(cases)
    assert bytes(out) == b"before" + _paho_bytes(cases)


@pytest.mark.parametrize("build", BUILDERS)
@pytest.mark.parametrize("refused", ["a/+", "a/#", "", "x" * 70000, "\ud800"])
def test_a_qos0_run_stops_at_a_topic_paho_must_judge(build, refused: str) -> None:  # type: ignore[no-untyped-def]
    out = bytearray()
    assert build(out, ["ok/1", refused, "ok/2"], [b"p", b"p", b"p"], False) == 1
    assert bytes(out) == _paho_bytes([("ok/1", b"p", False)])
    assert build(out, [refused], [b"p"], False) == 0 and bytes(out) == _paho_bytes([("ok/1", b"p", False)])
