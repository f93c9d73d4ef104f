"""Clock offsets between nodes, from the hello exchange, and the correction of event times.

Theory of operation
-------------------
Each node stamps its events with its own clock; on different machines the
clocks disagree, and a latency computed across two machines inherits the
difference. The hello exchange measures it (docs/protocol.md, rule 1): node
A sends `hl` at t1 (A's clock), B answers `hb` carrying t1 and its own time
t2 = t3 (B stamps receive and reply with the same instant), A receives it at
t4. Then

    rtt    = t4 - t1
    offset = ((t2 - t1) + (t3 - t4)) / 2 = t3 - (t1 + rtt / 2)    (B's clock minus A's)

and the true offset lies within rtt / 2 of it, whatever the asymmetry of
the two one-way delays (B's instant lies between t1 and t4 in A's time).
Nodes report samples in `neighbour_up` (`clock_offset`, `clock_error`) and,
every `stats_interval`, the best recent sample per neighbour in `counters`
(`clocks`).

Here every measured pair keeps its sample with the smallest error bound
(both directions count: B's view of A is the negated offset). The pairs
form a graph; each node's offset from a reference node is the sum of the
pair offsets along the path of least total error from the reference
(Dijkstra on the error bounds), and its error bound is that sum of bounds.
The reference is the clock most nodes share: the node from which the fewest
offsets exceed their bounds, then the one whose paths have the least total
error (or the one named with `--clock-reference`). The majority clock is
also the clock of the timeline when one machine's clock is off (the
simulator's, the harness's host, the scenario's anchor). An event's corrected time is its time
minus its node's offset, i.e. the reference node's clock.

`auto` correction applies an offset only when it exceeds its error bound:
an offset smaller than its bound is indistinguishable from zero (all
machines share one clock, as in the simulator or on one host), and
correcting it would only add error. Offsets are assumed constant over a
run: drift shows as a widening spread of the samples, not corrected.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MODES = ("auto", "always", "never")
MAX_CENTRE_SEARCH = 400
"""above this many nodes the reference is the node with the most measured pairs (Dijkstra from each is slow)"""


@dataclass(frozen=True)
class Sample:
    observer: str
    """address of the node that measured"""
    neighbour: str
    """address of the measured neighbour"""
    offset: float
    """neighbour's clock minus observer's clock, seconds"""
    error: float
    """bound on |true offset - offset|: half the sample's round-trip time"""


@dataclass(frozen=True)
class NodeOffset:
    node: str
    offset: float
    """this node's clock minus the reference's clock"""
    error: float | None
    """bound on the offset's error; None when no measurement connects the node to the reference"""
    hops: int
    applied: bool


@dataclass(frozen=True)
class ClockEstimate:
    reference: str | None
    mode: str
    offsets: dict[str, NodeOffset]
    pairs: int
    """measured node pairs"""

    def correction(self) -> dict[str, float]:
        """node address -> seconds to subtract from its event times (only applied, non-zero offsets)."""
        return {node: item.offset for node, item in sorted(self.offsets.items()) if item.applied and item.offset}

    def max_error(self) -> float | None:
        errors = [item.error for item in self.offsets.values() if item.applied and item.error is not None]
        return max(errors) if errors else None


def best_pairs(samples: Iterable[Sample]) -> dict[tuple[str, str], tuple[float, float]]:
    """(low, high) address pair -> (offset of high minus low, error) of the sample with the smallest error."""
    best: dict[tuple[str, str], tuple[float, float]] = {}
    for sample in samples:
        if sample.observer == sample.neighbour or sample.error < 0 or sample.error != sample.error:
            continue
        if sample.observer < sample.neighbour:
            key, offset = (sample.observer, sample.neighbour), sample.offset
        else:
            key, offset = (sample.neighbour, sample.observer), -sample.offset
        held = best.get(key)
        if held is None or sample.error < held[1]:
            best[key] = (offset, sample.error)
    return best


def _paths(source: str, graph: Mapping[str, list[tuple[str, float, float]]]) -> dict[str, tuple[float, float, int]]:
    """Dijkstra on error bounds from `source`: node -> (offset from source, error, hops)."""
    done: dict[str, tuple[float, float, int]] = {}
    queue: list[tuple[float, int, str, float]] = [(0.0, 0, source, 0.0)]
    while queue:
        error, hops, node, offset = heapq.heappop(queue)
        if node in done:
            continue
        done[node] = (offset, error, hops)
        for other, pair_offset, pair_error in graph.get(node, ()):
            if other not in done:
                heapq.heappush(queue, (error + pair_error, hops + 1, other, offset + pair_offset))
    return done


def estimate(samples: Iterable[Sample], nodes: Iterable[str], mode: str = "auto",
             reference: str | None = None) -> ClockEstimate:
    """Every node's offset from the reference node's clock (see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"clock correction mode {mode!r}: expected one of {', '.join(MODES)}")
    all_nodes = sorted(set(nodes))
    pairs = best_pairs(samples)
    graph: dict[str, list[tuple[str, float, float]]] = defaultdict(list)
    for (low, high), (offset, error) in sorted(pairs.items()):
        graph[low].append((high, offset, error))
        graph[high].append((low, -offset, error))
    if reference is not None and reference not in all_nodes:
        raise ValueError(f"--clock-reference {reference}: no such node in the events "
                         f"(nodes: {', '.join(all_nodes[:10])}{'...' if len(all_nodes) > 10 else ''})")
    if reference is None and graph:
        candidates = sorted(graph)
        if len(candidates) <= MAX_CENTRE_SEARCH:
            def rank(node: str) -> tuple[int, int, float, str]:
                reached = _paths(node, graph)
                corrections = sum(1 for offset, error, _ in reached.values() if abs(offset) > error)
                return (-len(reached), corrections, sum(error for _, error, _ in reached.values()), node)
            reference = min(candidates, key=rank)
        else:
            reference = max(candidates, key=lambda node: (len(graph[node]), [-ord(c) for c in node]))
    reached = _paths(reference, graph) if reference is not None else {}
    offsets = {}
    for node in all_nodes:
        if node in reached:
            offset, error, hops = reached[node]
            applied = mode == "always" or (mode == "auto" and abs(offset) > error)
            offsets[node] = NodeOffset(node, offset, error, hops, applied and node != reference)
        else:
            offsets[node] = NodeOffset(node, 0.0, None, 0, False)
    return ClockEstimate(reference, mode, offsets, len(pairs))
