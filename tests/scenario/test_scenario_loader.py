"""The scenario loader: every format feature it accepts, and every class of mistake it names."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from federation.protocol.settings import Settings
from federation.scenario.loader import ScenarioError, load_scenario, parse_scenario
from federation.scenario.model import (
    Cut,
    Disconnect,
    Heal,
    Kill,
    LinkDefaults,
    Loss,
    NodeSpec,
    Publish,
    Restart,
    Subscribe,
    Unsubscribe,
)

FULL = """\
name: everything
description: one of each
duration: 30
settle: 4
settings: {hello_interval: 0.5}
link_model: {latency: 0.002, jitter: 0.001, loss: 1, duplicate: 2}
nodes:
  n0: {id: 0}
  n1: null
  n2: {id: 0, settings: {redundancy: 3}}
links:
  - [n0, n1]
  - [n1, n2]
events:
  - {at: 8, loss: {link: [n0, n1], percent: 10}}
  - {at: 8, loss: {all: true, percent: 0}}
  - {at: 1, subscribe: {node: n0, client: s0, filter: "a/#", qos: 1}}
  - {at: 2, unsubscribe: {node: n0, client: s0, filter: "a/#"}}
  - {at: 2, disconnect: {node: n0, client: s0}}
  - {at: 3, publish: {node: n1, topic: a/b, count: 10, interval: 0.1, qos: 2, retain: true, payload_size: 64}}
  - {at: 4, cut: [n0, n1]}
  - {at: 4, cut: [n1, n0], oneway: true}
  - {at: 5, heal: [n0, n1]}
  - {at: 6, kill: n1}
  - {at: 7, restart: n1}
  - {at: 7.5, restart: {node: n2, broker: true}}
