"""What every node of a real federation is given: a broker config, a wrapper config and a command line.

Theory of operation: a node is one Mosquitto broker plus one wrapper, whether
it runs on a loopback address (`federation.tools.launch`), in a network namespace
(`federation.netns`) or in a container. The files and flags are the same in
all of them, only the addresses and directories differ, so they are written
here once: the broker config is `configs/mosquitto.conf` with the lines that
place the broker (listener, log file, persistence directory) replaced, the
wrapper's YAML carries the protocol `settings`, and `wrapper_command` is the
`wrapper.py` invocation with the node's addresses, id, state directory and
event log.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from federation import shipped

log = logging.getLogger(__name__)

REPO_ROOT = shipped.CHECKOUT_ROOT
WRAPPER_SCRIPT = REPO_ROOT / "wrapper.py"
"""the checkout's entry point; an installed package has none and runs WRAPPER_MODULE"""
WRAPPER_MODULE = "federation.daemon.cli"
MOSQUITTO_CONF_TEMPLATE = shipped.ROOT / "configs" / "mosquitto.conf"
BROKER_PORT = 1883
WRAPPER_PORT = 10500

FALLBACK_CONF_LINES = (
    "allow_anonymous true",
    "log_dest topic",
    "log_type all",
    "max_queued_messages 0",
    "max_inflight_messages 1000",
    "persistence false",
)
"""used when configs/mosquitto.conf does not exist"""
REQUIRED_CONF_LINES = ("allow_anonymous true", "log_dest topic", "log_type all")
"""lines the federation needs; added to the rendered config when the template lacks them (`log_type all`
only when the template does not list every type of WRAPPER_LOG_TYPES itself)"""
WRAPPER_LOG_TYPES = tuple(f"log_type {kind}" for kind in
                          ("error", "warning", "notice", "information", "subscribe", "unsubscribe"))
"""every log type whose lines the wrapper reads on $SYS/broker/log (all but debug); one per line"""
_REPLACED_KEYS = frozenset({"listener", "port", "bind_address", "bind_interface", "user", "pid_file",
                            "persistence_location"})
BROKER_RUNNING = re.compile(r"^\d+: mosquitto version \S+ running$", re.MULTILINE)
"""the broker log line that says a broker is accepting connections"""


def mosquitto_template(path: Path | None = None) -> str:
    """The broker config template (configs/mosquitto.conf by default; a minimal one, with a warning, if it
    is missing)."""
    template = path or MOSQUITTO_CONF_TEMPLATE
    try:
        return template.read_text(encoding="utf-8")
    except FileNotFoundError:
        log.warning("broker config template %s is missing: the brokers get a minimal config without its "
                    "tuning (set_tcp_nodelay, the log types without debug), slower under load", template)
        return "\n".join(FALLBACK_CONF_LINES) + "\n"


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
            kept.append(f"# (replaced below by federation.tools.launch) {raw}")
            continue
        kept.append(raw)
    present = {" ".join(raw.split()) for raw in kept if not raw.lstrip().startswith("#")}
    lines = [f"# rendered by federation.tools.launch for {host}:{port}", f"listener {port} {host}", *kept, ""]
    if all(log_type in present for log_type in WRAPPER_LOG_TYPES):
        present.add("log_type all")  # what the wrapper reads, without debug
    lines += [required for required in REQUIRED_CONF_LINES if required not in present]
    lines += [f"log_dest file {node_dir / 'broker.log'}", f"persistence_location {node_dir}/"]
    if run_as_root:
        # Started as root, mosquitto drops to user `mosquitto`, which cannot write the node directory.
        lines.append("user root")
    return "\n".join(lines) + "\n"


def wrapper_yaml(name: str, settings: Mapping[str, Any] | None, writer: str = "federation.tools.launch", *,
                 topics: Sequence[str] | None = None, neighbours: Sequence[str] | None = None) -> str:
    """The wrapper's YAML file: the protocol settings (sorted), the topic policy lines and the neighbours when
    given (None: left out), or an empty mapping for the defaults."""
    lines = [f"# written by {writer} for {name}"]
    if neighbours is not None:
        lines.append("neighbors: " + json.dumps(list(neighbours)))
    if topics is not None:
        lines.append("topics:" + ("" if topics else " []"))
        lines += [f"  - {json.dumps(line)}" for line in topics]
    if settings:
        lines.append("settings:")
        lines += [f"  {key}: {json.dumps(value)}" for key, value in sorted(settings.items())]
    if len(lines) == 1:
        lines.append("{}")
    return "\n".join(lines) + "\n"


def wrapper_program() -> list[str]:
    """What follows the interpreter to start the wrapper: the checkout's wrapper.py (so the code beside it
    runs, whatever else is installed), else the installed module."""
    return [str(WRAPPER_SCRIPT)] if WRAPPER_SCRIPT.is_file() else ["-m", WRAPPER_MODULE]


def wrapper_command(*, config: Path, bind: str, broker: str, vid: int | None, name: str, state_dir: Path,
                    event_log: Path, neighbours: Sequence[str], log_level: str = "INFO",
                    python: str = sys.executable) -> list[str]:
    """The `wrapper.py` command line of one node (neighbours as `host:port`, in the order given)."""
    command = [python, *wrapper_program(), "--config", str(config)]
    if neighbours:
        command += ["--neighbors", ",".join(neighbours)]
    command += ["--bind", bind, "--broker", broker]
    if vid is not None:
        command += ["--id", str(vid)]
    command += ["--name", name, "--state-dir", str(state_dir), "--event-log", str(event_log),
                "--log-level", log_level]
    return command


def broker_running_since(log: Path, offset: int) -> bool:
    """True once the broker log, read from byte `offset`, says the broker is running."""
    try:
        with open(log, "rb") as handle:
            handle.seek(offset)
            return BROKER_RUNNING.search(handle.read().decode(errors="replace")) is not None
    except FileNotFoundError:
        return False


def log_size(log: Path) -> int:
    """Bytes in a log so far (0 if absent): the offset from which to look for this start's lines."""
    try:
        return log.stat().st_size
    except FileNotFoundError:
        return 0
