"""LXD provisioning without LXD: topology file -> plan, resource checks, rendered files, image recipe.

Everything here is pure (federation.lxd.plan, the recipe half of
federation.lxd.image, cluster.convergence_problems and project_bundle); the
containers themselves are tested in test_lxd_containers.py (marker `lxd`).
"""

from __future__ import annotations

import io
import ipaddress
import tarfile
from pathlib import Path

import pytest
import yaml

from federation.daemon.config import load_config
from federation.harness.nodeconfig import MOSQUITTO_CONF_TEMPLATE, REPO_ROOT, WRAPPER_LOG_TYPES
from federation.lxd.cluster import convergence_problems, project_bundle
from federation.lxd.image import ImageRecipe, default_recipe, project_extra, project_requirements
from federation.lxd.plan import (
    BRIDGE,
    EVENT_LOG,
    INOTIFY_PER_CONTAINER,
    MAX_CONTAINERS,
    MEMORY_PER_CONTAINER,
    MEMORY_RESERVE,
    STATE_DIR,
    WRAPPER_CONFIG,
    WRAPPER_LOG,
    WRAPPER_SCRIPT,
    Machine,
    PlanError,
    capacity_problems,
    choose_subnet,
    estimate_needs,
    expected_members,
    make_plan,
    render_bridge_faults,
    render_bridge_inbound,
    render_broker_conf,
    render_broker_dropin,
    render_container_firewall,
    render_host_firewall,
    render_preseed,
    render_wrapper_unit,
    render_wrapper_yaml,
)
from federation.scenario.loader import ScenarioError, load_scenario, parse_scenario

GiB = 2**30
BIG_MACHINE = Machine(memory_available=24 * GiB, disk_free=80 * GiB, disk_path="/var/lib/lxd",
                      inotify_instances=128)


def scenario(**overrides: object) -> dict[str, object]:
    data: dict[str, object] = {"name": "demo", "duration": 10, "nodes": {"n0": {"id": 5}, "n1": None, "n2": None},
                               "links": [["n0", "n1"], ["n1", "n2"]]}
    data.update(overrides)
    return data


def plan_of(data: dict[str, object], prefix: str = "mqf"):  # type: ignore[no-untyped-def]
    return make_plan(parse_scenario(data, "demo.yaml"), image_alias="mqtt-federation-test", prefix=prefix)


# ---------------------------------------------------------------- topology file -> plan


def test_every_topology_file_of_the_project_makes_a_plan() -> None:
    files = sorted((REPO_ROOT / "configs" / "topologies").glob("*.yaml"))
    assert files
    for path in files:
        plan = make_plan(load_scenario(path), image_alias="x")
        assert len(plan.containers()) == len(set(plan.containers())) == len(plan.nodes), path
        assert all(name.startswith(plan.container_prefix) for name in plan.containers()), path


def test_plan_maps_nodes_to_containers_with_ids_and_neighbours() -> None:
    plan = plan_of(scenario())
    assert plan.containers() == ["mqf-demo-n0", "mqf-demo-n1", "mqf-demo-n2"]
    assert [node.vid for node in plan.nodes] == [5, 2, 3]  # explicit id, else index + 1
    assert plan.node("n1").neighbours == ("n0", "n2")
    assert plan.node("n0").neighbours == ("n1",)
    assert plan.container_prefix == "mqf-demo-"
    text = "\n".join(plan.describe())
    assert "3 containers, 2 links, image mqtt-federation-test" in text
    assert "mqf-demo-n1  node n1, id 2, neighbours n0, n2" in text


def test_node_settings_override_scenario_settings_in_the_plan() -> None:
    plan = plan_of(scenario(settings={"hello_interval": 0.5},
                            nodes={"n0": {"settings": {"redundancy": 1}}, "n1": None}, links=[["n0", "n1"]]))
    assert plan.node("n0").settings.redundancy == 1
    assert plan.node("n0").settings.hello_interval == 0.5
    assert plan.node("n1").settings.redundancy == 2


def test_node_names_become_host_names_and_collisions_are_refused() -> None:
    plan = plan_of(scenario(name="My_Test.1", nodes=["Kitchen_1", "b.2"], links=[["Kitchen_1", "b.2"]]))
    assert plan.containers() == ["mqf-my-test-1-kitchen-1", "mqf-my-test-1-b-2"]
    with pytest.raises(PlanError, match=r"nodes 'a_b' and 'a\.b' would both become container 'mqf-demo-a-b'"):
        plan_of(scenario(nodes=["a_b", "a.b"], links=[]))


