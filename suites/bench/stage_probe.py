"""The probe `python -m suites.bench.stages` loads into each wrapper: CPU time per stage of the data path.

Theory of operation: `install` wraps each function of `STAGES` (class attributes, so every object made after it
uses the wrapped one) with the thread's CPU clock, and on SIGUSR2 writes every stage's seconds and calls so far
to `<out>/stages-<pid>-<n>.json`. The command sends SIGUSR2 before and after the measured run and takes the
difference. Nothing in the wrapper changes: Python imports a `sitecustomize` module at start-up from its path,
and the command puts one there that calls `install` (`SITECUSTOMIZE`). The clock costs about 0.7 µs a reading
(`clock_gettime` of the thread's CPU time is a system call), two per call of a stage: a few percent of a pass.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENVIRONMENT = "MQTTFED_STAGE_PROBE"
"""the directory the probe writes to; a wrapper started without it loads no probe"""

STAGES: dict[str, tuple[str, str]] = {
    "loop": ("asyncio.base_events", "BaseEventLoop._run_once"),
    "broker pass": ("federation.daemon.broker_reading", "BrokerReading.on_readable"),
    "broker read": ("federation.daemon.broker_reading", "BrokerReading._read_pass"),
    "node, own publications": ("federation.protocol.node", "Node.local_publish_run"),
    "datagram pass": ("federation.daemon.receiving", "Receiving.on_datagram"),
    "envelope in": ("federation.envelope.datagrams", "Envelope.receive_datagram"),
    "node, packets in": ("federation.protocol.node", "Node.receive_packet"),
    "outputs": ("federation.daemon.running", "Running._drain_outputs"),
}
"""label -> (module, Class.method). They nest: a loop iteration runs the passes, a pass its node call and its
outputs (datagrams out, injections to the broker)."""

SITECUSTOMIZE = f"""\
import os, sys
if os.environ.get({ENVIRONMENT!r}) and sys.argv and sys.argv[0].endswith("wrapper.py"):
    from suites.bench import stage_probe
    stage_probe.install(os.environ[{ENVIRONMENT!r}])
"""
"""the `sitecustomize.py` the command writes (the wrapper's processes only)"""


class StageClock:
    """Seconds of the thread's CPU and calls, per stage."""

    def __init__(self, clock: Callable[[], float] = time.thread_time) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def timed(self, label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        clock, seconds, calls = self.clock, self.seconds, self.calls
        seconds[label], calls[label] = 0.0, 0

        @functools.wraps(function)
        def wrapper(*arguments: Any, **options: Any) -> Any:
            started = clock()
            try:
                return function(*arguments, **options)
            finally:
                seconds[label] += clock() - started
                calls[label] += 1

        return wrapper

    def snapshot(self) -> dict[str, list[float]]:
        return {label: [self.seconds[label], self.calls[label]] for label in self.seconds}


def wrap(stages: StageClock, label: str, module: str, qualified: str) -> None:
    class_name, method = qualified.split(".")
    owner = getattr(importlib.import_module(module), class_name)
    setattr(owner, method, stages.timed(label, getattr(owner, method)))


def install(out: str) -> StageClock:
    """Wrap every stage and write a snapshot on each SIGUSR2 (numbered from 1)."""
    stages = StageClock()
    for label, (module, qualified) in STAGES.items():
        wrap(stages, label, module, qualified)
    written = [0]

    def write(signum: int, frame: Any) -> None:
        written[0] += 1
        path = Path(out) / f"stages-{os.getpid()}-{written[0]}.json"
        path.with_suffix(".tmp").write_text(json.dumps(stages.snapshot()))
        path.with_suffix(".tmp").rename(path)  # whole when the command sees it

    signal.signal(signal.SIGUSR2, write)
    return stages
