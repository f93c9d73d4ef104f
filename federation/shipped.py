"""The files the project ships beside its code: example configs, scenario topologies, examples, service files.

Theory of operation: in a checkout these are the repository's own folders
(`configs/`, `examples/`, `packaging/`). An installed package has no
repository around it, so the wheel carries copies of the same folders in
`federation/_shipped/` (setup.py's build step copies them there; nothing in
git lives there). `ROOT` is the first of the two that exists, the packaged
copy first, so the demo, the launcher and `federation-configs` read the same
files from a wheel as from a checkout, and a name resolves to one file or
raises `ShippedFileError` with what exists instead.
"""

from __future__ import annotations

from pathlib import Path

SHIPPED_FOLDERS = ("configs", "examples", "packaging")
"""top-level folders of the repository that the wheel carries (setup.py copies them; keep the two in step)"""
PACKAGED_ROOT = Path(__file__).resolve().parent / "_shipped"
"""where a wheel holds the copies"""
CHECKOUT_ROOT = Path(__file__).resolve().parent.parent
"""the repository, when this package is a checkout's"""
ROOT = PACKAGED_ROOT if PACKAGED_ROOT.is_dir() else CHECKOUT_ROOT
"""the folder that holds `configs/`, `examples/` and `packaging/` for this installation"""
DEFAULT_FOLDER = "configs"
"""a name without a folder is looked up here first: `mosquitto.conf` is `configs/mosquitto.conf`"""


class ShippedFileError(LookupError):
    """A name that is no shipped file or folder (or more than one); the message lists what would do."""


def listing(root: Path = ROOT) -> list[str]:
    """Every shipped file, as a path relative to `root` (`configs/wrapper.yaml`, ...), sorted."""
    names = []
    for folder in SHIPPED_FOLDERS:
        for path in (root / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                names.append(path.relative_to(root).as_posix())
    return sorted(names)


def resolve(name: str, root: Path = ROOT) -> Path:
    """The shipped file or folder called `name`: a path relative to the root (`configs/topologies/line5.yaml`,
    `examples/three-sites`) or to `configs/` (`mosquitto.conf`, `topologies/line5.yaml`)."""
    relative = Path(name.strip("/"))
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise ShippedFileError(f"{name!r}: give a name relative to the shipped folders, as `federation-configs "
                               f"list` prints them")
    candidates = [root / relative] if relative.parts[0] in SHIPPED_FOLDERS else []
    candidates.append(root / DEFAULT_FOLDER / relative)
    for candidate in candidates:
        if candidate.exists():
            return candidate
    similar = [entry for entry in listing(root) if entry.endswith("/" + relative.name)]
    hint = (f"; did you mean {', '.join(similar[:8])}?" if similar
            else "; `federation-configs list` prints every shipped file")
    raise ShippedFileError(f"no shipped file or folder {name!r} under {root}{hint}")
