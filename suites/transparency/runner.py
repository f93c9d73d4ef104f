"""Running one scenario on one started setup, and what its clients recorded.

Theory of operation: `ScenarioRunner.run` performs the actions in order
with `RecordingClient`s, each connected to the broker its site maps to, and
returns a `Recording`: every client's messages and answers, the receivers'
message counts at each `Settle`, and notes on anything that did not go as
planned (a subscription that no probe reached, a settle that ran out of
time). An error that stops the scenario (a client that cannot connect) is
kept in the recording, not raised: the suite goes on with the next case.

How a `Settle` knows the deliveries are over depends on the setup:

* the reference (one broker, `expected` is None): a fence published after
  the scenario's publications arrives at every connected client after all of
  them (`recorder`); then a short quiet period.
* every other setup: each receiver has at least what it had at the same
  point on the reference (`expected`, the reference's counts), or is
  offline; then a quiet period in which nothing new arrives, so that extra
  copies are seen too. Either wait ends at `Scenario.settle_timeout`, with a
  note.
* a reference no fence crosses (the bridge chain of the policy cases,
  policies.py), and a setup compared with a recording whose duplicates are
  left out (no counts to wait for): a longer quiet period alone.

A new subscription is made ready with probes (`Subscribe.ready`): each
site's probe client publishes on a topic the filter matches until the
subscriber has a probe from every site, or `Timing.probe_timeout` passes
(a note; the scenario goes on, and its recording shows what followed). With
topic lines a site's probe goes on the local topic there that arrives as the
probe topic, and a site whose lines keep it away is not asked. A
member of a shared group is reached when its group is: the probes meant
for it count wherever in its group they arrive (a group is served once).

After the scenario every client disconnects cleanly, and a client that had
a persistent session connects once more with a clean start and no session
expiry, so no session outlives its case.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from federation.daemon.topic_policy import TopicPolicy
from federation.harness.processes import LaunchError, poll
from suites.transparency import policies
from suites.transparency.policies import probe_topics
from suites.transparency.recorder import Control, Message, ProbeClient, RecordingClient, digest
from suites.transparency.scenario import (
    Action,
    Connect,
    Disconnect,
    Kill,
    Publish,
    Scenario,
    Settle,
    Subscribe,
    Unsubscribe,
    Wait,
    describe_action,
    expand,
    short,
)

TOPIC_ROOT = "tp"


class SiteMap(Protocol):
    """What the runner needs from a setup: where each site's clients connect, which sites are distinct, whether
    a fence reaches every client (one broker), and each site's topic policy (where probes can come from)."""

    @property
    def name(self) -> str: ...

    def address(self, site: str) -> tuple[str, int]: ...

    @property
    def probe_sites(self) -> tuple[str, ...]: ...

    @property
    def settles_on_fence(self) -> bool: ...

    def policy(self, site: str) -> TopicPolicy: ...

    def broker_of(self, site: str) -> str: ...


@dataclass(frozen=True)
class Timing:
    probe_timeout: float = 5.0
    """seconds a new subscription may take to be reached from every site"""
    probe_interval: float = 0.1
    """seconds between two probes from a site that has not reached the subscriber yet"""
    fence_timeout: float = 10.0
    reference_quiet: float = 0.2
    """seconds without a new arrival that end a settle on the reference, after its fence"""
    quiet: float = 0.5
    """seconds without a new arrival that end a settle elsewhere, after the reference's counts"""
    unfenced_quiet: float = 1.0
    """seconds without a new arrival that end a settle of a reference no fence crosses (a bridge chain with
    topic lines), or of a setup compared with one whose duplicates are left out (no counts to wait for)"""
    connect_timeout: float = 10.0


def prefix_of(scenario: Scenario) -> str:
    return f"{TOPIC_ROOT}/{scenario.name}"


