"""The three things the benchmark compares, started on loopback: one broker, a bridge chain, a federation.

Theory of operation: every setup is a `federation.tools.launch.LocalFederation`, so
all brokers are rendered from the same template (configs/mosquitto.conf),
started and stopped by the same code, and differ only in what joins them:

* `single`: one broker; publisher and subscriber both on it. The clients'
  own ceiling, and the latency floor.
* `bridge-N`: N brokers in a line, broker i carrying a Mosquitto bridge to
  broker i+1 (`topic bench/# out 1`: every bench message, QoS kept up to 1).
  No wrappers run.
* `federation-N`: the same N brokers in a line joined by our wrappers
  (default protocol settings), nothing else.
* `relay-N`: the same N brokers, each hop a relay of two C processes
  joined by a pipe: `mosquitto_sub` on broker i printing each payload,
  piped into `mosquitto_pub -l` on broker i+1 (same topic and QoS,
  started for each case, since `mosquitto_pub -l` publishes on one topic).
  Not a federation: the latency floor of any design that, as ours does,
  puts two extra processes on each hop, with no work in them but the MQTT
  clients' own. It writes a packet per message, so for throughput it is a
  reference, not a ceiling (batching carries more). Loopback and a pipe
  instead of UDP; payloads are the bench's lines.

Publisher on the first broker, subscriber on the last. Two changes to the
rendered configs apply to every setup alike:

* `log_type all` becomes the list of log types the wrapper reads
  (`WRAPPER_LOG_TYPES`). `log_type all` includes `debug`, which makes
  Mosquitto write two lines per message to its log file ("Received PUBLISH
  ...", "Sending PUBLISH ..."); the wrapper never sees debug lines (they are
  not published on `$SYS/broker/log`), so they are pure cost, and they would
  load the disk of a benchmark that moves millions of messages.
* `set_tcp_nodelay true`: without it Mosquitto's sends to a QoS 0
  subscriber wait for Nagle's algorithm, and a 1 KB message at 1,000/s takes
  about 20 ms on one broker instead of 0.15 ms (measured; docs/benchmarks/history.md).

With `max_inflight` (the bench's `--max-inflight`), every setup's brokers
get `max_inflight_messages` set to it in place of the template's value: the
window of unacknowledged QoS 1/2 publications a broker allows each client
both ways (its Receive Maximum), and so how many the receiving wrapper, or a
bridge, may have in flight into the next broker (docs/benchmarks/history.md,
"Sixth pass").

Each setup gets its own /24 of loopback addresses (127.0.<subnet>.10 and up),
away from the tests' 127.0.40+ and the demo's 127.0.0.10.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from federation.harness.nodeconfig import WRAPPER_LOG_TYPES
from federation.harness.processes import end_all, find_tool, tail
from federation.protocol import events
from federation.tools.launch import (
    BROKER_PORT,
    FederationNode,
    LaunchError,
    LocalFederation,
    die_with_parent,
    line,
    node_names,
)

BRIDGE_TOPIC = "bench/#"
BRIDGE_RESTART_TIMEOUT = 1
"""seconds a bridge waits before retrying its connection (the next broker may start after it)"""
CONVERGE_TIMEOUT = 30.0
"""seconds a federation gets to converge after its wrappers start"""
START_TIMEOUT = 60.0
"""seconds a broker or wrapper gets to start (a loaded 2-CPU machine took over 10 s to start a wrapper)"""
SETUP_KINDS = ("single", "bridge", "federation", "relay")


def find_client(name: str) -> str:
    """The path of one of Mosquitto's C clients; LaunchError saying how to install them."""
    found = find_tool(name)
    if found is None:
        raise LaunchError(f"{name} is not installed: `apt-get install -y mosquitto-clients` (or `make install`)")
    return found


@dataclass(frozen=True)
class SetupSpec:
    """What to start: a kind and a number of brokers (`single` has 1)."""

    kind: str
    brokers: int

    @property
    def name(self) -> str:
        return "single" if self.kind == "single" else f"{self.kind}-{self.brokers}"

    @staticmethod
    def parse(text: str) -> SetupSpec:
        """'single', 'bridge-3', 'federation-2' -> SetupSpec; ValueError naming the accepted forms."""
        if text == "single":
            return SetupSpec("single", 1)
        kind, _, count = text.partition("-")
        if kind in ("bridge", "federation", "relay") and count.isdigit() and int(count) >= 2:
            return SetupSpec(kind, int(count))
        raise ValueError(f"setup {text!r}: expected single, bridge-N, federation-N or relay-N with N >= 2")


