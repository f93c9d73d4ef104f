"""Is what the clients saw on a setup what they saw on one broker? The verdict, and a diff a person can read.

Theory of operation: the comparison is per *receiver* (a client, or the
members of a shared subscription group taken together) and follows what
MQTT promises, no more:

* the same messages: every (topic, payload, QoS, retain flag, properties)
  as often as on the reference. The Message Expiry Interval counts down
  while a message waits, and how long it waited differs from setup to setup
  (a case's settles take longer on some), so what is compared is the
  remaining interval plus the time since the publisher sent it: the same
  within `EXPIRY_TOLERANCE` when each setup counted the time its message
  spent, and off by that time when one did not.
* the same order on each topic (MQTT 5 section 4.6 orders one publisher's
  messages per topic; a case's publishers on one topic are separated by a
  settle), judged on the first arrival of each payload, since a client with
  overlapping subscriptions gets one copy per subscription and a broker may
  send them in any order. Messages on different topics may interleave
  differently (retained messages sent at subscribe time come in the
  broker's storage order). Within a group only the set counts: which member
  gets which publication is the broker's choice.
* the same answers: CONNACK (session present), SUBACK and UNSUBACK reason
  codes, disconnections the client did not ask for. The acknowledgement of
  a publication is judged only where the case says so (`judge_acks`):
  Mosquitto answers "No matching subscribers" where nobody subscribes, and
  a wrapper is always subscribed, so that difference shows up in most cases
  and has a case of its own.

Everything is pure: recordings in, a `Verdict` out.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from suites.transparency.recorder import Control, Message
from suites.transparency.runner import Recording
from suites.transparency.scenario import Scenario, short

EXPIRY_TOLERANCE = 2.0
"""seconds by which a message's remaining expiry interval plus its time in transit may differ from the
reference's: Mosquitto counts in whole seconds of its own clock, so each side may be off by up to one"""
DIFF_LINES = 40
SESSION_PRESENT = re.compile(r" session_present=\d")
"""a CONNACK answer's session present flag (`Scenario.session_present_differs`)"""
"""at most this many lines of diff per receiver"""


@dataclass
class Verdict:
    same: bool
    summary: str
    """a matrix cell: `same`, or what differs (`missing 2, extra 6`)"""
    details: list[str] = field(default_factory=list)
    """the readable diff, per receiver"""
    notes: list[str] = field(default_factory=list)
    """what is reported but not judged (acknowledgement reasons in most cases), and the runner's notes"""
    counts: dict[str, int] = field(default_factory=dict)
    """missing, extra, changed, order, answers"""

    def to_json(self) -> dict[str, Any]:
        return {"same": self.same, "summary": self.summary, "details": self.details, "notes": self.notes,
                "counts": self.counts}

    @staticmethod
    def from_json(document: dict[str, Any]) -> Verdict:
        return Verdict(document["same"], document["summary"], document["details"], document["notes"],
                       document["counts"])


def identity(message: Message) -> tuple[Any, ...]:
    """What must be equal, the remaining expiry interval aside."""
    properties = {key: value for key, value in message.properties.items() if key != "message_expiry"}
    return (message.topic, message.size, message.digest, message.qos, message.retain, repr(sorted(properties.items())))


def original_expiry(message: Message, published: Mapping[str, float]) -> float | None:
    """The interval the message left its publisher with, as its subscriber can tell: the remaining Message
    Expiry Interval plus the time since it was published (`published`: payload digest -> when, seconds since
    the scenario started; a message whose publication time is unknown counts as published when it came)."""
    remaining = message.properties.get("message_expiry")
    if remaining is None:
        return None
    return float(remaining) + message.at - published.get(message.digest, message.at)


def expiry_close(reference: Message, other: Message, reference_published: Mapping[str, float],
                 other_published: Mapping[str, float]) -> bool:
    """Both remaining intervals shrank by the time their message waited (within EXPIRY_TOLERANCE)."""
    first = original_expiry(reference, reference_published)
    second = original_expiry(other, other_published)
    if first is None or second is None:
        return first is second
    return abs(first - second) <= EXPIRY_TOLERANCE


def render(message: Message, expiry: bool = True) -> str:
    """One message for people: `c1 <- tp/x/r q1 retained "v1" (2 B) {message_expiry=58, subscription_ids=[1]}`;
    without `expiry` the remaining interval shows as `~` (it may differ by EXPIRY_TOLERANCE)."""
    payload = f'"{message.preview}"' if message.preview and message.size <= 24 else f"#{message.digest[:8]}"
    parts = [f"{message.client} <- {short(message.topic)} q{message.qos}", "retained" if message.retain else "",
             f"{payload} ({message.size} B)"]
    properties = []
    for key, value in sorted(message.properties.items()):
        properties.append(f"{key}={value if expiry or key != 'message_expiry' else '~'}")
    if properties:
        parts.append("{" + ", ".join(properties) + "}")
    return " ".join(part for part in parts if part)


