"""The two ends of a numbered stream: a paced publisher that records acknowledgements, a persistent subscriber.

Theory of operation: "lost" only means something for a publication the broker
acknowledged, so the publisher must be a client that waits for its
acknowledgements and says which came back (`mosquitto_pub -l` may stop
before every acknowledgement has arrived: shared/reference). `PacedPublisher`
is a paho-mqtt MQTT v5 client in its own network thread; a pacing thread
publishes 1, 2, 3, ... (the payload is the number in ASCII) at a steady rate,
on schedule from the start (a publication that is late goes at once, so the
offered rate holds on average), and keeps paho's `MQTTMessageInfo` of each:
paho marks it published when the PUBACK (QoS 1) or PUBCOMP (QoS 2) arrives.
Its session persists (clean start off, an hour's session expiry), so paho
resends what was in flight if its connection drops.

`StreamSubscriber` is Mosquitto's own `mosquitto_sub`, with a fixed client
id and a persistent session (`-c`: MQTT 3.1.1 clean session off, or MQTT v5
with `-x` session expiry), subscribed at the stream's QoS, printing each
message as `<receive time> <payload>` (`-F '%U %p'`) into a file. It
reconnects by itself when its broker restarts and subscribes again on every
connection (so a broker that lost its session gets the subscription back).
What it printed is what the suite judges (`counting`).

Both run as children of the calling process only through their own
threads (paho) or process (mosquitto_sub, its own process group, SIGTERM if
this process dies); `close` ends them.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from federation.daemon.lean_client import stop_network_thread
from federation.harness.processes import LaunchError, die_with_parent, poll
from suites.faults.counting import Arrival, parse_output

CONNECT_TIMEOUT = 10.0
"""seconds a client gets to connect to its broker"""
SESSION_EXPIRY = 3600
"""seconds the broker keeps a stream client's session after a disconnection"""
SUBSCRIBER_STOP_TIMEOUT = 5.0


class PacedPublisher:
    """Publishes 1, 2, 3, ... on `topic` at `rate` per second (None: a burst, as fast as paho takes them),
    until stopped or `count` are published; see the module docstring."""

    def __init__(self, host: str, port: int, topic: str, qos: int, rate: float | None, client_id: str,
                 count: int | None = None) -> None:
        if qos not in (1, 2):
            raise ValueError(f"qos {qos}: the streams are QoS 1 or 2")
        if rate is not None and rate <= 0:
            raise ValueError(f"rate {rate}: must be positive")
        if rate is None and count is None:
            raise ValueError("a burst (rate None) needs a count")
        self.host, self.port, self.topic, self.qos, self.rate = host, port, topic, qos, rate
        self.count = count
        self.client_id = client_id
        self.infos: list[mqtt.MQTTMessageInfo] = []
        self.published_at: list[float] = []
        """unix time each was handed to paho (a latency's start)"""
        self.refused = 0
        """acknowledgements with a failure reason code"""
        self.connects = 0
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._thread: threading.Thread | None = None
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish

    def connect(self) -> None:
        """Connect (clean start off, persistent session) and start paho's network thread; LaunchError on failure."""
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = SESSION_EXPIRY
        try:
            self.client.connect(self.host, self.port, keepalive=30, clean_start=False, properties=properties)
        except OSError as error:
            raise LaunchError(f"publisher {self.client_id}: cannot connect to {self.host}:{self.port}: {error}") \
                from None
        self.client.loop_start()
        if not self._connected.wait(CONNECT_TIMEOUT):
            self.close()
            raise LaunchError(f"publisher {self.client_id}: no CONNACK from {self.host}:{self.port} within "
                              f"{CONNECT_TIMEOUT:g} s")

    def start(self) -> None:
        """Start publishing (the pacing thread)."""
        self._thread = threading.Thread(target=self._pace, name=f"publisher-{self.client_id}", daemon=True)
        self.started_at = time.time()
        self._thread.start()

    def stop(self) -> None:
        """Stop publishing (what is in flight still gets its acknowledgement)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.stopped_at is None:
            self.stopped_at = time.time()

    @property
    def sent(self) -> int:
        with self._lock:
            return len(self.infos)

    def acknowledged(self) -> list[int]:
        """Sequence numbers whose acknowledgement arrived."""
        with self._lock:
            infos = list(self.infos)
        return [seq for seq, info in enumerate(infos, start=1) if info.is_published()]

    def wait_published(self, timeout: float) -> bool:
        """With a `count`: wait until all are handed to paho; False if not after `timeout` s (True without one)."""
        if self.count is None:
            return True
        count = self.count
        try:
            poll(lambda: self.sent >= count, timeout, "publications", interval=0.05)
        except LaunchError:
            return False
        return True

    def wait_acknowledged(self, timeout: float) -> bool:
        """Wait until every publication sent is acknowledged; False if some are not after `timeout` s."""
        try:
            poll(lambda: len(self.acknowledged()) >= self.sent, timeout, "acknowledgements", interval=0.05)
        except LaunchError:
            return False
        return True

    def payload(self, seq: int) -> bytes:
        """What publication `seq` carries: its number in ASCII."""
        return str(seq).encode()

    def latencies(self, arrivals: list[Arrival]) -> list[float]:
        """Seconds from each publication's hand-over to paho to its first arrival (those that arrived)."""
        with self._lock:
            published = list(self.published_at)
        first: dict[int, float] = {}
        for arrival in arrivals:
            first.setdefault(arrival.seq, arrival.received)
        return [received - published[seq - 1] for seq, received in first.items() if 0 < seq <= len(published)]

    def close(self) -> None:
        self.stop()
        with contextlib.suppress(Exception):  # closing must not fail, whatever state paho is in
            self.client.disconnect()
        stop_network_thread(self.client)

    def _pace(self) -> None:
        assert self.started_at is not None
        start = time.monotonic()
        seq = 0
        while not self._stop.is_set() and (self.count is None or seq < self.count):
            seq += 1
            info = self.client.publish(self.topic, self.payload(seq), qos=self.qos)
            with self._lock:
                self.infos.append(info)
                self.published_at.append(time.time())
            if self.rate is not None:
                self._stop.wait(max(0.0, start + seq / self.rate - time.monotonic()))

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: ReasonCode,
                    properties: Any) -> None:
        if not reason_code.is_failure:
            self.connects += 1
            sock = client.socket()
            if isinstance(sock, socket.socket):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._connected.set()

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: ReasonCode,
                       properties: Any) -> None:
        self._connected.clear()

    def _on_publish(self, client: mqtt.Client, userdata: Any, mid: int, reason_code: ReasonCode,
                    properties: Any) -> None:
        if reason_code.is_failure:
            with self._lock:
                self.refused += 1


