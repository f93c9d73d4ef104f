"""Run a scenario on real brokers and wrappers, on any `Platform`, and report it like the simulator.

Theory of operation
-------------------
The driver is the real-process twin of `federation.sim.runner`: it keeps the
same ground truth (`federation.scenario.truth.GroundTruth`: alive nodes, links
up, subscriptions, the expected-delivery rule) and the same convergence
tracker, but the nodes are real Mosquitto brokers and `wrapper.py` daemons
on a `Platform` (docs/partitions.md; the interface is documented in
`federation.harness.platform`), time is the wall clock, and what the nodes
believe is read from their status documents.

1. Check the scenario (names, links, cuts between neighbours) and ask the
   platform whether it can run it (`preflight`): both before anything is
   created, so a bad input costs nothing.
2. Make the nodes, start every broker, then every wrapper, and wait until
   every wrapper is ready (connected to its broker, log lines flowing). That
   instant is run time 0: scenario times count from there, and the `start`
   phase's convergence is measured from it.
3. Execute the timeline on the wall clock. `subscribe` / `unsubscribe` /
   `disconnect` drive real `mosquitto_sub` processes
   (`federation.harness.clients`); every message of a `publish` is a line
   to the event's `mosquitto_pub -l` (`federation.harness.publishers`), a
   payload `{"id", "sent", "fill"}` as in the simulator; `cut` / `heal` /
   `loss` update `LinkState` and the platform installs the inbound packet
   filters of the nodes concerned; `kill` is kill -9 of the wrapper;
   `restart` kills what runs and starts it again (with `broker: true` the
   broker too, after which the node's subscribers are restarted once the
   wrapper is back on its broker: Mosquitto logs their subscriptions again
   only then). Disruptions update the ground truth and
   open a convergence phase exactly as in the simulator.
4. A poller thread (`federation.harness.poller`) asks every running wrapper
   for its status (every 0.1 s while a phase has not settled, every second
   otherwise) and feeds the views to the tracker. A phase settles at the
   start time of the first poll whose views agree with the ground truth (so
   the figure has the resolution of the poll interval); a poll that began
   before the latest disruption never settles the new phase.
5. After `duration`, wait (at most `DRAIN_SECONDS`) for deliveries still in
   flight, take a last status of every node, stop the clients and then the
   wrappers cleanly (their event logs are complete then), copy every node's
   files, and build the report with `federation.scenario.report.build_report`
   from what the subscribers printed and what the event logs and statuses
   counted.

Whatever happens (an error, Ctrl-C, SIGTERM), `Platform.destroy` runs last.
The events directory (`events_path`) receives `run.jsonl` (the driver's own
events, below), `nodes/<name>/` (each node's event log, broker and wrapper
logs, configs) and `clients/` (every subscriber's output).
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from federation.harness.checks import check_scenario, node_plans
from federation.harness.clients import Receipts, SubscriberClients, deliveries, read_receipts
from federation.harness.links import LinkState
from federation.harness.nodeconfig import WRAPPER_PORT
from federation.harness.platform import NodePlan, Platform, PlatformError
from federation.harness.poller import StatusPoller, wait_ready
from federation.harness.processes import LaunchError, end_all, poll
from federation.harness.publishers import Publishers
from federation.harness.signals import RunInterrupted, interrupt_on_sigterm, signals_held
from federation.harness.traffic import TrafficTally, lifetimes_seconds
from federation.protocol.types import Address
from federation.scenario.loader import ScenarioError
from federation.scenario.model import (
    Cut,
    Disconnect,
    Heal,
    Kill,
    Loss,
    Publish,
    Restart,
    Scenario,
    ScenarioEvent,
    Subscribe,
    Unsubscribe,
)
from federation.scenario.report import NodeRecord, build_report
from federation.scenario.truth import ConvergenceTracker, GroundTruth

EVENT_SCHEMA_VERSION = 1
LINK_EVENTS = (Cut, Heal, Loss)
READY_SECONDS = 30.0
"""seconds every wrapper gets to become ready, plus READY_SECONDS_PER_NODE per node (2 CPUs are slow)"""
READY_SECONDS_PER_NODE = 2.0
DRAIN_SECONDS = 3.0
"""seconds after `duration` to wait for expected deliveries still in flight"""
LATE_SECONDS = 0.25
"""an action applied this much after its scheduled time is reported as `run_late`"""
RESTART_READY_SECONDS = 15.0
"""seconds a restarted wrapper gets to reach its restarted broker before the node's subscribers restart"""

