"""paho's MQTT client with a short data path, for the wrapper's adapter driven by an asyncio loop.

Theory of operation: the wrapper's data path is "the broker sends a PUBLISH,
the wrapper hands it to the node", so what paho spends per received packet
is spent per federated message. paho reads every packet with at least three
`recv` calls (command byte, length byte, body), keeps its parse state in a
dict it rebuilds per packet, takes a lock and reads the clock twice, and
turns every PUBLISH into an `MQTTMessage` with an MQTT v5 `Properties`
object (about 30 `str.replace` and 27 `hasattr` calls when there are no
properties at all), a `threading.Condition` and a topic-matcher walk before
calling `on_message`; every QoS 1 PUBLISH then writes its own PUBACK with
its own `send`. `LeanClient` keeps paho for everything that is not the data
path (connecting, subscribing, keepalive, QoS 2, acknowledgements of what
the wrapper publishes) and shortens the data path:

* with `lean_publish` set, reads are buffered: one `recv` of up to
  `READ_CHUNK` bytes serves every packet in it (`buffered` tells the caller
  complete packets may wait without the socket being readable, so only a
  caller that drains them, `BrokerReading.on_readable`, sets it);
* with `lean_run` set too (and `manual_ack`), a run of *plain* PUBLISH
  packets at the front of that buffer (one QoS, 0 or 1, not retained, not
  DUP, no properties, not a `$` topic) is read in one call
  (`mqtt_runs.parse_plain_run`, in C where it was built) and handed over
  whole, `lean_run(topics, payloads, qos, packet ids)`: the sending wrapper's
  usual traffic, with nothing done per message in Python here;
* `read_packets` parses, while paho is between packets, every complete
  QoS 0 or 1 PUBLISH *without properties* at the front of that buffer in one
  loop and hands each to `lean_publish(topic_bytes, payload, qos, retain,
  packet id)`. The wrapper's client is made with paho's `manual_ack`, so
  nothing is acknowledged here: the runtime acknowledges what its node took,
  in one place, with `send_acks` (one write for a pass's PUBACKs and
  PUBCOMPs). A PUBACK saying success for one of our QoS 1 publications is
  taken in the same loop (`_complete_lean`): what paho's handler does,
  without the `ReasonCode` and `Properties` it builds for an `on_publish`
  nobody set; when the receiving wrapper injects at QoS 1 that construction
  was most of its CPU. Anything else (QoS 2, a PUBLISH with properties or an
  empty topic, another packet type, a packet not read whole yet, malformed
  bytes) goes to paho's own `_packet_read`, one packet at a time, unchanged;
  a QoS 0/1 PUBLISH without properties read that way still skips
  `MQTTMessage` (`_handle_publish`);
* `publish_completed` hears of every completed QoS 1/2 publication, with
  the broker's reason code (0x80 and above: refused), and
  `pubrec_received` of every first PUBREC of a QoS 2 one, before the PUBREL
  is written (the injection journal records it first: a restarted wrapper
  then sends the PUBREL again, not the PUBLISH, which the broker would take
  for a new message once it has completed the old one);
* a QoS 2 PUBLISH is handed to the caller when it arrives, not at the
  PUBREL: paho would answer PUBREC at once and keep the message in memory
  until the PUBREL, and a wrapper killed in between would lose it (the
  broker has let go of it at the PUBREC and only sends the PUBREL again).
  Here the PUBREC is the manual acknowledgement (`send_acks`), written once
  the runtime holds the publication (its custody spool); a PUBLISH repeated
  after a reconnection for a packet id already answered gets its PUBREC
  again, and any other reaches the caller with its DUP flag set, for the
  runtime to recognise (federation/daemon/spool.py). A PUBLISH with DUP
  set never takes the short path below, so that flag reaches the caller;
* log lines: Mosquitto gives each `$SYS/broker/log/...` message a message
  expiry, so every one carries properties and would take paho's path (a
  `Properties` object decoded per line; with the log at QoS 2 as it was,
  that path and the PUBRELs took 40% of the wrapper's samples while it learnt
  30,000 subscriptions in a burst, 5% after). The wrapper never uses the
  properties of a `$` topic (they are never federated), so `read_packets`
  skips them and hands such a QoS 0/1 PUBLISH to `lean_publish` like one
  without;
* reused packet ids: Mosquitto 2.0.11 numbers a message for a client when it
  queues it, and lets more than its Receive Maximum into flight (fixed in
  2.0.13: "Various fixes around inflight quota management"), so with more
  than 65,535 messages queued for the wrapper (100,000 subscribe lines in a
  burst) a packet id comes again while the message that had it still waits
  for its PUBREL. MQTT says such a PUBLISH is a repeat; from Mosquitto,
  without DUP, it is a new message, and acknowledging it at once would make
  the broker complete the earlier one (a second PUBREL, then a PUBCOMP it
  takes for a protocol error: the connection closed; or a PUBACK for a QoS 2
  message: the same). So such a message is handed over, and `send_acks` holds
  its acknowledgement until the PUBREL of the one before has been answered
  (`_release_held`); `acks_held` counts them. Before, the wrapper answered
  it as a repeat and dropped it (33,441 of a burst of 100,000 log lines),
  and the broker closed the connection for a protocol error 19-36 s later:
  the lines came back when that was within their 20 s message expiry, and
  were lost when it was not (both measured: docs/daemon.md, "Learning
  subscriptions in bulk");
* a PUBREL is answered with PUBCOMP at once (`_handle_pubrel`): with
  `manual_ack` paho would never answer one it does not hold (a previous
  run's, or one repeated after a reconnection), and the broker would keep
  that message in flight to us for ever, a slot of our Receive Maximum
  lost;
* `send_qos0` writes a run of QoS 0 PUBLISH packets built by
  `mqtt_runs.append_qos0_run` with one `send`, straight to the socket when paho
  has nothing queued and no network thread (else through paho's queue).
* `send_reliable` publishes a run of QoS 1 and 2 messages the way paho's
  `publish` does, minus its per-message overhead: packet ids from paho's
  `_mid_generate` (skipping ids still in use), the PUBLISH bytes paho
  builds (built here, properties packed by paho's `Properties.pack`), one
  `_packet_queue` (one `send`) for the run, and each message still
  registered in paho's `_out_messages` as an `MQTTMessage` waiting for its
  PUBACK or PUBREC, counted in `_inflight_messages`. The caller's `taken`
  sees the packet ids before the bytes are queued (the injection journal
  records them first). So paho's own acknowledgement handling completes
  them (`_do_on_publish`, hence `publish_completed`), and its reconnection
  logic (`_messages_reconnect_reset_out`, then the CONNACK handler) sends
  the unacknowledged ones again with the same packet id and DUP, or the
  PUBREL of those past PUBREC, unchanged. What goes is the rest of paho's
  `publish` per message (about 50-60 µs here: argument checks,
  `_send_publish`'s formatting and debug-log calls, one `_packet_queue` and
  `send` each) and the `threading.Condition` of a per-message
  `MQTTMessageInfo` (built by `MQTTMessage()`, and taken again at
  completion): the messages share one `_SharedInfo`, safe because nothing
  waits on it (the caller learns of completions from `publish_completed`;
  only `_do_on_publish` touches `info`, and only QoS 0 packets' `info` is
  touched on write or reconnect). The alternative, a table of our own with
  acknowledgements intercepted in `read_packets` and a re-publish through
  paho after reconnecting, would duplicate paho's session logic, resend in
  an order of our choosing and hide the messages from anything reading
  `_out_messages` (suites.bench.hotpath answers them from there).
  `max_inflight` holds as paho applies it: a run takes at most the free
  in-flight slots, and nothing at all while paho holds a message not in
  flight (queued at the limit, or unsent since a reconnection), so new
  messages never overtake those; the rest go through paho's `publish`, in
  order. (The wrapper sets no limit of paho's: `FlowControl` keeps the
  broker's Receive Maximum itself.)
* `restore` registers the messages a previous run of the wrapper had in
  flight (its injection journal) under their packet ids, before the first
  connection: paho's reconnection logic then sends them again exactly as
  it would its own (PUBLISH with DUP, or PUBREL), as an MQTT client with
  file persistence does.

These override or call paho's private methods and state, every one of
them named in `PAHO_PRIVATE_NAMES`; they were checked against paho-mqtt
2.2.0, which setup.cfg pins, and tests/daemon/test_hotpath_lean.py feeds the
same bytes to both paths and compares what comes out. Another paho may
rename what they rely on, so the adapter asks `missing_paho_names` at
start-up (tests/daemon/test_paho_names.py asks it too, and checks that the
list names everything this module uses): when a name is missing, it says
which in one warning and uses `PublicClient`, paho's documented API only
(every PUBLISH through `on_message`, one `publish` per injection), slower
but correct, instead of a `LeanClient` that would fail mid-run.
"""

