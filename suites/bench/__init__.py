"""Benchmarks of the real data path: one Mosquitto, Mosquitto bridge chains and federated brokers.

`python -m suites.bench` (cli.py) runs them; `setups.py` starts what is
compared, `runner.py` drives the C clients for one run, `stats.py` turns the
subscriber's output into figures, `report.py` writes the tables and chart.
docs/benchmarks.md has the command, the figures and how to read them.
"""
