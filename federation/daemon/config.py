"""The wrapper's configuration: YAML file, command-line flags, defaults, in that order of weakness.

Theory of operation: `load_config` merges three layers (built-in defaults,
the YAML file, then the flags that were actually given) into one raw
mapping, validates every field with a message that names the field and says
what to write instead, and only then touches the network: it resolves
neighbour names to addresses (the node compares the *source address* of
datagrams with its neighbour list, so names must become the addresses
packets come from) and works out the address this node announces. Any
problem raises `ConfigError`; the CLI prints it and exits with status 2
before anything is bound or connected.

`sample_yaml()` renders `configs/wrapper.yaml`, so the file that documents
every setting is generated from the same tables that validate them (a test
checks they agree).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import ipaddress
import os
import socket
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from federation.daemon import read_coalescing, wrapper_events
from federation.daemon.broker_auth import DEFAULT_TLS_PORT, BrokerAuth, BrokerAuthError, load_broker_auth
from federation.daemon.environment import EnvironmentSettingError, environment_values, variable
from federation.daemon.keys import KeyFileError, read_key_file
from federation.daemon.topic_policy import EVERYTHING, SYNTAX, TopicLineError, TopicPolicy, parse_line
from federation.envelope.config import ENCRYPTION_NONE, ENCRYPTIONS
from federation.protocol import events
from federation.protocol.placement import capability
from federation.protocol.publication_events import PER_PUBLICATION_NAMES
from federation.protocol.settings import Settings, SettingsError
from federation.protocol.types import Address

DEFAULT_SESSION_EXPIRY = 3600
"""seconds the broker keeps the wrapper's session (queues its QoS 1/2 messages and log lines, keeps its half of
the unfinished injections) after a disconnection"""
MIN_SESSION_EXPIRY = 60
MAX_SESSION_EXPIRY = 2**32 - 1
"""MQTT's largest session expiry interval: the session never expires"""
DEFAULT_RESUBSCRIBE_GRACE = 30.0
DEFAULT_RESOLVE_INTERVAL = 60.0
"""seconds between resolutions of the neighbours given by name"""
MAX_RESOLVE_INTERVAL = 86400.0
MAX_RESUBSCRIBE_GRACE = 86400.0
DEFAULT_PORT = 10500
"""UDP port of the overlay, for --bind and for neighbours given without a port."""
DEFAULT_BIND = "0.0.0.0:10500"
DEFAULT_BROKER = "127.0.0.1:1883"
DEFAULT_BROKER_PORT = 1883
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
MAX_VID = 2**31

Resolver = Callable[[str, int, int], str]
"""(host, port, family) -> numeric host; raises OSError when the name does not resolve."""


class ConfigError(ValueError):
    """A bad configuration value; the message names the field and says how to fix it (exit status 2)."""


@dataclass(frozen=True)
class Field:
    """One top-level key of wrapper.yaml (and the flag that overrides it)."""

    key: str
    flag: str | None
    default: Any
    help: str


