"""wrapper.yaml keys from environment variables `MQTT_FEDERATION_<KEY>`: how a container is configured.

Theory of operation: a container image is configured through its environment as often as through a mounted
file, so every top-level key of wrapper.yaml can also come from a variable named `MQTT_FEDERATION_` and the
key in capitals (`MQTT_FEDERATION_NEIGHBORS=paris,berlin`, `MQTT_FEDERATION_METRICS_PORT=9101`), and the
protocol settings from `MQTT_FEDERATION_SETTINGS` as one YAML mapping (`{hello_interval: 1}`), merged over the
file's. The layers are, weakest first: defaults, the YAML file, the environment, the flags
(federation.daemon.config.load_config reads this module between the file and the flags, also on SIGHUP).

A value is the variable's text, as a flag's would be: the config's checks read numbers written as text, a
comma-separated neighbour list and `null` (unset what the file says). A value that starts with `[` or `{` is
read as YAML (a list of `topics` lines, `event_types`). A variable with the prefix that names no key is an
error naming it and listing the keys, so a misspelt setting is not silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

PREFIX = "MQTT_FEDERATION_"
SETTINGS = "settings"
ALIASES = {"neighbours": "neighbors"}


class EnvironmentSettingError(ValueError):
    """A variable with the prefix that cannot be used; the message names it and says what to write."""


@dataclass
class EnvironmentValues:
    values: dict[str, tuple[Any, str]] = field(default_factory=dict)
    """key -> (value, the variable's name, for messages)"""
    settings: dict[str, Any] = field(default_factory=dict)
    """protocol settings from MQTT_FEDERATION_SETTINGS"""


def variable(key: str) -> str:
    """The environment variable of a wrapper.yaml key."""
    return PREFIX + key.upper()


def environment_values(environ: Mapping[str, str], keys: Iterable[str]) -> EnvironmentValues:
    """The wrapper.yaml keys (`keys`, without `settings`) and settings the environment gives."""
    known = {variable(key): key for key in keys}
    known.update({variable(alias): key for alias, key in ALIASES.items() if key in known.values()})
    found = EnvironmentValues()
    for name in sorted(environ):
        if not name.startswith(PREFIX):
            continue
        text = environ[name]
        if name == variable(SETTINGS):
            found.settings = _settings(name, text)
            continue
        key = known.get(name)
        if key is None:
            choices = ", ".join(sorted([*known, variable(SETTINGS)]))
            raise EnvironmentSettingError(f"{name}: no such setting; the variables are {PREFIX} and a wrapper.yaml "
                                          f"key in capitals: {choices}")
        if key in found.values:
            raise EnvironmentSettingError(f"{name} and {found.values[key][1]} both give {key}; keep one")
        found.values[key] = (_value(name, text), name)
    return found


def _value(name: str, text: str) -> Any:
    stripped = text.strip()
    if stripped == "null":
        return None
    if stripped.startswith(("[", "{")):
        try:
            return yaml.safe_load(stripped)
        except yaml.YAMLError as error:
            raise EnvironmentSettingError(f"{name}: not valid YAML ({_one_line(error)}); write a list as "
                                          f"[a, b] or give the text without brackets") from None
    return text


def _settings(name: str, text: str) -> dict[str, Any]:
    try:
        mapping = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as error:
        raise EnvironmentSettingError(f"{name}: not valid YAML ({_one_line(error)}); write the protocol settings "
                                      f"as one mapping, e.g. {name}='{{hello_interval: 1, dead_intervals: 4}}'") \
            from None
    if not isinstance(mapping, dict):
        raise EnvironmentSettingError(f"{name}: expected a mapping of protocol settings, e.g. "
                                      f"{name}='{{hello_interval: 1}}', got {text!r}")
    return mapping


def _one_line(error: yaml.YAMLError) -> str:
    return " ".join(str(error).split())