def receiver_messages(scenario: Scenario, recording: Recording) -> dict[str, list[Message]]:
    """Messages by receiver (a group's members together), each in arrival order."""
    found: dict[str, list[Message]] = {receiver: [] for receiver in scenario.receivers}
    for client, messages in recording.messages.items():
        found.setdefault(scenario.receiver_of(client), []).extend(messages)
    for receiver in found:
        found[receiver].sort(key=lambda message: message.at)
    return found


@dataclass
class ReceiverDiff:
    missing: list[Message] = field(default_factory=list)
    extra: list[Message] = field(default_factory=list)
    changed: list[tuple[Message, Message]] = field(default_factory=list)
    order: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.missing or self.extra or self.changed or self.order)


def match(reference: Sequence[Message], other: Sequence[Message], ordered: bool,
          reference_published: Mapping[str, float] | None = None,
          other_published: Mapping[str, float] | None = None) -> ReceiverDiff:
    """Pair the messages of one receiver; see the module docstring. `*_published`: when each payload was
    published (digest -> seconds since the scenario started), for the expiry intervals."""
    diff = ReceiverDiff()
    unused = list(range(len(other)))
    pairs: list[tuple[int, int]] = []
    unmatched: list[int] = []
    for index, message in enumerate(reference):
        key = identity(message)
        found = next((candidate for candidate in unused if identity(other[candidate]) == key), None)
        if found is None:
            unmatched.append(index)
            continue
        unused.remove(found)
        pairs.append((index, found))
        if not expiry_close(message, other[found], reference_published or {}, other_published or {}):
            diff.changed.append((message, other[found]))
    for index in unmatched:  # the same publication with other fields: changed rather than missing + extra
        message = reference[index]
        found = next((candidate for candidate in unused
                      if (other[candidate].topic, other[candidate].digest) == (message.topic, message.digest)), None)
        if found is None:
            diff.missing.append(message)
        else:
            unused.remove(found)
            diff.changed.append((message, other[found]))
    diff.extra = [other[index] for index in unused]
    if ordered:
        diff.order = order_differences(reference, other, pairs)
    return diff


def order_differences(reference: Sequence[Message], other: Sequence[Message],
                      pairs: Iterable[tuple[int, int]]) -> list[str]:
    """Topics on which the first arrivals of the paired payloads come in another order than on the reference."""
    first_reference: dict[str, list[str]] = {}
    first_other: dict[str, list[str]] = {}
    paired = sorted(pairs)
    for index, _ in paired:
        sequence = first_reference.setdefault(reference[index].topic, [])
        if reference[index].digest not in sequence:
            sequence.append(reference[index].digest)
    for _, index in sorted(paired, key=lambda pair: pair[1]):
        sequence = first_other.setdefault(other[index].topic, [])
        if other[index].digest not in sequence:
            sequence.append(other[index].digest)
    return [f"{short(topic)}: {len(sequence)} payloads in another order"
            for topic, sequence in sorted(first_reference.items()) if first_other.get(topic) != sequence]


def answers(controls: Iterable[Control], acks: bool) -> list[str]:
    """A client's answers as comparable lines (times left out): its acknowledgements with `acks`, the rest
    without."""
    return [f"{control.kind} {control.detail}" for control in controls if (control.kind == "ack") == acks]