from __future__ import annotations

import contextlib
import socket
from collections import deque
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from federation.daemon.mqtt_runs import parse_plain_run
from federation.daemon.publish_packets import NO_PROPERTIES, append_publish, publishable_field

PAHO_PRIVATE_NAMES: tuple[str, ...] = (
    # methods of paho's Client that LeanClient overrides or calls
    "client._sock_recv", "client._packet_read", "client._handle_publish", "client._do_on_publish",
    "client._send_puback", "client._handle_pubrec", "client._handle_pubrel", "client._send_pubcomp",
    "client._send_pubrec", "client._handle_on_message",
    "client._loop_rc_handle", "client._mid_generate", "client._packet_queue",
    "client._send_pingreq", "client._handle_pingresp", "client._send_simple_command",
    # the state of a Client it reads or writes
    "client._sock", "client._protocol", "client._thread", "client._in_packet", "client._manual_ack",
    "client._on_publish", "client._out_packet", "client._out_messages", "client._out_message_mutex",
    "client._in_messages", "client._in_message_mutex", "client._last_mid",
    "client._inflight_messages", "client._max_inflight_messages", "client._max_queued_messages",
    "client._msgtime_mutex", "client._last_msg_out", "client._last_bytes_received",
    # the keys of paho's parse state (`_in_packet`) it reads
    "in_packet.command", "in_packet.remaining_count", "in_packet.packet",
    # every field of a message `send_reliable` registers (all of MQTTMessage's), and how one is completed
    "message._topic", "message.mid", "message.payload", "message.qos", "message.retain", "message.dup",
    "message.properties", "message.timestamp", "message.state", "message.info", "info._set_as_published",
    # names of the paho.mqtt.client module outside its documented API
    "module.time_func", "module.PUBLISH", "module.PUBACK", "module.PINGREQ", "module.mqtt_ms_wait_for_puback",
    "module.mqtt_ms_wait_for_pubrec", "module.mqtt_ms_wait_for_pubcomp",
)
"""Every name of paho's that the lean path relies on and paho does not document, as `where.name`: `client`
an `mqtt.Client`, `in_packet` the keys of its `_in_packet`, `message` an `MQTTMessage`, `info` an
`MQTTMessageInfo`, `module` paho.mqtt.client. `missing_paho_names` checks them."""