def test_too_long_names_and_bad_prefixes_are_refused() -> None:
    with pytest.raises(PlanError, match="LXD allows 63"):
        plan_of(scenario(name="x" * 60))
    for prefix in ("", "Upper", "9lives", "a_b"):
        with pytest.raises(PlanError, match="prefix"):
            plan_of(scenario(), prefix=prefix)


def test_unknown_nodes_and_cuts_between_unlinked_nodes_fail_in_the_loader() -> None:
    with pytest.raises(ScenarioError, match="unknown node 'n9'"):
        parse_scenario(scenario(events=[{"at": 1, "publish": {"node": "n9", "topic": "a"}}]), "demo.yaml")
    with pytest.raises(ScenarioError, match="n0 and n2 are not neighbours; links are: n0-n1, n1-n2"):
        parse_scenario(scenario(events=[{"at": 1, "cut": ["n0", "n2"]}]), "demo.yaml")


def test_expected_members_are_connected_components() -> None:
    plan = plan_of(scenario(nodes=["a", "b", "c", "d"], links=[["a", "b"], ["c", "d"]]))
    assert expected_members(plan) == {"a": ["a", "b"], "b": ["a", "b"], "c": ["c", "d"], "d": ["c", "d"]}


# ---------------------------------------------------------------- resources


def test_a_small_topology_fits_a_big_machine() -> None:
    plan = plan_of(scenario())
    assert capacity_problems(estimate_needs(plan, image_cached=False), BIG_MACHINE) == []


def test_memory_disk_count_and_inotify_shortfalls_are_each_reported() -> None:
    plan = plan_of(scenario(nodes=[f"n{i}" for i in range(MAX_CONTAINERS + 1)], links=[]))
    small = Machine(memory_available=2 * GiB, disk_free=3 * GiB, disk_path="/var/lib/lxd", inotify_instances=128)
    problems = capacity_problems(estimate_needs(plan, image_cached=True), small)
    text = "\n".join(problems)
    assert len(problems) == 4, text
    assert f"{MAX_CONTAINERS + 1} containers requested, at most {MAX_CONTAINERS}" in text
    fits = (2 * GiB - MEMORY_RESERVE) // MEMORY_PER_CONTAINER
    assert "not enough memory" in text and f"at most {fits} containers fit" in text
    assert "not enough disk at /var/lib/lxd" in text
    assert "sysctl -w fs.inotify.max_user_instances=" in text


def test_inotify_limit_counts_containers_already_running() -> None:
    plan = plan_of(scenario())
    limit = 128
    running = limit // INOTIFY_PER_CONTAINER - 3  # three more fit exactly
    assert capacity_problems(estimate_needs(plan, image_cached=True, running_containers=running), BIG_MACHINE) == []
    problems = capacity_problems(estimate_needs(plan, image_cached=True, running_containers=running + 1),
                                 BIG_MACHINE)
    assert len(problems) == 1 and "inotify" in problems[0]


def test_an_image_to_build_needs_more_disk_than_a_cached_one() -> None:
    plan = plan_of(scenario())
    assert estimate_needs(plan, image_cached=False).disk > estimate_needs(plan, image_cached=True).disk


# ---------------------------------------------------------------- rendered files


def test_wrapper_yaml_is_a_valid_wrapper_config_bound_to_the_container(tmp_path: Path) -> None:
    plan = plan_of(scenario(settings={"hello_interval": 0.25}))
    node = plan.node("n1")
    text = render_wrapper_yaml(node, "10.97.0.12", ["10.97.0.13", "10.97.0.11"])
    path = tmp_path / "wrapper.yaml"
    path.write_text(text)
    document = yaml.safe_load(text)
    assert document["bind"] == "10.97.0.12:10500"
    assert document["neighbors"] == ["10.97.0.11:10500", "10.97.0.13:10500"]
    assert document["id"] == 2 and document["name"] == "n1"
    assert document["event_log"] == EVENT_LOG and document["state_dir"] == STATE_DIR
    # The daemon's own loader accepts it (bind/neighbour resolution is not exercised: addresses are numeric).
    config = load_config({"config": str(path)})
    assert config.settings.hello_interval == 0.25
    assert config.vid == 2 and config.name == "n1"
    assert str(config.bind) == "10.97.0.12:10500"
    assert sorted(str(neighbour) for neighbour in config.neighbours) == ["10.97.0.11:10500", "10.97.0.13:10500"]


