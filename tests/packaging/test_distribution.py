"""The sdist and the wheel as a user gets them: built, installed into a new virtual environment, run from elsewhere.

`python -m build` makes the sdist from a copy of this tree and the wheel from
that sdist (so the sdist holds what the build needs). The wheel goes into a
new virtual environment that sees the machine's site packages for the
dependencies (pyspark is large; CI installs it once) but holds its own copy
of this project, and every console script runs from a temporary directory
with no PYTHONPATH: a simulator scenario from the packaged topologies, the
Spark job on its event log, the example configs, `--help` of the others.
The sdist's own tests then run from the unpacked sdist.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

pytest.importorskip("build", reason="needs the `build` package (the test extra: pip install -e '.[test]')")

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = ("federation-wrapper", "federation-scenario", "federation-analyze", "federation-provision",
           "federation-demo", "federation-configs")
NOT_IN_SDIST = (".ci/", ".gitignore")
"""tracked files the sdist leaves out (CI and git plumbing); everything else tracked is in it"""
COPY_IGNORED = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".*_cache",
                                      ".hypothesis", "_shipped")
BUILD_TIMEOUT = 300
RUN_TIMEOUT = 300
SDIST_TESTS = ("tests/scenario/test_scenario_cli.py", "tests/daemon/test_daemon_cli.py", "tests/lxd/test_lxd_plan.py",
               "tests/packaging/test_service_files.py", "tests/packaging/test_shipped.py")
"""tests of the unpacked sdist that read what only a complete sdist has: topologies, docs, setup.cfg, packaging/"""


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheel: Path


def clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without what would make Python import this checkout instead."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    return {**environment, **extra}


def run(command: Sequence[str | Path], cwd: Path, timeout: float = RUN_TIMEOUT,
        expect: int = 0) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(part) for part in command], cwd=cwd, env=clean_environment(), capture_output=True,
                            text=True, timeout=timeout, check=False)
    assert result.returncode == expect, (f"{' '.join(map(str, command))} exited with {result.returncode}, expected "
                                         f"{expect}:\nstdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}")
    return result


def source_files(tracked_only: bool = False) -> list[str] | None:
    """The checkout's files (tracked, and unless `tracked_only` untracked ones git does not ignore: a new module
    not yet added is built too), or None outside a git checkout."""
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        return None
    untracked = [] if tracked_only else ["--others", "--exclude-standard"]
    result = subprocess.run([git, "-C", str(REPO), "ls-files", "--cached", *untracked, "-z"],
                            capture_output=True, timeout=60, check=False)
    if result.returncode != 0:
        return None
    return sorted(name for name in result.stdout.decode().split("\0") if name and (REPO / name).is_file())


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The sdist and the wheel, built from a copy of this tree (the build writes egg-info beside its sources)."""
    work = tmp_path_factory.mktemp("build")
    source = work / "source"
    files = source_files()
    if files is None:  # an unpacked sdist: it holds nothing else
        shutil.copytree(REPO, source, ignore=COPY_IGNORED)
    else:
        for name in files:
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    run([sys.executable, "-m", "build", "--outdir", work / "dist", source], cwd=work, timeout=BUILD_TIMEOUT)
    (sdist,) = (work / "dist").glob("*.tar.gz")
    (wheel,) = (work / "dist").glob("*.whl")
    return Built(sdist, wheel)