def paho_version() -> str:
    """The installed paho-mqtt's version, for messages."""
    try:
        return metadata.version("paho-mqtt")
    except metadata.PackageNotFoundError:
        return "(version unknown)"


def stop_network_thread(client: mqtt.Client) -> None:
    """paho's `loop_stop`, without its race. paho 2.2.0's network thread sets `client._thread` to None as it
    ends, and `loop_stop` reads that attribute twice, to check it and to join the thread: when the thread ends in
    between, as it does right after a `disconnect`, `loop_stop` raises AttributeError ('NoneType' object has no
    attribute 'join'). The thread has ended then, so there is nothing left to wait for."""
    with contextlib.suppress(AttributeError):
        client.loop_stop()


def missing_paho_names() -> list[str]:
    """The entries of `PAHO_PRIVATE_NAMES` the installed paho lacks; empty when `LeanClient` may be used."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    owners: dict[str, object] = {"client": client, "message": mqtt.MQTTMessage(), "info": mqtt.MQTTMessageInfo(0),
                                 "module": mqtt}
    in_packet = getattr(client, "_in_packet", None)
    missing = []
    for entry in PAHO_PRIVATE_NAMES:
        where, name = entry.split(".", 1)
        if where == "in_packet":
            found = isinstance(in_packet, dict) and name in in_packet
        else:
            found = hasattr(owners[where], name)
        if not found:
            missing.append(entry)
    # `send_reliable` builds messages without `MQTTMessage.__init__`: a field it does not fill would be missing there
    filled = {entry.split(".", 1)[1] for entry in PAHO_PRIVATE_NAMES if entry.startswith("message.")}
    missing += [f"message.{name} (a field send_reliable does not fill)"
                for name in sorted(set(getattr(mqtt.MQTTMessage, "__slots__", ())) - filled)]
    return missing


PINGREQ_PACKET = b"\xc0\x00"
"""a PINGREQ, as paho's `_send_simple_command` builds it"""
READ_CHUNK = 1 << 16
"""bytes asked of the socket per read (paho asks for 1 byte, 1 byte, then the rest per packet)"""
ReliableMessage = tuple[str, bytes, int, bool, Properties | None]
"""what `LeanClient.send_reliable` publishes: topic, payload, qos (1 or 2), retain, properties"""
RestoredMessage = tuple[int, str, bytes, int, bool, Properties | None, bool]
"""what `LeanClient.restore` takes: mid, topic, payload, qos, retain, properties, past PUBREC (QoS 2)"""


def _skip_properties(data: bytes, position: int, stop: int) -> int:
    """Where the payload of a PUBLISH starts whose property length (a variable byte integer) is at `position`;
    -1 when the length is malformed or runs past `stop`, the packet's end."""
    length = 0
    shift = 0
    while position < stop and shift <= 21:
        byte = data[position]
        position += 1
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            end = position + length
            return end if end <= stop else -1
        shift += 7
    return -1


class _SharedInfo(mqtt.MQTTMessageInfo):
    """The `info` of every message `send_reliable` registers: nobody waits on it (the adapter learns of completions
    from `publish_completed`), so completing one message need not take a `threading.Condition`."""

    __slots__ = ()

    def _set_as_published(self) -> None:
        pass


class _WrittenInfo(mqtt.MQTTMessageInfo):
    """The `info` of a run of QoS 0 packets `send_qos0` queued behind a full socket: paho marks it published
    once its write loop has written the run, which is when the owner counts the run as written."""

    __slots__ = ("run_length", "on_written")

    def __init__(self, count: int, written: Callable[[int], None]) -> None:
        super().__init__(0)
        self.run_length = count
        self.on_written = written

    def _set_as_published(self) -> None:
        super()._set_as_published()
        self.on_written(self.run_length)


