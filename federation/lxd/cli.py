"""Command line of LXD provisioning: `python lxc/provision.py up|status|down FILE`.

    up FILE      build the topology: one container per node, Mosquitto + wrapper in each, federated
    status FILE  each node's container, address and wrapper status
    down FILE    delete the topology's containers (and stop the LXD daemon if `up` started it)

Theory of operation: the file is the scenario/topology YAML that the
simulator reads (`federation.scenario.loader`), so a scenario can be brought
up on containers as written. Everything checkable without a machine is
checked first (the file, the container names, memory/disk/container count),
and exits with status 2 and one message before anything is installed or
created; `up --dry-run` stops there and prints the plan. Then `up` prepares
the host (packages, daemon, image) unless an existing LXD is named with
`--endpoint`, creates the containers and waits until the federation has
converged, printing progress node by node on stderr. A failed `up` deletes
what it created unless `--keep-on-failure`.

Exit status: 0 done; 1 an LXD or container step failed; 2 bad arguments,
bad file, or a topology the machine cannot hold.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from federation.cli_version import add_version_option
from federation.harness.nodeconfig import MOSQUITTO_CONF_TEMPLATE, REPO_ROOT
from federation.lxd import host
from federation.lxd.cluster import ClusterError, LxdCluster, delete_containers, ours
from federation.lxd.image import DEFAULT_MIRROR, ImageError, default_recipe, ensure_image, image_exists
from federation.lxd.plan import (
    DEFAULT_PREFIX,
    PROFILE,
    Plan,
    PlanError,
    capacity_problems,
    estimate_needs,
    make_plan,
)
from federation.scenario.loader import ScenarioError, load_scenario

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
PROG = "federation-provision"


class UsageError(Exception):
    """Bad arguments, a bad file or a topology too large: exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}\n{self.format_usage().rstrip()}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Build, inspect and remove a federation of LXD containers described "
                                            "by a scenario/topology file (configs/topologies/*.yaml; in a "
                                            "checkout also `python lxc/provision.py`).")
    add_version_option(parser, PROG)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--prefix", default=DEFAULT_PREFIX,
                         help=f"container name prefix: PREFIX-TOPOLOGY-NODE (default {DEFAULT_PREFIX})")
        sub.add_argument("--endpoint", metavar="SOCKET|URL",
                         help="use this existing LXD (unix socket path or https URL) and set nothing up on the host "
                              "(default: the local LXD, started and initialised if needed)")

    up = commands.add_parser("up", help="create and start the topology's containers, federated")
    up.add_argument("file", metavar="FILE", help="scenario/topology YAML file")
    common(up)
    up.add_argument("--image", metavar="ALIAS",
                    help="use this existing LXD image (Debian 12 with mosquitto, mosquitto-clients, nftables, python3 "
                         "and the wrapper's Python requirements) instead of building mqtt-federation-<hash>")
    up.add_argument("--profile", default=PROFILE, help=f"LXD profile with a root disk and a NIC (default {PROFILE})")
    up.add_argument("--mirror", default=DEFAULT_MIRROR, help=f"Debian mirror for the image build "
                                                             f"(default {DEFAULT_MIRROR})")
    up.add_argument("--no-setup", action="store_true",
                    help="do not install packages, start or initialise LXD: fail if it is not ready")
    up.add_argument("--replace", action="store_true", help="delete this topology's containers first if they exist")
    up.add_argument("--keep-on-failure", action="store_true", help="leave the containers of a failed `up` for "
                                                                     "inspection (`down` removes them)")
    up.add_argument("--dry-run", action="store_true",
                    help="check the file and the machine and print the plan; create nothing")
    up.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                    help="the wrappers' log level (default INFO)")

    status = commands.add_parser("status", help="show each node's container and wrapper status")
    status.add_argument("file", metavar="FILE", help="scenario/topology YAML file")
    common(status)
    status.add_argument("--json", action="store_true", help="print node -> wrapper status document as JSON")

    down = commands.add_parser("down", help="delete the topology's containers; stop the LXD daemon `up` started")
    down.add_argument("file", metavar="FILE", nargs="?", help="scenario/topology YAML file")
    common(down)
    down.add_argument("--all", action="store_true",
                      help="delete every container made by this tool with the prefix, whatever its topology")
    down.add_argument("--keep-daemon", action="store_true", help="leave the LXD daemon running (the next `up` is "
                                                                   "faster)")
    return parser


