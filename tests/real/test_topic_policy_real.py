"""Topic policies on real brokers and wrappers (issue 38): the line A-B-C where A has
`--topic 'sensors/# out 1 "" site-a/' --topic 'cmd/# in 1'`, counted at plain mosquitto_sub clients; and the
parser against Mosquitto itself, line by line (the same lines accepted and refused, with the same message).

The bridge chain given the same lines is the transparency suite's (tests/real/test_transparency_real.py, the
policy cases); here each sentence of the issue's first "Done when" line is asserted on its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from federation.daemon.topic_policy import TopicLineError, parse_line
from federation.tools.launch import LocalFederation, find_mosquitto

from broker_util import free_port, requires_mosquitto, wait_for
from federation_util import (  # noqa: F401 - the fixtures
    Clients,
    Streamer,
    Subscriber,
    clients_fixture,
    flush_event_logs,
    make_federation_fixture,
    publication_events,
    wait_known,
)

pytestmark = requires_mosquitto

SITE_A = ['sensors/# out 1 "" site-a/', "cmd/# in 1"]
CUSTODY_STREAM = 400
"""QoS 2 publications of the stream across a kill -9 (about 4 s at its pace)"""


def filtered(federation: LocalFederation, name: str, direction: str) -> dict[str, int]:
    return dict(federation.status(name)["daemon"]["topic_policy"]["filtered"][direction])


def topics_of(subscriber: Subscriber) -> list[str]:
    """What the subscriber received, the probes left out."""
    return [message.topic for message in subscriber.messages() if not message.topic.endswith("/probe")]


def reach(clients: Clients, federation: LocalFederation, node: str, topic: str, subscriber: Subscriber,
          arrives_as: str, timeout: float = 15.0) -> None:
    """Publish on `topic` at `node` every 0.2 s until `subscriber` has one (as `arrives_as`): the path through
    the federation is up, seen as a client sees it."""
    deadline = time.monotonic() + timeout
    while True:
        clients.publish(federation, node, topic, b"probe", qos=0)
        try:
            wait_for(lambda: arrives_as in [m.topic for m in subscriber.messages()], timeout=0.2)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise


def test_telemetry_up_commands_down_on_a_line(make_federation, clients: Clients) -> None:
    federation = make_federation(3, "line", topics={"n0": SITE_A})
    a, b, c = "n0", "n1", "n2"
    prefixed_c = clients.subscribe(federation, c, "site-a/sensors/#", qos=2)
    plain_c = clients.subscribe(federation, c, "sensors/#", qos=2)
    everything_c = clients.subscribe(federation, c, "#", qos=2)
    everything_b = clients.subscribe(federation, b, "#", qos=2)
    commands_a = clients.subscribe(federation, a, "cmd/#", qos=2)
    everything_a = clients.subscribe(federation, a, "#", qos=2, wait=False)
    wait_known(federation, a, everything_a.client_id, "cmd/#")  # `#` asks the federation only for what A imports
    sensors_a = clients.subscribe(federation, a, "sensors/#", qos=2, wait=False)
    reach(clients, federation, a, "sensors/probe", prefixed_c, "site-a/sensors/probe")
    reach(clients, federation, c, "cmd/probe", commands_a, "cmd/probe")
    reach(clients, federation, b, "other/probe", everything_c, "other/probe")

    # A wrapper never joins the mesh of a filter it cannot import: A's `sensors/#` asks the federation for nothing.
    wait_for(lambda: "sensors/#" in federation.status(a)["daemon"]["topic_policy"]["subscriptions"]["not_imported"],
             timeout=10, message="A's wrapper to see its sensors/# subscriber")
    status_a = federation.status(a)
    assert status_a["local_subscriptions"].get(sensors_a.client_id, {}) == {}
    assert not [topic for topic in status_a["topics"] if topic["filter"] == "sensors/#" and topic.get("member")]

    # A's sensors/t1 reaches C's site-a/sensors/# once, at QoS 1 at most (published at 2), not C's sensors/#.
    clients.publish(federation, a, "sensors/t1", b"21.5", qos=2)
    prefixed_c.wait_for_message("site-a/sensors/t1", b"21.5")
    # A's private/x reaches no other broker; C's cmd/a1 reaches A.
    clients.publish(federation, a, "private/x", b"stays home", qos=1)
    clients.publish(federation, c, "cmd/a1", b"open", qos=1)
    commands_a.wait_for_message("cmd/a1", b"open")
    # C's other/x and B's site-a/sensors/echo reach B and C, never A's clients.
    clients.publish(federation, c, "other/x", b"not for a", qos=1)
    clients.publish(federation, b, "site-a/sensors/echo", b"not for a either", qos=1)
    everything_b.wait_for_message("other/x", b"not for a")
    everything_c.wait_for_message("site-a/sensors/echo", b"not for a either")
    # A fence from C on a topic A imports: everything C and B sent before it had its chance to arrive at A.
    clients.publish(federation, c, "cmd/fence", b"last", qos=1)
    everything_a.wait_for_message("cmd/fence", b"last")
    flush_event_logs(federation)

    received = prefixed_c.messages()
    assert [(m.topic, m.payload, m.qos) for m in received if m.topic == "site-a/sensors/t1"] == \
        [("site-a/sensors/t1", b"21.5", 1)]  # once, at QoS 1
    assert "sensors/t1" not in topics_of(plain_c) and "sensors/t1" not in topics_of(everything_c)
    for subscriber in (everything_b, everything_c):
        assert "private/x" not in topics_of(subscriber), subscriber
    assert topics_of(commands_a) == ["cmd/a1", "cmd/fence"]
    assert sorted(topics_of(everything_a)) == sorted(["sensors/t1", "private/x", "cmd/a1", "cmd/fence"])
    assert {m.topic for m in everything_a.messages()} - set(topics_of(everything_a)) == \
        {"sensors/probe", "cmd/probe"}  # its own probes and C's on cmd/; B's other/probe never
    assert topics_of(sensors_a) == ["sensors/t1"]  # A's own publication, from its own broker

    # private/x never left A's wrapper: the node never saw it (no datagram can carry it), and it is counted.
    originated_a = [event.get("topic") for event in federation.events(a, ["publication_originated"])]
    assert "site-a/sensors/t1" in originated_a
    assert "private/x" not in originated_a and "sensors/t1" not in originated_a
    assert filtered(federation, a, "export")["no_out_line"] == 1  # private/x; the probes went out
    # Nothing crossed the overlay to A only to be dropped there: A asked for none of it.
    assert filtered(federation, a, "import")["no_in_line"] == 0
    delivered_a = [event.get("topic") for event in federation.events(a, ["publication_delivered"])]
    assert "other/x" not in delivered_a and "site-a/sensors/echo" not in delivered_a


def test_custody_order_and_transit_keep_their_guarantees_under_policies(make_federation, clients: Clients) -> None:
    """A QoS 2 stream exported under site-a/ while the exporting wrapper is killed (kill -9) and restarted: its
    spool holds what the policy made of each publication and is replayed so, the broker's redeliveries are
    recognised by that, and the stream arrives exactly once, in order. It crosses n1, whose own lines let
    nothing of it in or out: a transit wrapper forwards what others exchange."""
    federation = make_federation(3, "line", topics={"n0": ['sensors/# out 2 "" site-a/'], "n1": ["local/# both 0"]})
    received = clients.subscribe(federation, "n2", "site-a/sensors/#", qos=2)
    reach(clients, federation, "n0", "sensors/probe", received, "site-a/sensors/probe")
    streamer = Streamer(federation.node("n0").host, "sensors/stream", CUSTODY_STREAM, qos=2, pace=0.01)
    try:
        wait_for(lambda: streamer.acknowledged >= CUSTODY_STREAM // 3, timeout=30, message="a third of the stream")
        federation.stop_wrapper("n0", kill=True)
        federation.start_wrapper("n0")
    finally:
        streamer.close()
    assert streamer.error is None and streamer.acknowledged == CUSTODY_STREAM, streamer.error
    wait_for(lambda: len([m for m in received.messages() if m.topic == "site-a/sensors/stream"]) >= CUSTODY_STREAM,
             timeout=60, message=lambda: f"{CUSTODY_STREAM} publications at n2, got {len(received.messages())}")
    flush_event_logs(federation)
    numbers = [int(m.payload) for m in received.messages() if m.topic == "site-a/sensors/stream"]
    assert numbers == list(range(1, CUSTODY_STREAM + 1))  # none lost, none twice, in order
    assert {m.qos for m in received.messages() if m.topic == "site-a/sensors/stream"} == {2}
    transit = federation.status("n1")["daemon"]["topic_policy"]["filtered"]
    assert transit["import"]["no_in_line"] == 0  # n1 asked for none of it, and dropped none of it
    # The line's only path is through n1 (the killed n0's last second of events is lost, so not counted).
    assert [event for event in publication_events(federation, "site-a/sensors/stream")["n1"]
            if event["type"] == "publication_forwarded"]


# ------------------------------------------------------------------ the parser against Mosquitto


SAME_AS_MOSQUITTO = [
    'sensors/# out 1 "" site-a/', "cmd/# in 1", "x", "x OUT 1", "x out 1 # a comment", "x out # a comment",
    '"" both 0 a/ b/', 'x both 0 "" ""', "sensors/# up 1", "x out 3", "x out -1", '"" both 0 a/ ""',
    "x both 0 a# b/", "a/+ both 2 lo/ re/+/", "# both 0 loc rem", "topic sensors/# out",
]
"""lines the wrapper reads as Mosquitto 2.0.11 does: accepted by both, or refused by both with its message"""
STRICTER = ["x both 0 a/", "x out 1x", "x out 256", "a/#/b out", "x out 1 a/ b/ extra", "$SYS/# out"]
"""lines Mosquitto starts with and the wrapper refuses (docs/topic-policies.md, "Where the wrapper is stricter")"""
REMOTE_NAMED = {'# both 0 "" rem': "Error: Invalid bridge topic remote prefix and pattern combination 'rem#'."}
"""lines both refuse, where Mosquitto 2.0.11 calls the remote prefix the local one"""


def mosquitto_verdict(mosquitto: str, directory: Path, line: str) -> str | None:
    """None when Mosquitto starts running with a bridge holding `topic LINE`, else its error line (a bad line
    ends it before it opens its log file; its errors go to its console)."""
    conf, log = directory / "bridge.conf", directory / "bridge.log"
    user = "user root\n" if os.geteuid() == 0 else ""  # as root Mosquitto drops to `mosquitto`, who cannot write here
    conf.write_text(f"{user}listener {free_port()} 127.0.0.1\nallow_anonymous true\nlog_dest file {log}\n"
                    f"connection parse-check\naddress 127.0.0.1:9\ntopic {line}\n", encoding="utf-8")
    process = subprocess.Popen([mosquitto, "-c", str(conf)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        wait_for(lambda: process.poll() is not None or (log.exists() and " running" in log.read_text()),
                 timeout=10, message=f"mosquitto to start or refuse `topic {line}`")
    finally:
        process.kill()
        output, _ = process.communicate()
    if process.returncode == -signal.SIGKILL:
        return None
    errors = [raw.split(": ", 1)[1].strip() for raw in output.splitlines() if ": Error: " in raw]
    return next((error for error in errors if "Error found at" not in error and "Out of memory" not in error),
                output)


@pytest.mark.parametrize("line", SAME_AS_MOSQUITTO + STRICTER + list(REMOTE_NAMED))
def test_a_line_is_read_as_mosquitto_reads_it(tmp_path: Path, line: str) -> None:
    verdict = mosquitto_verdict(find_mosquitto(), tmp_path, line)
    try:
        parse_line(line)
        ours = None
    except TopicLineError as error:
        ours = error.mosquitto
    if line in STRICTER:
        assert verdict is None and ours is not None, (verdict, ours)
    elif line in REMOTE_NAMED:
        assert ours == REMOTE_NAMED[line] and verdict == ours.replace("remote prefix", "local prefix")
    else:
        assert ours == verdict