@pytest.fixture(scope="module")
def venv(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment holding the wheel; dependencies come from the machine's site packages."""
    environment = tmp_path_factory.mktemp("venv") / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", environment], cwd=environment.parent)
    # The machine's pip installs into the venv: quicker than ensurepip, which Debian has only in python3-venv.
    run([sys.executable, "-m", "pip", "--python", environment / "bin" / "python", "install", "--no-deps",
         "--no-index", "--ignore-installed", "--quiet", "--disable-pip-version-check", built.wheel],
        cwd=environment.parent)
    return environment


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory outside the checkout."""
    directory = tmp_path / "elsewhere"
    directory.mkdir()
    return directory


def python_in(venv: Path, code: str, cwd: Path) -> str:
    return run([venv / "bin" / "python", "-c", code], cwd=cwd).stdout


# ---------------------------------------------------------------- what the archives hold


def test_sdist_holds_every_file_of_the_checkout(built: Built) -> None:
    with tarfile.open(built.sdist) as archive:
        top, *_ = archive.getnames()
        members = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for needed in ("LICENSE", "README.md", "pytest.ini", "setup.py", "setup.cfg", "wrapper.py", "spark/convergence.py",
                   "lxc/provision.py", "configs/mosquitto.conf", "tests/conftest.py", "docs/install.md",
                   "packaging/systemd/mqtt-federation.service"):
        assert needed in members, f"{needed} is not in {built.sdist.name}"
    files = source_files(tracked_only=True)
    if files is None:
        pytest.skip("not a git checkout: only the files the tests need were checked")
    missing = [name for name in files if name not in members and not name.startswith(NOT_IN_SDIST)]
    assert not missing, f"{built.sdist.name} ({top}) lacks {missing[:20]}: add them to MANIFEST.in"
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in members)


def test_wheel_holds_only_the_package_its_data_and_full_metadata(built: Built) -> None:
    with zipfile.ZipFile(built.wheel) as archive:
        names = archive.namelist()
        info = next(name.split("/")[0] for name in names if name.endswith(".dist-info/METADATA"))
        metadata = archive.read(f"{info}/METADATA").decode()
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert {name.split("/")[0] for name in names} == {"federation", info}, "a top-level name besides `federation`"
    suites = [name for name in names if name.startswith(("federation/tools/bench/", "federation/tools/faults/",
                                                         "federation/tools/transparency/"))]
    assert suites == [], "the benchmarks and suites live in suites/, outside the installed package"
    for needed in ("federation/_shipped/configs/mosquitto.conf", "federation/_shipped/configs/wrapper.yaml",
                   "federation/_shipped/configs/topologies/seed-partition.yaml",
                   "federation/_shipped/examples/three-sites/paris/wrapper.yaml",
                   "federation/_shipped/packaging/systemd/mqtt-federation.service",
                   "federation/spark/convergence.py", "federation/spark/log4j2.properties", "federation/py.typed",
                   f"{info}/licenses/LICENSE"):
        assert needed in names, f"{needed} is not in {built.wheel.name}"
    for field in ("License: Apache-2.0", "Author: mqtt-federation contributors",
                  "Maintainer: mqtt-federation contributors", "Requires-Python: >=3.11", "Keywords: ",
                  "Classifier: Operating System :: POSIX :: Linux", "Provides-Extra: spark", "Provides-Extra: lxc"):
        assert field in metadata, f"METADATA lacks {field!r}"
    for script in SCRIPTS:
        assert f"{script} = " in entry_points, f"no console script {script}"


# ---------------------------------------------------------------- the installed scripts, run from elsewhere


def test_installed_package_is_the_wheels_copy(venv: Path, elsewhere: Path) -> None:
    imported = python_in(venv, "import federation; print(federation.__file__)", elsewhere).strip()
    assert Path(imported).is_relative_to(venv), f"the venv imports {imported}, not its own copy"


def test_the_wheel_carries_the_built_c_extension(built: Built, venv: Path, elsewhere: Path) -> None:
    """setup.py builds federation.daemon._mqtt_runs (a C compiler is on the machines `make test` runs on); the
    installed wrapper uses it. Where none is found the build goes on without it (mqtt_runs.py's Python)."""
    with zipfile.ZipFile(built.wheel) as archive:
        assert any(name.startswith("federation/daemon/_mqtt_runs.") and name.endswith(".so")
                   for name in archive.namelist())
    answer = python_in(venv, "from federation.daemon import mqtt_runs; print(mqtt_runs.NATIVE)", elsewhere).strip()
    assert answer == "True"


def test_simulator_scenario_then_spark_job_on_its_event_log(venv: Path, elsewhere: Path) -> None:
    scripts = venv / "bin"
    topology = Path(run([scripts / "federation-configs", "path", "topologies/seed-partition.yaml"],
                        cwd=elsewhere).stdout.strip())
    assert topology.is_relative_to(venv) and topology.is_file(), topology
    events, report = elsewhere / "events.jsonl", elsewhere / "report.json"
    run([scripts / "federation-scenario", "run", topology, "--backend", "sim", "--seed", "1", "--events", events,
         "--report", report], cwd=elsewhere)
    simulated = json.loads(report.read_text())
    # One shuffle partition: a third less time for a log this small (the default is 2).
    run([scripts / "federation-analyze", "--events", events, "--out", elsewhere / "analysis", "--no-plots",
         "--partitions", "1"], cwd=elsewhere)
    analysed = json.loads((elsewhere / "analysis" / "report.json").read_text())
    for count in ("sent", "expected_deliveries", "delivered", "lost", "duplicates"):
        assert analysed["publications"][count] == simulated["publications"][count], count
    assert len(analysed["convergence"]) == len(simulated["convergence"])


def test_every_script_answers_help_and_the_job_path_is_installed(venv: Path, elsewhere: Path) -> None:
    scripts = venv / "bin"
    for script in SCRIPTS:
        assert "usage:" in run([scripts / script, "--help"], cwd=elsewhere).stdout, script
    job = Path(run([scripts / "federation-analyze", "--job-path"], cwd=elsewhere).stdout.strip())
    assert job.is_relative_to(venv) and job.name == "convergence.py" and job.is_file(), job
    assert run([scripts / "python", "-m", "federation.spark", "--job-path"], cwd=elsewhere).stdout.strip() == str(job)
    assert "usage:" in run([scripts / "python", "-m", "federation.daemon.cli", "--help"], cwd=elsewhere).stdout


def test_every_script_answers_version_with_its_own_name(venv: Path, elsewhere: Path) -> None:
    version = python_in(venv, "import federation; print(federation.__version__)", elsewhere).strip()
    for script in SCRIPTS:
        answer = run([venv / "bin" / script, "--version"], cwd=elsewhere).stdout.strip()
        assert answer == f"{script} {version}", script
        shown = run([venv / "bin" / script, "--help"], cwd=elsewhere).stdout
        assert f"usage: {script}" in shown, script  # the installed name, not wrapper.py or python -m ...


def test_example_configs_print_and_copy(venv: Path, elsewhere: Path) -> None:
    configs = venv / "bin" / "federation-configs"
    shown = run([configs, "show", "mosquitto.conf"], cwd=elsewhere).stdout
    assert shown == (REPO / "configs" / "mosquitto.conf").read_text(encoding="utf-8")
    listed = run([configs, "list"], cwd=elsewhere).stdout.split()
    assert "configs/wrapper.yaml" in listed and "packaging/logrotate/mqtt-federation" in listed
    run([configs, "copy", "mosquitto.conf", "wrapper.yaml", "examples/home-iot", "--dest", elsewhere / "site"],
        cwd=elsewhere)
    assert (elsewhere / "site" / "wrapper.yaml").read_text() == (REPO / "configs" / "wrapper.yaml").read_text()
    assert (elsewhere / "site" / "home-iot" / "kitchen.yaml").is_file()
    refused = run([configs, "copy", "wrapper.yaml", "--dest", elsewhere / "site"], cwd=elsewhere, expect=2)
    assert "--force" in refused.stderr
    assert "topologies/line5.yaml" in run([configs, "show", "line5.yaml"], cwd=elsewhere, expect=2).stderr


def test_demo_launcher_and_lxd_use_the_packaged_files(venv: Path, elsewhere: Path) -> None:
    found = json.loads(python_in(venv, (
        "import io, json, tarfile\n"
        "from federation.harness.nodeconfig import MOSQUITTO_CONF_TEMPLATE, wrapper_program\n"
        "from federation.lxd.cluster import project_bundle\n"
        "from federation.lxd.image import default_recipe\n"
        "from federation.tools.launch import REPO_ROOT\n"
        "names = tarfile.open(fileobj=io.BytesIO(project_bundle()), mode='r:gz').getnames()\n"
        "print(json.dumps({'template': str(MOSQUITTO_CONF_TEMPLATE), 'exists': MOSQUITTO_CONF_TEMPLATE.is_file(),\n"
        "                  'program': wrapper_program(), 'bundle': names,\n"
        "                  'requirements': list(default_recipe(REPO_ROOT).requirements)}))\n"), elsewhere))
    assert found["exists"] and Path(found["template"]).is_relative_to(venv), found["template"]
    assert found["program"] == ["-m", "federation.daemon.cli"]
    assert "wrapper.py" in found["bundle"] and "federation/daemon/cli.py" in found["bundle"]
    assert any(requirement.startswith("paho-mqtt") for requirement in found["requirements"]), found["requirements"]


# ---------------------------------------------------------------- the sdist's own tests


def test_sdist_tests_run_from_the_unpacked_sdist(built: Built, tmp_path: Path) -> None:
    with tarfile.open(built.sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    (unpacked,) = tmp_path.iterdir()
    imported = run([sys.executable, "-c", "import federation; print(federation.__file__)"], cwd=unpacked).stdout
    assert Path(imported.strip()).is_relative_to(unpacked), imported
    result = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SDIST_TESTS], cwd=unpacked)
    assert " passed" in result.stdout and " failed" not in result.stdout, result.stdout[-2000:]