FIELDS: tuple[Field, ...] = (
    Field("neighbors", "--neighbors", [],
          "neighbour wrappers, HOST[:PORT] each (port 10500 if omitted); names are resolved at start, every "
          "neighbour_resolve_interval and on SIGHUP, which also reads this list again. Alias: neighbours / "
          "--neighbours"),
    Field("neighbour_resolve_interval", None, DEFAULT_RESOLVE_INTERVAL,
          f"seconds between resolutions of the neighbours given by name (0 to {MAX_RESOLVE_INTERVAL:g}; 0: only at "
          f"start and on SIGHUP): a neighbour whose address changed is reached at the new one, the old link goes "
          f"down"),
    Field("topics", "--topic", [],
          "topic policy: the lines of a Mosquitto bridge's `topic` option, one string each, quoted ('" + SYNTAX
          + "'); the federation is the bridge's remote side. A publication leaves this broker only where an out or "
          "both line matches it, and is injected here only where an in or both line does, its topic mapped through "
          "the prefixes, its QoS at most the line's. [] is `# both 2`: everything, both ways, as it is. Read again "
          "on SIGHUP (docs/topic-policies.md). --topic is repeatable; given, it replaces this list"),
    Field("bind", "--bind", DEFAULT_BIND,
          "UDP address HOST[:PORT] to listen on; it is also the address this node announces, "
          "unless it is 0.0.0.0 (then: the local address that reaches the first neighbour)"),
    Field("broker", "--broker", DEFAULT_BROKER,
          "the local Mosquitto broker, HOST[:PORT] (MQTT v5 over TCP; port 1883, or 8883 with TLS, if omitted). "
          "No credentials in it (user:password@host is refused): see broker_username and broker_password_file"),
    Field("broker_username", "--broker-username", None,
          "user name the wrapper logs in to its broker with (null: anonymous); the broker's ACL must let it read "
          "$SYS/broker/log/# and read and write # (configs/mosquitto.conf, PRODUCTION)"),
    Field("broker_password_file", "--broker-password-file", None,
          "file whose first line is the broker password of broker_username (chmod 600; never on the command line). "
          "Re-read on SIGHUP (null: no password)"),
    Field("broker_tls_ca", "--broker-tls-ca", None,
          "PEM file of the CA that signed the broker's certificate: the connection uses TLS, and the certificate "
          "must name the broker host (null: no TLS, unless broker_tls_cert is given; then the system's CAs)"),
    Field("broker_tls_cert", "--broker-tls-cert", None,
          "PEM client certificate the wrapper presents to the broker (TLS; needs broker_tls_key)"),
    Field("broker_tls_key", "--broker-tls-key", None,
          "PEM private key of broker_tls_cert, not encrypted (chmod 600)"),
    Field("id", "--id", None,
          "virtual id (0 .. 2^31-1) used in elections: the lowest id becomes management core; "
          "null picks a random one at every start"),
    Field("name", "--name", None, "a label shown in status and written in node_started events"),
    Field("state_dir", "--state-dir", None,
          "directory for the boot epoch and the local subscription table (null: no persistence)"),
    Field("event_log", "--event-log", None, "JSON-lines event trace file, appended to (null: none)"),
    Field("event_types", None, None,
          "event types written to event_log (null: all); one of: " + ", ".join(events.ALL + wrapper_events.ALL)
          + " (the version 1 names " + ", ".join(sorted(PER_PUBLICATION_NAMES.values())) + " name their runs)"),
    Field("metrics_port", "--metrics-port", None, "Prometheus metrics TCP port (null: no metrics server)"),
    Field("metrics_bind", None, None,
          "address of the metrics server (null: the bind host, or 0.0.0.0 when bound to 0.0.0.0)"),
    Field("log_level", "--log-level", "INFO", "human log level on stderr: " + ", ".join(LOG_LEVELS)),
    Field("max_qos", None, 2, "cap for the QoS of publications injected into the local broker (0, 1 or 2)"),
    Field("client_id", "--client-id", None,
          "MQTT client id of the wrapper's broker connection (null: federation-wrapper-<bind host>-<port>)"),
    Field("key_file", "--key-file", None,
          "file with the federation key(s), one per line, hex or base64 (`federation-wrapper genkey > FILE`); "
          "the first signs, all are accepted. null: the overlay is OPEN (no authentication: lab use only)"),
    Field("encryption", "--encryption", ENCRYPTION_NONE,
          "payload encryption between wrappers: " + " or ".join(ENCRYPTIONS) + " (encryption needs key_file)"),
    Field("broker_session_expiry", None, DEFAULT_SESSION_EXPIRY,
          f"seconds the broker keeps the wrapper's MQTT session after a disconnection ({MIN_SESSION_EXPIRY} to "
          f"{MAX_SESSION_EXPIRY}): meanwhile it queues the local publications and log lines for the wrapper and "
          f"keeps its half of the unfinished injections, so a wrapper or connection that is down for less loses "
          f"nothing"),
    Field("resubscribe_grace", None, DEFAULT_RESUBSCRIBE_GRACE,
          "seconds, after the broker restarted (it lost the wrapper's session, and its clients' subscriptions), "
          "during which the wrapper keeps the filters it knew as interest and holds their publications until a "
          "matching subscription is logged again; then they are dropped (no_subscriber_after_broker_restart)"),
    Field("broker_read_coalesce", None, read_coalescing.DEFAULT_SECONDS,
          f"seconds the wrapper lets its broker's packets gather between read passes while they come faster than "
          f"{read_coalescing.MIN_RATE:,.0f} a second (0 to {read_coalescing.MAX_SECONDS:g}; 0: read each as soon as "
          f"it comes): less CPU per publication at high rates, for at most this much latency at those rates only"),
    Field("allow_other_wrappers", "--allow-other-wrappers", False,
          "start even when another federation wrapper holds a record on this broker (false: refuse, exit status 2, "
          "naming it; two wrappers on one broker each take the other's subscription to # for a client's: "
          "federation.daemon.other_wrappers)"),
)
KNOWN_KEYS = frozenset(f.key for f in FIELDS) | {"neighbours", "settings"}


