"""The benchmark's tables, command line and broker configs (no brokers: the default test run)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from suites.bench.cli import cases, main, parse_rates
from suites.bench.report import Results, setup_order, tables
from suites.bench.setups import WRAPPER_LOG_TYPES, SetupSpec, bench_conf, bridge_lines, cpu_seconds
from suites.bench.stats import RunSummary


def summary(rate: float, p50: float, p99: float, lost: int = 0, wrapper_cpu: float = 0.0,
            idle: float = 0.25) -> RunSummary:
    return RunSummary(sent=1000, delivered=1000 - lost, lost=lost, duplicates=0, unexpected=0, rate=rate,
                      p50_ms=p50, p90_ms=p50, p99_ms=p99, max_ms=p99, cpu_wrappers_s=wrapper_cpu,
                      cpu_clients_s=0.4, idle_fraction=idle)


def sample_results() -> Results:
    results = Results({"rounds": 3})
    figures = {  # setup: (max rate, p50 at 1000/s, p99 at 1000/s)
        "single": (100_000.0, 0.10, 0.50), "bridge-2": (60_000.0, 0.20, 0.80), "federation-2": (30_000.0, 0.40, 1.50),
    }
    for round_ in (1, 2, 3):
        for setup, (top, p50, p99) in figures.items():
            cpu = 0.5 if setup.startswith("federation") else 0.0
            results.add(setup, 0, 64, None, round_, summary(top * round_ / 2, 50.0, 90.0, wrapper_cpu=cpu))
            results.add(setup, 0, 64, 1000.0, round_, summary(1000.0, p50, p99, wrapper_cpu=cpu))
    results.add("federation-2", 0, 64, 1000.0, 4, None, "probe timed out")
    return results


def test_tables_quote_medians_ratios_and_added_latency_per_hop() -> None:
    text = tables(sample_results())
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "| 100,000 | 0 / 0 | 1,000 | 0.10 / 0.10 / 0.50 |" in rows["single"]  # median of 50k, 100k, 150k
    assert "(1 failed)" in rows["federation-2"]
    assert "0.500 \\| 0.500" in rows["federation-2"]  # wrapper CPU s per 1000 messages, paced | max
    assert rows["federation-2"].endswith(" | 0.400 | 25% |")  # the clients' CPU s per 1000 messages, machine idle
    ratio_row = next(line for line in text.splitlines() if line.startswith("| 0 | 64 B | 2 | federation-2 |"))
    cells = [cell.strip() for cell in ratio_row.strip("|").split(" | ")]
    assert cells[4:8] == ["0.50", "0.30", "2.00", "1.88"]  # ours/bridge, ours/single, p50 and p99 ours/bridge
    assert cells[8] == "0.30 \\| 0.10"  # p50 added per hop: (0.40 - 0.10) / 1 and (0.20 - 0.10) / 1


def test_a_relay_floor_gets_its_own_ratio_row_and_its_clients_cpu() -> None:
    results = sample_results()
    for round_ in (1, 2, 3):
        results.add("relay-2", 0, 64, None, round_, summary(54_000.0, 50.0, 90.0, wrapper_cpu=0.2))
        results.add("relay-2", 0, 64, 1000.0, round_, summary(1000.0, 0.25, 0.9, wrapper_cpu=0.2))
    text = tables(results)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "0.200 \\| 0.200" in rows["relay-2"]  # the relay clients' CPU, as a federation's wrappers'
    relay_row = next(line for line in text.splitlines() if line.startswith("| 0 | 64 B | 2 | relay-2 |"))
    cells = [cell.strip() for cell in relay_row.strip("|").split(" | ")]
    assert cells[4] == "0.90"  # 54,000 / 60,000


def test_saturated_paced_runs_are_marked() -> None:
    results = Results()
    results.add("federation-2", 0, 64, 10000.0, 1, summary(4000.0, 900.0, 2000.0))
    assert "4,000 (saturated)" in tables(results)


def test_results_round_trip_through_json() -> None:
    results = sample_results()
    again = Results.from_json(json.loads(json.dumps(results.as_json())))
    assert tables(again) == tables(results)


def test_setup_order_puts_each_bridge_chain_before_its_federation() -> None:
    assert setup_order(["federation-3", "bridge-2", "single", "federation-2", "bridge-3", "relay-2"]) == \
        ["single", "bridge-2", "relay-2", "federation-2", "bridge-3", "federation-3"]


def test_setup_names_parse() -> None:
    assert SetupSpec.parse("single") == SetupSpec("single", 1)
    assert SetupSpec.parse("bridge-3").name == "bridge-3"
    assert SetupSpec.parse("relay-2") == SetupSpec("relay", 2)
    for bad in ("bridge-1", "federation", "chain-2", "bridge-x", "relay-1"):
        with pytest.raises(ValueError, match="single, bridge-N, federation-N or relay-N"):
            SetupSpec.parse(bad)


def test_rates_and_cases() -> None:
    assert parse_rates(["max", "1000", "2.5e3"]) == [None, 1000.0, 2500.0]
    with pytest.raises(argparse.ArgumentTypeError):
        parse_rates(["fast"])
    with pytest.raises(argparse.ArgumentTypeError):
        parse_rates(["-5"])
    made = cases([0, 1], [64], [None, 1000.0], count=5000, seconds=2.0)
    assert [(c.qos, c.rate, c.count) for c in made] == [(0, None, 5000), (0, 1000.0, 2000), (1, None, 5000),
                                                        (1, 1000.0, 2000)]
    assert made[1].label == "q0-64B-1000"


def test_broker_config_gets_lean_log_types_and_a_bridge() -> None:
    rendered = "listener 1883 127.0.150.10\nlog_dest topic\nlog_type all\nmax_queued_messages 0\n"
    conf = bench_conf(rendered, bridge_lines(0, "127.0.150.11")).splitlines()
    assert "log_type all" not in conf
    assert all(line in conf for line in WRAPPER_LOG_TYPES)
    assert "log_type debug" not in conf
    assert conf[conf.index("connection bench-bridge-0") + 1] == "address 127.0.150.11:1883"
    assert "topic bench/# out 1" in conf and "max_queued_messages 0" in conf and "set_tcp_nodelay true" in conf


def test_broker_config_gets_the_window_asked_for_in_place_of_the_templates() -> None:
    rendered = "listener 1883 127.0.150.10\nmax_inflight_messages 1000\nmax_queued_messages 0\n"
    assert "max_inflight_messages 1000" in bench_conf(rendered, None).splitlines()
    conf = bench_conf(rendered, None, max_inflight=20).splitlines()
    assert [line for line in conf if line.startswith("max_inflight_messages")] == ["max_inflight_messages 20"]


def test_cpu_seconds_of_this_process_and_of_a_missing_one() -> None:
    import os

    assert cpu_seconds(os.getpid()) > 0
    assert cpu_seconds(2**22 + 12345) == 0.0


def test_report_command_redraws_tables_from_saved_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps(sample_results().as_json()))
    status = main(["--report", str(saved), "--out", str(tmp_path / "again"), "--no-chart"])
    assert status == 1  # one run of the saved results had failed
    assert "federation-2" in capsys.readouterr().out
    assert (tmp_path / "again" / "tables.md").read_text().startswith("### QoS 0, 64 B payload")


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--setups", "chain-2"])
    assert "single, bridge-N, federation-N or relay-N" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--sizes", "8"])
    assert "--sizes: at least 31 bytes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--max-inflight", "70000"])
    assert "--max-inflight: 0" in capsys.readouterr().err


def test_chart_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from suites.bench.report import chart

    chart(sample_results(), tmp_path / "chart.png")
    assert (tmp_path / "chart.png").read_bytes().startswith(b"\x89PNG")
