"""The network-namespace platform: every scenario node is a namespace with its own broker and wrapper.

Theory of operation
-------------------
Node i is the namespace `<prefix>-i` (names: `federation.netns.system`). Its
address 10.77.x.y (`node_address`) sits on the namespace's own loopback
interface as a /32, its Mosquitto listens on 127.0.0.1:1883 *inside* the
namespace (where its clients connect), and its wrapper binds
10.77.x.y:10500 with the scenario's links as neighbours.

Links are point-to-point: one veth pair per scenario link, one end in each
of the two namespaces, and a /32 route to the neighbour's address through
it. So a node can reach exactly its neighbours, as in the simulator (a
datagram to a non-neighbour has no route), and no packet of a run ever
enters the host's network namespace or leaves the machine. A bridge would
have let every node reach every other and put the host's bridge
netfilter hooks in the path.

Faults are nftables rules in each namespace's table `fedns_<token>`, on the
input hook: `iif "lo" accept` (the broker, clients and status queries are
never touched), then `jump links`, a chain rewritten as a whole, in one nft
transaction, whenever the driver sets a node's inbound filters: per
neighbour address, `drop` for a cut, or
`numgen random mod 10000 < P*100 drop` for P% loss. A one-way cut a -> b is
a drop in b's chain only.

Processes (brokers, wrappers, clients) are children of this process that
enter their node's namespace between fork and exec and die with it; their
files are under one temporary directory, `<prefix>-XXXX`, per run: for node
n, `nodes/n/` holds mosquitto.conf, broker.log, broker-console.log,
wrapper.yaml, wrapper.log, events.jsonl and state/.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import federation.netns.system as system
from federation.daemon.status import STATUS_MAGIC, StatusError, decode_reply
from federation.harness.nodeconfig import (
    BROKER_PORT,
    WRAPPER_PORT,
    broker_running_since,
    log_size,
    mosquitto_template,
    render_mosquitto_conf,
    wrapper_command,
    wrapper_yaml,
)
from federation.harness.platform import (
    InboundFilter,
    NodePlan,
    Platform,
    PlatformError,
    PlatformUnavailable,
    StatusDocument,
)
from federation.harness.processes import LaunchError, end_all, end_process, poll, spawn, tail
from federation.netns.system import TOOLS, RunNames, node_address

BROKER_START_TIMEOUT = 15.0
"""seconds a broker gets to log that it is running"""
MEMORY_PER_NODE = 96 * 2**20
"""bytes a node needs (a wrapper is a Python process of about 33 MB resident; broker and clients are small)"""
NODES_PER_CPU = 16
"""nodes a CPU can carry with the tests' short timers (hello every 0.2 s) and a status poll every 0.1 s"""
MAX_NODES = 250
"""a hard limit whatever the machine (process and file counts; interface names)"""
MAX_NODES_ENV = "FEDERATION_NETNS_MAX_NODES"
"""environment variable that replaces the computed limit (for a bigger machine or a careful person)"""


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes; None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def node_limit() -> tuple[int, str]:
    """(the most nodes this machine runs, why): CPUs, memory and MAX_NODES, or $FEDERATION_NETNS_MAX_NODES."""
    override = os.environ.get(MAX_NODES_ENV)
    if override and override.isdigit():
        return int(override), f"${MAX_NODES_ENV}={override}"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limits = [(MAX_NODES, f"the backend's limit of {MAX_NODES}"),
              (cpus * NODES_PER_CPU, f"{cpus} CPU(s) x {NODES_PER_CPU} nodes")]
    memory = available_memory()
    if memory is not None:
        limits.append((memory // MEMORY_PER_NODE,
                       f"{memory / 2**30:.1f} GiB available / {MEMORY_PER_NODE // 2**20} MiB per node"))
    return min(limits)


