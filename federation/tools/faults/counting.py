"""What a stream's subscriber printed, judged against what its publisher had acknowledged.

Theory of operation: the publisher's payload is its sequence number in ASCII
(1, 2, 3, ...), and the subscriber (`mosquitto_sub -F '%U %p'`) prints each
message it receives on its own line, after its receive time. So the
subscriber's output file alone says what reached the client, in which order
and how often; the publisher says which sequence numbers the broker
acknowledged (PUBACK for QoS 1, PUBCOMP for QoS 2). Probe payloads (sent
before the stream until the path carries one) start with `probe` and are
left out.

The verdicts (Jepsen's "what goes in must come out"):

* lost: acknowledged to the publisher and never received;
* duplicated: copies received beyond the first, summed over publications;
* out of order, over the first arrival of each publication:
  `inversions` counts adjacent pairs where a smaller number follows a
  larger one, `late` counts publications that arrived after a later one
  (after a larger number had already arrived);
* unexpected: numbers received that were never published (a stray).

A publication the publisher sent but saw no acknowledgement for may arrive
or not: MQTT promises nothing for it, so it is only counted (`unacknowledged`).

Everything here is pure (lines and sets in, counts out), so it is unit-tested
without brokers (tests/tools/test_faults_counting.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

PROBE_MARK = b"probe"
"""first bytes of a probe payload (not part of the stream)"""


class OutputError(ValueError):
    """A subscriber output line that is neither a stream message nor a probe."""


@dataclass(frozen=True, slots=True)
class Arrival:
    """One message as the subscriber printed it: the sequence number and the receive time (unix seconds)."""

    seq: int
    received: float


def parse_line(line: bytes) -> Arrival | None:
    """One `mosquitto_sub -F '%U %p'` line: the stream message, or None for a probe. OutputError otherwise."""
    stamp, _, payload = line.partition(b" ")
    try:
        received = float(stamp)
    except ValueError:
        raise OutputError(f"no %U receive time at the start of {line[:60]!r}") from None
    if payload.startswith(PROBE_MARK):
        return None
    if not payload.isdigit():
        raise OutputError(f"payload is not a sequence number: {payload[:60]!r}")
    return Arrival(int(payload), received)


def parse_output(data: bytes) -> list[Arrival]:
    """Every stream message of a subscriber's output, in arrival order (a last line without its newline,
    still being written, is left out)."""
    lines = data.split(b"\n")[:-1]
    return [arrival for arrival in map(parse_line, lines) if arrival is not None]


@dataclass(frozen=True)
class StreamCount:
    """The verdicts for one stream; see the module docstring."""

    sent: int
    acknowledged: int
    received: int
    """messages printed by the subscriber, copies included"""
    lost: int
    duplicated: int
    inversions: int
    late: int
    unexpected: int
    unacknowledged: int
    """sent but never acknowledged to the publisher (not judged)"""
    lost_sample: tuple[int, ...] = ()
    """the first lost sequence numbers, for a reader"""
    lost_ranges: tuple[tuple[int, int], ...] = ()
    """the lost sequence numbers as (first, last) runs, at most `RANGES_KEPT` of them"""

    @property
    def ordered(self) -> bool:
        return self.inversions == 0 and self.late == 0

    def meets(self, qos: int) -> bool:
        """The issue 19 target: nothing lost, nothing out of order, and for QoS 2 nothing duplicated."""
        return self.lost == 0 and self.ordered and (qos < 2 or self.duplicated == 0) and self.unexpected == 0

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["lost_sample"] = list(self.lost_sample)
        document["lost_ranges"] = [list(pair) for pair in self.lost_ranges]
        return document


SAMPLE_KEPT = 20
RANGES_KEPT = 20


def runs(numbers: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted numbers as (first, last) runs of consecutive values: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    found: list[tuple[int, int]] = []
    for number in sorted(numbers):
        if found and number == found[-1][1] + 1:
            found[-1] = (found[-1][0], number)
        else:
            found.append((number, number))
    return found


def count_stream(sent: int, acknowledged: Iterable[int], arrivals: Sequence[int]) -> StreamCount:
    """Judge a stream: `sent` publications numbered 1..sent, the acknowledged numbers, the numbers the
    subscriber printed in arrival order."""
    acked = set(acknowledged)
    copies = Counter(arrivals)
    seen: set[int] = set()
    first_arrivals: list[int] = []
    for seq in arrivals:
        if seq not in seen:
            seen.add(seq)
            first_arrivals.append(seq)
    inversions = sum(1 for before, after in zip(first_arrivals, first_arrivals[1:], strict=False) if after < before)
    late = 0
    highest = 0
    for seq in first_arrivals:
        if seq < highest:
            late += 1
        highest = max(highest, seq)
    lost = sorted(acked - seen)
    return StreamCount(
        sent=sent, acknowledged=len(acked), received=len(arrivals), lost=len(lost),
        duplicated=sum(count - 1 for count in copies.values()), inversions=inversions, late=late,
        unexpected=sum(1 for seq in seen if not 1 <= seq <= sent),
        unacknowledged=sent - len(acked & set(range(1, sent + 1))),
        lost_sample=tuple(lost[:SAMPLE_KEPT]), lost_ranges=tuple(runs(lost)[:RANGES_KEPT]))
