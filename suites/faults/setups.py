"""What the faults are done to: a federation (line or ring) or the Mosquitto bridge chain, on loopback.

Theory of operation: both setups are `federation.tools.launch.LocalFederation`s
(the bridge chain is the benchmark's `BenchBrokers` with bridges and no
wrappers), so brokers are rendered from the same template, started, killed
and restarted by the same code. Each setup answers the same few questions:
where the publisher and the subscriber connect, how to apply a fault (the
returned `Heal` undoes it), how to get back to a healthy state between two
cases (`recover`), and, for the federation, what its wrappers counted
(`snapshot`).

The bridge chain forwards the streams from each broker to the next with
`cleansession false` (the reference our fault tests compare with,
shared/reference/measured-behaviour.md), one bridge per stream QoS, each
connecting to a listener of its own on the next broker (`BRIDGE_PORT`), so a
packet filter can cut the bridges without touching the clients. Its
analogue of each fault is explained in `catalogue`. Between two cases a
federation is reused when it is healthy again within `RECOVER_TIMEOUT` and
started afresh otherwise; the bridge chain is always started afresh (it
takes a fraction of a second).

A partition or a bridge link reset is a `PacketFilter` cut (nftables on lo);
the setup owns one filter and deletes its table when it stops.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from federation.harness import statusview
from federation.harness.nodeconfig import MOSQUITTO_CONF_TEMPLATE, mosquitto_template
from federation.harness.processes import LaunchError
from federation.tools.launch import BROKER_PORT, WRAPPER_PORT, FederationNode, LocalFederation
from suites.bench.setups import BenchBrokers, bridge_lines
from suites.faults import disk
from suites.faults.catalogue import Fault, Topology, describe
from suites.faults.packet_filter import Cut, PacketFilter

Heal = Callable[[], None]
TOPIC_ROOT = "faults"
CONVERGE_TIMEOUT = 30.0
"""seconds a federation gets to converge at start"""
START_TIMEOUT = 30.0
"""seconds each broker and wrapper gets to become ready at start: a wrapper's imports alone took over 10 s
while other test jobs loaded both CPUs, and the start is not what the suite measures"""
RECOVER_TIMEOUT = 3.0
"""seconds a federation gets to be healthy again after a case before it is started afresh"""
BRIDGE_RESTART = "1 2"
"""a bridge retries its connection after 1-2 s (base 1 s, cap 2 s): Mosquitto's default backs off to 30 s, and
2.0.11 backs off (5 s, 8 s, ...) even with one value, which would leave the reference idle for most of a short
case after a healing"""
BRIDGE_PORT = 1884
"""the port on which each broker of the bridge chain takes its bridge (clients use BROKER_PORT)"""
SNAPSHOT_FIELDS = ("reconnects", "injected", "inject_failed", "injection_backlog", "backpressure_pauses")
"""fields of a status document's `daemon.broker` kept by `snapshot`"""
SNAPSHOT_COUNTERS = ("custody_released", "custody_given_up", "publications_originated", "publications_delivered",
                     "repairs_sent", "repairs_delivered", "publications_awaiting", "retransmissions")
"""node counters kept by `snapshot` (the ledger of a case: runner.py)"""


INFLIGHT_KEYS = ("max_inflight_messages", "max_inflight_bytes")


def inflight_template(target: Path, limit: int | None, source: Path = MOSQUITTO_CONF_TEMPLATE) -> Path:
    """Write the broker template `source` to `target` with its `max_inflight_*` lines commented out and, with
    `limit`, `max_inflight_messages limit` added (None: Mosquitto's default, 20); return `target`."""
    lines = []
    for raw in mosquitto_template(source).splitlines():
        words = raw.split()
        if words and words[0] in INFLIGHT_KEYS:
            raw = f"# (replaced by suites.faults) {raw}"
        lines.append(raw)
    if limit is not None:
        lines += ["", "# suites.faults: the in-flight limit of this run", f"max_inflight_messages {limit}"]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target


