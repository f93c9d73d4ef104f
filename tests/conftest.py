"""Fixtures any test may use, and the markers each test folder implies.

Keep this small: topic-specific helpers live beside their tests. Tests are laid out by layer
(`tests/protocol`, `tests/daemon`, ...); everything under `tests/real/` runs real processes and is
marked by its folder (see `FOLDER_MARKERS`), so a test file never has to repeat it.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from summary_tables import PENDING, SECTION_PREFIX

TESTS = Path(__file__).resolve().parent

FOLDER_MARKERS: dict[str, tuple[str, ...]] = {
    "real": ("broker",),
    "real/netns": ("broker", "netns"),
    "real/lxd": ("lxd",),
}
"""folder under tests/ -> the markers of every test in it (the deepest matching folder wins)"""


def markers_for(path: Path) -> tuple[str, ...]:
    relative = path.resolve().relative_to(TESTS).parent.as_posix()
    best = ""
    for folder in FOLDER_MARKERS:
        if (relative == folder or relative.startswith(folder + "/")) and len(folder) > len(best):
            best = folder
    return FOLDER_MARKERS.get(best, ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for marker in markers_for(item.path):
            item.add_marker(marker)


def find_free_port(kind: socket.SocketKind = socket.SOCK_STREAM, host: str = "127.0.0.1") -> int:
    """A port the kernel just reported free on `host` (TCP by default; pass SOCK_DGRAM for UDP).

    Another process can take it before the caller binds it; tests that start
    servers should bind soon after asking.
    """
    with socket.socket(socket.AF_INET, kind) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def free_port() -> Callable[..., int]:
    """Call it for a free loopback port: `free_port()` for TCP, `free_port(socket.SOCK_DGRAM)` for UDP."""
    return find_free_port


# ------------------------------------------------------------------ tables for the terminal summary (summary_tables)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    pending = item.config.stash.get(PENDING, [])
    if pending:
        report = outcome.get_result()
        report.sections.extend((SECTION_PREFIX + title, text) for title, text in pending)
        pending.clear()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for reports in list(terminalreporter.stats.values()):
        for report in reports:
            for title, text in getattr(report, "sections", ()):
                if title.startswith(SECTION_PREFIX):
                    terminalreporter.write_sep("-", title.removeprefix(SECTION_PREFIX))
                    terminalreporter.write_line(text)
