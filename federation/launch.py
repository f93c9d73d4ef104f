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
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

REPO_ROOT = Path(__file__).resolve().parent.parent
WRAPPER_SCRIPT = REPO_ROOT / "wrapper.py"
MOSQUITTO_CONF_TEMPLATE = REPO_ROOT / "configs" / "mosquitto.conf"
BROKER_PORT = 1883
WRAPPER_PORT = 10500
FIRST_ADDRESS = "127.0.0.10"

START_TIMEOUT = 10.0
"""seconds a broker or a wrapper gets to become ready"""
STOP_TIMEOUT = 5.0
"""seconds a process gets to exit after SIGTERM before SIGKILL"""
STATUS_TIMEOUT = 1.0
"""seconds one status query waits for the reply"""
POLL_INTERVAL = 0.05

FALLBACK_CONF_LINES = (
    "allow_anonymous true",
    "log_dest topic",
    "log_type all",
    "max_queued_messages 0",
    "persistence false",
)
"""used when configs/mosquitto.conf does not exist"""
REQUIRED_CONF_LINES = ("allow_anonymous true", "log_dest topic", "log_type all")
"""lines the federation needs; added to the rendered config when the template lacks them"""
_REPLACED_KEYS = frozenset({"listener", "port", "bind_address", "bind_interface", "user", "pid_file",
                            "persistence_location"})
_RUNNING = re.compile(r"^\d+: mosquitto version \S+ running$", re.MULTILINE)
_PR_SET_PDEATHSIG = 1

T = TypeVar("T")


class LaunchError(Exception):
    """Something a person can fix (missing mosquitto, address in use) or a process that did not come up."""


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


def find_mosquitto() -> str:
    """The mosquitto executable, or LaunchError telling how to install it."""
    found = shutil.which("mosquitto") or next(
        (path for path in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(path, os.X_OK)), None)
    if found is None:
        raise LaunchError("mosquitto is not installed (not on PATH, not in /usr/sbin): run `make install` "
                          "(or `apt-get install -y mosquitto mosquitto-clients`)")
    return found


def render_mosquitto_conf(template: str, host: str, port: int, node_dir: Path, run_as_root: bool) -> str:
    """A broker config for one node: the template with its listener, log file and persistence dir replaced.

    Lines that place the broker (`listener`, `port`, `bind_address`, `user`,
    `pid_file`, `persistence_location`) and file or console log destinations
    are replaced; `log_dest topic` and every other line are kept. Lines the
    federation needs and the template lacks are added at the end.
    """
    kept: list[str] = []
    for raw in template.splitlines():
        words = raw.split()
        if words and (words[0] in _REPLACED_KEYS or (words[0] == "log_dest" and words[1:2] != ["topic"])):
            kept.append(f"# (replaced below by federation.launch) {raw}")
            continue
        kept.append(raw)
    present = {" ".join(raw.split()) for raw in kept if not raw.lstrip().startswith("#")}
    lines = [f"# rendered by federation.launch for {host}:{port}", f"listener {port} {host}", *kept, ""]
    lines += [required for required in REQUIRED_CONF_LINES if required not in present]
    lines += [f"log_dest file {node_dir / 'broker.log'}", f"persistence_location {node_dir}/"]
    if run_as_root:
        # Started as root, mosquitto drops to user `mosquitto`, which cannot write the node directory.
        lines.append("user root")
    return "\n".join(lines) + "\n"


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


