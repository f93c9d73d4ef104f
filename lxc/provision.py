#!/usr/bin/env python3
"""Build a federation of LXD containers from a scenario/topology file, show it, remove it.

    python lxc/provision.py up configs/topologies/line5.yaml       # containers, brokers, wrappers, federated
    python lxc/provision.py status configs/topologies/line5.yaml   # each node's wrapper status
    python lxc/provision.py down configs/topologies/line5.yaml     # delete them (and stop the LXD it started)

On a Debian 12 machine as root it installs LXD, starts and initialises the
daemon and builds the node image when they are missing. Everything lives in
`federation.lxd` (this file only makes it runnable from a checkout);
docs/lxc.md is the guide, `python lxc/provision.py COMMAND --help` the flags.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from federation.lxd.cli import main  # noqa: E402 - after the path set-up above

if __name__ == "__main__":
    sys.exit(main())