class LeanClient(mqtt.Client):
    """paho's client with the shorter receive and send paths described in the module docstring."""

    lean_publish: Callable[[bytes, bytes, int, bool, int], None] | None = None
    """a QoS 0/1 PUBLISH without properties: (topic bytes, payload, qos, retain, packet id, 0 for QoS 0); None:
    paho's path only"""
    lean_run: Callable[[list[str], list[bytes], int, list[int]], None] | None = None
    """with `lean_publish` and `manual_ack`: a run of plain PUBLISH packets of one QoS (0 or 1; not retained, not
    DUP, no properties, not a `$` topic), read a run at a time (mqtt_runs.parse_plain_run): (topics, payloads, qos,
    packet ids at QoS 1); the rest still goes to `lean_publish` or paho"""
    publish_completed: Callable[[int, int], None] | None = None
    """called with the mid and the broker's reason code of every QoS 1/2 publication the broker completed
    (PUBACK, PUBCOMP; a code of 0x80 or more says it refused it); unlike `on_publish` it costs nothing per QoS 0
    publication (paho builds a ReasonCode and Properties for each)"""
    pubrec_received: Callable[[int, int], None] | None = None
    """QoS 2: called with the mid and reason code of the first PUBREC for one of ours, before the PUBREL is
    written"""
    paused = False
    """set while the owner takes no publications (backpressure): `read_packets` stops, also mid-burst"""
    _read_data = b""
    _read_pos = 0
    _read_sock: object = None
    _lean_info: mqtt.MQTTMessageInfo | None = None
    _deferring_pubrec = False
    """set while `_take_qos2` lets paho decode a QoS 2 PUBLISH: its PUBREC waits for `send_acks`"""
    _qos2_answered: set[int] = frozenset()  # type: ignore[assignment]  # replaced per client in __init__
    """packet ids of received QoS 2 messages whose PUBREC we wrote and whose PUBREL has not come yet"""
    _held_acks: dict[int, deque[int]] = {}  # replaced per client in __init__
    """packet id -> the QoS of acknowledgements that wait for that id's PUBREL, in order (`send_acks`)"""
    _held_on: object = None
    """the connection (socket) the held acknowledgements belong to"""
    acks_held = 0
    """acknowledgements held because the broker reused a packet id before finishing its previous message"""
    pings_sent = 0
    """PINGREQs written on this client (paho's keepalive ones too), over every connection"""
    pings_answered = 0
    """PINGRESPs read; on a new connection it starts level with `pings_sent` (nothing outstanding)"""
    releases_unanswered = 0
    """PUBRELs for packet ids this client never answered with PUBREC: a previous run's, or, for a takeover's
    connection (federation.daemon.kicker), the client's own, which took a QoS 2 message and was gone before its
    PUBREL"""
    pingresp_received: Callable[[int], None] | None = None
    """called with `pings_answered` after each PINGRESP: the broker has processed everything written before the
    PINGREQ it answers (it handles one connection's packets in order; federation.daemon.retained_order)"""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._qos2_answered = set()
        self._held_acks = {}

    def buffered(self) -> int:
        """Bytes read from the socket that have not been consumed yet."""
        return len(self._read_data) - self._read_pos if self._read_sock is self._sock else 0

    def read_packets(self, limit: int) -> int:
        """Read up to `limit` packets from the connection (at least one if any is complete and not `paused`);
        how many were read, or -1 when the connection is gone (paho has closed it and called
        `on_disconnect`). Fewer than `limit`: what one read from the socket brought is used up (the socket
        may hold more: `BrokerReading.on_readable` asks FIONREAD), nothing more can be read now (the socket
        is empty, or holds part of a packet), or `paused` was set meanwhile."""
        if self._sock is None:
            return -1
        lean = self.lean_publish is not None and self._protocol == MQTTProtocolVersion.MQTTv5
        runs = self.lean_run if lean and self._manual_ack else None  # nothing of a run is acknowledged here
        count = 0
        while count < limit and not self.paused:
            if self._sock is None:  # closed by what the last packet caused (a DISCONNECT, a failed write)
                return -1
            in_packet = self._in_packet
            if lean and in_packet["command"] == 0 and not in_packet["remaining_count"]:  # between packets
                if self._read_sock is not self._sock or self._read_pos >= len(self._read_data):
                    if count:  # the buffer is used up: the caller asks FIONREAD, cheaper than a read raising EAGAIN
                        return count
                    try:
                        data = super()._sock_recv(READ_CHUNK)
                    except BlockingIOError:
                        return count
                    except OSError:
                        data = b""  # paho's read below meets the error (or the end) again and handles it
                    self._read_sock, self._read_data, self._read_pos = self._sock, data, 0
                if runs:
                    end, qos, topics, payloads, mids = parse_plain_run(self._read_data, self._read_pos, limit - count)
                    if topics:
                        self._read_pos = end
                        with self._msgtime_mutex:  # as `_parse_publishes_and_acks`: the keepalive's "heard"
                            self._last_bytes_received = mqtt.time_func()
                        runs(topics, payloads, qos, mids)
                        count += len(topics)
                        continue
                parsed = self._parse_publishes_and_acks(limit - count, runs is not None)
                if parsed:
                    count += parsed
                    continue
            rc = self._packet_read()  # paho's own: the next packet, or as much of it as has arrived
            if rc > 0:
                self._loop_rc_handle(rc)
                return -1
            if rc == MQTTErrorCode.MQTT_ERR_AGAIN:
                return count
            count += 1
        return count

    def _parse_publishes_and_acks(self, limit: int, runs: bool = False) -> int:
        """At most `limit` complete QoS 0/1 PUBLISH packets without properties (or on a `$` topic, whose
        properties are skipped) from the front of the read buffer, to `lean_publish`, and successful PUBACKs
        (`_complete_lean`); how many. Stops at the first packet that is anything else, and with `runs`
        (`lean_run` takes plain runs) at a plain QoS 0/1 PUBLISH after the first packet: `parse_plain_run` may
        take it."""
        publish = self.lean_publish
        assert publish is not None
        acknowledge = not self._manual_ack
        data = self._read_data
        pos = self._read_pos
        end = len(data)
        acks = bytearray()
        count = 0
        try:
            while count < limit and end - pos >= 4:  # the shortest: a PUBACK
                command = data[pos]
                if command == 0x40 and data[pos + 1] == 2:  # a PUBACK saying success (no reason code)
                    if not self._complete_lean((data[pos + 2] << 8) | data[pos + 3]):
                        break
                    pos += 4
                    count += 1
                    continue
                if command & 0xFC != 0x30 or end - pos < 6:  # not a PUBLISH, DUP, QoS 2 (or 3), or too short
                    break
                length = data[pos + 1]
                start = pos + 2
                if length & 0x80:  # more length bytes
                    length &= 0x7F
                    shift = 7
                    while True:
                        if start >= end or shift > 21:
                            length = -1  # not all here yet, or malformed: paho's
                            break
                        byte = data[start]
                        start += 1
                        length |= (byte & 0x7F) << shift
                        if not byte & 0x80:
                            break
                        shift += 7
                    if length < 0:
                        break
                stop = start + length
                if stop > end or length < 4:
                    break
                topic_end = start + 2 + ((data[start] << 8) | data[start + 1])
                qos = (command >> 1) & 1
                properties = topic_end + 2 * qos
                if properties >= stop or topic_end == start + 2:
                    break  # an empty topic (an alias: paho's), or malformed
                dollar = data[start + 2] == 0x24
                if runs and count and (command == 0x30 or command == 0x32) and not dollar and not data[properties]:
                    break  # a plain one: `parse_plain_run` may take it with those after it
                payload_start = properties + 1
                if data[properties]:
                    if not dollar:
                        break  # a publication's properties: paho decodes them (they are federated)
                    # A `$` topic (the broker's log lines: Mosquitto gives each a message expiry): its properties
                    # are never used, so they are skipped, not decoded (module docstring, "log lines").
                    payload_start = _skip_properties(data, properties, stop)
                    if payload_start < 0:
                        break  # malformed: paho's to refuse
                if qos:
                    publish(data[start + 2:topic_end], data[payload_start:stop], 1, bool(command & 0x01),
                            (data[topic_end] << 8) | data[topic_end + 1])
                    if acknowledge:
                        acks += bytes((0x40, 2, data[topic_end], data[topic_end + 1]))  # as `_send_puback`
                else:
                    publish(data[start + 2:topic_end], data[payload_start:stop], 0, bool(command & 0x01), 0)
                pos = stop
                count += 1
                if self.paused:
                    break
        finally:  # also if `lean_publish` raised: the packets handed over before stay consumed, acknowledged
            if count:
                self._read_pos = pos
                with self._msgtime_mutex:  # what `_packet_read` updates per packet: the keepalive's idea of "heard"
                    self._last_bytes_received = mqtt.time_func()
                if acks:
                    self._packet_queue(mqtt.PUBACK, acks, 0, 0)  # several PUBACK packets, one write
        return count

    def _complete_lean(self, mid: int) -> bool:
        """A successful PUBACK for `mid`, as paho's `_handle_pubackcomp` and `_do_on_publish` would take it,
        minus the `ReasonCode` and `Properties` they build for an `on_publish` callback nobody set; False
        (paho's to take) when one is set, paho keeps an in-flight limit, or `mid` is not a QoS 1 message."""
        if self._on_publish is not None or self._max_inflight_messages:
            return False
        with self._out_message_mutex:
            message = self._out_messages.get(mid)
            if message is None:
                return True  # not ours or already completed: paho ignores it too
            if message.qos != 1:
                return False
            completed = self.publish_completed
            if completed is not None:
                completed(mid, 0)
            del self._out_messages[mid]
            message.info._set_as_published()
            self._inflight_messages -= 1
        return True

    def _sock_recv(self, bufsize: int) -> bytes:
        """paho's reads, served from the buffer `read_packets` fills."""
        if self.lean_publish is None:
            return super()._sock_recv(bufsize)
        if self._read_sock is not self._sock:  # a new connection: nothing of the old one is valid
            self._read_sock, self._read_data, self._read_pos = self._sock, b"", 0
        data, pos = self._read_data, self._read_pos
        if pos >= len(data):
            data = super()._sock_recv(max(bufsize, READ_CHUNK))  # BlockingIOError when empty, b"" at EOF
            if len(data) <= bufsize:
                self._read_data, self._read_pos = b"", 0
                return data
            pos = 0
            self._read_data = data
        end = min(pos + bufsize, len(data))
        self._read_pos = end
        return data[pos:end]

    def send_qos0(self, packets: bytearray, count: int = 0, written: Callable[[int], None] | None = None
                  ) -> MQTTErrorCode:
        """Queue and write already-built QoS 0 PUBLISH packets (`mqtt_runs.append_qos0_run`) as one buffer: one `send`
        for a run of them, and none of paho's per-publish `MQTTMessageInfo` (with its `threading.Condition`).
        `written(count)` once the whole buffer is on the socket (at once, or when paho's write loop has
        written what the socket refused at first; never if the connection drops before)."""
        sock = self._sock
        if sock is None:
            return MQTTErrorCode.MQTT_ERR_NO_CONN
        if self._thread is None and not self._out_packet and type(sock) is socket.socket:
            # Nothing of paho's waits to go before these and no network thread writes meanwhile: one `send`
            # now. paho's path (a queued dict, its write loop, three locks, an info object with a
            # `threading.Condition`) cost 12.6 against 3.9 µs here for one publication.
            try:
                sent = sock.send(packets)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                sent = 0  # paho's write below meets the error again and handles it (closing the connection)
            if sent:
                with self._msgtime_mutex:  # what paho's write updates: the keepalive's idea of "sent"
                    self._last_msg_out = mqtt.time_func()
                if sent == len(packets):
                    if written is not None:
                        written(count)
                    return MQTTErrorCode.MQTT_ERR_SUCCESS
                packets = packets[sent:]  # the socket is full: the rest waits in paho's queue, written in order
        # One MQTTMessageInfo for the whole run: paho marks it published once the buffer is written.
        info = mqtt.MQTTMessageInfo(0) if written is None else _WrittenInfo(count, written)
        return self._packet_queue(mqtt.PUBLISH, packets, 0, 0, info)

    def send_reliable(self, messages: Sequence[ReliableMessage], taken: Callable[[list[int]], None]) -> list[int]:
        """Publish at QoS 1 or 2 the leading `messages` (topic, payload, qos, retain, properties) that may go out
        at once, as paho's `publish` would, with one `_packet_queue` call for the run; their mids, in order.
        `taken(mids)` is called before the bytes are queued, under the lock paho's acknowledgement handling
        takes (so with paho's network thread a completion cannot come first). The rest (all of them when paho
        holds messages not in flight, once `max_inflight` is reached, at a topic paho must judge) are the
        caller's to hand to `publish`, in order."""
        if self._sock is None or self._protocol != MQTTProtocolVersion.MQTTv5:
            return []
        mids: list[int] = []
        packets = bytearray()
        with self._out_message_mutex:  # what paho's `publish` holds while it registers and queues
            out = self._out_messages
            inflight = self._inflight_messages
            if len(out) != inflight:  # queued, or unsent since a reconnection: new ones go behind them
                return []
            room = len(messages)
            if self._max_inflight_messages:
                room = min(room, self._max_inflight_messages - inflight)
            if self._max_queued_messages:
                room = min(room, self._max_queued_messages - len(out))
            info = self._lean_info
            if info is None:
                info = self._lean_info = _SharedInfo(0)
            now = mqtt.time_func()
            new_message = mqtt.MQTTMessage.__new__
            waiting_for_puback = mqtt.mqtt_ms_wait_for_puback
            waiting_for_pubrec = mqtt.mqtt_ms_wait_for_pubrec
            for index in range(room):
                topic, payload, qos, retain, properties = messages[index]
                packed = properties.pack() if properties is not None else NO_PROPERTIES
                field = publishable_field(topic, payload, len(packed))
                if not field:
                    break  # paho's to judge: the caller's `publish`
                mid = self._mid_generate()
                if mid in out:
                    mid = self._free_mid(out)
                append_publish(packets, field, payload, retain, mid, qos, packed)
                message = new_message(mqtt.MQTTMessage)  # `MQTTMessage()` without its own MQTTMessageInfo
                message.mid = mid
                message._topic = field[2:]
                message.payload = payload
                message.qos = qos
                message.retain = retain
                message.dup = False
                message.properties = properties
                message.timestamp = now
                message.state = waiting_for_puback if qos == 1 else waiting_for_pubrec
                message.info = info
                out[mid] = message
                mids.append(mid)
            if mids:
                self._inflight_messages = inflight + len(mids)
                taken(mids)
                # One queued packet for the run. A failed write closes the connection; the messages stay in
                # `_out_messages` and paho sends them again (DUP) after reconnecting, as it would its own.
                self._packet_queue(mqtt.PUBLISH, packets, mids[-1], 1)
        return mids

    def _free_mid(self, out: dict[int, mqtt.MQTTMessage]) -> int:
        """The next packet id of paho's not held by a message in flight (paho's `publish` would reuse one in use)."""
        mid = self._mid_generate()
        while mid in out:  # at most len(out) ids are taken, and the broker's Receive Maximum keeps that small
            mid = self._mid_generate()
        return mid

    def restore(self, messages: Sequence[RestoredMessage]) -> None:
        """Hold `messages` (mid, topic, payload, qos, retain, properties, released) as if this client had sent
        them and not had them completed: QoS 1 waiting for PUBACK, QoS 2 for PUBREC, or for PUBCOMP when
        `released` (past PUBREC). Call it before connecting: `reconnect` then marks them to be sent again (DUP)
        and the CONNACK handler sends them, or the PUBREL, as for its own. New packet ids start after them."""
        with self._out_message_mutex:
            for mid, topic, payload, qos, retain, properties, released in messages:
                message = mqtt.MQTTMessage(mid, topic.encode("utf-8"))
                message.payload = payload
                message.qos = qos
                message.retain = retain
                message.dup = True
                message.properties = properties
                message.timestamp = mqtt.time_func()
                message.state = (mqtt.mqtt_ms_wait_for_puback if qos == 1 else
                                 mqtt.mqtt_ms_wait_for_pubcomp if released else mqtt.mqtt_ms_wait_for_pubrec)
                self._out_messages[mid] = message
                self._inflight_messages += 1
                self._last_mid = max(self._last_mid, mid)

    def send_acks(self, acks: Sequence[tuple[int, int]]) -> MQTTErrorCode:
        """Acknowledge publications received with `manual_ack`: (mid, qos) each, a PUBACK for QoS 1 and a PUBREC
        for QoS 2 (handed over at its PUBLISH: `_handle_publish`; the PUBREL is answered at once), all in one
        buffer. Not connected: nothing (the broker sends them again on the next connection, with DUP)."""
        if self._sock is None or not acks:
            return MQTTErrorCode.MQTT_ERR_NO_CONN if self._sock is None else MQTTErrorCode.MQTT_ERR_SUCCESS
        data = bytearray()
        answered = self._qos2_answered
        held = self._current_held_acks()
        for mid, qos in acks:
            if mid in answered or mid in held:
                # An earlier message with this packet id still waits for its PUBREL: the broker reused the id
                # (module docstring, "reused packet ids"). Acknowledged now, this would complete that one.
                held.setdefault(mid, deque()).append(qos)
                self.acks_held += 1
                continue
            data += bytes((0x40 if qos == 1 else 0x50, 2, mid >> 8, mid & 0xFF))  # as `_send_puback`, `_send_pubrec`
            if qos == 2:
                answered.add(mid)
        if not data:
            return MQTTErrorCode.MQTT_ERR_SUCCESS
        return self._packet_queue(mqtt.PUBACK, data, 0, 0)

    def session_started(self, session_present: bool) -> None:
        """A CONNACK: without the session, what the broker's earlier session left here is forgotten. MQTT 5 (section
        4.1.0) has a client that gets Session Present 0 discard its session state, and the QoS 2 packet ids we
        answered with PUBREC and whose PUBREL had not come are part of it: a broker restarted without persistence
        numbers its messages from 1 again, and kept, those ids made a new message with one of them wait for a
        PUBREL that never comes (its PUBREC held for ever, a slot of our Receive Maximum lost), or, sent again
        with DUP after a later reconnection, taken for a repeat and not handed over (issue 39)."""
        self.pings_answered = self.pings_sent  # a PINGREQ of the old connection is never answered
        if session_present:
            return
        self._qos2_answered.clear()
        self._held_acks.clear()
        self._held_on = self._sock

    def send_ping(self) -> int:
        """A PINGREQ now, behind what was written before it; the number its PINGRESP will bring `pings_answered`
        to, or 0 when not connected (nothing written)."""
        sock = self._sock
        if sock is None:
            return 0
        if self._thread is None and not self._out_packet and type(sock) is socket.socket:
            # Written now, as `send_qos0` writes what it follows: queued in paho's list inside one of its
            # callbacks, it would wait for the end of the read pass while what came before it is on the wire,
            # and the broker's answer would come after publications it processed later.
            try:
                sent = sock.send(PINGREQ_PACKET)
            except OSError:
                sent = 0
            if sent == len(PINGREQ_PACKET):
                self.pings_sent += 1
                return self.pings_sent
            if sent:  # one byte of two: the other must follow it (paho's queue writes it in order)
                self._packet_queue(mqtt.PINGREQ, PINGREQ_PACKET[sent:], 0, 0)
                self.pings_sent += 1
                return self.pings_sent
        if self._send_simple_command(mqtt.PINGREQ) != MQTTErrorCode.MQTT_ERR_SUCCESS:
            return 0
        self.pings_sent += 1
        return self.pings_sent

    def _send_pingreq(self) -> MQTTErrorCode:
        """paho's keepalive PINGREQ, counted: its PINGRESP comes in the same order as ours (`send_ping`)."""
        rc = super()._send_pingreq()
        if rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
            self.pings_sent += 1
        return rc

    def _handle_pingresp(self) -> MQTTErrorCode:
        rc = super()._handle_pingresp()
        if rc == MQTTErrorCode.MQTT_ERR_SUCCESS and self.pings_answered < self.pings_sent:
            self.pings_answered += 1
            hook = self.pingresp_received
            if hook is not None:
                hook(self.pings_answered)
        return rc

    def _current_held_acks(self) -> dict[int, deque[int]]:
        """The held acknowledgements of this connection: those of an earlier one are forgotten (the broker sends
        their messages again, DUP, after the PUBREL of the message before them)."""
        if self._held_on is not self._sock:
            self._held_on = self._sock
            self._held_acks.clear()
        return self._held_acks

    def _release_held(self, mid: int) -> None:
        """The PUBREL of `mid` came and its PUBCOMP is written: the acknowledgements held behind it follow, up to
        and including the next PUBREC (which waits for a PUBREL of its own)."""
        held = self._current_held_acks()
        waiting = held.get(mid)
        if not waiting:
            return
        data = bytearray()
        while waiting:
            qos = waiting.popleft()
            data += bytes((0x40 if qos == 1 else 0x50, 2, mid >> 8, mid & 0xFF))
            if qos == 2:
                self._qos2_answered.add(mid)
                break
        if not waiting:
            del held[mid]
        self._packet_queue(mqtt.PUBACK, data, 0, 0)

    def _do_on_publish(self, mid: int, reason_code: ReasonCode, properties: Properties) -> MQTTErrorCode:
        completed = self.publish_completed
        if completed is not None:
            completed(mid, reason_code.value if reason_code is not None else 0)
        return super()._do_on_publish(mid, reason_code, properties)

    def _handle_pubrec(self) -> MQTTErrorCode:
        """paho's, after telling `pubrec_received` of the first PUBREC of one of our QoS 2 messages."""
        hook = self.pubrec_received
        data = self._in_packet["packet"]
        if hook is not None and len(data) >= 2:
            mid = (data[0] << 8) | data[1]
            with self._out_message_mutex:
                message = self._out_messages.get(mid)
                first = message is not None and message.qos == 2 and message.state == mqtt.mqtt_ms_wait_for_pubrec
            if first:
                hook(mid, data[2] if len(data) > 2 else 0)
        return super()._handle_pubrec()

    def _handle_pubrel(self) -> MQTTErrorCode:
        """paho's, except that with manual acknowledgements a PUBREL for a packet id paho does not hold (every one:
        QoS 2 messages are handed over at their PUBLISH) is answered with PUBCOMP at once (module docstring)."""
        data = self._in_packet["packet"]
        if self._manual_ack and len(data) >= 2:
            mid = (data[0] << 8) | data[1]
            with self._in_message_mutex:
                held = mid in self._in_messages
            if not held:
                if mid not in self._qos2_answered:
                    self.releases_unanswered += 1
                self._qos2_answered.discard(mid)
                rc = self._send_pubcomp(mid)
                if self._held_acks:
                    self._release_held(mid)
                return rc
        return super()._handle_pubrel()

    def _send_pubrec(self, mid: int) -> MQTTErrorCode:
        """paho's, except while `_handle_publish` hands a QoS 2 message over at once: then the caller's
        acknowledgement is the PUBREC (`send_acks`)."""
        if self._deferring_pubrec:
            return MQTTErrorCode.MQTT_ERR_SUCCESS
        return super()._send_pubrec(mid)

    def _take_qos2(self) -> MQTTErrorCode:
        """A QoS 2 PUBLISH with manual acknowledgement: its PUBREC again if it is sent again (DUP) with a packet id
        we answered already (a repeat after a reconnection), else the message to `on_message` now (paho's
        decoding, no PUBREC yet). Without DUP, an id we answered is a new message under a reused id (module
        docstring): `send_acks` holds its PUBREC until the PUBREL of the one before."""
        data = self._in_packet["packet"]
        topic_end = 2 + ((data[0] << 8) | data[1]) if len(data) >= 2 else len(data)
        if topic_end + 2 > len(data):
            return super()._handle_publish()  # malformed: paho's to refuse
        mid = (data[topic_end] << 8) | data[topic_end + 1]
        if mid in self._qos2_answered and self._in_packet["command"] & 0x08:
            return super()._send_pubrec(mid)
        self._deferring_pubrec = True
        try:
            rc = super()._handle_publish()  # decodes it and keeps it in `_in_messages` for the PUBREL
        finally:
            self._deferring_pubrec = False
        with self._in_message_mutex:
            message = self._in_messages.pop(mid, None)
        if rc == MQTTErrorCode.MQTT_ERR_SUCCESS and message is not None:
            self._handle_on_message(message)
        return rc

    def _handle_publish(self) -> MQTTErrorCode:
        """A PUBLISH paho read itself (one that arrived in pieces): QoS 0/1 without properties still skip
        `MQTTMessage`."""
        lean = self.lean_publish
        packet = self._in_packet
        command = packet["command"]
        qos = (command & 0x06) >> 1
        data = packet["packet"]
        if qos == 2 and self._manual_ack:
            return self._take_qos2()
        if lean is None or qos == 2 or command & 0x08 or self._protocol != MQTTProtocolVersion.MQTTv5:
            return super()._handle_publish()  # QoS 2, a repeat (DUP: the flag must reach the caller), not v5
        topic_end = 2 + ((data[0] << 8) | data[1]) if len(data) >= 2 else len(data) + 1
        position = topic_end + (2 if qos else 0)
        if position >= len(data) or data[position] != 0 or topic_end <= 2:
            return super()._handle_publish()  # properties, or malformed
        mid = (data[topic_end] << 8) | data[topic_end + 1] if qos else 0
        lean(bytes(data[2:topic_end]), bytes(data[position + 1:]), qos, bool(command & 0x01), mid)
        if qos == 1 and not self._manual_ack:
            return self._send_puback(mid)
        return MQTTErrorCode.MQTT_ERR_SUCCESS