@dataclass(frozen=True)
class DaemonConfig:
    """A validated, resolved configuration: everything the runtime needs, nothing left to parse."""

    bind: Address
    """numeric host and port the UDP socket binds"""
    announced: Address
    """the node's address in the protocol (its identity)"""
    neighbours: tuple[Address, ...]
    """resolved (numeric) neighbour addresses"""
    broker: Address
    client_id: str
    vid: int | None = None
    name: str | None = None
    state_dir: Path | None = None
    event_log: Path | None = None
    event_types: frozenset[str] | None = None
    metrics_port: int | None = None
    metrics_bind: str = "0.0.0.0"
    log_level: str = "INFO"
    max_qos: int = 2
    settings: Settings = field(default_factory=Settings)
    config_file: Path | None = None
    key_file: Path | None = None
    broker_auth: BrokerAuth = field(default_factory=BrokerAuth)
    """how the wrapper logs in to its broker (user, password, TLS); the default is anonymous without TLS"""
    keys: tuple[bytes, ...] = field(default=(), repr=False)
    """federation keys read from key_file (the first signs); empty: open overlay"""
    encryption: str = ENCRYPTION_NONE
    broker_session_expiry: int = DEFAULT_SESSION_EXPIRY
    """seconds the broker keeps the wrapper's session after a disconnection"""
    resubscribe_grace: float = DEFAULT_RESUBSCRIBE_GRACE
    """seconds to hold publications for the filters known before a broker restart"""
    broker_read_coalesce: float = read_coalescing.DEFAULT_SECONDS
    """seconds between read passes from the broker at high rates (federation.daemon.read_coalescing); 0: off"""
    topic_policy: TopicPolicy = EVERYTHING
    """what crosses in which direction, under which topic (federation.daemon.topic_policy); no lines: everything"""
    neighbour_names: tuple[tuple[Address, Address], ...] = ()
    """each neighbour as given (a name unresolved) with the address it resolved to, for resolving them again
    (neighbour_names.py); empty when built in code"""
    neighbour_resolve_interval: float = DEFAULT_RESOLVE_INTERVAL
    """seconds between resolutions of `neighbour_names` (0: only at start and on SIGHUP)"""
    flags: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    """the command-line values `load_config` was given, to load the configuration again on SIGHUP; None for a
    config built in code (SIGHUP then only reads the key and password files again)"""
    config_hash: str | None = None
    """SHA-256 of the YAML file as read (hex); None without one"""
    loaded_at: float = field(default_factory=time.time, compare=False)
    """unix time this configuration was read"""
    allow_other_wrappers: bool = False
    """start even when another wrapper holds a record on the broker (federation.daemon.other_wrappers)"""

    @property
    def family(self) -> socket.AddressFamily:
        return family_of(self.bind.host)

    @property
    def publication_events(self) -> bool:
        """Whether the node should make the events of what happens to publications (`Node.publication_events`):
        only for an event log that keeps at least one of them."""
        return self.event_log is not None and (
            self.event_types is None or bool(self.event_types & events.PER_PUBLICATION))


