"""Write the report directory: report.json, CSV tables, and report.html that shows them with the plots.

Theory of operation
-------------------
`report.json` is the machine-readable result (docs/spark.md lists its
keys); the CSV files are its tables, one per question, for spreadsheets
and other tools; `report.html` is one page for a person: the run in a few
lines, the convergence and delivery tables, and the pictures. Everything is
derived from the report dict, so the three never disagree.
"""

from __future__ import annotations

import csv
import html
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

FIGURES = (
    ("convergence.png", "Convergence timeline"),
    ("overlay.png", "Overlay at the end of each phase"),
    ("latency_cdf.png", "Latency"),
    ("overhead.png", "Control overhead"),
    ("cores_meshes.png", "Core changes and mesh sizes"),
)


def _clean(value: Any) -> Any:
    """JSON-safe: infinities become null, floats rounded to microseconds."""
    if isinstance(value, float):
        return None if not math.isfinite(value) else round(value, 6)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.write_text(json.dumps(_clean(report), indent=2) + "\n", encoding="utf-8")


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for row in rows:
            writer.writerow(["" if v is None else _clean(v) for v in row])


def write_tables(directory: Path, report: dict[str, Any], extras: dict[str, Any]) -> list[str]:
    """The CSV files; returns their names."""
    written = []

    def table(name: str, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        write_csv(directory / name, header, rows)
        written.append(name)

    phases = report["convergence"]
    table("convergence.csv", ["phase", "at", "settled_at", "seconds", "end", "components"],
          [(p["phase"], p["at"], p["settled_at"], p["seconds"], p["end"], len(p["components"])) for p in phases])
    table("components.csv", ["phase", "component", "nodes", "size", "settled_at", "seconds", "problem_at_end"],
          [(p["phase"], index, " ".join(c["nodes"]), len(c["nodes"]), c["settled_at"], c["seconds"], c["problem"])
           for p in phases for index, c in enumerate(p["components"])])
    columns = ["sent", "in_bound", "expected_deliveries", "delivered", "lost", "duplicates", "unexpected",
               "delivered_outside_bound"]
    table("deliveries.csv", ["phase", *columns, "p50", "p90", "p99", "max"],
          [(row["phase"], *[row[c] for c in columns], *[row["latency"][k] for k in ("p50", "p90", "p99", "max")])
           for row in [*report["publications_by_phase"], {"phase": "all", **report["publications"]}]])
    cdf = extras["cdf"]
    table("latency_cdf.csv", ["fraction", "latency_s"], [((i + 1) / len(cdf), v) for i, v in enumerate(cdf)])
    table("overhead.csv", ["t", "type", "packets", "bytes", "nodes", "node_seconds", "packets_per_node_s",
                           "bytes_per_node_s"],
          [(r["t"], r["type"], r["packets"], r["bytes"], r["nodes"], r["node_seconds"], r["packets_per_node_s"],
            r["bytes_per_node_s"]) for r in extras["overhead_series"]])
    table("core_changes.csv", ["t", "node", "kind", "filter", "core", "previous", "reason"],
          [(c["t"], c["node"], c["kind"], c["filter"], c["core"], c["previous"], c["reason"])
           for c in extras["core_changes"]])
    table("mesh_sizes.csv", ["t", "filter", "members"], extras["mesh_sizes"])
    table("clock_offsets.csv", ["node", "offset_s", "error_s", "hops", "applied"],
          [(n, o["offset"], o["error"], o["hops"], o["applied"]) for n, o in report["clocks"]["nodes"].items()])
    return written


# ---------------------------------------------------------------- HTML

def _cell(value: Any) -> str:
    if value is None:
        return "&ndash;"
    if isinstance(value, float):
        return f"{value:.6g}"
    return html.escape(str(value))


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _ms(value: float | None) -> str:
    return "&ndash;" if value is None else f"{value * 1000:.3f}"


def write_html(path: Path, report: dict[str, Any], figures: Sequence[str]) -> None:
    job = report["job"]
    inputs = report["input"]
    pubs = report["publications"]
    clocks = report["clocks"]
    converged = sum(1 for p in report["convergence"] if p["seconds"] is not None)
    summary = [
        ("events", f"{inputs['valid']:,} valid of {inputs['lines']:,} lines in {len(inputs['files'])} file(s); "
                   f"{inputs['corrupt']:,} corrupt, {sum(inputs['unknown_version'].values()):,} of another version"),
        ("time span", f"{(inputs['last_t'] or 0) - (inputs['first_t'] or 0):.3f} s of events; the run's t=0 is "
                      f"{job['t0']:.6f} in the event clock; the pictures and this page count from it"),
        ("disruptions from", job["timeline"]),
        ("settle", f"{job['settle']} s (expected-delivery rule)"),
        ("clocks", f"mode {clocks['mode']}, reference {clocks['reference']}, {clocks['applied']} node(s) corrected"
                   + (f", largest error bound {_ms(clocks['max_error'])} ms" if clocks["applied"] else
                      " (no offset larger than its error bound)")),
        ("phases", f"{len(report['convergence'])}, {converged} converged"),
        ("publications", f"sent {pubs['sent']:,}, expected {pubs['expected_deliveries']:,}, delivered "
                         f"{pubs['delivered']:,}, lost {pubs['lost']:,}, duplicates {pubs['duplicates']:,}, "
                         f"unexpected {pubs['unexpected']:,}, outside bound {pubs['delivered_outside_bound']:,}"),
        ("latency (ms)", f"p50 {_ms(pubs['latency']['p50'])}, p90 {_ms(pubs['latency']['p90'])}, "
                         f"p99 {_ms(pubs['latency']['p99'])}, max {_ms(pubs['latency']['max'])}"),
        ("control", f"{_cell(report['control']['per_node_per_second']['packets'])} packets and "
                    f"{_cell(report['control']['per_node_per_second']['bytes'])} bytes per node per second"),
        ("job", f"{job['wall_seconds']:.1f} s wall, {job['events_per_second']:,.0f} events/s, master {job['master']}"),
    ]
    convergence_rows = [(p["phase"], p["at"] - job["t0"], p["seconds"], len(p["components"]),
                         "; ".join(f"[{' '.join(c['nodes'])}] {_cell(c['seconds'])} s" + (
                             f" (not converged: {c['problem']})" if c["seconds"] is None and c["problem"] else "")
                                   for c in p["components"]))
                        for p in report["convergence"]]
    delivery_rows = [(row["phase"], row["sent"], row["in_bound"], row["expected_deliveries"], row["delivered"],
                      row["lost"], row["duplicates"], row["unexpected"], row["delivered_outside_bound"],
                      _ms(row["latency"]["p50"]), _ms(row["latency"]["p99"]))
                     for row in report["publications_by_phase"]]
    overhead_rows = [(kind, v["packets"], v["bytes"]) for kind, v in report["control"]["by_type"].items()]
    warnings = "".join(f"<li>{html.escape(w)}</li>" for w in report["warnings"]) or "<li>none</li>"
    captions = dict(FIGURES)
    pictures = "".join(f"<figure><img src='{name}' alt='{html.escape(captions.get(name, name))}'>"
                       f"<figcaption>{html.escape(captions.get(name, name))}</figcaption></figure>"
                       for name in figures)
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Federation run report</title>
<style>
body {{ font-family: sans-serif; margin: 1.2em auto; max-width: 1200px; font-size: 14px; color: #222; }}
table {{ border-collapse: collapse; margin: 0.4em 0 1em; }}
td, th {{ border: 1px solid #ccc; padding: 2px 7px; text-align: left; vertical-align: top; }}
th {{ background: #f0f0f0; }}
img {{ max-width: 100%; border: 1px solid #ddd; }}
figure {{ margin: 0.5em 0 1.2em; }} figcaption {{ color: #555; font-size: 12px; }}
h1 {{ font-size: 20px; }} h2 {{ font-size: 16px; margin-top: 1.4em; }}
</style></head><body>
<h1>Federation run: convergence, delivery and overhead</h1>
{_table(["", ""], summary)}
<h2>Convergence per disruption</h2>
<p>A component has converged when all its nodes agree on members, management core and topic cores, and these
are right (docs/simulator.md). Seconds from the disruption; &ndash; means not before the next phase.</p>
{_table(["phase", "at (s)", "converged in (s)", "components", "per component"], convergence_rows)}
<h2>Publications per phase</h2>
{_table(["phase", "sent", "in bound", "expected", "delivered", "lost", "duplicates", "unexpected",
         "outside bound", "p50 ms", "p99 ms"], delivery_rows)}
<h2>Pictures</h2>
{pictures}
<h2>Control traffic by type (from the last counters of each node)</h2>
{_table(["type", "packets", "bytes"], overhead_rows)}
<h2>Warnings</h2><ul>{warnings}</ul>
<p style="color:#777">Tables: {', '.join(html.escape(t) for t in report['tables'])}; all figures in report.json.
Command: <code>{html.escape(job['command'])}</code></p>
</body></html>
"""
    path.write_text(page, encoding="utf-8")
