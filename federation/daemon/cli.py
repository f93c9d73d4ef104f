"""Command line of the wrapper daemon (console script `federation-wrapper`; `python wrapper.py` in a checkout).

    federation-wrapper [--config FILE.yaml] [--neighbors HOST[:PORT],...] [--bind HOST[:PORT]]
                       [--broker HOST[:PORT]] [--id N] [--state-dir DIR] [--event-log FILE]
                       [--metrics-port N] [--log-level LEVEL] [--topic LINE]...   run the wrapper
    federation-wrapper status [--node HOST[:PORT]] [--json]           ask a running wrapper
    federation-wrapper genkey                                          print a new federation key

Theory of operation: flags are parsed with no defaults of their own (None
means "not given") so that `load_config` can apply the precedence flags >
YAML file > built-in defaults in one place. Every problem a person can fix
(bad flag, bad YAML, unresolvable neighbour, port in use, state directory
in use) is printed as one `wrapper: error: ...` line and gives exit status
2; a clean shutdown on SIGINT/SIGTERM gives 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from federation.cli_version import add_version_option
from federation.daemon.config import DEFAULT_PORT, LOG_LEVELS, ConfigError, load_config
from federation.daemon.keys import generate_key
from federation.daemon.runtime import Runtime
from federation.daemon.startup import StartupError
from federation.daemon.state import StateError
from federation.daemon.status import StatusError, query, render
from federation.daemon.udp import BindError
from federation.protocol.types import Address

EXIT_OK = 0
EXIT_NOT_READY = 1
"""`status`: the wrapper answered and is not ready (health.py; the reasons are printed)"""
EXIT_USAGE = 2
DEFAULT_STATUS_NODE = "127.0.0.1:10500"
PROG = "federation-wrapper"
"""the installed name, used in every message (in a checkout `python wrapper.py` is the same program)"""


class UsageError(Exception):
    """Bad arguments: exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}\n{self.format_usage().rstrip()}")


def build_run_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Federation wrapper: runs beside one Mosquitto broker and federates it with its neighbours' "
                    f"brokers over UDP. `{PROG} status --help` for the status command. Flags override the "
                    "YAML file; `federation-configs show wrapper.yaml` prints every key and protocol setting "
                    "with its default.",
    )
    parser.add_argument("--config", metavar="FILE.yaml",
                        help="YAML configuration file (every key: `federation-configs show wrapper.yaml`)")
    parser.add_argument("--neighbors", "--neighbours", dest="neighbors", metavar="HOST[:PORT],...",
                        help=f"comma-separated neighbour wrappers (port {DEFAULT_PORT} if omitted)")
    parser.add_argument("--bind", metavar="HOST[:PORT]",
                        help=f"UDP address to listen on and announce (default 0.0.0.0:{DEFAULT_PORT}; with 0.0.0.0 "
                             f"the announced address is the local address that reaches the first neighbour)")
    parser.add_argument("--broker", metavar="HOST[:PORT]",
                        help="the local Mosquitto broker (default 127.0.0.1:1883; port 8883 with TLS). No "
                             "credentials in it: use --broker-username and --broker-password-file")
    parser.add_argument("--broker-username", dest="broker_username", metavar="USER",
                        help="user name for the broker login (default: anonymous)")
    parser.add_argument("--broker-password-file", dest="broker_password_file", metavar="FILE",
                        help="file whose first line is the broker password (never give the password itself)")
    parser.add_argument("--broker-tls-ca", dest="broker_tls_ca", metavar="FILE",
                        help="PEM CA certificate(s) that signed the broker's certificate: connect with TLS")
    parser.add_argument("--broker-tls-cert", dest="broker_tls_cert", metavar="FILE",
                        help="PEM client certificate for the broker (TLS; with --broker-tls-key)")
    parser.add_argument("--broker-tls-key", dest="broker_tls_key", metavar="FILE",
                        help="PEM private key of --broker-tls-cert, not encrypted")
    parser.add_argument("--id", metavar="N", help="virtual id 0..2147483647 for elections (default: random)")
    parser.add_argument("--name", metavar="NAME", help="a label for status and events")
    parser.add_argument("--client-id", dest="client_id", metavar="ID",
                        help="MQTT client id of the wrapper (default federation-wrapper-<bind host>-<port>)")
    parser.add_argument("--state-dir", dest="state_dir", metavar="DIR",
                        help="persist the boot epoch and local subscriptions here (default: no persistence)")
    parser.add_argument("--event-log", dest="event_log", metavar="FILE", help="append JSON-lines events to FILE")
    parser.add_argument("--metrics-port", dest="metrics_port", metavar="N", help="serve Prometheus metrics on port N")
    parser.add_argument("--log-level", dest="log_level", metavar="LEVEL",
                        help=f"stderr log level: {', '.join(LOG_LEVELS)} (default INFO)")
    parser.add_argument("--topic", dest="topics", action="append", metavar="'PATTERN [out|in|both [QOS [L R]]]'",
                        help="a topic policy line, as a Mosquitto bridge's `topic` option (repeatable; replaces the "
                             "YAML file's `topics`; docs/topic-policies.md). Default: everything, both ways")
    parser.add_argument("--key-file", dest="key_file", metavar="FILE",
                        help="federation key(s), one per line, hex or base64; the first signs, all are accepted "
                             f"(`{PROG} genkey > FILE`). Without it the overlay is open: lab use only")
    parser.add_argument("--encryption", metavar="CIPHER",
                        help="chacha20-poly1305 to encrypt what this wrapper sends (needs --key-file), "
                             "or none (default)")
    parser.add_argument("--allow-other-wrappers", dest="allow_other_wrappers", action="store_true", default=None,
                        help="start even when another federation wrapper holds a record on this broker (refused "
                             "otherwise: both would federate everything twice)")
    add_version_option(parser, PROG)
    return parser


