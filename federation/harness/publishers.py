"""The scenario driver's publishers: one `mosquitto_pub` per `publish` event, and what each message should reach.

Theory of operation
-------------------
A `publish` event sends `count` messages, `interval` seconds apart. Starting
a `mosquitto_pub` per message would put a process start and an MQTT
connection between the scheduled instant and the send, and the broker would
log a connect and a disconnect per message. So each event gets one
`mosquitto_pub -l` (`publisher_argv`), started `PUBLISHER_LEAD` seconds
before its first message so that it is connected by then; each message is
one line written to its stdin, a JSON payload `{"id", "sent", "fill"}` as in
the simulator. The last message closes stdin:
mosquitto_pub sends what it has read and exits with status 0. A publisher
whose process has gone (its broker was restarted, or it failed) is started
again at its next message; a broker restart first closes the node's
publishers (`close(node)`), so what they read is sent before the broker goes.

What it records, at the instant a line is written: the publication (id,
origin, topic, run time), whether it was in bound and which nodes the ground
truth expects it to reach (`GroundTruth.expected`), and the process that took
it, plus a `run_publish` event (`run_publish_failed` if the write failed).
At the end (`records`), a publication whose mosquitto_pub did not exit with
status 0 may never have reached its broker: it is recorded as
`run_publish_unconfirmed` and reported out of bound, with no expected nodes,
so it is counted but not judged.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from federation.harness.clients import SentPublication, publisher_argv
from federation.harness.platform import Platform
from federation.harness.poller import EventSink
from federation.harness.processes import wait_all
from federation.scenario.model import Publish
from federation.scenario.report import PublicationRecord
from federation.scenario.truth import GroundTruth

PUBLISHER_LEAD = 1.0
"""seconds before a `publish` event's first message its mosquitto_pub is started, so it is connected"""
PUBLISHER_EXIT_SECONDS = 5.0
"""seconds a publisher gets to send what it read and exit after its stdin is closed"""


@dataclass
class _Publisher:
    """The `mosquitto_pub -l` of one `publish` event (a new one if the last died with its broker)."""

    event: Publish
    process: subprocess.Popen[bytes] | None = None
    used: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None and self.process.stdin is not None

    def close(self) -> None:
        """Close stdin: mosquitto_pub sends what it has read and exits with status 0."""
        if self.process is not None and self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        self.process = None


@dataclass
class _Publication:
    sent: SentPublication
    in_bound: bool
    expected: frozenset[str]
    process: subprocess.Popen[bytes]
    """the mosquitto_pub that took it: if that exits with an error, the publication is not judged"""


class Publishers:
    """Every `publish` event's mosquitto_pub, and every publication made through them."""

    def __init__(self, platform: Platform, output: Path, truth: GroundTruth, *, lock: threading.RLock,
                 now: Callable[[], float], t0_unix: float, event: EventSink) -> None:
        self.platform = platform
        self.output = output  # every publisher's stdout+stderr, appended
        self.truth = truth  # read under `lock`
        self.lock = lock
        self.now = now
        self.t0_unix = t0_unix  # the wall-clock time of run time 0, for the payloads' "sent"
        self.event = event
        self.publishers: list[_Publisher] = []
        self.publications: list[_Publication] = []
        self.payload_counter = 0

    def schedule(self, event: Publish) -> list[tuple[float, Callable[[], None], str]]:
        """The actions of one `publish` event, in order: (run time, action, kind for `run_late`)."""
        publisher = _Publisher(event)
        self.publishers.append(publisher)
        actions: list[tuple[float, Callable[[], None], str]] = [
            (max(0.0, event.at - PUBLISHER_LEAD), partial(self.start, publisher), "publisher")]
        for number in range(event.count):
            actions.append((event.at + number * event.interval, partial(self.publish, publisher, number), "publish"))
        return actions

    def start(self, publisher: _Publisher) -> None:
        """Start the event's mosquitto_pub on its node, unless it runs."""
        if publisher.running():
            return
        event = publisher.event
        publisher.process = self.platform.start_client(
            event.node, publisher_argv(event.topic, event.qos, event.retain), self.output, stdin=True)
        publisher.used.append(publisher.process)

    def publish(self, publisher: _Publisher, number: int) -> None:
        """One message of a `publish` event: a line to its mosquitto_pub, with the id and send time."""
        event = publisher.event
        if not publisher.running():
            self.start(publisher)  # its broker was restarted, or it failed
        process = publisher.process
        assert process is not None and process.stdin is not None
        self.payload_counter += 1
        payload_id = f"{event.node}-{self.payload_counter}"
        with self.lock:
            now = self.now()
            in_bound, expected = self.truth.expected(event.node, event.topic, now)
        payload = json.dumps({"id": payload_id, "sent": round(self.t0_unix + now, 6),
                              "fill": "x" * event.payload_size}, separators=(",", ":"))
        try:
            process.stdin.write(payload.encode() + b"\n")
            process.stdin.flush()
        except OSError as error:
            self.event("run_publish_failed", event.node, payload_id=payload_id, reason=str(error))
            publisher.close()
            return
        self.publications.append(_Publication(SentPublication(payload_id, event.node, event.topic, now),
                                              in_bound, expected, process))
        self.event("run_publish", event.node, payload_id=payload_id, topic=event.topic, qos=event.qos,
                   retain=event.retain, size=len(payload), in_bound=in_bound, expected=sorted(expected))
        if number == event.count - 1:
            publisher.close()

    def close(self, node: str | None = None) -> None:
        """Close the stdin of the (node's) publishers and wait until they have sent everything and exited."""
        chosen = [p for p in self.publishers if node is None or p.event.node == node]
        processes = [process for publisher in chosen for process in publisher.used]
        for publisher in chosen:
            publisher.close()
        wait_all(processes, PUBLISHER_EXIT_SECONDS)

    def processes(self) -> list[subprocess.Popen[bytes]]:
        """Every mosquitto_pub started so far (for the cleanup after a failed run)."""
        return [process for publisher in self.publishers for process in publisher.used]

    def expected_deliveries(self) -> set[tuple[str, str]]:
        """(payload id, node) of every delivery the ground truth expected when the message was sent."""
        return {(p.sent.payload_id, node) for p in self.publications for node in p.expected}

    def records(self) -> tuple[list[PublicationRecord], dict[str, SentPublication]]:
        """The report's publication records, and payload id -> publication (call after `close()`)."""
        records = []
        sent = {}
        for publication in self.publications:
            in_bound, expected = publication.in_bound, publication.expected
            status = publication.process.poll()
            if status != 0:
                # Its mosquitto_pub failed: the message may never have reached the broker; count, don't judge.
                self.event("run_publish_unconfirmed", publication.sent.origin,
                           payload_id=publication.sent.payload_id, exit_status=status)
                in_bound, expected = False, frozenset()
            sent[publication.sent.payload_id] = publication.sent
            records.append(PublicationRecord(publication.sent.payload_id, publication.sent.origin,
                                             publication.sent.topic, publication.sent.sent_at,
                                             in_bound, expected))
        return records, sent
