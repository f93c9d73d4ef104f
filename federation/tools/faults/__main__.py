"""`python -m federation.tools.faults`: see federation/tools/faults/cli.py and docs/guarantees.md."""

import sys

from federation.tools.faults.cli import main

sys.exit(main())