def family_of(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def is_wildcard(host: str) -> bool:
    return host in ("0.0.0.0", "::", "")


def default_resolver(host: str, port: int, family: int) -> str:
    infos = socket.getaddrinfo(host, port, family, socket.SOCK_DGRAM)
    if not infos:
        raise OSError(f"no {socket.AddressFamily(family).name} address")
    return str(infos[0][4][0])


def route_source(target: Address, family: int) -> str:
    """The local address the kernel would send from to reach `target` (UDP connect: no packet is sent)."""
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((target.host, target.port))
        return str(probe.getsockname()[0])


def read_yaml(path: Path) -> dict[str, Any]:
    """The YAML file as a mapping; ConfigError naming the file for a missing file or a syntax error."""
    return read_yaml_and_hash(path)[0]


def read_yaml_and_hash(path: Path) -> tuple[dict[str, Any], str]:
    """`read_yaml`, and the SHA-256 of the bytes it read (hex): the running configuration's hash in status."""
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    except FileNotFoundError:
        raise ConfigError(f"--config: file {str(path)!r} not found; give the path of a wrapper.yaml "
                          f"(`federation-configs show wrapper.yaml` prints a documented one)") from None
    except OSError as error:
        raise ConfigError(f"--config: cannot read {str(path)!r}: {error.strerror or error}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}".replace("\n", " ")) from None
    digest = hashlib.sha256(raw).hexdigest()
    if data is None:
        return {}, digest
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings (key: value lines), got {type(data).__name__}")
    return data, digest


def load_config(flags: Mapping[str, Any], resolver: Resolver = default_resolver,
                source_for: Callable[[Address, int], str] = route_source,
                environ: Mapping[str, str] | None = None) -> DaemonConfig:
    """Merge defaults, the YAML file named by flags["config"], the MQTT_FEDERATION_* environment variables
    (`environ`, default os.environ: federation.daemon.environment) and the given flags; validate; resolve.

    `flags` maps YAML keys to command-line values; None means "not given".
    """
    loaded_at = time.time()
    config_path = Path(flags["config"]) if flags.get("config") else None
    file_values, config_hash = read_yaml_and_hash(config_path) if config_path is not None else ({}, None)
    where = str(config_path) if config_path is not None else "config"
    unknown = sorted(str(key) for key in file_values if key not in KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; known keys are: {', '.join(sorted(KNOWN_KEYS))}")
    if "neighbors" in file_values and "neighbours" in file_values:
        raise ConfigError(f"{where}: both 'neighbors' and 'neighbours' given; keep one")
    if "neighbours" in file_values:
        file_values["neighbors"] = file_values.pop("neighbours")

    # name -> (value, where it came from, for messages)
    merged: dict[str, tuple[Any, str]] = {f.key: (f.default, f"default {f.key}") for f in FIELDS}
    for key, given in file_values.items():
        if key != "settings":
            merged[key] = (given, f"{where}: {key}")
    try:
        environment = environment_values(os.environ if environ is None else environ, [f.key for f in FIELDS])
    except EnvironmentSettingError as error:
        raise ConfigError(str(error)) from None
    merged.update(environment.values)
    for spec in FIELDS:
        if spec.flag is not None and flags.get(spec.key) is not None:
            merged[spec.key] = (flags[spec.key], spec.flag)

    def value(key: str) -> Any:
        return merged[key][0]

    def origin(key: str) -> str:
        return merged[key][1]

    try:
        settings = Settings.from_mapping({**(_mapping(file_values.get("settings"), f"{where}: settings") or {}),
                                          **environment.settings},
                                         where=f"{where}: settings" if not environment.settings
                                         else f"{where}: settings, with {variable('settings')}")
    except SettingsError as error:
        raise ConfigError(str(error)) from None
    settings = measured_capability(settings, f"{where}: settings")

    bind_text = _text(value("bind"), origin("bind"), "HOST[:PORT], e.g. 0.0.0.0:10500")
    bind_raw = _address(bind_text, DEFAULT_PORT, origin("bind"))
    broker_username = _optional_text(value("broker_username"), origin("broker_username"))
    try:
        broker_auth = load_broker_auth(broker_username, _optional_path(value("broker_password_file"),
                                                                       origin("broker_password_file")),
                                       _optional_path(value("broker_tls_ca"), origin("broker_tls_ca")),
                                       _optional_path(value("broker_tls_cert"), origin("broker_tls_cert")),
                                       _optional_path(value("broker_tls_key"), origin("broker_tls_key")))
    except BrokerAuthError as error:
        raise ConfigError(str(error)) from None
    broker = _broker_address(_text(value("broker"), origin("broker"), "HOST[:PORT], e.g. 127.0.0.1:1883"),
                             DEFAULT_TLS_PORT if broker_auth.tls else DEFAULT_BROKER_PORT, origin("broker"))
    neighbour_texts = _neighbour_list(value("neighbors"), origin("neighbors"))
    neighbour_raw = [_address(text, DEFAULT_PORT, origin("neighbors")) for text in neighbour_texts]
    vid = _optional_int(value("id"), origin("id"), 0, MAX_VID - 1, "a whole number from 0 to 2147483647")
    name = _optional_text(value("name"), origin("name"))
    state_dir = _optional_path(value("state_dir"), origin("state_dir"))
    event_log = _optional_path(value("event_log"), origin("event_log"))
    event_types = _event_types(value("event_types"), origin("event_types"))
    metrics_port = _optional_int(value("metrics_port"), origin("metrics_port"), 1, 65535, "a TCP port 1-65535")
    metrics_bind = _optional_text(value("metrics_bind"), origin("metrics_bind"))
    log_level = _log_level(value("log_level"), origin("log_level"))
    max_qos = _optional_int(value("max_qos"), origin("max_qos"), 0, 2, "0, 1 or 2")
    client_id = _optional_text(value("client_id"), origin("client_id"))
    key_file = _optional_path(value("key_file"), origin("key_file"))
    encryption = _encryption(value("encryption"), origin("encryption"))
    session_expiry = _optional_int(value("broker_session_expiry"), origin("broker_session_expiry"),
                                   MIN_SESSION_EXPIRY, MAX_SESSION_EXPIRY,
                                   f"whole seconds from {MIN_SESSION_EXPIRY} to {MAX_SESSION_EXPIRY} (how long the "
                                   f"broker keeps the wrapper's session; the default {DEFAULT_SESSION_EXPIRY} rides "
                                   f"out a wrapper restart)")
    resubscribe_grace = _seconds(value("resubscribe_grace"), origin("resubscribe_grace"), MAX_RESUBSCRIBE_GRACE,
                                 f"seconds above 0 and at most {MAX_RESUBSCRIBE_GRACE:g} (how long clients of a "
                                 f"restarted broker get to subscribe again; default {DEFAULT_RESUBSCRIBE_GRACE:g})")
    read_coalesce = _seconds_or_zero(value("broker_read_coalesce"), origin("broker_read_coalesce"),
                                     read_coalescing.MAX_SECONDS,
                                     f"seconds from 0 to {read_coalescing.MAX_SECONDS:g} (0 turns the gathering off; "
                                     f"default {read_coalescing.DEFAULT_SECONDS:g})")
    topic_policy = _topic_policy(value("topics"), origin("topics"))
    allow_other_wrappers = _boolean(value("allow_other_wrappers"), origin("allow_other_wrappers"))
    resolve_interval = _seconds_or_zero(value("neighbour_resolve_interval"), origin("neighbour_resolve_interval"),
                                        MAX_RESOLVE_INTERVAL,
                                        f"seconds from 0 to {MAX_RESOLVE_INTERVAL:g} (0: resolve names only at start "
                                        f"and on SIGHUP; default {DEFAULT_RESOLVE_INTERVAL:g})")
    keys: tuple[bytes, ...] = ()
    if key_file is not None:
        try:
            keys = read_key_file(key_file)
        except KeyFileError as error:
            raise ConfigError(f"{origin('key_file')}: {error}") from None
    elif encryption != ENCRYPTION_NONE:
        raise ConfigError(f"{origin('encryption')}: {encryption} needs a federation key; give key_file "
                          f"(--key-file), made with `federation-wrapper genkey > federation.key`")
    if state_dir is not None and state_dir.exists() and not state_dir.is_dir():
        raise ConfigError(f"{origin('state_dir')}: {str(state_dir)!r} exists and is not a directory; "
                          f"give a directory (it is created if missing)")
    if event_log is not None and event_log.is_dir():
        raise ConfigError(f"{origin('event_log')}: {str(event_log)!r} is a directory; give a file path")

    # Resolution: names become the numeric addresses datagrams come from.
    family = family_of(bind_raw.host)
    bind_host = bind_raw.host
    if not is_wildcard(bind_host):
        bind_host = _resolve(resolver, bind_raw, family, origin("bind"), "bind")
    bind = Address(bind_host, bind_raw.port)
    neighbours: list[Address] = []
    names: list[tuple[Address, Address]] = []
    for text, raw in zip(neighbour_texts, neighbour_raw, strict=True):
        resolved = resolve_neighbour(resolver, raw, family, origin("neighbors"), text)
        names.append((raw, resolved))
        if resolved not in neighbours:
            neighbours.append(resolved)
    if is_wildcard(bind.host):
        if neighbours:
            try:
                announced_host = source_for(neighbours[0], family)
            except OSError as error:
                raise ConfigError(
                    f"{origin('bind')}: bound to {bind.host} and no local address reaches the first neighbour "
                    f"{neighbours[0]} ({error.strerror or error}); give this host's address with --bind") from None
        else:
            announced_host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
        announced = Address(announced_host, bind.port)
    else:
        announced = bind
    neighbours = [n for n in neighbours if n != announced]
    metrics_host = metrics_bind if metrics_bind is not None else (
        "0.0.0.0" if is_wildcard(bind.host) else bind.host)
    return DaemonConfig(
        bind=bind, announced=announced, neighbours=tuple(neighbours), broker=broker,
        client_id=client_id or f"federation-wrapper-{bind_raw.host}-{bind_raw.port}",
        vid=vid, name=name, state_dir=state_dir, event_log=event_log, event_types=event_types,
        metrics_port=metrics_port, metrics_bind=metrics_host, log_level=log_level,
        max_qos=2 if max_qos is None else max_qos, settings=settings, config_file=config_path,
        key_file=key_file, broker_auth=broker_auth, keys=keys, encryption=encryption,
        broker_session_expiry=DEFAULT_SESSION_EXPIRY if session_expiry is None else session_expiry,
        resubscribe_grace=resubscribe_grace, broker_read_coalesce=read_coalesce, topic_policy=topic_policy,
        neighbour_names=tuple(names), neighbour_resolve_interval=resolve_interval, flags=dict(flags),
        config_hash=config_hash, loaded_at=loaded_at, allow_other_wrappers=allow_other_wrappers,
    )


def resolve_neighbour(resolver: Resolver, raw: Address, family: int, where: str, text: str | None = None) -> Address:
    """A neighbour as given (`HOST[:PORT]`, the host a name or an address) as the numeric address datagrams come
    from; ConfigError naming it when the name does not resolve."""
    return Address(_resolve(resolver, raw, family, where, f"neighbour {text or str(raw)!r}"), raw.port)


# ------------------------------------------------------------------ field validators


def measured_capability(settings: Settings, where: str, proc: Path = Path("/proc")) -> Settings:
    """With `replication_root: capability` and no `capability` given, measure C = a·L + b·M at start-up
    from /proc/cpuinfo and /proc/meminfo (seed 001's recipe); other settings are returned unchanged."""
    if settings.replication_root != "capability" or settings.capability > 0:
        return settings
    try:
        cpuinfo = (proc / "cpuinfo").read_text(encoding="utf-8", errors="replace")
        meminfo = (proc / "meminfo").read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise ConfigError(f"{where}.capability: cannot measure it ({error.strerror or error} reading {proc}); "
                          f"give this node's capability as a number > 0") from None
    value = capability(cpuinfo, meminfo, settings.capability_cpu_weight, settings.capability_memory_weight)
    if value <= 0:
        raise ConfigError(f"{where}.capability: {proc}/cpuinfo and {proc}/meminfo give no CPU speed or memory "
                          f"(C = 0); give this node's capability as a number > 0")
    return dataclasses.replace(settings, capability=value)


def _mapping(value: Any, where: str) -> Mapping[str, Any] | None:
    if value is None or isinstance(value, dict):
        return value
    raise ConfigError(f"{where}: expected a mapping of setting: value lines, got {value!r}")


def _text(value: Any, where: str, expected: str) -> str:
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise ConfigError(f"{where}: expected {expected}, got {value!r}")


def _address(text: str, default_port: int, where: str) -> Address:
    try:
        return Address.parse(text, default_port)
    except ValueError as error:
        raise ConfigError(f"{where}: {error}; write HOST or HOST:PORT (IPv6 as [ADDR]:PORT)") from None


def _broker_address(text: str, default_port: int, where: str) -> Address:
    """The broker's HOST[:PORT]; an address with credentials or a URL scheme is refused without echoing it (the
    password would be in the message, and so in the journal)."""
    if "@" in text:
        raise ConfigError(f"{where}: the broker address holds credentials (USER:PASSWORD@HOST); they are refused "
                          f"there because the command line and wrapper.yaml are readable and end up in logs. Give "
                          f"the broker as HOST[:PORT], the user with broker_username (--broker-username) and the "
                          f"password in a file named by broker_password_file (--broker-password-file)")
    if "://" in text:
        raise ConfigError(f"{where}: give the broker as HOST[:PORT], without a scheme such as mqtt:// or mqtts://; "
                          f"TLS is asked for with broker_tls_ca (--broker-tls-ca)")
    return _address(text, default_port, where)


def _neighbour_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        items: list[Any] = [part for part in value.split(",") if part.strip()]
    elif isinstance(value, Sequence):
        items = list(value)
    else:
        raise ConfigError(f"{where}: expected a list of HOST[:PORT] (or a comma-separated string), got {value!r}")
    texts = []
    for index, item in enumerate(items):
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(f"{where}[{index}]: expected HOST[:PORT], got {item!r}")
        texts.append(item.strip())
    return texts


def _optional_int(value: Any, where: str, low: int, high: int, expected: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{where}: expected {expected}, got {value!r}")
    return value


def _number_from_text(value: Any) -> Any:
    """A number written as text (an environment variable, a flag) as the number; anything else as it is."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return float(value.strip())
    return value


def _seconds(value: Any, where: str, high: float, expected: str) -> float:
    value = _number_from_text(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= high:
        raise ConfigError(f"{where}: expected {expected}, got {value!r}")
    return float(value)


def _seconds_or_zero(value: Any, where: str, high: float, expected: str) -> float:
    """`_seconds`, where 0 is allowed too (it turns the feature off)."""
    value = _number_from_text(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
        return 0.0
    return _seconds(value, where, high, expected)


def _boolean(value: Any, where: str) -> bool:
    """true or false; also as text (an environment variable): true/false, yes/no, 1/0."""
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "1", "false", "no", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    return value


def _optional_text(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
        return str(value).strip()
    raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")


def _optional_path(value: Any, where: str) -> Path | None:
    text = _optional_text(value, where)
    return None if text is None else Path(text)


def _event_types(value: Any, where: str) -> frozenset[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{where}: expected a list of event types, got {value!r}")
    known = events.ALL + wrapper_events.ALL
    renamed = {single: run for run, single in PER_PUBLICATION_NAMES.items()}
    chosen = []
    for item in value:
        item = renamed.get(item, item)  # a version 1 name: the same events, one per run since version 2
        if item not in known:
            raise ConfigError(f"{where}: unknown event type {item!r}; known types are: {', '.join(known)}")
        chosen.append(item)
    return frozenset(chosen)


def _topic_policy(value: Any, where: str) -> TopicPolicy:
    """The `topics` list (or `--topic` flags): each line parsed as Mosquitto parses a bridge's `topic` line."""
    if value is None:
        return EVERYTHING
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise ConfigError(f"{where}: expected a list of topic lines ('{SYNTAX}'), got {value!r}")
    lines = []
    for index, item in enumerate(items):
        if not isinstance(item, str):
            hint = (": in YAML a line that starts with # is a comment, quote it ('# both 2')"
                    if item is None else "")
            raise ConfigError(f"{where}[{index}]: expected a topic line, a string '{SYNTAX}', got {item!r}{hint}")
        try:
            lines.append(parse_line(item))
        except TopicLineError as error:
            line = where if where.startswith("--") else f"{where}[{index}]"  # --topic, or wrapper.yaml: topics[2]
            raise ConfigError(f"{line} {item!r}: {error}") from None
    return TopicPolicy(tuple(lines))


def _encryption(value: Any, where: str) -> str:
    if isinstance(value, str) and value.strip().lower() in ENCRYPTIONS:
        return value.strip().lower()
    raise ConfigError(f"{where}: expected one of {', '.join(ENCRYPTIONS)}, got {value!r}")


def _log_level(value: Any, where: str) -> str:
    if isinstance(value, str) and value.strip().upper() in LOG_LEVELS:
        return value.strip().upper()
    raise ConfigError(f"{where}: expected one of {', '.join(LOG_LEVELS)}, got {value!r}")


def _resolve(resolver: Resolver, address: Address, family: int, where: str, what: str) -> str:
    host = address.host
    try:
        parsed = ipaddress.ip_address(host)
    except ValueError:
        parsed = None
    if parsed is not None:
        if (parsed.version == 6) != (family == socket.AF_INET6):
            raise ConfigError(f"{where}: {what} {host} is IPv{parsed.version} but the bind address is "
                              f"IPv{6 if family == socket.AF_INET6 else 4}; use one address family throughout")
        return str(parsed)
    try:
        return resolver(host, address.port, family)
    except (OSError, UnicodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise ConfigError(f"{where}: cannot resolve {what} host {host!r} ({reason}); "
                          f"fix the name or give an IP address") from None


# ------------------------------------------------------------------ the documented sample file


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[]" if not value else "[" + ", ".join(_yaml_scalar(v) for v in value) + "]"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value).lower() if isinstance(value, bool) else str(value)


def sample_yaml() -> str:
    """The text of configs/wrapper.yaml: every key and every protocol setting, with default and unit."""
    lines = [
        "# Federation wrapper configuration (federation-wrapper --config wrapper.yaml).",
        "# Generated by `python -m federation.daemon.config`; a test checks it matches the code.",
        "# Every key is optional; the values below are the defaults. Command-line flags",
        "# (federation-wrapper --help) override the values in this file.",
        "",
    ]
    for spec in FIELDS:
        flag = f" Flag: {spec.flag}." if spec.flag else ""
        lines.extend(textwrap.wrap(f"{spec.help}.{flag}", 96, initial_indent="# ", subsequent_indent="# "))
        lines.append(f"{spec.key}: {_yaml_scalar(spec.default)}")
        lines.append("")
    lines += [
        "# Protocol settings (federation/protocol/settings.py); every wrapper of a federation should use the same,",
        "# except `owned` and `capability*`, which describe the node itself (docs/modes.md).",
        "settings:",
    ]
    for name, default, doc in Settings.documentation():
        lines.extend(textwrap.wrap(f"{doc} (default {_yaml_scalar(default).strip(chr(34))})", 96, initial_indent="  # ",
                                   subsequent_indent="  # "))
        lines.append(f"  {name}: {_yaml_scalar(default)}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(sample_yaml(), end="")
