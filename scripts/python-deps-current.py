"""Exit 0 if this repository's editable install is current, 1 if pip must run.

Current means: build/install-deps.stamp holds the hash of setup.cfg,
pyproject.toml, setup.py, the C extension's sources (federation/**/*.c: an
editable install compiles them in place, so a changed one needs pip again)
and the interpreter path written after the last successful install;
`mqtt-federation` is installed editable from this directory; and every
requirement, with the `test` extra, is installed at an accepted version.
`--write-stamp` records the stamp (scripts/install-deps.sh calls it after pip).
"""

from __future__ import annotations

import hashlib
import json
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAMP = REPO / "build" / "install-deps.stamp"
EXTRA = "test"


def fingerprint() -> str:
    digest = hashlib.sha256(sys.executable.encode())
    for path in [REPO / "setup.cfg", REPO / "pyproject.toml", REPO / "setup.py",
                 *sorted((REPO / "federation").rglob("*.c"))]:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def is_current() -> bool:
    if not STAMP.exists() or STAMP.read_text().strip() != fingerprint():
        return False
    try:
        from packaging.requirements import Requirement  # comes with pytest
        dist = metadata.distribution("mqtt-federation")
    except (ImportError, metadata.PackageNotFoundError):
        return False
    direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct_url.get("url") != REPO.as_uri() or not direct_url.get("dir_info", {}).get("editable"):
        return False
    for text in dist.requires or []:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": EXTRA}):
            continue
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            return False
        if not requirement.specifier.contains(version, prereleases=True):
            return False
    return True


def main() -> int:
    if "--write-stamp" in sys.argv[1:]:
        STAMP.parent.mkdir(exist_ok=True)
        STAMP.write_text(fingerprint() + "\n")
        return 0
    return 0 if is_current() else 1


if __name__ == "__main__":
    sys.exit(main())
