"""`python -m federation.bench`: see federation/bench/cli.py and docs/benchmarks.md."""

import sys

from federation.bench.cli import main

sys.exit(main())
