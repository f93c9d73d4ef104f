"""`python -m suites.bench.mqtt_codec`: CPU per 64 B PUBLISH read and written, by each MQTT codec at hand.

Theory of operation: issue 41 asks for the broker link's codec to be chosen
after measuring. Each way of reading (decoding a stream of PUBLISH packets
the broker sent) and writing (building the PUBLISH packets of a run) is
timed alone, on `--count` packets of a `--payload`-byte payload on a topic
like the federation's, repeated `--repeat` times; the median is printed in
microseconds per message. CPU time of the calling thread (`time.thread_time`),
so other processes on a shared machine inflate it little.

* `ours: general`: federation/mqtt/codec.py one packet at a time (Python),
  what the session uses for anything that is not a plain run, and for
  MQTT 3.1.1.
* `ours: session`: `MqttSession.receive_data` of the whole stream (plain
  runs read by the C `parse_plain_run`, events made) and `publish_run`
  (one buffer; QoS 0 built in C, QoS 1 in Python with its flight kept).
* `paho`: paho-mqtt's own client on a loopback socket, the bench playing
  the broker: reading is `loop_read` until `on_message` has seen every
  message (paho's three `recv` calls per packet are part of its cost),
  writing is `publish` per message (one `send` each, as paho does it).
* `mqtt5`: the `mqtt5` package (Rust, MQTT 5 only; `pip install mqtt5`),
  `mqtt5.read` per packet and `PublishPacket.write` per packet, when it is
  installed; said so when it is not.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import threading
import time
from collections.abc import Callable
from importlib import import_module, metadata
from types import ModuleType

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from federation.mqtt.codec import MQTT_5, ConnAck, Publish, decode_packet, encode, encode_publish
from federation.mqtt.events import Connected
from federation.mqtt.runs import NATIVE
from federation.mqtt.session import MqttSession, SessionSettings

TOPIC = "site7/dev/{:04d}/telemetry"
TOPICS = 100
"""distinct topics the messages cycle through"""


def stream(count: int, payload: bytes, qos: int) -> bytes:
    """`count` PUBLISH packets as a broker sends them (MQTT 5, no properties)."""
    return b"".join(encode_publish(Publish(TOPIC.format(index % TOPICS), payload, qos, packet_id=index % 65535 + 1 if
                                           qos else 0), MQTT_5) for index in range(count))


def timed(work: Callable[[], object], count: int, repeat: int) -> float:
    """Median microseconds of thread CPU per message over `repeat` runs of `work` (which handles `count`)."""
    samples = []
    for _ in range(repeat):
        start = time.thread_time()
        work()
        samples.append((time.thread_time() - start) / count * 1e6)
    return statistics.median(samples)


def connected_session(qos: int) -> MqttSession:
    session = MqttSession(SessionSettings("bench", manual_ack=True, receive_maximum=65535))
    session.connect(0.0)
    session.data_to_send(0.0)
    events = session.receive_data(encode(ConnAck(False), MQTT_5), 0.0)
    assert isinstance(events[0], Connected)
    return session


def ours_read_general(data: bytes, count: int) -> Callable[[], object]:
    def work() -> None:
        pos = 0
        for _ in range(count):
            decoded = decode_packet(data, pos, MQTT_5)
            assert decoded is not None
            pos = decoded[1]
    return work


def ours_read_session(data: bytes, count: int, qos: int) -> Callable[[], object]:
    def work() -> None:
        session = connected_session(qos)
        events = session.receive_data(data, 1.0)
        assert sum(len(getattr(event, "topics", ())) for event in events) == count
    return work


def ours_write_general(payload: bytes, count: int, qos: int) -> Callable[[], object]:
    topics = [TOPIC.format(index % TOPICS) for index in range(count)]

    def work() -> None:
        for index, topic in enumerate(topics):
            encode_publish(Publish(topic, payload, qos, packet_id=index % 65535 + 1 if qos else 0), MQTT_5)
    return work


def ours_write_run(payload: bytes, count: int, qos: int) -> Callable[[], object]:
    topics = [TOPIC.format(index % TOPICS) for index in range(count)]
    payloads = [payload] * count

    def work() -> None:
        session = connected_session(qos)
        taken, _ids = session.publish_run(topics, payloads, qos)
        assert taken == min(count, 65535)
        session.data_to_send(1.0)
    return work


class FakeBroker:
    """A loopback listener that answers paho's CONNECT with a CONNACK, then sends or drains what the bench says."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.conn: socket.socket | None = None
        self._draining = False
        self._thread: threading.Thread | None = None

    def accept(self) -> socket.socket:
        conn, _address = self.listener.accept()
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            conn.setsockopt(socket.SOL_SOCKET, option, 8 << 20)
        conn.recv(65536)  # the CONNECT
        conn.sendall(encode(ConnAck(False), MQTT_5))
        self.conn = conn
        return conn

    def drain(self) -> None:
        """Read and drop everything the client writes, in a thread of its own (not the timed thread)."""
        conn = self.conn
        assert conn is not None

        def run() -> None:
            with contextlib.suppress(OSError):  # closed by `close`
                while conn.recv(1 << 20):
                    pass

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.shutdown(socket.SHUT_RDWR)
            if self._thread is not None:
                self._thread.join(5)
            self.conn.close()
        self.listener.close()


