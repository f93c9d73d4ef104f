"""The LXD backend is a deployment adapter of the package: it takes what it shares with the loopback launcher from
`federation.harness`, never from `federation.tools` (benchmarks and verification suites leave the package, issue 40
item 7)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LXD_MODULES = sorted(f"federation.lxd.{path.stem}" for path in (REPO / "federation" / "lxd").glob("*.py"))


def test_no_lxd_module_loads_the_tools() -> None:
    # A fresh interpreter: what is loaded counts every import on the way, also the harness's own.
    program = ("import importlib, json, sys\n"
               f"for name in {LXD_MODULES!r}:\n"
               "    importlib.import_module(name)\n"
               "print(json.dumps(sorted(m for m in sys.modules if m.startswith('federation.'))))\n")
    loaded = json.loads(subprocess.run([sys.executable, "-c", program], cwd=REPO, check=True, capture_output=True,
                                       text=True, timeout=60).stdout)
    assert "federation.lxd.cli" in loaded and "federation.harness.nodeconfig" in loaded
    assert [name for name in loaded if name == "federation.tools" or name.startswith("federation.tools.")] == []
