"""Spark analysis of federation event logs: convergence, delivery, overhead, plots.

Run `federation-analyze --events 'DIR/*.jsonl' --out REPORT_DIR` (or
`python -m federation.spark`, or `python spark/convergence.py` in a checkout;
docs/spark.md). The modules without Spark (`timeline`, `replay`, `clocks`,
`topics`) hold the logic that is sequential by nature and small; the Spark
modules (`session`, `reader`, `analysis`) hold what scales with the number
of events.
"""

from __future__ import annotations

from federation.protocol import wire_constants

DATA_TYPES: tuple[str, ...] = tuple(sorted(wire_constants.DATA_TYPES))
"""packet types that carry publications (tm, tb, tq): data traffic; every other is control. Taken from the
protocol's own list, the one place that says it (a copy here once left out tq, and QoS 1/2 runs counted as
control)"""
