"""Spark analysis of federation event logs: convergence, delivery, overhead, plots.

Run `federation-analyze --events 'DIR/*.jsonl' --out REPORT_DIR` (or
`python -m federation.spark`, or `python spark/convergence.py` in a checkout;
docs/spark.md). The modules without Spark (`timeline`, `replay`, `clocks`,
`topics`) hold the logic that is sequential by nature and small; the Spark
modules (`session`, `reader`, `analysis`) hold what scales with the number
of events.
"""

DATA_TYPES = ("tm", "tb")
"""packet types that carry publications (federation.protocol.wire.DATA_TYPES): data traffic; every other is control"""
