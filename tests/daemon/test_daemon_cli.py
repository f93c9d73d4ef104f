"""`python wrapper.py` as users run it: real wrappers and brokers on loopback, status, metrics, exit codes."""

from __future__ import annotations

import contextlib
import json
import random
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from federation.daemon.client_registry import REGISTRY_PREFIX
from federation.daemon.status import (
    COMPRESS_ABOVE,
    FLAG_JSON,
    FLAG_ZLIB,
    MAX_REPLY,
    StatusError,
    decode_reply,
    encode_reply,
    query,
    render,
    table,
)
from federation.daemon.udp import LocalAddresses

from broker_util import Processes, mosquitto_pub, mosquitto_sub, requires_mosquitto, start_broker, wait_for

REPO = Path(__file__).resolve().parents[2]
WRAPPER = [sys.executable, str(REPO / "wrapper.py")]


class Wrapper:
    """One `wrapper.py` process; its stderr goes to a file shown in failure messages."""

    def __init__(self, tmp_path: Path, name: str, *arguments: str) -> None:
        self.log_path = tmp_path / f"{name}.stderr"
        with open(self.log_path, "wb") as stderr:
            self.process = subprocess.Popen([*WRAPPER, *arguments], stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=stderr, cwd=REPO)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float = 10) -> int:
        return self.process.wait(timeout)

    def stop(self, how: signal.Signals = signal.SIGTERM) -> int:
        return Processes.end(self.process, how, timeout=10)


@pytest.fixture
def wrappers() -> Iterator[list[Wrapper]]:
    started: list[Wrapper] = []
    yield started
    for wrapper in started:
        if wrapper.process.poll() is None:
            wrapper.process.kill()
            wrapper.process.wait()


@pytest.fixture
def processes() -> Iterator[Processes]:
    started = Processes()
    yield started
    started.close()


def loopback_hosts(count: int) -> list[str]:
    """Distinct random 127.x.y.z addresses whose UDP port 10500 is free (loopback is a /8 on Linux)."""
    chooser = random.Random()
    hosts: list[str] = []
    while len(hosts) < count:
        host = f"127.{chooser.randrange(1, 255)}.{chooser.randrange(0, 256)}.{chooser.randrange(2, 255)}"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.bind((host, 10500))
            except OSError:
                continue
        if host not in hosts:
            hosts.append(host)
    return hosts


