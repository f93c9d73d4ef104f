"""The LXD backend of the scenario runner: every scenario node is a container with its broker and wrapper.

    python -m federation.scenario run FILE --backend lxd --report OUT.json --events DIR

Theory of operation: the backend-neutral work (timeline, ground truth,
convergence, report) is `federation.harness.driver`; this module is the
`Platform` it drives, built from the provisioning code (`federation.lxd`):
the same host set-up (LXD daemon, bridge, forwarding rule), the same cached
image, the same container configuration (`LxdCluster.install`) as
`lxc/provision.py up`, with the services left stopped so that the driver
starts brokers and wrappers when it wants to.

- Containers are named `mqf-run<token>-<scenario>-<node>`, a fresh token per
  run, so a run never touches a topology made by `lxc/provision.py` (and
  `provision.py down --all` removes the containers of a crashed run).
- Brokers and wrappers are the systemd services of the container
  (`mosquitto.service` with `Restart=no`, `federation-wrapper.service`): a
  kill is `systemctl kill --signal=SIGKILL`, a clean stop `systemctl stop`.
- Clients are `lxc exec -T CONTAINER -- mosquitto_sub|pub ...` processes on
  this machine (children of this process that die with it); `lxc exec`
  forwards SIGTERM and stdin's end of file, which is how the driver stops
  them.
- Status: the wrapper answers only requests from its own host, and the
  driver's status poller must not spawn processes, so every container gets an
  LXD proxy device that relays UDP from 127.0.0.1:PORT on this machine to the
  wrapper's port inside the container (the relay's packets leave from the
  container's own address). A round of status queries is one datagram per
  node and a `select` for the replies, as in the netns backend.
- Link faults are nftables rules on the host's bridge (table
  `bridge mqf_run_<token>`, a chain per receiving container, rewritten in one
  local `nft` call per change). Rules inside the containers (as
  `LxdCluster.cut` does) cost an exec per change, 0.2-0.5 s on a busy
  machine: a cut of three links then took 1.5 s to apply, which moved the
  ground truth's convergence bound and so the expected deliveries away from
  the simulator's.

`destroy` deletes the run's containers and, if this run started the LXD
daemon, stops it again (environment.md: shut it down when tests end).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from federation.daemon.status import STATUS_MAGIC, StatusError, decode_reply
from federation.harness.driver import run_on_platform
from federation.harness.nodeconfig import REPO_ROOT, WRAPPER_PORT, mosquitto_template
from federation.harness.platform import (
    InboundFilter,
    NodePlan,
    Platform,
    PlatformError,
    PlatformUnavailable,
    StatusDocument,
)
from federation.harness.processes import end_all, find_tool, spawn
from federation.lxd import host
from federation.lxd.cluster import ClusterError, LxdCluster, delete_containers
from federation.lxd.image import ImageError, default_recipe, ensure_image, image_exists
from federation.lxd.plan import (
    BROKER_LOG,
    BROKER_SERVICE,
    DEFAULT_PREFIX,
    EVENT_LOG,
    MOSQUITTO_CONF,
    WRAPPER_CONFIG,
    WRAPPER_LOG,
    WRAPPER_SERVICE,
    Plan,
    PlanError,
    capacity_problems,
    estimate_needs,
    make_plan,
    render_bridge_faults,
    render_bridge_inbound,
    sanitize,
)
from federation.scenario.model import Scenario

STATUS_DEVICE = "fedstatus"
"""name of the proxy device that relays status queries into a container"""
SCENARIO_NAME_CHARS = 20
"""the scenario's name is cut to this in container names (they must stay under 63 characters)"""
FAULT_TABLE_PREFIX = "mqf_run_"
"""host nftables tables (bridge family) of the runs' link faults: mqf_run_<token>"""
RUNNING_CACHE_SECONDS = 0.5
"""how long `wrapper_running` trusts its last answer (each answer is an exec into the container)"""


def _stderr_progress(message: str) -> None:
    print(f"lxd: {message}", file=sys.stderr, flush=True)


