"""The container image and the compose example under podman (issue 40, item 1): `pytest -m container`, as root.

No registry is reached. The images are built from a Debian 12 root file system the test makes itself
(debootstrap: python3, python3-venv, mosquitto, from the machine's Debian mirror) and imports into podman:

- the wrapper's image from packaging/container/Containerfile (`--build-arg BASE=` that root file system; users
  get python:3.11-slim), with this checkout's wheel and its dependencies' wheels in the build context
  (`pip download`), built with no network at all;
- a stand-in for eclipse-mosquitto:2 (Debian's mosquitto, run as the official image runs it:
  /mosquitto/config/mosquitto.conf, user mosquitto).

Then examples/compose/compose.yaml, copied out as `federation-configs copy examples/compose` would, runs
unchanged under podman-compose with those two images: three brokers, three wrappers, a federation key made by
the image (`genkey`). The three sites must become ready (/readyz, and the image's HEALTHCHECK run by podman),
and a publication at paris must reach subscribers at berlin and madrid. Every container, volume, network and
image the test made is removed at the end, also on failure.

The test installs what it lacks (podman, podman-compose, debootstrap, and runc where the machine's cgroups are
a v1/v2 hybrid that crun refuses) with apt-get, and skips with the reason when it cannot. About 2-3 minutes on
the 2-CPU development machine, most of it debootstrap.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from federation import __version__
from federation.tools import configs

from broker_util import MOSQUITTO_PUB, MOSQUITTO_SUB, wait_for

pytestmark = pytest.mark.container

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "packaging" / "container" / "Containerfile"
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "mosquitto", "mosquitto-clients")
TOOLS = (("podman", "podman"), ("podman-compose", "podman-compose"), ("debootstrap", "debootstrap"))
IMAGE_PREFIX = "localhost/mqtt-federation-test"
SITES = ("paris", "berlin", "madrid")
STEP_TIMEOUT = 900
READY_TIMEOUT = 180.0
MOSQUITTO_STAND_IN = """\
FROM {base}
RUN install -d -o mosquitto -g mosquitto /mosquitto/data /mosquitto/log && install -d /mosquitto/config
USER mosquitto
CMD ["/usr/sbin/mosquitto", "-c", "/mosquitto/config/mosquitto.conf"]
"""
"""eclipse-mosquitto:2 as far as the compose file uses it: its config path, its data directory, its user"""


def run(command: Sequence[str | Path], *, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = STEP_TIMEOUT, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(part) for part in command], cwd=cwd, env=env, capture_output=True, timeout=timeout,
                            check=False, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"`{' '.join(map(str, command))}` exited with {result.returncode}:\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def missing_tools() -> list[str]:
    packages = [package for command, package in TOOLS if shutil.which(command) is None]
    if Path("/sys/fs/cgroup/unified").is_dir() and shutil.which("runc") is None:
        packages.append("runc")  # crun refuses a v1/v2 hybrid cgroup hierarchy
    return packages


def install_tools() -> str | None:
    """Install what is missing; the reason the test cannot run, or None."""
    if os.geteuid() != 0:
        return "needs root: rootful podman, debootstrap"
    packages = missing_tools()
    if not packages:
        return None
    if shutil.which("apt-get") is None:
        return f"needs {', '.join(packages)} (no apt-get here to install them)"
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    installed = run(["apt-get", "install", "-y", "-q", *packages], env=environment, check=False)
    if installed.returncode != 0:
        run(["apt-get", "update", "-q"], env=environment, check=False)
        installed = run(["apt-get", "install", "-y", "-q", *packages], env=environment, check=False)
    if installed.returncode != 0:
        return f"apt-get install {' '.join(packages)} failed: {installed.stderr.strip()[-500:]}"
    return None


def debian_mirror() -> str:
    """The machine's own Debian mirror (its apt sources), else deb.debian.org; $FEDERATION_TEST_DEBIAN_MIRROR wins."""
    if os.environ.get("FEDERATION_TEST_DEBIAN_MIRROR"):
        return os.environ["FEDERATION_TEST_DEBIAN_MIRROR"]
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split()
            for word in words:
                if word.startswith("http") and word.rstrip("/").endswith("/debian"):
                    return word.rstrip("/")
    return DEFAULT_MIRROR


@dataclass
class Podman:
    """podman with the environment this machine needs (CONTAINERS_CONF) and the images the test built."""

    environment: dict[str, str]
    base: str
    wrapper: str
    mosquitto: str

    def __call__(self, *arguments: str | Path, check: bool = True,
                 timeout: float = STEP_TIMEOUT) -> subprocess.CompletedProcess[str]:
        return run(["podman", *arguments], env=self.environment, check=check, timeout=timeout)


