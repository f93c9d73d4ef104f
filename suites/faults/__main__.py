"""`python -m suites.faults`: see suites/faults/cli.py and docs/guarantees.md."""

import sys

from suites.faults.cli import main

sys.exit(main())
