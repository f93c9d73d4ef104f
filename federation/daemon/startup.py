"""Starting a wrapper: the resources its configuration names, then the node's boot.

Theory of operation: startup order is chosen so that every mistake a person
can fix (state directory in use, port in use, metrics port in use, event log
unwritable) fails with exit status 2 before the epoch is advanced or
anything is sent. So `open_resources` first takes everything that can fail
because of the configuration, each failure an exception whose message says
what to change (`StartupError` here, `BindError` from udp.py, `StateError`
from state.py), and releases what it took when a later one fails. Only then
does `boot` load the saved state, advance the boot epoch and write it to
disk before the node exists ("the epoch never goes backwards", state.py),
and build the node and its envelope.

Nothing here touches the event loop: the runtime (runtime.py) calls these
two, opens the UDP endpoint and hands everything to `Running`
(running.py), which owns it from then on and releases the resources at
shutdown (`Resources.close`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from federation.daemon.config import DaemonConfig
from federation.daemon.event_log import EventLog, EventLogError
from federation.daemon.injections import JOURNAL_FILE, InjectionJournal
from federation.daemon.metrics_server import Probe, start_metrics_server
from federation.daemon.record_log import RecordLog, RecordLogError
from federation.daemon.retained import RETAINED_FILE, RetainedStore
from federation.daemon.spool import SPOOL_FILE, Spool
from federation.daemon.state import EpochExhausted, LocalSubscriptions, PersistedState, StateStore, next_epoch
from federation.daemon.udp import open_socket
from federation.envelope.config import EnvelopeConfig, EnvelopeConfigError
from federation.envelope.datagrams import Envelope, envelope_epoch
from federation.protocol.node import Node

log = logging.getLogger("federation.daemon")


class StartupError(Exception):
    """Something a person must fix before the wrapper can run (exit status 2)."""


@dataclass
class Resources:
    """What the configuration names and the wrapper holds while it runs; None where the configuration
    asks for none (no state directory, no metrics port, no event log)."""

    sock: socket.socket
    """the overlay's bound UDP socket"""
    store: StateStore | None
    """the state directory, locked"""
    event_log: EventLog | None
    metrics_server: Any | None
    journal: InjectionJournal | None = None
    """the injection journal in the state directory (federation.daemon.injections)"""
    spool: Spool | None = None
    """the custody spool of our own QoS 1/2 publications in the state directory (federation.daemon.spool)"""
    retained: RetainedStore | None = None
    """the retained store kept in the state directory (federation.daemon.retained)"""

    def close(self, transport: asyncio.BaseTransport | None = None) -> None:
        """Release everything. The socket is closed by `transport` when there is one: it sends what it still
        buffers first."""
        if self.event_log is not None:
            self.event_log.close()
        if self.journal is not None:
            self.journal.close()
            self.journal = None
        if self.spool is not None:
            self.spool.log.close()
            self.spool = None
        if self.retained is not None:
            self.retained.close()
            self.retained = None
        if transport is not None:
            transport.close()
        else:
            self.sock.close()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
            self.metrics_server = None
        if self.store is not None:
            self.store.unlock()


def open_resources(config: DaemonConfig, probe: Probe) -> Resources:
    """Take every resource that can fail because of the configuration, or raise what says how to fix it.

    `probe` is what the metrics port reads (from its thread: metrics_server.py)."""
    store = StateStore(config.state_dir) if config.state_dir is not None else None
    if store is not None:
        store.lock()
    try:
        sock = open_socket(config.bind, config.family)
    except BaseException:
        if store is not None:
            store.unlock()
        raise
    resources = Resources(sock, store, event_log=None, metrics_server=None)
    try:
        if config.metrics_port is not None:
            try:
                resources.metrics_server = start_metrics_server(config.metrics_bind, config.metrics_port, probe)
            except OSError as error:
                raise StartupError(
                    f"--metrics-port: cannot serve metrics on {config.metrics_bind}:{config.metrics_port}: "
                    f"{error.strerror or error}; choose another --metrics-port (or metrics_bind)") from None
        if config.event_log is not None:
            try:
                resources.event_log = EventLog(config.event_log, config.event_types)
            except EventLogError as error:
                raise StartupError(str(error)) from None
        if store is not None:
            resources.journal = open_journal(config, store.directory)
            resources.spool = open_spool(store.directory)
            resources.retained = open_retained(store.directory)
    except BaseException:
        resources.close()
        raise
    return resources


