"""The interface between the scenario driver and a place where real nodes run.

Theory of operation: a scenario says *what* happens (subscribe here, cut
that link, kill this wrapper); `federation.harness.driver` turns it into a
timeline of actions, keeps the ground truth and builds the report. *How* a
node is made, and how a link is cut, differs per backend: network namespaces
(`federation.netns`), LXD containers (`federation.lxd`, later). A backend
implements `Platform`; the driver calls nothing else. Every method is
blocking and called from the driver's main thread, except `statuses`,
which the driver's status poller calls from its own thread while the main
thread may call it too (so it must be thread-safe, and must not spawn
processes: PR_SET_PDEATHSIG is tied to the spawning thread).

Life cycle, in the order the driver calls it:

1. `preflight(plans, links)`: refuse, before anything is created, what cannot
   run here (not root, a tool missing, a topology too large for the machine),
   by raising `PlatformUnavailable` with a message a person can act on.
2. `create(plans, links)`: make the nodes (hosts with their own address
   each), the links between neighbours and empty packet filters; write each
   node's broker config and wrapper YAML. Nothing runs yet.
3. `start_broker(name)` for every node (returns when the broker accepts
   connections), then `start_wrapper(name)` for every node (returns at once;
   the driver waits for readiness through `statuses`).
4. During the run: `start_client` (a `mosquitto_sub`, or a `mosquitto_pub -l`
   fed line by line through its stdin, on a node, talking to that node's
   broker at 127.0.0.1:1883, its output appended to a file on this machine), `stop_wrapper` / `start_wrapper`
   (kill -9 and restart), `stop_broker` / `start_broker`, and
   `set_inbound(name, filters)`: the complete set of packet filters for
   traffic *arriving* at `name` from each neighbour (cut, loss percent).
   The driver computes the filters from the scenario's cut/heal/loss
   semantics; the platform only installs them, replacing the previous set.
5. `stop_all()`: SIGTERM every wrapper (they leave cleanly and flush their
   event logs), then every broker.
6. `collect(name, dest)`: copy the node's files (event log `events.jsonl`,
   `broker.log`, `wrapper.log`, configs) into `dest`, a directory on this
   machine; returns the local path of the event log copy.
7. `destroy()`: remove everything `create` made (processes, hosts, links,
   rules, temporary directories). Idempotent, never raises, safe to call
   after a failure at any step, and also from a signal handler's unwinding.

Addresses: `address(name)` is the host the node's wrapper binds and its
neighbours send to (UDP port `WRAPPER_PORT`); the broker listens on the
node's loopback (127.0.0.1:1883), where the node's clients connect.
"""

from __future__ import annotations

import abc
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from federation.scenario.loader import ScenarioError

StatusDocument = dict[str, Any]


class PlatformUnavailable(ScenarioError):
    """The scenario cannot run on this backend here (not root, tool missing, too large): CLI exit status 2.

    A subclass of ScenarioError so that `python -m federation.scenario run`
    prints it as `error: ...` and exits 2 instead of reporting a crash.
    """


class PlatformError(Exception):
    """A platform operation failed while running (a process did not start, a command failed)."""


@dataclass(frozen=True)
class NodePlan:
    """One node as the driver wants it: everything a platform needs to make it."""

    name: str
    index: int
    """position in the scenario's node list, from 0"""
    vid: int
    """the wrapper's virtual id (`--id`)"""
    neighbours: tuple[str, ...]
    """names of the node's neighbours (the scenario's links), sorted"""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """protocol settings for the wrapper's YAML (`settings:`)"""


@dataclass(frozen=True)
class InboundFilter:
    """What happens to packets arriving at a node from one neighbour."""

    cut: bool = False
    """drop every packet"""
    loss: float = 0.0
    """percent of packets dropped at random (0-100), when not cut"""

    @property
    def active(self) -> bool:
        return self.cut or self.loss > 0


class Platform(abc.ABC):
    """Where real nodes run; see the module docstring for the life cycle and the threading rule."""

    backend: str = "?"
    """the backend name the report carries (`netns`, `lxd`)"""
    workdir: Path
    """a directory on this machine for the run's files (client outputs go to workdir/clients)"""

    @abc.abstractmethod
    def preflight(self, plans: Sequence[NodePlan], links: Sequence[tuple[str, str]]) -> None:
        """Raise PlatformUnavailable if this run cannot happen here; create nothing."""

    @abc.abstractmethod
    def create(self, plans: Sequence[NodePlan], links: Sequence[tuple[str, str]]) -> None:
        """Make the hosts, links, addresses, empty filters and config files; start nothing."""

    @abc.abstractmethod
    def address(self, name: str) -> str:
        """The node's wrapper host (its neighbours send to address:WRAPPER_PORT)."""

    @abc.abstractmethod
    def start_broker(self, name: str) -> None:
        """Start the node's Mosquitto and return once it accepts connections; PlatformError if it does not."""

    @abc.abstractmethod
    def stop_broker(self, name: str, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL) the node's broker and wait for it; nothing if it is not running."""

    @abc.abstractmethod
    def start_wrapper(self, name: str) -> None:
        """Start the node's wrapper (same config, state directory and event log every time); do not wait."""

    @abc.abstractmethod
    def stop_wrapper(self, name: str, kill: bool = False) -> int | None:
        """SIGTERM (clean leave) or SIGKILL (crash) the wrapper; its exit status, None if it was not running."""

    @abc.abstractmethod
    def wrapper_running(self, name: str) -> bool:
        """Whether the node's wrapper process is alive."""

    @abc.abstractmethod
    def wrapper_diagnostics(self, name: str) -> str:
        """The ends of the node's logs, for error messages."""

    @abc.abstractmethod
    def statuses(self, names: Sequence[str], timeout: float) -> dict[str, StatusDocument | None]:
        """Each named wrapper's status document, None where no reply came within `timeout` s.

        Called from the driver's poller thread and from its main thread: must
        be thread-safe and must not spawn processes.
        """

    @abc.abstractmethod
    def start_client(self, name: str, argv: Sequence[str], output: Path,
                     stdin: bool = False) -> subprocess.Popen[bytes]:
        """Run an MQTT client command on the node (its broker is 127.0.0.1:1883 there); stdout+stderr
        are appended to `output` on this machine. With `stdin`, the driver writes the process's stdin
        (`mosquitto_pub -l`). The driver stops it with terminate() / kill(), or by closing stdin."""

    @abc.abstractmethod
    def set_inbound(self, name: str, filters: Mapping[str, InboundFilter]) -> None:
        """Replace the packet filters for traffic arriving at `name`: neighbour name -> filter
        (neighbours not listed pass everything)."""

    def set_inbound_many(self, filters: Mapping[str, Mapping[str, InboundFilter]]) -> None:
        """`set_inbound` for several nodes at once (all the changes of one event); a platform may apply
        them in parallel, so the change is complete sooner. The default applies them one by one."""
        for name in sorted(filters):
            self.set_inbound(name, filters[name])

    @abc.abstractmethod
    def stop_all(self) -> None:
        """SIGTERM every wrapper and wait, then every broker: wrappers flush their event logs."""

    @abc.abstractmethod
    def collect(self, name: str, dest: Path) -> Path:
        """Copy the node's files into `dest` (created); the local path of its event log copy."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Remove everything this platform made. Idempotent; never raises."""
