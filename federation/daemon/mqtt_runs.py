"""Runs of plain PUBLISH packets: read from the broker's bytes, and built for it, a run at a time.

Theory of operation: most of what a wrapper carries is "plain" publications
(QoS 0 or 1, not retained, not sent again, no MQTT v5 properties, a topic
that is not the broker's own `$` one). The sending wrapper reads them from
its broker's socket and the receiving wrapper writes them into its broker's,
and the per-message walk over their bytes was about a microsecond of Python
on each side: at the bridge chain's rate on this 2-CPU machine, a wrapper's
whole budget (docs/benchmarks.md). So both walks take a run of packets at a
time and trade in lists:

* `parse_plain_run(data, pos, limit)` reads, from offset `pos` of `data`, at
  most `limit` complete plain PUBLISH packets of the first one's QoS, and
  returns `(end, qos, topics, payloads, mids)`: the offset after the last one
  taken, their QoS (0 when none), and their topics (str), payloads and, at
  QoS 1, packet ids. It stops, taking nothing more, at the first packet that
  is not plain, not complete in `data`, malformed, of the other QoS, or whose
  topic is not UTF-8: those are for the caller's packet-at-a-time reader,
  which knows what to answer.
* `append_qos0_run(out, topics, payloads, retain)` appends to `out` a QoS 0
  PUBLISH without properties for each (topic, payload) from the first on, as
  paho's `_send_publish` builds it, and returns how many it appended: it
  stops at the first whose topic paho or the broker would refuse (empty,
  longer than 65,535 bytes, with a wildcard, not encodable) or whose packet
  would pass MQTT's limit, leaving that one for paho's own path.

`federation/daemon/_mqtt_runs.c` does the same in C, built with the package
where a C compiler is found (setup.py; optional). This module uses it when it
was built and falls back to the Python below, which is also the reference the
tests compare it with (tests/daemon/test_mqtt_runs.py); `NATIVE` says which.
"""

from __future__ import annotations

from collections.abc import Callable

MAX_REMAINING_LENGTH = 268435455
"""MQTT's largest remaining length (four length bytes)"""


def parse_plain_run_python(data: bytes, pos: int, limit: int) -> tuple[int, int, list[str], list[bytes], list[int]]:
    """`parse_plain_run` in Python (the module docstring)."""
    topics: list[str] = []
    payloads: list[bytes] = []
    mids: list[int] = []
    run_qos = -1
    end = len(data)
    pos = max(pos, 0)
    while len(topics) < limit and end - pos >= 2:
        command = data[pos]
        if command != 0x30 and command != 0x32:
            break
        qos = (command >> 1) & 1
        if run_qos >= 0 and qos != run_qos:
            break
        start, length, shift, complete = pos + 1, 0, 0, False
        for _ in range(4):
            if start >= end:
                break
            byte = data[start]
            start += 1
            length |= (byte & 0x7F) << shift
            if not byte & 0x80:
                complete = True
                break
            shift += 7
        if not complete or length > MAX_REMAINING_LENGTH:
            break
        stop = start + length
        if stop > end or length < 4 + 2 * qos:
            break
        topic_end = start + 2 + ((data[start] << 8) | data[start + 1])
        properties = topic_end + 2 * qos
        if topic_end == start + 2 or properties >= stop or data[properties] or data[start + 2] == 0x24:  # "$"
            break
        try:
            topic = data[start + 2:topic_end].decode("utf-8")
        except UnicodeDecodeError:
            break
        topics.append(topic)
        payloads.append(data[properties + 1:stop])
        if qos:
            mids.append((data[topic_end] << 8) | data[topic_end + 1])
        run_qos = qos
        pos = stop
    return pos, max(run_qos, 0), topics, payloads, mids


def append_qos0_run_python(out: bytearray, topics: list[str], payloads: list[bytes], retain: bool) -> int:
    """`append_qos0_run` in Python (the module docstring)."""
    count = 0
    for topic, payload in zip(topics, payloads, strict=False):  # as far as both go, as the C one
        try:
            topic_bytes = topic.encode("utf-8")
        except UnicodeEncodeError:
            break
        if not 0 < len(topic_bytes) <= 0xFFFF or b"+" in topic_bytes or b"#" in topic_bytes:
            break
        length = 2 + len(topic_bytes) + 1 + len(payload)
        if length + 2 > MAX_REMAINING_LENGTH:  # paho's limit, which leaves room for a packet id
            break
        out.append(0x31 if retain else 0x30)
        while True:
            byte, length = length & 0x7F, length >> 7
            out.append(byte | 0x80 if length else byte)
            if not length:
                break
        out += len(topic_bytes).to_bytes(2, "big")
        out += topic_bytes
        out.append(0)  # no properties
        out += payload
        count += 1
    return count


parse_plain_run: Callable[[bytes, int, int], tuple[int, int, list[str], list[bytes], list[int]]]
append_qos0_run: Callable[[bytearray, list[str], list[bytes], bool], int]
try:
    from federation.daemon import _mqtt_runs  # type: ignore[attr-defined]
except ImportError:  # not built (no C compiler at install): the same in Python
    NATIVE = False
    parse_plain_run = parse_plain_run_python
    append_qos0_run = append_qos0_run_python
else:
    NATIVE = True
    parse_plain_run = _mqtt_runs.parse_plain_run
    append_qos0_run = _mqtt_runs.append_qos0_run