class _Progress:
    """Progress lines on stderr, with the seconds since the command started."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"{time.monotonic() - self.started:6.1f}s  {message}", file=self.stream, flush=True)


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    try:
        arguments = build_parser().parse_args(argv)
        if arguments.command == "up":
            return _up(arguments, out, err)
        if arguments.command == "status":
            return _status(arguments, out, err)
        return _down(arguments, out, err)
    except (UsageError, ScenarioError, PlanError) as error:
        print(f"{PROG}: error: {error}", file=err)
        return EXIT_USAGE
    except (ClusterError, ImageError, host.HostError) as error:
        print(f"{PROG}: error: {error}", file=err)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; `{PROG} down FILE` removes what was created", file=err)
        return EXIT_FAILED


def load_plan(path: str, *, prefix: str, image: str | None = None) -> Plan:
    """The plan for a file: ScenarioError or PlanError with a message a person can act on."""
    scenario = load_scenario(path)
    alias = image or default_recipe(REPO_ROOT).alias
    return make_plan(scenario, image_alias=alias, prefix=prefix)


def connect(endpoint: str | None, *, required: bool = True) -> Any | None:
    """A pylxd Client of `endpoint`, or of the local LXD if it runs; None if the local one does not.

    Without pylxd: UsageError, or None if not `required` (`up` installs it).
    """
    if endpoint is None and not host.daemon_answers():
        return None
    importlib.invalidate_caches()  # `up` may have pip-installed pylxd after this interpreter started
    try:
        import pylxd
    except ImportError as error:
        if not required:
            return None
        raise UsageError(f"pylxd is not installed ({error}): pip install -e '.[lxc]' (or run `up`, which "
                         f"installs it)") from error
    try:
        return pylxd.Client(endpoint=endpoint) if endpoint else pylxd.Client()
    except Exception as error:  # noqa: BLE001 - pylxd raises ClientConnectionFailed and friends
        raise host.HostError(f"cannot reach LXD at {endpoint or host.LXD_SOCKET}: {error}") from error


def _up(arguments: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    plan = load_plan(arguments.file, prefix=arguments.prefix, image=arguments.image)
    client = connect(arguments.endpoint, required=arguments.endpoint is not None)
    image_cached = client is not None and image_exists(client, plan.image_alias)
    running = 0 if client is None else sum(1 for instance in client.instances.all() if instance.status == "Running")
    needs = estimate_needs(plan, image_cached=image_cached, running_containers=running)
    problems = capacity_problems(needs, host.measure_machine(running))
    if problems:
        raise UsageError(f"{plan.source}: the topology does not fit on this machine:\n  " + "\n  ".join(problems))
    if arguments.dry_run:
        for line in plan.describe():
            print(line, file=out)
        print(f"needs about {needs.memory / 2**20:.0f} MiB of memory and {needs.disk / 2**20:.0f} MiB of disk "
              f"(image {'cached' if image_cached else 'to be built'}); nothing was created", file=out)
        return EXIT_OK

    progress = _Progress(err)
    for line in plan.describe():
        progress(line)
    if arguments.endpoint is None and not arguments.no_setup:
        client = host.prepare_host(progress, profile=arguments.profile)
    elif client is None:
        raise host.HostError("--no-setup: the local LXD daemon is not running (start it: lxd --group root &) or "
                             "pylxd is missing (pip install -e '.[lxc]'); or drop --no-setup")
    if arguments.image:
        if not image_exists(client, arguments.image):
            raise UsageError(f"--image {arguments.image}: LXD has no image with that alias (`lxc image list`)")
    else:
        ensure_image(client, default_recipe(REPO_ROOT), host.CACHE_DIR, mirror=arguments.mirror, progress=progress)

    cluster = LxdCluster(client, plan, profile=arguments.profile, progress=progress)
    if arguments.replace:
        cluster.delete()
    elif cluster.existing():
        raise ClusterError(f"containers of topology {plan.topology!r} already exist ({', '.join(cluster.existing())}); "
                           f"`{PROG} status {plan.source}` shows them; `down` it first, or `up --replace`")
    template = MOSQUITTO_CONF_TEMPLATE.read_text(encoding="utf-8")
    try:
        cluster.up(broker_template=template, log_level=arguments.log_level)
    except BaseException:
        if not arguments.keep_on_failure:
            progress("up failed: deleting the containers it created (--keep-on-failure keeps them)")
            try:
                cluster.delete()
            except Exception as error:  # noqa: BLE001 - the first failure is the one to report
                progress(f"cleanup failed too: {error}")
        raise
    progress(f"up: {len(plan.nodes)} nodes federated; `{PROG} status {plan.source}` shows them")
    _print_table(cluster, out)
    return EXIT_OK


def _status(arguments: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    plan = load_plan(arguments.file, prefix=arguments.prefix)
    client = connect(arguments.endpoint)
    if client is None:
        print(f"LXD is not running: topology {plan.topology} is down", file=out)
        return EXIT_FAILED
    cluster = LxdCluster(client, plan)
    present = set(cluster.existing())
    if not present:
        print(f"no containers of topology {plan.topology} (prefix {plan.container_prefix}): it is down", file=out)
        return EXIT_FAILED
    if arguments.json:
        cluster.load_addresses()
        documents = {node.name: (cluster.status(node.name) if node.container in present else None)
                     for node in plan.nodes}
        print(json.dumps(documents, indent=2, sort_keys=True), file=out)
        return EXIT_OK
    healthy = _print_table(cluster, out)
    return EXIT_OK if healthy else EXIT_FAILED


def _print_table(cluster: LxdCluster, out: TextIO) -> bool:
    """One line per node; True if every wrapper answered and is connected to its broker."""
    present = {instance.name: instance
               for instance in ours(cluster.client, cluster.plan.container_prefix, cluster.plan.topology)}
    cluster.load_addresses()
    rows = [("NODE", "CONTAINER", "STATE", "ADDRESS", "WRAPPER", "BROKER", "NEIGHBOURS UP", "MEMBERS", "MGMT CORE")]
    healthy = True
    for node in cluster.plan.nodes:
        instance = present.get(node.container)
        state = instance.status if instance is not None else "missing"
        document = cluster.status(node.name) if state == "Running" else None
        if document is None:
            healthy = False
            rows.append((node.name, node.container, state, cluster.addresses.get(node.name, "-"), "no answer",
                         "-", "-", "-", "-"))
            continue
        neighbours = document.get("neighbours", [])
        connected = bool(document.get("daemon", {}).get("broker", {}).get("connected"))
        healthy = healthy and connected
        rows.append((node.name, node.container, state, cluster.addresses.get(node.name, "-"), "running",
                     "connected" if connected else "DISCONNECTED",
                     f"{sum(1 for n in neighbours if n.get('up'))}/{len(neighbours)}",
                     str(len(document.get("federation", []))), str(document.get("management_core"))))
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(), file=out)
    return healthy


def _down(arguments: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if arguments.all == (arguments.file is not None):
        raise UsageError("give a topology FILE, or --all for every container of this tool")
    if arguments.all:
        prefix, topology = f"{arguments.prefix}-", None
    else:
        plan = load_plan(arguments.file, prefix=arguments.prefix)
        prefix, topology = plan.container_prefix, plan.topology
    progress = _Progress(err)
    client = connect(arguments.endpoint)
    started_here = False
    if client is None:
        if not _stored_containers(prefix):
            print(f"LXD is not running and has no containers named {prefix}*: nothing to remove", file=out)
            return EXIT_OK
        progress("LXD is not running but has containers of ours: starting it to delete them")
        client = host.prepare_host(progress, install=False)
        started_here = True
    deleted = delete_containers(client, prefix, progress, topology)
    print(f"deleted {len(deleted)} containers{': ' + ', '.join(deleted) if deleted else ''}", file=out)
    if arguments.all and arguments.endpoint is None:
        tables = host.delete_fault_tables()
        if tables:
            print(f"deleted the nftables tables of killed scenario runs: {', '.join(tables)}", file=out)
    if arguments.endpoint is None and (started_here or not arguments.keep_daemon):
        remaining = [instance.name for instance in client.instances.all()]
        if remaining:
            if host.started_daemon() is not None:
                print(f"LXD daemon left running: other containers remain ({', '.join(sorted(remaining))})", file=out)
        elif host.stop_daemon(progress):
            print("stopped the LXD daemon that lxc/provision.py had started", file=out)
    return EXIT_OK


def _stored_containers(prefix: str) -> list[str]:
    directory = host.LXD_DIR / "containers"
    try:
        return sorted(path.name for path in Path(directory).iterdir() if path.name.startswith(prefix))
    except OSError:
        return []