class PublicClient(mqtt.Client):
    """paho's client through its documented API only: what the adapter uses instead of `LeanClient` when the
    installed paho lacks one of `PAHO_PRIVATE_NAMES`. It offers the attributes and calls of `LeanClient` that
    the adapter reads with, so the adapter drives either; every PUBLISH goes to `on_message`, and the adapter
    publishes each injection with `publish` (it never calls `send_qos0`, `send_reliable` or `restore` on this
    one). paho acknowledges received publications itself here (no `manual_ack`: without `_handle_pubrel`
    a repeated PUBREL would never be answered), so `send_acks` has nothing to do, and no PUBREC reaches
    `pubrec_received`."""

    lean_publish: Callable[[bytes, bytes, int, bool, int], None] | None = None
    """never called: here every PUBLISH takes paho's path"""
    publish_completed: Callable[[int, int], None] | None = None
    """called with the mid and reason code of every publication paho reports published (`on_publish`; QoS 0
    ones too)"""
    pubrec_received: Callable[[int, int], None] | None = None
    """never called: paho's public API says nothing of PUBREC"""
    paused = False
    """set while the owner takes no publications; the adapter stops calling `read_packets` meanwhile"""

    def __init__(self, *arguments: Any, **options: Any) -> None:
        options["manual_ack"] = False
        super().__init__(*arguments, **options)

        def published(client: mqtt.Client, userdata: Any, mid: int, reason_code: ReasonCode,
                      properties: Properties) -> None:
            completed = self.publish_completed
            if completed is not None:
                completed(mid, reason_code.value if reason_code is not None else 0)

        self.on_publish = published

    pingresp_received: Callable[[int], None] | None = None
    """never called: paho's public API sends no PINGREQ on demand"""

    def send_ping(self) -> int:
        """Nothing: paho's public API has no PINGREQ on demand (0: the caller learns of no answer)."""
        return 0

    def session_started(self, session_present: bool) -> None:
        """Nothing: paho keeps a received QoS 2 message until its PUBREL and replaces it when its packet id comes
        again (it calls `on_message` at the PUBREL), so no id answered in an earlier session is taken for a repeat."""

    def send_acks(self, acks: Sequence[tuple[int, int]]) -> MQTTErrorCode:
        """Nothing: paho acknowledged them when it handed them over."""
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def buffered(self) -> int:
        """Nothing is read ahead: paho reads each packet from the socket as it parses it."""
        return 0

    def read_packets(self, limit: int) -> int:
        """paho's `loop_read`: the packets it decides to read (at least the next one, if whole; `limit` is not
        paho's to take). 1, or -1 when the connection is gone (paho has closed it and called `on_disconnect`)."""
        if self.loop_read() != MQTTErrorCode.MQTT_ERR_SUCCESS or self.socket() is None:
            return -1
        return 1
