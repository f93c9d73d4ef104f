"""Build step for the wheel: everything else is declared in setup.cfg.

The wheel carries the repository's `configs/`, `examples/` and `packaging/`
(the example broker and wrapper configs, scenario topologies, the systemd
unit, ...) as `federation/_shipped/`, where `federation.shipped` finds them
once installed. They stay where they are in the repository, where the docs
and the tests name them; `build_py` copies them at build time. An editable
install reads the checkout's folders instead and gets no copy.

One C extension, `federation.daemon._mqtt_runs` (the MQTT data path's loops,
federation/daemon/mqtt_runs.py), is optional: where no C compiler is found
the build warns and goes on, and the package uses the same loops in Python.
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from federation.shipped import PACKAGED_ROOT, SHIPPED_FOLDERS  # noqa: E402 - the source tree being built

SHIPPED_PACKAGE_DIR = PACKAGED_ROOT.relative_to(HERE)


def shipped_files() -> list[Path]:
    return sorted(path.relative_to(HERE) for folder in SHIPPED_FOLDERS for path in (HERE / folder).rglob("*")
                  if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc")


class BuildWithShippedFiles(build_py):
    """build_py, plus a copy of the shipped folders into the built package."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for relative in shipped_files():
            target = Path(self.build_lib) / SHIPPED_PACKAGE_DIR / relative
            self.mkpath(str(target.parent))
            self.copy_file(str(HERE / relative), str(target))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            outputs += [str(Path(self.build_lib) / SHIPPED_PACKAGE_DIR / relative) for relative in shipped_files()]
        return outputs


MQTT_RUNS = Extension("federation.daemon._mqtt_runs", sources=["federation/daemon/_mqtt_runs.c"], optional=True)

setup(cmdclass={"build_py": BuildWithShippedFiles}, ext_modules=[MQTT_RUNS])
