"""Bring up (and later stop) the LXD daemon on a Debian machine without systemd.

Theory of operation: on the machines this project runs on, LXD 5.0.2 comes
from apt, nothing starts it, no image server is reachable and container
traffic must stay on the machine. `prepare_host` makes that true step by
step, skipping every step already done, so it is cheap when run again:

1. Debian packages `lxd lxd-client nftables debootstrap` (nftables must be
   there before the daemon first starts, or LXD falls back to iptables).
2. The daemon: `lxd --group root --logfile ...` in its own session (it must
   outlive this process: the containers live in it), then `lxd waitready`.
   What we started is recorded in `DAEMON_RECORD` (pid, the previous
   `net.ipv4.ip_forward`), so `stop_daemon` stops only a daemon this tool
   started and puts the machine back.
3. First-time initialisation (`lxd init --preseed`): dir storage, bridge
   `lxdbr0` with DHCP on a /24 that overlaps no host network, no NAT, no
   IPv6. An LXD that already has a storage pool is never re-initialised.
4. A host nftables table that drops forwarding between the bridge and every
   other interface, so nothing a container sends leaves the machine.

An existing LXD named by the user (`--endpoint`) skips all of this.
"""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from federation.harness.nodeconfig import REPO_ROOT
from federation.harness.processes import poll
from federation.lxd.plan import (
    BRIDGE,
    HOST_FIREWALL_TABLE,
    Machine,
    choose_subnet,
    render_host_firewall,
    render_preseed,
)

HOST_PACKAGES = ("lxd", "lxd-client", "nftables", "debootstrap")
LXD_DIR = Path("/var/lib/lxd")
LXD_SOCKET = LXD_DIR / "unix.socket"
RUN_DIR = Path("/run/mqtt-federation-lxd")
DAEMON_RECORD = RUN_DIR / "daemon.json"
LOG_DIR = Path("/var/log/mqtt-federation-lxd")
DAEMON_LOG = LOG_DIR / "lxd.log"
CACHE_DIR = Path("/var/cache/mqtt-federation-lxd")
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
DAEMON_START_TIMEOUT = 60
DAEMON_STOP_TIMEOUT = 60
APT_TIMEOUT = 900.0

Progress = Callable[[str], None]


class HostError(Exception):
    """The host cannot run LXD as needed; the message says which step failed and what to do."""


# ---------------------------------------------------------------- facts


def measure_machine(running_containers: int = 0) -> Machine:
    """Memory, disk (where LXD stores containers) and inotify limit of this machine, now."""
    available = 0
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    disk_path = LXD_DIR
    while not disk_path.exists():
        disk_path = disk_path.parent
    try:
        inotify = int(INOTIFY_INSTANCES.read_text().strip())
    except (OSError, ValueError):
        inotify = 1 << 30
    return Machine(memory_available=available, disk_free=shutil.disk_usage(disk_path).free,
                   disk_path=str(disk_path), inotify_instances=inotify, running_containers=running_containers)


def missing_packages(packages: tuple[str, ...] = HOST_PACKAGES) -> list[str]:
    missing = []
    for package in packages:
        result = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True,
                                check=False)
        if "install ok installed" not in result.stdout:
            missing.append(package)
    return missing


