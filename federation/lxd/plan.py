"""What a topology becomes on LXD, decided before anything is created: names, configs, needs, rules.

Theory of operation: provisioning takes tens of seconds and leaves state on
the machine (containers, a daemon, firewall rules), so every decision that
needs no machine is made here, as pure functions of the scenario and of a
few measured machine facts, and is unit-tested without LXD:

- `make_plan` maps each scenario node to a container (name, virtual id,
  neighbours, protocol settings). Container names must be valid host names,
  so node names are lower-cased and `_`/`.` become `-`; two nodes that would
  get the same container name are an error, not a silent merge.
- `estimate_needs` / `capacity_problems` compare what the plan needs
  (memory, disk, containers, inotify instances) with what the machine has,
  so a topology too large fails with a message before the first container.
- The `render_*` functions produce every file pushed into a container
  (broker config, wrapper YAML, systemd unit, nftables ruleset) and the host
  files (LXD preseed, forwarding rule). Addresses come in as arguments: the
  containers get them from DHCP, so configs are rendered after start.

Container-side paths are constants here so that the provisioning, the
scenario backend, the tests and docs/lxc.md agree on them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from federation.harness.nodeconfig import BROKER_PORT, WRAPPER_PORT, render_mosquitto_conf
from federation.protocol.settings import Settings
from federation.scenario.model import Scenario

DEFAULT_PREFIX = "mqf"
"""containers are named PREFIX-TOPOLOGY-NODE"""
MAX_NAME = 63
"""LXD instance names are host names: at most 63 characters"""

# Paths inside every container.
PROJECT_DIR = "/opt/mqtt-federation"
WRAPPER_SCRIPT = f"{PROJECT_DIR}/wrapper.py"
WRAPPER_CONFIG = "/etc/mqtt-federation/wrapper.yaml"
LOG_DIR = "/var/log/mqtt-federation"
EVENT_LOG = f"{LOG_DIR}/events.jsonl"
WRAPPER_LOG = f"{LOG_DIR}/wrapper.log"
STATE_DIR = "/var/lib/mqtt-federation/state"
MOSQUITTO_CONF = "/etc/mosquitto/mosquitto.conf"
MOSQUITTO_DIR = "/var/lib/mosquitto"
BROKER_LOG = f"{MOSQUITTO_DIR}/broker.log"
WRAPPER_SERVICE = "federation-wrapper.service"
WRAPPER_UNIT = f"/etc/systemd/system/{WRAPPER_SERVICE}"
BROKER_SERVICE = "mosquitto.service"
BROKER_DROPIN = "/etc/systemd/system/mosquitto.service.d/federation.conf"
CONTAINER_PYTHON = "/usr/bin/python3"
CONTAINER_FIREWALL_TABLE = "mqtt_federation"

# LXD instance config keys that mark containers as ours (`down` deletes only those).
KEY_TOPOLOGY = "user.mqtt-federation.topology"
KEY_NODE = "user.mqtt-federation.node"
KEY_SOURCE = "user.mqtt-federation.source"

# Host side.
BRIDGE = "lxdbr0"
STORAGE_POOL = "default"
PROFILE = "default"
HOST_FIREWALL_TABLE = "mqtt_federation_lxd"
SUBNET_CANDIDATES = tuple(ipaddress.IPv4Network(f"10.{second}.{third}.0/24")
                          for second in (97, 98, 99) for third in range(0, 256, 7))
"""where the bridge's /24 is chosen from: the first that overlaps no host address, route or resolver"""