def runtime_environment(work: Path, base: str) -> dict[str, str]:
    """os.environ, plus a containers.conf where podman's defaults cannot start a container here: a runtime that
    takes the cgroup hierarchy, and resource limits no higher than this process's (raising them needs
    CAP_SYS_RESOURCE, which some sandboxes drop)."""
    environment = dict(os.environ)
    probe = run(["podman", "run", "--rm", base, "true"], env=environment, check=False)
    if probe.returncode == 0:
        return environment
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lines = ["[containers]", f'default_ulimits = ["nofile={hard}:{hard}", "nproc=4096:4096"]']
    if shutil.which("runc") is not None:
        lines += ["[engine]", 'runtime = "runc"']
    conf = work / "containers.conf"
    conf.write_text("\n".join(lines) + "\n", encoding="utf-8")
    environment["CONTAINERS_CONF"] = str(conf)
    again = run(["podman", "run", "--rm", base, "true"], env=environment, check=False)
    if again.returncode != 0:
        pytest.skip(f"podman cannot start a container here: {probe.stderr.strip()[-300:]}; with {conf}: "
                    f"{again.stderr.strip()[-300:]}")
    return environment


def checkout_copy(target: Path) -> Path:
    """The files of this checkout (tracked and new), copied: the wheel is built from there, leaving no build/ here."""
    listed = run(["git", "-C", REPO, "ls-files", "--cached", "--others", "--exclude-standard", "-z"]).stdout
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    reason = install_tools()
    if reason is not None:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("container")
    tag = secrets.token_hex(3)
    names = Podman({}, f"{IMAGE_PREFIX}/debian-python:{tag}", f"{IMAGE_PREFIX}/wrapper:{tag}",
                   f"{IMAGE_PREFIX}/mosquitto:{tag}")
    rootfs = work / "rootfs"
    try:
        # A Debian 12 base of our own: no registry.
        run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, rootfs,
             debian_mirror()])
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        tarball = work / "rootfs.tar"
        run(["tar", "-C", rootfs, "-cf", tarball, "."])
        shutil.rmtree(rootfs)
        run(["podman", "import", tarball, names.base])
        tarball.unlink()
        names.environment = runtime_environment(work, names.base)
        # The wrapper's image: this checkout's wheel and the wheels it depends on, no network in the build.
        context = work / "context"
        context.mkdir()
        run([sys.executable, "-m", "build", "--wheel", "--outdir", context, checkout_copy(work / "source")])
        (wheel,) = context.glob("mqtt_federation-*.whl")
        run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", context, wheel])
        names("build", "--format", "docker", "--layers=false", "--network", "none", "--build-arg",
              f"BASE={names.base}", "--build-arg", "PIP_OPTIONS=--no-index --find-links /tmp/dist",
              "-f", CONTAINERFILE, "-t", names.wrapper, context)
        stand_in = work / "mosquitto"
        stand_in.mkdir()
        (stand_in / "Containerfile").write_text(MOSQUITTO_STAND_IN.format(base=names.base), encoding="utf-8")
        names("build", "--format", "docker", "--layers=false", "--network", "none", "-t", names.mosquitto, stand_in)
        yield names
    finally:
        for image in (names.wrapper, names.mosquitto, names.base):
            run(["podman", "rmi", "-f", image], env=names.environment or None, check=False)
        shutil.rmtree(work, ignore_errors=True)


