"""The container image: Debian with Mosquitto and the wrapper's Python dependencies, built offline-ready.

Theory of operation: the containers have no internet and no image server is
reachable, so the image is built on the host, which can reach the Debian and
PyPI registries: `debootstrap` makes a minimal Debian root file system with
the Debian packages (`PACKAGES`), host-side `pip install --target` puts the
wrapper's Python requirements (read from setup.cfg, or from the installed
package's metadata outside a checkout) into the rootfs for the
image's Python version and CPU, the rootfs and a `metadata.yaml` are packed
into one tarball, and LXD imports it under an alias.

The alias is `mqtt-federation-<hash>` where the hash covers everything that
goes into the image (the recipe: suite, packages, requirements, architecture,
the files written into it and `RECIPE_VERSION`). The project's own code is
*not* in the image: it is pushed into each container at `up`, so editing the
code never rebuilds the image, and the second `up` finds the alias and takes
seconds. A change of dependencies changes the alias and builds a new image.

Builds are serialised with a lock file, so two provisioning runs never build
the same image twice at once. The build directory is removed afterwards;
LXD keeps its own copy of the image.
"""

from __future__ import annotations

import configparser
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

RECIPE_VERSION = 1
"""bump when the build steps change in a way the other fields do not show"""
SUITE = "bookworm"
PYTHON_VERSION = "3.11"
"""the python3 of SUITE: the wheels are chosen for it"""
PACKAGES = ("iproute2", "ifupdown", "isc-dhcp-client", "python3", "systemd-sysv", "procps",
            "mosquitto", "mosquitto-clients", "nftables")
"""minbase has no networking, init or Python; ifupdown + dhclient configure eth0 (systemd-networkd does not)"""
DEFAULT_MIRROR = "http://deb.debian.org/debian"
ALIAS_PREFIX = "mqtt-federation-"
DISTRIBUTION = "mqtt-federation"
"""this project's distribution name: its installed metadata stands in for setup.cfg outside a checkout"""
NETWORK_INTERFACES = "auto lo\niface lo inet loopback\n\nauto eth0\niface eth0 inet dhcp\n"
DEBOOTSTRAP_TIMEOUT = 1200.0
PIP_TIMEOUT = 600.0

Progress = Callable[[str], None]


class ImageError(Exception):
    """The image could not be built or imported; the message names the step and its log."""


@dataclass(frozen=True)
class ImageRecipe:
    """Everything that decides the image's content; its hash names the image."""

    requirements: tuple[str, ...]
    architecture: str
    suite: str = SUITE
    python_version: str = PYTHON_VERSION
    packages: tuple[str, ...] = PACKAGES
    network_interfaces: str = NETWORK_INTERFACES
    recipe_version: int = RECIPE_VERSION

    def digest(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def alias(self) -> str:
        return ALIAS_PREFIX + self.digest()[:12]

    def metadata_yaml(self, creation_date: int) -> str:
        return yaml.safe_dump({
            "architecture": self.architecture,
            "creation_date": creation_date,
            "properties": {
                "description": f"mqtt-federation node: Debian {self.suite}, mosquitto, wrapper dependencies "
                               f"({self.alias})",
                "os": "debian",
                "release": self.suite,
            },
        }, sort_keys=True)

    def pip_platforms(self) -> list[str]:
        """Wheel platform tags that run on the image's glibc (bookworm: 2.36) for this CPU."""
        machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(self.architecture, self.architecture)
        return [f"manylinux_2_{minor}_{machine}" for minor in (36, 34, 31, 28, 17)] + [
            f"manylinux2014_{machine}", f"linux_{machine}"]


def project_requirements(setup_cfg: Path) -> tuple[str, ...]:
    """`install_requires` of setup.cfg: what the wrapper needs at run time, sorted."""
    requirements = _setup_cfg_list(setup_cfg, "options", "install_requires")
    if not requirements:
        raise ImageError(f"{setup_cfg}: no [options] install_requires; the image's Python requirements come from it")
    return requirements


def project_extra(setup_cfg: Path, extra: str) -> tuple[str, ...]:
    """The requirements of one `extras_require` entry of setup.cfg (empty if it is not there)."""
    return _setup_cfg_list(setup_cfg, "options.extras_require", extra)


def _setup_cfg_list(setup_cfg: Path, section: str, key: str) -> tuple[str, ...]:
    if not setup_cfg.is_file():  # an installed package: its metadata holds the same lists
        return _installed_requirements(None if section == "options" else key)
    parser = configparser.ConfigParser()
    parser.read(setup_cfg, encoding="utf-8")
    text = parser.get(section, key, fallback="")
    entries = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return tuple(sorted(entry for entry in entries if entry))


def _installed_requirements(extra: str | None) -> tuple[str, ...]:
    """The installed distribution's requirements: unconditional ones (extra None) or one extra's, sorted."""
    try:
        declared = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return ()
    chosen = []
    for entry in declared:
        requirement, _, marker = (part.strip() for part in entry.partition(";"))
        wanted = re.fullmatch(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        if (not marker and extra is None) or (wanted is not None and wanted.group(1) == extra):
            chosen.append(requirement)
    return tuple(sorted(chosen))


def host_architecture() -> str:
    """The architecture name LXD uses for this machine (x86_64, aarch64)."""
    return platform.machine()


def default_recipe(repo_root: Path) -> ImageRecipe:
    return ImageRecipe(requirements=project_requirements(repo_root / "setup.cfg"), architecture=host_architecture())


# ---------------------------------------------------------------- building (touches the host)


@contextlib.contextmanager
def build_lock(cache_dir: Path) -> Iterator[None]:
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / "build.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(step: str, command: list[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> None:
    with open(log, "ab") as sink:
        sink.write(f"\n$ {' '.join(command)}\n".encode())
        sink.flush()
        try:
            result = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                    timeout=timeout, check=False, env=env)
        except FileNotFoundError as error:
            raise ImageError(f"{step}: {command[0]} is not installed ({error}); run `python lxc/provision.py up` "
                             f"without --no-setup, or apt-get install -y debootstrap") from error
        except subprocess.TimeoutExpired as error:
            raise ImageError(f"{step}: still running after {timeout:g} s; see {log}") from error
    if result.returncode != 0:
        lines = log.read_text(errors="replace").splitlines()[-15:]
        raise ImageError(f"{step} failed with status {result.returncode}; the end of {log}:\n" + "\n".join(lines))


def build_rootfs(recipe: ImageRecipe, rootfs: Path, log: Path, *, mirror: str, progress: Progress) -> None:
    """debootstrap + network config + Python requirements, in `rootfs` (which must not exist)."""
    started = time.monotonic()
    progress(f"image: debootstrap {recipe.suite} with {', '.join(recipe.packages)} (about a minute; log {log})")
    _run("debootstrap", ["debootstrap", "--variant=minbase", f"--include={','.join(recipe.packages)}",
                         recipe.suite, str(rootfs), mirror], log, DEBOOTSTRAP_TIMEOUT)
    (rootfs / "etc" / "network" / "interfaces").write_text(recipe.network_interfaces, encoding="utf-8")
    progress(f"image: debootstrap done in {time.monotonic() - started:.0f} s; installing Python requirements "
             f"{', '.join(recipe.requirements)}")
    target = rootfs / "usr" / "local" / "lib" / f"python{recipe.python_version}" / "dist-packages"
    abi = "cp" + recipe.python_version.replace(".", "")
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
               "--root-user-action=ignore", "--target", str(target), "--only-binary=:all:",
               "--python-version", recipe.python_version, "--implementation", "cp", "--abi", abi]
    for tag in recipe.pip_platforms():
        command += ["--platform", tag]
    _run("pip install into the image", command + list(recipe.requirements), log, PIP_TIMEOUT,
         env={**os.environ, "PIP_BREAK_SYSTEM_PACKAGES": "1"})
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
        directory = rootfs / leftover
        for item in directory.glob("*"):
            if item.is_file():
                item.unlink()