def test_broker_conf_listens_everywhere_and_keeps_the_log_topic() -> None:
    text = render_broker_conf(MOSQUITTO_CONF_TEMPLATE.read_text())
    active = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert "listener 1883 0.0.0.0" in active
    assert "log_dest topic" in active and all(log_type in active for log_type in WRAPPER_LOG_TYPES)
    assert "log_dest file /var/lib/mosquitto/broker.log" in active
    assert "user root" not in active  # Debian's service drops to the mosquitto user, which owns the directory


def test_wrapper_unit_runs_the_pushed_wrapper_with_its_config() -> None:
    unit = render_wrapper_unit()
    assert f"ExecStart=/usr/bin/python3 {WRAPPER_SCRIPT} --config {WRAPPER_CONFIG}" in unit
    assert f"StandardError=append:{WRAPPER_LOG}" in unit
    assert "WantedBy=multi-user.target" in unit


def test_container_firewall_replaces_its_table_with_cuts_and_losses() -> None:
    text = render_container_firewall({"10.97.0.20": 100.0, "10.97.0.3": 30.0, "10.97.0.4": 0.0})
    lines = [line.strip() for line in text.splitlines()]
    assert lines[:3] == ["table inet mqtt_federation", "delete table inet mqtt_federation",
                         "table inet mqtt_federation {"]
    rules = [line for line in lines if line.startswith("ip saddr")]
    assert rules == ["ip saddr 10.97.0.3 numgen random mod 10000 < 3000 drop", "ip saddr 10.97.0.20 drop"]
    healed = render_container_firewall({})
    assert "ip saddr" not in healed and "policy accept" in healed
    with pytest.raises(ValueError, match="0..100"):
        render_container_firewall({"10.97.0.3": 101.0})


def test_bridge_fault_table_sends_each_receiver_to_its_chain() -> None:
    text = render_bridge_faults("mqf_run_ab12", {"in_1": "10.97.0.5", "in_0": "10.97.0.4"})
    lines = [line.strip() for line in text.splitlines()]
    assert lines[:3] == ["table bridge mqf_run_ab12", "delete table bridge mqf_run_ab12",
                         "table bridge mqf_run_ab12 {"]
    assert "chain in_0 {" in lines and "chain in_1 {" in lines
    assert lines.index("ip daddr 10.97.0.4 jump in_0") < lines.index("ip daddr 10.97.0.5 jump in_1")
    assert "type filter hook forward priority -10; policy accept;" in lines


def test_bridge_inbound_rules_replace_one_receivers_chain() -> None:
    text = render_bridge_inbound("mqf_run_ab12", "in_0", {"10.97.0.6": 12.5, "10.97.0.5": 100.0, "10.97.0.7": 0})
    assert text.splitlines() == [
        "flush chain bridge mqf_run_ab12 in_0",
        "add rule bridge mqf_run_ab12 in_0 ip saddr 10.97.0.5 drop",
        "add rule bridge mqf_run_ab12 in_0 ip saddr 10.97.0.6 numgen random mod 10000 < 1250 drop",
    ]
    assert render_bridge_inbound("t", "in_3", {}) == "flush chain bridge t in_3\n"


def test_broker_dropin_keeps_a_killed_broker_down() -> None:
    assert render_broker_dropin() == "[Service]\nRestart=no\n"


def test_host_firewall_drops_forwarding_off_the_bridge() -> None:
    text = render_host_firewall()
    assert f'iifname "{BRIDGE}" oifname != "{BRIDGE}" drop' in text
    assert f'oifname "{BRIDGE}" iifname != "{BRIDGE}" drop' in text
    assert "hook forward" in text


def test_preseed_has_dir_storage_and_a_bridge_without_nat() -> None:
    document = yaml.safe_load(render_preseed(ipaddress.IPv4Network("10.97.7.0/24")))
    assert document["storage_pools"] == [{"driver": "dir", "name": "default"}]
    network = document["networks"][0]
    assert network["name"] == BRIDGE
    assert network["config"] == {"ipv4.address": "10.97.7.1/24", "ipv4.nat": "false", "ipv6.address": "none"}
    assert document["profiles"][0]["devices"]["eth0"]["network"] == BRIDGE


