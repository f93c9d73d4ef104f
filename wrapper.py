#!/usr/bin/env python3
"""The federation wrapper daemon: run one beside each Mosquitto broker.

    python wrapper.py --neighbors 10.0.0.2,10.0.0.3 --broker 127.0.0.1:1883
    python wrapper.py status

Everything lives in `federation.daemon`; `python wrapper.py --help` and
docs/daemon.md describe the flags, the YAML file and the status command.
"""

from __future__ import annotations

import sys

from federation.daemon.cli import main

if __name__ == "__main__":
    sys.exit(main())
