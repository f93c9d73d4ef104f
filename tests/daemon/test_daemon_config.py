"""The wrapper's configuration: defaults, YAML, flags (which win), resolution, and errors that say what to fix."""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from federation.daemon import cli
from federation.daemon.config import ConfigError, load_config, sample_yaml
from federation.protocol.settings import Settings
from federation.protocol.types import Address

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "configs" / "wrapper.yaml"

NAMES = {"alpha.example": "10.1.0.1", "beta.example": "10.1.0.2"}


def fake_resolver(host: str, port: int, family: int) -> str:
    try:
        return NAMES[host]
    except KeyError:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known") from None


def fake_source(target: Address, family: int) -> str:
    return "10.9.9.9"


def load(flags: dict[str, Any] | None = None, yaml_text: str | None = None, tmp_path: Path | None = None):
    given = dict(flags or {})
    if yaml_text is not None:
        assert tmp_path is not None
        path = tmp_path / "wrapper.yaml"
        path.write_text(yaml_text)
        given["config"] = str(path)
    return load_config(given, resolver=fake_resolver, source_for=fake_source)


def error_of(flags: dict[str, Any] | None = None, yaml_text: str | None = None, tmp_path: Path | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load(flags, yaml_text, tmp_path)
    return str(caught.value)


def test_defaults() -> None:
    config = load()
    assert config.bind == Address("0.0.0.0", 10500)
    assert config.announced == Address("127.0.0.1", 10500)  # no neighbours: loopback
    assert config.broker == Address("127.0.0.1", 1883)
    assert config.neighbours == ()
    assert config.client_id == "federation-wrapper-0.0.0.0-10500"
    assert config.max_qos == 2 and config.log_level == "INFO" and config.vid is None
    assert config.state_dir is None and config.event_log is None and config.metrics_port is None
    assert config.event_types is None
    assert config.settings == Settings()
    assert config.metrics_bind == "0.0.0.0"


def test_yaml_then_flags_win(tmp_path: Path) -> None:
    text = """
neighbors: ["10.0.0.2", "10.0.0.3:10600"]
bind: 10.0.0.1:10501
broker: 10.0.0.1:1884
id: 7
name: edge-a
state_dir: /var/lib/fed
event_log: /var/log/fed.jsonl
event_types: [node_started, node_stopped]
metrics_port: 9100
log_level: debug
max_qos: 1
client_id: my-wrapper
settings:
  hello_interval: 0.5
  redundancy: 3
"""
    config = load(yaml_text=text, tmp_path=tmp_path)
    assert config.neighbours == (Address("10.0.0.2", 10500), Address("10.0.0.3", 10600))
    assert config.bind == config.announced == Address("10.0.0.1", 10501)
    assert config.broker == Address("10.0.0.1", 1884)
    assert (config.vid, config.name, config.max_qos, config.log_level) == (7, "edge-a", 1, "DEBUG")
    assert config.state_dir == Path("/var/lib/fed") and config.event_log == Path("/var/log/fed.jsonl")
    assert config.event_types == frozenset({"node_started", "node_stopped"})
    assert config.metrics_port == 9100 and config.metrics_bind == "10.0.0.1"
    assert config.client_id == "my-wrapper"
    assert config.settings == dataclasses.replace(Settings(), hello_interval=0.5, redundancy=3)

    flags = {"neighbors": "10.0.0.9", "bind": "10.0.0.1:10777", "id": "3", "log_level": "ERROR",
             "metrics_port": "9200", "state_dir": "/tmp/other"}
    overridden = load(flags, yaml_text=text, tmp_path=tmp_path)
    assert overridden.neighbours == (Address("10.0.0.9", 10500),)
    assert overridden.bind == Address("10.0.0.1", 10777)
    assert (overridden.vid, overridden.log_level, overridden.metrics_port) == (3, "ERROR", 9200)
    assert overridden.state_dir == Path("/tmp/other")
    assert overridden.broker == Address("10.0.0.1", 1884)  # not overridden: the file's value stays
    assert overridden.client_id == "my-wrapper"


@pytest.mark.parametrize(("event_log", "types", "expected"), [
    (None, None, False),                                             # no event log: nothing would write them
    ("events.jsonl", None, True),                                    # every type kept
    ("events.jsonl", "[node_started, neighbour_up]", False),         # control plane only
    ("events.jsonl", "[node_started, publication_delivered]", True),  # one of them is enough
])
def test_per_publication_events_are_made_only_for_an_event_log_that_keeps_them(
        tmp_path: Path, event_log: str | None, types: str | None, expected: bool) -> None:
    text = "neighbors: [10.0.0.2]\n"
    if event_log is not None:
        text += f"event_log: {tmp_path / event_log}\n"
    if types is not None:
        text += f"event_types: {types}\n"
    assert load(yaml_text=text, tmp_path=tmp_path).publication_events is expected


def test_neighbours_spellings_and_cleanup(tmp_path: Path) -> None:
    config = load(yaml_text="neighbours:\n  - 10.0.0.2\n  - 10.0.0.2:10500\n  - 10.0.0.1\nbind: 10.0.0.1\n",
                  tmp_path=tmp_path)
    assert config.neighbours == (Address("10.0.0.2", 10500),)  # duplicate and self removed
    parsed = vars(cli.build_run_parser().parse_args(["--neighbours", "10.0.0.5, 10.0.0.6:7"]))
    assert load(parsed).neighbours == (Address("10.0.0.5", 10500), Address("10.0.0.6", 7))
    assert "both 'neighbors' and 'neighbours'" in error_of(yaml_text="neighbors: []\nneighbours: []\n",
                                                           tmp_path=tmp_path)


def test_names_are_resolved_and_wildcard_announces_the_route_source() -> None:
    config = load({"neighbors": "alpha.example,beta.example:10600"})
    assert config.neighbours == (Address("10.1.0.1", 10500), Address("10.1.0.2", 10600))
    assert config.announced == Address("10.9.9.9", 10500)  # the address that reaches the first neighbour
    assert config.bind == Address("0.0.0.0", 10500)


def test_route_source_for_loopback_neighbour() -> None:
    config = load_config({"neighbors": "127.0.0.7:10500"})
    assert config.announced == Address("127.0.0.1", 10500)


@pytest.mark.parametrize("flags, expected", [
    ({"neighbors": "nowhere.invalid"}, "neighbors: cannot resolve neighbour 'nowhere.invalid' host"),
    ({"bind": "10.0.0.1:99999"}, "--bind: bad port '99999'"),
    ({"broker": "host:x"}, "--broker: bad port 'x'"),
    ({"id": "-4"}, "--id: expected a whole number from 0 to 2147483647"),
    ({"id": "2147483648"}, "--id: expected a whole number"),
    ({"metrics_port": "0"}, "--metrics-port: expected a TCP port 1-65535"),
    ({"log_level": "loud"}, "--log-level: expected one of DEBUG, INFO, WARNING, ERROR"),
    ({"bind": "::1", "neighbors": "10.0.0.2"}, "use one address family throughout"),
])
def test_flag_errors_name_the_field_and_the_fix(flags: dict[str, Any], expected: str) -> None:
    assert expected in error_of(flags)


@pytest.mark.parametrize("text, expected", [
    ("neighbors: [1.2.3.4]\nhello: 1\n", "unknown key 'hello'; known keys are:"),
    ("settings:\n  hello_interval: -1\n", "settings.hello_interval: must be greater than 0"),
    ("settings:\n  no_such: 1\n", "settings: unknown setting 'no_such'"),
    ("settings: 3\n", "settings: expected a mapping"),
    ("settings:\n  max_datagram: 100\n", "settings.max_datagram: must be 512 to 65507 bytes, or 0 to let the "
                                          "wrapper choose, got 100"),
    ("max_qos: 3\n", "max_qos: expected 0, 1 or 2"),
    ("event_types: [node_started, bogus]\n", "event_types: unknown event type 'bogus'"),
    ("neighbors: 5\n", "neighbors: expected a list of HOST[:PORT]"),
    ("neighbors: [10.0.0.2, 7]\n", "neighbors[1]: expected HOST[:PORT]"),
    ("bind: [\n", "not valid YAML"),
    ("- a\n- b\n", "expected a mapping of settings"),
    ("broker_session_expiry: 0\n", "broker_session_expiry: expected whole seconds from 60 to 4294967295 (how long "
                                    "the broker keeps the wrapper's session; the default 3600 rides out a wrapper "
                                    "restart), got 0"),
    ("broker_session_expiry: 1.5\n", "broker_session_expiry: expected whole seconds from 60"),
    ("resubscribe_grace: -1\n", "resubscribe_grace: expected seconds above 0 and at most 86400"),
    ("resubscribe_grace: soon\n", "resubscribe_grace: expected seconds above 0"),
    ("broker_read_coalesce: 0.1\n", "broker_read_coalesce: expected seconds from 0 to 0.05 (0 turns the gathering "
                                     "off; default 0.002), got 0.1"),
    ("broker_read_coalesce: -0.001\n", "broker_read_coalesce: expected seconds from 0 to 0.05"),
    ("broker_read_coalesce: false\n", "broker_read_coalesce: expected seconds from 0 to 0.05"),
])
def test_yaml_errors_name_the_field(tmp_path: Path, text: str, expected: str) -> None:
    message = error_of(yaml_text=text, tmp_path=tmp_path)
    assert expected in message
    if "YAML" not in expected and "mapping of settings" not in expected:
        assert str(tmp_path / "wrapper.yaml") in message  # which file


def test_the_broker_session_settings(tmp_path: Path) -> None:
    config = load()
    assert config.broker_session_expiry == 3600 and config.resubscribe_grace == 30.0
    config = load(yaml_text="broker_session_expiry: 86400\nresubscribe_grace: 2.5\n", tmp_path=tmp_path)
    assert config.broker_session_expiry == 86400 and config.resubscribe_grace == 2.5
    assert config.broker_read_coalesce == 0.002
    assert load(yaml_text="broker_read_coalesce: 0\n", tmp_path=tmp_path).broker_read_coalesce == 0.0
    assert load(yaml_text="broker_read_coalesce: 0.004\n", tmp_path=tmp_path).broker_read_coalesce == 0.004
    assert load(yaml_text="event_types: [broker_connected, unaccounted_subscriptions]\n",
                tmp_path=tmp_path).event_types == {"broker_connected", "unaccounted_subscriptions"}


def test_missing_file_and_state_dir_that_is_a_file(tmp_path: Path) -> None:
    assert "--config: file" in error_of({"config": str(tmp_path / "missing.yaml")})
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert "is not a directory" in error_of({"state_dir": str(plain)})
    assert "is a directory" in error_of({"event_log": str(tmp_path)})


@pytest.mark.parametrize(("hosts", "chosen"), [
    (["127.0.0.1", "127.0.40.11", "127.0.40.12"], 65507),
    (["::1", "::1"], 65507),
    (["127.0.0.1", "10.0.0.2"], 1400),  # one neighbour off the host: every datagram must cross Ethernet
    (["10.0.0.1", "10.0.0.2"], 1400),
    (["127.0.0.1", "broker.example"], 1400),  # a name (the daemon resolves them first): not known loopback
])
def test_max_datagram_0_is_chosen_from_the_addresses(hosts: list[str], chosen: int) -> None:
    assert Settings().max_datagram == 0
    assert Settings().with_datagram_for(hosts).max_datagram == chosen
    assert Settings(max_datagram=9000).with_datagram_for(hosts).max_datagram == 9000  # a size given stays
    small = Settings(max_packet=40000, max_publication_bytes=30000)
    assert small.with_datagram_for(hosts).max_datagram == min(chosen, 40000)  # never above max_packet


def test_sample_file_is_generated_and_documents_every_setting() -> None:
    text = SAMPLE.read_text()
    stale = "configs/wrapper.yaml is stale: python -m federation.daemon.config > configs/wrapper.yaml"
    assert text == sample_yaml(), stale
    data = yaml.safe_load(text)
    for field in dataclasses.fields(Settings):
        assert field.name in data["settings"], field.name
        assert f"  {field.name}: " in text
    for name, default, doc in Settings.documentation():
        assert doc, f"Settings.{name} has no docstring"
        assert data["settings"][name] == (list(default) if isinstance(default, tuple) else default)
        assert " ".join(doc.split()[:3]) in text
    config = load_config({"config": str(SAMPLE)})  # the sample is a valid config giving the defaults
    assert config.settings == Settings()
    assert config.bind == Address("0.0.0.0", 10500) and config.broker == Address("127.0.0.1", 1883)


def test_cli_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--bind", "127.0.0.1:70000"]) == 2
    assert "federation-wrapper: error: --bind: bad port '70000'" in capsys.readouterr().err
    assert cli.main(["--no-such-flag"]) == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("settings:\n  redundancy: 0\n")
    assert cli.main(["--config", str(bad)]) == 2
    assert "settings.redundancy: must be greater than 0" in capsys.readouterr().err
    assert cli.main(["status", "--node", "127.0.0.1:0"]) == 2
    assert "--node: bad port" in capsys.readouterr().err


# ------------------------------------------------------------------ broker credentials and TLS


def test_a_broker_address_with_credentials_is_refused_without_echoing_it(tmp_path: Path) -> None:
    for message in (error_of({"broker": "fed:s3cret-pass@127.0.0.1:1883"}),
                    error_of(yaml_text="broker: 'fed:s3cret-pass@127.0.0.1'\n", tmp_path=tmp_path)):
        assert "s3cret-pass" not in message and "fed:" not in message
        assert "holds credentials" in message
        assert "broker_username (--broker-username)" in message and "(--broker-password-file)" in message
    assert "without a scheme" in error_of({"broker": "mqtts://127.0.0.1"})


def test_broker_login_and_tls_options_load(tmp_path: Path) -> None:
    from tls_util import make_pki

    pki = make_pki(tmp_path / "pki")
    password_file = tmp_path / "broker.password"
    password_file.write_text("pass word with spaces\nignored second line\n")
    password_file.chmod(0o600)
    config = load({"broker_username": "fed", "broker_password_file": str(password_file),
                   "broker_tls_ca": str(pki.ca), "broker_tls_cert": str(pki.client_cert),
                   "broker_tls_key": str(pki.client_key), "broker": "localhost"})
    auth = config.broker_auth
    assert (auth.username, auth.password, auth.tls) == ("fed", "pass word with spaces", True)
    assert config.broker == Address("localhost", 8883)  # the TLS port when none is given
    assert "pass word" not in repr(config) and "pass word" not in auth.describe()
    assert auth.describe() == (f"as user 'fed' with a password over TLS (CA {pki.ca}, client certificate "
                               f"{pki.client_cert})")
    assert auth.permission_warnings() == []
    password_file.chmod(0o644)
    assert auth.permission_warnings() == [f"broker_password_file (--broker-password-file): {password_file} can be "
                                          f"read or written by other users (mode 0644): chmod 600 {password_file}"]
    yaml_config = load(yaml_text=f"broker_username: fed\nbroker_password_file: {password_file}\n"
                                 f"broker_tls_ca: {pki.ca}\n", tmp_path=tmp_path)
    assert yaml_config.broker_auth.password == "pass word with spaces"
    assert yaml_config.broker == Address("127.0.0.1", 1883)  # a port given stays (the default broker has one)
    plain = load({"broker_username": "fed"})
    assert (plain.broker_auth.password, plain.broker_auth.tls, plain.broker_auth.ssl_context()) == (None, False, None)


def test_every_bad_broker_credential_option_names_the_option_and_the_fix(tmp_path: Path) -> None:
    from tls_util import make_pki

    pki = make_pki(tmp_path / "pki")
    empty = tmp_path / "empty"
    empty.write_text("\nsecond line\n")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    unreadable = tmp_path / "unreadable"
    unreadable.write_text("x\n")
    cases = [
        ({"broker_password_file": str(empty)}, "broker_password_file (--broker-password-file) needs broker_username"),
        ({"broker_username": "fed", "broker_password_file": str(tmp_path / "missing")},
         f"broker_password_file (--broker-password-file): file '{tmp_path / 'missing'}' not found; write the "
         f"broker password on the first line"),
        ({"broker_username": "fed", "broker_password_file": str(empty)}, "the first line of"),
        ({"broker_username": "fed", "broker_password_file": str(tmp_path)}, "is a directory"),
        ({"broker_tls_cert": str(pki.client_cert)}, "broker_tls_cert (--broker-tls-cert) needs broker_tls_key"),
        ({"broker_tls_key": str(pki.client_key)}, "broker_tls_key (--broker-tls-key) needs broker_tls_cert"),
        ({"broker_tls_ca": str(tmp_path / "nope.crt")}, "broker_tls_ca (--broker-tls-ca): file"),
        ({"broker_tls_ca": str(garbage)}, "holds no usable CA certificate"),
        ({"broker_tls_ca": str(pki.ca), "broker_tls_cert": str(pki.client_cert), "broker_tls_key": str(pki.server_key)},
         "cannot load the client certificate"),
        ({"broker_tls_ca": str(pki.ca), "broker_tls_cert": str(pki.client_cert),
          "broker_tls_key": str(tmp_path / "missing.key")}, "broker_tls_key (--broker-tls-key): file"),
        ({"broker_username": ""}, "--broker-username: expected a non-empty string"),
    ]
    for flags, expected in cases:
        message = error_of(flags)
        assert expected in message, (flags, message)
    unreadable.chmod(0)
    import os
    if os.geteuid() != 0:  # root reads anything
        assert "cannot read" in error_of({"broker_username": "fed", "broker_password_file": str(unreadable)})


def test_a_password_file_is_never_shown(tmp_path: Path) -> None:
    secret = tmp_path / "secret.pem"
    secret.write_text("hunter2-not-a-cert\n")
    message = error_of({"broker_tls_ca": str(secret)})
    assert "hunter2" not in message