class _Node:
    def __init__(self, plan: NodePlan, namespace: str, address: str, directory: Path) -> None:
        self.plan = plan
        self.namespace = namespace
        self.address = address
        self.directory = directory
        self.broker: subprocess.Popen[bytes] | None = None
        self.wrapper: subprocess.Popen[bytes] | None = None
        self.status_socket: socket.socket | None = None

    @property
    def name(self) -> str:
        return self.plan.name

    def path(self, file: str) -> Path:
        return self.directory / file


class NetnsPlatform(Platform):
    """See the module docstring; `federation.harness.platform` documents the interface."""

    backend = "netns"

    def __init__(self, names: RunNames | None = None) -> None:
        self.names = names or RunNames.new()
        self.nodes: dict[str, _Node] = {}
        self.namespaces: list[str] = []
        """namespaces this run asked for, recorded *before* asking, so destroy removes half-made ones"""
        self.processes: list[subprocess.Popen[bytes]] = []
        self.status_lock = threading.Lock()
        self.destroyed = False
        self.workdir = Path(tempfile.gettempdir()) / f"{self.names.prefix}-unused"
        self._workdir_made = False
        self._tools: dict[str, str] = {}

    # ------------------------------------------------------------ before anything exists

    def preflight(self, plans: Sequence[NodePlan], links: Sequence[tuple[str, str]]) -> None:
        reason = system.unavailable_reason()
        if reason is not None:
            raise PlatformUnavailable(reason)
        limit, why = node_limit()
        if len(plans) > limit:
            raise PlatformUnavailable(
                f"the scenario has {len(plans)} nodes; this machine runs at most {limit} on the netns backend "
                f"({why}): use a smaller topology, --backend sim, or set ${MAX_NODES_ENV} if you know better")
        self._tools = {name: system.tool(name, package) for name, package in TOOLS}

    # ------------------------------------------------------------ making the nodes

    def create(self, plans: Sequence[NodePlan], links: Sequence[tuple[str, str]]) -> None:
        if not self._tools:
            self._tools = {name: system.tool(name, package) for name, package in TOOLS}
        ip = self._tools["ip"]
        system.cleanup_leftovers(ip)
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.names.prefix}-"))
        self._workdir_made = True
        template = mosquitto_template()
        for plan in plans:
            namespace = self.names.namespace(plan.index)
            node = _Node(plan, namespace, node_address(plan.index), self.workdir / "nodes" / plan.name)
            self.nodes[plan.name] = node
            node.directory.mkdir(parents=True)
            self.namespaces.append(namespace)
            system.run([ip, "netns", "add", namespace])
            system.run([ip, "-n", namespace, "link", "set", "lo", "up"])
            system.run([ip, "-n", namespace, "address", "add", f"{node.address}/32", "dev", "lo"])
            self._write_ruleset(node)
            node.path("mosquitto.conf").write_text(
                render_mosquitto_conf(template, "127.0.0.1", BROKER_PORT, node.directory, run_as_root=True))
            node.path("wrapper.yaml").write_text(wrapper_yaml(plan.name, plan.settings, "federation.netns"))
        for a, b in links:
            self._link(self.nodes[a], self.nodes[b])

    def _link(self, a: _Node, b: _Node) -> None:
        ip = self._tools["ip"]
        a_side = self.names.veth(a.plan.index, b.plan.index)
        b_side = self.names.veth(b.plan.index, a.plan.index)
        system.run([ip, "link", "add", "name", a_side, "netns", a.namespace, "type", "veth",
                    "peer", "name", b_side, "netns", b.namespace])
        for node, device, peer in ((a, a_side, b), (b, b_side, a)):
            system.run([ip, "-n", node.namespace, "link", "set", device, "up"])
            system.run([ip, "-n", node.namespace, "route", "add", f"{peer.address}/32", "dev", device,
                        "src", node.address])

    def _write_ruleset(self, node: _Node) -> None:
        table = self.names.table
        script = (f"table inet {table} {{\n"
                  f"  chain links {{\n  }}\n"
                  f"  chain input {{\n"
                  f"    type filter hook input priority 0; policy accept;\n"
                  f"    iif \"lo\" accept\n"
                  f"    jump links\n"
                  f"  }}\n"
                  f"}}\n")
        system.run([self._tools["nft"], "-f", "-"], namespace=node.namespace, stdin=script)

    def address(self, name: str) -> str:
        return self._node(name).address

    def _node(self, name: str) -> _Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise PlatformError(f"no node named {name!r}; nodes are {', '.join(self.nodes)}") from None

    # ------------------------------------------------------------ processes

    def _spawn(self, node: _Node, argv: Sequence[str], output: Path,
               stdin: bool = False) -> subprocess.Popen[bytes]:
        process = spawn(argv, output, before_exec=system.enter_namespace(node.namespace), stdin_pipe=stdin)
        self.processes.append(process)
        return process

    def start_broker(self, name: str) -> None:
        node = self._node(name)
        if node.broker is not None and node.broker.poll() is None:
            raise PlatformError(f"the broker of {name} is already running")
        offset = log_size(node.path("broker.log"))
        process = self._spawn(node, [self._tools["mosquitto"], "-c", str(node.path("mosquitto.conf"))],
                              node.path("broker-console.log"))
        node.broker = process

        def running() -> bool:
            if process.poll() is not None:
                raise PlatformError(f"mosquitto of {name} exited with status {process.returncode} at start:\n"
                                    f"{self.wrapper_diagnostics(name)}")
            return broker_running_since(node.path("broker.log"), offset)

        try:
            poll(running, BROKER_START_TIMEOUT, f"mosquitto of {name} to start")
        except LaunchError as error:
            raise PlatformError(f"{error}:\n{self.wrapper_diagnostics(name)}") from None

    def stop_broker(self, name: str, kill: bool = False) -> None:
        node = self._node(name)
        end_process(node.broker, kill)
        node.broker = None

    def start_wrapper(self, name: str) -> None:
        node = self._node(name)
        if node.wrapper is not None and node.wrapper.poll() is None:
            raise PlatformError(f"the wrapper of {name} is already running")
        command = wrapper_command(
            config=node.path("wrapper.yaml"), bind=f"{node.address}:{WRAPPER_PORT}",
            broker=f"127.0.0.1:{BROKER_PORT}", vid=node.plan.vid, name=name, state_dir=node.path("state"),
            event_log=node.path("events.jsonl"),
            neighbours=[f"{self._node(peer).address}:{WRAPPER_PORT}" for peer in node.plan.neighbours])
        node.wrapper = self._spawn(node, command, node.path("wrapper.log"))

    def stop_wrapper(self, name: str, kill: bool = False) -> int | None:
        node = self._node(name)
        status = end_process(node.wrapper, kill)
        node.wrapper = None
        return status

    def wrapper_running(self, name: str) -> bool:
        wrapper = self._node(name).wrapper
        return wrapper is not None and wrapper.poll() is None

    def wrapper_diagnostics(self, name: str) -> str:
        node = self._node(name)
        return (f"--- {name} ({node.namespace}, {node.address}) broker log:\n{tail(node.path('broker.log'))}\n"
                f"--- {name} broker console:\n{tail(node.path('broker-console.log'), 5)}\n"
                f"--- {name} wrapper log:\n{tail(node.path('wrapper.log'))}")

    def start_client(self, name: str, argv: Sequence[str], output: Path,
                     stdin: bool = False) -> subprocess.Popen[bytes]:
        node = self._node(name)
        program = self._tools.get(argv[0]) or system.find_tool(argv[0]) or argv[0]
        return self._spawn(node, [program, *argv[1:]], output, stdin)

    def stop_all(self) -> None:
        end_all([node.wrapper for node in self.nodes.values() if node.wrapper is not None])
        end_all([node.broker for node in self.nodes.values() if node.broker is not None])

    # ------------------------------------------------------------ status

    def statuses(self, names: Sequence[str], timeout: float) -> dict[str, StatusDocument | None]:
        """One status datagram to every named wrapper at once, then the replies until `timeout`."""
        with self.status_lock:
            results: dict[str, StatusDocument | None] = {name: None for name in names}
            waiting: dict[int, tuple[str, socket.socket]] = {}
            for name in names:
                node = self._node(name)
                if node.status_socket is None:
                    node.status_socket = system.socket_in_namespace(node.namespace)
                    node.status_socket.setblocking(False)
                channel = node.status_socket
                _drain(channel)
                try:
                    channel.sendto(STATUS_MAGIC, (node.address, WRAPPER_PORT))
                except OSError:
                    continue
                waiting[channel.fileno()] = (name, channel)
            deadline = time.monotonic() + timeout
            while waiting:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                readable, _, _ = select.select(list(waiting), [], [], remaining)
                for descriptor in readable:
                    name, channel = waiting[descriptor]
                    try:
                        data, source = channel.recvfrom(65536)
                    except OSError:  # ICMP port unreachable: the wrapper is not there
                        del waiting[descriptor]
                        continue
                    if source[0] != self._node(name).address:
                        continue
                    with contextlib.suppress(StatusError):
                        results[name] = decode_reply(data)
                    del waiting[descriptor]
            return results

    # ------------------------------------------------------------ faults

    def _links_chain(self, filters: Mapping[str, InboundFilter]) -> str:
        """The nft transaction that replaces a node's `links` chain with these filters."""
        table = self.names.table
        lines = [f"flush chain inet {table} links"]
        for peer in sorted(filters):
            chosen = filters[peer]
            source = self._node(peer).address
            if chosen.cut:
                lines.append(f"add rule inet {table} links ip saddr {source} drop")
            elif chosen.loss > 0:
                threshold = round(chosen.loss * 100)
                lines.append(f"add rule inet {table} links ip saddr {source} numgen random mod 10000 < {threshold} "
                             f"drop")
        return "\n".join(lines) + "\n"

    def set_inbound(self, name: str, filters: Mapping[str, InboundFilter]) -> None:
        node = self._node(name)
        system.run([self._tools["nft"], "-f", "-"], namespace=node.namespace, stdin=self._links_chain(filters))

    def set_inbound_many(self, filters: Mapping[str, Mapping[str, InboundFilter]]) -> None:
        """One `nft -f -` per node, all started before any is waited for."""
        jobs = [(name, self._links_chain(filters[name])) for name in sorted(filters)]
        system.run_many([([self._tools["nft"], "-f", "-"], self._node(name).namespace, script)
                         for name, script in jobs])

    # ------------------------------------------------------------ the end

    def collect(self, name: str, dest: Path) -> Path:
        node = self._node(name)
        dest.mkdir(parents=True, exist_ok=True)
        for file in ("events.jsonl", "broker.log", "broker-console.log", "wrapper.log", "mosquitto.conf",
                     "wrapper.yaml"):
            source = node.path(file)
            if source.exists():
                shutil.copyfile(source, dest / file)
        return dest / "events.jsonl"

    def destroy(self) -> None:
        if self.destroyed:
            return
        self.destroyed = True
        with contextlib.suppress(Exception):
            end_all(self.processes, timeout=3.0)
        for node in self.nodes.values():
            if node.status_socket is not None:
                node.status_socket.close()
                node.status_socket = None
        ip = self._tools.get("ip") or system.find_tool("ip") or "ip"
        for namespace in self.namespaces:
            with contextlib.suppress(Exception):
                system.delete_namespace(ip, namespace)
        if self._workdir_made:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _drain(channel: socket.socket) -> None:
    """Throw away late replies to an earlier query that timed out."""
    for _ in range(1000):
        try:
            channel.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # a pending ICMP error is reported once
            continue
