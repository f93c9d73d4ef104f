"""The suite's table, federation and bridge side by side, and the notes that say where a federation lost.

Theory of operation: rows are fault x QoS, columns are setups (the bridge
chain last: the reference). A cell says whether the issue-19 target held
for that stream (0 lost, 0 out of order, and for QoS 2 0 duplicated) and
otherwise what broke it: `lost` (acknowledged, never received), `dup`
(copies beyond the first), `late` (publications that arrived after a later
one) with the adjacent inversions in brackets, each of the acknowledged
count. The same cells make a plain-text table for the terminal and a
Markdown table for docs/guarantees.md. Pure: results in, text out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from suites.faults.counting import StreamCount
from suites.faults.runner import CaseResult

LEGEND = ("cells: `ok` when the stream met the target (0 lost, 0 out of order, QoS 2: 0 duplicated), else "
          "lost = acknowledged to the publisher and never received, dup = extra copies, late = publications that "
          "arrived after a later one (adjacent inversions in brackets), swapped by the client = lost by the "
          "subscriber's client library after its broker restarted, an older message printed in the lost one's "
          "place (docs/guarantees.md; not counted as lost); `/N` = publications acknowledged")


def cell(count: StreamCount | None, qos: int, error: str | None = None) -> str:
    if error is not None:
        return "not judged"
    if count is None:
        return "-"
    parts = []
    if count.lost:
        parts.append(f"lost {count.lost}")
    if count.duplicated:
        parts.append(f"dup {count.duplicated}")
    if count.late or count.inversions:
        parts.append(f"late {count.late} ({count.inversions})")
    if count.unexpected:
        parts.append(f"stray {count.unexpected}")
    if count.swapped:
        parts.append(f"swapped by the client {len(count.swapped)}")
    verdict = "ok" if count.meets(qos) else ""
    return ", ".join(([verdict] if verdict else []) + parts) + f" /{count.acknowledged}"


def rows(results: Mapping[str, Sequence[CaseResult]], titles: Mapping[str, str]) -> list[list[str]]:
    """[fault title, QoS, one cell per setup] for every case in the order of the first setup that ran it."""
    cases: list[str] = []
    for setup_results in results.values():
        for result in setup_results:
            if result.case not in cases:
                cases.append(result.case)
    table = []
    for case in cases:
        levels = sorted({qos for setup_results in results.values() for result in setup_results
                         if result.case == case for qos in result.streams}) or [1, 2]
        for qos in levels:
            line = [titles.get(case, case), str(qos)]
            for setup_results in results.values():
                found = next((result for result in setup_results if result.case == case), None)
                if found is None:
                    line.append("-")
                else:
                    line.append(cell(found.streams.get(qos), qos, found.error))
            table.append(line)
    return table


SETUP_TITLES = {"federation-line": "federation line a-b-c", "federation-ring": "federation ring a-b-c-d",
                "bridge-line": "bridge chain a->b->c (reference)"}


def _header(results: Mapping[str, Sequence[CaseResult]]) -> list[str]:
    return ["fault", "QoS", *(SETUP_TITLES.get(name, name) for name in results)]


def text_table(results: Mapping[str, Sequence[CaseResult]], titles: Mapping[str, str]) -> str:
    header = _header(results)
    body = rows(results, titles)
    widths = [max(len(line[column]) for line in [header, *body]) for column in range(len(header))]
    lines = ["  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip()
             for line in [header, *body]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def markdown_table(results: Mapping[str, Sequence[CaseResult]], titles: Mapping[str, str]) -> str:
    header = _header(results)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(text.replace("|", "\\|") for text in line) + " |" for line in rows(results, titles)]
    return "\n".join(lines)


def _counts(mapping: Mapping[str, Any]) -> str:
    return ", ".join(f"{key} {value}" for key, value in sorted(mapping.items()) if value)


def explain_lines(result: CaseResult) -> list[str]:
    """Where a federation case lost or doubled, from its wrappers' events and status (empty if it met the target
    or has nothing to explain)."""
    events = result.explain.get("events")
    if not events or all(result.meets(qos) for qos in result.streams):
        return []
    lines = []
    for qos, count in sorted(result.streams.items()):
        if count.meets(qos):
            continue
        stream = events.get(str(qos), {})
        dropped = "; ".join(f"{node}: {_counts(reasons)}"
                            for node, reasons in sorted(stream.get("dropped", {}).items()))
        duplicates = _counts(stream.get("duplicate_dropped", {}))
        lines.append(f"  QoS {qos}: originated {stream.get('originated')}, delivered {stream.get('delivered')} "
                     f"({stream.get('delivered_unique')} distinct) to the subscriber's broker, received "
                     f"{count.received - count.duplicated} distinct; dropped: {dropped or 'none logged'}"
                     + (f"; duplicates dropped: {duplicates}" if duplicates else "")
                     + f"; retransmissions {stream.get('retransmitted')}")
    before, after = result.explain.get("status_before", {}), result.explain.get("status_after", {})
    notes = []
    for node in sorted(after):
        now, then = after.get(node), before.get(node)
        if now is None:
            notes.append(f"{node}: no status")
            continue
        restarted = then is None or then.get("pid") != now.get("pid")
        base = {} if restarted else then
        reconnects = (now["broker"].get("reconnects") or 0) - (base.get("broker", {}).get("reconnects") or 0)
        drops = {reason: value - base.get("drops", {}).get(reason, 0) for reason, value in now["drops"].items()}
        parts = [part for part in (
            "restarted (counters since)" if restarted else "",
            f"broker reconnects {reconnects}" if reconnects else "",
            f"drops {_counts(drops)}" if _counts(drops) else "",
            f"injection dropped {_counts(now['injection_dropped'])}" if _counts(now["injection_dropped"]) else "",
        ) if part]
        if parts:
            notes.append(f"{node}: " + ", ".join(parts))
    if notes:
        lines.append("  status: " + "; ".join(notes))
    return lines


def drain_note(result: CaseResult) -> str:
    """When the last message arrived after the healing, and subscribers that had to be started again."""
    parts = []
    if result.healed is not None and result.last_arrival:
        parts.append("last arrival " + ", ".join(f"QoS {qos} {when - result.healed:+.1f} s"
                                                 for qos, when in sorted(result.last_arrival.items()))
                     + " from the healing")
    restarted = {qos: count for qos, count in result.subscriber_restarts.items() if count}
    if restarted:
        parts.append("subscriber exited and was started again: " + ", ".join(
            f"QoS {qos} {count}x" for qos, count in sorted(restarted.items())))
    return "; ".join(parts)


def explanations(results: Mapping[str, Sequence[CaseResult]], events: bool = True) -> list[str]:
    """Per case that missed the target: when the last message arrived, and (`events`, the federation) where
    it lost or doubled."""
    lines = []
    for setup, setup_results in results.items():
        for result in setup_results:
            if result.error is not None:
                lines.append(f"{setup} / {result.case}: not judged: {result.error.splitlines()[0]}")
                continue
            if all(result.meets(qos) for qos in result.streams):
                continue
            note = drain_note(result)
            lines.append(f"{setup} / {result.case}:" + (f" {note}" if note else ""))
            if events:
                lines += explain_lines(result)
    return lines


def extended_cells(result: CaseResult) -> list[tuple[str, str]]:
    """(what, cell) of every stream of an issue-37 case: each QoS at each subscribing node, and the bulk flood."""
    if result.error is not None:
        return [("case", f"not judged: {result.error.splitlines()[0]}")]
    cells = [(f"QoS {qos} at {result.subscriber_node or 'the subscriber'}", cell(count, qos))
             for qos, count in sorted(result.streams.items())]
    for node, counts in sorted(result.more.items()):
        for qos, count in sorted(counts.items()):
            cells.append((f"QoS {qos} at {node}", cell(count, qos)))
    if result.bulk is not None:
        cells.append(("bulk QoS 1", cell(result.bulk, 1)))
    return cells


def extended_lines(results: Sequence[CaseResult], titles: Mapping[str, str]) -> list[str]:
    """One line per issue-37 case: its streams' cells, what the ledger found, and what it measured besides."""
    lines = []
    for result in results:
        parts = [f"{what}: {text}" for what, text in extended_cells(result)]
        problems = result.ledger.get("problems")
        if problems is not None:
            parts.append("counters agree" if not problems else f"counters disagree ({len(problems)})")
        caught = ", ".join(f"{key} caught up {value['arrived']:g} in {value['seconds']:g} s"
                           for key, value in sorted(result.catch_up.items()))
        if caught:
            parts.append(caught)
        if result.bulk is not None:
            parts.append("plain streams' latency p99 " + ", ".join(
                f"QoS {qos} {result.latency.get(qos, {}).get('p99', '-')} s" for qos in ("1", "2")))
            parts.append("peak MiB " + ", ".join(f"{node}: wrapper {peaks.get('wrapper_mib')}, broker "
                                                 f"{peaks.get('broker_mib')}"
                                                 for node, peaks in sorted(result.memory.items())))
        lines.append(f"{titles.get(result.case, result.case)}: " + "; ".join(parts))
    return lines