def free_udp_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def free_tcp_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def status_json(host: str, port: int = 10500) -> dict[str, Any]:
    result = subprocess.run([*WRAPPER, "status", "--node", f"{host}:{port}", "--json"], capture_output=True,
                            text=True, timeout=10, cwd=REPO)
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def read_line(process: subprocess.Popen[bytes], timeout: float = 10.0) -> str:
    assert process.stdout is not None
    stream = process.stdout
    result: list[bytes] = []
    reader = threading.Thread(target=lambda: result.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    assert result and result[0], f"no output line within {timeout} s"
    return result[0].decode().rstrip("\n")


def events_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------ two federated brokers


@pytest.mark.broker
@requires_mosquitto
def test_two_wrappers_federate_two_brokers(tmp_path: Path, wrappers: list[Wrapper], processes: Processes) -> None:
    host_a, host_b = loopback_hosts(2)
    broker_a = start_broker(tmp_path, name="broker-a")
    broker_b = start_broker(tmp_path, name="broker-b")
    try:
        metrics_port = free_tcp_port(host_a)
        wrapper_a = Wrapper(tmp_path, "wrapper-a", "--bind", host_a, "--neighbors", host_b,
                            "--broker", f"127.0.0.1:{broker_a.port}", "--id", "1", "--name", "a",
                            "--event-log", str(tmp_path / "a.jsonl"), "--state-dir", str(tmp_path / "state-a"),
                            "--metrics-port", str(metrics_port), "--log-level", "DEBUG")
        wrappers.append(wrapper_a)
        config_b = tmp_path / "b.yaml"
        config_b.write_text(f"bind: {host_b}:10500\nneighbours: ['{host_a}:10500']\nbroker: 127.0.0.1:{broker_b.port}\n"
                            f"id: 2\nevent_log: {tmp_path / 'b.jsonl'}\nlog_level: WARNING\n"
                            f"settings:\n  hello_interval: 0.5\n")
        wrapper_b = Wrapper(tmp_path, "wrapper-b", "--config", str(config_b), "--log-level", "DEBUG")
        wrappers.append(wrapper_b)

        def diagnostics() -> str:
            return f"wrapper a:\n{wrapper_a.log()[-3000:]}\nwrapper b:\n{wrapper_b.log()[-3000:]}"

        def log_flowing(host: str) -> bool:
            try:
                return bool(query(host, 10500, timeout=0.5)["daemon"]["broker"]["log_lines"] > 0)
            except StatusError:
                return False

        # A wrapper learns only subscriptions made after it subscribed to the broker log.
        wait_for(lambda: log_flowing(host_b), timeout=10, message=lambda: "b's broker log\n" + diagnostics())
        reader = processes.start(mosquitto_sub(broker_b.port, "-V", "mqttv5", "-i", "reader-b", "-q", "1",
                                               "-t", "fed/#", "-F", "%t|%p|%q|%P"), stdout=subprocess.PIPE)

        seen: list[dict[str, Any]] = []

        def a_knows_the_core() -> bool:
            try:
                document = query(host_a, 10500, timeout=0.5)
            except StatusError:
                return False
            seen[:] = [document]
            with contextlib.suppress(StatusError):
                seen.append(query(host_b, 10500, timeout=0.5))
            topics = {t["filter"]: t for t in document["topics"]}
            up = [n for n in document["neighbours"] if n["up"]]
            return bool(up) and topics.get("fed/#", {}).get("core") is not None

        wait_for(a_knows_the_core, timeout=15, message=lambda: f"a to learn the core of fed/#\n{seen}\n{diagnostics()}")
        subprocess.run(mosquitto_pub(broker_a.port, "-V", "mqttv5", "-q", "1", "-t", "fed/x", "-m", "hello",
                                     "-D", "publish", "user-property", "origin", "broker-a"), check=True, timeout=10)
        assert read_line(reader) == "fed/x|hello|1|origin:broker-a"

        document = status_json(host_a)
        assert document["node"] == f"{host_a}:10500" and document["name"] == "a"
        assert document["daemon"]["broker"]["connected"] is True
        assert [n["address"] for n in document["neighbours"] if n["up"]] == [f"{host_b}:10500"]
        assert {m["address"] for m in document["federation"]} == {f"{host_a}:10500", f"{host_b}:10500"}
        assert document["management_core"].startswith("1@")  # the lowest id
        human = subprocess.run([*WRAPPER, "status", "--node", host_a], capture_output=True, text=True, timeout=10,
                               cwd=REPO)
        assert human.returncode == 0, human.stderr
        for heading in ("Neighbours (1 up of 1)", "Federation table (2 members)", "Topic cores and meshes",
                        "Packets", "Counters", "fed/#", f"{host_b}:10500"):
            assert heading in human.stdout

        with urllib.request.urlopen(f"http://{host_a}:{metrics_port}/metrics", timeout=5) as response:
            metrics = response.read().decode()
        for line in ('mqttfed_neighbours{state="up"} 1.0', 'mqttfed_members 2.0', 'mqttfed_broker_connected 1.0',
                     'mqttfed_ready 1.0'):
            assert line in metrics, metrics
        # The publication, and the records of the registry of client ids (one per client connection on a:
        # federation.daemon.client_registry), are the publications a originated.
        originated = float(metrics.split('mqttfed_publications_total{stage="originated"} ', 1)[1].split()[0])
        assert originated >= 1.0, metrics
        assert 'mqttfed_packets_sent_total{type="hl"}' in metrics and "federation_" not in metrics

        assert wrapper_a.stop() == 0, diagnostics()
        assert wrapper_b.stop(signal.SIGINT) == 0, diagnostics()
    finally:
        broker_a.stop()
        broker_b.stop()
    for name, delivered in (("a.jsonl", False), ("b.jsonl", True)):
        events = events_of(tmp_path / name)
        kinds = [event["type"] for event in events]
        assert kinds[0] == "node_started" and kinds[-1] == "node_stopped", kinds
        # (not counting the records of the registry of client ids: every wrapper gets them: client_registry.py)
        topics = [topic for event in events if event["type"] == "publications_delivered"
                  for topic in event["topics"] if not topic.startswith(REGISTRY_PREFIX)]
        assert bool(topics) == delivered, topics
    assert "publications_originated" in [event["type"] for event in events_of(tmp_path / "a.jsonl")]
    assert json.loads((tmp_path / "state-a" / "wrapper-state.json").read_text())["epoch"] > 0


# ------------------------------------------------------------------ exit status 2 with a message that helps


def test_port_in_use_exits_2(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        result = subprocess.run([*WRAPPER, "--bind", f"127.0.0.1:{port}", "--broker", "127.0.0.1:1"],
                                capture_output=True, text=True, timeout=20, cwd=REPO)
    assert result.returncode == 2
    assert (f"cannot bind UDP 127.0.0.1:{port}: address already in use; another wrapper running? choose --bind"
            in result.stderr)


@pytest.mark.parametrize("arguments, yaml_text, expected", [
    (["--neighbors", "no-such-host.invalid"], None, "cannot resolve neighbour 'no-such-host.invalid'"),
    ([], "bind: 127.0.0.1:10500\nsetings: {}\n", "unknown key 'setings'"),
    (["--bind", "192.0.2.250:10500"], None, "is not an address of this host"),
    (["--log-level", "chatty"], None, "--log-level: expected one of"),
    (["--broker", "fed:hunter2@127.0.0.1"], None, "the broker address holds credentials"),
    ([], "broker: fed:hunter2@127.0.0.1:1883\n", "the broker address holds credentials"),
    (["--broker-tls-cert", "/etc/hostname"], None, "broker_tls_cert (--broker-tls-cert) needs broker_tls_key"),
    (["--broker-username", "fed", "--broker-password-file", "/nonexistent/broker.password"], None,
     "broker_password_file (--broker-password-file): file '/nonexistent/broker.password' not found"),
    (["--broker-tls-ca", "/etc/hostname"], None, "holds no usable CA certificate"),
])
def test_bad_configuration_exits_2(tmp_path: Path, arguments: list[str], yaml_text: str | None,
                                   expected: str) -> None:
    if yaml_text is not None:
        (tmp_path / "w.yaml").write_text(yaml_text)
        arguments = [*arguments, "--config", str(tmp_path / "w.yaml")]
    result = subprocess.run([*WRAPPER, *arguments], capture_output=True, text=True, timeout=20, cwd=REPO)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("federation-wrapper: error: ") and expected in result.stderr
    assert "Traceback" not in result.stderr and "hunter2" not in result.stderr


def test_state_dir_shared_by_two_wrappers_exits_2(tmp_path: Path, wrappers: list[Wrapper]) -> None:
    first = Wrapper(tmp_path, "first", "--bind", f"127.0.0.1:{free_udp_port()}", "--broker", "127.0.0.1:1",
                    "--state-dir", str(tmp_path / "s"))
    wrappers.append(first)
    wait_for(lambda: "listening on UDP" in first.log(), timeout=10, message=first.log)
    second = subprocess.run([*WRAPPER, "--bind", f"127.0.0.1:{free_udp_port()}", "--broker", "127.0.0.1:1",
                             "--state-dir", str(tmp_path / "s")], capture_output=True, text=True, timeout=20, cwd=REPO)
    assert second.returncode == 2 and "is in use by another wrapper" in second.stderr
    assert first.stop() == 0


def test_status_without_a_wrapper_exits_2() -> None:
    port = free_udp_port()
    result = subprocess.run([*WRAPPER, "status", "--node", f"127.0.0.1:{port}"], capture_output=True, text=True,
                            timeout=20, cwd=REPO)
    assert result.returncode == 2
    assert f"no wrapper answered at 127.0.0.1:{port}" in result.stderr and "is it running?" in result.stderr


def test_sigterm_without_a_broker_exits_0_and_logs_start_and_stop(tmp_path: Path, wrappers: list[Wrapper]) -> None:
    wrapper = Wrapper(tmp_path, "lonely", "--bind", f"127.0.0.1:{free_udp_port()}", "--broker", "127.0.0.1:1",
                      "--event-log", str(tmp_path / "events.jsonl"))
    wrappers.append(wrapper)
    wait_for(lambda: "unreachable" in wrapper.log(), timeout=10, message=wrapper.log)
    assert wrapper.stop() == 0, wrapper.log()
    kinds = [event["type"] for event in events_of(tmp_path / "events.jsonl")]
    assert kinds[0] == "node_started" and kinds[-1] == "node_stopped"


# ------------------------------------------------------------------ the status protocol and tables


def test_status_reply_encoding() -> None:
    small = {"node": "a", "topics": [1, 2]}
    assert encode_reply(small)[0] == FLAG_JSON and decode_reply(encode_reply(small)) == small
    big = {"node": "a", "topics": [{"filter": f"t/{i}", "core": "x"} for i in range(3000)]}
    packed = encode_reply(big)
    assert len(json.dumps(big)) > COMPRESS_ABOVE and packed[0] == FLAG_ZLIB and len(packed) <= MAX_REPLY
    assert decode_reply(packed) == big
    rng = random.Random(1)
    huge = {"node": "a", "local_subscriptions": {f"c{i}": {f"{rng.random()}": 0} for i in range(20000)}}
    trimmed = decode_reply(encode_reply(huge))
    assert trimmed["truncated"] is True and trimmed["local_subscriptions"] == {} and trimmed["node"] == "a"
    with pytest.raises(StatusError):
        decode_reply(b"\x07{}")


def test_a_lost_status_request_is_sent_again() -> None:
    """A wrapper whose receive buffer a flood filled loses requests: the query repeats until answered."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        server.settimeout(5)
        requests: list[bytes] = []

        def answer_the_second() -> None:
            with contextlib.suppress(OSError):
                while len(requests) < 2:
                    data, source = server.recvfrom(100)
                    requests.append(data)
                server.sendto(encode_reply({"node": "a"}), source)

        answering = threading.Thread(target=answer_the_second, daemon=True)
        answering.start()
        assert query("127.0.0.1", server.getsockname()[1], timeout=3) == {"node": "a"}
        answering.join(5)
    assert len(requests) == 2 and requests[0] == requests[1]


def test_status_is_answered_only_on_this_host() -> None:
    local = LocalAddresses({"10.1.2.3"})
    assert "127.0.0.1" in local and "127.9.8.7" in local and "10.1.2.3" in local and "::1" in local
    assert "203.0.113.9" not in local  # TEST-NET-3: not an address of this host
    assert "not-an-address" not in local


def test_tables_are_aligned() -> None:
    text = table(["name", "rtt ms"], [["a", 1.5], ["longer", 12.25], ["c", None]])
    lines = text.splitlines()
    assert lines[0] == "name    rtt ms"
    assert lines[2] == "a          1.5"
    assert lines[3] == "longer   12.25"
    assert lines[4] == "c            -"
    document: dict[str, Any] = {"node": "127.0.0.1:10500", "name": None, "broker_id": "5@127.0.0.1:10500", "epoch": 1,
                "management_core": "5@127.0.0.1:10500", "neighbours": [], "federation": [], "topics": [],
                "local_subscriptions": {"c": {"a/#": 1}}, "sent": {"hl": [3, 90]}, "received": {},
                "drops": {"oversized": 1}, "counters": {}}
    rendered = render(document)
    assert "management core: 5@127.0.0.1:10500 (this node)" in rendered
    assert "drop: oversized" in rendered and "Local subscriptions (1)" in rendered


def test_docs_describe_every_flag_and_metric() -> None:
    from federation.daemon.cli import build_run_parser, build_status_parser
    from federation.daemon.metrics import METRICS

    text = (REPO / "docs" / "daemon.md").read_text()
    for parser in (build_run_parser(), build_status_parser()):
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in text or f"{flag}`" in text or f" {flag} " in text, flag
    metrics = (REPO / "docs" / "metrics.md").read_text()  # checked against a live endpoint: test_metrics_real.py
    for name, kind, _labels, _help in METRICS:
        exposed = f"{name}_total" if kind == "counter" else name
        assert f"`{exposed}`" in metrics, exposed
