"""`python -m federation.netns cleanup [--dry-run]`: remove what crashed netns runs left behind.

A run whose owner process was killed with SIGKILL leaves its namespaces
(`fedns-<pid>-<token>-<i>`) and its temporary directory; every new run
removes those first, and this command does it by hand. Runs whose owner is
still alive are never touched.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import federation.netns.system as system
from federation.harness.platform import PlatformError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m federation.netns",
                                     description="Tools of the network-namespace backend.")
    commands = parser.add_subparsers(dest="command", required=True)
    cleanup = commands.add_parser("cleanup", help="remove namespaces and directories of runs that crashed")
    cleanup.add_argument("--dry-run", action="store_true", help="only list them")
    options = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("error: cleanup needs root (it deletes network namespaces)", file=sys.stderr)
        return 2
    ip = system.find_tool("ip")
    if ip is None:
        print("error: `ip` is not installed (apt-get install -y iproute2)", file=sys.stderr)
        return 2
    try:
        if options.dry_run:
            namespaces, directories = system.leftovers(ip)
        else:
            namespaces, directories = system.cleanup_leftovers(ip)
    except PlatformError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    verb = "would remove" if options.dry_run else "removed"
    for name in namespaces:
        print(f"{verb} namespace {name}")
    for path in directories:
        print(f"{verb} directory {path}")
    if not namespaces and not directories:
        print("nothing left behind")
    return 0


if __name__ == "__main__":
    sys.exit(main())
