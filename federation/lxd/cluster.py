"""The containers of one plan, driven with pylxd: create, configure, query, disturb, delete.

Theory of operation: `LxdCluster` is the only place that talks to LXD about
containers. `up` runs in phases so that progress can be shown node by node
and so that configs can name real addresses: create and start every
container, wait for each DHCP address, then push into each the project code
(a small tarball of `federation/` and `wrapper.py`; the image carries only
the dependencies), the rendered broker config, wrapper YAML and systemd
unit, and start the two services; finally wait until every wrapper answers
`status`, sees its broker and, per connected component, agrees on the
federation's members.

Containers are marked with `user.mqtt-federation.*` keys and named
`PREFIX-TOPOLOGY-NODE`; `delete_containers` removes every container with
the prefix *and* the key, so `down` also cleans up what a failed or older
run left, and never touches foreign containers. `boot.autostart` is off, so
a daemon restart never brings them back.

Link faults are nftables rules inside the receiving container
(`plan.render_container_firewall`): the whole table is replaced on every
change, so the rules always equal `blocked`, the state kept here.
"""

from __future__ import annotations

import io
import json
import shlex
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from federation.harness.nodeconfig import REPO_ROOT, WRAPPER_PORT
from federation.harness.processes import LaunchError, poll
from federation.lxd.plan import (
    BROKER_DROPIN,
    BROKER_SERVICE,
    CONTAINER_PYTHON,
    KEY_NODE,
    KEY_SOURCE,
    KEY_TOPOLOGY,
    LOG_DIR,
    MOSQUITTO_CONF,
    PROFILE,
    PROJECT_DIR,
    STATE_DIR,
    WRAPPER_CONFIG,
    WRAPPER_SCRIPT,
    WRAPPER_SERVICE,
    WRAPPER_UNIT,
    Plan,
    expected_members,
    render_broker_conf,
    render_broker_dropin,
    render_container_firewall,
    render_wrapper_unit,
    render_wrapper_yaml,
)

ADDRESS_TIMEOUT = 60.0
READY_TIMEOUT = 60.0
CONVERGE_TIMEOUT = 60.0
STATUS_COMMAND_TIMEOUT = 10
SETUP_DIR = "/tmp/mqtt-federation-setup"
DELETE_WORKERS = 8

Progress = Callable[[str], None]


class ClusterError(Exception):
    """A container could not be created, configured or reached; the message names it and what it saw."""


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str


INSTALLED_WRAPPER_ENTRY = (b"import sys\n\nfrom federation.daemon.cli import main\n\n"
                           b"if __name__ == \"__main__\":\n    sys.exit(main())\n")
"""the containers' wrapper.py when the host runs an installed package, which has no wrapper.py of its own"""


