"""Pause CPython's cyclic garbage collector while a simulation runs.

Theory of operation
-------------------
A large simulation keeps millions of long-lived objects (every node holds
every other node's link-state record) and allocates millions of short-lived
ones (decoded packets). CPython's cyclic collector rescans the long-lived
ones each time enough new objects survive: measured on a 300-node cold
start, more than half the CPU went to those scans, and the share grows with
the size of the federation. The simulation creates almost no reference
cycles (a 100-node benchmark left none behind; a crashed node's object is
one), and plain reference counting frees everything else at once. So the
simulator pauses the collector for the run and runs one full collection
when it ends: memory is the same, less the scans.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused(collect: bool = True) -> Iterator[None]:
    """Disable the cyclic collector inside the block (if it was enabled), then (with `collect`) collect
    once. The bench passes False: its process ends at once, and a full collection of a 1,000-node heap
    (3 GB) takes minutes."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
            if collect:
                gc.collect()
