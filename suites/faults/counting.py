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

One loss is the subscriber's client library's, not the path's, and is told
apart in a QoS 2 stream when the case restarted the subscriber's broker
(`broker_restarted`). libmosquitto keeps an incoming QoS 2 message whose
PUBREL never came across a reconnection, also to a broker that lost the
session; the restarted broker's publication that gets the same packet id is
taken for a repeat of it, and the PUBREL that follows prints the old message
instead (docs/guarantees.md, "kill -9 the subscriber's broker"). Its mark in
the output: X is missing and an older L, printed for the first time, stands
right where X belongs (after X - 1 and, unless it is the last line, before
X + 1). Such a pair is counted as `swapped` (X neither lost nor L late); any
other loss still counts.

Everything here is pure (lines and sets in, counts out), so it is unit-tested
without brokers (tests/tools/test_faults_units.py).
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
    swapped: tuple[tuple[int, int], ...] = ()
    """(X, L): X lost by the client library, which printed the older L in its place (module docstring)"""

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
        document["swapped"] = [list(pair) for pair in self.swapped]
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


def client_swaps(first_arrivals: Sequence[int], missing: set[int]) -> list[tuple[int, int]]:
    """(X, L) for each missing X whose place (right after X - 1, and before X + 1 unless it is the last) holds an
    older L: the client library's swap after its broker restarted (module docstring)."""
    swaps = []
    for index, seq in enumerate(first_arrivals):
        before = first_arrivals[index - 1] if index else None
        after = first_arrivals[index + 1] if index + 1 < len(first_arrivals) else None
        if before is None or before + 1 not in missing or seq >= before:
            continue
        if after is None or after == before + 2:
            swaps.append((before + 1, seq))
    return swaps


def count_stream(sent: int, acknowledged: Iterable[int], arrivals: Sequence[int],
                 broker_restarted: bool = False) -> StreamCount:
    """Judge a stream: `sent` publications numbered 1..sent, the acknowledged numbers, the numbers the
    subscriber printed in arrival order; `broker_restarted`: the case killed and restarted the subscriber's
    broker, so the client library's swaps are told apart (module docstring)."""
    acked = set(acknowledged)
    copies = Counter(arrivals)
    seen: set[int] = set()
    first_arrivals: list[int] = []
    for seq in arrivals:
        if seq not in seen:
            seen.add(seq)
            first_arrivals.append(seq)
    swapped = client_swaps(first_arrivals, acked - seen) if broker_restarted else []
    if swapped:  # judged as if X had been printed in its place and L where it was due
        stand_ins = {older: lost for lost, older in swapped}
        seen |= set(stand_ins.values())
        first_arrivals = [stand_ins.get(seq, seq) for seq in first_arrivals]
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
        lost_sample=tuple(lost[:SAMPLE_KEPT]), lost_ranges=tuple(runs(lost)[:RANGES_KEPT]), swapped=tuple(swapped))