def compare(scenario: Scenario, reference: Recording, other: Recording) -> Verdict:
    """`other`'s recording judged against the reference's (see the module docstring)."""
    details: list[str] = []
    notes = [f"{other.setup}: {note}" for note in other.notes]
    counts = {"missing": 0, "extra": 0, "changed": 0, "order": 0, "answers": 0}
    if reference.error or other.error:
        errors = [f"{recording.setup}: {recording.error}" for recording in (reference, other) if recording.error]
        return Verdict(False, "not run: " + "; ".join(errors), errors, notes, counts)
    expected, got = receiver_messages(scenario, reference), receiver_messages(scenario, other)
    for receiver in sorted(set(expected) | set(got)):
        diff = match(expected.get(receiver, []), got.get(receiver, []), receiver not in scenario.groups,
                     reference.published, other.published)
        counts["missing"] += len(diff.missing)
        counts["extra"] += len(diff.extra)
        counts["changed"] += len(diff.changed)
        counts["order"] += len(diff.order)
        if not diff.empty:
            details.append(f"{receiver}: " + receiver_summary(diff))
            details += ["  " + line for line in message_diff(expected.get(receiver, []), got.get(receiver, []),
                                                             receiver in scenario.groups)]
            details += [f"  changed: {render(old)}  ->  {render(new)}" for old, new in diff.changed[:5]]
            details += [f"  order: {text}" for text in diff.order]
    for client in scenario.clients:
        for acks in (False, True):
            theirs = answers(reference.controls.get(client, []), acks)
            ours = answers(other.controls.get(client, []), acks)
            if theirs == ours:
                continue
            lines = [line for line in difflib.unified_diff(theirs, ours, reference.setup, other.setup, lineterm="",
                                                           n=0) if not line.startswith(("---", "+++", "@@"))]
            if acks and not scenario.judge_acks:
                notes.append(f"{client}'s acknowledgements differ (not judged in this case): " + "; ".join(lines))
            elif not acks and scenario.session_present_differs and \
                    [SESSION_PRESENT.sub("", line) for line in theirs] == \
                    [SESSION_PRESENT.sub("", line) for line in ours]:
                notes.append(f"{client}'s session present differs ({scenario.session_present_differs}): "
                             + "; ".join(lines))
            else:
                counts["answers"] += 1
                details.append(f"{client}'s {'acknowledgements' if acks else 'answers'} differ:")
                details += ["  " + line for line in lines]
    same = not any(counts.values())
    return Verdict(same, "same" if same else cell_text(counts), details, notes, counts)


def receiver_summary(diff: ReceiverDiff) -> str:
    parts = [f"{name} {len(items)}" for name, items in (("missing", diff.missing), ("extra", diff.extra),
                                                          ("changed", diff.changed), ("order", diff.order)) if items]
    return ", ".join(parts)


def cell_text(counts: dict[str, int]) -> str:
    names = {"missing": "missing", "extra": "extra", "changed": "changed", "order": "reordered",
             "answers": "answers differ"}
    return ", ".join(f"{names[key]} {value}" if key != "answers" else names[key]
                     for key, value in counts.items() if value)


def message_diff(reference: Sequence[Message], other: Sequence[Message], group: bool = False) -> list[str]:
    """A unified diff of the receiver's messages as rendered lines (`-` only on one broker, `+` only here);
    a group's messages sorted by payload, then member (their interleaving is the brokers' choice)."""
    def lines_of(messages: Sequence[Message]) -> list[str]:
        if group:
            messages = sorted(messages, key=lambda message: (message.preview, message.digest, message.client))
        return [render(message, False) for message in messages]

    lines = [line for line in difflib.unified_diff(lines_of(reference), lines_of(other), lineterm="", n=1)
             if not line.startswith(("---", "+++"))]
    if len(lines) > DIFF_LINES:
        lines = lines[:DIFF_LINES] + [f"... {len(lines) - DIFF_LINES} more lines"]
    return lines


def without_duplicates(scenario: Scenario, recording: Recording) -> Recording:
    """The recording with each receiver's later copies of a publication (same topic and payload) left out, the
    first kept at the highest QoS any copy had: what one broker delivers where a bridge chain delivers twice
    (overlapping topic lines, a shared group served by each member broker: policies.py). Subscription
    identifiers differ from copy to copy (one per matching subscription), so they are not merged."""
    kept: dict[tuple[str, str, str], Message] = {}
    highest: dict[tuple[str, str, str], int] = {}
    for message in sorted((m for messages in recording.messages.values() for m in messages), key=lambda m: m.at):
        key = (scenario.receiver_of(message.client), message.topic, message.digest)
        kept.setdefault(key, message)
        highest[key] = max(highest.get(key, 0), message.qos)
    messages: dict[str, list[Message]] = {client: [] for client in recording.messages}
    for key, message in kept.items():
        messages[message.client].append(dataclasses.replace(message, qos=highest[key]))
    for found in messages.values():
        found.sort(key=lambda message: message.at)
    return dataclasses.replace(recording, messages=messages, setup=f"{recording.setup}, duplicates left out")


def describe_reference(scenario: Scenario, recording: Recording) -> str:
    """The reference's matrix cell: what its receivers got (`6 msgs to 3 receivers`)."""
    if recording.error:
        return "not run"
    found = receiver_messages(scenario, recording)
    total = sum(len(messages) for messages in found.values())
    receivers = sum(1 for messages in found.values() if messages)
    if not total:
        return "nothing delivered"
    return f"{total} msg{'s' if total != 1 else ''} to {receivers} receiver{'s' if receivers != 1 else ''}"
