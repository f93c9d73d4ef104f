"""The simulator reproduces its golden traces exactly (tests/golden_traces.py says how to record them)."""

from __future__ import annotations

import pytest
from golden_traces import case_names, differences, fingerprint, load_manifest

MANIFEST = load_manifest()


def test_manifest_covers_every_case() -> None:
    assert sorted(MANIFEST) == sorted(case_names()), \
        "a scenario was added or removed: python tests/golden_traces.py --record"


@pytest.mark.parametrize("name", case_names())
def test_trace_is_golden(name: str) -> None:
    assert name in MANIFEST, f"{name} has no golden trace: python tests/golden_traces.py --record"
    problems = differences(name, MANIFEST[name], fingerprint(name))
    assert not problems, "\n".join(problems)
