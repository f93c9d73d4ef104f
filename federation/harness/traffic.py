"""Packet totals of a real run, from the wrappers' event logs and status snapshots.

Theory of operation: a wrapper counts the datagrams it sends by type from its
start (`sent` in `counters` events every `stats_interval`, in `node_stopped`
at a clean exit, and in its status document). The counts restart with every
process, so a run's total is the sum over every wrapper *lifetime* (one boot
epoch) of the last count seen in it. A lifetime that ended with `kill -9` has
no `node_stopped`: its last `counters` event or the last status snapshot the
driver took, whichever is higher, stands for it (an undercount of at most
one interval, said so in docs/partitions.md). Everything is counted at the
sender, as in the simulator's report.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from federation.protocol.wire import DATA_TYPES
from federation.scenario.report import TrafficRecord

SentCounts = dict[str, tuple[int, int]]
"""packet type -> (packets, bytes)"""


def sent_counts(raw: Any) -> SentCounts:
    """The `sent` mapping of a counters snapshot ({type: [packets, bytes]}); {} if malformed."""
    counts: SentCounts = {}
    if not isinstance(raw, Mapping):
        return counts
    for kind, pair in raw.items():
        if isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(v, int) for v in pair):
            counts[str(kind)] = (int(pair[0]), int(pair[1]))
    return counts


def _total(counts: SentCounts) -> int:
    return sum(packets for packets, _ in counts.values())


class TrafficTally:
    """The best (highest) snapshot of every (node, epoch) lifetime, whichever source it came from."""

    def __init__(self) -> None:
        self.best: dict[tuple[str, int], SentCounts] = {}

    def observe(self, node: str, epoch: int, counts: SentCounts) -> None:
        key = (node, epoch)
        if _total(counts) >= _total(self.best.get(key, {})):
            self.best[key] = counts

    def read_event_log(self, node: str, path: Path) -> int:
        """Add every counters snapshot of the node's event log; the number of lines that were not JSON."""
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return 0
        bad = 0
        epoch: int | None = None
        for raw in text.splitlines():
            try:
                event = json.loads(raw)
            except ValueError:
                bad += 1
                continue
            if not isinstance(event, dict):
                continue
            kind = event.get("type")
            if kind == "node_started" and isinstance(event.get("epoch"), int):
                epoch = event["epoch"]
            elif epoch is None:
                continue
            elif kind == "counters":
                self.observe(node, epoch, sent_counts(event.get("sent")))
            elif kind == "node_stopped":
                snapshot = event.get("counters")
                if isinstance(snapshot, Mapping):
                    self.observe(node, epoch, sent_counts(snapshot.get("sent")))
        return bad

    def record(self, node_seconds: float) -> TrafficRecord:
        control: dict[str, tuple[int, int]] = {}
        data_packets = data_bytes = 0
        for _, counts in sorted(self.best.items()):
            for kind, (packets, size) in counts.items():
                if kind in DATA_TYPES:
                    data_packets += packets
                    data_bytes += size
                    continue
                old = control.get(kind, (0, 0))
                control[kind] = (old[0] + packets, old[1] + size)
        return TrafficRecord(dict(sorted(control.items())), data_packets, data_bytes, node_seconds)


def lifetimes_seconds(spans: Iterable[tuple[float, float | None]], end: float) -> float:
    """Sum of [start, stop) spans clipped to [0, end]; an open span runs to `end`."""
    total = 0.0
    for start, stop in spans:
        stop_at = end if stop is None else min(stop, end)
        total += max(0.0, stop_at - max(0.0, start))
    return total