try:
    _PRCTL: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # pragma: no cover - not Linux
    _PRCTL = None


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask the kernel to send SIGTERM to this child when the launching process dies (Linux).

    Pass it as `preexec_fn` (with `process_group=0`) to any child a launcher
    must not leave behind, even when the launcher is killed with SIGKILL.
    """
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def _spawn(command: Sequence[str], output: Path) -> subprocess.Popen[bytes]:
    with open(output, "ab") as sink:
        return subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                process_group=0, preexec_fn=die_with_parent,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _end(process: subprocess.Popen[bytes] | None, kill: bool = False, timeout: float = STOP_TIMEOUT) -> int | None:
    """SIGTERM (or SIGKILL) and wait; SIGKILL after `timeout`. The exit status, None if it was not running."""
    if process is None:
        return None
    if process.poll() is None:
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) or "(empty)"
    except FileNotFoundError:
        return "(none)"


def poll(predicate: Callable[[], T | None], timeout: float, message: str | Callable[[], str],
         interval: float = POLL_INTERVAL) -> T:
    """Call `predicate` until it returns something truthy and return it; LaunchError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise LaunchError(f"timed out after {timeout:g} s waiting for {text}")
        time.sleep(interval)


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
    """

    def __init__(self, nodes: list[str] | int, links: Iterable[tuple[str, str]], workdir: Path,
                 settings: dict[str, Any] | None = None, *, first_address: str = FIRST_ADDRESS,
                 vids: dict[str, int] | None = None, log_level: str = "INFO",
                 mosquitto_template: Path | None = None) -> None:
        names = node_names(nodes) if isinstance(nodes, int) else list(nodes)
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"node names must be unique and at least one: {names}")
        self.workdir = Path(workdir).resolve()
        self.settings = dict(settings) if settings else None
        self.log_level = log_level
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
        if not WRAPPER_SCRIPT.exists():
            raise LaunchError(f"{WRAPPER_SCRIPT} does not exist: the wrapper daemon is missing from this checkout")
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
        # Signal all first, then wait: stopping N processes costs one timeout, not N.
        for brokers in (False, True):
            processes: list[tuple[FederationNode, subprocess.Popen[bytes]]] = []
            for node in nodes:
                process = node.broker_process if brokers else node.wrapper_process
                if process is not None and process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        process.send_signal(signal.SIGTERM)
                if process is not None:
                    processes.append((node, process))
            deadline = time.monotonic() + STOP_TIMEOUT
            for node, process in processes:
                try:
                    process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                if brokers:
                    node.broker_process = None
                else:
                    node.wrapper_exits.append(process.returncode)
                    node.wrapper_process = None
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
        status = _end(node.wrapper_process, kill)
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
        status = _end(node.broker_process, kill)
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
            if document is None:
                return None
            broker = document.get("daemon", {}).get("broker", {})
            last[0] = f"broker connected={broker.get('connected')}, log lines={broker.get('log_lines')}"
            return document if broker.get("connected") and broker.get("log_lines", 0) > 0 else None

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
        """The same document, through the real command line `python wrapper.py status --node ... --json`."""
        node = self.node(name)
        result = subprocess.run([sys.executable, str(WRAPPER_SCRIPT), "status", "--node", node.address, "--json"],
                                capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
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
        problems = [f"{name}: no status reply" for name, document in documents.items() if document is None]
        if problems:
            return problems
        expected = sorted(self.node(name).address for name in documents)
        cores: dict[str, set[str | None]] = {}
        topic_views: dict[str, dict[str, str | None]] = {}
        subscribed: set[str] = set()
        for name, document in documents.items():
            assert document is not None
            members = sorted(str(member.get("address")) for member in document.get("federation", []))
            if members != expected:
                problems.append(f"{name}: members {members}, expected {expected}")
            cores.setdefault("management", set()).add(document.get("management_core"))
            view: dict[str, str | None] = {}
            for topic in document.get("topics", []):
                view[str(topic["filter"])] = topic.get("core")
                if topic.get("local_subscribers"):
                    subscribed.add(str(topic["filter"]))
            topic_views[name] = view
        if len(cores["management"]) != 1 or None in cores["management"]:
            problems.append(f"management cores differ: {sorted(map(str, cores['management']))}")
        for filter_ in sorted({f for view in topic_views.values() for f in view} | subscribed):
            seen = {view.get(filter_) for view in topic_views.values()}
            if filter_ in subscribed and None in seen:
                problems.append(f"filter {filter_!r} has subscribers but no core at "
                                f"{[n for n, v in topic_views.items() if v.get(filter_) is None]}")
            elif len(seen - {None}) > 1 or (len(seen) > 1 and filter_ in subscribed):
                problems.append(f"filter {filter_!r}: cores differ: "
                                f"{ {n: v.get(filter_) for n, v in topic_views.items()} }")
        return problems

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
        rows: dict[str, dict[str, Any]] = {}
        problems: list[str] = []
        for name, document in documents.items():
            if document is None:
                problems.append(f"{name}: no status reply")
                continue
            row = next((t for t in document.get("topics", []) if t.get("filter") == filter_), None)
            if row is None:
                problems.append(f"{name}: does not know filter {filter_!r}")
            else:
                rows[self.node(name).address] = row
        if problems:
            return problems
        core_ids = {row.get("core") for row in rows.values()}
        if len(core_ids) != 1 or None in core_ids:
            return [f"filter {filter_!r}: cores {sorted(map(str, core_ids))}"]
        for address, row in sorted(rows.items()):
            if not row.get("member") or row.get("own_core"):
                continue
            parents = row.get("parents") or []
            if not parents:
                problems.append(f"{address} is a member of {filter_!r} without parents")
            for parent in parents:
                parent_row = rows.get(parent)
                if parent_row is None or not parent_row.get("member") or address not in (
                        parent_row.get("children") or []):
                    problems.append(f"{address}'s parent {parent} does not list it as a child")
        return problems

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

        A last line still being written is skipped. `types` keeps only those event types.
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
            if isinstance(event, dict) and (wanted is None or event.get("type") in wanted):
                found.append(event)
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
        try:
            template = self.mosquitto_template.read_text(encoding="utf-8")
        except FileNotFoundError:
            template = "\n".join(FALLBACK_CONF_LINES) + "\n"
        node.broker_conf.write_text(render_mosquitto_conf(template, node.host, BROKER_PORT, node.directory,
                                                          os.geteuid() == 0))
        lines = [f"# written by federation.launch for {node.name}"]
        if self.settings:
            lines.append("settings:")
            lines += [f"  {key}: {json.dumps(value)}" for key, value in sorted(self.settings.items())]
        else:
            lines.append("{}")
        node.wrapper_config.write_text("\n".join(lines) + "\n")

    def _spawn_broker(self, node: FederationNode) -> int:
        """Start the broker; returns the size of its log before, to find this start's "running" line."""
        if self._mosquitto is None:
            self._mosquitto = find_mosquitto()
        offset = node.broker_log.stat().st_size if node.broker_log.exists() else 0
        node.broker_process = _spawn([self._mosquitto, "-c", str(node.broker_conf)], node.broker_console)
        return offset

    def _wait_broker(self, node: FederationNode, offset: int, timeout: float) -> None:
        process = node.broker_process
        assert process is not None

        def running() -> bool:
            if process.poll() is not None:
                raise LaunchError(f"mosquitto of {node.name} exited with status {process.returncode} at start "
                                  f"(config {node.broker_conf}):\n{node.diagnostics()}")
            try:
                with open(node.broker_log, "rb") as log:
                    log.seek(offset)
                    return _RUNNING.search(log.read().decode(errors="replace")) is not None
            except FileNotFoundError:
                return False

        poll(running, timeout, lambda: f"mosquitto of {node.name} on {node.host}:{BROKER_PORT} to start:\n"
                                       f"{node.diagnostics()}")

    def _wrapper_command(self, node: FederationNode) -> list[str]:
        neighbours = ",".join(self.node(name).address for name in node.neighbours)
        command = [sys.executable, str(WRAPPER_SCRIPT), "--config", str(node.wrapper_config),
                   "--bind", node.address, "--broker", f"{node.host}:{BROKER_PORT}",
                   "--id", str(self.vids[node.name]), "--name", node.name,
                   "--state-dir", str(node.state_dir), "--event-log", str(node.event_log),
                   "--log-level", self.log_level]
        if neighbours:
            command[2:2] = ["--neighbors", neighbours]
        return command

    def _spawn_wrapper(self, node: FederationNode) -> None:
        node.wrapper_process = _spawn(self._wrapper_command(node), node.wrapper_log)

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
        prog="python -m federation.launch",
        description="Start a local federation of real Mosquitto brokers and wrappers on 127.0.0.x and keep it "
                    "running until Ctrl-C. `python -m federation.demo` does the same with a commentary.")
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