_RUN_LAYOUT = ("run.jsonl", "nodes", "clients")
"""what the driver writes into the events directory (and may replace there)"""


class Driver:
    """One scenario run on one platform; `run()` returns the report dict."""

    def __init__(self, scenario: Scenario, platform: Platform, *, seed: int, events_path: str | None) -> None:
        self.scenario = scenario
        self.platform = platform
        self.seed = seed
        self.events_dir = Path(events_path) if events_path else None
        self.wall_started = time.perf_counter()
        self.names = scenario.node_names()
        self.lock = threading.RLock()
        self.t0_monotonic = 0.0
        self.t0_unix = 0.0
        self.started = False
        self.files: Path | None = None
        self.events_file: IO[str] | None = None
        self.links = LinkState(scenario.links, scenario.link_model.loss)
        self.truth: GroundTruth | None = None
        self.tracker: ConvergenceTracker | None = None
        self.alive: set[str] = set()
        self.lifetimes: dict[str, list[tuple[float, float | None]]] = {name: [] for name in self.names}
        self.tally = TrafficTally()
        self.publishers: Publishers | None = None  # made at run time 0, in _run
        self.violations: list[str] = []
        self.clients: SubscriberClients | None = None
        self.poller: StatusPoller | None = None  # made with the tracker, in _run
        self.late: list[tuple[str, float]] = []

    # ------------------------------------------------------------ time

    def now(self) -> float:
        """Run time: seconds since every wrapper was ready (0 before that)."""
        return time.monotonic() - self.t0_monotonic if self.started else 0.0

    def _wait_until(self, at: float) -> None:
        while True:
            remaining = self.t0_monotonic + at - time.monotonic()
            if self.poller is not None:
                self.poller.check()
            if remaining <= 0:
                return
            time.sleep(min(remaining, 0.2))

    # ------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        check_scenario(self.scenario)
        plans = node_plans(self.scenario, self.seed)
        self._check_events_dir()
        self.platform.preflight(plans, self.scenario.links)
        self._clear_events_dir()
        try:
            with interrupt_on_sigterm():
                try:
                    return self._run(plans)
                finally:
                    with signals_held():
                        self._cleanup()
        except RunInterrupted as interrupted:
            # Everything is cleaned up: now end the way SIGTERM ends a process, as the sender expects.
            signal.signal(interrupted.signum, signal.SIG_DFL)
            os.kill(os.getpid(), interrupted.signum)
            raise

    def _check_events_dir(self) -> None:
        """ScenarioError if the events directory cannot be ours: a file, or a directory with other files."""
        directory = self.events_dir
        if directory is None:
            return
        if directory.exists() and not directory.is_dir():
            raise ScenarioError(f"--events {directory}: a file of that name exists; the netns and lxd backends "
                                f"write a directory there (run.jsonl, nodes/, clients/): give a new name")
        if directory.is_dir():
            foreign = sorted(entry.name for entry in directory.iterdir() if entry.name not in _RUN_LAYOUT)
            if foreign:
                raise ScenarioError(f"--events {directory}: the directory holds other files ({', '.join(foreign)}); "
                                    f"give an empty or new directory")

    def _clear_events_dir(self) -> None:
        """Remove what an earlier run wrote there (only the driver's own layout)."""
        directory = self.events_dir
        if directory is not None and directory.is_dir():
            for name in _RUN_LAYOUT:
                path = directory / name
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()

    def _run(self, plans: list[NodePlan]) -> dict[str, Any]:
        platform = self.platform
        platform.create(plans, self.scenario.links)
        self.files = self.events_dir or platform.workdir / "run"
        (self.files / "clients").mkdir(parents=True, exist_ok=True)
        self.events_file = open(self.files / "run.jsonl", "w", encoding="utf-8")  # noqa: SIM115 - closed in _cleanup
        addresses = {name: Address(platform.address(name), WRAPPER_PORT) for name in self.names}
        self.truth = GroundTruth(self.names, addresses, self.scenario.settle)
        self.tracker = ConvergenceTracker(self.truth)
        self.poller = StatusPoller(platform, self.tracker, self.tally, lock=self.lock, alive=self.alive,
                                   now=self.now, event=self._event)
        self.clients = SubscriberClients(platform, self.files / "clients", self.now)
        for name in self.names:
            filters = self.links.inbound(name)
            if filters:
                platform.set_inbound(name, filters)
        for name in self.names:
            platform.start_broker(name)
        spawned = time.monotonic()
        for name in self.names:
            platform.start_wrapper(name)
        wait_ready(self.platform, self.names, READY_SECONDS + READY_SECONDS_PER_NODE * len(self.names))
        self.t0_monotonic = time.monotonic()
        self.t0_unix = time.time()
        self.started = True
        self.publishers = Publishers(platform, self.files / "clients" / "publishers.out", self.truth, lock=self.lock,
                                     now=self.now, t0_unix=self.t0_unix, event=self._event)
        for name in self.names:
            self.alive.add(name)
            self.lifetimes[name].append((0.0, None))
        self._event("run_start", None, scenario=self.scenario.name, seed=self.seed, backend=platform.backend,
                    t0_unix=round(self.t0_unix, 6), ready_seconds=round(self.t0_monotonic - spawned, 3),
                    nodes={name: str(address) for name, address in addresses.items()},
                    vids={plan.name: plan.vid for plan in plans}, links=[list(link) for link in self.scenario.links])
        with self.lock:
            self.truth.set_topology(self.names, self.links.up_links())
            self.truth.loss_active = self.links.loss_active()
            self.tracker.begin_phase("start", 0.0)
        self.poller.start()
        self._execute_timeline()
        self._wait_until(self.scenario.duration)
        self._drain()
        return self._finish()

    # ------------------------------------------------------------ the timeline

    def _execute_timeline(self) -> None:
        assert self.publishers is not None
        queue: list[tuple[float, int, Callable[[], None], str]] = []
        order = 0
        batch: list[Cut | Heal | Loss] | None = None
        batch_at: float | None = None
        for event in self.scenario.events:
            if not isinstance(event, LINK_EVENTS):
                batch = None  # only consecutive link events of one instant are applied together
            if isinstance(event, Publish):
                for at, action, kind in self.publishers.schedule(event):
                    order += 1
                    heapq.heappush(queue, (at, order, action, kind))
            elif isinstance(event, LINK_EVENTS):
                # Link changes at one instant are applied together: one filter update per node.
                if batch_at == event.at and batch is not None:
                    batch.append(event)
                    continue
                batch, batch_at = [event], event.at
                order += 1
                heapq.heappush(queue, (event.at, order, _bind(self._apply_links, batch), "links"))
            else:
                order += 1
                heapq.heappush(queue, (event.at, order, _bind(self._apply, event), type(event).__name__.lower()))
        while queue:
            at, _, action, kind = heapq.heappop(queue)
            self._wait_until(at)
            late = self.now() - at
            if late > LATE_SECONDS:
                self.late.append((kind, late))
                self._event("run_late", None, action=kind, scheduled=at, late=round(late, 3))
            action()

    def _apply(self, event: ScenarioEvent) -> None:
        assert self.clients is not None and self.truth is not None and self.tracker is not None
        truth, tracker, clients = self.truth, self.tracker, self.clients
        if isinstance(event, Subscribe):
            with self.lock:
                truth.subscribe(event.node, event.client, event.filter, self.now())
                tracker.dirty = True
            clients.subscribe(event.node, event.client, event.filter, event.qos)
            self._event("run_subscribe", event.node, client=event.client, filter=event.filter, qos=event.qos)
        elif isinstance(event, Unsubscribe):
            with self.lock:
                truth.unsubscribe(event.node, event.client, event.filter)
                tracker.dirty = True
            clients.unsubscribe(event.node, event.client, event.filter)
            self._event("run_unsubscribe", event.node, client=event.client, filter=event.filter)
        elif isinstance(event, Disconnect):
            with self.lock:
                truth.disconnect(event.node, event.client)
                tracker.dirty = True
            clients.disconnect(event.node, event.client)
            self._event("run_disconnect", event.node, client=event.client)
        elif isinstance(event, Kill):
            self._event("run_kill", event.node)
            self._disrupt(event.at, f"kill {event.node}", [event.node], lambda: self._kill(event.node))
        elif isinstance(event, Restart):
            self._disrupt(event.at, f"restart {event.node}", [event.node],
                          lambda: self._restart(event.node, event.broker))
            if event.broker:
                self._resubscribe_after_broker_restart(event.node)
        else:  # pragma: no cover - the model's union is closed
            raise TypeError(f"unknown scenario event {event!r}")

    def _apply_links(self, events: list[Cut | Heal | Loss]) -> None:
        """Cuts, heals and loss changes of one instant: one disruption, one filter update per node."""
        labels: list[str] = []
        touched: list[str] = []
        for event in events:
            if isinstance(event, Cut):
                labels.append(f"cut {event.a}->{event.b}" if event.oneway else f"cut {event.a}-{event.b}")
                touched += [event.a, event.b]
                self._event("run_cut", None, a=event.a, b=event.b, oneway=event.oneway)
            elif isinstance(event, Heal):
                labels.append(f"heal {event.a}-{event.b}")
                touched += [event.a, event.b]
                self._event("run_heal", None, a=event.a, b=event.b)
            else:
                link = event.link
                labels.append(f"loss {event.percent:g}% {f'{link[0]}-{link[1]}' if link else 'all links'}")
                touched += list(link) if link else list(self.names)
                self._event("run_loss", None, percent=event.percent, link=list(link) if link else None)

        def change() -> None:
            changed: set[str] = set()
            for event in events:
                if isinstance(event, Cut):
                    changed |= self.links.cut(event.a, event.b, event.oneway)
                elif isinstance(event, Heal):
                    changed |= self.links.heal(event.a, event.b)
                else:
                    changed |= self.links.set_loss(event.percent, event.link)
            self.platform.set_inbound_many({name: self.links.inbound(name) for name in sorted(changed)})

        self._disrupt(events[0].at, labels, sorted(set(touched)), change)

    def _disrupt(self, at: float, labels: str | list[str], touched: list[str], change: Callable[[], None]) -> None:
        """As the simulator's `_disrupt`: the truth before and after the change, then a new phase."""
        assert self.truth is not None and self.tracker is not None
        with self.lock:
            now = self.now()
            self.truth.disrupt(now, touched)
            change()
            done = self.now()
            self.truth.set_topology(sorted(self.alive), self.links.up_links())
            self.truth.disrupt(done, touched)
            parts = [labels] if isinstance(labels, str) else labels
            self._event("run_applied", None, change=", ".join(parts), scheduled=at, started=round(now, 6),
                        seconds=round(done - now, 6))
            self.truth.loss_active = self.links.loss_active()
            for label in parts:
                self.tracker.begin_phase(label, at)
            assert self.poller is not None
            self.poller.disrupted()

    def _kill(self, name: str) -> None:
        assert self.tracker is not None
        status = self.platform.stop_wrapper(name, kill=True)
        self._node_down(name)
        self._event("run_killed", name, exit_status=status)

    def _node_down(self, name: str) -> None:
        assert self.poller is not None
        if name in self.alive:
            self.alive.discard(name)
            start, _ = self.lifetimes[name][-1]
            self.lifetimes[name][-1] = (start, self.now())
        self.poller.forget(name)

    def _restart(self, name: str, broker: bool) -> None:
        crashed = self.platform.wrapper_running(name)
        if crashed:
            self.platform.stop_wrapper(name, kill=True)
        self._node_down(name)
        if broker:
            assert self.publishers is not None
            self.publishers.close(name)  # what they read is sent before the broker goes
            self.platform.stop_broker(name, kill=True)
            self.platform.start_broker(name)
        self.platform.start_wrapper(name)
        self.alive.add(name)
        self.lifetimes[name].append((self.now(), None))
        self._event("run_restart", name, crashed=crashed, broker=broker)

    def _resubscribe_after_broker_restart(self, name: str) -> None:
        """A restarted broker forgot its clients, and logs their subscriptions again only when they
        subscribe again: wait until the wrapper reads the new broker's log, then restart the clients."""
        assert self.clients is not None
        try:
            wait_ready(self.platform, [name], RESTART_READY_SECONDS)
        except PlatformError as error:
            self.violations.append(f"restart {name} with its broker: the wrapper did not come back: {error}")
            return
        self.clients.restart_node(name)
        self._event("run_resubscribed", name)

    # ------------------------------------------------------------ the end

    def _drain(self) -> None:
        """Wait until every expected delivery has been printed, or DRAIN_SECONDS."""
        assert self.clients is not None and self.publishers is not None
        wanted = self.publishers.expected_deliveries()

        def all_printed() -> bool:
            receipts = read_receipts(self.clients.runs if self.clients else [], 0.0, final=False)
            have = {(identifier, node) for node, receivers in receipts.by_node.items()
                    for copies in receivers.values() for identifier in copies}
            return wanted <= have

        with contextlib.suppress(LaunchError):
            poll(all_printed, DRAIN_SECONDS, "expected deliveries", interval=0.1)

    def _finish(self) -> dict[str, Any]:
        assert self.truth is not None and self.clients is not None and self.poller is not None
        assert self.publishers is not None
        self.poller.stop()
        self.poller.poll_once()
        end = self.now()
        for text in self._final_violations(end):
            self.violations.append(text)
            self._event("run_violation", None, text=text)
        node_records = self._node_records()
        self.clients.stop_all()
        self.publishers.close()
        self.platform.stop_all()
        node_seconds = sum(lifetimes_seconds(spans, end) for spans in self.lifetimes.values())
        assert self.files is not None
        bad_lines = 0
        for name in self.names:
            event_log = self.platform.collect(name, self.files / "nodes" / name)
            bad_lines += self.tally.read_event_log(name, event_log)
        publications, sent = self.publishers.records()
        receipts: Receipts = read_receipts(self.clients.runs, self.t0_unix, final=True)
        delivered = deliveries(receipts, self.clients.runs, sent, self.clients.history)
        phases = self.poller.phase_records()
        report = build_report(
            scenario=self.scenario.name, seed=self.seed, backend=self.platform.backend,
            duration=self.scenario.duration, publications=publications, deliveries=delivered, phases=phases,
            nodes=node_records, traffic=self.tally.record(node_seconds), violations=self.violations,
            wall_seconds=time.perf_counter() - self.wall_started)
        self._event("run_end", None, duration=self.scenario.duration, invariants_ok=report["invariants"]["ok"],
                    lost=report["publications"]["lost"], duplicates=report["publications"]["duplicates"],
                    unexpected=report["publications"]["unexpected"], foreign_lines=receipts.foreign,
                    unreadable_event_lines=bad_lines, late_actions=len(self.late))
        return report

    def _final_violations(self, end: float) -> list[str]:
        """As the simulator: every component quiet for `settle` seconds must have converged."""
        assert self.truth is not None and self.tracker is not None
        problems = []
        with self.lock:
            truth = self.truth
            for index in truth.quiet_components(end):
                problem = self.tracker.component_problem(index)
                if problem is not None:
                    names = ", ".join(sorted(truth.components[index]))
                    problems.append(f"at the end (t={end:.3f}), quiet component [{names}] has not converged: "
                                    f"{problem}")
        return problems

    def _node_records(self) -> list[NodeRecord]:
        assert self.poller is not None
        records = []
        for name in self.names:
            document = self.poller.last_status.get(name)
            if name not in self.alive:
                records.append(NodeRecord(name, False))
                continue
            if document is None:
                records.append(NodeRecord(name, True))
                continue
            topics = {str(row["filter"]): str(row["core"]) for row in document.get("topics", []) if row.get("core")}
            records.append(NodeRecord(name, True, document.get("broker_id"), document.get("management_core"),
                                      topics, len(document.get("federation", []))))
        return records

    def _cleanup(self) -> None:
        if self.poller is not None:
            self.poller.stop(timeout=5)
        if self.clients is not None:
            with contextlib.suppress(Exception):
                self.clients.stop_all()
        if self.publishers is not None:
            with contextlib.suppress(Exception):
                end_all(self.publishers.processes(), timeout=2)
        if self.events_dir is not None and self.files is not None:
            # A failed run still leaves its node files for diagnosis.
            for name in self.names:
                if not (self.files / "nodes" / name).exists():
                    with contextlib.suppress(Exception):
                        self.platform.collect(name, self.files / "nodes" / name)
        if self.events_file is not None:
            self.events_file.close()
            self.events_file = None
        self.platform.destroy()

    # ------------------------------------------------------------ the events file

    def _event(self, kind: str, name: str | None, **fields: Any) -> None:
        if self.events_file is None:
            return
        node = f"{self.platform.address(name)}:{WRAPPER_PORT}" if name is not None else "run"
        record: dict[str, Any] = {"v": EVENT_SCHEMA_VERSION, "t": round(self.now(), 6), "node": node, "type": kind}
        if name is not None:
            record["name"] = name
        record.update(fields)
        with self.lock:
            self.events_file.write(json.dumps(record, separators=(",", ":"), default=str) + "\n")
            self.events_file.flush()


def _bind(function: Callable[[Any], None], argument: Any) -> Callable[[], None]:
    return lambda: function(argument)


def run_on_platform(scenario: Scenario, platform: Platform, *, seed: int, events_path: str | None) -> dict[str, Any]:
    """Run `scenario` on `platform`; the report dict (schema: docs/simulator.md "Report")."""
    return Driver(scenario, platform, seed=seed, events_path=events_path).run()