# Resource model of one running container (systemd, Mosquitto, a wrapper; docs/lxc.md, "Sizes").
# Measured: about 43 MB of memory (cgroup usage) and 223 MB of disk per container; the
# constants keep a margin for event logs, queued messages and boot-time peaks.
MEMORY_PER_CONTAINER = 128 * 2**20
DISK_PER_CONTAINER = 320 * 2**20
"""the dir storage driver unpacks the whole image for every container"""
IMAGE_BUILD_DISK = 1024 * 2**20
"""debootstrap rootfs + the packed image + LXD's copy, while an image is built"""
MEMORY_RESERVE = 1024 * 2**20
"""left for the host, the LXD daemon and the test processes"""
DISK_RESERVE = 1024 * 2**20
INOTIFY_PER_CONTAINER = 8
"""measured 6 (systemd, journald, ...); all containers' count against one host uid"""
MAX_CONTAINERS = 100
"""the bridge's /24 leaves 253 DHCP addresses; past 100 the 2-CPU machines this runs on are the limit"""

_NAME_CHARS = re.compile(r"[^a-z0-9-]+")


class PlanError(Exception):
    """The topology cannot be provisioned as given; the message says why and what to change."""


@dataclass(frozen=True)
class NodePlan:
    """One scenario node as one container."""

    name: str
    container: str
    index: int
    vid: int
    neighbours: tuple[str, ...]
    """neighbour node names, sorted"""
    settings: Settings


@dataclass(frozen=True)
class Plan:
    topology: str
    source: str
    prefix: str
    image_alias: str
    nodes: tuple[NodePlan, ...]
    links: tuple[tuple[str, str], ...]

    def node(self, name: str) -> NodePlan:
        for node in self.nodes:
            if node.name == name:
                return node
        raise PlanError(f"{self.source}: unknown node {name!r}; nodes are: {', '.join(self.node_names())}")

    def node_names(self) -> list[str]:
        return [node.name for node in self.nodes]

    def containers(self) -> list[str]:
        return [node.container for node in self.nodes]

    @property
    def container_prefix(self) -> str:
        """Every container of this topology starts with this (what `down` looks for)."""
        return f"{self.prefix}-{sanitize(self.topology)}-"

    def describe(self) -> list[str]:
        """The plan as lines for a person: what `up` will create."""
        lines = [f"topology {self.topology} ({self.source}): {len(self.nodes)} containers, "
                 f"{len(self.links)} links, image {self.image_alias}"]
        for node in self.nodes:
            neighbours = ", ".join(node.neighbours) or "(none)"
            lines.append(f"  {node.container:<{max(len(n.container) for n in self.nodes)}}  node {node.name}, "
                         f"id {node.vid}, neighbours {neighbours}")
        return lines


def sanitize(text: str) -> str:
    """A host-name-safe form: lower case, runs of other characters become one '-'."""
    return _NAME_CHARS.sub("-", text.lower()).strip("-")


def make_plan(scenario: Scenario, *, image_alias: str, prefix: str = DEFAULT_PREFIX, topology: str | None = None,
              vids: Mapping[str, int] | None = None) -> Plan:
    """Map every node of the scenario to a container; PlanError if names collide or are too long.

    `topology` replaces the scenario's name in container names (the scenario
    backend makes one per run); `vids` replaces the virtual ids (default: the
    node's `id`, else its index + 1).
    """
    clean_prefix = sanitize(prefix)
    if not clean_prefix or not clean_prefix[0].isalpha() or clean_prefix != prefix:
        raise PlanError(f"prefix {prefix!r}: use lower-case letters, digits and '-', starting with a letter "
                        f"(for example {DEFAULT_PREFIX!r})")
    topology = sanitize(topology if topology is not None else scenario.name) or "topology"
    nodes: list[NodePlan] = []
    owner: dict[str, str] = {}
    for index, spec in enumerate(scenario.nodes):
        container = f"{clean_prefix}-{topology}-{sanitize(spec.name) or 'node'}"
        if len(container) > MAX_NAME:
            raise PlanError(f"{scenario.source}: container name {container!r} for node {spec.name!r} is "
                            f"{len(container)} characters, LXD allows {MAX_NAME}; shorten the scenario `name`, "
                            f"the node name or --prefix")
        if container in owner:
            raise PlanError(f"{scenario.source}: nodes {owner[container]!r} and {spec.name!r} would both become "
                            f"container {container!r} (names are lower-cased, '_' and '.' become '-'); "
                            f"rename one of them")
        owner[container] = spec.name
        nodes.append(NodePlan(
            name=spec.name, container=container, index=index,
            vid=(vids or {}).get(spec.name, spec.vid if spec.vid is not None else index + 1),
            neighbours=tuple(scenario.neighbours_of(spec.name)),
            settings=scenario.settings_for(spec.name),
        ))
    return Plan(topology=topology, source=scenario.source, prefix=clean_prefix, image_alias=image_alias,
                nodes=tuple(nodes), links=tuple(scenario.links))


