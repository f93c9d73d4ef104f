"""`python -m federation.tools.transparency`: see federation/tools/transparency/cli.py and docs/transparency.md."""

import sys

from federation.tools.transparency.cli import main

sys.exit(main())
