"""Run a scenario on the virtual network and report what happened.

Theory of operation
-------------------
`Simulation` places one real `federation.protocol.node.Node` at every scenario node,
queues the scenario's events on the network's clock and watches three
things while time runs:

* outputs: every injection is a delivery (classified against the ground
  truth at that instant); node events and `sim_*` events go, in time order,
  to the JSON-lines events file;
* views: after each instant, the views of the nodes that received input are
  re-read (only when `view().version` moved) and the convergence tracker
  checks them against the ground truth;
* safety: every `tm` or `tb` datagram bumps its publications' copy counts, which must
  stay under a loop bound; timer storms are reported by the network.

At the end the still-quiet components must have converged, and the plain
records go to `federation.scenario.report.build_report`.

Restart semantics: a restarted wrapper is a new Node with the next epoch and
the same address and vid setting. The simulator then replays the node's
still-active local subscriptions into it, as the daemon does from the
subscription table it persists (the broker kept its clients while the
wrapper was down; subscriptions made while the wrapper was dead are part of
that table too). It keeps what the daemon keeps in its state directory
across a crash (`durable`, the default): the injection journal (every
publication injected, given back to the new node with `Node.restore`
before it starts, with the stream positions it implies, and the filters the
node knew when it died) and the spool (the node's own QoS 1/2 publications
not yet released by custody, replayed into the new node with their ids
after the subscriptions). Each broker is
modelled as taking every injection at once (federation.sim.network).
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

from federation.protocol.events import id_text, publication_text
from federation.protocol.node import Node
from federation.protocol.ordering import Position, StreamKey
from federation.protocol.retained_sync import MemoryRetainedIndex
from federation.protocol.stored_records import MakeStored, RecordPool, stored_record
from federation.protocol.types import Event, Injection, PublicationId
from federation.protocol.wire import DATA_TYPES, DecodeFunction
from federation.protocol.wire import decode as wire_decode
from federation.protocol.wire_types import RetainedCopy
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
from federation.scenario.report import (
    DeliveryRecord,
    NodeRecord,
    PhaseRecord,
    PublicationRecord,
    TrafficRecord,
    build_report,
)
from federation.scenario.truth import ConvergenceTracker, GroundTruth
from federation.sim.collector import collector_paused
from federation.sim.decode_cache import DecodeCache
from federation.sim.network import Host, LinkModel, Network, NetworkOverload, NodeSetup, Observer

BACKEND = "sim"
EVENT_SCHEMA_VERSION = 1
LOOP_FACTOR = 4
"""tm copies of one publication above LOOP_FACTOR * links * matching filters are a loop (QoS 1/2: times
RETRIED_FACTOR plus two for every `retransmit_timeout_max` since it was published: a copy is sent again for as
long as its next hop is up and has not acknowledged it)"""
RETRIED_FACTOR = 8
"""the first retransmissions of a QoS 1/2 copy (the timeout doubles up to its cap), a reroute, a replay"""


def build_node(setup: NodeSetup, decode: DecodeFunction = wire_decode, make_stored: MakeStored = stored_record) -> Node:
    return Node(setup.address, setup.neighbours, setup.epoch, setup.rng, setup.settings, vid=setup.vid,
                name=setup.name, decode=decode, make_stored=make_stored)


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


class Simulation(Observer[Node]):
    def __init__(self, scenario: Scenario, *, seed: int, events_path: str | None = None,
                 node_factory: Callable[[NodeSetup], Node] | None = None, max_in_flight: int | None = None,
                 durable: bool = True) -> None:
        self.wall_started = time.perf_counter()
        self.scenario = scenario
        self.seed = seed
        # Open for the whole run; `close` (called by `run`) ends it.
        self.events_file: IO[str] | None = (
            open(events_path, "w", encoding="utf-8") if events_path else None  # noqa: SIM115
        )
        names = scenario.node_names()
        self.decode_cache = DecodeCache()
        self.record_pool = RecordPool()
        """one stored copy of each distinct link-state record for all the nodes (docs/simulator.md, "Speed")"""
        if node_factory is None:
            node_factory = functools.partial(build_node, decode=self.decode_cache, make_stored=self.record_pool)
        self.durable = durable
        """a restarted node gets back its journal and its spool (see the module docstring)"""
        self.journals: dict[str, dict[PublicationId, None]] = {}
        """node name -> the publications injected there (in order)"""
        self.positions: dict[str, dict[StreamKey, Position]] = {}
        """node name -> how far each QoS 1/2 stream was injected there"""
        self.filters: dict[str, list[str]] = {}
        """node name -> the filters it knew when it was killed (`Node.known_filters`, as the daemon saves them)"""
        self.spools: dict[str, dict[PublicationId, tuple[str, bytes, int, bool]]] = {}
        """node name -> its own QoS 1/2 publications not yet released (topic, payload, qos, retain)"""
        self.retained: dict[str, MemoryRetainedIndex] = {}
        """node name -> its broker's retained store (newest wins), as the wrapper's retained store keeps it: the
        node compares it with its neighbours' (docs/protocol.md rule 10); kept across a restart when durable"""
        self._factory = node_factory
        node_factory = self._build
        vids = {spec.name: spec.vid for spec in scenario.nodes}
        model = scenario.link_model
        self.network: Network[Node] = Network(
            node_factory, names, scenario.links, seed=seed,
            model=LinkModel(model.latency, model.jitter, model.loss, model.duplicate),
            settings=scenario.settings_for, vids=vids.get, observer=self, max_in_flight=max_in_flight)
        self.truth = GroundTruth(names, {host.name: host.address for host in self.network.hosts}, scenario.settle)
        self.truth.loss_active = self.network.loss_active()
        self.tracker = ConvergenceTracker(self.truth)
        self.qos: dict[tuple[str, str, str], int] = {}
        """(node, client, filter) -> qos of the active subscription, for replay on restart"""
        self.versions: dict[str, int] = {}
        self.touched: set[int] = set()
        self._batch: list[tuple[str, list[str], Callable[[], None]]] | None = None
        """disruptions collected by `simultaneously`, applied when it ends"""
        self.publications: list[PublicationRecord] = []
        self.topics: dict[PublicationId, str] = {}
        self.retried: dict[PublicationId, tuple[float, float]] = {}
        """QoS 1/2 publications -> (when published, the origin's retransmit_timeout_max): their copies are sent
        again while unacknowledged"""
        self.released: dict[str, set[PublicationId]] = {}
        """node name -> its own QoS 1/2 publications whose custody was released (delivered everywhere)"""
        self.deliveries: list[DeliveryRecord] = []
        self.violations: list[str] = []
        self.loop_bounds: dict[PublicationId, int] = {}
        self.loops_flagged: set[PublicationId] = set()
        self.payload_counter = 0
        self.finished: dict[str, Any] | None = None
        self.aborted: str | None = None
        """why the run stopped before the end (a packet storm), or None"""

    # ------------------------------------------------------------ running

    @property
    def now(self) -> float:
        return self.network.now

    def start(self) -> None:
        """Start every node at t=0 and queue the scenario's events."""
        self._sim_event("sim_start", None, scenario=self.scenario.name, seed=self.seed,
                        nodes={host.name: str(host.address) for host in self.network.hosts},
                        links=[list(link) for link in self.scenario.links])
        self.truth.set_topology(self.scenario.node_names(), self.network.connected_links())
        self.tracker.begin_phase("start", 0.0)
        for name in self.scenario.node_names():
            self.network.start(name)
        for event in self.scenario.events:
            if isinstance(event, Publish):
                if event.count > 1 and not event.interval and not event.retain:
                    # All at one instant: read from the broker together, as the daemon hands such a burst
                    # to the node (federation.protocol.publications: `tb` runs, `tq` for QoS 1/2).
                    self.network.schedule(event.at, functools.partial(self.publish_burst, event))
                    continue
                for number in range(event.count):
                    self.network.schedule(event.at + number * event.interval,
                                          functools.partial(self.publish, event, number))
            else:
                self.network.schedule(event.at, functools.partial(self.apply, event))

    def run_until(self, until: float) -> None:
        self.network.run_until(until)

    def run(self) -> dict[str, Any]:
        """Run the whole scenario and return the report."""
        try:
            with collector_paused():
                try:
                    self.start()
                    self.run_until(self.scenario.duration)
                except NetworkOverload as overload:
                    self.aborted = str(overload)
                    self._violation(str(overload), self.now)
                return self.finish()
        finally:
            self.close()

    def close(self) -> None:
        if self.events_file is not None:
            self.events_file.close()
            self.events_file = None

    # ------------------------------------------------------------ scenario events

    def apply(self, event: ScenarioEvent) -> None:
        """Apply one scenario event now (publications: use `publish`)."""
        network = self.network
        truth = self.truth
        now = self.now
        if isinstance(event, Subscribe):
            truth.subscribe(event.node, event.client, event.filter, now)
            self.qos[(event.node, event.client, event.filter)] = event.qos
            self.tracker.dirty = True  # the filters that need a topic core changed
            self._sim_event("sim_subscribe", event.node, client=event.client, filter=event.filter, qos=event.qos)
            self._to_node(event.node, lambda node: node.local_subscribe(event.client, event.filter, event.qos, now))
        elif isinstance(event, Unsubscribe):
            truth.unsubscribe(event.node, event.client, event.filter)
            self.qos.pop((event.node, event.client, event.filter), None)
            self.tracker.dirty = True  # the filters that need a topic core changed
            self._sim_event("sim_unsubscribe", event.node, client=event.client, filter=event.filter)
            self._to_node(event.node, lambda node: node.local_unsubscribe(event.client, event.filter, now))
        elif isinstance(event, Disconnect):
            truth.disconnect(event.node, event.client)
            for key in [key for key in self.qos if key[0] == event.node and key[1] == event.client]:
                del self.qos[key]
            self.tracker.dirty = True  # the filters that need a topic core changed
            self._sim_event("sim_disconnect", event.node, client=event.client)
            self._to_node(event.node, lambda node: node.local_disconnect(event.client, now))
        elif isinstance(event, Publish):
            self.publish(event, 0)
        elif isinstance(event, Cut):
            def cut() -> None:
                network.set_cut(event.a, event.b, True)
                if not event.oneway:
                    network.set_cut(event.b, event.a, True)
            label = f"cut {event.a}->{event.b}" if event.oneway else f"cut {event.a}-{event.b}"
            self._sim_event("sim_cut", None, a=event.a, b=event.b, oneway=event.oneway)
            self._disrupt(label, [event.a, event.b], cut)
        elif isinstance(event, Heal):
            def heal() -> None:
                network.set_cut(event.a, event.b, False)
                network.set_cut(event.b, event.a, False)
            self._sim_event("sim_heal", None, a=event.a, b=event.b)
            self._disrupt(f"heal {event.a}-{event.b}", [event.a, event.b], heal)
        elif isinstance(event, Kill):
            self._sim_event("sim_kill", event.node)
            self._disrupt(f"kill {event.node}", [event.node], lambda: self._kill(event.node))
        elif isinstance(event, Restart):
            self._disrupt(f"restart {event.node}", [event.node], lambda: self._restart(event.node))
        elif isinstance(event, Loss):
            link = event.link
            self._sim_event("sim_loss", None, percent=event.percent, link=list(link) if link else None)
            touched = list(link) if link else self.scenario.node_names()
            where = f"{link[0]}-{link[1]}" if link else "all links"
            self._disrupt(f"loss {event.percent:g}% {where}", touched,
                          lambda: network.set_loss(event.percent, link))
        else:  # pragma: no cover - the model's union is closed
            raise TypeError(f"unknown scenario event {event!r}")

    def publish(self, event: Publish, number: int) -> None:
        host = self.network.host(event.node)
        node = host.node
        if node is None:
            self._sim_event("sim_publish_skipped", event.node, topic=event.topic, reason="node down")
            return
        payload_id, payload = self._payload(event)
        publication = node.local_publish(event.topic, payload, event.qos, event.retain, None, self.now)
        if publication is not None and event.retain:
            self._store_retained(event.node, event.topic, payload, event.qos, publication)
        if publication is not None and event.qos:
            self.spools.setdefault(event.node, {})[publication] = (event.topic, payload, event.qos, event.retain)
        self._record_publication(event, node, publication, payload_id, payload)
        self.network.after_input(host)

    def publish_burst(self, event: Publish) -> None:
        """`event.count` publications of one QoS at one instant, handed to the node as one run (QoS 1/2 ones kept
        in the node's spool, as `publish` keeps them)."""
        host = self.network.host(event.node)
        node = host.node
        if node is None:
            for _ in range(event.count):
                self._sim_event("sim_publish_skipped", event.node, topic=event.topic, reason="node down")
            return
        made = [self._payload(event) for _ in range(event.count)]
        publications = node.local_publish_run([(event.topic, payload) for _, payload in made], self.now,
                                              qos=event.qos)
        for (payload_id, payload), publication in zip(made, publications, strict=True):
            if publication is not None and event.qos:
                self.spools.setdefault(event.node, {})[publication] = (event.topic, payload, event.qos, False)
            self._record_publication(event, node, publication, payload_id, payload)
        self.network.after_input(host)

    def _payload(self, event: Publish) -> tuple[str, bytes]:
        self.payload_counter += 1
        payload_id = f"{event.node}-{self.payload_counter}"
        return payload_id, json.dumps({"id": payload_id, "sent": round(self.now, 6), "fill": "x" * event.payload_size},
                                      separators=(",", ":")).encode()

    def _record_publication(self, event: Publish, node: Node, publication: PublicationId | None, payload_id: str,
                            payload: bytes) -> None:
        now = self.now
        if publication is None:
            self._sim_event("sim_publish_skipped", event.node, topic=event.topic,
                            reason="the node does not federate this topic")
            return
        in_bound, expected = self.truth.expected(event.node, event.topic, now, event.retain)
        text = publication_text(publication)
        self.topics[publication] = event.topic
        if event.qos:
            self.retried[publication] = (now, node.settings.retransmit_timeout_max)
        self.publications.append(PublicationRecord(text, event.node, event.topic, now, in_bound, expected))
        self._sim_event("sim_publish", event.node, pub=text, payload_id=payload_id, topic=event.topic,
                        qos=event.qos, retain=event.retain, size=len(payload), in_bound=in_bound,
                        expected=sorted(expected))

    def _to_node(self, name: str, action: Callable[[Node], None]) -> None:
        host = self.network.host(name)
        if host.node is not None:
            action(host.node)
            self.network.after_input(host)

    def _build(self, setup: NodeSetup) -> Node:
        """A node incarnation; a restarted one gets its journal back before it starts."""
        node = self._factory(setup)
        if not self.durable or setup.name not in self.retained:
            self.retained[setup.name] = MemoryRetainedIndex()
        node.attach_retained(self.retained[setup.name])
        if self.durable:
            node.restore(self.journals.get(setup.name, {}), self.positions.get(setup.name, {}),
                         self.filters.get(setup.name, ()))
        return node

    def _kill(self, name: str) -> None:
        node = self.network.host(name).node
        if node is not None:
            self.filters[name] = node.known_filters()
        self.network.kill(name)
        self.tracker.remove_view(name)
        self.versions.pop(name, None)

    def _restart(self, name: str) -> None:
        host = self.network.host(name)
        crashed = host.node is not None
        if crashed:
            self._kill(name)
        self._sim_event("sim_restart", name, epoch=host.epoch + 1, crashed=crashed)
        node = self.network.start(name)
        now = self.now
        for client, filter_, _ in self.truth.active(name):
            node.local_subscribe(client, filter_, self.qos.get((name, client, filter_), 0), now)
        if self.durable:
            for publication, (topic, payload, qos, retain) in list(self.spools.get(name, {}).items()):
                node.local_publish(topic, payload, qos, retain, None, now, publication_id=publication)
        self.network.after_input(host)

    @contextlib.contextmanager
    def simultaneously(self) -> Iterator[None]:
        """Disruptions applied inside the block happen at one instant: the ground truth is recomputed
        once for all of them (cutting 1,000 links one by one recomputes it 1,000 times)."""
        if self._batch is not None:
            yield
            return
        self._batch = []
        try:
            yield
        finally:
            batch, self._batch = self._batch, None
            if batch:
                self._apply_disruptions(batch)

    def _disrupt(self, what: str, touched: list[str], change: Callable[[], None]) -> None:
        if self._batch is not None:
            self._batch.append((what, touched, change))
        else:
            self._apply_disruptions([(what, touched, change)])

    def _apply_disruptions(self, batch: list[tuple[str, list[str], Callable[[], None]]]) -> None:
        truth = self.truth
        touched = [name for _, names, _ in batch for name in names]
        truth.disrupt(self.now, touched)
        for _, _, change in batch:
            change()
        truth.set_topology([host.name for host in self.network.alive_hosts()], self.network.connected_links())
        truth.disrupt(self.now, touched)
        truth.loss_active = self.network.loss_active()
        for what, _, _ in batch:
            self.tracker.begin_phase(what, self.now)

    # ------------------------------------------------------------ observer

    def node_output(self, host: Host[Node], injections: list[Injection], events: list[Event], now: float) -> None:
        if injections:
            journal = self.journals.setdefault(host.name, {})
            positions = self.positions.setdefault(host.name, {})
            for injection in injections:
                journal[injection.publication] = None
                if injection.qos and injection.filter is not None:
                    origin, epoch, seq = injection.publication
                    key = (origin, injection.filter)
                    if positions.get(key, (-1, -1)) < (epoch, seq):
                        positions[key] = (epoch, seq)
        for injection in injections:
            if injection.retain:
                self._store_retained(host.name, injection.topic, injection.payload, injection.qos,
                                     injection.publication)
            text = publication_text(injection.publication)
            subscribed = self.truth.subscribed(host.name, injection.topic)
            self.deliveries.append(DeliveryRecord(text, host.name, now, subscribed))
            self._sim_event("sim_inject", host.name, pub=text, topic=injection.topic, subscribed=subscribed)
        if self.events_file is not None:
            for event in events:
                record = event.to_json_dict()
                record["name"] = host.name
                self._write(record)

    def _store_retained(self, name: str, topic: str, payload: bytes, qos: int, publication: PublicationId) -> None:
        """A retained publication made on or injected into `name`'s broker: into its store if the newest (the
        simulator carries no origin time, so versions order by epoch, seq and origin address)."""
        origin, epoch, seq = publication
        self.retained[name].offer(RetainedCopy(topic, (0, epoch, seq, origin.host, origin.port), qos, payload, None))

    def custody_released(self, host: Host[Node], publications: list[PublicationId], now: float) -> None:
        self.released.setdefault(host.name, set()).update(publications)
        spool = self.spools.get(host.name)
        if spool:
            for publication in publications:
                spool.pop(publication, None)

    def node_touched(self, host: Host[Node]) -> None:
        self.touched.add(host.index)

    def data_sent(self, host: Host[Node], publication: PublicationId, copies: int, now: float) -> None:
        bound = self.loop_bounds.get(publication)
        if bound is None:
            topic = self.topics.get(publication)
            filters = self.truth.filters_matching(topic) if topic is not None else len(self.truth.filters_ever)
            bound = LOOP_FACTOR * max(1, len(self.network.links)) * max(1, filters)
            self.loop_bounds[publication] = bound
        retried = self.retried.get(publication)
        if retried is not None:
            published_at, interval = retried
            bound *= RETRIED_FACTOR + 2 * int((now - published_at) / interval)
        if copies > bound and publication not in self.loops_flagged:
            self.loops_flagged.add(publication)
            self._violation(f"publication {publication_text(publication)}: more than {bound} tm copies "
                            f"(a forwarding loop?) by t={now}", now)

    def anomaly(self, text: str, now: float) -> None:
        self._violation(text, now)

    def timestamp_done(self, now: float) -> None:
        self.refresh_views()
        before = self.tracker.phases[-1].settled_at if self.tracker.phases else None
        self.tracker.check(now)
        if self.tracker.phases and before is None and self.tracker.phases[-1].settled_at is not None:
            phase = self.tracker.phases[-1]
            self._sim_event("sim_converged", None, phase=phase.label, seconds=round(now - phase.at, 6))

    def refresh_views(self) -> None:
        hosts = self.network.hosts
        for index in self.touched:
            host = hosts[index]
            node = host.node
            if node is None:
                continue
            if self.versions.get(host.name) == node.version:
                continue  # cheaper than building the view to read its version
            view = node.view()
            if self.versions.get(host.name) != view.version:
                self.versions[host.name] = view.version
                self.tracker.update_view(host.name, view.broker_id, view.members, view.management_core,
                                         view.cores_source, view.cores_fingerprint)
        self.touched.clear()

    # ------------------------------------------------------------ output

    def _violation(self, text: str, now: float) -> None:
        self.violations.append(text)
        self._sim_event("sim_violation", None, text=text)

    def _sim_event(self, kind: str, name: str | None, **fields: Any) -> None:
        if self.events_file is None:
            return
        node = str(self.network.host(name).address) if name is not None else "sim"
        record: dict[str, Any] = {"v": EVENT_SCHEMA_VERSION, "t": round(self.now, 6), "node": node, "type": kind}
        if name is not None:
            record["name"] = name
        record.update(fields)
        self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        assert self.events_file is not None
        self.events_file.write(json.dumps(record, separators=(",", ":"), default=_json_default))
        self.events_file.write("\n")

    def final_violations(self) -> list[str]:
        """The end-of-run checks on every component that has been quiet for `settle` seconds."""
        problems = []
        truth = self.truth
        for index in truth.quiet_components(self.now):
            problem = self.tracker.component_problem(index)
            if problem is not None:
                names = ", ".join(sorted(truth.components[index]))
                problems.append(f"at the end (t={self.now}), quiet component [{names}] has not converged: {problem}")
        return problems

    def node_records(self) -> list[NodeRecord]:
        records = []
        for host in self.network.hosts:
            node = host.node
            if node is None:
                records.append(NodeRecord(host.name, False))
                continue
            view = node.view()
            records.append(NodeRecord(
                host.name, True, id_text(view.broker_id), id_text(view.management_core),
                {filter_: str(core) for filter_, core in sorted(view.topic_cores.items())}, len(view.members)))
        return records

    def traffic_record(self) -> TrafficRecord:
        traffic = self.network.traffic
        control = {kind: (traffic.packets_by_type[kind], traffic.bytes_by_type[kind])
                   for kind in sorted(traffic.packets_by_type) if kind not in DATA_TYPES}
        packets, size = traffic.data_totals()
        return TrafficRecord(control, packets, size, self.network.alive_seconds())

    def finish(self) -> dict[str, Any]:
        """Final checks and the report (call once, after running to the end)."""
        self.refresh_views()
        for text in self.final_violations():
            self._violation(text, self.now)
        phases = [PhaseRecord(phase.label, phase.at, phase.settled_at) for phase in self.tracker.phases]
        report = build_report(
            scenario=self.scenario.name, seed=self.seed, backend=BACKEND, duration=self.scenario.duration,
            publications=self.publications, deliveries=self.deliveries, phases=phases, nodes=self.node_records(),
            traffic=self.traffic_record(), violations=self.violations,
            wall_seconds=time.perf_counter() - self.wall_started)
        self._sim_event("sim_end", None, duration=self.scenario.duration, invariants_ok=report["invariants"]["ok"],
                        lost=report["publications"]["lost"], duplicates=report["publications"]["duplicates"],
                        unexpected=report["publications"]["unexpected"])
        self.finished = report
        return report


def run_scenario(scenario: Scenario, *, seed: int, events_path: str | None = None) -> dict[str, Any]:
    """Run `scenario` on the simulator with `seed`; returns the report dict (see docs/simulator.md).

    With `events_path`, every node event and `sim_*` event is written there as
    JSON lines in time order. The same seed gives a byte-identical events file
    and the same report, except `wall_seconds`.
    """
    return Simulation(scenario, seed=seed, events_path=events_path).run()