def open_spool(directory: Path) -> Spool:
    """The custody spool in the state directory, as a previous run left it; StartupError if unusable."""
    path = directory / SPOOL_FILE
    try:
        record_log = RecordLog(path)
    except (RecordLogError, OSError) as error:
        raise StartupError(f"--state-dir: cannot use the custody spool {path}: {error}; give a writable "
                           f"directory") from None
    if record_log.torn_bytes:
        log.warning("the custody spool %s ended in a record cut short (%d bytes, a crash while it was written): "
                    "cut off; that publication was not acknowledged to the broker, which sends it again", path,
                    record_log.torn_bytes)
    spool = Spool(record_log)
    if spool.undecodable:
        log.warning("the custody spool %s held %d records that could not be read: skipped", path, spool.undecodable)
    if spool.recovered_count:
        log.info("the custody spool holds %d publications a previous run had not delivered everywhere: sending "
                 "them again", spool.recovered_count)
    return spool


def open_retained(directory: Path) -> RetainedStore:
    """The retained store in the state directory, as a previous run left it; StartupError if unusable."""
    path = directory / RETAINED_FILE
    try:
        record_log = RecordLog(path)
    except (RecordLogError, OSError) as error:
        raise StartupError(f"--state-dir: cannot use the retained store {path}: {error}; give a writable "
                           f"directory") from None
    store = RetainedStore(record_log)
    if record_log.torn_bytes or store.undecodable:
        log.warning("the retained store %s ended in a record cut short (%d bytes) or held %d records that could not "
                    "be read: skipped", path, record_log.torn_bytes, store.undecodable)
    if store.values:
        log.info("the retained store holds %d retained topics from a previous run", len(store.values))
    return store


def open_journal(config: DaemonConfig, directory: Path) -> InjectionJournal:
    """The injection journal in the state directory, as a previous run left it; StartupError if unusable."""
    path = directory / JOURNAL_FILE
    try:
        record_log = RecordLog(path)
    except (RecordLogError, OSError) as error:
        raise StartupError(f"--state-dir: cannot use the injection journal {path}: {error}; give a writable "
                           f"directory") from None
    if record_log.torn_bytes:
        log.warning("the injection journal %s ended in a record cut short (%d bytes, a crash while it was "
                    "written): cut off", path, record_log.torn_bytes)
    journal = InjectionJournal(record_log, config.settings.duplicate_cache_size)
    if journal.undecodable:
        log.warning("the injection journal %s held %d records that could not be read: skipped", path,
                    journal.undecodable)
    if journal.recovered:
        log.info("the injection journal holds %d injections a previous run left unfinished: sending them again",
                 journal.recovered)
    return journal


def boot(config: DaemonConfig, store: StateStore | None) -> tuple[Node, Envelope, PersistedState]:
    """The node (not started yet), its envelope and the state to keep: the saved subscriptions and the new
    epoch, which is on disk (with a state directory) before this returns."""
    wall = time.time()
    epoch = int(wall)
    persisted = PersistedState()
    if store is not None:
        persisted, warning = store.load()
        if warning:
            log.warning("%s", warning)
        try:
            epoch = next_epoch(persisted.epoch, wall)
        except EpochExhausted as error:
            raise StartupError(f"--state-dir {store.path}: {error}") from None
        broker = str(config.broker)
        if persisted.broker is not None and persisted.broker != broker and persisted.subscriptions.clients:
            log.warning("saved subscriptions were learned from broker %s, not %s: not replaying them",
                        persisted.broker, broker)
            persisted.subscriptions = LocalSubscriptions()
        persisted.epoch = epoch
        persisted.broker = broker
        try:
            store.save(persisted, wall)  # the new epoch is on disk before anything is sent
        except OSError as error:
            raise StartupError(f"--state-dir: cannot write {store.path}: {error.strerror or error}; "
                               f"give a writable directory") from None
    node = Node(config.announced, config.neighbours, epoch, random.Random(), config.settings,
                vid=config.vid, name=config.name, publication_events=config.publication_events)
    try:
        envelope = Envelope(config.announced, envelope_epoch(epoch, wall),
                            EnvelopeConfig.from_settings(node.settings, config.keys, config.encryption),
                            drop_sink=node.drop)
    except EnvelopeConfigError as error:
        raise StartupError(str(error)) from None
    return node, envelope, persisted
