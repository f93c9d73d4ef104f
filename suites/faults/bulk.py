"""The bulk flood: large publications at a high rate beside the plain streams, counted at a subscriber of their own.

Theory of operation: issue 37's case is publications above `bulk_threshold`
(64 KiB, so each crosses every hop as a bulk transfer: docs/protocol.md
"Bulk transfers") at hundreds a second, beside the suite's plain QoS 1 and
2 streams. What it asks: every large one arrives (QoS 1: at least once, in
order), the plain streams beside them are never starved (their latency
stays low), and memory stays bounded end to end, the brokers included (the
processes' peak resident size, `VmHWM`, read when the case ends).

`BulkPublisher` is the suite's `PacedPublisher` whose payload is the
sequence number, a space and padding up to `size` bytes; `BulkSubscriber`
is a paho client with a persistent session (MQTT 3.1.1, clean session off)
that writes `<receive time> <sequence number>` per message to a file, in the
format `mosquitto_sub -F '%U %p'` gives the plain streams (the payloads
themselves would be gigabytes of output), so `counting` judges it the same
way.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from federation.daemon.lean_client import stop_network_thread
from federation.harness.processes import LaunchError
from suites.faults.clients import CONNECT_TIMEOUT, PacedPublisher
from suites.faults.counting import Arrival, parse_output


@dataclass(frozen=True)
class BulkLoad:
    """Publications of `size` bytes at `rate` per second for `seconds`, from the stream's start."""

    rate: float = 500.0
    size: int = 100_000
    seconds: float = 4.0

    def to_json(self) -> dict[str, Any]:
        return {"rate": self.rate, "size": self.size, "seconds": self.seconds}


class BulkPublisher(PacedPublisher):
    """A `PacedPublisher` of `size`-byte payloads, `count` of them; see the module docstring."""

    def __init__(self, host: str, port: int, topic: str, load: BulkLoad, client_id: str) -> None:
        super().__init__(host, port, topic, 1, load.rate, client_id, count=int(load.rate * load.seconds))
        self.size = load.size

    def payload(self, seq: int) -> bytes:
        head = b"%d " % seq
        return head + b"x" * max(0, self.size - len(head))


class BulkSubscriber:
    """A paho subscriber that writes `<receive time> <sequence number>` per message; see the module docstring."""

    def __init__(self, host: str, port: int, topic: str, client_id: str, output: Path) -> None:
        self.host, self.port, self.topic = host, port, topic
        self.client_id = client_id
        self.output = output
        self.restarts = 0
        self._lock = threading.Lock()
        self._lines: list[bytes] = []
        self._connected = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311,
                                  clean_session=False)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message

    def start(self) -> None:
        try:
            self.client.connect(self.host, self.port, keepalive=30)
        except OSError as error:
            raise LaunchError(f"bulk subscriber: cannot connect to {self.host}:{self.port}: {error}") from None
        self.client.loop_start()
        if not self._connected.wait(CONNECT_TIMEOUT):
            self.stop()
            raise LaunchError(f"bulk subscriber: no CONNACK from {self.host}:{self.port}")

    def restart_if_exited(self) -> bool:
        return False  # paho reconnects by itself, and subscribes again in `_on_connect`

    def last_error(self) -> str:
        return ""

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: ReasonCode,
                    properties: Any) -> None:
        if not reason_code.is_failure:
            client.subscribe(self.topic, qos=1)
            self._connected.set()

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        payload = message.payload
        head = payload[:payload.find(b" ")] if b" " in payload[:24] else payload[:24]
        line = b"%.6f %s\n" % (time.time(), head)
        with self._lock:
            self._lines.append(line)
            if len(self._lines) >= 256:
                self._flush()

    def _flush(self) -> None:
        lines, self._lines = self._lines, []
        if lines:
            with open(self.output, "ab") as sink:
                sink.write(b"".join(lines))

    def raw(self) -> bytes:
        with self._lock:
            self._flush()
        try:
            return self.output.read_bytes()
        except FileNotFoundError:
            return b""

    def arrivals(self) -> list[Arrival]:
        return parse_output(self.raw())

    def stop(self) -> None:
        with contextlib.suppress(Exception):  # stopping must not fail, whatever state paho is in
            self.client.disconnect()
        stop_network_thread(self.client)
        with self._lock:
            self._flush()


def peak_resident_mib(pid: int | None) -> float | None:
    """A process's peak resident set size (`VmHWM`) in MiB, or None when it is gone."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        return None
    return None
