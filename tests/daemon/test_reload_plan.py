"""What a SIGHUP's configuration changes in a running wrapper (federation.daemon.reload.plan_reload), and the
neighbours' names resolved again (federation.daemon.neighbour_names): pure, no process."""

from __future__ import annotations

import socket
from pathlib import Path

from federation.daemon import neighbour_names
from federation.daemon.config import DaemonConfig, load_config
from federation.daemon.reload import plan_reload
from federation.protocol.types import Address

NAMES = {"alpha.example": "10.1.0.1", "beta.example": "10.1.0.2"}


def resolver(host: str, port: int, family: int) -> str:
    try:
        return NAMES[host]
    except KeyError:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known") from None


def load(tmp_path: Path, text: str, **flags: str) -> DaemonConfig:
    path = tmp_path / "wrapper.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config({"config": str(path), "bind": "10.0.0.9", **flags}, resolver=resolver)


def test_what_changes_at_run_time_and_what_waits_for_a_restart(tmp_path: Path) -> None:
    running = load(tmp_path, "neighbors: [alpha.example]\ntopics: ['a/# out']\nlog_level: INFO\n")
    loaded = load(tmp_path, "neighbors: [alpha.example, beta.example]\ntopics: ['a/# out', 'b/# in']\n"
                            "log_level: DEBUG\nmax_qos: 1\nsettings: {hello_interval: 2}\n"
                            "neighbour_resolve_interval: 5\n")
    plan = plan_reload(running, loaded)
    assert (plan.neighbours, plan.policy, plan.log_level, plan.keys, plan.password, plan.resolve_interval) == \
        (True, True, True, False, False, True)
    assert plan.pending_restart == ("max_qos", "settings")
    applied = plan.applied
    assert applied.neighbours == (Address("10.1.0.1", 10500), Address("10.1.0.2", 10500))
    assert applied.topic_policy.texts == ("a/# out", "b/# in") and applied.log_level == "DEBUG"
    assert applied.max_qos == 2 and applied.settings == running.settings
    assert applied.config_hash == loaded.config_hash != running.config_hash
    same = plan_reload(running, load(tmp_path, "neighbors: [alpha.example]\ntopics: ['a/# out']\n"))
    assert not (same.neighbours or same.policy or same.log_level) and same.pending_restart == ()


def test_the_announced_address_cannot_change_while_running(tmp_path: Path) -> None:
    running = load(tmp_path, "{}\n")
    loaded = load(tmp_path, "{}\n", bind="10.0.0.8")
    plan = plan_reload(running, loaded)
    assert plan.pending_restart == ("bind", "client_id", "metrics_bind")  # the last two follow from the bind
    assert plan.applied.announced == running.announced == Address("10.0.0.9", 10500)


def test_names_resolved_again_keep_their_address_when_they_fail() -> None:
    names = ((Address("alpha.example", 10500), Address("10.1.0.1", 10500)),
             (Address("gone.example", 10501), Address("10.1.0.7", 10501)),
             (Address("10.3.0.1", 10500), Address("10.3.0.1", 10500)))
    NAMES["alpha.example"] = "10.1.0.5"  # it moved
    try:
        found, problems = neighbour_names.resolve_again(names, socket.AF_INET, resolver)
    finally:
        NAMES["alpha.example"] = "10.1.0.1"
    assert [address for _given, address in found] == [Address("10.1.0.5", 10500), Address("10.1.0.7", 10501),
                                                      Address("10.3.0.1", 10500)]
    assert len(problems) == 1 and "'gone.example'" in problems[0] and "still using 10.1.0.7:10501" in problems[0]
    assert neighbour_names.moved(names, found) == ["alpha.example:10500 10.1.0.1:10500 -> 10.1.0.5:10500"]
    assert neighbour_names.addresses(found, Address("10.1.0.7", 10501)) == (Address("10.1.0.5", 10500),
                                                                            Address("10.3.0.1", 10500))
    assert neighbour_names.has_names(names) and not neighbour_names.has_names(names[2:])


def test_a_first_neighbour_on_another_host_needs_network_sized_datagrams(tmp_path: Path) -> None:
    running = load(tmp_path, "neighbors: [127.0.0.7]\n", bind="127.0.0.9")
    plan = plan_reload(running, load(tmp_path, "neighbors: [127.0.0.7, alpha.example]\n", bind="127.0.0.9"))
    assert plan.neighbours and plan.pending_restart[0].startswith("settings.max_datagram")
