"""The stage probe of `python -m suites.bench.stages`: its clock, its snapshots, its table; and (`pytest -m
bench`) the command on a real federation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from suites.bench import stage_probe, stages
from suites.bench.stage_probe import StageClock

from broker_util import requires_mosquitto


class Pass:
    def run(self, packets: int) -> int:
        if packets < 0:
            raise ValueError(packets)
        return packets * 2


def test_a_wrapped_stage_counts_its_calls_and_clock_and_still_returns_and_raises() -> None:
    ticks = iter([1.0, 1.5, 2.0, 2.25])
    clock = StageClock(lambda: next(ticks))
    run = clock.timed("pass", Pass.run)
    assert run(Pass(), 3) == 6
    with pytest.raises(ValueError):
        run(Pass(), -1)
    assert clock.snapshot() == {"pass": [0.75, 2]}


def test_every_stage_is_a_method_that_exists() -> None:
    """A renamed method would leave the probe timing nothing (the wrapper would fail to start instead)."""
    import importlib
    for module, qualified in stage_probe.STAGES.values():
        class_name, method = qualified.split(".")
        assert callable(getattr(getattr(importlib.import_module(module), class_name), method)), qualified


def test_sigusr2_writes_a_numbered_snapshot_of_every_stage(tmp_path: Path) -> None:
    script = ("import os, signal\n"
              "from suites.bench import stage_probe\n"
              f"stage_probe.install({str(tmp_path)!r})\n"
              "os.kill(os.getpid(), signal.SIGUSR2)\n"
              "os.kill(os.getpid(), signal.SIGUSR2)\n")
    process = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert process.returncode == 0, process.stderr
    names = sorted(path.name for path in tmp_path.iterdir())
    pid = names[0].split("-")[1] if names else "?"
    assert names == [f"stages-{pid}-1.json", f"stages-{pid}-2.json"]
    counters = json.loads((tmp_path / names[1]).read_text())
    assert set(counters) == set(stage_probe.STAGES)
    assert all(calls == 0 for _seconds, calls in counters.values())  # nothing ran: no loop, no wrapper


def test_the_sitecustomize_loads_the_probe_in_wrappers_only(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(stage_probe.SITECUSTOMIZE)
    out = tmp_path / "out"
    out.mkdir()
    source = str(Path(stages.__file__).resolve().parents[2])
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), source]),
                   stage_probe.ENVIRONMENT: str(out)}
    check = "import sys; print('suites.bench.stage_probe' in sys.modules)"
    other = subprocess.run([sys.executable, "-c", check], env=environment, capture_output=True, text=True,
                           timeout=60)
    assert other.stdout.strip() == "False", other.stderr
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(check + "\n")
    probed = subprocess.run([sys.executable, str(wrapper)], env=environment, capture_output=True, text=True,
                            timeout=60)
    assert probed.stdout.strip() == "True", probed.stderr


def test_the_table_gives_each_stage_per_message_and_the_flood_against_warm() -> None:
    first_before = {label: [0.0, 0] for label in stage_probe.STAGES}
    first_after = {**first_before, "loop": [0.4, 200], "broker pass": [0.3, 100], "node, own publications": [0.1, 100]}
    last_after = {**first_before, "loop": [0.2, 150], "datagram pass": [0.15, 100]}
    first = stages.difference(first_before, first_after)
    last = stages.difference(first_before, last_after)
    assert stages.messages_per_pass(first, stages.FIRST_PASS, 100_000) == 1000
    assert stages.per_message(first, 100_000)["loop"] == pytest.approx(4.0)
    table = stages.report(first, last, 100_000, 2.0, 1000)
    assert "both wrappers' loops, in the flood: 6.00 µs per message" in table
    assert "in the flood 3.0 times that" in table
    node_row = next(line for line in table.splitlines() if line.startswith("node, own publications"))
    assert node_row.split()[-2:] == ["1.00", "-"]


@pytest.mark.bench
@requires_mosquitto
def test_the_command_reads_the_stages_of_real_wrappers(capsys: pytest.CaptureFixture[str]) -> None:
    subnet = int(os.environ.get("FEDERATION_BENCH_SUBNET", "150")) + 2
    assert stages.main(["--count", "20000", "--no-warm", "--subnet", str(subnet)]) == 0
    printed = capsys.readouterr().out
    assert "20,000 of 20,000 delivered" in printed, printed
    rows = {line[:28].strip(): line[28:].split() for line in printed.splitlines()[2:10]}
    assert float(rows["broker pass"][0]) > 0 and float(rows["datagram pass"][1]) > 0, printed
    assert float(rows["node, own publications"][0]) > 0 and float(rows["node, packets in"][1]) > 0, printed
