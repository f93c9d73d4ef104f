"""wrapper.yaml keys from MQTT_FEDERATION_* environment variables (federation/daemon/environment.py): the layer
between the YAML file and the flags, as a container image is configured (issue 40, item 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from federation.daemon.config import ConfigError, load_config


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "wrapper.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_the_environment_sits_between_the_file_and_the_flags(tmp_path: Path) -> None:
    config_file = write(tmp_path, "metrics_port: 9000\nname: from-file\nlog_level: DEBUG\n"
                                  "settings: {hello_interval: 2.0, dead_intervals: 6}\n")
    environ = {"MQTT_FEDERATION_METRICS_PORT": "9101", "MQTT_FEDERATION_NAME": "from-env",
               "MQTT_FEDERATION_NEIGHBORS": "127.0.0.7,127.0.0.8:10600", "MQTT_FEDERATION_MAX_QOS": "1",
               "MQTT_FEDERATION_SETTINGS": "{hello_interval: 0.5}", "UNRELATED": "x"}
    config = load_config({"config": config_file, "name": "from-flag"}, environ=environ)
    assert config.metrics_port == 9101  # the environment beats the file
    assert config.name == "from-flag"  # a flag beats the environment
    assert config.log_level == "DEBUG"  # the file where the environment says nothing
    assert [str(n) for n in config.neighbours] == ["127.0.0.7:10500", "127.0.0.8:10600"]
    assert config.max_qos == 1
    assert config.settings.hello_interval == 0.5 and config.settings.dead_intervals == 6  # merged over the file's


def test_null_unsets_and_brackets_read_yaml(tmp_path: Path) -> None:
    config_file = write(tmp_path, "metrics_port: 9000\n")
    config = load_config({"config": config_file},
                         environ={"MQTT_FEDERATION_METRICS_PORT": "null",
                                  "MQTT_FEDERATION_EVENT_TYPES": "[node_started, neighbour_up]",
                                  "MQTT_FEDERATION_NEIGHBOURS": "127.0.0.9"})
    assert config.metrics_port is None
    assert config.event_types == frozenset({"node_started", "neighbour_up"})
    assert [str(n) for n in config.neighbours] == ["127.0.0.9:10500"]


def test_a_yes_or_no_setting_from_text() -> None:
    assert load_config({}, environ={"MQTT_FEDERATION_ALLOW_OTHER_WRAPPERS": "true"}).allow_other_wrappers is True
    assert load_config({}, environ={"MQTT_FEDERATION_ALLOW_OTHER_WRAPPERS": "no"}).allow_other_wrappers is False
    assert load_config({}, environ={}).allow_other_wrappers is False
    with pytest.raises(ConfigError, match="MQTT_FEDERATION_ALLOW_OTHER_WRAPPERS: expected true or false, got 'maybe'"):
        load_config({}, environ={"MQTT_FEDERATION_ALLOW_OTHER_WRAPPERS": "maybe"})


@pytest.mark.parametrize(("environ", "message"), [
    ({"MQTT_FEDERATION_NEIGHBOURZ": "a"}, "MQTT_FEDERATION_NEIGHBOURZ: no such setting; the variables are "
                                          "MQTT_FEDERATION_ and a wrapper.yaml key in capitals: "),
    ({"MQTT_FEDERATION_METRICS_PORT": "ninety"}, "MQTT_FEDERATION_METRICS_PORT: expected a TCP port 1-65535"),
    ({"MQTT_FEDERATION_SETTINGS": "hello_interval"}, "MQTT_FEDERATION_SETTINGS: expected a mapping of protocol "
                                                     "settings"),
    ({"MQTT_FEDERATION_SETTINGS": "{hello_interval: -1}"}, "settings, with MQTT_FEDERATION_SETTINGS"),
    ({"MQTT_FEDERATION_EVENT_TYPES": "[unclosed"}, "MQTT_FEDERATION_EVENT_TYPES: not valid YAML"),
    ({"MQTT_FEDERATION_NEIGHBORS": "127.0.0.7", "MQTT_FEDERATION_NEIGHBOURS": "127.0.0.8"}, "keep one"),
])
def test_a_bad_variable_is_named_with_the_fix(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config({}, environ=environ)
    assert message in str(raised.value)