class LxdPlatform(Platform):
    """See the module docstring; `federation.harness.platform` documents the interface."""

    backend = "lxd"

    def __init__(self, scenario: Scenario, *, prefix: str = DEFAULT_PREFIX,
                 progress: Any = _stderr_progress) -> None:
        self.scenario = scenario
        self.prefix = prefix
        token = secrets.token_hex(2)
        self.topology = f"run{token}-{sanitize(scenario.name)[:SCENARIO_NAME_CHARS].strip('-')}"
        self.fault_table = f"{FAULT_TABLE_PREFIX}{token}"
        self.fault_table_made = False
        self.progress = progress
        self.plan: Plan | None = None
        self.client: Any = None
        self.cluster: LxdCluster | None = None
        self.started_daemon = False
        self.processes: list[subprocess.Popen[bytes]] = []
        self.status_sockets: dict[str, socket.socket] = {}
        self.relay_ports: dict[str, int] = {}
        self.status_lock = threading.Lock()
        self.running_cache: dict[str, tuple[float, bool]] = {}
        self.workdir = Path(tempfile.gettempdir()) / "mqf-lxd-unused"
        self._workdir_made = False
        self.destroyed = False

    # ------------------------------------------------------------ before anything exists

    def _make_plan(self, plans: Sequence[NodePlan]) -> Plan:
        try:
            return make_plan(self.scenario, image_alias=default_recipe(REPO_ROOT).alias, prefix=self.prefix,
                             topology=self.topology, vids={plan.name: plan.vid for plan in plans})
        except PlanError as error:
            raise PlatformUnavailable(str(error)) from error

    def preflight(self, plans: Sequence[NodePlan], links: Sequence[tuple[str, str]]) -> None:
        if os.geteuid() != 0:
            raise PlatformUnavailable("the lxd backend needs root (it installs and starts LXD and makes "
                                      "containers): run it as root, or use --backend sim or netns")
        self.plan = self._make_plan(plans)
        client = None
        if host.daemon_answers():
            with contextlib.suppress(ImportError):
                import pylxd

                client = pylxd.Client()
        cached = client is not None and image_exists(client, self.plan.image_alias)
        running = 0 if client is None else sum(1 for item in client.instances.all() if item.status == "Running")
        problems = capacity_problems(estimate_needs(self.plan, image_cached=cached, running_containers=running),
                                     host.measure_machine(running))
        if problems:
            raise PlatformUnavailable(f"{self.scenario.source}: the scenario does not fit on this machine as LXD "
                                      f"containers:\n  " + "\n  ".join(problems))

    # ------------------------------------------------------------ making the nodes

    def create(self, plans: Sequence[NodePlan], links: Sequence[tuple[str, str]]) -> None:
        plan = self.plan or self._make_plan(plans)
        self.plan = plan
        self.workdir = Path(tempfile.mkdtemp(prefix=f"mqf-lxd-{self.topology}-"))
        self._workdir_made = True
        try:
            self.started_daemon = not host.daemon_answers()
            self.client = host.prepare_host(self.progress)
            ensure_image(self.client, default_recipe(REPO_ROOT), host.CACHE_DIR, progress=self.progress)
            for line in plan.describe():
                self.progress(line)
            self.cluster = LxdCluster(self.client, plan, progress=self.progress)
            self.cluster.create()
            self.cluster.wait_addresses()
            self.cluster.install(broker_template=mosquitto_template(), start=False)
            self._nft(render_bridge_faults(self.fault_table, {_chain(node.index): self.cluster.addresses[node.name]
                                                              for node in plan.nodes}))
            self.fault_table_made = True
            for node in plan.nodes:
                self._add_status_relay(node.name)
        except (ClusterError, ImageError, host.HostError) as error:
            raise PlatformError(str(error)) from error

    def _add_status_relay(self, name: str) -> None:
        assert self.cluster is not None
        instance = self.cluster.instance(name)
        for _attempt in range(5):
            port = _free_udp_port()
            instance.devices[STATUS_DEVICE] = {"type": "proxy", "listen": f"udp:127.0.0.1:{port}",
                                               "connect": f"udp:{self.cluster.addresses[name]}:{WRAPPER_PORT}"}
            try:
                instance.save(wait=True)
            except Exception:  # noqa: BLE001 - the port was taken meanwhile: try another
                instance.devices.pop(STATUS_DEVICE, None)
                continue
            self.relay_ports[name] = port
            self._renew_socket(name)
            return
        raise PlatformError(f"{name}: could not add the status relay (LXD proxy device) to its container")

    def _renew_socket(self, name: str) -> None:
        """A new host-side socket (a new source port) for the node's status relay.

        LXD's UDP relay gives up on a client whose first datagram met a closed
        port (the wrapper not started yet, or killed): later datagrams from that
        source port are never relayed. So a node that did not answer a round is
        asked from a new port the next time.
        """
        old = self.status_sockets.pop(name, None)
        if old is not None:
            old.close()
        channel = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        channel.connect(("127.0.0.1", self.relay_ports[name]))
        channel.setblocking(False)
        self.status_sockets[name] = channel

    def address(self, name: str) -> str:
        return self._cluster().addresses[self._known(name)]

    def _cluster(self) -> LxdCluster:
        if self.cluster is None:
            raise PlatformError("the lxd platform has no containers yet (create was not called or failed)")
        return self.cluster

    def _known(self, name: str) -> str:
        if self.plan is None or name not in self.plan.node_names():
            names = ", ".join(self.plan.node_names()) if self.plan else "none"
            raise PlatformError(f"no node named {name!r}; nodes are {names}")
        return name

    def _exec(self, name: str, command: list[str], check: bool = True) -> str:
        try:
            return self._cluster().exec(self._known(name), command, check=check).stdout
        except ClusterError as error:
            raise PlatformError(f"{error}\n{self.wrapper_diagnostics(name)}") from None

    # ------------------------------------------------------------ services

    def start_broker(self, name: str) -> None:
        self._exec(name, ["systemctl", "start", BROKER_SERVICE])  # Type=notify: returns once it listens

    def stop_broker(self, name: str, kill: bool = False) -> None:
        self._stop_service(name, BROKER_SERVICE, kill)

    def start_wrapper(self, name: str) -> None:
        self.running_cache.pop(name, None)
        self._exec(name, ["systemctl", "start", WRAPPER_SERVICE])

    def stop_wrapper(self, name: str, kill: bool = False) -> int | None:
        self.running_cache.pop(name, None)
        return self._stop_service(name, WRAPPER_SERVICE, kill)

    def _stop_service(self, name: str, service: str, kill: bool) -> int | None:
        """Stop a unit (SIGTERM via `systemctl stop`, or SIGKILL); the main process's exit status, like
        Popen's (negative: killed by that signal), None if it was not running."""
        stop = f"systemctl kill --signal=SIGKILL {service}" if kill else f"systemctl stop {service}"
        script = (f"systemctl is-active --quiet {service} || {{ echo not-running; exit 0; }}; {stop}; "
                  f"for i in $(seq 100); do systemctl is-active --quiet {service} || break; sleep 0.1; done; "
                  f"systemctl show -p ExecMainCode -p ExecMainStatus {service}")
        output = self._exec(name, ["sh", "-c", script])
        if "not-running" in output:
            return None
        values = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
        try:
            code, status = int(values.get("ExecMainCode", "1")), int(values.get("ExecMainStatus", "0"))
        except ValueError:
            return None
        return status if code == 1 else -status  # CLD_EXITED: an exit status; CLD_KILLED/DUMPED: a signal

    def wrapper_running(self, name: str) -> bool:
        cached = self.running_cache.get(name)
        if cached is not None and time.monotonic() - cached[0] < RUNNING_CACHE_SECONDS:
            return cached[1]
        result = self._cluster().exec(self._known(name), ["systemctl", "is-active", "--quiet", WRAPPER_SERVICE],
                                      check=False)
        running = result.exit_code == 0
        self.running_cache[name] = (time.monotonic(), running)
        return running

    def wrapper_diagnostics(self, name: str) -> str:
        try:
            return self._cluster().diagnostics(name)
        except Exception as error:  # noqa: BLE001 - diagnostics must never hide the original error
            return f"--- {name}: no diagnostics ({error})"

    def start_client(self, name: str, argv: Sequence[str], output: Path,
                     stdin: bool = False) -> subprocess.Popen[bytes]:
        container = self._cluster().plan.node(self._known(name)).container
        lxc = find_tool("lxc")
        if lxc is None:
            raise PlatformError("the lxc command is missing: apt-get install -y lxd-client")
        process = spawn([lxc, "exec", "-T", container, "--", *argv], output, stdin_pipe=stdin)
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        cluster = self._cluster()
        for service in (WRAPPER_SERVICE, BROKER_SERVICE):
            _parallel(lambda name, unit=service: cluster.exec(name, ["systemctl", "stop", unit], check=False),
                      cluster.plan.node_names())
        self.running_cache.clear()

    # ------------------------------------------------------------ status

    def statuses(self, names: Sequence[str], timeout: float) -> dict[str, StatusDocument | None]:
        """One status datagram to every named wrapper (through its relay), then the replies until `timeout`."""
        with self.status_lock:
            results: dict[str, StatusDocument | None] = {name: None for name in names}
            waiting: dict[int, tuple[str, socket.socket]] = {}
            for name in names:
                channel = self.status_sockets.get(name)
                if channel is None:
                    continue
                _drain(channel)
                try:
                    channel.send(STATUS_MAGIC)
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
                    name, channel = waiting.pop(descriptor)
                    try:
                        data = channel.recv(65536)
                    except OSError:
                        continue
                    with contextlib.suppress(StatusError):
                        results[name] = decode_reply(data)
            for name, document in results.items():
                if document is None and name in self.relay_ports:
                    self._renew_socket(name)
            return results

    # ------------------------------------------------------------ faults

    def set_inbound(self, name: str, filters: Mapping[str, InboundFilter]) -> None:
        cluster = self._cluster()
        blocked = {cluster.addresses[self._known(peer)]: (100.0 if chosen.cut else chosen.loss)
                   for peer, chosen in filters.items() if chosen.active}
        self._nft(render_bridge_inbound(self.fault_table, _chain(cluster.plan.node(self._known(name)).index),
                                        blocked))

    def _nft(self, script: str) -> None:
        nft = find_tool("nft")
        if nft is None:
            raise PlatformError("the nft command is missing: apt-get install -y nftables")
        result = subprocess.run([nft, "-f", "-"], input=script, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise PlatformError(f"nft refused the fault rules ({result.stderr.strip()}):\n{script}")

    # ------------------------------------------------------------ the end

    def collect(self, name: str, dest: Path) -> Path:
        dest.mkdir(parents=True, exist_ok=True)
        cluster = self._cluster()
        for remote, local in ((EVENT_LOG, "events.jsonl"), (WRAPPER_LOG, "wrapper.log"), (BROKER_LOG, "broker.log"),
                              (MOSQUITTO_CONF, "mosquitto.conf"), (WRAPPER_CONFIG, "wrapper.yaml")):
            with contextlib.suppress(Exception):  # a file that does not exist (a node that never started)
                (dest / local).write_bytes(cluster.fetch(self._known(name), remote))
        return dest / "events.jsonl"

    def destroy(self) -> None:
        if self.destroyed:
            return
        self.destroyed = True
        with contextlib.suppress(Exception):
            end_all(self.processes, timeout=3.0)
        for channel in self.status_sockets.values():
            channel.close()
        self.status_sockets.clear()
        if self.fault_table_made:
            subprocess.run(["nft", "delete", "table", "bridge", self.fault_table], capture_output=True, check=False)
        if self.client is not None and self.plan is not None:
            try:
                delete_containers(self.client, self.plan.container_prefix, self.progress, self.plan.topology)
            except Exception as error:  # noqa: BLE001 - never raises; say what is left
                self.progress(f"cleanup: {error}")
            if self.started_daemon:
                with contextlib.suppress(Exception):
                    if not self.client.instances.all():
                        host.stop_daemon(self.progress)
        if self._workdir_made:
            shutil.rmtree(self.workdir, ignore_errors=True)


def run_scenario(scenario: Scenario, *, seed: int, events_path: str | None = None) -> dict[str, Any]:
    """Run `scenario` on LXD containers; the report dict (same schema as the simulator's).

    `seed` draws the ids of nodes without an `id`; `events_path` is a
    directory (run.jsonl, nodes/<name>/, clients/). Raises ScenarioError (CLI
    exit 2) for a bad scenario and when the run cannot happen here (not root,
    too large for the machine), before anything is created.
    """
    return run_on_platform(scenario, LxdPlatform(scenario), seed=seed, events_path=events_path)


def _chain(index: int) -> str:
    return f"in_{index}"


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _drain(channel: socket.socket) -> None:
    """Throw away late replies to an earlier query that timed out."""
    for _ in range(1000):
        try:
            channel.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            continue


def _parallel(action: Any, names: Sequence[str]) -> None:
    threads = [threading.Thread(target=action, args=(name,), name=f"lxd-{name}") for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
