"""The shipped service files (packaging/), read as systemd and logrotate read them, with their paths movable.

    unit = read_unit()                                   # {"Service": {"Type": ["notify"], ...}, ...}
    argv = exec_start(unit)                              # the ExecStart command line, split
    moved = [installed_under(tmp_path, arg) for arg in argv]   # /etc/mqtt-federation/x -> TMP/etc/mqtt-federation/x

Tests use these to check the files offline (systemd-analyze, systemd-sysusers
and logrotate on copies whose paths point into a temporary directory) and to
run the unit's own command line against a real broker.
"""

from __future__ import annotations

import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGING = REPO / "packaging"
UNIT = PACKAGING / "systemd" / "mqtt-federation.service"
SYSUSERS = PACKAGING / "sysusers" / "mqtt-federation.conf"
LOGROTATE = PACKAGING / "logrotate" / "mqtt-federation"

SERVICE_USER = "mqtt-federation"
INSTALL_DIR = "/opt/mqtt-federation"
CONFIG_DIR = "/etc/mqtt-federation"
STATE_DIR = "/var/lib/mqtt-federation"
LOG_DIR = "/var/log/mqtt-federation"
INSTALLED_DIRS = (INSTALL_DIR, CONFIG_DIR, STATE_DIR, LOG_DIR)
"""the production layout (docs/install.md); every path the service files name is under one of these"""

Unit = dict[str, dict[str, list[str]]]


def read_unit(path: Path = UNIT) -> Unit:
    """section -> key -> every value given (systemd allows a key more than once), in file order."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        key, equals, value = line.partition("=")
        assert equals and section is not None, f"{path}:{number}: not `Key=value` inside a section: {raw!r}"
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def exec_start(unit: Unit) -> list[str]:
    """The one ExecStart command line, split as systemd splits it (no shell)."""
    (line,) = unit["Service"]["ExecStart"]
    return shlex.split(line)


def installed_under(root: Path, path: str) -> str:
    """A path of the production layout moved under `root` (other text unchanged)."""
    for prefix in INSTALLED_DIRS:
        if path == prefix or path.startswith(prefix + "/"):
            return str(root) + path
    return path
