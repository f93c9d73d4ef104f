"""SIGHUP: what a running wrapper takes up again without a restart.

Theory of operation: an operator (`systemctl reload mqtt-federation`, `kill -HUP PID`), or logrotate's
`postrotate`, sends SIGHUP to say "files have changed". The wrapper then

- reopens its event log at its path, at once: logrotate has renamed the old file, and the lines buffered so
  far are written to it before the new file at the path is opened (created if it is missing);
- loads its configuration again exactly as at start (`load_config` with the same command-line flags, which
  still win over the file): the YAML file read and every field validated, the neighbours' names resolved,
  the key file and the broker password file read. That runs in a worker thread (a resolver or a slow disk
  may take seconds; the loop keeps forwarding meanwhile);
- refuses a configuration that does not validate, with the one line a start would print, and keeps every
  running setting (as `nginx -s reload` does);
- otherwise takes up what can change while it runs (`plan_reload`): the neighbours (new ones greeted, dropped
  ones taken down: `Node.set_configured_neighbours`), the topic policy (the subscriptions mapped again, nothing
  forgotten: policy_subscriptions.py), the log level, the federation keys (a rotation: docs/security.md), the
  broker password (the next connection logs in with it) and the names' resolution interval. What needs a
  restart (the bind address, the broker, the state directory, protocol settings...) is listed in the log and
  in status (`daemon.config.pending_restart`) and left as it runs.

Nothing in custody is touched: the node, its copies, the spool and the journal carry on, so a QoS 1/2 stream
crossing the wrapper during a reload arrives whole. A configuration built in code (tests, tools) has no flags
to load again: SIGHUP then reads its key and password files again, as before issue 38 (`reload_files`).
The running wrapper (running.py) hands over the parts and counts the outcome (`Reloads`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
from dataclasses import dataclass, field

from federation.daemon.broker import BrokerAdapter
from federation.daemon.broker_auth import BrokerAuthError, read_password_file
from federation.daemon.broker_health import BrokerHealth
from federation.daemon.config import DaemonConfig
from federation.daemon.event_log import EventLog, EventLogError
from federation.daemon.keys import KeyFileError, read_key_file
from federation.envelope.config import EnvelopeConfigError
from federation.envelope.datagrams import Envelope
from federation.protocol.types import Address

log = logging.getLogger("federation.daemon")

RESTART_FIELDS: tuple[tuple[str, str], ...] = (
    ("bind", "bind"), ("broker", "broker"), ("client_id", "client_id"), ("vid", "id"), ("name", "name"),
    ("state_dir", "state_dir"), ("event_log", "event_log"), ("event_types", "event_types"),
    ("metrics_port", "metrics_port"), ("metrics_bind", "metrics_bind"), ("max_qos", "max_qos"),
    ("encryption", "encryption"), ("broker_session_expiry", "broker_session_expiry"),
    ("resubscribe_grace", "resubscribe_grace"), ("broker_read_coalesce", "broker_read_coalesce"),
)
"""(DaemonConfig field, its YAML key) of the settings a running wrapper cannot change: a reload reports them"""
RESTART_AUTH_FIELDS: tuple[tuple[str, str], ...] = (
    ("username", "broker_username"), ("password_file", "broker_password_file"), ("tls_ca", "broker_tls_ca"),
    ("tls_cert", "broker_tls_cert"), ("tls_key", "broker_tls_key"),
)


@dataclass
class Reloads:
    """What SIGHUPs did, for the status document."""

    signals: int = 0
    """SIGHUPs handled (counted once each is done: its files taken up, or refused)"""
    failures: int = 0
    """files a reload could not use (the wrapper kept what it had), a refused configuration included"""
    key_rotations: int = 0
    """reloads that installed different federation keys"""
    configurations: int = 0
    """configurations loaded again and taken up"""
    pending_restart: list[str] = field(default_factory=list)
    """settings the file changes that take effect only at the next restart (since the last reload)"""
    last_error: str | None = None
    """why the last refused configuration was refused"""


@dataclass(frozen=True)
class ReloadPlan:
    """What a configuration loaded again changes in a running wrapper (`plan_reload`)."""

    applied: DaemonConfig
    """the running configuration from now on: the new values of what changes at run time, the old ones of the
    rest"""
    neighbours: bool
    policy: bool
    log_level: bool
    keys: bool
    password: bool
    resolve_interval: bool
    pending_restart: tuple[str, ...]
    """the YAML keys whose new values wait for a restart"""


def plan_reload(running: DaemonConfig, loaded: DaemonConfig) -> ReloadPlan:
    """Compare a configuration loaded again with the running one (pure: nothing is applied here)."""
    pending = [key for name, key in RESTART_FIELDS if getattr(running, name) != getattr(loaded, name)]
    pending += [key for name, key in RESTART_AUTH_FIELDS
                if getattr(running.broker_auth, name) != getattr(loaded.broker_auth, name)]
    # A capability measured from /proc moves with the CPU's clock; it is read at start only anyway.
    if dataclasses.replace(running.settings, capability=0) != dataclasses.replace(loaded.settings, capability=0):
        pending.append("settings")
    if loaded.announced != running.announced and "bind" not in pending:
        pending.append(f"bind (this node would announce {loaded.announced}, not {running.announced})")
    neighbours = tuple(address for address in loaded.neighbours if address != running.announced)
    if not loaded.settings.max_datagram and _loopback_only(running) and not _loopback_only(loaded):
        # The node sized its datagrams at start for loopback neighbours only (Settings.with_datagram_for).
        pending.append("settings.max_datagram (chosen at start for loopback neighbours only; a neighbour on "
                       "another host needs datagrams sized for a network path)")
    password = running.broker_auth.password
    if loaded.broker_auth.password_file == running.broker_auth.password_file:
        password = loaded.broker_auth.password
    applied = dataclasses.replace(
        running, neighbours=neighbours, neighbour_names=loaded.neighbour_names,
        neighbour_resolve_interval=loaded.neighbour_resolve_interval, topic_policy=loaded.topic_policy,
        log_level=loaded.log_level, key_file=loaded.key_file, keys=loaded.keys,
        broker_auth=dataclasses.replace(running.broker_auth, password=password),
        config_hash=loaded.config_hash, loaded_at=loaded.loaded_at)
    return ReloadPlan(applied, neighbours != running.neighbours, loaded.topic_policy != running.topic_policy,
                      loaded.log_level != running.log_level, loaded.keys != running.keys,
                      password != running.broker_auth.password,
                      loaded.neighbour_resolve_interval != running.neighbour_resolve_interval, tuple(pending))


def _loopback_only(config: DaemonConfig) -> bool:
    return all(ipaddress.ip_address(address.host).is_loopback for address in (config.announced, *config.neighbours))


def set_log_level(level: str) -> None:
    logging.getLogger().setLevel(getattr(logging, level))


def reopen_event_log(event_log: EventLog | None, counts: Reloads) -> None:
    """The event log at its path again (logrotate renamed the old file); an unusable path keeps the old file."""
    if event_log is None:
        return
    try:
        event_log.reopen()
    except EventLogError as error:
        counts.failures += 1
        log.error("SIGHUP: %s; still writing to the file open before", error)
    else:
        log.info("SIGHUP: event log reopened at %s", event_log.path)


def install_keys(envelope: Envelope, keys: tuple[bytes, ...], key_file: object, counts: Reloads) -> None:
    """Federation keys read again: installed when they differ from those in use (a rotation, counted)."""
    in_use = ", ".join(envelope.key_ids())
    if keys == envelope.config.keys:
        log.info("SIGHUP: key file %s unchanged (ids %s)", key_file, in_use)
        return
    try:
        envelope.replace_keys(keys)
    except EnvelopeConfigError as error:
        counts.failures += 1
        log.error("SIGHUP: kept the federation keys in use (ids %s): %s", in_use, error)
        return
    counts.key_rotations += 1
    log.info("SIGHUP: federation keys read again from %s: ids %s (were %s); the first signs", key_file,
             ", ".join(envelope.key_ids()), in_use)


def install_password(broker: BrokerAdapter, health: BrokerHealth, password: str | None) -> None:
    """A broker password read again: the next connection uses it (made at once if not connected)."""
    auth = dataclasses.replace(broker.auth, password=password)
    broker.update_password(auth)
    health.auth = auth
    log.info("SIGHUP: broker password read again from %s; the next connection to the broker uses it",
             auth.password_file)


def reload_files(config: DaemonConfig, event_log: EventLog | None, envelope: Envelope, broker: BrokerAdapter,
                 health: BrokerHealth, counts: Reloads) -> None:
    """A configuration built in code: reopen the event log, re-read the key file and the broker password file
    (see the module docstring)."""
    counts.signals += 1
    reopen_event_log(event_log, counts)
    if config.key_file is not None:
        try:
            keys = read_key_file(config.key_file)
        except KeyFileError as error:
            counts.failures += 1
            log.error("SIGHUP: kept the federation keys in use (ids %s): %s", ", ".join(envelope.key_ids()), error)
        else:
            install_keys(envelope, keys, config.key_file, counts)
    auth = broker.auth
    if auth.password_file is not None:
        try:
            password = read_password_file(auth.password_file)
        except BrokerAuthError as error:
            counts.failures += 1
            log.error("SIGHUP: kept the broker password in use: %s", error)
            return
        if password != auth.password:
            install_password(broker, health, password)


def describe_neighbours(added: list[Address], removed: list[Address]) -> str:
    parts = []
    if added:
        parts.append("added " + ", ".join(str(address) for address in added))
    if removed:
        parts.append("removed " + ", ".join(str(address) for address in removed))
    return "; ".join(parts) or "unchanged"
