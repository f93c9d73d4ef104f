"""The container files, checked without a container engine (the default run); `pytest -m container` runs them
under podman (test_container_compose.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from federation.daemon.config import FIELDS
from federation.daemon.environment import PREFIX, variable

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "packaging" / "container" / "Containerfile"
COMPOSE = REPO / "examples" / "compose"
KNOWN = {variable(spec.key) for spec in FIELDS} | {variable("settings")}


def compose_file(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((COMPOSE / name).read_text(encoding="utf-8"))
    return document


def test_the_compose_brokers_get_the_shipped_drop_in_unchanged() -> None:
    assert (COMPOSE / "mosquitto" / "conf.d" / "federation.conf").read_bytes() == \
        (REPO / "configs" / "mosquitto-federation.conf").read_bytes(), \
        "examples/compose/mosquitto/conf.d/federation.conf must be configs/mosquitto-federation.conf: copy it"
    assert "include_dir /mosquitto/config/conf.d" in (COMPOSE / "mosquitto" / "mosquitto.conf").read_text()


def test_every_setting_the_files_give_is_a_wrapper_key() -> None:
    given = set(re.findall(rf"\b{PREFIX}[A-Z_]+", CONTAINERFILE.read_text(encoding="utf-8")))
    for name in ("compose.yaml", "site.yaml"):
        for service in compose_file(name)["services"].values():
            given |= {key for key in service.get("environment", {}) if key.startswith(PREFIX)}
    assert given and given <= KNOWN, sorted(given - KNOWN)


def test_three_sites_each_a_broker_and_its_wrapper() -> None:
    services = compose_file("compose.yaml")["services"]
    assert sorted(services) == sorted(f"{site}-{role}" for site in ("paris", "berlin", "madrid")
                                      for role in ("broker", "wrapper"))
    for site in ("paris", "berlin", "madrid"):
        wrapper = services[f"{site}-wrapper"]
        environment = wrapper["environment"]
        assert environment["MQTT_FEDERATION_BROKER"] == f"{site}-broker:1883"
        others = {f"{other}-wrapper" for other in ("paris", "berlin", "madrid") if other != site}
        assert set(environment["MQTT_FEDERATION_NEIGHBORS"].split(",")) == others
        assert environment["MQTT_FEDERATION_KEY_FILE"] == "/etc/mqtt-federation/federation.key"
        assert services[f"{site}-broker"]["image"].endswith("eclipse-mosquitto:2}")
    site = compose_file("site.yaml")["services"]["wrapper"]
    assert site["network_mode"] == "host", "a wrapper behind a published port would announce an unreachable address"


def test_the_containerfile_names_its_base_and_health() -> None:
    text = CONTAINERFILE.read_text(encoding="utf-8")
    assert "ARG BASE=docker.io/library/python:3.11-slim\nFROM ${BASE}\n" in text
    assert re.search(r"^HEALTHCHECK .*\n.*/readyz", text, re.MULTILINE)
    assert re.search(r"^USER mqtt-federation$", text, re.MULTILINE)
    assert 'ENTRYPOINT ["federation-wrapper"]' in text