def build_status_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=f"{PROG} status",
                     description="Print what a running wrapper knows: neighbours, federation table, cores, meshes, "
                                 "local subscriptions and counters. Works only from the wrapper's own host. Exit "
                                 "status: 0 ready, 1 answered but not ready (the reasons are printed: broker not "
                                 "connected, no broker log lines, no neighbour up), 2 no answer.")
    parser.add_argument("--node", default=DEFAULT_STATUS_NODE, metavar="HOST[:PORT]",
                        help=f"the wrapper's UDP address, its --bind (default {DEFAULT_STATUS_NODE})")
    parser.add_argument("--json", action="store_true", help="print the raw JSON document")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        if arguments[:1] == ["status"]:
            return status_command(arguments[1:])
        if arguments[:1] == ["genkey"]:
            return genkey_command(arguments[1:])
        return run_command(arguments)
    except (UsageError, ConfigError, StartupError, StateError, BindError, StatusError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return EXIT_USAGE


def run_command(arguments: list[str]) -> NoReturn:
    # SIGHUP (logrotate's postrotate, `systemctl reload`) must never end the wrapper, also while it starts: the
    # runtime handles it once the wrapper runs (runtime.py).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    options = vars(build_run_parser().parse_args(arguments))
    config = load_config(options)
    logging.basicConfig(level=getattr(logging, config.log_level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(getattr(logging, config.log_level))
    status = asyncio.run(Runtime(config).run())
    # Everything is written and closed (the runtime's shutdown): exit now, without the interpreter tearing the
    # node's tables down object by object. After a flood filled them that took 0.4 s of the second SIGTERM is
    # given (tests/real/test_hostile_real.py, issue 22).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def genkey_command(arguments: list[str]) -> int:
    _Parser(prog=f"{PROG} genkey",
            description="Print a new random federation key (32 bytes, hex) for --key-file: "
                        f"`{PROG} genkey > federation.key; chmod 600 federation.key`, then copy the file "
                        "to every wrapper of the federation.").parse_args(arguments)
    print(generate_key())
    return EXIT_OK


def status_command(arguments: list[str]) -> int:
    options = build_status_parser().parse_args(arguments)
    try:
        node = Address.parse(options.node, DEFAULT_PORT)
    except ValueError as error:
        raise UsageError(f"--node: {error}; write HOST or HOST:PORT") from None
    document = query(node.host, node.port)
    if options.json:
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        print(render(document), end="")
    ready = document.get("daemon", {}).get("ready")
    return EXIT_NOT_READY if isinstance(ready, dict) and ready.get("ready") is False else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
