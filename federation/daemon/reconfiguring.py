"""A running wrapper's configuration, changed while it runs: SIGHUP, and the neighbours' names resolved again.

Theory of operation: both load something slow (a YAML file and the DNS for SIGHUP, the DNS alone for the
periodic resolution) and change the running wrapper. So each loads in a worker thread (`run_in_executor`:
the loop keeps forwarding meanwhile) and applies what it found on the loop, the thread that owns the node.
What a SIGHUP loads is compared with the running configuration by reload.py (`plan_reload`), which also
says what each part of the change means; here it is applied, part by part, to the running wrapper
(`Reconfigurable`, what `Running` provides): the node's neighbours, the topic policy at the edges and in the
subscriptions, the log level, the keys, the broker password, and the resolution's timer. One load runs at a
time; a SIGHUP during one loads once more after it (the file may have changed again since it was read).

The periodic resolution (neighbour_names.py) applies only if no SIGHUP changed the names meanwhile (the
newer list wins), and never changes a neighbour whose name does not resolve now.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Protocol

from federation.daemon import neighbour_names
from federation.daemon.broker import BrokerAdapter
from federation.daemon.broker_health import BrokerHealth
from federation.daemon.clock import Clock
from federation.daemon.config import ConfigError, DaemonConfig, Resolver, default_resolver, load_config
from federation.daemon.event_log import EventLog
from federation.daemon.policy_edges import PolicyEdges
from federation.daemon.policy_subscriptions import PolicySubscriptions
from federation.daemon.reload import (
    Reloads,
    describe_neighbours,
    install_keys,
    install_password,
    plan_reload,
    reload_files,
    reopen_event_log,
    set_log_level,
)
from federation.daemon.retained_scan import RetainedReading
from federation.envelope.datagrams import Envelope
from federation.protocol.node import Node

log = logging.getLogger("federation.daemon")


class Reconfigurable(Protocol):
    """What a reconfiguration changes in a running wrapper (`Running` is one)."""

    config: DaemonConfig
    stopping: bool

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def node(self) -> Node: ...
    @property
    def envelope(self) -> Envelope: ...
    @property
    def broker(self) -> BrokerAdapter: ...
    @property
    def broker_health(self) -> BrokerHealth: ...
    @property
    def event_log(self) -> EventLog | None: ...
    @property
    def edges(self) -> PolicyEdges: ...
    @property
    def subscription_sink(self) -> PolicySubscriptions: ...
    @property
    def retained_reading(self) -> RetainedReading: ...
    @property
    def reloads(self) -> Reloads: ...


class Reconfiguring:
    """SIGHUP's loading and applying of the configuration, and the periodic resolution of the names."""

    def __init__(self, wrapper: Reconfigurable, drain: Callable[[float], None],
                 resolver: Resolver = default_resolver) -> None:
        """`drain(now)`: the wrapper's outputs after a change (the hellos to new neighbours go at once);
        `resolver`: how the periodic resolution looks names up (config.py's)."""
        self.wrapper = wrapper
        self._drain = drain
        self.resolver = resolver
        self._loading = False
        """a configuration is being loaded in a worker thread"""
        self._load_again = False
        """a SIGHUP came meanwhile: load once more when it is done"""
        self._resolve_handle: asyncio.TimerHandle | None = None
        """the next resolution of the neighbours given by name, while one is due"""
        self._resolving = False

    def close(self) -> None:
        if self._resolve_handle is not None:
            self._resolve_handle.cancel()
            self._resolve_handle = None

    # ------------------------------------------------------------ SIGHUP

    def reload(self) -> None:
        """Reopen the event log at its path at once, then load the configuration again in a worker thread and
        take up what changed (`_loaded`); a configuration built in code re-reads its key and password files
        only (reload.py)."""
        wrapper = self.wrapper
        if wrapper.stopping:
            return
        config = wrapper.config
        if config.flags is None:
            reload_files(config, wrapper.event_log, wrapper.envelope, wrapper.broker, wrapper.broker_health,
                         wrapper.reloads)
            return
        reopen_event_log(wrapper.event_log, wrapper.reloads)
        if self._loading:
            self._load_again = True
            return
        self._loading = True
        future = wrapper.loop.run_in_executor(None, load_config, config.flags)
        future.add_done_callback(self._loaded)  # called on the loop, once the thread is done

    def _loaded(self, future: asyncio.Future[DaemonConfig]) -> None:
        """A configuration loaded again: refused with the start-up message when it does not validate, else what
        can change at run time is taken up (`apply`)."""
        self._loading = False
        wrapper = self.wrapper
        counts = wrapper.reloads
        counts.signals += 1
        running = wrapper.config
        where = running.config_file or "the command line"
        try:
            loaded = future.result()
        except ConfigError as error:
            counts.failures += 1
            counts.last_error = str(error)
            log.error("SIGHUP: %s refused; kept the running configuration (loaded %s, sha256 %s; federation keys "
                      "in use: %s): federation-wrapper: error: %s", where, _time_text(running.loaded_at),
                      running.config_hash, "ids " + ", ".join(wrapper.envelope.key_ids()) if running.keys else
                      "none, the overlay is open", error)
        except Exception as error:  # noqa: BLE001 - a bug must not end the wrapper: it keeps what runs
            counts.failures += 1
            counts.last_error = f"{type(error).__name__}: {error}"
            log.exception("SIGHUP: loading %s failed; kept the running configuration", where)
        else:
            if not wrapper.stopping:
                self.apply(loaded, wrapper.clock.now())
        if self._load_again and not wrapper.stopping:
            self._load_again = False
            self.reload()

    def apply(self, loaded: DaemonConfig, now: float) -> None:
        """Take up a configuration loaded again (reload.py `plan_reload`): neighbours, topic policy, log level,
        keys, password and the resolution interval now; the rest is reported as waiting for a restart."""
        wrapper = self.wrapper
        plan = plan_reload(wrapper.config, loaded)
        applied = plan.applied
        counts = wrapper.reloads
        if plan.log_level:
            set_log_level(applied.log_level)
            log.info("SIGHUP: log level %s", applied.log_level)
        if applied.key_file is not None:
            install_keys(wrapper.envelope, applied.keys, applied.key_file, counts)
        if plan.password:
            install_password(wrapper.broker, wrapper.broker_health, applied.broker_auth.password)
        if plan.neighbours:
            added, removed = wrapper.node.set_configured_neighbours(applied.neighbours, now)
            log.info("SIGHUP: neighbours %s (now: %s)", describe_neighbours(added, removed),
                     ", ".join(str(address) for address in applied.neighbours) or "none")
        if plan.policy:
            policy = applied.topic_policy
            wrapper.edges.set_policy(policy)  # both edges, from the next publication on
            changed = wrapper.subscription_sink.set_policy(policy, now)  # new filters joined first, then old left
            log.info("SIGHUP: topic policy %s; %d federated subscriptions changed", "; ".join(policy.describe()),
                     changed)
        wrapper.config = applied
        wrapper.retained_reading.config = applied  # its connection logs in as the wrapper's does
        if plan.resolve_interval or plan.neighbours:
            self.schedule_resolution()
        counts.configurations += 1
        counts.pending_restart = list(plan.pending_restart)
        if plan.pending_restart:
            log.warning("SIGHUP: %s changes %s: they take effect at the next restart", applied.config_file,
                        ", ".join(plan.pending_restart))
        log.info("SIGHUP: configuration %s taken up (sha256 %s)", applied.config_file or "from the command line",
                 applied.config_hash)
        self._drain(now)

    # ------------------------------------------------------------ neighbours given by name

    def schedule_resolution(self) -> None:
        """Resolve the neighbours given by name again after `neighbour_resolve_interval` (none given: nothing)."""
        self.close()
        wrapper = self.wrapper
        interval = wrapper.config.neighbour_resolve_interval
        if interval > 0 and neighbour_names.has_names(wrapper.config.neighbour_names) and not wrapper.stopping:
            self._resolve_handle = wrapper.loop.call_later(interval, self._resolve)

    def _resolve(self) -> None:
        self._resolve_handle = None
        wrapper = self.wrapper
        if self._resolving or wrapper.stopping:
            return
        self._resolving = True
        asked = wrapper.config
        future = wrapper.loop.run_in_executor(None, neighbour_names.resolve_again, asked.neighbour_names,
                                              asked.family, self.resolver)
        future.add_done_callback(lambda done: self._resolved(asked, done))

    def _resolved(self, asked: DaemonConfig, future: asyncio.Future[tuple[neighbour_names.Names, list[str]]]) -> None:
        """Names resolved again: a neighbour that moved is reached at its new address (its old link goes down)."""
        self._resolving = False
        wrapper = self.wrapper
        try:
            names, problems = future.result()
        except Exception as error:  # noqa: BLE001 - the next interval tries again
            log.error("resolving the neighbours' names again failed: %s", error)
            self.schedule_resolution()
            return
        for problem in problems:
            log.warning("%s", problem)
        config = wrapper.config
        if config.neighbour_names == asked.neighbour_names and not wrapper.stopping:  # no SIGHUP changed them
            addresses = neighbour_names.addresses(names, config.announced)
            wrapper.config = dataclasses.replace(config, neighbours=addresses, neighbour_names=names)
            if addresses != config.neighbours:
                now = wrapper.clock.now()
                log.info("neighbours resolved again: %s",
                         "; ".join(neighbour_names.moved(config.neighbour_names, names)))
                wrapper.node.set_configured_neighbours(addresses, now)
                self._drain(now)
        self.schedule_resolution()


def _time_text(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix))
