"""The wrapper's login at a real Mosquitto: passwords, ACLs and TLS (issue 21, item 1).

Brokers here accept no anonymous clients; the wrapper runs in the test's process (`RuntimeThread`), except for
the federation through the shipped ACL, which runs two `wrapper.py` processes as an operator would. Certificates
are made for each test (tests/tls_util.py). Nothing sleeps blindly: every wait polls a condition.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from federation.daemon.broker_auth import BrokerAuth, load_broker_auth
from federation.daemon.runtime import Runtime
from federation.daemon.status import StatusError, query
from federation.protocol.types import Address

from broker_util import Broker, Processes, mosquitto_pub, mosquitto_sub, requires_mosquitto, wait_for
from runtime_util import RuntimeThread, runtime_config
from tls_util import Pki, make_pki

pytestmark = requires_mosquitto

REPO = Path(__file__).resolve().parents[2]
ACL = REPO / "configs" / "mosquitto.acl"
WRAPPER_USER = "mqtt-federation"
CLIENT_USER = "alice"
PASSWORDS = {WRAPPER_USER: "wrapper secret", CLIENT_USER: "alice secret"}
CLIENT_ACL = f"\nuser {CLIENT_USER}\ntopic readwrite fed/#\n"
"""what the test's own clients need, appended to the shipped ACL"""


def password_file(directory: Path, passwords: dict[str, str]) -> Path:
    """A Mosquitto password file (mosquitto_passwd -b) holding `passwords`."""
    path = directory / "passwd"
    path.unlink(missing_ok=True)
    for user, password in passwords.items():
        subprocess.run(["mosquitto_passwd", "-b", *([] if path.exists() else ["-c"]), str(path), user, password],
                       check=True, capture_output=True, timeout=10)
    return path


def secret_file(path: Path, text: str) -> Path:
    path.write_text(text + "\n", encoding="utf-8")
    path.chmod(0o600)
    return path


def secure_broker(tmp_path: Path, name: str, *, tls: Pki | None = None, client_certificates: bool = False,
                  acl: bool = True, host: str = "127.0.0.1") -> Broker:
    """A broker that requires a password (and TLS with `tls`), with the shipped ACL plus the test's clients."""
    directory = tmp_path / name
    directory.mkdir(parents=True)
    lines = ["allow_anonymous false", f"password_file {password_file(directory, PASSWORDS)}"]
    if acl:
        acl_path = directory / "acl"
        acl_path.write_text(ACL.read_text(encoding="utf-8") + CLIENT_ACL, encoding="utf-8")
        lines.append(f"acl_file {acl_path}")
    if tls is not None:
        lines += [f"certfile {tls.server_cert}", f"keyfile {tls.server_key}", f"cafile {tls.ca}"]
        if client_certificates:
            lines.append("require_certificate true")
    broker = Broker(directory, _free_port(host), lines, host=host)
    broker.start()
    return broker


def _free_port(host: str) -> int:
    from broker_util import free_port

    return free_port(host)


def wrapper_auth(tmp_path: Path, password: str = PASSWORDS[WRAPPER_USER], **tls: Path) -> BrokerAuth:
    return load_broker_auth(WRAPPER_USER, secret_file(tmp_path / "broker.password", password),
                            tls.get("ca"), tls.get("cert"), tls.get("key"))


@pytest.fixture
def runtimes() -> Iterator[list[RuntimeThread]]:
    started: list[RuntimeThread] = []
    yield started
    for thread in started:
        if thread.thread.is_alive():
            assert thread.stop() == 0


def start_runtime(runtimes: list[RuntimeThread], broker: Broker, auth: BrokerAuth, **changes: Any) -> RuntimeThread:
    config = runtime_config(broker.port, broker_auth=auth, **changes)
    config = dataclasses.replace(config, broker=Address(broker.host, broker.port))
    thread = RuntimeThread(Runtime(config))
    runtimes.append(thread)
    return thread


def wait_connected_and_logging(thread: RuntimeThread, timeout: float = 10.0) -> None:
    health = thread.wrapper.broker_health
    wait_for(lambda: health.connected and health.log_lines > 0, timeout=timeout,
             message=lambda: f"the wrapper to log in and read the broker's log; problem: {health.problem}")


def learns_a_subscription(thread: RuntimeThread, broker: Broker, processes: Processes, *client: str) -> None:
    """A client of the broker subscribes; the wrapper learns it from the log it may read."""
    processes.start(mosquitto_sub(broker.port, "-i", "watcher", "-t", "fed/#", "-u", CLIENT_USER, "-P",
                                  PASSWORDS[CLIENT_USER], *client, host=broker.host))
    node = thread.wrapper.node
    wait_for(lambda: node.clients.get("watcher") == {"fed/#": 0}, timeout=10,
             message=lambda: f"the subscription in the node; it has {node.clients}")


# ------------------------------------------------------------------ passwords


