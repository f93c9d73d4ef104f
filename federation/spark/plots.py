"""The report's pictures (matplotlib, no display needed).

Theory of operation
-------------------
Each figure answers one question a person asks about a run:

- `convergence.png`: when did the federation agree again after each
  disruption? Nodes with a wrong view over time, phases marked, the
  converging interval shaded and labelled with its duration.
- `latency_cdf.png`: how long did deliveries take? The CDF with p50/p90/p99.
- `overhead.png`: what did the protocol cost? Control packets per node per
  second by message type over time, bytes on the right axis.
- `overlay.png`: what did the federation look like when each phase ended?
  The overlay links (up, or down/cut), the management core, each filter's
  topic core and the links publications used (in the mesh, toward the core).
- `cores_meshes.png`: core changes per time bucket and mesh sizes.

Node positions are computed once (layers by hop distance from the lowest
named node over the scenario's links) so the overlay pictures of successive
phases can be compared at a glance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend
from matplotlib.lines import Line2D  # noqa: E402

from federation.spark import DATA_TYPES  # noqa: E402

FILTER_COLOURS = ("tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:cyan", "tab:brown", "tab:pink",
                  "tab:olive")
MAX_OVERLAY_PANELS = 12
LABEL_LIMIT = 40
"""above this many nodes, overlay pictures drop node labels"""


def _phase_lines(axis: Any, phases: Sequence[Mapping[str, Any]], labels: bool = True) -> None:
    top = axis.get_ylim()[1]
    for phase in phases:
        axis.axvline(phase["at"], color="black", linewidth=0.8, linestyle="--", alpha=0.6)
        if labels:
            text = phase["label"] if len(phase["label"]) <= 40 else phase["label"][:37] + "..."
            axis.text(phase["at"], top, " " + text, rotation=90, va="top", ha="left", fontsize=7, alpha=0.8)


def convergence(path: Path, phases: Sequence[Mapping[str, Any]], series: Sequence[Sequence[float]],
                span: tuple[float, float]) -> None:
    figure, axis = plt.subplots(figsize=(11, 4.2))
    start, end = span
    if series:
        times = [point[0] for point in series] + [end]
        for column, label, colour in ((1, "nodes with wrong members", "tab:red"),
                                      (2, "nodes with wrong management core", "tab:orange"),
                                      (3, "components not converged", "tab:blue")):
            values = [point[column] for point in series]
            axis.step(times, values + values[-1:], where="post", label=label, color=colour, linewidth=1.3)
    axis.set_ylim(bottom=0, top=max([p[1] for p in series] + [p[3] for p in series] + [1]) * 1.35 + 0.5)
    for phase in phases:
        if phase["settled_at"] is not None:
            axis.axvspan(phase["at"], max(phase["settled_at"], phase["at"] + (end - start) * 0.002),
                         color="tab:orange", alpha=0.25)
            axis.annotate(f"{phase['seconds']:.3f} s", (phase["settled_at"], axis.get_ylim()[1] * 0.72),
                          fontsize=7, color="tab:red")
        else:
            axis.axvspan(phase["at"], phase["end"] if math.isfinite(phase["end"]) else end, color="red", alpha=0.12)
            axis.annotate("never converged", (phase["at"], axis.get_ylim()[1] * 0.62), fontsize=7, color="red")
    _phase_lines(axis, phases)
    axis.set_xlim(start, end)
    axis.set_xlabel("time (s)")
    axis.set_ylabel("count")
    axis.set_title("Convergence: disruptions (dashed), converging intervals (shaded) and their duration")
    axis.legend(loc="upper right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def latency_cdf(path: Path, quantiles: Sequence[float], percentiles: Mapping[str, float | None]) -> None:
    figure, axis = plt.subplots(figsize=(6.5, 4.2))
    if quantiles:
        values = [q * 1000 for q in quantiles]
        fractions = [(i + 1) / len(values) for i in range(len(values))]
        axis.step(values, fractions, where="post", color="tab:blue")
        for name, colour in (("p50", "tab:green"), ("p90", "tab:orange"), ("p99", "tab:red")):
            value = percentiles.get(name)
            if value is not None:
                axis.axvline(value * 1000, color=colour, linestyle=":", label=f"{name} {value * 1000:.3f} ms")
        axis.legend(fontsize=8, loc="lower right")
    else:
        axis.text(0.5, 0.5, "no delivered publication", ha="center", transform=axis.transAxes)
    axis.set_xlabel("end-to-end latency (ms)")
    axis.set_ylabel("fraction of deliveries")
    axis.set_ylim(0, 1.02)
    axis.set_title("Latency CDF (first delivery to each expected node)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def overhead(path: Path, series: Sequence[Mapping[str, Any]], phases: Sequence[Mapping[str, Any]],
             span: tuple[float, float]) -> None:
    figure, axis = plt.subplots(figsize=(11, 4.2))
    rows = [row for row in series if row["type"] not in DATA_TYPES and row["packets_per_node_s"] is not None]
    buckets = sorted({row["t"] for row in rows})
    kinds = sorted({row["type"] for row in rows})
    if buckets:
        width = series[0].get("width", None) or (buckets[1] - buckets[0] if len(buckets) > 1 else 1.0)
        table = {(row["t"], row["type"]): row for row in rows}
        stacks = [[table[(b, k)]["packets_per_node_s"] if (b, k) in table else 0.0 for b in buckets] for k in kinds]
        centres = [b + width / 2 for b in buckets]
        axis.stackplot(centres, stacks, labels=kinds, alpha=0.85, step="mid")
        totals = [sum(table[(b, k)]["bytes_per_node_s"] for k in kinds if (b, k) in table) for b in buckets]
        right = axis.twinx()
        right.plot(centres, totals, color="black", linewidth=1.2, label="bytes / node / s (right)")
        right.set_ylabel("control bytes / node / s")
        right.set_ylim(bottom=0)
        right.legend(loc="upper right", fontsize=8)
        axis.legend(loc="upper left", fontsize=8, ncol=min(len(kinds), 5), title="packets / node / s by type",
                    title_fontsize=8)
        axis.set_ylim(0, max(sum(col) for col in zip(*stacks, strict=True)) * 1.3 + 1e-9)
    else:
        axis.text(0.5, 0.5, "no counters events (stats_interval longer than the run?)", ha="center",
                  transform=axis.transAxes)
    _phase_lines(axis, phases, labels=False)
    axis.set_xlim(*span)
    axis.set_xlabel("time (s)")
    axis.set_ylabel("control packets / node / s")
    axis.set_title("Control overhead (all types but tm and tb), from the nodes' counters")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def cores_meshes(path: Path, core_changes: Sequence[Mapping[str, Any]], mesh_sizes: Sequence[Sequence[Any]],
                 phases: Sequence[Mapping[str, Any]], span: tuple[float, float]) -> None:
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(11, 5.5), sharex=True)
    start, end = span
    width = max((end - start) / 120, 1e-3)
    for kind, colour in (("management", "tab:red"), ("topic", "tab:blue")):
        times = [c["t"] for c in core_changes if c["kind"] == kind]
        if times:
            bins = max(1, int(math.ceil((end - start) / width)))
            top.hist(times, bins=bins, range=(start, end), alpha=0.6, color=colour, label=f"{kind} core changes")
    top.set_ylabel("changes per bucket")
    top.legend(fontsize=8, loc="upper right")
    top.set_title(f"Core changes (all nodes, {width:.3g} s buckets) and mesh sizes")
    by_filter: dict[str, list[tuple[float, int]]] = {}
    for t, filter_, size in mesh_sizes:
        by_filter.setdefault(filter_, []).append((t, size))
    for index, (filter_, points) in enumerate(sorted(by_filter.items())):
        times = [p[0] for p in points] + [end]
        sizes = [p[1] for p in points]
        bottom.step(times, sizes + sizes[-1:], where="post", label=filter_,
                    color=FILTER_COLOURS[index % len(FILTER_COLOURS)])
    if by_filter:
        bottom.legend(fontsize=8, loc="upper right", title="mesh of filter", title_fontsize=8)
    bottom.set_ylabel("mesh members")
    bottom.set_xlabel("time (s)")
    bottom.set_ylim(bottom=0)
    for axis in (top, bottom):
        _phase_lines(axis, phases, labels=False)
    bottom.set_xlim(start, end)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# ---------------------------------------------------------------- overlay

def layout(names: Sequence[str], links: Sequence[tuple[str, str]]) -> dict[str, tuple[float, float]]:
    """Layers by hop distance from the first name; within a layer, ordered by the mean x of the layer above."""
    adjacency: dict[str, set[str]] = {name: set() for name in names}
    for a, b in links:
        if a in adjacency and b in adjacency:
            adjacency[a].add(b)
            adjacency[b].add(a)
    layers: list[list[str]] = []
    seen: set[str] = set()
    for root in names:
        if root in seen:
            continue
        frontier = [root]
        seen.add(root)
        depth = 0
        while frontier:
            if depth >= len(layers):
                layers.append([])
            layers[depth].extend(frontier)
            following = sorted({other for node in frontier for other in adjacency[node] if other not in seen})
            seen.update(following)
            frontier = following
            depth += 1
    positions: dict[str, tuple[float, float]] = {}
    for depth, layer in enumerate(layers):
        def parent_x(node: str) -> float:
            xs = [positions[o][0] for o in adjacency[node] if o in positions]
            return sum(xs) / len(xs) if xs else 0.0
        ordered = sorted(layer, key=lambda node: (parent_x(node), node))
        for index, node in enumerate(ordered):
            positions[node] = (index - (len(ordered) - 1) / 2, -float(depth))
    return positions


def overlay(path: Path, phases: Sequence[Mapping[str, Any]], names: Mapping[str, str],
            links: Sequence[tuple[str, str]], edges: Mapping[int, Sequence[tuple[str, str, str, str]]]) -> None:
    """One panel per phase (the first ones and the last, at most MAX_OVERLAY_PANELS)."""
    chosen = list(phases)
    if len(chosen) > MAX_OVERLAY_PANELS:
        chosen = chosen[:MAX_OVERLAY_PANELS - 1] + chosen[-1:]
    ordered_names = sorted(names)
    positions = layout(ordered_names, links)
    address_name = {address: name for name, address in names.items()}
    columns = min(3, max(1, len(chosen)))
    rows = max(1, math.ceil(len(chosen) / columns))
    figure, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 4.4 * rows), squeeze=False)
    filters = sorted({f for phase in chosen for node in phase["snapshot"].values() for f in node["topic_cores"]}
                     | {edge[2] for index in edges for edge in edges[index]})
    colour = {f: FILTER_COLOURS[i % len(FILTER_COLOURS)] for i, f in enumerate(filters)}
    labelled = len(ordered_names) <= LABEL_LIMIT
    size = 260 if labelled else max(12, 3000 / max(1, len(ordered_names)))
    for axis in axes.flat:
        axis.axis("off")
    for axis, phase in zip(axes.flat, chosen, strict=False):  # more axes than phases
        snapshot = phase["snapshot"]
        for a, b in links:
            if a not in positions or b not in positions:
                continue
            up = a in snapshot and b in snapshot and b in snapshot[a]["up"] and a in snapshot[b]["up"]
            (x1, y1), (x2, y2) = positions[a], positions[b]
            axis.plot([x1, x2], [y1, y2], color="0.45" if up else "tab:red", linestyle="-" if up else ":",
                      linewidth=1.4 if up else 1.0, zorder=1)
        used = list(edges.get(phase["index"], ()))
        if not any(mode == "mesh" for *_, mode in used):  # no publication used the mesh: the parents chosen
            used += [(names.get(node, node), parent, f, "mesh") for node, state in snapshot.items()
                     for f, parents in state["meshes"].items() for parent in parents]
        for source, target, filter_, mode in sorted(set(used)):
            a = address_name.get(source, source)
            b = address_name.get(target, target)
            if a not in positions or b not in positions:
                continue
            shift = 0.04 * (filters.index(filter_) + 1) if filter_ in filters else 0.0
            (x1, y1), (x2, y2) = positions[a], positions[b]
            mesh = mode == "mesh"
            axis.annotate("", xy=(x2 + shift, y2 + shift), xytext=(x1 + shift, y1 + shift), zorder=2,
                          arrowprops={"arrowstyle": "->", "color": colour.get(filter_, "black"),
                                      "linewidth": 1.6 if mesh else 1.0, "linestyle": "-" if mesh else "--",
                                      "alpha": 0.8 if mesh else 0.6, "shrinkA": 9, "shrinkB": 9})
        cores = {state["management_core"] for state in snapshot.values()}
        for name in ordered_names:
            if name not in positions:
                continue
            x, y = positions[name]
            state = snapshot.get(name)
            if state is None:
                axis.scatter([x], [y], s=size, facecolor="white", edgecolor="0.6", marker="X", zorder=3)
            else:
                is_core = state["broker_id"] in cores
                axis.scatter([x], [y], s=size * (1.6 if is_core else 1.0), marker="*" if is_core else "o",
                             facecolor="gold" if is_core else "white", edgecolor="black", zorder=3)
                held = sorted(f for f in filters
                              if any(s["topic_cores"].get(f) == state["broker_id"] for s in snapshot.values()))
                for ring, filter_ in enumerate(held):
                    axis.scatter([x], [y], s=size * (2.2 + 0.9 * ring), facecolor="none", edgecolor=colour[filter_],
                                 linewidth=2.0, zorder=2)
            if labelled:
                axis.text(x, y - 0.22, name, ha="center", va="top", fontsize=8)
        title = phase["label"] if len(phase["label"]) <= 48 else phase["label"][:45] + "..."
        axis.set_title(f"end of: {title}", fontsize=9)
        axis.set_xlim(min(p[0] for p in positions.values()) - 0.8, max(p[0] for p in positions.values()) + 0.8)
        axis.set_ylim(min(p[1] for p in positions.values()) - 0.7, 0.6)
    handles = [Line2D([], [], marker="*", color="w", markerfacecolor="gold", markeredgecolor="black", markersize=13,
                      label="management core"),
               Line2D([], [], color="0.45", label="link up"),
               Line2D([], [], color="tab:red", linestyle=":", label="link down / cut"),
               Line2D([], [], marker="X", color="w", markeredgecolor="0.6", markersize=10, label="node down"),
               Line2D([], [], color="black", label="publications in the mesh"),
               Line2D([], [], color="black", linestyle="--", linewidth=1.0, label="publications toward the core")]
    handles += [Line2D([], [], marker="o", color="w", markerfacecolor="none", markeredgecolor=colour[f],
                       markeredgewidth=2, markersize=12, label=f"topic core / mesh {f}") for f in filters]
    figure.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), fontsize=8)
    figure.suptitle("Overlay at the end of each phase; arrows: links publications used in the phase "
                    "(the mesh parents when none did)", fontsize=10)
    figure.tight_layout(rect=(0, 0.07, 1, 0.96))
    figure.savefig(path, dpi=100)
    plt.close(figure)