def inflight_settings(config: str) -> list[str]:
    """The active `max_inflight_*` lines of a broker config."""
    return [raw.strip() for raw in config.splitlines() if raw.split()[:1] and raw.split()[0] in INFLIGHT_KEYS]


class FaultSetup:
    """The part both setups share: the brokers (a LocalFederation), the roles, the packet filter."""

    kind = ""

    def __init__(self, topology: Topology, brokers: LocalFederation) -> None:
        self.topology = topology
        self.brokers = brokers
        self.packet_filter = PacketFilter()

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.topology.name}"

    @property
    def bridge(self) -> bool:
        return self.kind == "bridge"

    def host(self, node: str) -> str:
        return self.brokers.node(node).host

    @property
    def publish_host(self) -> str:
        return self.host(self.topology.node("publisher"))

    @property
    def subscribe_host(self) -> str:
        return self.host(self.topology.node("subscriber"))

    @property
    def subscriber_nodes(self) -> tuple[str, ...]:
        """Every node with a subscriber to each stream: the subscriber role's first, then the others."""
        return (self.topology.node("subscriber"), *self.topology.also_subscribing)

    @property
    def broker_port(self) -> int:
        return BROKER_PORT

    def describe(self, fault: Fault) -> str:
        return describe(fault, self.topology, self.bridge)

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """Stop every process and delete the packet filter's table. Never raises."""
        self.brokers.stop()
        self.packet_filter.close()

    pause_target = "wrapper"
    """the process a `pause_wrapper` fault stops (a bridge chain forwards inside its brokers)"""

    def apply(self, fault: Fault) -> Heal:
        """Do the fault now; the returned `Heal` undoes it."""
        if fault.kind == "partition":
            return self._partition()
        if len(fault.roles) > 1:  # several processes at once, each healed in turn
            heals = [self.apply(Fault(f"{fault.name}-{role}", fault.kind, role, fault.seconds, fault.title))
                     for role in fault.roles]

            def heal_all() -> None:
                for heal in heals:
                    heal()

            return heal_all
        node = self.topology.node(fault.role or "")
        if fault.kind == "kill_wrapper":
            return self._kill_forwarding(node)
        if fault.kind == "stop_wrapper":
            return self._stop_forwarding(node)
        if fault.kind == "disk_full":
            return self._fill_disk(node)
        if fault.kind == "kill_broker":
            self.brokers.stop_broker(node, kill=True)
            return lambda: self.brokers.start_broker(node)
        if fault.kind == "pause_wrapper":
            self.brokers.pause(node, self.pause_target)
            return lambda: self.brokers.resume(node, self.pause_target)
        raise ValueError(f"fault kind {fault.kind!r} has no action on {self.name}")

    def _partition(self) -> Heal:
        raise NotImplementedError

    def _kill_forwarding(self, node: str) -> Heal:
        """What `kill_wrapper` does: the forwarding element of `node` dies, and comes back at the healing."""
        raise NotImplementedError

    def _stop_forwarding(self, node: str) -> Heal:
        """What `stop_wrapper` does: the forwarding element of `node` stops cleanly, and starts at the healing."""
        raise NotImplementedError

    def _fill_disk(self, node: str) -> Heal:
        """What `disk_full` does: the forwarding element of `node` finds its state directory full until the
        healing."""
        raise NotImplementedError

    def recover(self, timeout: float = RECOVER_TIMEOUT) -> None:
        """Back to a healthy setup (every process running, cuts removed); LaunchError if it does not get there."""
        self._restart_missing_brokers()

    def snapshot(self) -> dict[str, Any]:
        """What the forwarding processes counted so far, per node (empty for a bridge chain)."""
        return {}

    def forwarding_ready(self, for_seconds: float = 0.0) -> bool:
        """Every forwarding process is up and ready, and has been up `for_seconds` (a bridge chain's are the
        brokers: always)."""
        return True

    def diagnostics(self) -> str:
        return self.brokers.diagnostics()

    def _cut(self, cut: Cut) -> Heal:
        key = self.packet_filter.block(cut)
        return lambda: self.packet_filter.unblock(key)

    def _restart_missing_brokers(self) -> None:
        for name, node in self.brokers.nodes.items():
            if not node.broker_running:
                self.brokers.start_broker(name)


