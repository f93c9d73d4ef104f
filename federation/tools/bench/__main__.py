"""`python -m federation.tools.bench`: see federation/tools/bench/cli.py and docs/benchmarks.md."""

import sys

from federation.tools.bench.cli import main

sys.exit(main())
