"""A second wrapper on the same broker (issue 40, item 6; federation/daemon/other_wrappers.py), with real
Mosquitto brokers and real wrapper processes: refused at start naming the first, allowed when told, and the
first's record gone with it (a clean stop, a kill -9); a broker not reachable at start, or an ACL without the
line, does not hold a wrapper up."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from federation.daemon.other_wrappers import PREFIX

from broker_util import Broker, free_port, mosquitto_sub, requires_mosquitto, start_broker, wait_for

pytestmark = requires_mosquitto

START_TIMEOUT = 20.0


def udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Wrapper:
    """`python -m federation.daemon.cli` against a broker port; its stderr in a file."""

    def __init__(self, directory: Path, broker_port: int, name: str, *flags: str,
                 environment: dict[str, str] | None = None) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.port = udp_port()
        self.client_id = f"federation-wrapper-127.0.0.1-{self.port}"
        self.log = directory / f"{name}.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "federation.daemon.cli", "--bind", f"127.0.0.1:{self.port}",
                 "--broker", f"127.0.0.1:{broker_port}", "--neighbors", f"127.0.0.1:{udp_port()}", "--name", name,
                 *flags], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, **(environment or {})})

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def logged(self, words: str) -> bool:
        assert self.process.poll() is None, f"the wrapper exited with {self.process.returncode}:\n{self.text()}"
        return words in self.text()

    def stop(self, how: signal.Signals = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(how)
            try:
                return self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


@pytest.fixture
def wrappers() -> Iterator[list[Wrapper]]:
    started: list[Wrapper] = []
    yield started
    for wrapper in started:
        wrapper.stop(signal.SIGKILL)


def records(broker: Broker) -> list[str]:
    """The wrapper records the broker holds now (retained), as `topic payload` lines."""
    heard = subprocess.run(mosquitto_sub(broker.port, "-t", PREFIX + "+", "-v", "-W", "1"), capture_output=True,
                           text=True, timeout=10, check=False)
    return [line for line in heard.stdout.splitlines() if line.strip()]


def running(broker: Broker, wrappers: list[Wrapper], tmp_path: Path, name: str, *flags: str,
            environment: dict[str, str] | None = None) -> Wrapper:
    """A wrapper started and holding its record on the broker."""
    wrapper = Wrapper(tmp_path, broker.port, name, *flags, environment=environment)
    wrappers.append(wrapper)
    wait_for(lambda: any(line.startswith(PREFIX + wrapper.client_id + " ") for line in records(broker)),
             START_TIMEOUT, 0.2, lambda: f"{name}'s record on the broker:\n{wrapper.text()}")
    return wrapper


def test_a_second_wrapper_is_refused_naming_the_first_unless_allowed(tmp_path: Path,
                                                                     wrappers: list[Wrapper]) -> None:
    broker = start_broker(tmp_path, name="broker")
    try:
        first = running(broker, wrappers, tmp_path, "alpha")
        second = Wrapper(tmp_path, broker.port, "beta")
        wrappers.append(second)
        assert second.process.wait(START_TIMEOUT) == 2, second.text()
        message = second.text()
        assert message.startswith("federation-wrapper: error: 1 other federation wrapper(s) hold a record on "
                                  f"broker 127.0.0.1:{broker.port}: client '{first.client_id}' (alpha), overlay "
                                  f"address 127.0.0.1:{first.port}"), message
        assert "--allow-other-wrappers" in message and "MQTT_FEDERATION_ALLOW_OTHER_WRAPPERS=true" in message
        assert [line.split()[0] for line in records(broker)] == [PREFIX + first.client_id], "beta left a record"

        allowed = running(broker, wrappers, tmp_path, "gamma",
                          environment={"MQTT_FEDERATION_ALLOW_OTHER_WRAPPERS": "true"})
        assert allowed.logged(f"client '{first.client_id}' (alpha)") and allowed.logged("starting anyway")
        assert first.process.poll() is None, "the first wrapper must go on"
    finally:
        broker.stop()


def test_the_record_goes_with_its_wrapper_stopped_or_killed(tmp_path: Path, wrappers: list[Wrapper]) -> None:
    broker = start_broker(tmp_path, name="broker")
    try:
        stopped = running(broker, wrappers, tmp_path, "stopped")
        assert stopped.stop(signal.SIGTERM) == 0, stopped.text()
        assert records(broker) == [], "a clean stop removes the record"
        killed = running(broker, wrappers, tmp_path, "killed")
        killed.stop(signal.SIGKILL)
        wait_for(lambda: records(broker) == [], 10, 0.2, "the will to remove the killed wrapper's record")
        running(broker, wrappers, tmp_path, "next")  # nothing left to refuse it
    finally:
        broker.stop()


def test_a_broker_down_at_start_or_an_acl_without_the_line_holds_no_wrapper_up(tmp_path: Path,
                                                                               wrappers: list[Wrapper]) -> None:
    parked = Broker(tmp_path / "late", free_port())
    port = parked.port
    early = Wrapper(tmp_path, port, "early")
    wrappers.append(early)
    wait_for(lambda: early.logged("the look for other wrappers on broker") and early.logged("cannot be reached yet"),
             START_TIMEOUT, 0.1, lambda: f"the wrapper to start without its broker:\n{early.text()}")
    parked.start()
    try:  # the look happens when the broker comes, and the record is held from then on
        wait_for(lambda: any(early.client_id in line for line in records(parked)), START_TIMEOUT, 0.2,
                 lambda: f"the late look and the record:\n{early.text()}")
    finally:
        parked.stop()

    acl = tmp_path / "acl"
    acl.write_text("topic read $SYS/broker/log/#\ntopic readwrite #\n", encoding="utf-8")  # anonymous users
    strict = start_broker(tmp_path, name="strict", extra_conf_lines=[f"acl_file {acl}"])
    try:
        lone = Wrapper(tmp_path, strict.port, "lone")
        wrappers.append(lone)
        wait_for(lambda: lone.logged("could not look for other wrappers")
                 and lone.logged("topic readwrite $federation/wrappers/#"), START_TIMEOUT, 0.1,
                 lambda: f"the wrapper to start without the look:\n{lone.text()}")
        wait_for(lambda: lone.logged("connected to broker"), START_TIMEOUT, 0.1,
                 lambda: f"the wrapper to connect:\n{lone.text()}")
    finally:
        strict.stop()