class FederationSetup(FaultSetup):
    """Brokers joined by the wrappers, on a line or a ring."""

    kind = "federation"

    def __init__(self, topology: Topology, workdir: Path, first_address: str,
                 settings: dict[str, Any] | None = None, mosquitto_template: Path | None = None,
                 small_state_dirs: bool = False) -> None:
        super().__init__(topology, LocalFederation(list(topology.nodes), topology.links, workdir, settings,
                                                   first_address=first_address, vids=dict(topology.vids) or None,
                                                   mosquitto_template=mosquitto_template))
        self.state_dirs = disk.SmallStateDirs() if small_state_dirs else None
        """each wrapper's state directory on a small tmpfs of its own, for the full-disk cases (disk.py)"""

    def start(self) -> None:
        if self.state_dirs is not None and not self.state_dirs.mounted:
            for node in self.brokers.nodes.values():
                self.state_dirs.mount(node.state_dir)
        self.brokers.start(timeout=START_TIMEOUT)
        try:
            self.brokers.wait_converged(timeout=CONVERGE_TIMEOUT)
        except BaseException:
            self.stop()
            raise

    def _partition(self) -> Heal:
        sides = (self.topology.publisher_side, self.topology.subscriber_side)
        return self._cut(Cut(tuple(map(self.host, sides[0])), tuple(map(self.host, sides[1])), "udp", WRAPPER_PORT))

    def _kill_forwarding(self, node: str) -> Heal:
        self.brokers.stop_wrapper(node, kill=True)
        return lambda: self.brokers.start_wrapper(node, wait=False)

    def _stop_forwarding(self, node: str) -> Heal:
        self.brokers.stop_wrapper(node, kill=False)  # SIGTERM: it withdraws its claims and leaves the overlay
        return lambda: self.brokers.start_wrapper(node, wait=False)

    def _fill_disk(self, node: str) -> Heal:
        if self.state_dirs is None:
            raise LaunchError(f"{self.name}: the full-disk cases need the setup's small state directories")
        directory = self.brokers.node(node).state_dir
        disk.fill(directory)
        return lambda: disk.free(directory)

    def stop(self) -> None:
        super().stop()
        if self.state_dirs is not None:
            self.state_dirs.unmount_all()

    def recover(self, timeout: float = RECOVER_TIMEOUT) -> None:
        super().recover(timeout)
        for name, node in self.brokers.nodes.items():
            if "wrapper" in node.paused:
                self.brokers.resume(name, "wrapper")
            if not node.wrapper_running:
                self.brokers.start_wrapper(name, wait=False)
        for name in self.brokers.nodes:
            self.brokers.wait_wrapper_ready(name, timeout)
        self.brokers.wait_converged(timeout=timeout)

    def forwarding_ready(self, for_seconds: float = 0.0) -> bool:
        """Every wrapper answers status, is ready, has run `for_seconds` and holds nothing in flight (no copy
        unacknowledged, no custody open): only then can the drain take silence for the end. A wrapper restarted at
        a healing took 7 s to start under load, and the drain called the case quiet 0.4 s after it was up (913
        of 1,000 counted lost that arrived in the next 10 s); at a load of 37 one was up 8 s and had not
        delivered yet while its neighbour still held its copies (829 of 1,000)."""
        documents = self.brokers.statuses(list(self.brokers.nodes))
        return all(document is not None and statusview.ready_problem(document) is None
                   and document.get("daemon", {}).get("uptime_s", 0.0) >= for_seconds
                   and not document.get("reliable", {}).get("unacked") and not document.get("custody", {}).get("open")
                   for document in documents.values())

    def snapshot(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for name, document in self.brokers.statuses(list(self.brokers.nodes)).items():
            if document is None:
                found[name] = None
                continue
            broker = document.get("daemon", {}).get("broker", {})
            counters = document.get("counters", {})
            found[name] = {
                "pid": document.get("daemon", {}).get("pid"),
                "drops": dict(document.get("drops", {})),
                "broker": {key: broker.get(key) for key in SNAPSHOT_FIELDS},
                "injection_dropped": dict(broker.get("injection_dropped", {})),
                "unacked": document.get("reliable", {}).get("unacked"),
                "counters": {key: counters.get(key, 0) for key in SNAPSHOT_COUNTERS},
                "custody": dict(document.get("custody", {})),
                "receivers": {key: value for key, value in document.get("receivers", {}).items()
                              if key in ("awaiting", "repairs_in_flight")},
                "ready": document.get("daemon", {}).get("ready"),
                "storage": document.get("daemon", {}).get("storage"),
                "intake_paused": broker.get("intake_paused"),
            }
        return found


class BridgeBrokers(BenchBrokers):
    """The bench's bridge chain with the reference settings: persistent bridge sessions (`cleansession false`)
    and one bridge per stream QoS on each link (`faults/+/+/q1` at QoS 1, `faults/+/+/q2` at QoS 2), so what
    befalls one QoS's bridge does not decide the other's figures. Bridges connect to a listener of their own
    (`BRIDGE_PORT`), so a packet filter can cut the bridges and nothing else: a bridge's connection on
    loopback leaves from 127.0.0.1 like the clients' (Mosquitto 2.0.11 ignores `bridge_bind_address` there,
    seen in the brokers' logs)."""

    def extra_conf(self, node: FederationNode) -> list[str] | None:
        lines = ["", "# faults: bridges arrive on a listener of their own", f"listener {BRIDGE_PORT} {node.host}"]
        target = self.next_broker(node)
        if target is not None:
            for qos in (1, 2):
                lines += bridge_lines(node.index, target.host, BRIDGE_PORT, topic=f"{TOPIC_ROOT}/+/+/q{qos}",
                                      qos=qos, clean_session=False, label=f"faults-q{qos}",
                                      restart_timeout=BRIDGE_RESTART)
        return lines


class BridgeSetup(FaultSetup):
    """Brokers in a line, each bridged to the next (no wrappers); the reference."""

    kind = "bridge"
    pause_target = "broker"

    def __init__(self, topology: Topology, workdir: Path, first_address: str,
                 mosquitto_template: Path | None = None) -> None:
        if topology.name != "line":
            raise ValueError(f"a bridge chain must be a line (a {topology.name} of bridges loops forever)")
        brokers = BridgeBrokers(list(topology.nodes), [], workdir, first_address, bridges=True)
        if mosquitto_template is not None:
            brokers.mosquitto_template = mosquitto_template
        super().__init__(topology, brokers)

    def start(self) -> None:
        self.brokers.start_brokers()

    def bridge_links(self, node: str | None = None) -> list[tuple[str, str]]:
        """(from, to) of every bridge (each node bridges to the next), or only those touching `node`."""
        order = list(self.topology.nodes)
        links = list(zip(order, order[1:], strict=False))
        return [link for link in links if node is None or node in link]

    def _partition(self) -> Heal:
        cut = set(map(frozenset, self.topology.cut_links()))
        return self._cut_bridges([link for link in self.bridge_links() if frozenset(link) in cut], "drop")

    def _kill_forwarding(self, node: str) -> Heal:
        return self._cut_bridges(self.bridge_links(node), "reset")

    def recover(self, timeout: float = RECOVER_TIMEOUT) -> None:
        """Start the chain again: it starts in a fraction of a second, and a bridge that cannot get back by
        itself (a QoS 2 bridge whose remote broker lost its session, docs/guarantees.md) shows no sign of it
        until traffic fails to pass."""
        self.brokers.stop()
        self.start()

    def _cut_bridges(self, links: list[tuple[str, str]], action: str) -> Heal:
        if not links:
            raise LaunchError(f"{self.name}: no bridge to cut")
        heals = [self._cut(Cut((), (self.host(target),), "tcp", BRIDGE_PORT, action))
                 for _, target in links]

        def heal() -> None:
            for undo in heals:
                undo()

        return heal