def bridge_lines(index: int, target_host: str, port: int = BROKER_PORT, *, topic: str = BRIDGE_TOPIC, qos: int = 1,
                 clean_session: bool = True, label: str = "bench",
                 restart_timeout: str = str(BRIDGE_RESTART_TIMEOUT), direction: str = "out",
                 protocol: str | None = None) -> list[str]:
    """The mosquitto.conf bridge section that forwards every message on `topic` from broker `index` to the next
    (QoS kept up to `qos`; `direction` "both" forwards the next broker's messages back too). `clean_session=False`
    makes the brokers keep the bridge's session and queue for it while it is down. `restart_timeout`:
    Mosquitto's value, seconds or "base cap" (2.0.11 backs off even with a single value: 5 s, then 8 s, ...
    between attempts). `protocol`: `bridge_protocol_version` (None: Mosquitto's default, mqttv311, which
    carries no MQTT 5 properties)."""
    if direction not in ("out", "in", "both"):
        raise ValueError(f"bridge direction {direction!r}: out, in or both")
    return [
        "",
        f"# {label}: bridge to the next broker of the line",
        f"connection {label}-bridge-{index}",
        f"address {target_host}:{port}",
        f"topic {topic} {direction} {qos}",
        *([f"bridge_protocol_version {protocol}"] if protocol is not None else []),
        f"cleansession {'true' if clean_session else 'false'}",
        f"restart_timeout {restart_timeout}",
        "notifications false",
    ]


def bench_conf(rendered: str, bridge: list[str] | None, max_inflight: int | None = None) -> str:
    """A config rendered by `federation.tools.launch` with the bench's log types and, optionally, a bridge and
    `max_inflight_messages max_inflight` (replacing the template's)."""
    lines = [raw for raw in rendered.splitlines() if raw.split() != ["log_type", "all"]]
    if max_inflight is not None:
        lines = [raw for raw in lines if raw.split()[:1] != ["max_inflight_messages"]]
        lines.append(f"max_inflight_messages {max_inflight}")
    active = {" ".join(raw.split()) for raw in lines if not raw.lstrip().startswith("#")}
    lines += [wanted for wanted in (*WRAPPER_LOG_TYPES, "set_tcp_nodelay true") if wanted not in active]
    return "\n".join(lines + (bridge or [])) + "\n"


class BenchBrokers(LocalFederation):
    """A LocalFederation whose broker configs get the bench's log types and, with `bridges`, a bridge from
    each broker to the next in name order; without `publication_events`, the wrappers' event logs keep every
    event type but the per-publication ones (so the nodes do not make those: docs/daemon.md "Event log")."""

    def __init__(self, names: Sequence[str], links: Sequence[tuple[str, str]], workdir: Path, first_address: str,
                 bridges: bool, publication_events: bool = True, max_inflight: int | None = None,
                 settings: dict[str, Any] | None = None) -> None:
        super().__init__(list(names), links, workdir, settings, first_address=first_address)
        self.bridges = bridges
        self.publication_events = publication_events
        self.max_inflight = max_inflight

    def next_broker(self, node: FederationNode) -> FederationNode | None:
        """The broker after `node` in name order (the one its bridge connects to), None for the last."""
        order = list(self.nodes)
        return self.nodes[order[node.index + 1]] if node.index + 1 < len(order) else None

    def extra_conf(self, node: FederationNode) -> list[str] | None:
        """Lines added at the end of the node's broker config: with `bridges`, the bridge to the next broker
        (subclasses add other lines or choose other bridge settings)."""
        target = self.next_broker(node)
        return bridge_lines(node.index, target.host) if self.bridges and target is not None else None

    def _write_configs(self, node: FederationNode) -> None:  # extends LocalFederation's rendering
        super()._write_configs(node)
        node.broker_conf.write_text(bench_conf(node.broker_conf.read_text(encoding="utf-8"), self.extra_conf(node),
                                               self.max_inflight), encoding="utf-8")
        if not self.publication_events:
            config = yaml.safe_load(node.wrapper_config.read_text(encoding="utf-8")) or {}
            config["event_types"] = [kind for kind in events.ALL if kind not in events.PER_PUBLICATION]
            node.wrapper_config.write_text(yaml.safe_dump(config), encoding="utf-8")