def paho_client() -> tuple[mqtt.Client, FakeBroker, list[int]]:
    broker = FakeBroker()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bench", protocol=mqtt.MQTTv5)
    received = [0]
    client.on_message = lambda _c, _u, _m: received.__setitem__(0, received[0] + 1)
    client.max_inflight_messages_set(0)  # no limit: every publish is written at once, as the wrapper sets it
    client.max_queued_messages_set(0)
    accepting = threading.Thread(target=broker.accept)
    accepting.start()
    client.connect("127.0.0.1", broker.port)
    accepting.join()
    deadline = time.monotonic() + 5
    while not client.is_connected():
        if time.monotonic() > deadline:
            raise RuntimeError("paho did not connect to the bench's fake broker")
        client.loop(0.01)
    sock = client.socket()
    assert isinstance(sock, socket.socket)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    return client, broker, received


def paho_read(data: bytes, count: int, repeat: int) -> float:
    client, broker, received = paho_client()
    assert broker.conn is not None
    samples = []
    try:
        for _ in range(repeat):
            received[0] = 0
            broker.conn.sendall(data)
            start = time.thread_time()
            while received[0] < count:
                client.loop_read(count)
            samples.append((time.thread_time() - start) / count * 1e6)
    finally:
        client.disconnect()
        broker.close()
    return statistics.median(samples)


def paho_write(payload: bytes, count: int, qos: int, repeat: int) -> float:
    topics = [TOPIC.format(index % TOPICS) for index in range(count)]
    samples = []
    for _ in range(repeat):  # a new client each run: QoS 1 messages stay in paho's flight (never acknowledged)
        client, broker, _received = paho_client()
        broker.drain()
        try:
            start = time.thread_time()
            for topic in topics:
                client.publish(topic, payload, qos)
            samples.append((time.thread_time() - start) / count * 1e6)
        finally:
            client.disconnect()
            broker.close()
    return statistics.median(samples)


def mqtt5_module() -> ModuleType | None:
    try:
        return import_module("mqtt5")
    except ImportError:
        return None


def mqtt5_read(module: ModuleType, data: bytes, count: int) -> Callable[[], object]:
    view = memoryview(data)

    def work() -> None:
        pos = 0
        read = module.read
        for _ in range(count):
            _packet, size = read(view[pos:])
            pos += size
    return work


def mqtt5_write(module: ModuleType, payload: bytes, count: int, qos: int) -> Callable[[], object]:
    topics = [TOPIC.format(index % TOPICS) for index in range(count)]
    packet = module.PublishPacket
    level = module.QoS(qos)

    def work() -> None:
        for index, topic in enumerate(topics):
            packet(topic, payload, qos=level, packet_id=index % 65535 + 1 if qos else None).write()
    return work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suites.bench.mqtt_codec", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--count", type=int, default=20000, help="messages per run (default 20000)")
    parser.add_argument("--payload", type=int, default=64, help="payload bytes (default 64)")
    parser.add_argument("--repeat", type=int, default=7, help="runs per figure; the median is printed (default 7)")
    options = parser.parse_args(argv)
    count, repeat = options.count, options.repeat
    payload = bytes(options.payload)
    module = mqtt5_module()
    print(f"CPU per message (µs, median of {repeat} runs of {count}), {options.payload} B payload, topic like "
          f"{TOPIC.format(7)!r}; C extension built: {NATIVE}; paho-mqtt {metadata.version('paho-mqtt')}; mqtt5 "
          + (metadata.version("mqtt5") if module is not None else "not installed (pip install mqtt5)"))
    print(f"{'codec':<18} {'read QoS 0':>11} {'read QoS 1':>11} {'write QoS 0':>12} {'write QoS 1':>12}")
    rows: list[tuple[str, list[float]]] = []
    streams = {qos: stream(count, payload, qos) for qos in (0, 1)}
    rows.append(("ours: general", [timed(ours_read_general(streams[qos], count), count, repeat) for qos in (0, 1)]
                 + [timed(ours_write_general(payload, count, qos), count, repeat) for qos in (0, 1)]))
    rows.append(("ours: session", [timed(ours_read_session(streams[qos], count, qos), count, repeat) for qos in (0, 1)]
                 + [timed(ours_write_run(payload, count, qos), count, repeat) for qos in (0, 1)]))
    rows.append(("paho", [paho_read(streams[qos], count, repeat) for qos in (0, 1)]
                 + [paho_write(payload, count, qos, repeat) for qos in (0, 1)]))
    if module is not None:
        rows.append(("mqtt5 (Rust)", [timed(mqtt5_read(module, streams[qos], count), count, repeat) for qos in (0, 1)]
                     + [timed(mqtt5_write(module, payload, count, qos), count, repeat) for qos in (0, 1)]))
    for name, figures in rows:
        print(f"{name:<18} " + " ".join(f"{figure:>11.2f} " for figure in figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
