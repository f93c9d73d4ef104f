"""federation.mqtt's session against a real Mosquitto and against paho, in the same scenarios.

Each scenario is played twice through a recording TCP proxy in front of one broker: once by paho (its own
loop, driven here), once by the session over a plain socket; a paho peer on the broker publishes to it and
counts what it publishes. What each wrote to the broker is compared packet for packet (decoded with the
codec; packet ids renumbered in order of first use, because paho spends one on every QoS 0 publish too), and
what the peer received is compared count for count. Where the session departs from paho on purpose (a
CONNACK without the session), the test says so and checks both.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from federation.mqtt.codec import (
    MQTT_5,
    MQTT_311,
    PUBREL,
    Ack,
    Packet,
    Publish,
    Subscribe,
    SubscriptionOptions,
    decode_all,
)
from federation.mqtt.events import Completed, Connected, Event, Message, MessageRun, PingAnswered, Subscribed
from federation.mqtt.session import MqttSession, SessionSettings, State

from broker_util import Broker, requires_mosquitto, start_broker, wait_for

pytestmark = requires_mosquitto

HOST = "127.0.0.1"
DEADLINE = 10.0


# ------------------------------------------------------------------ a recording proxy


class RecordingProxy:
    """Forwards one client's connections to the broker, recording what the client wrote on each; `mute` loses what
    the broker writes on the current one from then on, `cut` closes it abruptly (a lost connection)."""

    def __init__(self, broker_port: int) -> None:
        self.broker_port = broker_port
        self.listener = socket.create_server((HOST, 0))
        self.port: int = self.listener.getsockname()[1]
        self.streams: list[bytearray] = []
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._muted = -1
        self.ended: list[bool] = []
        """per connection: one side closed it (everything the client wrote before is recorded)"""
        self._stopping = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ)
        deadline = time.monotonic() + 120  # bounded: a test takes seconds
        while not self._stopping and time.monotonic() < deadline:
            for key, _mask in selector.select(0.05):
                sock = key.fileobj
                if sock is self.listener:
                    client, _address = self.listener.accept()
                    upstream = socket.create_connection((HOST, self.broker_port))
                    stream = bytearray()
                    self.streams.append(stream)
                    self._pairs.append((client, upstream))
                    index = len(self._pairs) - 1
                    self.ended.append(False)
                    selector.register(client, selectors.EVENT_READ, (upstream, stream, index))
                    selector.register(upstream, selectors.EVENT_READ, (client, None, index))
                    continue
                other, record, index = key.data
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(65536)
                    if data and (record is not None or index != self._muted):
                        other.sendall(data)
                except OSError:
                    data = b""
                if not data:
                    self.ended[index] = True
                    for each in (sock, other):
                        if each.fileno() >= 0:
                            selector.unregister(each)
                            each.close()
                    continue
                if record is not None:
                    record += data
        selector.close()

    def mute(self) -> None:
        """From now on, what the broker writes on the current connection is lost on the way."""
        self._muted = len(self._pairs) - 1

    def cut(self) -> None:
        """Close the current connection on both sides, as a network would lose it."""
        client, upstream = self._pairs[-1]
        for sock in (client, upstream):
            with contextlib.suppress(OSError):  # closed by the broker already
                sock.shutdown(socket.SHUT_RDWR)

    def packets(self, connection: int, protocol: int) -> list[Packet]:
        """What the client wrote on a connection, once it has ended."""
        wait_for(lambda: self.ended[connection], DEADLINE, message=f"connection {connection} through the proxy to end")
        return decode_all(bytes(self.streams[connection]), protocol)

    def close(self) -> None:
        self._stopping = True
        self._thread.join(5)
        self.listener.close()
        for pair in self._pairs:
            for sock in pair:
                sock.close()


def renumbered(packets: list[Packet]) -> list[Packet]:
    """What a client wrote, with its own packet ids (PUBLISH, SUBSCRIBE, PUBREL) numbered 1, 2, ... in order of first
    use; those of its PUBACK, PUBREC and PUBCOMP are the broker's, kept."""
    numbers: dict[int, int] = {}

    def number(packet_id: int) -> int:
        return numbers.setdefault(packet_id, len(numbers) + 1)

    result: list[Packet] = []
    for packet in packets:
        if (isinstance(packet, Publish) and packet.qos) or isinstance(packet, Subscribe) \
                or (isinstance(packet, Ack) and packet.kind == PUBREL):
            packet = replace(packet, packet_id=number(packet.packet_id))
        result.append(packet)
    return result


