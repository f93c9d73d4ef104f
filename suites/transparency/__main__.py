"""`python -m suites.transparency`: see suites/transparency/cli.py and docs/transparency.md."""

import sys

from suites.transparency.cli import main

sys.exit(main())
