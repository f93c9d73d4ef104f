"""`python -m suites.bench`: see suites/bench/cli.py and docs/benchmarks.md."""

import sys

from suites.bench.cli import main

sys.exit(main())
