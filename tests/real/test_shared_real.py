"""Shared subscriptions for real (docs/protocol.md rule 9): Mosquitto brokers, wrapper daemons, plain
`mosquitto_sub -t '$share/g/...'` members and `mosquitto_pub`, counted at the subscribers against one broker.

On one broker the members of a group together get each publication once; in a federated line n0-n1-n2 they
must too, whichever brokers they are on: spread over the member brokers when the publisher's broker has no
member, all on the publisher's broker when it has one, and on the remaining member once one leaves.
"""

from __future__ import annotations

import subprocess
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from federation.tools.launch import BROKER_PORT, LocalFederation

from broker_util import HOST, mosquitto_pub, mosquitto_sub, requires_mosquitto, start_broker, wait_for
from federation_util import (
    SUBSCRIBER_FORMAT,
    Clients,
    Subscriber,
    clients_fixture,  # noqa: F401 - the `clients` fixture
    make_federation_fixture,  # noqa: F401 - the `make_federation` fixture
)

pytestmark = requires_mosquitto

MakeFederation = Callable[..., LocalFederation]
COUNT = 20


def publish_lines(host: str, port: int, topic: str, payloads: list[str]) -> None:
    """One `mosquitto_pub -l` connection publishing each line as a QoS 1 message, in order."""
    result = subprocess.run(mosquitto_pub(port, "-t", topic, "-q", "1", "-l", host=host),
                            input="".join(f"{payload}\n" for payload in payloads).encode(), capture_output=True,
                            timeout=30, check=False)
    assert result.returncode == 0, f"mosquitto_pub -l failed: {result.stderr!r}"


def deliveries(members: list[Subscriber], label: str) -> Counter[bytes]:
    return Counter(payload for member in members for topic, payload in member.received() if topic == f"{label}/t")


def wait_total(members: list[Subscriber], label: str, count: int) -> None:
    wait_for(lambda: sum(deliveries(members, label).values()) >= count, 15,
             message=lambda: f"{count} deliveries to the group; got {dict(deliveries(members, label))}")


def settle(members: list[Subscriber], label: str) -> Counter[bytes]:
    """The deliveries once none has arrived for a second (so that extra copies show)."""
    last: list[int] = [-1]

    def quiet() -> bool:
        total = sum(deliveries(members, label).values())
        done = total == last[0]
        last[0] = total
        return done

    wait_for(quiet, 10, interval=1.0, message=lambda: "the deliveries to stop")
    return deliveries(members, label)


def wait_members(federation: LocalFederation, shared: str, expected: dict[str, list[str]]) -> None:
    """Until every wrapper's status lists `expected` (node -> the nodes' addresses it knows as other members)."""
    def members(name: str) -> list[str]:
        return federation.status(name).get("shared_groups", {}).get("members", {}).get(shared, [])

    wanted = {name: sorted(federation.node(other).address for other in others) for name, others in expected.items()}
    wait_for(lambda: all(members(name) == wanted[name] for name in wanted), 15,
             message=lambda: f"members of {shared}: wanted {wanted}, "
                             f"have { {name: members(name) for name in wanted} }")


def test_one_broker_serves_a_group_once(tmp_path: Path, clients: Clients) -> None:
    """The reference: two members on one broker get each of COUNT publications once between them."""
    broker = start_broker(tmp_path)
    try:
        label = f"shared-one-{uuid.uuid4().hex[:6]}"
        members = []
        for number in range(2):
            output = tmp_path / f"member{number}.out"
            with open(output, "wb") as sink:
                process = clients.processes.start(
                    mosquitto_sub(broker.port, "-i", f"m{number}", "-q", "1", "-t", f"$share/g/{label}/#",
                                  "-F", SUBSCRIBER_FORMAT), stdout=sink)
            members.append(Subscriber("one", f"m{number}", f"$share/g/{label}/#", output, process))
        payloads = [f"p{number}" for number in range(COUNT)]
        publish_until_ready(lambda: publish_lines(HOST, broker.port, f"{label}/t", ["ready"]), members,
                            label)
        publish_lines(HOST, broker.port, f"{label}/t", payloads)
        wait_total(members, label, COUNT + 1)
        got = settle(members, label)
        assert got == Counter(payload.encode() for payload in ["ready", *payloads])
    finally:
        broker.stop()


def publish_until_ready(publish: Callable[[], None], members: list[Subscriber], label: str) -> None:
    """Publish "ready" until a member has it (the members' SUBSCRIBE is done)."""
    def ready() -> bool:
        publish()
        return deliveries(members, label)[b"ready"] > 0

    wait_for(ready, 10, interval=0.2, message=lambda: "a member to get 'ready'")


def test_members_on_other_brokers_get_each_publication_once_spread_and_the_last_takes_over(
        make_federation: MakeFederation, clients: Clients) -> None:
    federation = make_federation(3, "line")
    label = f"shared-{uuid.uuid4().hex[:6]}"
    shared = f"$share/g/{label}/#"
    m1 = clients.subscribe(federation, "n1", shared, qos=1)
    m2 = clients.subscribe(federation, "n2", shared, qos=1)
    wait_members(federation, shared, {"n0": ["n1", "n2"], "n1": ["n2"], "n2": ["n1"]})
    payloads = [f"p{number}" for number in range(COUNT)]
    publish_lines(federation.node("n0").host, BROKER_PORT, f"{label}/t", payloads)
    wait_total([m1, m2], label, COUNT)
    got = settle([m1, m2], label)
    assert got == Counter(payload.encode() for payload in payloads)  # once each, as on one broker
    spread = {member.node: len(member.received()) for member in (m1, m2)}
    assert all(count > 0 for count in spread.values()), spread
    assert federation.status("n0")["counters"].get("shared_copies_forwarded", 0) >= COUNT
    for name in federation.nodes:
        assert federation.status(name)["counters"].get("shared_group_served_twice", 0) == 0

    # n1's member leaves: n2's takes every later publication.
    m1.process.terminate()
    m1.process.wait(5)
    wait_members(federation, shared, {"n0": ["n2"], "n1": ["n2"]})
    later = [f"q{number}" for number in range(COUNT)]
    publish_lines(federation.node("n0").host, BROKER_PORT, f"{label}/t", later)
    wait_total([m2], label, spread["n2"] + COUNT)
    got = settle([m1, m2], label)
    assert got == Counter(payload.encode() for payload in [*payloads, *later])
    assert sorted(payload for topic, payload in m2.received() if payload.startswith(b"q")) == \
        sorted(payload.encode() for payload in later)


def test_a_member_on_the_publishing_broker_is_served_there_alone(make_federation: MakeFederation,
                                                                 clients: Clients) -> None:
    federation = make_federation(3, "line")
    label = f"shared-origin-{uuid.uuid4().hex[:6]}"
    shared = f"$share/g/{label}/#"
    m0 = clients.subscribe(federation, "n0", shared, qos=1)
    m2 = clients.subscribe(federation, "n2", shared, qos=1)
    wait_members(federation, shared, {"n1": ["n0", "n2"]})
    payloads = [f"p{number}" for number in range(COUNT)]
    publish_lines(federation.node("n0").host, BROKER_PORT, f"{label}/t", payloads)
    wait_total([m0, m2], label, COUNT)
    got = settle([m0, m2], label)
    assert got == Counter(payload.encode() for payload in payloads)
    assert len(m0.received()) == COUNT and m2.received() == []