def mosquitto_sub_command(host: str, port: int, topic: str, qos: int, client_id: str, protocol: str) -> list[str]:
    """The `mosquitto_sub` command line of a persistent stream subscriber (`protocol`: "mqttv311" or "mqttv5")."""
    executable = shutil.which("mosquitto_sub") or "/usr/bin/mosquitto_sub"
    command = [executable, "-h", host, "-p", str(port), "-i", client_id, "-t", topic, "-q", str(qos), "-c",
               "-V", protocol, "-F", "%U %p", "--nodelay"]
    if protocol == "mqttv5":
        command += ["-x", str(SESSION_EXPIRY)]
    elif protocol != "mqttv311":
        raise ValueError(f"protocol {protocol!r}: mqttv311 or mqttv5")
    return command


class StreamSubscriber:
    """`mosquitto_sub` with a persistent session, printing `%U %p` per message; see the module docstring."""

    def __init__(self, host: str, port: int, topic: str, qos: int, client_id: str, output: Path,
                 protocol: str = "mqttv311") -> None:
        self.client_id = client_id
        self.topic = topic
        self.output = output
        self.errors = output.with_suffix(".err")
        self.command = mosquitto_sub_command(host, port, topic, qos, client_id, protocol)
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._stopped = False

    def start(self) -> None:
        self._stopped = False
        with open(self.output, "ab") as sink, open(self.errors, "ab") as errors:
            self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=sink, stderr=errors,
                                            process_group=0, preexec_fn=die_with_parent)

    def restart_if_exited(self) -> bool:
        """Start it again (same client id, so the same session, output appended) if it exited without being
        stopped: mosquitto_sub reconnects after a lost connection by itself but exits on a protocol error,
        where an application would reconnect. True if it was restarted."""
        if self._stopped or self.process is None or self.process.poll() is None:
            return False
        self.restarts += 1
        self.start()
        return True

    def last_error(self) -> str:
        """The last line mosquitto_sub wrote to its standard error (empty if none)."""
        try:
            lines = self.errors.read_text(errors="replace").strip().splitlines()
        except FileNotFoundError:
            return ""
        return lines[-1] if lines else ""

    def raw(self) -> bytes:
        try:
            return self.output.read_bytes()
        except FileNotFoundError:
            return b""

    def arrivals(self) -> list[Arrival]:
        return parse_output(self.raw())

    def has_line_containing(self, text: bytes) -> bool:
        return any(line.partition(b" ")[2] == text for line in self.raw().split(b"\n"))

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM (mosquitto_sub disconnects cleanly and its session stays), SIGKILL after a timeout."""
        self._stopped = True
        process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(SUBSCRIBER_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
