"""The MQTT codec benchmark (suites/bench/mqtt_codec.py) runs and prints a figure for every codec it has:
a small run, so that it does not rot; the figures themselves belong in docs/mqtt-link.md."""

from __future__ import annotations

import re

import pytest

from suites.bench import mqtt_codec


def test_the_codec_bench_prints_a_row_per_codec(capsys: pytest.CaptureFixture[str]) -> None:
    assert mqtt_codec.main(["--count", "300", "--repeat", "1"]) == 0
    output = capsys.readouterr().out
    rows = {line.split("  ")[0].strip(): line for line in output.splitlines()[2:]}
    expected = {"ours: general", "ours: session", "paho"} | ({"mqtt5 (Rust)"} if mqtt_codec.mqtt5_module() else set())
    assert set(rows) == expected
    for line in rows.values():
        assert len(re.findall(r"\d+\.\d\d", line)) == 4
