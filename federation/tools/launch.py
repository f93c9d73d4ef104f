"""Start a local federation of real processes on loopback: one Mosquitto and one wrapper per node.

    with LocalFederation(5, ring(node_names(5)), Path("/tmp/fed")) as federation:
        federation.wait_converged(timeout=15)
        print(federation.status("n0")["management_core"])

Theory of operation: Linux routes all of 127.0.0.0/8 to the loopback
interface, so node i can own the address 127.0.0.(10+i) (`first_address`
moves the range) and keep the standard ports, 1883 for its broker and 10500
for its wrapper, exactly as on separate hosts. Each node gets a directory
under `workdir` with its broker config (configs/mosquitto.conf rendered with
the node's listener, log file and persistence directory), the broker's log,
the wrapper's YAML (protocol `settings`), stderr, event log and state
directory, so a failed run can be read afterwards.

`start` starts every broker, waits until each logs that it is running, then
starts every wrapper and waits until each answers `status` and has its broker
connection with the broker's log flowing. Children run in their own process
group, so a Ctrl-C reaches only this process, which then stops them in order
(wrappers first, so they leave the overlay cleanly, then brokers); they also
get SIGTERM from the kernel if this process dies without cleaning up
(PR_SET_PDEATHSIG). `stop` is idempotent, registered with `atexit`, and runs
when the `with` block ends, also on an exception.

Nothing here sleeps blindly: every wait polls a condition until a deadline and
raises `LaunchError` with the state it saw and the ends of the relevant logs.

The pieces every real backend shares live in `federation.harness`: process
spawning and `poll` (`processes`), the broker config, wrapper YAML and
command line (`nodeconfig`), and the judgements made from status documents
(`statusview`). The deployment backends (`federation.netns`, `federation.lxd`)
take them from there, never from here: this module is a tool. They are
re-exported here for the tests and scripts that start a loopback federation,
so `from federation.tools.launch import poll, render_mosquitto_conf, ...` keeps working.
"""

from __future__ import annotations

import argparse
import atexit
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from federation.harness import statusview
from federation.harness.nodeconfig import (
    BROKER_PORT,
    FALLBACK_CONF_LINES,
    MOSQUITTO_CONF_TEMPLATE,
    REPO_ROOT,
    REQUIRED_CONF_LINES,
    WRAPPER_PORT,
    WRAPPER_SCRIPT,
    broker_running_since,
    log_size,
    mosquitto_template,
    render_mosquitto_conf,
    wrapper_command,
    wrapper_program,
    wrapper_yaml,
)
from federation.harness.processes import (
    POLL_INTERVAL,
    STOP_TIMEOUT,
    LaunchError,
    die_with_parent,
    end_all,
    end_process,
    find_mosquitto,
    poll,
    spawn,
    tail,
)
from federation.protocol.publication_events import expand

__all__ = [
    "BROKER_PORT", "FALLBACK_CONF_LINES", "FIRST_ADDRESS", "MOSQUITTO_CONF_TEMPLATE", "POLL_INTERVAL", "REPO_ROOT",
    "REQUIRED_CONF_LINES", "START_TIMEOUT", "STATUS_TIMEOUT", "STOP_TIMEOUT", "WRAPPER_PORT", "WRAPPER_SCRIPT",
    "FederationNode", "LaunchError", "LocalFederation", "address_in_use", "die_with_parent", "find_mosquitto",
    "line", "main", "node_names", "poll", "render_mosquitto_conf", "ring", "tail",
]

FIRST_ADDRESS = "127.0.0.10"

START_TIMEOUT = 10.0
"""seconds a broker or a wrapper gets to become ready"""
STATUS_TIMEOUT = 1.0
"""seconds one status query waits for the reply"""


def node_names(count: int) -> list[str]:
    """The default names: n0, n1, ..."""
    return [f"n{index}" for index in range(count)]