# ------------------------------------------------------------------ the two clients, driven the same way


@dataclass
class Options:
    protocol: int = MQTT_5
    clean_start: bool = False
    session_expiry: int = 60
    receive_maximum: int = 10


@dataclass
class Side:
    """What a client under test reports, whichever it is."""

    received: list[tuple[str, bytes, int]] = field(default_factory=list)
    completed: int = 0
    connacks: list[bool] = field(default_factory=list)
    subacks: int = 0


class PahoSide(Side):
    def __init__(self, client_id: str, options: Options) -> None:
        super().__init__()
        self.client_id = client_id
        self.options = options
        v5 = options.protocol == MQTT_5
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
                                  clean_session=None if v5 else options.clean_start)
        self.client.on_message = lambda _c, _u, message: self.received.append(
            (message.topic, bytes(message.payload), message.qos))
        self.client.on_publish = lambda _c, _u, mid, *_rest: self._published(mid)
        self.client.on_connect = lambda _c, _u, flags, *_rest: self.connacks.append(bool(flags.session_present))
        self.client.on_subscribe = lambda *_args: setattr(self, "subacks", self.subacks + 1)
        self.reliable: set[int] = set()

    def _published(self, mid: int) -> None:
        if mid in self.reliable:
            self.completed += 1

    def connect(self, port: int) -> None:
        properties = None
        if self.options.protocol == MQTT_5:
            properties = PahoProperties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = self.options.session_expiry
            properties.ReceiveMaximum = self.options.receive_maximum
            self.client.connect(HOST, port, keepalive=30, clean_start=self.options.clean_start, properties=properties)
        else:
            self.client.connect(HOST, port, keepalive=30)
        count = len(self.connacks)
        self.wait(lambda: len(self.connacks) > count, "CONNACK")

    def reconnect(self) -> None:
        count = len(self.connacks)
        self.client.reconnect()
        self.wait(lambda: len(self.connacks) > count, "CONNACK after reconnecting")

    def notice_loss(self) -> None:
        self.wait(lambda: self.client.socket() is None, "paho to see the connection closed")

    def subscribe(self, topic_filter: str, qos: int) -> None:
        count = self.subacks
        if self.options.protocol == MQTT_5:
            self.client.subscribe(topic_filter, options=SubscribeOptions(qos=qos, noLocal=True))
        else:
            self.client.subscribe(topic_filter, qos)
        self.wait(lambda: self.subacks > count, "SUBACK")

    def publish(self, topic: str, payload: bytes, qos: int) -> None:
        info = self.client.publish(topic, payload, qos)  # written at once: no network thread
        if qos:
            self.reliable.add(info.mid)

    def pump(self) -> None:
        self.client.loop(0.02)

    def wait(self, predicate: Callable[[], object], what: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while not predicate():
            assert time.monotonic() < deadline, f"paho: no {what} within {DEADLINE} s"
            self.pump()

    def disconnect(self) -> None:
        self.client.disconnect()
        self.client.loop(0.02)


class SessionSide(Side):
    def __init__(self, client_id: str, options: Options, manual_ack: bool = False) -> None:
        super().__init__()
        self.client_id = client_id
        self.options = options
        self.session = MqttSession(SessionSettings(
            client_id, protocols=(options.protocol,), keepalive=30, clean_start=options.clean_start,
            session_expiry=options.session_expiry if options.protocol == MQTT_5 else 0,
            receive_maximum=options.receive_maximum, manual_ack=manual_ack))
        self.sock: socket.socket | None = None
        self.events: list[Event] = []
        self.port = 0

    def connect(self, port: int) -> None:
        self.port = port
        self.sock = socket.create_connection((HOST, port))
        self.session.connect(time.monotonic())
        self.flush()
        count = len(self.connacks)
        self.wait(lambda: len(self.connacks) > count, "CONNACK")

    def reconnect(self) -> None:
        self.connect(self.port)

    def notice_loss(self) -> None:
        self.wait(lambda: self.sock is None, "the connection to close")

    def flush(self) -> None:
        data = self.session.data_to_send(time.monotonic())
        if data and self.sock is not None:
            self.sock.sendall(data)

    def pump(self) -> None:
        sock = self.sock
        assert sock is not None
        sock.settimeout(0.02)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            data = None
        except OSError:
            data = b""
        if data == b"":  # closed
            sock.close()
            self.sock = None
            self.session.connection_lost()
            return
        now = time.monotonic()
        events = self.session.receive_data(data, now) if data else []
        events += self.session.handle_timer(now)
        self.events += events
        for event in events:
            if isinstance(event, Connected):
                self.connacks.append(event.session_present)
            elif isinstance(event, Subscribed):
                self.subacks += 1
            elif isinstance(event, Completed):
                self.completed += len(event.packet_ids)
            elif isinstance(event, MessageRun):
                self.received += [(topic, payload, event.qos) for topic, payload in zip(event.topics, event.payloads,
                                                                                         strict=True)]
            elif isinstance(event, Message):
                self.received.append((event.topic, event.payload, event.qos))
        self.flush()

    def wait(self, predicate: Callable[[], object], what: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while not predicate():
            assert time.monotonic() < deadline, f"session: no {what} within {DEADLINE} s; events {self.events[-5:]}"
            self.pump()

    def subscribe(self, topic_filter: str, qos: int) -> None:
        count = self.subacks
        self.session.subscribe([(topic_filter, SubscriptionOptions(qos, no_local=self.options.protocol == MQTT_5))])
        self.flush()
        self.wait(lambda: self.subacks > count, "SUBACK")

    def publish(self, topic: str, payload: bytes, qos: int) -> None:
        self.session.publish(topic, payload, qos)
        self.flush()

    def disconnect(self) -> None:
        self.session.disconnect()
        self.flush()
        assert self.sock is not None
        self.sock.close()
        self.sock = None
        self.session.connection_lost()


class Peer:
    """A plain paho client on the broker itself (its own network thread): publishes, and counts what it gets."""

    def __init__(self, port: int, topic_filter: str) -> None:
        self.received: list[tuple[str, bytes, int]] = []
        self.acknowledged: set[int] = set()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="peer", protocol=mqtt.MQTTv5)
        self.client.on_message = lambda _c, _u, message: self.received.append(
            (message.topic, bytes(message.payload), message.qos))
        self.client.on_publish = lambda _c, _u, mid, *_rest: self.acknowledged.add(mid)
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *_args: subscribed.set()
        self.client.connect(HOST, port)
        self.client.loop_start()
        self.client.subscribe(topic_filter, 2)
        assert subscribed.wait(DEADLINE), "the peer's SUBACK"

    def publish(self, topic: str, payload: bytes, qos: int) -> int:
        return self.client.publish(topic, payload, qos).mid

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with start_broker(tmp_path, extra_conf_lines=["max_inflight_messages 4"]) as running:
        yield running


@pytest.fixture
def closing() -> Iterator[list[Any]]:
    """Things to close after the test, also on failure."""
    things: list[Any] = []
    yield things
    for thing in reversed(things):
        thing.close()


def forget_session(port: int, client_id: str) -> None:
    """A clean start with no expiry: the broker forgets what an earlier scenario left under `client_id`."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    client.connect(HOST, port, clean_start=True)
    client.disconnect()


def play(make: Callable[[], PahoSide | SessionSide], broker: Broker, closing: list[Any],
         scenario: Callable[[PahoSide | SessionSide, Peer, RecordingProxy], None]) -> tuple[RecordingProxy, Peer]:
    side = make()
    forget_session(broker.port, side.client_id)
    proxy = RecordingProxy(broker.port)
    closing.append(proxy)
    peer = Peer(broker.port, "out/#")
    closing.append(peer)
    scenario(side, peer, proxy)
    return proxy, peer


# ------------------------------------------------------------------ the scenarios


def both_ways(side: PahoSide | SessionSide, peer: Peer, proxy: RecordingProxy) -> None:
    """Connect, subscribe, publish at QoS 0, 1 and 2, receive at QoS 0, 1 and 2, disconnect."""
    side.connect(proxy.port)
    side.subscribe("in/#", 2)
    for qos in (0, 1, 2):
        side.publish(f"out/{qos}", b"to the peer %d" % qos, qos)
    side.wait(lambda: side.completed == 2, "completion of the QoS 1 and 2 publications")
    wait_for(lambda: len(peer.received) == 3, DEADLINE, message="the peer to get all three")
    for qos in (0, 1, 2):
        peer.publish(f"in/{qos}", b"from the peer %d" % qos, qos)
    side.wait(lambda: len(side.received) == 3, "all three of the peer's publications")
    side.wait(lambda: proxy.streams[-1][-4:-2] == b"\x70\x02", "the PUBCOMP")
    side.disconnect()


@pytest.mark.parametrize("protocol", [MQTT_5, MQTT_311], ids=["mqtt5", "mqtt311"])
def test_connect_subscribe_and_every_qos_both_ways_packet_for_packet(broker: Broker, closing: list[Any],
                                                                    protocol: int) -> None:
    options = Options(protocol=protocol, clean_start=True)
    paho_proxy, paho_peer = play(lambda: PahoSide("paho", options), broker, closing, both_ways)
    ours_proxy, ours_peer = play(lambda: SessionSide("paho", options), broker, closing, both_ways)
    theirs = renumbered(paho_proxy.packets(0, protocol))
    ours = renumbered(ours_proxy.packets(0, protocol))
    assert ours == theirs
    assert [type(packet).__name__ for packet in ours][:3] == ["Connect", "Subscribe", "Publish"]
    assert ours_peer.received == paho_peer.received == [(f"out/{qos}", b"to the peer %d" % qos, qos)
                                                        for qos in (0, 1, 2)]


def resumed(side: PahoSide | SessionSide, peer: Peer, proxy: RecordingProxy) -> None:
    """QoS 2, 2, 1, 1 published and processed by the broker (the peer has the QoS 1 ones, which the broker handled
    after the QoS 2 ones), the connection lost before the client read any acknowledgement, then a reconnection with
    the session: everything is sent again (DUP, in order) and completed."""
    side.connect(proxy.port)
    proxy.mute()  # the client reads none of the broker's acknowledgements
    for name, qos in (("a", 2), ("b", 2), ("c", 1), ("d", 1)):
        side.publish(f"out/{name}", name.encode(), qos)
    wait_for(lambda: sum(1 for topic, _payload, _qos in peer.received if topic in ("out/c", "out/d")) == 2,
             DEADLINE, message="the broker to process all four")
    proxy.cut()
    side.notice_loss()
    side.reconnect()
    assert side.connacks == [False, True]
    side.wait(lambda: side.completed == 4, "completion of all four")
    wait_for(lambda: len(peer.received) >= 6, DEADLINE, message="the peer to get the QoS 2 ones and the repeats")
    side.disconnect()


def test_a_resumed_session_sends_its_flights_again_as_paho_does(broker: Broker, closing: list[Any]) -> None:
    paho_proxy, paho_peer = play(lambda: PahoSide("resume", Options()), broker, closing, resumed)
    ours_proxy, ours_peer = play(lambda: SessionSide("resume", Options()), broker, closing, resumed)
    theirs = renumbered(paho_proxy.packets(1, MQTT_5))
    ours = renumbered(ours_proxy.packets(1, MQTT_5))
    assert ours == theirs
    assert [(packet.topic, packet.dup) for packet in ours if isinstance(packet, Publish)] == [
        ("out/a", True), ("out/b", True), ("out/c", True), ("out/d", True)]

    def counts(peer: Peer) -> dict[str, int]:
        return {name: sum(1 for topic, _payload, _qos in peer.received if topic == f"out/{name}") for name in "abcd"}

    # QoS 2 exactly once; QoS 1 at least once (Mosquitto delivers a DUP PUBLISH at QoS 1 again)
    assert counts(ours_peer) == counts(paho_peer) == {"a": 1, "b": 1, "c": 2, "d": 2}


def test_a_session_lost_hands_its_flights_back_where_paho_sends_them_again(tmp_path: Path,
                                                                           closing: list[Any]) -> None:
    """A broker restarted without persistence answers session present 0: the session hands its unfinished
    publications back (`Connected.abandoned`) and sends none of them; paho sends them again with DUP, which the
    new session takes as new messages (and a PUBREL of one past PUBREC would be answered "done" for a message
    never delivered: why the wrapper's injector takes them back from paho, federation/daemon/injector.py)."""
    with start_broker(tmp_path) as broker:
        sides: dict[str, tuple[PahoSide | SessionSide, RecordingProxy]] = {}
        for name, side in (("paho", PahoSide("lost-paho", Options())),
                           ("session", SessionSide("lost-ours", Options()))):
            proxy = RecordingProxy(broker.port)
            closing.append(proxy)
            side.connect(proxy.port)
            proxy.mute()  # the PUBACK never reaches the client: the publication stays in flight
            side.publish("out/x", b"x", 1)
            sides[name] = (side, proxy)
        broker.restart()
        for side, proxy in sides.values():
            proxy.cut()
            side.notice_loss()
            side.reconnect()
            assert side.connacks == [False, False]
        paho_side = sides["paho"][0]
        paho_side.wait(lambda: paho_side.completed == 1, "the completion of paho's publication sent again")
        for side, _proxy in sides.values():
            side.disconnect()
    paho_proxy = sides["paho"][1]
    ours, ours_proxy = sides["session"]
    assert [type(packet).__name__ for packet in paho_proxy.packets(1, MQTT_5)] == ["Connect", "Publish", "Disconnect"]
    assert [type(packet).__name__ for packet in ours_proxy.packets(1, MQTT_5)] == ["Connect", "Disconnect"]
    assert isinstance(ours, SessionSide)
    connected = [event for event in ours.events if isinstance(event, Connected)][-1]
    assert [(message.topic, message.payload, message.qos) for message in connected.abandoned] == [("out/x", b"x", 1)]
    assert ours.session.in_flight() == () and ours.session.state is State.IDLE  # disconnected, nothing kept


def test_flow_control_by_receive_maximum_both_ways(broker: Broker, closing: list[Any]) -> None:
    """The broker's Receive Maximum (max_inflight_messages 4) bounds what the session has in flight; ours (5) bounds
    what the broker sends us unacknowledged. Counted at the subscribers: every message once, in order. (paho is not
    compared here: its in-flight limit is its own setting, not the broker's Receive Maximum.)"""
    proxy = RecordingProxy(broker.port)
    closing.append(proxy)
    peer = Peer(broker.port, "out/#")
    closing.append(peer)
    side = SessionSide("flow", Options(receive_maximum=5), manual_ack=True)
    side.connect(proxy.port)
    session = side.session
    assert [event for event in side.events if isinstance(event, Connected)][0].receive_maximum == 4
    payloads = [b"%d" % number for number in range(20)]
    sent = 0
    most_in_flight = 0
    while sent < len(payloads):
        taken, _ids = session.publish_run(["out/flow"] * (len(payloads) - sent), payloads[sent:], qos=1)
        sent += taken
        most_in_flight = max(most_in_flight, len(session.in_flight()))
        side.flush()
        side.pump()
    side.wait(lambda: side.completed == 20, "completion of all 20")
    assert most_in_flight == 4
    wait_for(lambda: len(peer.received) == 20, DEADLINE, message="the peer to get all 20")
    assert [payload for _topic, payload, _qos in peer.received] == payloads

    side.subscribe("in/#", 1)
    mids = [peer.publish("in/flow", payload, 1) for payload in payloads]
    wait_for(lambda: peer.acknowledged >= set(mids), DEADLINE, message="the broker to take all 20 from the peer")
    # A PINGRESP comes after everything the broker wrote before it: what it would send us now has come.
    number = session.ping(time.monotonic())
    side.flush()
    side.wait(lambda: any(isinstance(event, PingAnswered) and event.number == number for event in side.events),
              "the PINGRESP")
    assert len(side.received) == 5  # our Receive Maximum: the broker waits for acknowledgements
    # Each acknowledgement of everything read lets more come. Mosquitto 2.0.11 then sends past our Receive Maximum
    # ("fixes around inflight quota management" came in 2.0.13): the session counts, and does not disconnect for it.
    acknowledged = 0
    past_our_maximum = 0
    while len(side.received) < 20:
        received = [packet_id for event in side.events if isinstance(event, MessageRun)
                    for packet_id in event.packet_ids]
        past_our_maximum += max(0, len(received) - acknowledged - 5)
        session.acknowledge([(packet_id, 1) for packet_id in received[acknowledged:]])
        acknowledged = len(received)
        side.flush()
        side.wait(lambda count=acknowledged: len(side.received) > count, "more after acknowledging")
    past_our_maximum += max(0, len(side.received) - acknowledged - 5)
    assert [payload for _topic, payload, _qos in side.received] == payloads
    assert session.counts.receive_maximum_exceeded == past_our_maximum
    side.disconnect()
