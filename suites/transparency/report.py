"""The matrix (one broker | federation | bridge chain per case) and the differences under it, as text or Markdown.

Theory of operation: a `SuiteResult` in, strings out. The reference's cell
says what its receivers got; every other cell is `same` or what differs
(`missing 1, extra 6`). Under the matrix, each case that differs somewhere
gets its readable diff per setup and, for the federation, what the wrappers
said (events on the case's topics, drop counters, log warnings), which is
where a fix starts.
"""

from __future__ import annotations

from suites.transparency.suite import REFERENCE, CaseResult, SuiteResult

LEGEND = ("cells: the one-broker column says what its subscribers received; elsewhere `same` = every subscriber "
          "received the same messages (topic, payload, QoS, retain flag, properties, order per topic) and answers "
          "as on one broker; otherwise how many messages were missing, extra, changed (same payload, another "
          "QoS, retain flag or property) or reordered, or `answers differ` (CONNACK, SUBACK, UNSUBACK, and "
          "the publisher's acknowledgements where the case judges them).")
SHORT_NAMES = {"one-broker": "one broker", "federation": "federation", "bridge-chain": "bridge chain"}


POLICY_LEGEND = ("cells: the bridge chain (a and c bridged to b with their topic lines) is the reference and "
                 "says what its subscribers received, each duplicate left out where the case says it delivers some "
                 "twice; `same` = the federation given the same lines delivered the same messages and answers")


def columns(result: SuiteResult) -> list[str]:
    return [result.reference, *[name for name in result.setups if name != result.reference]]


def cell(case: CaseResult, setup: str, reference: str = REFERENCE) -> str:
    if setup == reference:
        return case.reference
    verdict = case.verdicts.get(setup)
    return "-" if verdict is None else verdict.summary


def text_table(result: SuiteResult) -> str:
    names = columns(result)
    header = ["case", *[SHORT_NAMES.get(name, name) for name in names]]
    rows = [[case.name, *[cell(case, name, result.reference) for name in names]] for case in result.cases]
    widths = [max(len(row[index]) for row in [header, *rows]) for index in range(len(header))]
    lines = [" | ".join(text.ljust(width) for text, width in zip(header, widths, strict=True)),
             "-+-".join("-" * width for width in widths)]
    lines += [" | ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def markdown_table(result: SuiteResult) -> str:
    names = columns(result)
    lines = ["| case | what the clients do | " + " | ".join(SHORT_NAMES.get(name, name) for name in names) + " |",
             "|---|---|" + "---|" * len(names)]
    for case in result.cases:
        cells = [cell(case, name, result.reference).replace("|", "\\|") for name in names]
        lines.append(f"| {case.name} | {case.title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def setups_text(result: SuiteResult) -> str:
    """One line per setup: what it is, and how long its new subscriptions took to be reached from every site."""
    lines = []
    for name, description in result.setups.items():
        waits = sorted(wait for case in result.cases if name in case.recordings
                       for wait in case.recordings[name].ready_after)
        timing = f"; {len(waits)} subscriptions reached from every site after {waits[len(waits) // 2]:.2f} s " \
                 f"(median), {waits[-1]:.2f} s at most" if waits else ""
        lines.append(f"- {SHORT_NAMES.get(name, name)}: {description}{timing}")
    return "\n".join(lines)


def differences(result: SuiteResult, setups: list[str] | None = None) -> str:
    """For every case that differs (or has notes) on a setup: its diff, notes and explanation."""
    blocks = []
    for case in result.cases:
        for setup, verdict in case.verdicts.items():
            if setups is not None and setup not in setups:
                continue
            if verdict.same and not verdict.notes:
                continue
            recording = case.recordings.get(setup)
            lines = [f"## {case.name} on the {SHORT_NAMES.get(setup, setup)}: {verdict.summary} ({case.title})"]
            lines += verdict.details
            lines += [f"note: {note}" for note in verdict.notes]
            if recording is not None and recording.explanation and not verdict.same:
                lines.append("wrappers:")
                lines += [f"  {line}" for line in recording.explanation]
            blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def full_text(result: SuiteResult) -> str:
    minutes = (result.ended - result.started) / 60
    legend = LEGEND if result.reference == REFERENCE else POLICY_LEGEND
    parts = [setups_text(result), "", text_table(result), "", legend,
             f"({len(result.cases)} cases in {minutes:.1f} min)"]
    if result.errors:
        parts += ["", "setup errors:", *[f"- {error}" for error in result.errors]]
    text = differences(result)
    if text:
        parts += ["", text]
    return "\n".join(parts)
