"""The wrapper's configuration accepts the federation modes and measures the capability."""

from __future__ import annotations

from pathlib import Path

import pytest

from federation.daemon.config import ConfigError, load_config, measured_capability
from federation.protocol.settings import Settings


def config_file(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "wrapper.yaml"
    path.write_text(text, encoding="utf-8")
    return {"config": str(path), "bind": "127.0.0.1:10500"}


def test_modes_in_the_yaml_settings(tmp_path: Path) -> None:
    flags = config_file(tmp_path, """settings:
  replication: {"alerts/#": full}
  replication_root: lowest_id
  core_placement: hash
  owned: ["kitchen/#", "garage/+/door"]
""")
    settings = load_config(flags).settings
    assert settings.replication == (("alerts/#", "full"),)
    assert settings.core_placement == "hash"
    assert settings.owned == ("garage/+/door", "kitchen/#")
    assert settings.capability == 0  # not measured: the root is not chosen by capability


def test_bad_mode_is_a_config_error_naming_file_and_fix(tmp_path: Path) -> None:
    flags = config_file(tmp_path, "settings:\n  owned: [\"kitchen/#/x\"]\n")
    with pytest.raises(ConfigError) as caught:
        load_config(flags)
    expected = "wrapper.yaml: settings.owned[0]: topic filter 'kitchen/#/x': '#' must be the last level"
    assert expected in str(caught.value)


def test_capability_is_measured_from_proc_at_start_up(tmp_path: Path) -> None:
    flags = config_file(tmp_path, "settings:\n  replication: full\n  replication_root: capability\n")
    measured = load_config(flags).settings.capability
    assert measured > 0  # this machine's /proc
    given = config_file(tmp_path, "settings:\n  replication_root: capability\n  capability: 42\n")
    assert load_config(given).settings.capability == 42  # a number given is kept


def test_capability_formula_and_unreadable_proc(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text("processor : 0\ncpu MHz : 1000.0\nprocessor : 1\ncpu MHz : 1000.0\n")
    (proc / "meminfo").write_text("MemTotal:        4194304 kB\n")
    settings = Settings.from_mapping({"replication_root": "capability", "capability_cpu_weight": 2,
                                      "capability_memory_weight": 0.5})
    assert measured_capability(settings, "settings", proc).capability == 2 * 2000 + 0.5 * 4096
    with pytest.raises(ConfigError, match="settings.capability: cannot measure it"):
        measured_capability(settings, "settings", tmp_path / "missing")
    (proc / "cpuinfo").write_text("processor : 0\n")
    (proc / "meminfo").write_text("\n")
    with pytest.raises(ConfigError, match=r"give this node's capability as a number > 0"):
        measured_capability(settings, "settings", proc)