def probe_topic(topic_filter: str) -> str:
    """A topic that `topic_filter` matches: its wildcards become a `tp-probe` level (a shared subscription's
    group is left out)."""
    if topic_filter.startswith("$share/"):
        topic_filter = topic_filter.split("/", 2)[2]
    return policies.probe_topic(topic_filter)


@dataclass
class Recording:
    """What the clients of one scenario on one setup saw."""

    scenario: str
    setup: str
    messages: dict[str, list[Message]] = field(default_factory=dict)
    controls: dict[str, list[Control]] = field(default_factory=dict)
    settle_counts: list[dict[str, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    started: float = 0.0
    """unix time"""
    ended: float = 0.0
    explanation: list[str] = field(default_factory=list)
    """what the forwarding processes said about the case (a federation's wrappers), for people"""
    ready_after: list[float] = field(default_factory=list)
    """seconds each subscription made ready took until its probes from every site had arrived"""
    published: dict[str, float] = field(default_factory=dict)
    """payload digest -> when it was published, seconds since the scenario started (for expiry intervals)"""
    probes: dict[str, int] = field(default_factory=dict)
    """probes published from each site during the case (they are publications on the case's topics too)"""

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "setup": self.setup, "error": self.error, "started": self.started,
                "ended": self.ended, "notes": self.notes, "settle_counts": self.settle_counts,
                "explanation": self.explanation, "probes": self.probes, "published": self.published,
                "ready_after": self.ready_after,
                "messages": {name: [item.to_json() for item in items] for name, items in self.messages.items()},
                "controls": {name: [item.to_json() for item in items] for name, items in self.controls.items()}}

    @staticmethod
    def from_json(document: dict[str, Any]) -> Recording:
        return Recording(document["scenario"], document["setup"],
                         {name: [Message.from_json(item) for item in items]
                          for name, items in document["messages"].items()},
                         {name: [Control.from_json(item) for item in items]
                          for name, items in document["controls"].items()},
                         document["settle_counts"], document["notes"], document["error"], document["started"],
                         document["ended"], document.get("explanation", []), document.get("ready_after", []),
                         document.get("published", {}), document.get("probes", {}))


class ScenarioRunner:
    """Runs scenarios on one setup; `probes`: a connected probe client per site of `setup.probe_sites`."""

    def __init__(self, setup: SiteMap, probes: Mapping[str, ProbeClient], timing: Timing | None = None) -> None:
        self.setup = setup
        self.probes = probes
        self.timing = timing or Timing()
        self._fences = 0

    def run(self, scenario: Scenario, expected: Sequence[Mapping[str, int]] | None = None) -> Recording:
        """Perform the scenario; `expected`: the reference's counts per settle (None: this is the reference)."""
        run = _Run(self, scenario, expected)
        return run.perform()

    def next_fence(self) -> int:
        self._fences += 1
        return self._fences


class _Run:
    """One scenario's performance (the clients, the settle counter, the notes)."""

    def __init__(self, runner: ScenarioRunner, scenario: Scenario, expected: Sequence[Mapping[str, int]] | None):
        self.runner = runner
        self.scenario = scenario
        self.expected = expected
        self.prefix = prefix_of(scenario)
        self.clock = time.monotonic()
        self.clients: dict[str, RecordingClient] = {}
        self.persistent: set[str] = set()
        self.recording = Recording(scenario.name, runner.setup.name)
        self.published = 0

    def perform(self) -> Recording:
        self.recording.started = time.time()
        actions = self.scenario.with_settle_at_end()
        done = 0
        try:
            for action in actions:
                self.act(action)
                done += 1
        except LaunchError as error:
            self.recording.error = f"action {done + 1} ({describe_action(actions[done])}): {error}"
        finally:
            self.finish()
        return self.recording

    # ------------------------------------------------------------ actions

    def act(self, action: Action) -> None:
        timing = self.runner.timing
        if isinstance(action, Connect):
            client = self.clients.get(action.client)
            if client is None:
                client = RecordingClient(action.client,
                                         f"tp-{self.scenario.name}-{action.identity or action.client}", self.clock)
                self.clients[action.client] = client
            will = None
            if action.will is not None:
                will = (action.will, expand(action.will.topic, self.prefix),
                        action.will.payload.build(f"{self.scenario.name}/{action.client}/will"))
            if not action.clean_start or action.session_expiry:
                self.persistent.add(action.client)
            host, port = self.runner.setup.address(action.site)
            client.connect(host, port, site=action.site, clean_start=action.clean_start,
                           session_expiry=action.session_expiry, will=will, timeout=timing.connect_timeout)
        elif isinstance(action, Subscribe):
            topic_filter = expand(action.filter, self.prefix)
            client = self.clients[action.client]
            client.subscribe(topic_filter, qos=action.qos, no_local=action.no_local,
                             retain_as_published=action.retain_as_published,
                             retain_handling=action.retain_handling, identifier=action.identifier,
                             timeout=timing.connect_timeout)
            if action.ready:
                self.make_ready(client, topic_filter)
        elif isinstance(action, Unsubscribe):
            self.clients[action.client].unsubscribe(expand(action.filter, self.prefix), timing.connect_timeout)
        elif isinstance(action, Publish):
            self.published += 1
            payload = action.payload.build(f"{self.scenario.name}/{action.client}/{self.published}")
            self.recording.published.setdefault(digest(payload), round(time.monotonic() - self.clock, 4))
            self.clients[action.client].publish(expand(action.topic, self.prefix), payload, qos=action.qos,
                                                retain=action.retain, properties=action.properties,
                                                timeout=self.scenario.ack_timeout)
        elif isinstance(action, Disconnect):
            self.clients[action.client].disconnect(action.with_will, timing.connect_timeout)
        elif isinstance(action, Kill):
            self.clients[action.client].kill(timing.connect_timeout)
        elif isinstance(action, Wait):
            threading.Event().wait(action.seconds)  # the scenario's own time: its clients do nothing meanwhile
        elif isinstance(action, Settle):
            self.settle()

    def make_ready(self, client: RecordingClient, topic_filter: str) -> None:
        """Probe from every site until `client` has a probe from each (see the module docstring)."""
        timing = self.runner.timing
        # A member of a shared group is reached when its group is: a probe meant for it may go to any member.
        receiver = self.scenario.receiver_of(client.name)
        members = [client] if not topic_filter.startswith("$share/") else \
            [other for name, other in sorted(self.clients.items()) if self.scenario.receiver_of(name) == receiver]
        for member in members:
            member.forget_probes(client.name)

        def reached() -> set[str]:
            return set().union(*(member.probe_sites(client.name) for member in members))

        setup = self.runner.setup
        sites = setup.probe_sites
        # Each site's probe on the local topic that arrives as `topic` here; sites whose lines keep it away are
        # not asked (a policy case: policies.py).
        receiver_site = client.site or sites[0]
        every = (*sites, receiver_site)
        where = probe_topics({site: setup.policy(site) for site in every},
                             {site: setup.broker_of(site) for site in every}, sites, receiver_site, topic_filter)
        sites = tuple(site for site in sites if site in where)
        began = time.monotonic()
        deadline = began + timing.probe_timeout
        while True:
            missing = [site for site in sites if site not in reached()]
            if not missing:
                self.recording.ready_after.append(round(time.monotonic() - began, 3))
                return
            if time.monotonic() >= deadline or not client.online:
                self.recording.notes.append(
                    f"{client.name}'s subscription {short(topic_filter)} was not reached from "
                    f"{', '.join(missing)} within {timing.probe_timeout:g} s")
                return
            for site in missing:
                self.runner.probes[site].probe(where[site], client.name)
                self.recording.probes[site] = self.recording.probes.get(site, 0) + 1

            def arrived(sent: frozenset[str] = frozenset(missing)) -> bool:
                return sent <= reached()

            with contextlib.suppress(LaunchError):  # not all arrived within the interval: probe those again
                poll(arrived, timing.probe_interval, "probes", interval=0.005)

    # ------------------------------------------------------------ settling

    def counts(self) -> dict[str, int]:
        totals = {receiver: 0 for receiver in self.scenario.receivers}
        for name, client in self.clients.items():
            totals[self.scenario.receiver_of(name)] += client.message_count()
        return totals

    def receiver_online(self, receiver: str) -> bool:
        members = self.scenario.groups.get(receiver, (receiver,))
        return any(self.clients[name].online for name in members if name in self.clients)

    def settle(self) -> None:
        index = len(self.recording.settle_counts)
        if self.expected is None and self.runner.setup.settles_on_fence:
            self.settle_on_fence(index)
        elif self.expected is None:  # a reference no fence crosses, or counts that include duplicates
            self.wait_quiet(index, self.runner.timing.unfenced_quiet)
        else:
            self.settle_on_counts(index, self.expected[index] if index < len(self.expected) else {})
        self.recording.settle_counts.append(self.counts())

    def settle_on_fence(self, index: int) -> None:
        timing = self.runner.timing
        number = self.runner.next_fence()
        online = [client for client in self.clients.values() if client.online]
        self.runner.probes[self.runner.setup.probe_sites[0]].fence(number)
        try:
            poll(lambda: all(client.has_fence(number) for client in online), timing.fence_timeout, "the fence",
                 interval=0.005)
        except LaunchError:
            late = [client.name for client in online if not client.has_fence(number)]
            self.recording.notes.append(f"settle {index + 1}: the fence did not reach {', '.join(late)} within "
                                        f"{timing.fence_timeout:g} s")
        self.wait_quiet(index, timing.reference_quiet)

    def settle_on_counts(self, index: int, expected: Mapping[str, int]) -> None:
        timeout = self.scenario.settle_timeout
        short_of: list[str] = []

        def arrived() -> bool:
            counts = self.counts()
            short_of[:] = [f"{receiver} {counts.get(receiver, 0)} of {count}"
                           for receiver, count in sorted(expected.items())
                           if counts.get(receiver, 0) < count and self.receiver_online(receiver)]
            return not short_of

        try:
            poll(arrived, timeout, "the reference's deliveries", interval=0.01)
        except LaunchError:
            self.recording.notes.append(f"settle {index + 1}: after {timeout:g} s still short: {'; '.join(short_of)}")
            return
        self.wait_quiet(index, self.runner.timing.quiet)

    def wait_quiet(self, index: int, quiet: float) -> None:
        """Until nothing new has arrived at any client for `quiet` seconds (at most the settle timeout)."""
        last = [sum(self.counts().values()), time.monotonic()]

        def still() -> bool:
            total = sum(self.counts().values())
            now = time.monotonic()
            if total != last[0]:
                last[:] = [total, now]
            return now - last[1] >= quiet

        try:
            poll(still, self.scenario.settle_timeout, "a quiet period", interval=0.02)
        except LaunchError:
            self.recording.notes.append(f"settle {index + 1}: messages kept arriving for "
                                        f"{self.scenario.settle_timeout:g} s")

    # ------------------------------------------------------------ the end

    def finish(self) -> None:
        for client in self.clients.values():
            client.close()
        for name in sorted(self.persistent):
            self.discard_session(self.clients[name])
        self.recording.ended = time.time()
        for name, client in self.clients.items():
            self.recording.messages[name] = list(client.messages)
            self.recording.controls[name] = list(client.controls)

    def discard_session(self, client: RecordingClient) -> None:
        """Connect once with a clean start and no session expiry, then leave: the broker drops the session."""
        if client.site is None:
            return
        cleaner = RecordingClient(client.name, client.client_id, self.clock)
        host, port = self.runner.setup.address(client.site)
        try:
            cleaner.connect(host, port, site=client.site, timeout=self.runner.timing.connect_timeout)
        except LaunchError as error:
            self.recording.notes.append(f"{client.name}: its session could not be discarded: {error}")
        finally:
            cleaner.close()

