"""Names, commands and leftovers of the network-namespace backend: the part that touches the kernel.

Theory of operation
-------------------
Everything a run creates carries the run's prefix `fedns-<pid>-<token>`: the
pid of the process that owns the run and six random hex digits. Namespaces
are `<prefix>-<node index>`, the temporary directory is `<prefix>-XXXX` in
the system's temp dir, and the nftables table inside every namespace is
`fedns_<token>`. Links are veth pairs created directly inside the two
namespaces (`ip link add ... netns A type veth peer ... netns B`), so
nothing of a run ever exists in the host's own network namespace: deleting a
run's namespaces removes its interfaces, addresses, routes and rules with
them. The processes inside are children of the owner, started with
PR_SET_PDEATHSIG, so they die with it.

What can outlive a run is what survives its owner being killed with SIGKILL
(or the machine's power going): the namespaces (a namespace is kept as long
as a file under /run/netns names it) and the temporary directory. A name
whose owner pid is gone, or belongs to a process that started after the
namespace was made (a reused pid), is a leftover: `cleanup_leftovers` kills
any process still inside and deletes it. Every run does that for the prefix
scheme before creating anything; `python -m federation.netns cleanup` does it
by hand.

Entering a namespace without `ip netns exec`: a child process calls
setns(2) on /run/netns/<name> between fork and exec (`enter_namespace`); the
status poller gets a UDP socket that lives in a node's namespace by creating
it in a short-lived thread that called setns first (network namespaces are
per thread, and a socket stays in the namespace it was created in).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from federation.harness.platform import PlatformError
from federation.harness.processes import die_with_parent, find_tool

PREFIX = "fedns"
NETNS_DIR = Path("/run/netns")
RUN_NAME = re.compile(rf"^{PREFIX}-(?P<pid>\d+)-(?P<token>[0-9a-f]{{6}})(?:-(?P<rest>.+))?$")
"""a namespace or temporary directory made by some run"""
COMMAND_TIMEOUT = 20.0
"""seconds one `ip` or `nft` command may take"""
_CLONE_NEWNET = 0x40000000

try:
    _SETNS: Any = ctypes.CDLL(None, use_errno=True).setns
except (OSError, AttributeError):  # pragma: no cover - not Linux
    _SETNS = None


@dataclass(frozen=True)
class RunNames:
    """The names of one run's namespaces, interfaces, nftables table and directory."""

    pid: int
    token: str

    @classmethod
    def new(cls) -> RunNames:
        return cls(os.getpid(), secrets.token_hex(3))

    @property
    def prefix(self) -> str:
        return f"{PREFIX}-{self.pid}-{self.token}"

    def namespace(self, index: int) -> str:
        return f"{self.prefix}-{index}"

    def veth(self, index: int, peer_index: int) -> str:
        """The interface in node `index`'s namespace that leads to node `peer_index` (at most 15 bytes)."""
        return f"{self.token[:4]}-{index}-{peer_index}"

    @property
    def table(self) -> str:
        return f"{PREFIX}_{self.token}"


def node_address(index: int) -> str:
    """Node `index`'s address: 10.77.x.y, on the loopback of its namespace (never on the host)."""
    if not 0 <= index < 200 * 250:
        raise ValueError(f"node index {index} is out of range for 10.77.0.0/16")
    return f"10.77.{index // 200}.{index % 200 + 1}"


TOOLS = (("ip", "iproute2"), ("nft", "nftables"), ("mosquitto", "mosquitto"),
         ("mosquitto_sub", "mosquitto-clients"), ("mosquitto_pub", "mosquitto-clients"))
"""(program, Debian package) the backend runs"""