def daemon_answers(socket_path: Path = LXD_SOCKET) -> bool:
    """True if something accepts connections on the LXD unix socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(str(socket_path))
        except OSError:
            return False
    return True


def host_networks() -> list[ipaddress.IPv4Network]:
    """IPv4 networks this host already uses: its addresses, its routes and its DNS resolvers."""
    networks: list[ipaddress.IPv4Network] = []
    for command in (["ip", "-j", "-4", "addr"], ["ip", "-j", "-4", "route", "show", "table", "all"]):
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        try:
            entries = json.loads(result.stdout or "[]")
        except json.JSONDecodeError:
            continue
        for entry in entries:
            for info in entry.get("addr_info", []):
                with contextlib.suppress(ValueError, KeyError):
                    networks.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
            destination = entry.get("dst")
            if destination and destination != "default":
                with contextlib.suppress(ValueError):
                    networks.append(ipaddress.IPv4Network(destination, strict=False))
    with contextlib.suppress(OSError):
        for line in Path("/etc/resolv.conf").read_text().splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] == "nameserver":
                with contextlib.suppress(ValueError):
                    networks.append(ipaddress.IPv4Network(words[1]))
    return networks


# ---------------------------------------------------------------- steps


def install_packages(packages: list[str], progress: Progress) -> None:
    progress(f"host: installing Debian packages {' '.join(packages)} (apt-get; a minute or so)")
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / "apt.log"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with open(log, "ab") as sink:
        for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *packages]):
            result = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                    env=env, timeout=APT_TIMEOUT, check=False)
            if result.returncode != 0:
                raise HostError(f"`{' '.join(command)}` failed with status {result.returncode}; see {log}")


def ensure_pylxd(progress: Progress) -> None:
    """Import pylxd, installing the `lxc` extra's requirement with pip first if it is missing."""
    try:
        importlib.import_module("pylxd")
        return
    except ImportError:
        pass
    from federation.lxd.image import project_extra

    requirements = project_extra(REPO_ROOT / "setup.cfg", "lxc") or ("pylxd",)
    progress(f"host: installing {' '.join(requirements)} with pip (the `lxc` extra of setup.cfg)")
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--root-user-action=ignore",
                             *requirements], capture_output=True, text=True, check=False,
                            env={**os.environ, "PIP_BREAK_SYSTEM_PACKAGES": "1"})
    if result.returncode != 0:
        raise HostError(f"pip could not install {' '.join(requirements)}:\n{result.stderr.strip()[-2000:]}\n"
                        f"install it yourself: {sys.executable} -m pip install -e '.[lxc]'")
    importlib.invalidate_caches()
    importlib.import_module("pylxd")