def test_the_image_runs_its_own_user_with_every_script_and_a_healthcheck(podman: Podman) -> None:
    assert podman("run", "--rm", podman.wrapper, "--version").stdout.strip() == f"federation-wrapper {__version__}"
    for script in ("federation-configs", "federation-scenario", "federation-analyze"):
        answer = podman("run", "--rm", "--entrypoint", script, podman.wrapper, "--version").stdout.strip()
        assert answer == f"{script} {__version__}"
    user = podman("run", "--rm", "--entrypoint", "id", podman.wrapper).stdout
    assert user.startswith("uid=10500(mqtt-federation) gid=10500(mqtt-federation)"), user

    def configured(field: str) -> Any:
        template = "{{json .Config." + field + "}}"
        return json.loads(podman("image", "inspect", "--format", template, podman.wrapper).stdout)

    health = configured("Healthcheck")
    assert health["Test"][0] == "CMD-SHELL" and "/readyz" in health["Test"][1], health
    assert configured("Entrypoint") == ["federation-wrapper"]
    # A misspelt setting stops the wrapper at once, naming the variable.
    refused = podman("run", "--rm", "-e", "MQTT_FEDERATION_NEIGHBOURZ=x", podman.wrapper, check=False)
    assert refused.returncode == 2 and "MQTT_FEDERATION_NEIGHBOURZ: no such setting" in refused.stderr


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Compose:
    podman: Podman
    directory: Path
    project: str
    ports: dict[str, int]

    @property
    def environment(self) -> dict[str, str]:
        return {**self.podman.environment, "FEDERATION_IMAGE": self.podman.wrapper,
                "MOSQUITTO_IMAGE": self.podman.mosquitto, **{name: str(port) for name, port in self.ports.items()}}

    def __call__(self, *arguments: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(["podman-compose", "-p", self.project, *arguments], cwd=self.directory, env=self.environment,
                   check=check)

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def logs(self) -> str:
        parts = []
        for site in SITES:
            for role in ("broker", "wrapper"):
                name = self.container(f"{site}-{role}")
                text = self.podman("logs", name, check=False)
                parts.append(f"--- {name}\n{(text.stdout + text.stderr)[-1500:]}")
        return "\n".join(parts)


@pytest.fixture
def compose(podman: Podman, tmp_path: Path) -> Iterator[Compose]:
    """examples/compose copied out as a user copies it, with a federation key made by the image."""
    configs.copy(["examples/compose"], tmp_path)
    directory = tmp_path / "compose"
    key = directory / "federation.key"
    key.write_text(podman("run", "--rm", podman.wrapper, "genkey").stdout, encoding="utf-8")
    key.chmod(0o600)
    os.chown(key, 10500, 10500)  # the image's user
    ports = {f"{site.upper()}_{kind}_PORT": free_port() for site in SITES for kind in ("MQTT", "METRICS")}
    running = Compose(podman, directory, f"fedtest{os.getpid()}{secrets.token_hex(2)}", ports)
    try:
        yield running
    finally:
        running("down", "-v", check=False)
        podman("network", "rm", "-f", f"{running.project}_default", check=False)  # podman-compose 1.0 leaves it
        left = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={running.project}", "-q").stdout
        volumes = podman("volume", "ls", "-q", "--filter", f"label=io.podman.compose.project={running.project}")
        assert not left.strip() and not volumes.stdout.strip(), "the compose project left containers or volumes"


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=3) as answer:
            return bool(json.loads(answer.read())["ready"])
    except (urllib.error.URLError, OSError, ValueError):
        return False


def test_three_sites_federate_a_publication_end_to_end(compose: Compose) -> None:
    compose("up", "-d")
    metrics = {site: compose.ports[f"{site.upper()}_METRICS_PORT"] for site in SITES}
    wait_for(lambda: all(ready(port) for port in metrics.values()), READY_TIMEOUT, 1.0,
             lambda: f"the three wrappers to be ready:\n{compose.logs()}")
    for site in SITES:  # the image's HEALTHCHECK, as the engine runs it
        checked = compose.podman("healthcheck", "run", compose.container(f"{site}-wrapper"), check=False)
        assert checked.returncode == 0, f"{site}: {checked.stdout}{checked.stderr}"

    subscribers = {site: subprocess.Popen([MOSQUITTO_SUB, "-h", "127.0.0.1", "-p",
                                           str(compose.ports[f"{site.upper()}_MQTT_PORT"]), "-t", "demo/#", "-v",
                                           "-C", "1", "-W", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True)
                   for site in ("berlin", "madrid")}
    try:
        paris = str(compose.ports["PARIS_MQTT_PORT"])

        def delivered() -> bool:
            # Until each wrapper saw its subscriber's subscription, a publication reaches nobody: publish again.
            run([MOSQUITTO_PUB, "-h", "127.0.0.1", "-p", paris, "-t", "demo/hello", "-m", "from paris"])
            return all(process.poll() is not None for process in subscribers.values())

        wait_for(delivered, 60, 1.0, lambda: f"berlin and madrid to get paris' publication:\n{compose.logs()}")
        for site, process in subscribers.items():
            output, errors = process.communicate(timeout=10)
            assert process.returncode == 0 and output.strip() == "demo/hello from paris", (site, output, errors)
    finally:
        for process in subscribers.values():
            if process.poll() is None:
                process.kill()
                process.communicate()