def pack_image(recipe: ImageRecipe, build_dir: Path, log: Path) -> Path:
    """metadata.yaml + rootfs/ as one uncompressed tarball (LXD's unified image format)."""
    (build_dir / "metadata.yaml").write_text(recipe.metadata_yaml(int(time.time())), encoding="utf-8")
    tarball = build_dir / "image.tar"
    _run("packing the image", ["tar", "-C", str(build_dir), "--numeric-owner", "--xattrs", "-cf", str(tarball),
                               "metadata.yaml", "rootfs"], log, 600.0)
    return tarball


def import_image(client: Any, tarball: Path, alias: str) -> str:
    """Import a unified tarball into LXD under `alias`; its fingerprint."""
    with open(tarball, "rb") as data:
        image = client.images.create(data, public=False, wait=True)  # streamed, not read into memory
    image.add_alias(alias, "mqtt-federation node image (lxc/provision.py)")
    return str(image.fingerprint)


def image_exists(client: Any, alias: str) -> bool:
    return bool(client.images.exists(alias, alias=True))


def ensure_image(client: Any, recipe: ImageRecipe, cache_dir: Path, *, mirror: str = DEFAULT_MIRROR,
                 progress: Progress) -> str:
    """The alias of an image built from `recipe`, building and importing it if LXD lacks it."""
    alias = recipe.alias
    if image_exists(client, alias):
        progress(f"image: {alias} is cached in LXD")
        return alias
    with build_lock(cache_dir):
        if image_exists(client, alias):  # built by another run while we waited for the lock
            progress(f"image: {alias} was built meanwhile")
            return alias
        started = time.monotonic()
        build_dir = cache_dir / f"build-{recipe.digest()[:12]}"
        if build_dir.exists():
            shutil.rmtree(build_dir)
        build_dir.mkdir(parents=True)
        log = cache_dir / f"build-{recipe.digest()[:12]}.log"
        log.write_text("", encoding="utf-8")
        try:
            build_rootfs(recipe, build_dir / "rootfs", log, mirror=mirror, progress=progress)
            progress("image: packing and importing into LXD")
            tarball = pack_image(recipe, build_dir, log)
            fingerprint = import_image(client, tarball, alias)
        finally:
            shutil.rmtree(build_dir, ignore_errors=True)
        progress(f"image: {alias} ({fingerprint[:12]}) built and imported in {time.monotonic() - started:.0f} s")
        return alias
