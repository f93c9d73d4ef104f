"""One local[2] Spark session for every Spark test of the run: starting one costs 6-10 s."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="the spark extra is not installed: pip install -e '.[spark]'")
    from federation.spark.session import build_session

    session = build_session("local[2]")
    yield session
    session.stop()
