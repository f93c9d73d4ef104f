"""`--version` of the console scripts: each answers with its own installed name and the package's version.

One place for the text, so `federation-analyze --version` says `federation-analyze 0.1.0` as
`federation-wrapper --version` says `federation-wrapper 0.1.0` (tests/packaging/test_distribution.py runs
every installed script).
"""

from __future__ import annotations

import argparse

from federation import __version__


def version_text(script: str) -> str:
    return f"{script} {__version__}"


def add_version_option(parser: argparse.ArgumentParser, script: str) -> None:
    """`--version` on `parser`: prints `<script> <version>` and exits 0, also before a required subcommand."""
    parser.add_argument("--version", action="version", version=version_text(script),
                        help="print the script's name and the package's version, then exit")
