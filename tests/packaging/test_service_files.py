"""The service files under packaging/, checked offline by the tools that read them on a real host.

`systemd-analyze verify` and `systemd-analyze security --offline` read the
unit (with ExecStart pointed at an executable that exists here: verify checks
it), `systemd-sysusers --root` creates the service user in a scratch root, and
logrotate rotates an event log that a live `EventLog` keeps writing, with
the copytruncate the file documents as the alternative to its SIGHUP.
tests/real/test_systemd_service.py runs the unit's command line against a
real broker; tests/real/test_signals_real.py runs the logrotate file as
shipped (its postrotate's SIGHUP) against a live wrapper.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from federation.daemon.event_log import EventLog
from federation.protocol.types import Event

from service_util import (
    CONFIG_DIR,
    INSTALL_DIR,
    LOG_DIR,
    LOGROTATE,
    REPO,
    SERVICE_USER,
    STATE_DIR,
    SYSUSERS,
    UNIT,
    exec_start,
    installed_under,
    read_unit,
)

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
LOGROTATE_TOOL = shutil.which("logrotate") or ("/usr/sbin/logrotate" if os.path.exists("/usr/sbin/logrotate") else None)
SYSTEMD_SYSUSERS = shutil.which("systemd-sysusers")
MAX_EXPOSURE = 2.0
"""`systemd-analyze security` exposure (0 safest, 10 unsafe) the unit must stay at or under (1.3 when written)"""

needs_systemd = pytest.mark.skipif(SYSTEMD_ANALYZE is None,
                                   reason="needs systemd-analyze: apt-get install systemd (scripts/install-deps.sh)")


def unit_copy(tmp_path: Path) -> Path:
    """The unit with its executable replaced by one that exists here (verify checks that it does)."""
    text = UNIT.read_text(encoding="utf-8")
    program = exec_start(read_unit())[0]
    assert program in text
    copy = tmp_path / UNIT.name
    copy.write_text(text.replace(program, "/bin/true"), encoding="utf-8")
    return copy


# ---------------------------------------------------------------- the unit


def test_unit_is_a_notify_service_of_its_own_user_in_the_documented_layout() -> None:
    service = read_unit()["Service"]
    assert service["Type"] == ["notify"]
    assert service["Restart"] == ["on-failure"]
    assert service["User"] == [SERVICE_USER] and service["Group"] == [SERVICE_USER]
    assert service["StateDirectory"] == ["mqtt-federation"] and service["LogsDirectory"] == ["mqtt-federation"]
    argv = exec_start(read_unit())
    assert argv[0] == f"{INSTALL_DIR}/bin/federation-wrapper"
    options = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert options == {"--config": f"{CONFIG_DIR}/wrapper.yaml", "--state-dir": STATE_DIR,
                       "--event-log": f"{LOG_DIR}/events.jsonl"}
    for hardening in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes"):
        key, value = hardening.split("=")
        assert service.get(key) == [value], hardening
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"]  # SIGHUP: reopen the event log, read keys again


def test_docs_install_names_the_units_paths() -> None:
    text = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    for path in (f"{INSTALL_DIR}/bin/federation-wrapper", f"{CONFIG_DIR}/wrapper.yaml",
                 f"{CONFIG_DIR}/federation.key", STATE_DIR, f"{LOG_DIR}/events.jsonl",
                 "packaging/systemd/mqtt-federation.service", "packaging/logrotate/mqtt-federation",
                 "packaging/sysusers/mqtt-federation.conf"):
        assert path in text, f"docs/install.md does not mention {path}"


@needs_systemd
def test_systemd_analyze_verify_finds_nothing(tmp_path: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    result = subprocess.run([SYSTEMD_ANALYZE, "verify", str(unit_copy(tmp_path))], capture_output=True, text=True,
                            timeout=60, check=False)
    # verify exits 0 on unknown keys and bad values too (it only warns): any output is a finding.
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.returncode, result.stdout, result.stderr)


@needs_systemd
def test_systemd_analyze_security_rates_the_unit_ok(tmp_path: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    result = subprocess.run([SYSTEMD_ANALYZE, "security", "--offline=true", "--no-pager", str(unit_copy(tmp_path))],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    overall = [line for line in result.stdout.splitlines() if "Overall exposure level" in line]
    assert overall, result.stdout[-2000:]
    exposure = float(overall[-1].split(":")[1].split()[0])
    assert exposure <= MAX_EXPOSURE, "\n".join(line for line in result.stdout.splitlines() if "✗" in line)


@pytest.mark.skipif(SYSTEMD_SYSUSERS is None or os.geteuid() != 0,
                    reason="needs systemd-sysusers and root (it writes the scratch root's /etc/passwd as root)")
def test_sysusers_file_creates_the_service_user(tmp_path: Path) -> None:
    assert SYSTEMD_SYSUSERS is not None
    (tmp_path / "etc").mkdir()
    result = subprocess.run([SYSTEMD_SYSUSERS, f"--root={tmp_path}", str(SYSUSERS)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    users = {line.split(":")[0]: line.split(":") for line in (tmp_path / "etc" / "passwd").read_text().splitlines()}
    assert users[SERVICE_USER][5] == STATE_DIR and users[SERVICE_USER][6] == "/usr/sbin/nologin"
    assert SERVICE_USER in (tmp_path / "etc" / "group").read_text()


# ---------------------------------------------------------------- the event log under logrotate


def event(number: int) -> Event:
    return Event(float(number), "127.0.0.1:10500", "counters", {"number": number})


def test_logrotate_file_renames_creates_and_signals_the_service() -> None:
    config = LOGROTATE.read_text(encoding="utf-8")
    directives = [line.strip() for line in config.splitlines() if line.strip() and not line.startswith("#")]
    assert f"create 0640 {SERVICE_USER} {SERVICE_USER}" in directives and "copytruncate" not in directives
    start, end = directives.index("postrotate"), directives.index("endscript")
    assert directives[start + 1:end] == [
        "systemctl kill --kill-whom=main --signal=HUP mqtt-federation.service >/dev/null 2>&1 || true"]


def copytruncate_variant(config: str) -> str:
    """The shipped file with its documented alternative: `copytruncate` instead of create + postrotate."""
    lines = config.splitlines()
    start = next(index for index, line in enumerate(lines) if line.strip().startswith("create "))
    end = next(index for index, line in enumerate(lines) if line.strip() == "endscript")
    return "\n".join([*lines[:start], "    copytruncate", *lines[end + 1:]]) + "\n"


@pytest.mark.skipif(LOGROTATE_TOOL is None, reason="needs logrotate: apt-get install logrotate (install-deps.sh)")
def test_logrotate_copytruncate_alternative_keeps_the_live_event_log_whole(tmp_path: Path) -> None:
    """The documented alternative to SIGHUP: rotation while the wrapper's EventLog holds the file open; old lines
    in events.jsonl.1, new lines at the start of the cut file (O_APPEND), no hole of NUL bytes."""
    assert LOGROTATE_TOOL is not None
    config = copytruncate_variant(LOGROTATE.read_text(encoding="utf-8"))
    assert f"su {SERVICE_USER} {SERVICE_USER}" in config and "\n    copytruncate\n" in config
    assert "\n    postrotate" not in config
    log_path = Path(installed_under(tmp_path, f"{LOG_DIR}/events.jsonl"))
    # Rotate as whoever runs the test: the service user does not exist here.
    config = config.replace(f"{LOG_DIR}/", f"{log_path.parent}/").replace(
        f"su {SERVICE_USER} {SERVICE_USER}", "su root root" if os.geteuid() == 0 else "")
    (tmp_path / "logrotate.conf").write_text(config, encoding="utf-8")

    events = EventLog(log_path, None)
    try:
        events.write([event(number) for number in range(100)])
        events.flush()
        result = subprocess.run([LOGROTATE_TOOL, "--force", "--state", str(tmp_path / "logrotate.state"),
                                 str(tmp_path / "logrotate.conf")], capture_output=True, text=True, timeout=60,
                                check=False)
        assert result.returncode == 0 and not result.stderr.strip(), result.stderr
        events.write([event(number) for number in range(100, 110)])
        events.flush()
    finally:
        events.close()
    rotated = log_path.with_name("events.jsonl.1").read_bytes()
    live = log_path.read_bytes()
    assert rotated.count(b"\n") == 100 and b'"number":99}' in rotated
    assert b"\0" not in live, "the writer kept its old offset: the event log must be opened with O_APPEND"
    assert live.count(b"\n") == 10 and live.startswith(b'{"v":2,"t":100.0,')
