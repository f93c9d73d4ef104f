"""The scenario driver's status queries: when the wrappers are ready, what they believe, when the run converged.

Theory of operation
-------------------
The simulator sees every change of every node the instant it happens; a real
run does not. What a wrapper believes is known only from its status document,
so the harness sees convergence only when it polls, and this module decides
what it records and with what resolution:

* `wait_ready` polls until every given wrapper is ready (`ready_problem`):
  at start (that instant is run time 0) and after a broker restart. A
  wrapper that exits meanwhile fails the wait at once, with its diagnostics.
* A thread asks every running wrapper for its status (`Platform.statuses`),
  every `POLL_FAST` seconds while a convergence phase is open and every
  `POLL_SLOW` seconds once it has settled, and feeds the changed views to the
  `ConvergenceTracker` (the same one as the simulator's). It also keeps each
  node's last document (for the report's node records) and feeds the sent
  counters to the `TrafficTally`.
* A phase settles at the *start* time of the first round whose views agree
  with the ground truth. A round that began before the latest disruption
  (`disrupted`) never settles the new phase: its answers may predate it.
* The moment of agreement lies after the previous round began (that round
  still saw the views differ, or the phase had not begun) and before this
  round's last answer; that span is the phase's `resolution`
  (`PhaseRecord.resolution`, and the `run_converged` event's field).

The poller shares the driver's lock (the truth, the tracker, the set of
running nodes) and never raises in its thread: an error is kept in `error`,
and the driver's main thread raises it (`check`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Set
from typing import Any, Protocol

from federation.harness.platform import Platform, PlatformError, StatusDocument
from federation.harness.processes import LaunchError, poll
from federation.harness.statusview import StatusView, ready_problem, view_of
from federation.harness.traffic import TrafficTally, sent_counts
from federation.scenario.report import PhaseRecord
from federation.scenario.truth import ConvergenceTracker

POLL_FAST = 0.1
"""seconds between status polls while a convergence phase is open"""
POLL_SLOW = 1.0
"""seconds between status polls once it has settled"""
STATUS_TIMEOUT = 0.5
"""seconds one round of status queries waits for the replies"""


def wait_ready(platform: Platform, names: list[str], timeout: float) -> None:
    """Poll until every wrapper of `names` is ready; PlatformError (with diagnostics) if one exits or time runs out."""
    problems: dict[str, str] = {}

    def ready() -> bool:
        for name in names:
            if not platform.wrapper_running(name):
                raise PlatformError(f"the wrapper of {name} exited at start:\n"
                                    f"{platform.wrapper_diagnostics(name)}")
        documents = platform.statuses([name for name in names if name in problems], STATUS_TIMEOUT)
        for name, document in documents.items():
            problem = ready_problem(document)
            if problem is None:
                problems.pop(name, None)
            else:
                problems[name] = problem
        return not problems

    problems.update({name: "no status reply yet" for name in names})
    try:
        poll(ready, timeout, lambda: "every wrapper to be ready: " + "; ".join(
            f"{name}: {problem}" for name, problem in sorted(problems.items())), interval=0.1)
    except LaunchError as error:
        details = "\n".join(platform.wrapper_diagnostics(name) for name in sorted(problems))
        raise PlatformError(f"{error}\n{details}") from None


class EventSink(Protocol):
    """The driver's `_event`: one record of the run's events file."""

    def __call__(self, kind: str, name: str | None, **fields: Any) -> None: ...


class StatusPoller:
    """Polls the running wrappers' statuses into the convergence tracker, on a thread of its own."""

    def __init__(self, platform: Platform, tracker: ConvergenceTracker, tally: TrafficTally, *,
                 lock: threading.RLock, alive: Set[str], now: Callable[[], float], event: EventSink) -> None:
        self.platform = platform
        self.tracker = tracker
        self.tally = tally
        self.lock = lock
        self.alive = alive  # the driver's running nodes; read under `lock`
        self.now = now
        self.event = event
        self.generation = 0  # disruptions so far: a round begun before the latest one settles nothing
        self.previous_poll_at = 0.0  # when the last round of status queries began
        self.resolutions: dict[int, float] = {}  # phase index -> PhaseRecord.resolution
        self.views: dict[str, StatusView] = {}
        self.last_status: dict[str, StatusDocument] = {}
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------ the thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="status-poller", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread and wait for it (at most `timeout` seconds; None: until it has ended)."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)

    def check(self) -> None:
        """PlatformError if the thread failed."""
        if self.error is not None:
            raise PlatformError(f"the status poller failed: {self.error!r}") from self.error

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.poll_once()
                with self.lock:
                    open_phase = bool(self.tracker.phases) and self.tracker.phases[-1].settled_at is None
                self._stop.wait(POLL_FAST if open_phase else POLL_SLOW)
        except BaseException as error:  # noqa: BLE001 - handed to the main thread, which raises it
            self.error = error

    # ------------------------------------------------------------ what the driver tells it

    def disrupted(self) -> None:
        """A disruption opened a phase (call under `lock`): rounds begun before now settle nothing."""
        self.generation += 1

    def forget(self, name: str) -> None:
        """The node stopped: its view no longer counts (call under `lock`, or from the main thread)."""
        self.tracker.remove_view(name)
        self.views.pop(name, None)

    # ------------------------------------------------------------ one round

    def poll_once(self) -> None:
        """One round of status queries; update the views, and settle the open phase if they agree."""
        with self.lock:
            names = sorted(self.alive)
            generation = self.generation
            asked_at = self.now()
        documents = self.platform.statuses(names, STATUS_TIMEOUT)
        with self.lock:
            for name, document in sorted(documents.items()):
                if name not in self.alive or document is None:
                    continue  # killed meanwhile, or no answer this time: keep the last view
                self.last_status[name] = document
                epoch = document.get("epoch")
                if isinstance(epoch, int):
                    self.tally.observe(name, epoch, sent_counts(document.get("sent")))
                view = view_of(document)
                if view is None:
                    if name in self.views:
                        self.tracker.remove_view(name)
                        del self.views[name]
                    continue
                old = self.views.get(name)
                if old is None or (old.broker_id, old.members, old.management_core, dict(old.topic_cores)) != (
                        view.broker_id, view.members, view.management_core, dict(view.topic_cores)):
                    self.views[name] = view
                    self.tracker.update_view(name, view.broker_id, view.members, view.management_core,
                                             view.topic_cores)
            if generation == self.generation:
                before = self.tracker.phases[-1].settled_at if self.tracker.phases else None
                self.tracker.check(asked_at)
                phase = self.tracker.phases[-1] if self.tracker.phases else None
                if phase is not None and before is None and phase.settled_at is not None:
                    # The views came to agree after the previous round began (it still saw them differ)
                    # and before this one's last answer: how well a poll can place the moment.
                    resolution = self.now() - max(self.previous_poll_at, phase.at)
                    self.resolutions[len(self.tracker.phases) - 1] = resolution
                    self.event("run_converged", None, phase=phase.label, seconds=round(asked_at - phase.at, 6),
                               resolution=round(resolution, 6))
            self.previous_poll_at = asked_at

    # ------------------------------------------------------------ the report

    def phase_records(self) -> list[PhaseRecord]:
        """Every phase of the tracker, with the resolution its settling time was measured with."""
        return [PhaseRecord(phase.label, phase.at, phase.settled_at, self.resolutions.get(index, 0.0))
                for index, phase in enumerate(self.tracker.phases)]
