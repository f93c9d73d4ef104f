"""`python -m federation.scenario`: see `federation.scenario.cli`."""

from __future__ import annotations

import sys

from federation.scenario.cli import main

sys.exit(main())
