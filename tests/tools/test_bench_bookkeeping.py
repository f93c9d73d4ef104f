"""`python -m suites.bench.bookkeeping` runs on real files and prints both figures."""

from __future__ import annotations

import re

import pytest

from suites.bench import bookkeeping


def test_it_times_the_spool_and_the_journal(capsys: pytest.CaptureFixture[str]) -> None:
    assert bookkeeping.main(["--passes", "20", "--pass-size", "32", "--window", "5"]) == 0
    printed = capsys.readouterr().out
    figures = re.findall(r"([0-9.]+) µs per (?:publication|injection)", printed)
    assert len(figures) == 2 and all(float(figure) > 0 for figure in figures), printed