def line(names: Sequence[str]) -> list[tuple[str, str]]:
    """Links of a line: n0-n1, n1-n2, ..."""
    return [(names[i], names[i + 1]) for i in range(len(names) - 1)]


def ring(names: Sequence[str]) -> list[tuple[str, str]]:
    """Links of a ring: a line closed by last-first (needs at least 3 nodes)."""
    if len(names) < 3:
        raise ValueError(f"a ring needs at least 3 nodes, got {len(names)}")
    return [*line(names), (names[-1], names[0])]


def address_in_use(host: str, port: int, kind: socket.SocketKind) -> bool:
    """True if binding host:port (TCP or UDP) fails with EADDRINUSE right now."""
    with socket.socket(socket.AF_INET, kind) as probe:
        if kind == socket.SOCK_STREAM:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as mosquitto does: TIME_WAIT is fine
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


@dataclass
class FederationNode:
    """One node: its names, addresses, files and the two processes."""

    name: str
    index: int
    host: str
    directory: Path
    neighbours: list[str] = field(default_factory=list)
    broker_process: subprocess.Popen[bytes] | None = None
    wrapper_process: subprocess.Popen[bytes] | None = None
    wrapper_exits: list[int] = field(default_factory=list)
    """exit statuses of the wrapper processes that ended, in order"""
    paused: set[str] = field(default_factory=set)
    """"wrapper" and/or "broker" while `LocalFederation.pause` holds them stopped (SIGSTOP)"""

    @property
    def broker_port(self) -> int:
        return BROKER_PORT

    @property
    def wrapper_port(self) -> int:
        return WRAPPER_PORT

    @property
    def address(self) -> str:
        """The wrapper's address, as it appears in status and events (host:port)."""
        return f"{self.host}:{WRAPPER_PORT}"

    @property
    def broker_conf(self) -> Path:
        return self.directory / "mosquitto.conf"

    @property
    def broker_log(self) -> Path:
        return self.directory / "broker.log"

    @property
    def broker_console(self) -> Path:
        return self.directory / "broker-console.log"

    @property
    def wrapper_log(self) -> Path:
        return self.directory / "wrapper.log"

    @property
    def wrapper_config(self) -> Path:
        return self.directory / "wrapper.yaml"

    @property
    def event_log(self) -> Path:
        return self.directory / "events.jsonl"

    @property
    def state_dir(self) -> Path:
        return self.directory / "state"

    @property
    def broker_running(self) -> bool:
        return self.broker_process is not None and self.broker_process.poll() is None

    @property
    def wrapper_running(self) -> bool:
        return self.wrapper_process is not None and self.wrapper_process.poll() is None

    def diagnostics(self) -> str:
        return (f"--- {self.name} ({self.host}) broker log {self.broker_log}:\n{tail(self.broker_log)}\n"
                f"--- {self.name} broker console:\n{tail(self.broker_console, 5)}\n"
                f"--- {self.name} wrapper log {self.wrapper_log}:\n{tail(self.wrapper_log)}")


