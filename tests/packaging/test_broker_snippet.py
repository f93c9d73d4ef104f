"""configs/mosquitto-federation.conf, the drop-in for an existing broker (issue 40, item 2).

Debian's own /etc/mosquitto/mosquitto.conf (as the package ships it: its checksum is dpkg's) runs twice in a
network namespace of the test's own, where its default listener (port 1883, local only) is free: once with an
empty conf.d and once with the snippet in conf.d. Its paths are moved into a temporary directory, nothing else
of it changes. Both runs must listen on the same sockets, accept the same anonymous client, write the same
persistence file and keep a retained message across a restart, and write Debian's log file; only the run with
the snippet publishes its log on $SYS/broker/log/#, subscribe lines included.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from federation import shipped
from federation.harness.processes import poll
from federation.netns import system

pytestmark = [pytest.mark.broker, pytest.mark.netns]

REPO = Path(__file__).resolve().parents[2]
SNIPPET = REPO / "configs" / "mosquitto-federation.conf"
DEBIAN_CONF = Path("/etc/mosquitto/mosquitto.conf")
DEBIAN_PATHS = ("/run/mosquitto/mosquitto.pid", "/var/lib/mosquitto/", "/var/log/mosquitto/mosquitto.log",
                "/etc/mosquitto/conf.d")
"""the paths of Debian's file, moved into the test's directory (each must be there: the test says when Debian
changes its file)"""
ALLOWED_OPTIONS = {"log_dest", "log_type", "max_inflight_messages", "message_size_limit", "max_queued_messages",
                   "sys_interval", "set_tcp_nodelay"}
"""global options that change neither persistence, listeners nor authentication"""
WAIT = 10.0


def debian_conf_reason() -> str | None:
    """Why Debian's pristine mosquitto.conf is not at hand (None when it is)."""
    if not DEBIAN_CONF.is_file():
        return f"{DEBIAN_CONF} is missing: apt-get install mosquitto (scripts/install-deps.sh)"
    listed = subprocess.run(["dpkg-query", "-W", "-f=${Conffiles}", "mosquitto"], capture_output=True, text=True,
                            check=False).stdout
    shipped_sum = next((line.split()[1] for line in listed.splitlines() if line.split()[:1] == [str(DEBIAN_CONF)]),
                       None)
    if shipped_sum is None:
        return f"dpkg does not list {DEBIAN_CONF} as a file of the mosquitto package"
    if hashlib.md5(DEBIAN_CONF.read_bytes()).hexdigest() != shipped_sum:  # noqa: S324 - dpkg's own checksum
        return f"{DEBIAN_CONF} was changed on this host: the test needs it as Debian ships it"
    return None


REASON = system.unavailable_reason() or debian_conf_reason()


@dataclass
class Site:
    """One broker's files: Debian's conf with its paths moved under `root`."""

    root: Path
    namespace: str

    @property
    def conf(self) -> Path:
        return self.root / "mosquitto.conf"

    @property
    def conf_d(self) -> Path:
        return self.root / "conf.d"

    @property
    def database(self) -> Path:
        return self.root / "lib" / "mosquitto.db"

    @property
    def log_file(self) -> Path:
        return self.root / "log" / "mosquitto.log"


@pytest.fixture
def namespace() -> Iterator[str]:
    """A network namespace of this test, named as the netns backend names its own (so `python -m federation.netns
    cleanup` finds it if the test is killed); deleted with everything in it at the end."""
    ip = system.tool("ip", "iproute2")
    name = system.RunNames.new().namespace("snippet")
    system.run([ip, "netns", "add", name])
    try:
        system.run([ip, "link", "set", "lo", "up"], namespace=name)
        yield name
    finally:
        system.delete_namespace(ip, name)


@pytest.fixture
def site_root() -> Iterator[Path]:
    """A directory the broker can reach after it drops root for user mosquitto (pytest's tmp_path is root's only)."""
    root = Path(tempfile.mkdtemp(prefix="federation-snippet-"))
    try:
        root.chmod(0o755)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def make_site(root: Path, namespace: str, with_snippet: bool) -> Site:
    site = Site(root, namespace)
    text = DEBIAN_CONF.read_text(encoding="utf-8")
    for path in DEBIAN_PATHS:
        assert path in text, f"{DEBIAN_CONF} no longer names {path}: update DEBIAN_PATHS"
    moved = {DEBIAN_PATHS[0]: str(root / "run" / "mosquitto.pid"), DEBIAN_PATHS[1]: str(root / "lib") + "/",
             DEBIAN_PATHS[2]: str(site.log_file), DEBIAN_PATHS[3]: str(site.conf_d)}
    for old, new in moved.items():
        text = text.replace(old, new)
    site.conf.write_text(text, encoding="utf-8")
    mosquitto_user = pwd.getpwnam("mosquitto")
    for directory in (site.conf_d, root / "run", root / "lib", root / "log"):
        directory.mkdir()
        os.chown(directory, mosquitto_user.pw_uid, mosquitto_user.pw_gid)
    if with_snippet:
        shutil.copyfile(SNIPPET, site.conf_d / "federation.conf")
    return site