def expected_members(plan: Plan) -> dict[str, list[str]]:
    """Node -> the nodes its federation table must hold once converged: its connected component."""
    component: dict[str, list[str]] = {}
    for node in plan.nodes:
        if node.name in component:
            continue
        seen = {node.name}
        frontier = [node.name]
        while frontier:
            current = plan.node(frontier.pop())
            for neighbour in current.neighbours:
                if neighbour not in seen:
                    seen.add(neighbour)
                    frontier.append(neighbour)
        members = sorted(seen)
        for name in members:
            component[name] = members
    return component


# ---------------------------------------------------------------- resources


@dataclass(frozen=True)
class Machine:
    """What the host has now (measured by `federation.lxd.host.measure_machine`)."""

    memory_available: int
    """bytes (MemAvailable)"""
    disk_free: int
    """bytes free where LXD keeps its storage"""
    disk_path: str
    inotify_instances: int
    """fs.inotify.max_user_instances"""
    running_containers: int = 0
    """containers already running in this LXD (they share the inotify limit and memory)"""


@dataclass(frozen=True)
class Needs:
    containers: int
    memory: int
    disk: int
    inotify_instances: int


def estimate_needs(plan: Plan, *, image_cached: bool, running_containers: int = 0) -> Needs:
    count = len(plan.nodes)
    return Needs(
        containers=count,
        memory=count * MEMORY_PER_CONTAINER + MEMORY_RESERVE,
        disk=count * DISK_PER_CONTAINER + (0 if image_cached else IMAGE_BUILD_DISK) + DISK_RESERVE,
        inotify_instances=(count + running_containers) * INOTIFY_PER_CONTAINER,
    )


