"""Tables a suite prints at the end of the test session, also from a pytest-xdist worker.

The fault and transparency suites print their matrix (the federation beside its reference) whether their
tests pass or fail. A worker's own output is never shown (`make test` runs two), so a table waits in the
config's stash and rides to the controller as a section of the next test report (tests/conftest.py), which
prints every such section in the terminal summary.
"""

from __future__ import annotations

import pytest

SECTION_PREFIX = "federation table: "
"""report sections whose title starts so are printed in the terminal summary"""
PENDING = pytest.StashKey[list[tuple[str, str]]]()


def print_summary_table(config: pytest.Config, title: str, text: str) -> None:
    """Show `text` under `title` in the session's terminal summary."""
    config.stash.setdefault(PENDING, []).append((title, text))