def in_namespace(site: Site, *command: str, timeout: float = WAIT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), capture_output=True, text=True, timeout=timeout, check=False,
                          preexec_fn=system.enter_namespace(site.namespace))


def listening(site: Site) -> frozenset[str]:
    output = in_namespace(site, system.tool("ss", "iproute2"), "-Hltn").stdout
    return frozenset(line.split()[3] for line in output.splitlines() if line.strip())


class Broker:
    """mosquitto -c the site's conf, inside its namespace."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self.output = open(site.root / "stderr.log", "ab")  # noqa: SIM115 - closed in stop
        self.process = subprocess.Popen([system.tool("mosquitto", "mosquitto"), "-c", str(site.conf)],
                                        stdout=self.output, stderr=subprocess.STDOUT,
                                        preexec_fn=system.enter_namespace(site.namespace))
        self.listeners = poll(lambda: listening(site) or None if self.process.poll() is None else frozenset({"exited"}),
                              WAIT, lambda: f"mosquitto to listen: {(site.root / 'stderr.log').read_text()}")
        assert "exited" not in self.listeners, (site.root / "stderr.log").read_text()

    def stop(self) -> None:
        """SIGTERM, as systemctl stop: the broker writes its persistence file on the way out."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.output.close()


@dataclass(frozen=True)
class Behaviour:
    listeners: frozenset[str]
    anonymous_publish: bool
    database_written: bool
    retained_after_restart: str
    log_on_topic: list[str]


def subscribe_lines_heard(site: Site, sub: str) -> list[str]:
    """The subscribe log line a client of $SYS/broker/log/M/subscribe hears: its own (Mosquitto logs a
    subscription after making it), or none within 5 s from a broker that publishes no log."""
    heard = in_namespace(site, sub, "-t", "$SYS/broker/log/M/subscribe", "-C", "1", "-W", "5")
    return [line for line in heard.stdout.splitlines() if line.strip()]


def observe(site: Site) -> Behaviour:
    """What a client and an operator see of the broker: its sockets, an anonymous publication, its persistence
    file, a retained message across a restart, and its log on $SYS/broker/log/#."""
    pub, sub = system.tool("mosquitto_pub", "mosquitto-clients"), system.tool("mosquitto_sub", "mosquitto-clients")
    broker = Broker(site)
    try:
        log_lines = subscribe_lines_heard(site, sub)
        published = in_namespace(site, pub, "-t", "snippet/check", "-m", "kept", "-r", "-q", "1")
        broker.stop()
        written = site.database.is_file()
        broker = Broker(site)
        retained = in_namespace(site, sub, "-t", "snippet/check", "-C", "1", "-W", "5").stdout.strip()
        return Behaviour(broker.listeners, published.returncode == 0, written, retained, log_lines)
    finally:
        broker.stop()


def test_the_snippet_holds_only_global_options_the_wrapper_needs() -> None:
    options = [line.split()[0] for line in SNIPPET.read_text(encoding="utf-8").splitlines()
               if line.strip() and not line.lstrip().startswith("#")]
    assert set(options) <= ALLOWED_OPTIONS, sorted(set(options) - ALLOWED_OPTIONS)
    assert {"log_dest", "log_type", "max_inflight_messages", "message_size_limit"} <= set(options)
    assert shipped.resolve("mosquitto-federation.conf") == shipped.ROOT / "configs" / "mosquitto-federation.conf"


def test_install_doc_adds_the_snippet_not_the_example_broker() -> None:
    install = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    assert "federation-configs show mosquitto-federation.conf > /etc/mosquitto/conf.d/" in install
    assert not re.search(r"show mosquitto\.conf > /etc/mosquitto/conf\.d", install)


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_debians_broker_keeps_its_persistence_and_listeners_with_the_snippet(namespace: str,
                                                                            site_root: Path) -> None:
    (site_root / "plain").mkdir(mode=0o755)
    (site_root / "federated").mkdir(mode=0o755)
    plain = observe(make_site(site_root / "plain", namespace, with_snippet=False))
    federated = observe(make_site(site_root / "federated", namespace, with_snippet=True))

    assert plain.listeners, "Debian's broker listens nowhere"
    assert federated.listeners == plain.listeners
    assert plain.anonymous_publish and federated.anonymous_publish
    assert plain.database_written and federated.database_written, "persistence is off"
    assert plain.retained_after_restart == federated.retained_after_restart == "kept"
    assert plain.log_on_topic == [], "Debian's broker alone publishes no subscribe log lines"
    assert len(federated.log_on_topic) == 1, federated.log_on_topic
    assert federated.log_on_topic[0].endswith(" 0 $SYS/broker/log/M/subscribe"), federated.log_on_topic
    # Debian's own log file is still written beside the log on $SYS.
    assert (site_root / "federated" / "log" / "mosquitto.log").stat().st_size > 0
