"""Topic policies and the reloadable settings in the wrapper's configuration (`topics:`, `--topic`,
`neighbour_resolve_interval`, the file's hash): errors that name the field and the line, flags that win."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from federation.daemon import cli
from federation.daemon.config import ConfigError, load_config
from federation.daemon.topic_policy import EVERYTHING, Crossing


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "wrapper.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_topics_from_the_file_and_the_flags_which_replace_them(tmp_path: Path) -> None:
    path = write(tmp_path, "topics:\n  - 'sensors/# out 1 \"\" site-a/'\n  - cmd/# in 1\n")
    config = load_config({"config": path})
    assert config.topic_policy.texts == ('sensors/# out 1 "" site-a/', "cmd/# in 1")
    assert config.topic_policy.export("sensors/t1") == Crossing("site-a/sensors/t1", 1)
    flagged = load_config({"config": path, "topics": ["# both 2 local/ fed/"]})
    assert flagged.topic_policy.texts == ("# both 2 local/ fed/",)
    assert load_config({}).topic_policy == EVERYTHING and load_config({}).topic_policy.everything
    assert load_config({"config": write(tmp_path, "topics: []\n")}).topic_policy.everything


def test_a_bad_line_names_the_field_the_line_and_mosquittos_message(tmp_path: Path) -> None:
    path = write(tmp_path, "topics:\n  - cmd/# in 1\n  - sensors/# up 1\n")
    with pytest.raises(ConfigError) as caught:
        load_config({"config": path})
    assert str(caught.value) == (f"{path}: topics[1] 'sensors/# up 1': Error: Invalid bridge topic direction 'up'. "
                                 f"Write out, in or both after the pattern.")
    with pytest.raises(ConfigError, match=r"^--topic 'x out 3': Error: Invalid bridge QoS level '3'\. Write 0, 1"):
        load_config({"topics": ["x out 3"]})


def test_an_unquoted_hash_line_is_a_yaml_comment_and_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"topics\[0\]: expected a topic line.*got None: in YAML a line that "
                                          r"starts with # is a comment, quote it"):
        load_config({"config": write(tmp_path, "topics:\n  - # both 2\n")})
    with pytest.raises(ConfigError, match=r"topics: expected a list of topic lines"):
        load_config({"config": write(tmp_path, "topics: {a: b}\n")})


def test_the_configuration_carries_its_file_hash_and_what_reloads_it(tmp_path: Path) -> None:
    text = "neighbors: [127.0.0.7]\nneighbour_resolve_interval: 5\n"
    path = write(tmp_path, text)
    config = load_config({"config": path, "bind": "127.0.0.2"})
    assert config.config_hash == hashlib.sha256(text.encode()).hexdigest()
    assert config.flags == {"config": path, "bind": "127.0.0.2"}
    assert config.neighbour_resolve_interval == 5.0
    assert [(str(given), str(address)) for given, address in config.neighbour_names] == [
        ("127.0.0.7:10500", "127.0.0.7:10500")]
    assert load_config({}).config_hash is None and load_config({}).neighbour_resolve_interval == 60.0
    assert load_config({"config": write(tmp_path, "neighbour_resolve_interval: 0\n")}).neighbour_resolve_interval == 0
    with pytest.raises(ConfigError, match=r"neighbour_resolve_interval: expected seconds from 0 to 86400"):
        load_config({"config": write(tmp_path, "neighbour_resolve_interval: -1\n")})


def test_the_command_line_takes_repeated_topic_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    options = vars(cli.build_run_parser().parse_args(["--topic", "a/# out", "--topic", "b/# in 1"]))
    assert options["topics"] == ["a/# out", "b/# in 1"]
    assert cli.main(["--topic", "a/# sideways"]) == 2
    assert "federation-wrapper: error: --topic 'a/# sideways': Error: Invalid bridge topic direction 'sideways'." \
        in capsys.readouterr().err