def capacity_problems(needs: Needs, machine: Machine) -> list[str]:
    """Empty if the machine can hold the plan; else one actionable sentence per shortfall."""
    problems: list[str] = []
    if needs.containers > MAX_CONTAINERS:
        problems.append(f"{needs.containers} containers requested, at most {MAX_CONTAINERS} are supported "
                        f"on one machine; split the topology")
    if needs.memory > machine.memory_available:
        fits = max(0, (machine.memory_available - MEMORY_RESERVE) // MEMORY_PER_CONTAINER)
        problems.append(f"not enough memory: {needs.containers} containers need about {_mib(needs.memory)} "
                        f"({_mib(MEMORY_PER_CONTAINER)} each + {_mib(MEMORY_RESERVE)} reserve), "
                        f"{_mib(machine.memory_available)} is available; at most {fits} containers fit")
    if needs.disk > machine.disk_free:
        problems.append(f"not enough disk at {machine.disk_path}: about {_mib(needs.disk)} needed "
                        f"({_mib(DISK_PER_CONTAINER)} per container, image build and reserve), "
                        f"{_mib(machine.disk_free)} free; free space or use fewer nodes")
    if needs.inotify_instances > machine.inotify_instances:
        want = max(1024, needs.inotify_instances * 2)
        problems.append(f"fs.inotify.max_user_instances is {machine.inotify_instances}; "
                        f"{needs.containers} containers (plus {machine.running_containers} running) need "
                        f"about {needs.inotify_instances} (systemd in a container stops booting beyond it); "
                        f"raise it: sysctl -w fs.inotify.max_user_instances={want}")
    return problems


def _mib(size: int) -> str:
    return f"{size / 2**20:.0f} MiB"


# ---------------------------------------------------------------- files pushed into a container


def render_broker_conf(template: str) -> str:
    """configs/mosquitto.conf for a container: listen on every address, log to MOSQUITTO_DIR.

    Debian's mosquitto.service starts the broker as root and it drops to the
    `mosquitto` user, which owns MOSQUITTO_DIR.
    """
    return render_mosquitto_conf(template, "0.0.0.0", BROKER_PORT, Path(MOSQUITTO_DIR), run_as_root=False)


def render_wrapper_yaml(node: NodePlan, address: str, neighbour_addresses: Iterable[str], *,
                        log_level: str = "INFO") -> str:
    """The wrapper's YAML (configs/wrapper.yaml keys): bound to the container's own address."""
    document: dict[str, Any] = {
        "name": node.name,
        "id": node.vid,
        "bind": f"{address}:{WRAPPER_PORT}",
        "broker": f"127.0.0.1:{BROKER_PORT}",
        "neighbors": [f"{neighbour}:{WRAPPER_PORT}" for neighbour in sorted(neighbour_addresses)],
        "client_id": f"federation-wrapper-{node.name}",
        "state_dir": STATE_DIR,
        "event_log": EVENT_LOG,
        "log_level": log_level,
        "settings": {f.name: getattr(node.settings, f.name) for f in fields(node.settings)},
    }
    header = f"# written by lxc/provision.py for node {node.name} (container {node.container})\n"
    return header + yaml.safe_dump(document, sort_keys=True, default_flow_style=False)


def render_broker_dropin() -> str:
    """systemd drop-in for Debian's mosquitto.service: a killed broker stays down (Debian restarts it on
    failure), so that a scenario's `kill`/`restart` mean what they say, as for the wrapper."""
    return "[Service]\nRestart=no\n"


def render_wrapper_unit() -> str:
    """systemd unit of the wrapper; it logs to WRAPPER_LOG so the log survives in the container."""
    return "\n".join([
        "[Unit]",
        "Description=MQTT federation wrapper (written by lxc/provision.py)",
        f"After={BROKER_SERVICE} network-online.target",
        f"Wants={BROKER_SERVICE}",
        "",
        "[Service]",
        "Environment=PYTHONUNBUFFERED=1",
        f"ExecStart={CONTAINER_PYTHON} {WRAPPER_SCRIPT} --config {WRAPPER_CONFIG}",
        f"StandardOutput=append:{WRAPPER_LOG}",
        f"StandardError=append:{WRAPPER_LOG}",
        "Restart=no",
        "TimeoutStopSec=10",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ])


def render_container_firewall(blocked: Mapping[str, float]) -> str:
    """An nftables script that replaces the container's rule table atomically.

    `blocked`: peer address -> percent of its packets dropped on arrival
    (100: the link from that peer is cut). An empty mapping leaves an empty
    table: every link open.
    """
    rules: list[str] = []
    for peer in sorted(blocked, key=lambda text: ipaddress.IPv4Address(text)):
        percent = blocked[peer]
        if not 0 <= percent <= 100:
            raise ValueError(f"loss for {peer} must be within 0..100 percent, got {percent!r}")
        if percent >= 100:
            rules.append(f"        ip saddr {peer} drop")
        elif percent > 0:
            rules.append(f"        ip saddr {peer} numgen random mod 10000 < {round(percent * 100)} drop")
    table = f"inet {CONTAINER_FIREWALL_TABLE}"
    return "\n".join([
        f"table {table}",
        f"delete table {table}",
        f"table {table} {{",
        "    chain input {",
        "        type filter hook input priority -10; policy accept;",
        *rules,
        "    }",
        "}",
        "",
    ])


def render_bridge_faults(table: str, receivers: Mapping[str, str]) -> str:
    """nftables script for the host bridge: a table that sends each frame to its receiver's chain.

    `receivers`: chain name -> the receiving container's address. The chains
    start empty (every link open); `render_bridge_inbound` fills one. Frames
    between two containers cross the bridge's forward hook on the host, so a
    rule there cuts a link without entering any container (one local `nft`
    call instead of an exec into a container per change). Receivers are
    matched by address alone: the kernel here cannot match the bridge's name
    in the bridge family, and the addresses are the run's own containers'.
    """
    jumps = [f"        ip daddr {address} jump {chain}"
             for chain, address in sorted(receivers.items())]
    chains = [f"    chain {chain} {{\n    }}" for chain in sorted(receivers)]
    return "\n".join([
        f"table bridge {table}",
        f"delete table bridge {table}",
        f"table bridge {table} {{",
        *chains,
        "    chain forward {",
        "        type filter hook forward priority -10; policy accept;",
        *jumps,
        "    }",
        "}",
        "",
    ])


def render_bridge_inbound(table: str, chain: str, blocked: Mapping[str, float]) -> str:
    """Replace one receiver's chain: sender address -> percent of its frames dropped (100: cut)."""
    lines = [f"flush chain bridge {table} {chain}"]
    for peer in sorted(blocked, key=lambda text: ipaddress.IPv4Address(text)):
        percent = blocked[peer]
        if not 0 <= percent <= 100:
            raise ValueError(f"loss for {peer} must be within 0..100 percent, got {percent!r}")
        if percent >= 100:
            lines.append(f"add rule bridge {table} {chain} ip saddr {peer} drop")
        elif percent > 0:
            lines.append(f"add rule bridge {table} {chain} ip saddr {peer} numgen random mod 10000 < "
                         f"{round(percent * 100)} drop")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- host files


def render_preseed(subnet: ipaddress.IPv4Network, *, bridge: str = BRIDGE, pool: str = STORAGE_POOL) -> str:
    """`lxd init --preseed` input: dir storage, a bridge with DHCP and no NAT, no IPv6."""
    gateway = next(subnet.hosts())
    document = {
        "config": {},
        "networks": [{"name": bridge, "type": "bridge", "config": {
            "ipv4.address": f"{gateway}/{subnet.prefixlen}", "ipv4.nat": "false", "ipv6.address": "none"}}],
        "storage_pools": [{"name": pool, "driver": "dir"}],
        "profiles": [{"name": PROFILE, "devices": {
            "root": {"path": "/", "pool": pool, "type": "disk"},
            "eth0": {"name": "eth0", "network": bridge, "type": "nic"}}}],
    }
    return yaml.safe_dump(document, sort_keys=True)


def choose_subnet(in_use: Iterable[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """The first candidate /24 that overlaps none of the host's networks, routes and resolvers."""
    taken = list(in_use)
    for candidate in SUBNET_CANDIDATES:
        if not any(candidate.overlaps(network) for network in taken):
            return candidate
    raise PlanError(f"no free /24 for the {BRIDGE} bridge among {SUBNET_CANDIDATES[0]} .. "
                    f"{SUBNET_CANDIDATES[-1]}: every candidate overlaps a host network; configure LXD yourself "
                    f"and pass --no-setup")


def render_host_firewall(bridge: str = BRIDGE) -> str:
    """nftables script: nothing is forwarded between the bridge and other interfaces (no traffic leaves)."""
    table = f"inet {HOST_FIREWALL_TABLE}"
    return "\n".join([
        f"table {table}",
        f"delete table {table}",
        f"table {table} {{",
        "    chain forward {",
        "        type filter hook forward priority -10; policy accept;",
        f'        iifname "{bridge}" oifname != "{bridge}" drop',
        f'        oifname "{bridge}" iifname != "{bridge}" drop',
        "    }",
        "}",
        "",
    ])
