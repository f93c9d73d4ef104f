"""Tables and the chart of a benchmark: medians over rounds, side by side, with ratios.

Theory of operation: `results.json` holds every run of every round
(`Results`); the tables are computed from it, never from a partial state, so
`python -m suites.bench report results.json` redraws them from a saved
run. Rows are keyed `(setup, qos, size, rate)`; rate None is the
as-fast-as-possible run that measures throughput. Ratios compare the
federation with the bridge chain of the same length and with the single
broker; "added per hop" is the latency over the single broker's, divided by
the number of broker-to-broker hops. matplotlib is imported only to draw
(the `bench` extra).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suites.bench.stats import RunSummary, added_per_hop, combine_rounds, ratio

Key = tuple[str, int, int, float | None]
"""(setup name, qos, payload bytes, offered rate or None)"""
SATURATED = 0.95
"""a paced run whose delivery rate stays below this share of the offered rate saturated the path"""


@dataclass
class Results:
    """Every run of a benchmark, and where and how it ran."""

    environment: dict[str, Any] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    """one dict per run: setup, qos, size, rate, round, and either `summary` (RunSummary fields) or `error`"""

    def add(self, setup: str, qos: int, size: int, rate: float | None, round_: int,
            summary: RunSummary | None, error: str | None = None) -> None:
        self.runs.append({"setup": setup, "qos": qos, "size": size, "rate": rate, "round": round_,
                          "summary": summary.as_dict() if summary is not None else None, "error": error})

    def as_json(self) -> dict[str, Any]:
        return {"environment": self.environment, "runs": self.runs}

    @staticmethod
    def from_json(document: dict[str, Any]) -> Results:
        return Results(dict(document.get("environment", {})), list(document.get("runs", [])))

    def combined(self) -> dict[Key, dict[str, float]]:
        """Medians and totals over rounds for every key; failed runs are counted in `failed`."""
        grouped: dict[Key, list[RunSummary]] = {}
        failed: dict[Key, int] = {}
        for run in self.runs:
            key: Key = (run["setup"], run["qos"], run["size"], run["rate"])
            if run.get("summary") is None:
                failed[key] = failed.get(key, 0) + 1
                grouped.setdefault(key, [])
                continue
            grouped.setdefault(key, []).append(RunSummary(**run["summary"]))
        out: dict[Key, dict[str, float]] = {}
        for key, summaries in grouped.items():
            combined = combine_rounds(summaries) if summaries else {"rounds": 0.0}
            combined["failed"] = float(failed.get(key, 0))
            out[key] = combined
        return out


def _num(value: float, digits: int = 0) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def _ms(value: float) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.2f}" if value < 10 else f"{value:,.0f}"


def _percent(fraction: float) -> str:
    return "-" if math.isnan(fraction) else f"{100 * fraction:.0f}%"


def _counts(row: dict[str, float] | None) -> str:
    """loss / duplicates over all rounds, and failed runs if any."""
    if row is None:
        return "-"
    text = f"{int(row.get('lost', 0))} / {int(row.get('duplicates', 0))}"
    if row.get("failed"):
        text += f" ({int(row['failed'])} failed)"
    return text


def _ratio(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def setup_order(names: Iterable[str]) -> list[str]:
    """single first, then bridges and federations by length, each bridge chain before the federation."""
    def key(name: str) -> tuple[int, int]:
        kind, _, count = name.partition("-")
        return (int(count) if count.isdigit() else 1,
                {"single": 0, "bridge": 1, "relay": 2, "federation": 3}.get(kind, 4))

    return sorted(set(names), key=key)


def brokers_of(setup: str) -> int:
    _, _, count = setup.partition("-")
    return int(count) if count.isdigit() else 1


def tables(results: Results) -> str:
    """The markdown tables: one per (QoS, size) with every setup, then the ratios."""
    combined = results.combined()
    setups = setup_order(key[0] for key in combined)
    variants = sorted({(key[1], key[2]) for key in combined})
    rates = sorted({key[3] for key in combined if key[3] is not None})
    out: list[str] = []
    for qos, size in variants:
        out.append(f"### QoS {qos}, {size} B payload\n")
        header = ["setup", "max msg/s", "loss / dup (max)"]
        for rate in rates:
            label = f"{rate:,.0f}/s"
            header += [f"{label}: delivered msg/s", f"{label}: p50 / p90 / p99 ms", f"{label}: loss / dup"]
        first = f"{rates[0]:,.0f}/s" if rates else "max"
        header += [f"wrappers CPU s / 1000 msgs ({first} \\| max)", f"brokers CPU s / 1000 msgs ({first} \\| max)"]
        header += ["clients CPU s / 1000 msgs (max)", "machine idle (max)"]
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        for setup in setups:
            row = [setup]
            top = combined.get((setup, qos, size, None))
            row += [_num(top.get("rate", math.nan)) if top else "-", _counts(top)]
            for rate in rates:
                paced = combined.get((setup, qos, size, rate))
                if paced is None:
                    row += ["-", "-", "-"]
                    continue
                achieved = paced.get("rate", math.nan)
                delivered = _num(achieved)
                if not math.isnan(achieved) and achieved < SATURATED * rate:
                    delivered += " (saturated)"
                latency = " / ".join(_ms(paced.get(name, math.nan)) for name in ("p50_ms", "p90_ms", "p99_ms"))
                row += [delivered, latency, _counts(paced)]
            paced_row = (combined.get((setup, qos, size, rates[0])) if rates else None) or {}
            for name in ("wrapper_cpu_per_1000", "broker_cpu_per_1000"):
                if name.startswith("wrapper") and not setup.startswith(("federation", "relay")):
                    row.append("-")
                    continue
                row.append(f"{_num(paced_row.get(name, math.nan), 3)} \\| {_num((top or {}).get(name, math.nan), 3)}")
            row.append(_num((top or {}).get("client_cpu_per_1000", math.nan), 3))
            row.append(_percent((top or {}).get("idle_fraction", math.nan)))
            out.append("| " + " | ".join(row) + " |")
        out.append("")
    out.append(ratio_table(combined, setups, variants, rates))
    return "\n".join(out)


def ratio_table(combined: dict[Key, dict[str, float]], setups: Sequence[str], variants: Sequence[tuple[int, int]],
                rates: Sequence[float]) -> str:
    """Federation (and the relay floor) against the bridge chain of the same length and the single broker."""
    lines = ["### Ratios (federation / bridge chain, federation / single broker) and latency added per hop\n",
             "A `relay-N` row, in place of the federation: two extra C processes per hop doing nothing but MQTT, the "
             "latency floor of such a hop (docs/benchmarks.md).\n"]
    rate = rates[0] if rates else None
    at = f" at {rate:,.0f}/s" if rate is not None else ""
    header = ["QoS", "size", "brokers", "setup", "max msg/s: ours / bridge", "max msg/s: ours / single",
              f"p50{at}: ours / bridge", f"p99{at}: ours / bridge",
              f"p50 added per hop{at}, ms: ours \\| bridge", f"p99 added per hop{at}, ms: ours \\| bridge"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    federations = [s for s in setups if s.startswith(("federation-", "relay-"))]
    for qos, size in variants:
        single_top = combined.get(("single", qos, size, None), {})
        single_paced = combined.get(("single", qos, size, rate), {})
        for federation in federations:
            brokers = brokers_of(federation)
            bridge = f"bridge-{brokers}"
            ours_top = combined.get((federation, qos, size, None), {})
            theirs_top = combined.get((bridge, qos, size, None), {})
            ours = combined.get((federation, qos, size, rate), {})
            theirs = combined.get((bridge, qos, size, rate), {})
            nan = math.nan
            lines.append("| " + " | ".join([
                str(qos), f"{size} B", str(brokers), federation,
                _ratio(ratio(ours_top.get("rate", nan), theirs_top.get("rate", nan))),
                _ratio(ratio(ours_top.get("rate", nan), single_top.get("rate", nan))),
                _ratio(ratio(ours.get("p50_ms", nan), theirs.get("p50_ms", nan))),
                _ratio(ratio(ours.get("p99_ms", nan), theirs.get("p99_ms", nan))),
                f"{_hop(ours, single_paced, 'p50_ms', brokers)} \\| {_hop(theirs, single_paced, 'p50_ms', brokers)}",
                f"{_hop(ours, single_paced, 'p99_ms', brokers)} \\| {_hop(theirs, single_paced, 'p99_ms', brokers)}",
            ]) + " |")
    lines.append("")
    return "\n".join(lines)


def _hop(chain: dict[str, float], single: dict[str, float], name: str, brokers: int) -> str:
    return _ms(added_per_hop(chain.get(name, math.nan), single.get(name, math.nan), brokers))


def chart(results: Results, path: Path) -> None:
    """A PNG: throughput per setup (top) and latency p50/p99 at the lowest offered rate (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    combined = results.combined()
    setups = setup_order(key[0] for key in combined)
    variants = sorted({(key[1], key[2]) for key in combined})
    rates = sorted({key[3] for key in combined if key[3] is not None})
    rate = rates[0] if rates else None
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8.5))
    width = 0.8 / max(1, len(setups))
    positions = list(range(len(variants)))
    labels = [f"QoS {qos}, {size} B" for qos, size in variants]
    drawn = {"top": False, "bottom": False}
    for index, setup in enumerate(setups):
        offsets = [p + (index - (len(setups) - 1) / 2) * width for p in positions]
        throughput = [combined.get((setup, q, s, None), {}).get("rate", math.nan) for q, s in variants]
        top.bar(offsets, [0 if math.isnan(v) else v for v in throughput], width, label=setup)
        p50 = [combined.get((setup, q, s, rate), {}).get("p50_ms", math.nan) for q, s in variants]
        p99 = [combined.get((setup, q, s, rate), {}).get("p99_ms", math.nan) for q, s in variants]
        bottom.bar(offsets, [0 if math.isnan(v) else v for v in p99], width, color=f"C{index}", alpha=0.35)
        bottom.bar(offsets, [0 if math.isnan(v) else v for v in p50], width, color=f"C{index}", label=setup)
        drawn["top"] = drawn["top"] or any(v > 0 for v in throughput)
        drawn["bottom"] = drawn["bottom"] or any(v > 0 for v in p50 + p99)
    if drawn["top"]:
        top.set_yscale("log")
    top.set_ylabel("delivered msg/s (as fast as possible, median)")
    top.set_xticks(positions, labels)
    top.legend(ncol=min(5, len(setups)), fontsize="small")
    top.set_title("Throughput: publisher on the first broker, subscriber on the last")
    if drawn["bottom"]:
        bottom.set_yscale("log")
    bottom.set_ylabel("latency ms: p50 (solid), p99 (light)")
    bottom.set_xticks(positions, labels)
    bottom.set_title(f"Latency at {rate:,.0f} msg/s offered" if rate is not None else "Latency")
    rounds = results.environment.get("rounds", "?")
    figure.suptitle(f"mqtt-federation vs Mosquitto bridges (median of {rounds} rounds; "
                    f"{results.environment.get('machine', '')})", fontsize="medium")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
