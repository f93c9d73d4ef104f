"""A burst of QoS 2 publications through three brokers that keep Mosquitto's default `max_inflight_messages`.

Theory of operation: Mosquitto's default `max_inflight_messages` (20) is also
the Receive Maximum it announces to MQTT v5 clients, and a client that keeps
more QoS 1/2 publications unacknowledged than that loses its connection
(shared/reference/measured-behaviour.md). The federation must work with that
default (issue 19, item 4), so the burst's brokers are rendered from the
project's template with every `max_inflight_*` line commented out
(`setups.inflight_template`: the template may raise the limit for speed,
nothing may depend on it), on a line a-b-c of wrappers; a paho client on a
sends `count` QoS 2 publications as fast as its own 20 in-flight messages
allow, to a persistent QoS 2 `mosquitto_sub` on c. The verdict is the
suite's (`counting`): everything acknowledged arrives, once, in order.
The subscriber speaks MQTT 3.1.1: a persistent v5 `mosquitto_sub -q 2`
on one Mosquitto 2.0.11, with no federation at all, stopped with "A
network protocol error occurred when communicating with the broker" in 1
of 3 bursts of 2,000 (3.1.1: 0 of 3), and once it reconnects the broker's
queue for it brings the error back at once: the verdict would be the
client's, not the federation's.

It is an ordinary `suite.Job` (one case, no fault), so it runs in a worker
beside the suite's setups.
"""

from __future__ import annotations

from pathlib import Path

from suites.faults.runner import Timing
from suites.faults.setups import inflight_settings, inflight_template
from suites.faults.suite import CasePlan, Job

BURST_COUNT = 2000
BURST_TIMING = Timing(lead=0.0, tail=0.0, ack_timeout=60.0, quiet=10.0, drain_timeout=60.0)
"""no fault, so no lead or tail; a minute for the acknowledgements and the drain, ten quiet seconds end it"""


def burst_case(count: int) -> str:
    return f"burst-{count}"


def burst_job(workdir: Path, first_address: str, count: int = BURST_COUNT, timing: Timing = BURST_TIMING) -> Job:
    """The burst as a job on `federation-line`, its broker template written under `workdir`."""
    template = inflight_template(workdir / "mosquitto-default-inflight.conf", None)
    return Job("federation-line", (CasePlan(burst_case(count), (), streams=(2,), burst=count),), workdir,
               first_address, timing, mosquitto_template=template, qos2_v5=False)


def rendered_inflight(job: Job) -> dict[str, list[str]]:
    """The `max_inflight_*` lines of every broker config the job rendered (after it ran): all should be empty."""
    found = {}
    for config in sorted((job.workdir / "nodes").glob("*/mosquitto.conf")):
        found[config.parent.name] = inflight_settings(config.read_text(encoding="utf-8"))
    return found