"""

MINIMAL = """\
duration: 10
nodes: [a, b]
links: [[a, b]]
"""


def write(tmp_path: Path, text: str, name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_full_file_builds_every_model_object(tmp_path: Path) -> None:
    path = write(tmp_path, FULL)
    scenario = load_scenario(path)
    assert scenario.name == "everything"
    assert scenario.source == str(path)
    assert scenario.duration == 30.0
    assert scenario.settle == 4.0
    assert scenario.settings == Settings(hello_interval=0.5)
    assert scenario.link_model == LinkDefaults(latency=0.002, jitter=0.001, loss=1.0, duplicate=2.0)
    assert scenario.nodes == (
        NodeSpec("n0", 0),
        NodeSpec("n1", None),
        NodeSpec("n2", 0, {"redundancy": 3}),
    )
    assert scenario.links == (("n0", "n1"), ("n1", "n2"))
    assert scenario.events == (
        Subscribe(1.0, "n0", "s0", "a/#", 1),
        Unsubscribe(2.0, "n0", "s0", "a/#"),
        Disconnect(2.0, "n0", "s0"),
        Publish(3.0, "n1", "a/b", count=10, interval=0.1, qos=2, retain=True, payload_size=64),
        Cut(4.0, "n0", "n1"),
        Cut(4.0, "n1", "n0", oneway=True),
        Heal(5.0, "n0", "n1"),
        Kill(6.0, "n1"),
        Restart(7.0, "n1"),
        Restart(7.5, "n2", broker=True),
        Loss(8.0, 10.0, ("n0", "n1")),
        Loss(8.0, 0.0, None),
    )
    assert scenario.settings_for("n2") == Settings(hello_interval=0.5, redundancy=3)


def test_events_are_sorted_by_time_and_ties_keep_file_order(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, FULL))
    times = [event.at for event in scenario.events]
    assert times == sorted(times)
    # The two losses at t=8 were first in the file, link before all.
    assert [type(event) for event in scenario.events[-2:]] == [Loss, Loss]
    assert scenario.events[-2] == Loss(8.0, 10.0, ("n0", "n1"))


def test_defaults_and_name_from_file_stem(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, MINIMAL, "my-run.yaml"))
    assert scenario.name == "my-run"
    assert scenario.settle == 5.0
    assert scenario.settings == Settings()
    assert scenario.link_model == LinkDefaults()
    assert scenario.nodes == (NodeSpec("a"), NodeSpec("b"))
    assert scenario.events == ()


def test_parse_scenario_takes_a_decoded_mapping() -> None:
    scenario = parse_scenario({"duration": 5, "nodes": {"x": {"id": 7}}}, "generated")
    assert scenario.source == "generated"
    assert scenario.name == "generated"
    assert scenario.nodes == (NodeSpec("x", 7),)
    assert scenario.links == ()


def test_duplicate_virtual_ids_are_allowed() -> None:
    scenario = parse_scenario({"duration": 5, "nodes": {"a": {"id": 1}, "b": {"id": 1}}}, "ids.yaml")
    assert [node.vid for node in scenario.nodes] == [1, 1]


def test_publication_ending_exactly_at_duration_is_accepted() -> None:
    data = {"duration": 10, "nodes": ["a"],
            "events": [{"at": 9, "publish": {"node": "a", "topic": "t", "count": 11, "interval": 0.1}}]}
    assert parse_scenario(data, "edge.yaml").events[0] == Publish(9.0, "a", "t", count=11, interval=0.1)


BASE = """\
duration: 10
nodes: [n0, n1, n2]
links: [[n0, n1], [n1, n2]]
"""


def with_event(event: str) -> str:
    return BASE + "events:\n  - {at: 1, subscribe: {node: n0, client: c0, filter: x}}\n  - " + event + "\n"


ERROR_CASES: list[tuple[str, str, list[str]]] = [
    # (case id, file text, fragments the message must contain after "FILE: ")
    ("unknown top-level key", "duration: 1\nnodes: [a]\nnode_list: []\n",
     ["the top level: unknown key 'node_list'", "allowed keys are: name, description"]),
    ("misspelt key suggests", "duraton: 1\nnodes: [a]\n", ["unknown key 'duraton' (did you mean 'duration'?)"]),
    ("missing duration", "nodes: [a]\n", ["duration: missing", "seconds"]),
    ("zero duration", "duration: 0\nnodes: [a]\n", ["duration: must be greater than 0 seconds, got 0"]),
    ("duration not a number", "duration: long\nnodes: [a]\n", ["duration: expected a number (seconds), got 'long'"]),
    ("negative settle", "duration: 5\nsettle: -1\nnodes: [a]\n", ["settle: must be at least 0"]),
    ("missing nodes", "duration: 5\n", ["nodes: missing or empty"]),
    ("empty nodes", "duration: 5\nnodes: {}\n", ["nodes: missing or empty"]),
    ("bad node name", "duration: 5\nnodes: ['a b']\n", ["nodes[0]: bad node name 'a b'", "letters, digits"]),
    ("numeric node name", "duration: 5\nnodes: {1: null}\n", ["nodes.1: bad node name 1", "quote"]),
    ("node listed twice", "duration: 5\nnodes: [a, a]\n", ["nodes[1]: node 'a' is listed twice"]),
    ("negative id", "duration: 5\nnodes: {a: {id: -1}}\n", ["nodes.a.id: must be at least 0, got -1"]),
    ("fractional id", "duration: 5\nnodes: {a: {id: 1.5}}\n", ["nodes.a.id: expected a whole number >= 0, got 1.5"]),
    ("unknown node key", "duration: 5\nnodes: {a: {vid: 1}}\n",
     ["nodes.a: unknown key 'vid'", "allowed keys are: id, settings"]),
    ("bad settings", "duration: 5\nsettings: {hello_interval: 0}\nnodes: [a]\n",
     ["settings.hello_interval: must be greater than 0"]),
    ("unknown setting", "duration: 5\nsettings: {helo: 1}\nnodes: [a]\n",
     ["settings: unknown setting 'helo'", "known settings are:"]),
    ("bad node settings", "duration: 5\nnodes: {a: {settings: {redundancy: 0}}}\n",
     ["nodes.a.settings.redundancy: must be greater than 0"]),
    ("link_model loss range", "duration: 5\nlink_model: {loss: 150}\nnodes: [a]\n",
     ["link_model.loss: must be at most 100 percent, got 150"]),
    ("link_model unknown key", "duration: 5\nlink_model: {delay: 1}\nnodes: [a]\n",
     ["link_model: unknown key 'delay'", "latency, jitter, loss, duplicate"]),
    ("link to unknown node", "duration: 5\nnodes: [a, b]\nlinks: [[a, c]]\n",
     ["links[0]: unknown node 'c'; nodes are: a, b"]),
    ("self link", "duration: 5\nnodes: [a, b]\nlinks: [[a, a]]\n", ["links[0]: [a, a] links a node to itself"]),
    ("duplicate link", "duration: 5\nnodes: [a, b]\nlinks: [[a, b], [b, a]]\n", ["links[1]: [b, a] repeats links[0]"]),
    ("link not a pair", "duration: 5\nnodes: [a, b]\nlinks: [[a, b, a]]\n",
     ["links[0]: expected a pair of node names"]),
    ("event without action", with_event("{at: 1}"),
     ["events[1]: expected exactly one action, found none", "actions are:"]),
    ("event with two actions", with_event("{at: 1, kill: n0, restart: n0}"),
     ["events[1]: expected exactly one action, found kill, restart"]),
    ("event missing at", with_event("{kill: n0}"), ["events[1] (kill): missing 'at'"]),
    ("event after duration", with_event("{at: 11, kill: n0}"),
     ["events[1] (kill).at: must be at most 10 seconds, got 11"]),
    ("event before start", with_event("{at: -1, kill: n0}"), ["events[1] (kill).at: must be at least 0 seconds"]),
    ("event unknown key", with_event("{at: 1, kill: n0, oneway: true}"),
     ["events[1] (kill): unknown key 'oneway'", "allowed keys are: at, kill"]),
    ("unknown node in publish", with_event("{at: 3, publish: {node: n9, topic: a/b}}"),
     ["events[1] (publish): unknown node 'n9'; nodes are: n0, n1, n2"]),
    ("unknown publish key", with_event("{at: 3, publish: {node: n0, topic: a, size: 3}}"),
     ["events[1] (publish): unknown key 'size'", "count, interval, qos, retain, payload_size"]),
    ("missing publish topic", with_event("{at: 3, publish: {node: n0}}"),
     ["events[1] (publish): missing 'topic'; required keys are: node, topic"]),
    ("qos out of range", with_event("{at: 3, subscribe: {node: n0, client: c, filter: a, qos: 3}}"),
     ["events[1] (subscribe): qos must be 0, 1 or 2, got 3"]),
    ("bad filter", with_event("{at: 3, subscribe: {node: n0, client: c, filter: 'a/#/b'}}"),
     ["events[1] (subscribe): topic filter 'a/#/b': '#' must be the last level"]),
    ("wildcard topic", with_event("{at: 3, publish: {node: n0, topic: 'a/+'}}"),
     ["events[1] (publish): topic name 'a/+' contains a wildcard"]),
    ("null filter", with_event("{at: 3, unsubscribe: {node: n0, client: c, filter: }}"),
     ["events[1] (unsubscribe): filter must be a string, got None"]),
    ("count zero", with_event("{at: 3, publish: {node: n0, topic: a, count: 0}}"),
     ["events[1] (publish).count: must be at least 1, got 0"]),
    ("negative interval", with_event("{at: 3, publish: {node: n0, topic: a, interval: -0.1}}"),
     ["events[1] (publish).interval: must be at least 0 seconds"]),
    ("negative payload", with_event("{at: 3, publish: {node: n0, topic: a, payload_size: -1}}"),
     ["events[1] (publish).payload_size: must be at least 0"]),
    ("retain not bool", with_event("{at: 3, publish: {node: n0, topic: a, retain: 1}}"),
     ["events[1] (publish): retain must be true or false"]),
    ("publication runs past duration", with_event("{at: 9, publish: {node: n0, topic: a, count: 20, interval: 0.1}}"),
     ["events[1] (publish): the last of 20 messages would be sent at 10.9s", "duration"]),
    ("cut between non-neighbours", with_event("{at: 3, cut: [n0, n2]}"),
     ["events[1] (cut): n0 and n2 are not neighbours; links are: n0-n1, n1-n2"]),
    ("heal between non-neighbours", with_event("{at: 3, heal: [n2, n0]}"),
     ["events[1] (heal): n2 and n0 are not neighbours"]),
    ("loss between non-neighbours", with_event("{at: 3, loss: {link: [n0, n2], percent: 5}}"),
     ["events[1] (loss): n0 and n2 are not neighbours"]),
    ("oneway not bool", with_event("{at: 3, cut: [n0, n1], oneway: yes please}"),
     ["events[1] (cut): oneway must be true or false"]),
    ("percent out of range", with_event("{at: 3, loss: {all: true, percent: 101}}"),
     ["events[1] (loss).percent: must be at most 100 percent, got 101"]),
    ("loss needs link or all", with_event("{at: 3, loss: {percent: 5}}"),
     ["events[1] (loss): give exactly one of `link: [a, b]` or `all: true`"]),
    ("loss with both link and all", with_event("{at: 3, loss: {all: true, link: [n0, n1], percent: 5}}"),
     ["events[1] (loss): give exactly one of"]),
    ("kill unknown node", with_event("{at: 3, kill: n7}"), ["events[1] (kill): unknown node 'n7'"]),
    ("restart broker not bool", with_event("{at: 3, restart: {node: n0, broker: maybe}}"),
     ["events[1] (restart): broker must be true or false"]),
    ("empty client", with_event("{at: 3, disconnect: {node: n0, client: ''}}"),
     ["events[1] (disconnect): expected a client id (a non-empty string)"]),
    ("events not a list", "duration: 5\nnodes: [a]\nevents: {at: 1}\n", ["events: expected a list of events"]),
]


@pytest.mark.parametrize(("text", "fragments"), [case[1:] for case in ERROR_CASES],
                         ids=[case[0] for case in ERROR_CASES])
def test_errors_name_file_entry_and_problem(tmp_path: Path, text: str, fragments: list[str]) -> None:
    path = write(tmp_path, text, "bad.yaml")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "duration: 10\nnodes: [n0, n1\nlinks: []\n", "broken.yaml")
    with pytest.raises(ScenarioError, match=r"broken\.yaml:3:\d+: YAML syntax error: "):
        load_scenario(path)


def test_missing_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"absent\.yaml: cannot read the scenario file"):
        load_scenario(tmp_path / "absent.yaml")


def test_empty_file_and_non_mapping_top_level(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="the file is empty"):
        load_scenario(write(tmp_path, "# nothing\n", "empty.yaml"))
    with pytest.raises(ScenarioError, match="the top level is a list"):
        load_scenario(write(tmp_path, "- a\n- b\n", "list.yaml"))


def test_boolean_is_not_a_number() -> None:
    with pytest.raises(ScenarioError, match=r"src: duration: expected a number \(seconds\), got True"):
        parse_scenario({"duration": True, "nodes": ["a"]}, "src")
