"""The shipped files (federation.shipped) and `federation-configs`, in a checkout; test_distribution.py does the
same from an installed wheel."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from federation import shipped
from federation.harness import nodeconfig
from federation.tools import configs

REPO = Path(__file__).resolve().parents[2]


def test_a_checkout_reads_its_own_folders() -> None:
    assert shipped.ROOT == REPO
    assert nodeconfig.MOSQUITTO_CONF_TEMPLATE == REPO / "configs" / "mosquitto.conf"
    assert nodeconfig.wrapper_program() == [str(REPO / "wrapper.py")]


def test_names_resolve_relative_to_the_root_or_to_configs() -> None:
    assert shipped.resolve("mosquitto.conf") == REPO / "configs" / "mosquitto.conf"
    assert shipped.resolve("topologies/line5.yaml") == REPO / "configs" / "topologies" / "line5.yaml"
    assert shipped.resolve("configs/topologies/line5.yaml") == REPO / "configs" / "topologies" / "line5.yaml"
    assert shipped.resolve("examples/three-sites") == REPO / "examples" / "three-sites"
    assert shipped.resolve("packaging/systemd/mqtt-federation.service").is_file()


@pytest.mark.parametrize("name", ["line5.yaml", "../setup.cfg", "/etc/passwd", "federation/shipped.py", ""])
def test_other_names_are_refused_with_what_would_do(name: str) -> None:
    with pytest.raises(shipped.ShippedFileError) as refused:
        shipped.resolve(name)
    if name == "line5.yaml":
        assert "configs/topologies/line5.yaml" in str(refused.value)


def test_listing_covers_the_three_folders_without_caches() -> None:
    listed = shipped.listing()
    assert {"configs/mosquitto.conf", "configs/wrapper.yaml", "examples/python_client.py",
            "packaging/logrotate/mqtt-federation"} <= set(listed)
    assert all(name.split("/")[0] in shipped.SHIPPED_FOLDERS and "__pycache__" not in name for name in listed)


def test_configs_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert configs.main(["show", "wrapper.yaml"]) == 0
    assert capsys.readouterr().out == (REPO / "configs" / "wrapper.yaml").read_text(encoding="utf-8")
    assert configs.main(["copy", "mosquitto.conf", "examples/home-iot", "--dest", str(tmp_path)]) == 0
    assert (tmp_path / "mosquitto.conf").is_file() and (tmp_path / "home-iot" / "kitchen.yaml").is_file()
    capsys.readouterr()
    # A copy that would overwrite changes nothing without --force, and says so.
    (tmp_path / "mosquitto.conf").write_text("mine\n")
    assert configs.main(["copy", "wrapper.yaml", "mosquitto.conf", "--dest", str(tmp_path)]) == 2
    assert "--force" in capsys.readouterr().err
    assert not (tmp_path / "wrapper.yaml").exists() and (tmp_path / "mosquitto.conf").read_text() == "mine\n"
    assert configs.main(["copy", "mosquitto.conf", "--dest", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "mosquitto.conf").read_text() != "mine\n"
    assert configs.main(["show", "examples/three-sites"]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert configs.main(["path"]) == 0 and capsys.readouterr().out.strip() == str(REPO)


def test_without_setup_cfg_the_lxd_image_takes_the_installed_requirements(tmp_path: Path) -> None:
    """From a wheel there is no setup.cfg: the image's requirements come from the installed metadata."""
    from federation.lxd.image import project_extra, project_requirements

    def names(requirements: tuple[str, ...]) -> set[str]:
        return {re.split(r"[<>=!~;\s\[]", requirement)[0] for requirement in requirements}

    missing = tmp_path / "setup.cfg"
    assert names(project_requirements(missing)) == names(project_requirements(REPO / "setup.cfg"))
    assert project_extra(missing, "lxc") == ("pylxd",)
    assert project_extra(missing, "no-such-extra") == ()