def project_bundle(repo_root: Path = REPO_ROOT) -> bytes:
    """federation/ (without caches) and wrapper.py as a gzipped tarball, what runs in every container."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as bundle:
        for path in sorted((repo_root / "federation").rglob("*")):
            if "__pycache__" in path.parts or path.suffix == ".pyc" or not path.is_file():
                continue
            bundle.add(path, arcname=str(path.relative_to(repo_root)), recursive=False)
        if (repo_root / "wrapper.py").is_file():
            bundle.add(repo_root / "wrapper.py", arcname="wrapper.py")
        else:
            entry = tarfile.TarInfo("wrapper.py")
            entry.size, entry.mode, entry.mtime = len(INSTALLED_WRAPPER_ENTRY), 0o644, int(time.time())
            bundle.addfile(entry, io.BytesIO(INSTALLED_WRAPPER_ENTRY))
    return buffer.getvalue()


def ours(client: Any, prefix: str, topology: str | None = None) -> list[Any]:
    """Instances whose name starts with `prefix` and that carry our topology key (equal to `topology` if
    given: topology `a` must not take `a-b`'s containers), sorted by name."""
    found = []
    for instance in client.instances.all():
        marked = (instance.config or {}).get(KEY_TOPOLOGY)
        if instance.name.startswith(prefix) and marked is not None and topology in (None, marked):
            found.append(instance)
    return sorted(found, key=lambda instance: instance.name)


def delete_containers(client: Any, prefix: str, progress: Progress, topology: str | None = None) -> list[str]:
    """Stop (forced) and delete every container of ours with the prefix, in parallel; the names deleted.

    Deleting a dir-backed container removes its whole root file system, which
    takes seconds on a busy disk, so LXD is asked to do them all at once.
    Keeps going after a failure and raises ClusterError at the end, naming
    what is left.
    """
    instances = ours(client, prefix, topology)
    deleted: list[str] = []
    failures: list[str] = []
    begun = time.monotonic()

    def remove(instance: Any) -> str:
        if instance.status != "Stopped":
            instance.stop(force=True, wait=True)
        instance.delete(wait=True)
        return str(instance.name)

    with ThreadPoolExecutor(max_workers=DELETE_WORKERS) as pool:
        futures = {pool.submit(remove, instance): instance.name for instance in instances}
        for future in as_completed(futures):
            try:
                deleted.append(future.result())
            except Exception as error:  # noqa: BLE001 - report every container that could not be removed
                failures.append(f"{futures[future]}: {error}")
                continue
            progress(f"[{len(deleted)}/{len(instances)}] {deleted[-1]} deleted ({time.monotonic() - begun:.1f} s)")
    if failures:
        raise ClusterError("could not delete: " + "; ".join(sorted(failures)) +
                           " (retry `down`, or `lxc delete --force NAME`)")
    return sorted(deleted)


def convergence_problems(documents: Mapping[str, dict[str, Any] | None],
                         expected: Mapping[str, Iterable[str]]) -> list[str]:
    """Why nodes have not converged (empty when they have).

    `documents`: node -> its status document (None: no answer); `expected`:
    node -> the wrapper addresses its federation table must hold. Nodes with
    the same expected members must agree on the management core.
    """
    problems: list[str] = []
    cores: dict[tuple[str, ...], dict[str, Any]] = {}
    for name in sorted(documents):
        document = documents[name]
        if document is None:
            problems.append(f"{name}: no status answer")
            continue
        want = tuple(sorted(expected[name]))
        members = tuple(sorted(str(member.get("address")) for member in document.get("federation", [])))
        if members != want:
            problems.append(f"{name}: members {list(members)}, expected {list(want)}")
        cores.setdefault(want, {})[name] = document.get("management_core")
    for group in cores.values():
        if len(set(group.values())) > 1 or None in group.values():
            problems.append(f"management cores differ: {dict(sorted(group.items()))}")
    return problems


class LxdCluster:
    """The containers of `plan` in the LXD that `client` talks to."""

    def __init__(self, client: Any, plan: Plan, *, profile: str = PROFILE,
                 progress: Progress = lambda message: None) -> None:
        self.client = client
        self.plan = plan
        self.profile = profile
        self.progress = progress
        self.addresses: dict[str, str] = {}
        self.blocked: dict[str, dict[str, float]] = {node.name: {} for node in plan.nodes}
        """receiving node -> sending node -> percent of its packets dropped"""
        self._instances: dict[str, Any] = {}

    # ------------------------------------------------------------ bring-up

    def existing(self) -> list[str]:
        return [instance.name for instance in ours(self.client, self.plan.container_prefix, self.plan.topology)]

    def delete(self) -> list[str]:
        """Delete this plan's containers (also those an earlier run of the same topology left)."""
        return delete_containers(self.client, self.plan.container_prefix, self.progress, self.plan.topology)

    def up(self, *, broker_template: str, log_level: str = "INFO", converge: bool = True) -> None:
        """Create, start and configure every container, then wait until the federation works."""
        self.create()
        self.wait_addresses()
        self.configure(broker_template=broker_template, log_level=log_level)
        self.wait_ready()
        if converge:
            self.wait_converged()

    def create(self) -> None:
        left = self.existing()
        if left:
            raise ClusterError(f"containers of topology {self.plan.topology!r} already exist ({', '.join(left)}); "
                               f"run `python lxc/provision.py down {self.plan.source}` first, or `up --replace`")
        total = len(self.plan.nodes)
        for node in self.plan.nodes:
            started = time.monotonic()
            config = {
                "name": node.container,
                "source": {"type": "image", "alias": self.plan.image_alias},
                "profiles": [self.profile],
                "config": {KEY_TOPOLOGY: self.plan.topology, KEY_NODE: node.name, KEY_SOURCE: self.plan.source,
                           "boot.autostart": "false"},
            }
            try:
                instance = self.client.instances.create(config, wait=True)
                instance.start(wait=True)
            except Exception as error:  # noqa: BLE001 - pylxd raises LXDAPIException with LXD's message
                raise ClusterError(f"[{node.index + 1}/{total}] {node.name}: cannot create or start container "
                                   f"{node.container} from image {self.plan.image_alias}: {error}") from error
            self._instances[node.name] = instance
            self.progress(f"[{node.index + 1}/{total}] {node.name}: container {node.container} created and started "
                          f"({time.monotonic() - started:.1f} s)")

    def wait_addresses(self, timeout: float = ADDRESS_TIMEOUT) -> dict[str, str]:
        """Each container's IPv4 address on eth0 (from DHCP)."""
        for node in self.plan.nodes:
            started = time.monotonic()
            self.addresses[node.name] = self._wait_address(node.name, timeout)
            self.progress(f"[{node.index + 1}/{len(self.plan.nodes)}] {node.name}: address "
                          f"{self.addresses[node.name]} ({time.monotonic() - started:.1f} s)")
        return dict(self.addresses)

    def load_addresses(self) -> dict[str, str]:
        """Addresses of already running containers (for `status` and a backend attaching to them)."""
        for node in self.plan.nodes:
            address = self._ipv4(node.name)
            if address:
                self.addresses[node.name] = address
        return dict(self.addresses)

    def configure(self, *, broker_template: str, log_level: str = "INFO") -> None:
        """Push code and configs into each container and start its broker and wrapper."""
        self.install(broker_template=broker_template, log_level=log_level, start=True)

    def install(self, *, broker_template: str, log_level: str = "INFO", start: bool) -> None:
        """Push code and configs into each container; with `start`, (re)start the broker and the wrapper,
        else leave both stopped (the scenario backend starts them when its driver says so)."""
        bundle = project_bundle()
        files = {"mosquitto.conf": render_broker_conf(broker_template).encode(),
                 "broker-dropin.conf": render_broker_dropin().encode(),
                 "wrapper.service": render_wrapper_unit().encode()}
        services = ([f"systemctl restart {BROKER_SERVICE}", f"systemctl enable --now {WRAPPER_SERVICE}"] if start
                    else [f"systemctl stop {BROKER_SERVICE}"])
        total = len(self.plan.nodes)
        for node in self.plan.nodes:
            started = time.monotonic()
            neighbours = [self.addresses[name] for name in node.neighbours]
            wrapper_yaml = render_wrapper_yaml(node, self.addresses[node.name], neighbours, log_level=log_level)
            self.exec(node.name, ["mkdir", "-p", SETUP_DIR])
            for name, data in (("project.tar.gz", bundle), *files.items(), ("wrapper.yaml", wrapper_yaml.encode())):
                self.push(node.name, f"{SETUP_DIR}/{name}", data)
            script = " && ".join([
                f"rm -rf {PROJECT_DIR}",
                f"mkdir -p {PROJECT_DIR} {Path(WRAPPER_CONFIG).parent} {LOG_DIR} {STATE_DIR} "
                f"{Path(BROKER_DROPIN).parent}",
                f"tar -xzf {SETUP_DIR}/project.tar.gz -C {PROJECT_DIR}",
                f"install -m 644 {SETUP_DIR}/mosquitto.conf {MOSQUITTO_CONF}",
                f"install -m 644 {SETUP_DIR}/broker-dropin.conf {BROKER_DROPIN}",
                f"install -m 644 {SETUP_DIR}/wrapper.yaml {WRAPPER_CONFIG}",
                f"install -m 644 {SETUP_DIR}/wrapper.service {WRAPPER_UNIT}",
                f"rm -rf {SETUP_DIR}", "systemctl daemon-reload", *services,
            ])
            self.exec(node.name, ["sh", "-c", script])
            if node.index == 0:
                self.check_imports(node.name)
            done = "services started" if start else "services stopped"
            self.progress(f"[{node.index + 1}/{total}] {node.name}: code, broker config and wrapper config pushed, "
                          f"{done} ({time.monotonic() - started:.1f} s)")

    def check_imports(self, name: str) -> None:
        """ClusterError naming the missing module if the pushed code cannot import in the image."""
        command = f"cd {PROJECT_DIR} && {CONTAINER_PYTHON} -c 'import federation.daemon.cli'"
        result = self.exec(name, ["sh", "-c", command], check=False)
        if result.exit_code != 0:
            missing = result.stderr.strip().splitlines()[-1:] or ["(no message)"]
            raise ClusterError(f"{name}: the wrapper cannot start in image {self.plan.image_alias}: {missing[0]}. "
                               f"The image holds setup.cfg's install_requires: a module the code imports must be "
                               f"listed there (the image is rebuilt when that list changes)")

    def wait_ready(self, timeout: float = READY_TIMEOUT, names: Iterable[str] | None = None) -> None:
        """Every (named) wrapper answers status, is connected to its broker and receives the broker's log."""
        for name in (list(names) if names is not None else self.plan.node_names()):
            started = time.monotonic()
            self.wait_wrapper_ready(name, timeout)
            self.progress(f"[{self.plan.node(name).index + 1}/{len(self.plan.nodes)}] {name}: wrapper ready "
                          f"({time.monotonic() - started:.1f} s)")

    def wait_wrapper_ready(self, name: str, timeout: float = READY_TIMEOUT) -> None:
        seen = ["no answer yet"]

        def ready() -> bool:
            document = self.status(name)
            if document is None:
                return False
            broker = document.get("daemon", {}).get("broker", {})
            seen[0] = f"broker connected={broker.get('connected')}, log lines={broker.get('log_lines')}"
            return bool(broker.get("connected") and broker.get("log_lines", 0) > 0)

        self._poll(ready, timeout,
                   lambda: f"the wrapper of {name} to be ready ({seen[0]})\n{self.diagnostics(name)}")

    def wait_converged(self, timeout: float = CONVERGE_TIMEOUT, names: Iterable[str] | None = None) -> None:
        chosen = sorted(names) if names is not None else self.plan.node_names()
        members = expected_members(self.plan)
        expected = {name: [self.wrapper_address(member) for member in members[name] if member in chosen]
                    for name in chosen}
        last: list[list[str]] = [[]]

        def converged() -> bool:
            last[0] = convergence_problems({name: self.status(name) for name in chosen}, expected)
            return not last[0]

        started = time.monotonic()
        self._poll(converged, timeout, lambda: "convergence: " + "; ".join(last[0]))
        self.progress(f"federation converged: every wrapper knows its members and agrees on the management core "
                      f"({time.monotonic() - started:.1f} s)")

    # ------------------------------------------------------------ one container

    def instance(self, name: str) -> Any:
        node = self.plan.node(name)
        if name not in self._instances:
            try:
                self._instances[name] = self.client.instances.get(node.container)
            except Exception as error:  # noqa: BLE001 - NotFound and connection errors alike
                raise ClusterError(f"container {node.container} of node {name} is not there ({error}); "
                                   f"run `python lxc/provision.py up {self.plan.source}`") from error
        return self._instances[name]

    def wrapper_address(self, name: str) -> str:
        return f"{self.addresses[name]}:{WRAPPER_PORT}"

    def exec(self, name: str, command: list[str], *, stdin: str | bytes | None = None,
             check: bool = True) -> ExecResult:
        """Run a command in the node's container and wait for it; ClusterError if it fails and `check`."""
        install_excepthook()
        result = self.instance(name).execute(command, stdin_payload=stdin)
        outcome = ExecResult(int(result.exit_code), str(result.stdout or ""), str(result.stderr or ""))
        if check and outcome.exit_code != 0:
            raise ClusterError(f"{name}: `{' '.join(command)}` exited with {outcome.exit_code}: "
                               f"{(outcome.stderr or outcome.stdout).strip()[-1500:]}")
        return outcome

    def spawn(self, name: str, command: list[str], output: str) -> None:
        """Start a long-running command in the background in the container, output to the file `output`."""
        quoted = " ".join(_shell_quote(word) for word in command)
        self.exec(name, ["setsid", "-f", "sh", "-c", f"exec {quoted} >{_shell_quote(output)} 2>&1 </dev/null"])

    def push(self, name: str, path: str, data: bytes, mode: int = 0o644) -> None:
        self.instance(name).files.put(path, data, mode=mode)

    def fetch(self, name: str, path: str) -> bytes:
        data = self.instance(name).files.get(path)
        return bytes(data)

    def status(self, name: str) -> dict[str, Any] | None:
        """The wrapper's status document (`wrapper.py status --json` inside the container); None if no answer."""
        if name not in self.addresses:
            return None
        result = self.exec(name, ["timeout", str(STATUS_COMMAND_TIMEOUT), CONTAINER_PYTHON, WRAPPER_SCRIPT,
                                  "status", "--node", self.wrapper_address(name), "--json"], check=False)
        if result.exit_code not in (0, 1):  # 1: answered, not ready
            return None
        try:
            document: dict[str, Any] = json.loads(result.stdout)
        except ValueError:
            return None
        return document

    def diagnostics(self, name: str) -> str:
        result = self.exec(name, ["sh", "-c", f"systemctl --no-pager status {WRAPPER_SERVICE} {BROKER_SERVICE} "
                                              f"| tail -n 20; tail -n 15 /var/log/mqtt-federation/wrapper.log"],
                           check=False)
        return f"--- {name} ({self.plan.node(name).container}):\n{result.stdout.strip()}"

    # ------------------------------------------------------------ services

    def stop_wrapper(self, name: str, *, kill: bool = False) -> None:
        """SIGTERM (the node leaves cleanly) or SIGKILL (a crash) to the wrapper."""
        if kill:
            self.exec(name, ["systemctl", "kill", "--signal=SIGKILL", WRAPPER_SERVICE])
            self.exec(name, ["systemctl", "stop", WRAPPER_SERVICE], check=False)
        else:
            self.exec(name, ["systemctl", "stop", WRAPPER_SERVICE])

    def start_wrapper(self, name: str) -> None:
        self.exec(name, ["systemctl", "start", WRAPPER_SERVICE])

    def restart_broker(self, name: str) -> None:
        self.exec(name, ["systemctl", "restart", BROKER_SERVICE])

    # ------------------------------------------------------------ link faults

    def set_loss(self, sender: str, receiver: str, percent: float) -> None:
        """Drop `percent` of what `sender` sends to `receiver` (100: cut, 0: healed), at the receiver."""
        self.plan.node(sender)
        if percent > 0:
            self.blocked[receiver][sender] = percent
        else:
            self.blocked[receiver].pop(sender, None)
        self.apply_firewall(receiver)

    def set_inbound(self, receiver: str, percents: Mapping[str, float]) -> None:
        """Replace every rule at `receiver`: sending node -> percent of its packets dropped (100: cut)."""
        for sender in percents:
            self.plan.node(sender)
        self.blocked[receiver] = {sender: percent for sender, percent in percents.items() if percent > 0}
        self.apply_firewall(receiver)

    def cut(self, a: str, b: str, *, oneway: bool = False) -> None:
        """Cut the link a-b (only a -> b if `oneway`)."""
        self._check_link(a, b)
        self.set_loss(a, b, 100.0)
        if not oneway:
            self.set_loss(b, a, 100.0)

    def heal(self, a: str, b: str) -> None:
        self._check_link(a, b)
        self.set_loss(a, b, 0.0)
        self.set_loss(b, a, 0.0)

    def apply_firewall(self, name: str) -> None:
        blocked = {self.addresses[sender]: percent for sender, percent in self.blocked[name].items()}
        self.exec(name, ["nft", "-f", "-"], stdin=render_container_firewall(blocked))

    def _check_link(self, a: str, b: str) -> None:
        if b not in self.plan.node(a).neighbours:
            links = ", ".join(f"{x}-{y}" for x, y in self.plan.links) or "none"
            raise ClusterError(f"{a} and {b} are not linked; links are: {links}")

    # ------------------------------------------------------------ helpers

    def _ipv4(self, name: str) -> str | None:
        network = self.instance(name).state().network or {}
        for entry in network.get("eth0", {}).get("addresses", []):
            if entry.get("family") == "inet" and entry.get("scope") == "global":
                return str(entry["address"])
        return None

    def _wait_address(self, name: str, timeout: float) -> str:
        container = self.plan.node(name).container
        try:
            return poll(lambda: self._ipv4(name), timeout, f"an IPv4 address on eth0 of {container} (DHCP from the "
                        f"bridge; see `lxc exec {container} -- ip addr`)", interval=0.2)
        except LaunchError as error:
            raise ClusterError(str(error)) from None

    def _poll(self, predicate: Callable[[], bool], timeout: float, message: Callable[[], str]) -> None:
        try:
            poll(predicate, timeout, message, interval=0.5)
        except LaunchError as error:
            raise ClusterError(str(error)) from None


def _shell_quote(word: str) -> str:
    return shlex.quote(word)


_previous_excepthook = threading.excepthook


def _quiet_websocket_race(arguments: threading.ExceptHookArgs) -> None:
    """Hide one known harmless race of pylxd's exec: ws4py's manager thread polls an epoll object
    that `execute` has just closed (ValueError in thread WebSocketManager) after the command ended."""
    thread = arguments.thread
    if (arguments.exc_type is ValueError and thread is not None and thread.name == "WebSocketManager"
            and "closed epoll" in str(arguments.exc_value)):
        return
    _previous_excepthook(arguments)


def install_excepthook() -> None:
    """Idempotent; called before the first exec."""
    global _previous_excepthook
    if threading.excepthook is not _quiet_websocket_race:
        _previous_excepthook = threading.excepthook
        threading.excepthook = _quiet_websocket_race
