"""SIGHUP: what a running wrapper takes up again without a restart.

Theory of operation: an operator, or logrotate's `postrotate`, sends SIGHUP
(`systemctl reload mqtt-federation`, `kill -HUP PID`) to say "files have
changed". The wrapper then

- reopens its event log at its path: logrotate has renamed the old file, and
  the lines buffered so far are written to it before the new file at the
  path is opened (created if it is missing);
- re-reads the federation key file: a key rotation without a restart
  (docs/security.md "Rotating keys"), the first key signing from now on and
  every key accepted;
- re-reads the broker password file: the next connection to the broker logs
  in with the new password (the one open now is kept).

Whatever cannot be read or used keeps what the wrapper has and is logged
with the reason and the file, so a mistake in a new key file never leaves
the overlay without keys, and the wrapper keeps running. Nothing here reads
or writes the node: the running wrapper (running.py) hands over the parts
a reload touches and counts the outcome (`Reloads`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from federation.daemon.broker import BrokerAdapter
from federation.daemon.broker_auth import BrokerAuthError, read_password_file
from federation.daemon.broker_health import BrokerHealth
from federation.daemon.config import DaemonConfig
from federation.daemon.event_log import EventLog, EventLogError
from federation.daemon.keys import KeyFileError, read_key_file
from federation.envelope.config import EnvelopeConfigError
from federation.envelope.datagrams import Envelope

log = logging.getLogger("federation.daemon")


@dataclass
class Reloads:
    """What SIGHUPs did, for the status document."""

    signals: int = 0
    """SIGHUPs handled"""
    failures: int = 0
    """files a reload could not use (the wrapper kept what it had)"""
    key_rotations: int = 0
    """reloads that installed different federation keys"""


def reload_files(config: DaemonConfig, event_log: EventLog | None, envelope: Envelope, broker: BrokerAdapter,
                 health: BrokerHealth, counts: Reloads) -> None:
    """Reopen the event log, re-read the key file and the broker password file (see the module docstring)."""
    counts.signals += 1
    if event_log is not None:
        try:
            event_log.reopen()
        except EventLogError as error:
            counts.failures += 1
            log.error("SIGHUP: %s; still writing to the file open before", error)
        else:
            log.info("SIGHUP: event log reopened at %s", event_log.path)
    if config.key_file is not None:
        in_use = ", ".join(envelope.key_ids())
        try:
            keys = read_key_file(config.key_file)
            if keys != envelope.config.keys:
                envelope.replace_keys(keys)
                counts.key_rotations += 1
                log.info("SIGHUP: federation keys read again from %s: ids %s (were %s); the first signs",
                         config.key_file, ", ".join(envelope.key_ids()), in_use)
            else:
                log.info("SIGHUP: key file %s unchanged (ids %s)", config.key_file, in_use)
        except (KeyFileError, EnvelopeConfigError) as error:
            counts.failures += 1
            log.error("SIGHUP: kept the federation keys in use (ids %s): %s", in_use, error)
    auth = broker.auth
    if auth.password_file is not None:
        try:
            password = read_password_file(auth.password_file)
        except BrokerAuthError as error:
            counts.failures += 1
            log.error("SIGHUP: kept the broker password in use: %s", error)
            return
        if password != auth.password:
            auth = dataclasses.replace(auth, password=password)
            broker.update_password(auth)
            health.auth = auth
            log.info("SIGHUP: broker password read again from %s; the next connection to the broker uses it",
                     auth.password_file)