def start_daemon(progress: Progress) -> None:
    """Start `lxd` in its own session and wait until it answers; record it in DAEMON_RECORD."""
    lxd = shutil.which("lxd")
    if lxd is None:
        raise HostError("the lxd command is missing: apt-get install -y lxd lxd-client (or run without --no-setup)")
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    forward_before = IP_FORWARD.read_text().strip() if IP_FORWARD.exists() else None
    progress(f"host: starting the LXD daemon (log {DAEMON_LOG})")
    with open(LOG_DIR / "lxd.out", "ab") as sink:
        process = subprocess.Popen([lxd, "--group", "root", "--logfile", str(DAEMON_LOG)], stdin=subprocess.DEVNULL,
                                   stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    DAEMON_RECORD.write_text(json.dumps({"pid": process.pid, "ip_forward": forward_before,
                                         "started_at": time.time()}) + "\n", encoding="utf-8")
    result = subprocess.run([lxd, "waitready", f"--timeout={DAEMON_START_TIMEOUT}"], capture_output=True, text=True,
                            check=False)
    if result.returncode != 0 or process.poll() is not None:
        tail = "\n".join(DAEMON_LOG.read_text(errors="replace").splitlines()[-10:]) if DAEMON_LOG.exists() else ""
        raise HostError(f"the LXD daemon did not become ready within {DAEMON_START_TIMEOUT} s "
                        f"({result.stderr.strip()}); the end of {DAEMON_LOG}:\n{tail}")


def initialisation_problems(client: Any, *, profile: str) -> list[str]:
    """Why this LXD cannot run our containers yet (empty: it can)."""
    problems = []
    if not client.storage_pools.all():
        problems.append("no storage pool")
    try:
        devices = client.profiles.get(profile).devices
    except Exception:  # noqa: BLE001 - pylxd raises NotFound; any failure means "not usable"
        return problems + [f"no profile {profile!r}"]
    kinds = {device.get("type") for device in devices.values()}
    if "nic" not in kinds:
        problems.append(f"profile {profile!r} has no network device")
    if "disk" not in kinds:
        problems.append(f"profile {profile!r} has no root disk")
    return problems


def initialise(progress: Progress) -> None:
    subnet = choose_subnet(host_networks())
    progress(f"host: initialising LXD (dir storage, bridge {BRIDGE} on {subnet}, no NAT)")
    result = subprocess.run(["lxd", "init", "--preseed"], input=render_preseed(subnet), capture_output=True,
                            text=True, check=False)
    if result.returncode != 0:
        raise HostError(f"`lxd init --preseed` failed: {result.stderr.strip() or result.stdout.strip()}")


def apply_host_firewall() -> None:
    """Drop forwarding between the bridge and other interfaces (idempotent: the table is replaced)."""
    result = subprocess.run(["nft", "-f", "-"], input=render_host_firewall(), capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        raise HostError(f"nft could not install the forwarding rule: {result.stderr.strip()}; "
                        f"is nftables installed (apt-get install -y nftables)?")


def prepare_host(progress: Progress, *, profile: str = "default", install: bool = True) -> Any:
    """Packages, daemon, initialisation and forwarding rule as needed; a pylxd Client of the local LXD."""
    if os.geteuid() != 0:
        raise HostError("setting up LXD needs root (apt-get, the lxd daemon, nftables); run as root, or point "
                        "--endpoint at an LXD you already run")
    if install:
        missing = missing_packages()
        if missing:
            install_packages(missing, progress)
    ensure_pylxd(progress)
    if not daemon_answers():
        start_daemon(progress)
    import pylxd

    client = pylxd.Client()
    problems = initialisation_problems(client, profile=profile)
    if problems:
        if client.storage_pools.all() or profile != "default":
            raise HostError(f"this LXD is set up differently ({'; '.join(problems)}); it is not re-initialised "
                            f"automatically: fix it, or name a usable profile with --profile")
        initialise(progress)
        client = pylxd.Client()
    apply_host_firewall()
    return client


# ---------------------------------------------------------------- stopping


def started_daemon() -> dict[str, Any] | None:
    """What DAEMON_RECORD says we started, if that daemon is still the one running."""
    try:
        record: dict[str, Any] = json.loads(DAEMON_RECORD.read_text())
    except (OSError, ValueError):
        return None
    return record


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower().split("state:")[1].split("\n")[0]
    except (OSError, IndexError):
        return False


def stop_daemon(progress: Progress) -> bool:
    """Stop the LXD daemon if this tool started it; False if it was not ours (left running)."""
    record = started_daemon()
    if record is None:
        return False
    pid = int(record["pid"])
    if _alive(pid):
        progress("host: stopping the LXD daemon started by lxc/provision.py")
        subprocess.run(["lxd", "shutdown", f"--timeout={DAEMON_STOP_TIMEOUT}"], capture_output=True, check=False,
                       timeout=DAEMON_STOP_TIMEOUT + 30)
        try:
            poll(lambda: not _alive(pid), 15.0, f"lxd (pid {pid}) to exit")
        except Exception:  # noqa: BLE001 - a daemon that ignores shutdown is killed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    _stop_dnsmasq()
    delete_fault_tables()
    # Our forwarding rule, and the table LXD leaves behind (it writes it again when it starts).
    for table in (HOST_FIREWALL_TABLE, "lxd"):
        subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True, check=False)
    forward = record.get("ip_forward")
    if forward is not None and IP_FORWARD.exists():
        with contextlib.suppress(OSError):
            IP_FORWARD.write_text(f"{forward}\n")
    DAEMON_RECORD.unlink(missing_ok=True)
    return True


def delete_fault_tables(prefix: str = "mqf_run_") -> list[str]:
    """Delete the host's bridge-family nftables tables that scenario runs made (left by a killed run)."""
    result = subprocess.run(["nft", "-j", "list", "tables", "bridge"], capture_output=True, text=True, check=False)
    try:
        entries = json.loads(result.stdout or "{}").get("nftables", [])
    except ValueError:
        return []
    names = sorted(entry["table"]["name"] for entry in entries
                   if "table" in entry and str(entry["table"].get("name", "")).startswith(prefix))
    for name in names:
        subprocess.run(["nft", "delete", "table", "bridge", name], capture_output=True, check=False)
    return names


def _stop_dnsmasq() -> None:
    """LXD's dnsmasq for the bridge can outlive the daemon; end it (found by its pid file)."""
    pid_file = LXD_DIR / "networks" / BRIDGE / "dnsmasq.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text().strip())
        if "dnsmasq" in Path(f"/proc/{pid}/cmdline").read_text():
            os.kill(pid, signal.SIGTERM)