def test_password_login_reads_the_log_and_learns_subscriptions(tmp_path: Path, runtimes: list[RuntimeThread],
                                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="federation.daemon")
    processes = Processes()
    with secure_broker(tmp_path, "broker") as broker:
        try:
            thread = start_runtime(runtimes, broker, wrapper_auth(tmp_path))
            wait_connected_and_logging(thread)
            learns_a_subscription(thread, broker, processes)
        finally:
            processes.close()
    assert f"as user '{WRAPPER_USER}' with a password" in caplog.text
    assert PASSWORDS[WRAPPER_USER] not in caplog.text


def test_a_wrong_password_is_said_once_retried_with_backoff_and_fixed_by_sighup(
        tmp_path: Path, runtimes: list[RuntimeThread], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="federation.daemon")
    with secure_broker(tmp_path, "broker") as broker:
        auth = wrapper_auth(tmp_path, password="not the password")
        started = time.monotonic()
        thread = start_runtime(runtimes, broker, auth)
        health = thread.wrapper.broker_health
        wait_for(lambda: health.connect_failures["refused"] >= 4, timeout=20,
                 message=lambda: f"four refused attempts; {health.connect_failures}")
        # Backoff: attempts after 0, 0.25, 0.75 and 1.75 s at the earliest (the delay doubles from 0.25 s to 1 s).
        assert time.monotonic() - started >= 1.5
        refused = [record for record in caplog.records if "refused the login" in record.getMessage()
                   and record.levelno >= logging.WARNING]
        assert len(refused) == 1, [record.getMessage() for record in refused]
        message = refused[0].getMessage()
        assert f"refused the login of {thread.wrapper.config.client_id!r} as user '{WRAPPER_USER}'" in message
        assert "broker_password_file (--broker-password-file)" in message and str(auth.password_file) in message
        assert "the overlay keeps running" in message
        assert "not the password" not in caplog.text and "lost the connection" not in caplog.text
        assert not health.connected and health.problem is not None
        # The overlay runs meanwhile: the wrapper answers status.
        document = query(thread.wrapper.config.bind.host, thread.wrapper.config.bind.port)
        assert document["daemon"]["broker"]["connected"] is False
        # The operator fixes the password file and sends SIGHUP: the next attempt (made at once) logs in.
        secret_file(auth.password_file or tmp_path / "none", PASSWORDS[WRAPPER_USER])
        thread.runtime.request_reload()
        wait_connected_and_logging(thread, timeout=10)
        assert "broker password read again" in caplog.text


def test_an_anonymous_wrapper_is_told_which_options_log_it_in(tmp_path: Path, runtimes: list[RuntimeThread],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="federation.daemon")
    with secure_broker(tmp_path, "broker") as broker:
        thread = start_runtime(runtimes, broker, BrokerAuth())
        wait_for(lambda: "does not accept anonymous clients" in caplog.text, timeout=10,
                 message=lambda: f"the refusal; log: {caplog.text}")
        assert "broker_username (--broker-username)" in caplog.text
        assert not thread.wrapper.broker_health.connected


# ------------------------------------------------------------------ TLS


def test_tls_with_a_ca(tmp_path: Path, runtimes: list[RuntimeThread]) -> None:
    pki = make_pki(tmp_path / "pki")
    processes = Processes()
    with secure_broker(tmp_path, "broker", tls=pki) as broker:
        try:
            thread = start_runtime(runtimes, broker, wrapper_auth(tmp_path, ca=pki.ca))
            wait_connected_and_logging(thread)
            learns_a_subscription(thread, broker, processes, "--cafile", str(pki.ca))
        finally:
            processes.close()


def test_tls_with_a_client_certificate(tmp_path: Path, runtimes: list[RuntimeThread],
                                       caplog: pytest.LogCaptureFixture) -> None:
    pki = make_pki(tmp_path / "pki")
    caplog.set_level(logging.WARNING, logger="federation.daemon")
    with secure_broker(tmp_path, "broker", tls=pki, client_certificates=True) as broker:
        # Without a certificate the broker ends the connection: the message names the certificate options.
        without = start_runtime(runtimes, broker, wrapper_auth(tmp_path, ca=pki.ca))
        wait_for(lambda: "may ask for a client certificate: give broker_tls_cert (--broker-tls-cert)" in caplog.text,
                 timeout=10, message=lambda: f"the certificate hint; log: {caplog.text}")
        assert not without.wrapper.broker_health.connected
        assert without.stop() == 0
        thread = start_runtime(runtimes, broker, wrapper_auth(tmp_path, ca=pki.ca, cert=pki.client_cert,
                                                              key=pki.client_key))
        wait_connected_and_logging(thread)