def test_subnet_choice_avoids_host_networks() -> None:
    assert choose_subnet([ipaddress.IPv4Network("192.0.2.0/24")]) == ipaddress.IPv4Network("10.97.0.0/24")
    used = [ipaddress.IPv4Network("10.97.0.0/23"), ipaddress.IPv4Network("10.97.7.5/32")]
    assert choose_subnet(used) == ipaddress.IPv4Network("10.97.14.0/24")
    with pytest.raises(PlanError, match="no free /24"):
        choose_subnet([ipaddress.IPv4Network("10.0.0.0/8")])


# ---------------------------------------------------------------- image recipe, bundle, convergence


def test_image_alias_is_stable_and_follows_the_dependencies() -> None:
    recipe = default_recipe(REPO_ROOT)
    assert recipe.alias == default_recipe(REPO_ROOT).alias
    assert recipe.alias.startswith("mqtt-federation-") and len(recipe.alias) == len("mqtt-federation-") + 12
    assert recipe.requirements == project_requirements(REPO_ROOT / "setup.cfg")
    assert any(requirement.startswith("paho-mqtt") for requirement in recipe.requirements)
    changed = ImageRecipe(requirements=(*recipe.requirements, "extra>=1"), architecture=recipe.architecture)
    assert changed.alias != recipe.alias
    assert "mosquitto" in recipe.packages and "nftables" in recipe.packages
    metadata = yaml.safe_load(recipe.metadata_yaml(1700000000))
    assert metadata["architecture"] == recipe.architecture and metadata["creation_date"] == 1700000000


def test_pip_platforms_match_the_image_cpu() -> None:
    assert "manylinux2014_x86_64" in ImageRecipe(requirements=(), architecture="x86_64").pip_platforms()
    assert all(tag.endswith("aarch64") for tag in ImageRecipe(requirements=(), architecture="aarch64").pip_platforms())


def test_lxc_extra_names_pylxd() -> None:
    assert project_extra(REPO_ROOT / "setup.cfg", "lxc") == ("pylxd",)
    assert project_extra(REPO_ROOT / "setup.cfg", "no-such-extra") == ()


def test_project_bundle_holds_the_wrapper_and_the_package_without_caches() -> None:
    with tarfile.open(fileobj=io.BytesIO(project_bundle()), mode="r:gz") as bundle:
        names = bundle.getnames()
    assert "wrapper.py" in names
    assert "federation/daemon/cli.py" in names and "federation/protocol/node.py" in names
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in names)


def test_convergence_problems_name_missing_members_and_core_disagreement() -> None:
    expected = {"a": ["1:10500", "2:10500"], "b": ["1:10500", "2:10500"]}

    def document(members: list[str], core: str) -> dict[str, object]:
        return {"federation": [{"address": member} for member in members], "management_core": core}

    good = {"a": document(["1:10500", "2:10500"], "1@x"), "b": document(["2:10500", "1:10500"], "1@x")}
    assert convergence_problems(good, expected) == []
    bad = {"a": document(["1:10500"], "1@x"), "b": document(["1:10500", "2:10500"], "2@y")}
    problems = convergence_problems(bad, expected)
    assert any(problem.startswith("a: members ['1:10500']") for problem in problems)
    assert any("management cores differ" in problem for problem in problems)
    assert convergence_problems({"a": None, "b": good["b"]}, expected) == ["a: no status answer"]


def test_ours_takes_only_marked_containers_of_the_topology() -> None:
    from types import SimpleNamespace

    from federation.lxd.cluster import ours
    from federation.lxd.plan import KEY_TOPOLOGY

    def instance(name: str, topology: str | None) -> SimpleNamespace:
        return SimpleNamespace(name=name, config={KEY_TOPOLOGY: topology} if topology else {})

    everything = [instance("mqf-a-n1", "a"), instance("mqf-a-n0", "a"), instance("mqf-a-b-n0", "a-b"),
                  instance("mqf-a-foreign", None), instance("other-a-n0", "a")]
    client = SimpleNamespace(instances=SimpleNamespace(all=lambda: everything))
    assert [item.name for item in ours(client, "mqf-a-", "a")] == ["mqf-a-n0", "mqf-a-n1"]
    assert [item.name for item in ours(client, "mqf-a-")] == ["mqf-a-b-n0", "mqf-a-n0", "mqf-a-n1"]
    assert [item.name for item in ours(client, "mqf-")] == ["mqf-a-b-n0", "mqf-a-n0", "mqf-a-n1"]