def unavailable_reason() -> str | None:
    """Why this machine cannot run the netns backend (not root, a tool missing, `ip netns` failing); None if it can.

    Creates nothing: tests skip with this reason, and the backend refuses to start with it.
    """
    if os.geteuid() != 0:
        return ("the netns backend needs root (it creates network namespaces, veth links and nftables rules): "
                "run it as root, or use --backend sim")
    missing = [(name, package) for name, package in TOOLS if find_tool(name) is None]
    if missing:
        return (f"the netns backend needs {', '.join(name for name, _ in missing)}: "
                f"`apt-get install -y {' '.join(sorted({package for _, package in missing}))}` (or `make install`)")
    ip = find_tool("ip")
    assert ip is not None
    probe = subprocess.run([ip, "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return (f"`ip netns list` fails here ({probe.stderr.strip()}): this machine cannot make network "
                f"namespaces; use --backend sim")
    return None


VETH_NAME = re.compile(r"^[0-9a-f]{4}-\d+-\d+$")
"""a run's interface names (`RunNames.veth`)"""


def host_snapshot(owner: int | None = None) -> dict[str, list[str]]:
    """Everything of the prefix scheme visible from the host: namespaces, host interfaces and nftables
    tables named like a run's (there should never be any on the host), and temporary directories.

    After a run, nothing of it may be listed; tests compare before and after.
    With `owner`, only the namespaces and directories of runs owned by that
    pid are listed, so other runs on the machine (another test session) do
    not disturb the comparison; other software's interfaces and tables (LXD,
    Docker) are never listed.
    """
    ip = find_tool("ip") or "ip"
    nft = find_tool("nft") or "nft"
    links = run([ip, "-o", "link", "show"], check=False).stdout
    link_names = [line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if line.count(":") >= 2]
    tables = run([nft, "list", "tables"], check=False).stdout.splitlines()

    def mine(name: str) -> bool:
        match = RUN_NAME.match(name)
        return match is not None and (owner is None or int(match["pid"]) == owner)

    return {
        "namespaces": [name for name in list_namespaces(ip) if mine(name)],
        "links": sorted(name for name in link_names if VETH_NAME.match(name) or PREFIX in name),
        "nft_tables": sorted(table for table in tables if PREFIX in table),
        "directories": sorted(str(path) for path in Path(tempfile.gettempdir()).glob(f"{PREFIX}-*")
                              if mine(path.name)),
    }


# ------------------------------------------------------------ commands


def tool(name: str, package: str) -> str:
    found = find_tool(name)
    if found is None:
        raise PlatformError(f"{name} is not installed: `apt-get install -y {package}` (or `make install`)")
    return found


def run(argv: Sequence[str], *, namespace: str | None = None, stdin: str | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command (inside `namespace` if given); PlatformError with its stderr when it fails."""
    try:
        result = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT,
                                check=False, preexec_fn=enter_namespace(namespace) if namespace else None)
    except subprocess.TimeoutExpired as error:
        raise PlatformError(f"`{' '.join(argv)}` took more than {COMMAND_TIMEOUT:g} s") from error
    if check and result.returncode != 0:
        where = f" in namespace {namespace}" if namespace else ""
        raise PlatformError(f"`{' '.join(argv)}`{where} failed with status {result.returncode}: "
                            f"{result.stderr.strip() or result.stdout.strip()}")
    return result


def run_many(jobs: Sequence[tuple[Sequence[str], str, str]]) -> None:
    """Run several (argv, namespace, stdin) commands at once; PlatformError naming the first that failed."""
    started = []
    try:
        for argv, namespace, stdin in jobs:
            process = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, preexec_fn=enter_namespace(namespace))
            started.append((argv, namespace, stdin, process))
        failures = []
        for argv, namespace, stdin, process in started:
            try:
                _, error = process.communicate(stdin, timeout=COMMAND_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
                error = f"took more than {COMMAND_TIMEOUT:g} s"
            if process.returncode != 0:
                failures.append(f"`{' '.join(argv)}` in namespace {namespace} failed with status "
                                f"{process.returncode}: {error.strip()}")
    finally:
        for _, _, _, process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    if failures:
        raise PlatformError("; ".join(failures))


def enter_namespace(namespace: str) -> Callable[[], None]:
    """A `preexec_fn` that moves the child into the named network namespace (and dies with its parent)."""
    path = str(NETNS_DIR / namespace)

    def enter() -> None:  # pragma: no cover - runs in the child between fork and exec
        die_with_parent()
        descriptor = os.open(path, os.O_RDONLY)
        try:
            if _SETNS is None or _SETNS(descriptor, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns({path}) failed")
        finally:
            os.close(descriptor)

    return enter


def socket_in_namespace(namespace: str, kind: socket.SocketKind = socket.SOCK_DGRAM) -> socket.socket:
    """A socket that lives in the named network namespace (made by a thread that entered it)."""
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def make() -> None:
        try:
            descriptor = os.open(str(NETNS_DIR / namespace), os.O_RDONLY)
            try:
                if _SETNS is None or _SETNS(descriptor, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {namespace} failed")
            finally:
                os.close(descriptor)
            made.append(socket.socket(socket.AF_INET, kind))
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
            failed.append(error)

    worker = threading.Thread(target=make, name=f"enter-{namespace}")
    worker.start()
    worker.join()
    if failed:
        raise PlatformError(f"cannot open a socket in namespace {namespace}: {failed[0]}")
    return made[0]


# ------------------------------------------------------------ namespaces and leftovers


def list_namespaces(ip: str) -> list[str]:
    """Names of every network namespace `ip netns` knows."""
    output = run([ip, "netns", "list"]).stdout
    return sorted(line.split()[0] for line in output.splitlines() if line.strip())


def namespace_pids(ip: str, namespace: str) -> list[int]:
    result = run([ip, "netns", "pids", namespace], check=False)
    return [int(word) for word in result.stdout.split() if word.isdigit()]


def delete_namespace(ip: str, namespace: str) -> None:
    """Kill every process inside, then delete the namespace (and so its interfaces and rules). Never raises."""
    if not (NETNS_DIR / namespace).exists():
        return
    for _ in range(3):
        pids = namespace_pids(ip, namespace)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait_gone(pids, 2.0)
    run([ip, "netns", "delete", namespace], check=False)


def _wait_gone(pids: Sequence[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    remaining = list(pids)
    while remaining and time.monotonic() < deadline:
        remaining = [pid for pid in remaining if _alive(pid)]
        if remaining:
            time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is as good as gone
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _process_started(pid: int) -> float | None:
    """Unix time the process started (from /proc), None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat", encoding="ascii") as overall:
            boot = next(int(line.split()[1]) for line in overall if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def owner_alive(pid: int, made_at: float | None) -> bool:
    """Whether the run that made something at `made_at` (unix time) is still running as `pid`."""
    if pid == os.getpid():
        return True
    if not _alive(pid):
        return False
    started = _process_started(pid)
    return started is None or made_at is None or started <= made_at + 1.0


def _made_at(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def leftovers(ip: str) -> tuple[list[str], list[Path]]:
    """(namespaces, temporary directories) of the prefix scheme whose owner run is gone."""
    namespaces = []
    for name in list_namespaces(ip):
        match = RUN_NAME.match(name)
        if match and not owner_alive(int(match["pid"]), _made_at(NETNS_DIR / name)):
            namespaces.append(name)
    directories = []
    for path in sorted(Path(tempfile.gettempdir()).glob(f"{PREFIX}-*")):
        match = RUN_NAME.match(path.name)
        if match and path.is_dir() and not owner_alive(int(match["pid"]), _made_at(path)):
            directories.append(path)
    return namespaces, directories


def cleanup_leftovers(ip: str) -> tuple[list[str], list[Path]]:
    """Remove what crashed runs left behind (see the module docstring); what was removed."""
    namespaces, directories = leftovers(ip)
    for name in namespaces:
        delete_namespace(ip, name)
    for path in directories:
        shutil.rmtree(path, ignore_errors=True)
    return namespaces, directories