class Setup:
    """One started setup: where to publish and subscribe, and which processes to charge CPU time to."""

    def __init__(self, spec: SetupSpec, workdir: Path, subnet: int, publication_events: bool = True,
                 max_inflight: int | None = None, settings: dict[str, Any] | None = None) -> None:
        """`settings`: protocol settings for a federation's wrappers (None: the defaults)."""
        self.spec = spec
        names = node_names(spec.brokers)
        links = line(names) if spec.kind == "federation" else []
        self.brokers = BenchBrokers(names, links, workdir / spec.name, f"127.0.{subnet}.10",
                                    bridges=spec.kind == "bridge", publication_events=publication_events,
                                    max_inflight=max_inflight, settings=settings)
        self.relays: list[subprocess.Popen[bytes]] = []
        """a relay setup's clients for the case under way (`begin_case`)"""

    def start(self) -> None:
        """Start the brokers (and the wrappers, for a federation, until they converge); LaunchError on failure."""
        if self.spec.kind == "federation":
            self.brokers.start(timeout=START_TIMEOUT)
            try:
                self.brokers.wait_converged(timeout=CONVERGE_TIMEOUT)
            except LaunchError:
                self.brokers.stop()
                raise
        else:
            self.brokers.start_brokers(START_TIMEOUT)

    def stop(self) -> None:
        self.end_case()
        self.brokers.stop()

    def begin_case(self, topic: str, qos: int) -> None:
        """Before a case's clients start: a relay setup starts its relays for `topic` at `qos` (the case's
        probes wait for them to connect); the other setups have nothing to do."""
        if self.spec.kind != "relay":
            return
        self.end_case()
        nodes = list(self.brokers.nodes.values())
        common = ["-p", str(BROKER_PORT), "-t", topic, "-q", str(qos), "--nodelay"]
        log = open(self.brokers.workdir / "relays.log", "ab")  # noqa: SIM115 - the children hold it
        try:
            for index, (source, target) in enumerate(itertools.pairwise(nodes)):
                reader = subprocess.Popen(
                    [find_client("mosquitto_sub"), "-h", source.host, *common, "-F", "%p", "-i", f"relay{index}-sub"],
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, process_group=0,
                    preexec_fn=die_with_parent)
                self.relays.append(reader)
                assert reader.stdout is not None
                writer = subprocess.Popen(
                    [find_client("mosquitto_pub"), "-h", target.host, *common, "-l", "-i", f"relay{index}-pub"],
                    stdin=reader.stdout, stdout=log, stderr=log, process_group=0, preexec_fn=die_with_parent)
                reader.stdout.close()  # the writer holds the pipe's read end now
                self.relays.append(writer)
        finally:
            log.close()

    def end_case(self) -> None:
        """Stop the relays of the case that ended (nothing for the other setups)."""
        relays, self.relays = self.relays, []
        end_all(relays)

    @property
    def publish_host(self) -> str:
        return next(iter(self.brokers.nodes.values())).host

    @property
    def subscribe_host(self) -> str:
        return list(self.brokers.nodes.values())[-1].host

    def broker_pids(self) -> list[int]:
        return [node.broker_process.pid for node in self.brokers.nodes.values() if node.broker_process is not None]

    def wrapper_pids(self) -> list[int]:
        """The processes a hop adds beside the brokers: a federation's wrappers, a relay setup's clients."""
        if self.spec.kind == "relay":
            return [process.pid for process in self.relays]
        return [node.wrapper_process.pid for node in self.brokers.nodes.values()
                if node.wrapper_process is not None]

    def wrapper_drops(self) -> dict[str, int]:
        """Every wrapper's drop counters summed by reason, with the kernel's count of datagrams dropped for
        a full receive buffer as `kernel_receive`: where a federation run's losses happened. Empty for
        bridges; a wrapper that does not answer is left out (the run still counts what arrived)."""
        totals: dict[str, int] = {}
        if self.spec.kind != "federation":
            return totals
        for status in self.brokers.statuses().values():
            if status is None:
                continue
            counts = dict(status.get("drops", {}))
            counts["kernel_receive"] = status.get("daemon", {}).get("overload", {}).get("kernel_receive_drops") or 0
            for reason, count in counts.items():
                totals[reason] = totals.get(reason, 0) + int(count)
        return totals

    def check_running(self) -> None:
        """LaunchError if a broker, wrapper or relay client of this setup has exited."""
        for node in self.brokers.nodes.values():
            if not node.broker_running or (self.spec.kind == "federation" and not node.wrapper_running):
                raise LaunchError(f"{self.spec.name}: a process of {node.name} exited:\n{node.diagnostics()}")
        for process in self.relays:
            if process.poll() is not None:
                raise LaunchError(f"{self.spec.name}: a relay client (pid {process.pid}) exited with status "
                                  f"{process.returncode}:\n{tail(self.brokers.workdir / 'relays.log')}")

    def diagnostics(self) -> str:
        return self.brokers.diagnostics()


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a running process (all its threads); 0.0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    fields = text[text.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine since boot, summed over its CPUs (/proc/stat): the share of a
    run's CPU time left idle is 1 - (busy after - busy before) / (all after - all before)."""
    with open("/proc/stat", "rb") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle and iowait
    return (sum(ticks) - idle) / _CLOCK_TICKS, sum(ticks) / _CLOCK_TICKS
