"""The deterministic simulator: many protocol nodes on a virtual network, driven by scenarios.

`run_scenario(scenario, seed=..., events_path=...)` runs one scenario and
returns its report; see docs/simulator.md for the model, the rules and the
report schema.
"""

from __future__ import annotations

from federation.sim.runner import Simulation, run_scenario

__all__ = ["Simulation", "run_scenario"]
