"""Which QoS 2 messages a moved client had taken and not been released: told from the order the broker processed
them, so that the handover gives them again (issue 39 item 5; federation.daemon.roaming calls it).

Theory of operation
-------------------
A subscriber answers a QoS 2 PUBLISH with PUBREC and hands the message to its application at the PUBREL (paho and
MQTT.js do). When its connection drops between the two, one broker sends the PUBREL again when the client comes
back and the client hands the message over then; the takeover's connection on the old broker (federation.daemon.
kicker) gets that PUBREL instead, for a packet id it never saw, and the broker sends no content with it
(`unreleased`). The client, answered session present 0 on its new broker, never gets the PUBREL, so the message
is lost unless it is given again.

Which messages they are follows from the broker's order: it sends one client its messages in the order it
processed them, and the client answers in that order, so its session's messages are, in that order, those
completed, then those waiting for the PUBCOMP (the unreleased), then those waiting for the PUBREC and those queued
(the kicker reads both). The unreleased ones are therefore the `unreleased` QoS 2 publications on the session's
topics that the broker processed just before the first message the kicker read (or, with none read, just before the
fence). This wrapper knows that order for what came on one connection: its own injections in the order written,
or its clients' publications in the order its connection read them back. So it keeps the recent QoS 2 publications
(`RecentQos2`, `KEPT` of them) with where each came from, and names the unreleased ones only when the first message
read is found exactly once and it and the ones before it all came one way; otherwise they stay counted lost
(`roaming_unreleased`). A client whose PUBCOMP was lost in flight had handed the message over already and gets it
twice: with the takeover behind a TCP drop, a PUBCOMP written before the drop still reaches the broker, so this is
taken as rare (the load balancer test counts QoS 2 duplicates at the clients).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from federation.daemon.client_registry import Carried, Message
from federation.daemon.roaming_late import Key

KEPT = 16384
"""recent QoS 1/2 publications kept (a few seconds at thousands a second; beyond, nothing is named)"""
KEPT_BYTES = 16 * 1024 * 1024
"""and their payload bytes at most: without it 100 kB publications at 500/s kept 200 MB in the publishing wrapper
(the fault suite's bulk flood: its peak went from 56 to 244-273 MiB); the oldest go first"""
SEED_SECONDS = 2.0
"""how far back a takeover's forwarding looks when it starts (an injection queued toward a slow broker is written
after the fence: measured under a load of 20-40 on 2 CPUs, 5 QoS 1 publications lost so)"""
INJECTED = "injected"
LOCAL = "local"


class RecentQos2:
    """The broker's recent QoS 1/2 publications, in the order it processed them per way in (module docstring);
    the QoS 1 ones for `since` only (what a takeover's forwarding starts with: federation.daemon.roaming_late)."""

    def __init__(self, kept: int = KEPT, kept_bytes: int = KEPT_BYTES) -> None:
        self._recent: deque[tuple[str, bytes, dict[str, Any] | None, str, Key, int, float]] = deque()
        self._kept, self._kept_bytes = kept, kept_bytes
        self.payload_bytes = 0

    def add(self, topic: str, payload: bytes, properties: dict[str, Any] | None, way: str, key: Key, qos: int,
            now: float) -> None:
        recent = self._recent
        recent.append((topic, payload, properties, way, key, qos, now))
        self.payload_bytes += len(payload)
        while len(recent) > self._kept or (self.payload_bytes > self._kept_bytes and len(recent) > 1):
            self.payload_bytes -= len(recent.popleft()[1])

    def __len__(self) -> int:
        return len(self._recent)

    def since(self, start: float, wanted: Callable[[str], bool]) -> list[Carried]:
        """The publications `wanted` takes made or injected from `start` on, as a late record carries them."""
        return [(topic, payload, qos, properties, *key) for topic, payload, properties, _way, key, qos, at
                in self._recent if at >= start and wanted(topic)]

    def unreleased(self, count: int, wanted: Callable[[str], bool], first: Message | None,
                   before_fence: Callable[[Key], bool] | None = None) -> list[Message]:
        """The `count` messages just before `first` (the first the kicker read) among the publications `wanted`
        takes, or with no `first` the last `count` of them before the fence (`before_fence(key)`: the broker had
        that publication by then); [] when they cannot be told apart."""
        session = [entry for entry in self._recent if entry[5] == 2 and wanted(entry[0])]
        if first is not None:
            found = [index for index, entry in enumerate(session) if (entry[0], entry[1]) == (first[0], first[1])]
            if len(found) != 1:
                return []
            end = found[0]
            ways = {session[end][3]}
        else:
            if before_fence is None:
                return []
            end = max((index + 1 for index, entry in enumerate(session) if before_fence(entry[4])),
                      default=0)
            ways = set()
        start = end - count
        if start < 0:
            return []
        named = session[start:end]
        ways |= {entry[3] for entry in named}
        if len(ways) != 1:
            return []
        return [(topic, payload, 2, False, properties) for topic, payload, properties, _way, _key, _qos, _at in named]