def test_a_wrong_ca_is_said_once_naming_the_ca_option(tmp_path: Path, runtimes: list[RuntimeThread],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    pki = make_pki(tmp_path / "pki")
    caplog.set_level(logging.WARNING, logger="federation.daemon")
    with secure_broker(tmp_path, "broker", tls=pki) as broker:
        thread = start_runtime(runtimes, broker, wrapper_auth(tmp_path, ca=pki.other_ca))
        health = thread.wrapper.broker_health
        wait_for(lambda: health.connect_failures["tls"] >= 3, timeout=15,
                 message=lambda: f"three failed handshakes; {health.connect_failures}")
        failed = [record.getMessage() for record in caplog.records if "TLS with broker" in record.getMessage()]
        assert len(failed) == 1, failed
        assert "certificate verify failed" in failed[0]
        assert f"not signed by the CA in broker_tls_ca (--broker-tls-ca) ({pki.other_ca})" in failed[0]
        assert not health.connected


# ------------------------------------------------------------------ the shipped ACL is enough to federate


class WrapperProcess:
    """`wrapper.py` as an operator runs it (this checkout's code), its stderr in a file."""

    def __init__(self, directory: Path, arguments: Sequence[str]) -> None:
        self.log_path = directory / "wrapper.stderr"
        with open(self.log_path, "wb") as stderr:
            self.process = subprocess.Popen([sys.executable, str(REPO / "wrapper.py"), *arguments], cwd=REPO,
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        return Processes.end(self.process, timeout=10)


def test_the_shipped_acl_is_enough_for_the_wrapper_to_federate(tmp_path: Path) -> None:
    """Two brokers with passwords and exactly configs/mosquitto.acl for the wrapper's user (plus a rule for the
    test's client); two wrappers log in from wrapper.yaml; a publication crosses, and so does a retained message
    the broker held before its wrapper started (read on the wrapper's second connection, with the same login)."""
    from federation_util import next_first_address

    first = next_first_address()
    prefix, last = first.rsplit(".", 1)
    hosts = [first, f"{prefix}.{int(last) + 1}"]
    brokers = [secure_broker(tmp_path, f"broker-{index}", host=host) for index, host in enumerate(hosts)]
    wrappers: list[WrapperProcess] = []
    processes = Processes()
    try:
        subprocess.run(mosquitto_pub(brokers[0].port, "-t", "fed/held", "-m", "before", "-q", "1", "-r", "-u",
                                     CLIENT_USER, "-P", PASSWORDS[CLIENT_USER], host=hosts[0]), check=True, timeout=10)
        for index, host in enumerate(hosts):
            directory = tmp_path / f"wrapper-{index}"
            directory.mkdir()
            password = secret_file(directory / "broker.password", PASSWORDS[WRAPPER_USER])
            config = directory / "wrapper.yaml"
            config.write_text(f"bind: {host}:10500\nneighbors: ['{hosts[1 - index]}:10500']\n"
                              f"broker: {host}:{brokers[index].port}\nbroker_username: {WRAPPER_USER}\n"
                              f"broker_password_file: {password}\nid: {index + 1}\n"
                              f"settings:\n  hello_interval: 0.2\n  dead_intervals: 5\n", encoding="utf-8")
            wrappers.append(WrapperProcess(directory, ["--config", str(config)]))

        def ready(index: int) -> bool:
            assert wrappers[index].process.poll() is None, wrappers[index].log()
            try:
                document = query(hosts[index], 10500, timeout=0.5)
            except StatusError:
                return False
            broker = document["daemon"]["broker"]
            return bool(broker["connected"] and broker["log_lines"] > 0
                        and any(neighbour["up"] for neighbour in document["neighbours"]))

        for index in range(2):
            wait_for(lambda index=index: ready(index), timeout=20,  # type: ignore[misc]
                     message=lambda index=index: f"wrapper {index} to log in and meet its neighbour:\n"  # type: ignore[misc]
                                                 f"{wrappers[index].log()[-3000:]}")
        for index in range(2):  # the fence allowed by the shipped ACL: complete readings
            wait_for(lambda index=index: query(hosts[index], 10500)["daemon"]["broker"]["retained_scan"]["scans"],  # type: ignore[misc]
                     timeout=15, message="the reading of the broker's retained messages")
            scan = query(hosts[index], 10500)["daemon"]["broker"]["retained_scan"]
            assert (scan["scans"], scan["incomplete"], scan["originated"]) == (1, 0, 1 - index), scan
        received = tmp_path / "received"
        with open(received, "wb") as sink:
            processes.start(mosquitto_sub(brokers[1].port, "-i", "reader", "-t", "fed/#", "-q", "1", "-u",
                                          CLIENT_USER, "-P", PASSWORDS[CLIENT_USER], host=hosts[1]), stdout=sink)

        def core_known() -> bool:
            topics = {topic["filter"]: topic for topic in query(hosts[0], 10500)["topics"]}
            return topics.get("fed/#", {}).get("core") is not None

        wait_for(core_known, timeout=15, message="the first wrapper to learn fed/# from the second")
        subprocess.run(mosquitto_pub(brokers[0].port, "-t", "fed/x", "-m", "across", "-q", "1", "-u", CLIENT_USER,
                                     "-P", PASSWORDS[CLIENT_USER], host=hosts[0]), check=True, timeout=10)
        wait_for(lambda: b"across" in received.read_bytes(), timeout=10, message="the publication on the other broker")
        assert b"before" in received.read_bytes()  # retained on the second broker before the reader subscribed
        for wrapper in wrappers:
            log = wrapper.log()
            assert "refused" not in log and PASSWORDS[WRAPPER_USER] not in log, log
    finally:
        processes.close()
        exits = [wrapper.stop() for wrapper in wrappers]
        for broker in brokers:
            broker.stop()
    assert exits == [0, 0]