class LocalFederation:
    """Real brokers and wrappers on 127.0.0.x; see the module docstring.

    `nodes`: names, or a count (names n0, n1, ...). `links`: pairs of names,
    each a pair of neighbours (both wrappers list each other). `settings`:
    protocol settings written to each wrapper's YAML under `settings:`
    (None: the project's defaults). `vids`: the wrappers' virtual ids by name
    (default: index + 1, so n0 is the management core and runs repeat).
    `key_file`: a federation key file given to every wrapper (`--key-file`;
    None: an open overlay); `encryption`: their `--encryption` (None: default).
    `topics`: topic policy lines by node name, written to its YAML file (`topics:`);
    `neighbours_in_file`: the neighbours written to the YAML file instead of
    `--neighbors`, so a SIGHUP after `write_wrapper_config` can change them.
    """

    def __init__(self, nodes: list[str] | int, links: Iterable[tuple[str, str]], workdir: Path,
                 settings: dict[str, Any] | None = None, *, first_address: str = FIRST_ADDRESS,
                 vids: dict[str, int] | None = None, log_level: str = "INFO",
                 mosquitto_template: Path | None = None, key_file: Path | None = None,
                 encryption: str | None = None, topics: dict[str, list[str]] | None = None,
                 neighbours_in_file: bool = False) -> None:
        names = node_names(nodes) if isinstance(nodes, int) else list(nodes)
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"node names must be unique and at least one: {names}")
        self.workdir = Path(workdir).resolve()
        self.settings = dict(settings) if settings else None
        self.log_level = log_level
        self.key_file = Path(key_file).resolve() if key_file is not None else None
        self.encryption = encryption
        self.topics = dict(topics or {})
        self.neighbours_in_file = neighbours_in_file
        self.vids = {name: index + 1 for index, name in enumerate(names)}
        self.vids.update(vids or {})
        self.mosquitto_template = mosquitto_template or MOSQUITTO_CONF_TEMPLATE
        first = ipaddress.IPv4Address(first_address)
        self.nodes: dict[str, FederationNode] = {}
        for index, name in enumerate(names):
            host = str(first + index)
            if not ipaddress.IPv4Address(host).is_loopback:
                raise ValueError(f"node {name}: {host} is not a loopback address; choose first_address in 127/8")
            self.nodes[name] = FederationNode(name, index, host, self.workdir / name)
        self.links = [(a, b) for a, b in links]
        for a, b in self.links:
            for end in (a, b):
                if end not in self.nodes:
                    raise ValueError(f"link {a}-{b}: no node named {end!r}; nodes are {', '.join(names)}")
            if a == b:
                raise ValueError(f"link {a}-{b} joins a node to itself")
            if b not in self.nodes[a].neighbours:
                self.nodes[a].neighbours.append(b)
            if a not in self.nodes[b].neighbours:
                self.nodes[b].neighbours.append(a)
        self._mosquitto: str | None = None
        self._stopped = False
        self._atexit_registered = False

    # ------------------------------------------------------------ lifecycle

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start every broker, wait until all run, then every wrapper, and wait until all are ready.

        On any failure everything started is stopped and LaunchError says
        what failed, with the ends of the logs.
        """
        self.start_brokers(timeout)
        self.start_wrappers(timeout)

    def start_brokers(self, timeout: float = START_TIMEOUT) -> None:
        """The first half of `start`: check, write every config, start every broker and wait until all run."""
        self._mosquitto = find_mosquitto()
        self.check_addresses_free()
        self._stopped = False
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            for node in self.nodes.values():
                node.directory.mkdir(parents=True, exist_ok=True)
                self._write_configs(node)
            offsets = {name: self._spawn_broker(node) for name, node in self.nodes.items()}
            for name, node in self.nodes.items():
                self._wait_broker(node, offsets[name], timeout)
        except BaseException:
            self.stop()
            raise

    def start_wrappers(self, timeout: float = START_TIMEOUT) -> None:
        """The second half of `start`: start every wrapper, then wait until each is ready."""
        self._stopped = False
        try:
            for node in self.nodes.values():
                if not node.wrapper_running:
                    self._spawn_wrapper(node)
            for node in self.nodes.values():
                self.wait_wrapper_ready(node.name, timeout)
        except BaseException:
            self.stop()
            raise

    def check_addresses_free(self) -> None:
        """LaunchError naming the first node address whose broker or wrapper port is already taken."""
        for node in self.nodes.values():
            if address_in_use(node.host, BROKER_PORT, socket.SOCK_STREAM):
                raise LaunchError(f"{node.host}:{BROKER_PORT} (TCP) is already in use: another federation or "
                                  f"broker is running there (`pgrep -a mosquitto`); stop it, or choose other "
                                  f"addresses")
            if address_in_use(node.host, WRAPPER_PORT, socket.SOCK_DGRAM):
                raise LaunchError(f"{node.host}:{WRAPPER_PORT} (UDP) is already in use: another wrapper is running "
                                  f"there (`pgrep -af wrapper.py`); stop it, or choose other addresses")

    def stop(self) -> None:
        """Stop every wrapper (SIGTERM: they leave cleanly), then every broker. Idempotent; never raises."""
        if self._stopped:
            return
        # A second Ctrl-C while stopping must not leave processes behind: ignore SIGINT meanwhile
        # (stopping is bounded: SIGKILL after STOP_TIMEOUT).
        in_main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main_thread else None
        try:
            self._stop_all()
        finally:
            if in_main_thread:
                signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)

    def _stop_all(self) -> None:
        nodes = list(self.nodes.values())
        for node in nodes:  # a stopped process would take SIGTERM only after SIGCONT: wake it first
            for which in sorted(node.paused):
                self.resume(node.name, which)
        # Wrappers first (they leave the overlay cleanly), then brokers; each group costs one timeout.
        wrappers = [(node, node.wrapper_process) for node in nodes if node.wrapper_process is not None]
        end_all([process for _, process in wrappers if process is not None])
        for node, process in wrappers:
            assert process is not None
            node.wrapper_exits.append(process.returncode)
            node.wrapper_process = None
        end_all([node.broker_process for node in nodes if node.broker_process is not None])
        for node in nodes:
            node.broker_process = None
        self._stopped = True

    def __enter__(self) -> Self:
        if all(node.broker_process is None for node in self.nodes.values()):
            self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    # ------------------------------------------------------------ one node

    def node(self, name: str) -> FederationNode:
        try:
            return self.nodes[name]
        except KeyError:
            raise KeyError(f"no node named {name!r}; nodes are {', '.join(self.nodes)}") from None

    def stop_wrapper(self, name: str, kill: bool = False) -> int | None:
        """SIGTERM (clean leave) or SIGKILL (a crash) one wrapper; its exit status (None if not running)."""
        node = self.node(name)
        if "wrapper" in node.paused:
            self.resume(name, "wrapper")
        status = end_process(node.wrapper_process, kill)
        if status is not None:
            node.wrapper_exits.append(status)
        node.wrapper_process = None
        return status

    def start_wrapper(self, name: str, timeout: float = START_TIMEOUT, wait: bool = True) -> None:
        """Start one wrapper again (same flags, same state dir and event log) and wait until it is ready."""
        node = self.node(name)
        if node.wrapper_running:
            raise LaunchError(f"the wrapper of {name} is already running")
        self._stopped = False
        self._spawn_wrapper(node)
        if wait:
            self.wait_wrapper_ready(name, timeout)

    def stop_broker(self, name: str, kill: bool = False) -> int | None:
        node = self.node(name)
        if "broker" in node.paused:
            self.resume(name, "broker")
        status = end_process(node.broker_process, kill)
        node.broker_process = None
        return status

    def start_broker(self, name: str, timeout: float = START_TIMEOUT) -> None:
        node = self.node(name)
        if node.broker_running:
            raise LaunchError(f"the broker of {name} is already running")
        self._stopped = False
        self._wait_broker(node, self._spawn_broker(node), timeout)

    def restart_broker(self, name: str, timeout: float = START_TIMEOUT) -> None:
        """Stop the broker cleanly and start it again on the same address (its wrapper reconnects by itself)."""
        self.stop_broker(name)
        self.start_broker(name, timeout)

    def pause(self, name: str, which: str = "wrapper") -> None:
        """SIGSTOP the node's wrapper (or broker): it keeps its sockets and state but does nothing until
        `resume`, as a process descheduled for a long time. LaunchError if it is not running."""
        node = self.node(name)
        process = self._process(node, which)
        if process is None or process.poll() is not None:
            raise LaunchError(f"cannot pause the {which} of {name}: it is not running")
        process.send_signal(signal.SIGSTOP)
        node.paused.add(which)

    def resume(self, name: str, which: str = "wrapper") -> None:
        """SIGCONT what `pause` stopped (nothing if it is not paused or has exited meanwhile)."""
        node = self.node(name)
        process = self._process(node, which)
        node.paused.discard(which)
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGCONT)

    @staticmethod
    def _process(node: FederationNode, which: str) -> subprocess.Popen[bytes] | None:
        if which not in ("wrapper", "broker"):
            raise ValueError(f"which: wrapper or broker, not {which!r}")
        return node.wrapper_process if which == "wrapper" else node.broker_process

    def wait_wrapper_ready(self, name: str, timeout: float = START_TIMEOUT) -> dict[str, Any]:
        """Wait until the wrapper answers status, is connected to its broker and gets its log lines."""
        node = self.node(name)
        last: list[str] = ["no status reply yet"]

        def ready() -> dict[str, Any] | None:
            process = node.wrapper_process
            if process is None or process.poll() is not None:
                code = None if process is None else process.returncode
                raise LaunchError(f"the wrapper of {name} exited with status {code} at start:\n"
                                  f"{node.diagnostics()}")
            document = self._try_status(node)
            problem = statusview.ready_problem(document)
            last[0] = problem or "ready"
            return document if problem is None else None

        return poll(ready, timeout, lambda: f"the wrapper of {name} to be ready ({last[0]}):\n{node.diagnostics()}")

    # ------------------------------------------------------------ what the wrappers know

    def status(self, name: str, timeout: float = STATUS_TIMEOUT) -> dict[str, Any]:
        """The node's status document (what `wrapper.py status --json` prints), asked over its UDP port."""
        node = self.node(name)
        from federation.daemon.status import StatusError, query

        try:
            return query(node.host, WRAPPER_PORT, timeout)
        except StatusError as error:
            raise LaunchError(f"status of {name}: {error}") from None

    def status_cli(self, name: str, timeout: float = 10.0) -> dict[str, Any]:
        """The same document, through the real command line `python wrapper.py status --node ... --json` (which
        exits 1 when the wrapper answered and is not ready)."""
        node = self.node(name)
        result = subprocess.run([sys.executable, *wrapper_program(), "status", "--node", node.address, "--json"],
                                capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode not in (0, 1):
            raise LaunchError(f"`wrapper.py status --node {node.address} --json` exited with "
                              f"{result.returncode}: {result.stderr.strip()}")
        document: dict[str, Any] = json.loads(result.stdout)
        return document

    def running_wrappers(self) -> list[str]:
        return [name for name, node in self.nodes.items() if node.wrapper_running]

    def statuses(self, names: Iterable[str] | None = None) -> dict[str, dict[str, Any] | None]:
        """Status of each named node (default: every running wrapper); None where no reply came."""
        chosen = list(names) if names is not None else self.running_wrappers()
        return {name: self._try_status(self.node(name)) for name in chosen}

    def convergence_problems(self, names: Iterable[str] | None = None) -> list[str]:
        """Why the named nodes (default: every running wrapper) have not converged; empty when they have.

        Converged: each node's federation table holds exactly the named nodes'
        addresses, all agree on the management core, and all agree on the
        topic cores, with a core for every filter that has a local subscriber.
        """
        documents = self.statuses(names)
        return statusview.convergence_problems(documents, {name: self.node(name).address for name in documents})

    def wait_converged(self, timeout: float = 15.0, names: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
        """Poll until `convergence_problems` is empty; the statuses then. LaunchError with the problems."""
        chosen = list(names) if names is not None else None
        last: list[list[str]] = [[]]

        def converged() -> dict[str, dict[str, Any]] | None:
            last[0] = self.convergence_problems(chosen)
            if last[0]:
                return None
            return {name: document for name, document in self.statuses(chosen).items() if document is not None}

        return poll(converged, timeout, lambda: "convergence: " + "; ".join(last[0]), interval=0.1)

    def mesh_problems(self, filter_: str, names: Iterable[str] | None = None) -> list[str]:
        """Why the mesh of `filter_` cannot yet carry a publication to every subscriber; empty when it can.

        Ready: the nodes agree on a core for the filter, every member other
        than the core has parents, and each parent is a member that lists it
        as a child.
        """
        documents = self.statuses(names)
        return statusview.mesh_problems(documents, {name: self.node(name).address for name in documents}, filter_)

    def wait_mesh(self, filter_: str, timeout: float = 15.0, names: Iterable[str] | None = None) -> None:
        """Poll until `mesh_problems(filter_)` is empty; LaunchError with the problems."""
        chosen = list(names) if names is not None else None
        last: list[list[str]] = [[]]

        def ready() -> bool:
            last[0] = self.mesh_problems(filter_, chosen)
            return not last[0]

        poll(ready, timeout, lambda: f"the mesh of {filter_!r}: " + "; ".join(last[0]), interval=0.1)

    def events(self, name: str, types: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """The node's event log so far (the wrapper flushes it about every second and when it stops).

        A last line still being written is skipped. A run of publications (schema version 2) comes as one record
        per publication with the version 1 type and `pub` (`publication_events.expand`), so callers count by
        publication. `types` keeps only those event types (of either kind).
        """
        wanted = set(types) if types is not None else None
        found: list[dict[str, Any]] = []
        try:
            text = self.node(name).event_log.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return found
        for raw in text.splitlines():
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            if wanted is not None and event.get("type") in wanted:
                found.append(event)
                continue
            found.extend(item for item in expand(event) if wanted is None or item.get("type") in wanted)
        return found

    def wait_event_logs(self, after: float, timeout: float = 15.0, names: Iterable[str] | None = None) -> None:
        """Wait until each named node's event log (default: every running wrapper) holds an event later
        than `after` (unix seconds): then everything it emitted before `after` is on disk.

        Needs periodic events: a `stats_interval` of a second or so makes each
        wrapper write a `counters` event that often.
        """
        chosen = list(names) if names is not None else self.running_wrappers()
        behind: list[str] = []

        def caught_up() -> bool:
            behind[:] = [name for name in chosen
                         if not any(float(event.get("t", 0.0)) > after for event in self.events(name)[-50:])]
            return not behind

        poll(caught_up, timeout, lambda: f"event logs of {', '.join(behind)} to pass t={after:.3f}", interval=0.1)

    def diagnostics(self) -> str:
        return "\n".join(node.diagnostics() for node in self.nodes.values())

    # ------------------------------------------------------------ internals

    def _write_configs(self, node: FederationNode) -> None:
        template = mosquitto_template(self.mosquitto_template)
        node.broker_conf.write_text(render_mosquitto_conf(template, node.host, BROKER_PORT, node.directory,
                                                          os.geteuid() == 0))
        self.write_wrapper_config(node.name)

    def write_wrapper_config(self, name: str, *, topics: list[str] | None = None,
                             neighbours: list[str] | None = None) -> None:
        """Write the node's wrapper YAML: its protocol settings, its topic lines (`topics`, else those given at
        construction) and, with `neighbours_in_file`, its neighbours (names of nodes; else its links). A running
        wrapper reads it again on SIGHUP (`signal_wrapper`)."""
        node = self.node(name)
        listed = None
        if self.neighbours_in_file:
            listed = [self.node(other).address for other in (node.neighbours if neighbours is None else neighbours)]
        node.wrapper_config.write_text(wrapper_yaml(
            node.name, self.settings, topics=self.topics.get(name) if topics is None else topics, neighbours=listed))

    def signal_wrapper(self, name: str, signum: int = signal.SIGHUP) -> int:
        """Send a signal to the node's running wrapper (SIGHUP: it loads its YAML file again); returns its pid."""
        process = self.node(name).wrapper_process
        if process is None or process.poll() is not None:
            raise LaunchError(f"the wrapper of {name} is not running")
        process.send_signal(signum)
        return process.pid

    def _spawn_broker(self, node: FederationNode) -> int:
        """Start the broker; returns the size of its log before, to find this start's "running" line."""
        if self._mosquitto is None:
            self._mosquitto = find_mosquitto()
        offset = log_size(node.broker_log)
        node.broker_process = spawn([self._mosquitto, "-c", str(node.broker_conf)], node.broker_console)
        return offset

    def _wait_broker(self, node: FederationNode, offset: int, timeout: float) -> None:
        process = node.broker_process
        assert process is not None

        def running() -> bool:
            if process.poll() is not None:
                raise LaunchError(f"mosquitto of {node.name} exited with status {process.returncode} at start "
                                  f"(config {node.broker_conf}):\n{node.diagnostics()}")
            return broker_running_since(node.broker_log, offset)

        poll(running, timeout, lambda: f"mosquitto of {node.name} on {node.host}:{BROKER_PORT} to start:\n"
                                       f"{node.diagnostics()}")

    def _wrapper_command(self, node: FederationNode) -> list[str]:
        command = wrapper_command(config=node.wrapper_config, bind=node.address, broker=f"{node.host}:{BROKER_PORT}",
                                  vid=self.vids[node.name], name=node.name, state_dir=node.state_dir,
                                  event_log=node.event_log,
                                  neighbours=[] if self.neighbours_in_file else
                                  [self.node(name).address for name in node.neighbours],
                                  log_level=self.log_level)
        if self.key_file is not None:
            command += ["--key-file", str(self.key_file)]
        if self.encryption is not None:
            command += ["--encryption", self.encryption]
        return command

    def _spawn_wrapper(self, node: FederationNode) -> None:
        node.wrapper_process = spawn(self._wrapper_command(node), node.wrapper_log)

    @staticmethod
    def _try_status(node: FederationNode) -> dict[str, Any] | None:
        if not node.wrapper_running:
            return None
        from federation.daemon.status import StatusError, query

        try:
            return query(node.host, WRAPPER_PORT, STATUS_TIMEOUT)
        except StatusError:
            return None


# ------------------------------------------------------------ command line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m federation.tools.launch",
        description="Start a local federation of real Mosquitto brokers and wrappers on 127.0.0.x and keep it "
                    "running until Ctrl-C. `python -m federation.tools.demo` does the same with a commentary.")
    parser.add_argument("--nodes", type=int, default=4, help="number of brokers (default 4)")
    parser.add_argument("--topology", choices=("line", "ring"), default="ring")
    parser.add_argument("--workdir", type=Path, help="where configs and logs go (default: a new temporary dir)")
    parser.add_argument("--first-address", default=FIRST_ADDRESS, help=f"node 0's address (default {FIRST_ADDRESS})")
    options = parser.parse_args(argv)
    if options.nodes < 1 or (options.topology == "ring" and options.nodes < 3):
        parser.error("--nodes: at least 1 (3 for a ring)")
    names = node_names(options.nodes)
    links = ring(names) if options.topology == "ring" else line(names)
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="federation-"))
    federation = LocalFederation(names, links, workdir, first_address=options.first_address)

    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    try:
        federation.start()
        statuses = federation.wait_converged(timeout=30)
        core = next(iter(statuses.values()))["management_core"]
        for name, node in federation.nodes.items():
            print(f"{name}: broker {node.host}:{BROKER_PORT}, wrapper {node.address}, neighbours "
                  f"{', '.join(node.neighbours) or '-'}")
        print(f"converged; management core {core}; files in {workdir}. Ctrl-C to stop.")
        while True:
            time.sleep(3600)
    except LaunchError as error:
        print(f"launch: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    finally:
        federation.stop()


if __name__ == "__main__":
    sys.exit(main())
