"""The cases of the transparency suite (issue 20, item 6), each a scenario of client actions.

Theory of operation: each case isolates one behaviour a client relies on,
with the publisher on site a and subscribers spread over b and c (and a,
where the publisher's own broker is the interesting contrast), so that a
difference names one cause. Sites are brokers a, b, c of a line (c is the
far end) on the federation and on the bridge chain, and the same broker on
the reference. Payloads are short texts that say what they are, or sizes.

Where a broker needs time that no client can observe, a case waits (`Wait`):
after an unsubscribe (so the next publication finds the broker without
interest, as it would a minute later), and while a session is offline
(expiry runs, queued messages travel).
"""

from __future__ import annotations

from suites.transparency.scenario import (
    Action,
    Connect,
    Disconnect,
    Kill,
    Payload,
    Properties,
    Publish,
    Scenario,
    Settle,
    Subscribe,
    Unsubscribe,
    Wait,
    Will,
)

LARGE_SIZES = (0, 1024, 256 * 1024 + 1, 1024 * 1024)
"""payload sizes published at QoS 0, 1 and 2 each"""
HUGE_SIZE = 16 * 1024 * 1024
"""the largest payload, published once at QoS 1"""
LEAVE_WAIT = 2.0
"""seconds after an unsubscribe before the next publication"""
OFFLINE_WAIT = 2.0
"""seconds a persistent session stays offline with publications waiting for it"""
RETAINED_WAIT = 5.0
"""seconds a retained message with an expiry interval waits before it is asked for: more than the comparison's
tolerance (compare.EXPIRY_TOLERANCE) plus Mosquitto's rounding, so a copy that did not count its waiting
shows"""


def text(value: str) -> Payload:
    return Payload(text=value)


def sized(size: int) -> Payload:
    return Payload(size=size)


def long_level(name: str, total: int) -> str:
    """A topic or filter of exactly `total` bytes under the case's prefix (`tp/<name>/xxx...`)."""
    head = f"tp/{name}/"
    if total <= len(head):
        raise ValueError(f"{total} bytes cannot hold the prefix {head!r}")
    return "{p}/" + "x" * (total - len(head))


def _v1_while_c_listens() -> tuple[Action, ...]:
    """c has a subscriber on `{p}/r` when a publishes its retained value v1 (so c's broker gets it live)."""
    return (Connect("live_c", "c"), Subscribe("live_c", "{p}/r"),
            Connect("p", "a"), Publish("p", "{p}/r", text("v1"), qos=1, retain=True), Settle())


def _after_c_left(name: str, title: str, second: Payload) -> Scenario:
    """v1 while c listens; c's subscriber leaves; a publishes `second` retained; a later subscriber on c."""
    return Scenario(name, title, (
        *_v1_while_c_listens(), Unsubscribe("live_c", "{p}/r"), Wait(LEAVE_WAIT),
        Publish("p", "{p}/r", second, qos=1, retain=True), Settle(),
        Connect("late_c", "c"), Subscribe("late_c", "{p}/r")))


def _retain_options(client: str, site: str) -> tuple[Action, ...]:
    """`client` connects at `site` and subscribes with every retain handling and retain-as-published, each
    subscription with its own identifier (retain handling 1 twice: the second finds the subscription)."""
    return (Connect(client, site),
            Subscribe(client, "{p}/x/+", retain_handling=0, identifier=1),
            Subscribe(client, "{p}/x/#", retain_handling=1, identifier=2),
            Subscribe(client, "{p}/x/#", retain_handling=1, identifier=2),
            Subscribe(client, "{p}/+/1", retain_handling=2, identifier=3),
            Subscribe(client, "{p}/#", retain_as_published=True, retain_handling=2, identifier=4))


def _retained_cases() -> list[Scenario]:
    return [
        Scenario("retained-before-subscribe",
                 "retained, published while nobody subscribes; later subscribers on a and on c", (
                     Connect("p", "a"), Publish("p", "{p}/r", text("v1"), qos=1, retain=True), Settle(),
                     Connect("late_a", "a"), Subscribe("late_a", "{p}/r"),
                     Connect("late_c", "c"), Subscribe("late_c", "{p}/r"))),
        Scenario("retained-after-subscribe",
                 "retained, published while c listens; later subscribers on c and on b", (
                     *_v1_while_c_listens(),
                     Connect("late_c", "c"), Subscribe("late_c", "{p}/r"),
                     Connect("late_b", "b"), Subscribe("late_b", "{p}/r"))),
        _after_c_left("retained-update", "retained value updated after c's subscriber left; a later subscriber on c",
                      text("v2")),
        _after_c_left("retained-delete", "retained value deleted (empty payload) after c's subscriber left; a later "
                                         "subscriber on c", sized(0)),
        Scenario("retained-race",
                 "retained writes to three topics on a and on c a moment apart (issue 39); later subscribers on a, "
                 "b and c: the later values everywhere", (
                     Connect("p_a", "a"), Connect("p_c", "c"),
                     *[action for round_ in range(1, 4) for action in (
                         Publish("p_a", f"{{p}}/r{round_}", text(f"a{round_}"), qos=1, retain=True),
                         Publish("p_c", f"{{p}}/r{round_}", text(f"c{round_}"), qos=1, retain=True))],
                     Settle(),
                     *[action for site in "abc" for action in (
                         Connect(f"late_{site}", site), Subscribe(f"late_{site}", "{p}/+"))])),
        Scenario("retained-delete-live",
                 "retained value deleted while c listens; a later subscriber on c", (
                     *_v1_while_c_listens(), Publish("p", "{p}/r", sized(0), qos=1, retain=True), Settle(),
                     Connect("late_c", "c"), Subscribe("late_c", "{p}/r"))),
        Scenario("retained-expiry",
                 "retained with expiry 2 s and 60 s while nobody subscribes; subscribers on a and c 5 s later", (
                     Connect("p", "a"),
                     Publish("p", "{p}/short", text("short"), qos=1, retain=True,
                             properties=Properties(message_expiry=2)),
                     Publish("p", "{p}/long", text("long"), qos=1, retain=True,
                             properties=Properties(message_expiry=60)),
                     Settle(), Wait(RETAINED_WAIT),
                     Connect("late_a", "a"), Subscribe("late_a", "{p}/+"),
                     Connect("late_c", "c"), Subscribe("late_c", "{p}/+"))),
        Scenario("retain-handling-elsewhere",
                 "retain handling 0/1/2 and retain-as-published on c, whose broker had no subscriber", (
                     Connect("p", "a"), Publish("p", "{p}/x/1", text("r1"), qos=1, retain=True), Settle(),
                     *_retain_options("s", "c"),
                     Settle(), Publish("p", "{p}/x/1", text("r2"), qos=1, retain=True))),
        Scenario("retain-handling",
                 "retain handling 0/1/2 and retain-as-published on c, which has a subscriber throughout", (
                     Connect("watch_c", "c"), Subscribe("watch_c", "{p}/#", qos=0),
                     Connect("p", "a"), Publish("p", "{p}/x/1", text("r1"), qos=1, retain=True), Settle(),
                     *_retain_options("s", "c"),
                     Settle(), Publish("p", "{p}/x/1", text("r2"), qos=1, retain=True))),
    ]


def _shared_cases() -> list[Scenario]:
    publications: list[Action] = [Publish("p", "{p}/t", text(f"s{n}"), qos=1) for n in range(1, 7)]
    return [
        Scenario("shared-remote-members",
                 "$share/g: members on b and c, publisher on a: each publication once per group", (
                     Connect("m_b", "b"), Subscribe("m_b", "$share/g/{p}/t"),
                     Connect("m_c", "c"), Subscribe("m_c", "$share/g/{p}/t"),
                     Connect("p", "a"), *publications),
                 groups={"group_g": ("m_b", "m_c")}),
        Scenario("shared-member-leaves",
                 "$share/g: members on b and c; b's member leaves, c's takes every publication", (
                     Connect("m_b", "b"), Subscribe("m_b", "$share/g/{p}/t"),
                     Connect("m_c", "c"), Subscribe("m_c", "$share/g/{p}/t"),
                     Connect("p", "a"), *publications[:3], Settle(), Disconnect("m_b"), Wait(LEAVE_WAIT),
                     *publications[3:]),
                 groups={"group_g": ("m_b", "m_c")}),
        Scenario("shared-every-broker",
                 "$share/g with members on a, b, c and $share/h on b, c: once per group", (
                     Connect("g_a", "a"), Subscribe("g_a", "$share/g/{p}/t"),
                     Connect("g_b", "b"), Subscribe("g_b", "$share/g/{p}/t"),
                     Connect("g_c", "c"), Subscribe("g_c", "$share/g/{p}/t"),
                     Connect("h_b", "b"), Subscribe("h_b", "$share/h/{p}/t"),
                     Connect("h_c", "c"), Subscribe("h_c", "$share/h/{p}/t"),
                     Connect("p", "a"), *publications),
                 groups={"group_g": ("g_a", "g_b", "g_c"), "group_h": ("h_b", "h_c")}),
    ]


def _will_cases() -> list[Scenario]:
    will = Will("{p}/will", text("gone"), qos=1, properties=Properties(user=(("why", "killed"),)))
    return [
        Scenario("will", "will messages: a client on a killed, one disconnecting cleanly, one with a will delay", (
            Connect("sub_c", "c"), Subscribe("sub_c", "{p}/#"),
            Connect("sub_b", "b"), Subscribe("sub_b", "{p}/#"),
            Connect("killed", "a", will=will), Kill("killed"), Settle(),
            Connect("clean", "a", will=Will("{p}/will-clean", text("never"))), Disconnect("clean"), Settle(),
            Connect("delayed", "a", session_expiry=10,
                    will=Will("{p}/will-delayed", text("late"), qos=2, delay=1)),
            Kill("delayed"), Wait(1.8), Settle())),
        Scenario("will-retained", "a retained will of a client killed on a; later subscribers on a and c", (
            Connect("killed", "a", will=Will("{p}/status", text("offline"), qos=1, retain=True)),
            Kill("killed"), Settle(),
            Connect("late_a", "a"), Subscribe("late_a", "{p}/status"),
            Connect("late_c", "c"), Subscribe("late_c", "{p}/status"))),
    ]


def _session_cases() -> list[Scenario]:
    return [
        Scenario("message-expiry",
                 "message expiry: an expired message is not delivered, the remaining interval shrinks", (
                     Connect("live_c", "c"), Subscribe("live_c", "{p}/e"),
                     Connect("away_c", "c", clean_start=False, session_expiry=300), Subscribe("away_c", "{p}/e"),
                     Disconnect("away_c"),
                     Connect("p", "a"),
                     Publish("p", "{p}/e", text("short"), qos=1, properties=Properties(message_expiry=2)),
                     Publish("p", "{p}/e", text("long"), qos=1, properties=Properties(message_expiry=60)),
                     Settle(), Wait(3.0),
                     Connect("away_c", "c", clean_start=False, session_expiry=300))),
        Scenario("persistent-session",
                 "a persistent session on c offline and back: its QoS 1 and 2 messages wait for it", (
                     Connect("away_c", "c", clean_start=False, session_expiry=300),
                     Subscribe("away_c", "{p}/q/#", qos=2), Disconnect("away_c"),
                     Connect("p", "a"),
                     *[Publish("p", f"{{p}}/q/{qos}", text(f"q{qos}-{n}"), qos=qos)
                       for n in range(1, 4) for qos in (0, 1, 2)],
                     Wait(OFFLINE_WAIT),
                     Connect("away_c", "c", clean_start=False, session_expiry=300), Settle(),
                     Publish("p", "{p}/q/1", text("back"), qos=1))),
        Scenario("persistent-clean-start",
                 "a session made with clean start 1 and an expiry on c (MQTT.js `clean: true` with "
                 "`sessionExpiryInterval`), offline and back: its QoS 1 and 2 messages wait for it", (
                     Connect("away_c", "c", clean_start=True, session_expiry=300),
                     Subscribe("away_c", "{p}/q/#", qos=2), Disconnect("away_c"),
                     Connect("p", "a"),
                     *[Publish("p", f"{{p}}/q/{qos}", text(f"q{qos}-{n}"), qos=qos)
                       for n in range(1, 6) for qos in (1, 2)],
                     Wait(OFFLINE_WAIT),
                     Connect("away_c", "c", clean_start=False, session_expiry=300), Settle(),
                     Publish("p", "{p}/q/1", text("back"), qos=1))),
        Scenario("persistent-killed",
                 "paho's default session on c (clean start on the first connection only, an expiry) loses its "
                 "socket: the QoS 1 publications made meanwhile arrive when it is back", (
                     Connect("dev_c", "c", clean_start=True, session_expiry=60),
                     Subscribe("dev_c", "{p}/cmd/#", qos=1), Connect("p", "a"),
                     Publish("p", "{p}/cmd/0", text("before"), qos=1), Settle(),
                     Kill("dev_c"),
                     *[Publish("p", f"{{p}}/cmd/{n}", text(f"while-{n}"), qos=1) for n in range(1, 11)],
                     Wait(OFFLINE_WAIT),
                     Connect("dev_c", "c", clean_start=False, session_expiry=60), Settle(),
                     Publish("p", "{p}/cmd/0", text("after"), qos=1))),
        Scenario("unsubscribe", "after an unsubscribe on c nothing more arrives there", (
            Connect("s", "c"), Subscribe("s", "{p}/t"), Connect("p", "a"),
            Publish("p", "{p}/t", text("before"), qos=1), Settle(),
            Unsubscribe("s", "{p}/t"), Publish("p", "{p}/t", text("after"), qos=1))),
    ]


MOVED = ("Mosquitto answers session present 0 on a broker that never saw the client (one broker: 1); the client "
         "subscribes again, as MQTT 5 has it do then")
"""why the roaming cases' session present cannot match one broker's (docs/transparency.md)"""


def _roaming_cases() -> list[Scenario]:
    """Issue 39 item 3: one client id federation-wide. The same client id connects again on another site (a device
    behind a load balancer in front of the brokers)."""
    return [
        Scenario("takeover-elsewhere",
                 "the same client id connects on b, then on c: the first connection is closed (taken over)", (
                     Connect("dev_b", "b", identity="dev"), Subscribe("dev_b", "{p}/d"),
                     Connect("dev_c", "c", identity="dev"), Subscribe("dev_c", "{p}/d"),
                     Connect("p", "a"), Publish("p", "{p}/d", text("to the second"), qos=1))),
        Scenario("will-delay-elsewhere",
                 "a client with a 3 s will delay killed on a comes back on c within it: no will", (
                     Connect("watch_b", "b"), Subscribe("watch_b", "{p}/will"),
                     Connect("w_a", "a", clean_start=True, session_expiry=60, identity="w",
                             will=Will("{p}/will", text("w is gone"), delay=3)),
                     Kill("w_a"), Wait(0.5),
                     Connect("w_c", "c", clean_start=False, session_expiry=60, identity="w"),
                     Wait(4.0), Connect("p", "a"), Publish("p", "{p}/will", text("after the delay"), qos=1)),
                 session_present_differs=MOVED),
        Scenario("session-moves",
                 "a persistent session made on a, offline while QoS 1 and 2 are published, resumed on c: its queued "
                 "messages, once, in order, then what follows", (
                     Connect("s_a", "a", clean_start=True, session_expiry=300, identity="s"),
                     Subscribe("s_a", "{p}/q/#", qos=2), Disconnect("s_a"),
                     Connect("p", "b"),
                     *[Publish("p", f"{{p}}/q/{qos}", text(f"q{qos}-{n}"), qos=qos)
                       for n in range(1, 4) for qos in (1, 2)],
                     Wait(OFFLINE_WAIT),
                     Connect("s_c", "c", clean_start=False, session_expiry=300, identity="s"),
                     Subscribe("s_c", "{p}/q/#", qos=2), Settle(),
                     Publish("p", "{p}/q/1", text("back"), qos=1)),
                 session_present_differs=MOVED),
    ]


def _option_cases() -> list[Scenario]:
    return [
        Scenario("qos-levels", "QoS 0/1/2 published, subscribed at 0/1/2 on c and at 2 on a: downgrade", (
            *[action for qos in (0, 1, 2) for action in (Connect(f"sub{qos}_c", "c"),
                                                         Subscribe(f"sub{qos}_c", "{p}/t", qos=qos))],
            Connect("sub2_a", "a"), Subscribe("sub2_a", "{p}/t", qos=2),
            Connect("p", "a"), *[Publish("p", "{p}/t", text(f"q{qos}"), qos=qos) for qos in (0, 1, 2)])),
        Scenario("no-local", "no_local subscribers on a and c, a plain one on b; each publishes", (
            Connect("x_a", "a"), Subscribe("x_a", "{p}/#", no_local=True),
            Connect("y_c", "c"), Subscribe("y_c", "{p}/#", no_local=True),
            Connect("z_b", "b"), Subscribe("z_b", "{p}/#"),
            Publish("x_a", "{p}/from-x", text("x"), qos=1), Settle(),
            Publish("y_c", "{p}/from-y", text("y"), qos=1), Settle(),
            Publish("z_b", "{p}/from-z", text("z"), qos=1))),
        Scenario("overlapping-filters",
                 "one client with three overlapping filters on c and on a (one copy per subscription)", (
                     *[action for client, site in (("o_c", "c"), ("o_a", "a")) for action in (
                         Connect(client, site),
                         Subscribe(client, "{p}/#", qos=0, identifier=1),
                         Subscribe(client, "{p}/+/x", qos=1, identifier=2),
                         Subscribe(client, "{p}/a/x", qos=2, identifier=3))],
                     Connect("p", "b"),
                     Publish("p", "{p}/a/x", text("ax"), qos=2), Publish("p", "{p}/b/x", text("bx"), qos=1),
                     Publish("p", "{p}/a/y", text("ay"), qos=0))),
        Scenario("subscription-identifiers",
                 "subscription identifiers on c, one replaced by subscribing again", (
                     Connect("s", "c"),
                     Subscribe("s", "{p}/#", identifier=7), Subscribe("s", "{p}/s/+", identifier=268435455),
                     Subscribe("s", "{p}/#", identifier=9),
                     Connect("p", "a"), Publish("p", "{p}/s/1", text("id"), qos=1))),
        Scenario("topic-alias", "a publisher on a uses topic aliases (set, use, rebind); subscriber on c", (
            Connect("s", "c"), Subscribe("s", "{p}/#"), Connect("p", "a"),
            Publish("p", "{p}/alias/one", text("one-set"), qos=1, properties=Properties(topic_alias=1)),
            Publish("p", "", text("one-used"), qos=1, properties=Properties(topic_alias=1)),
            Publish("p", "{p}/alias/two", text("two-set"), qos=1, properties=Properties(topic_alias=1)),
            Publish("p", "", text("two-used"), qos=0, properties=Properties(topic_alias=1)))),
        Scenario("properties", "user properties (repeated, in order), content type, response topic, "
                               "correlation data, payload format, message expiry", (
                     Connect("s_c", "c"), Subscribe("s_c", "{p}/#", qos=2),
                     Connect("s_a", "a"), Subscribe("s_a", "{p}/#", qos=2),
                     Connect("p", "a"),
                     *[Publish("p", "{p}/props", text(f"props-q{qos}"), qos=qos, properties=Properties(
                         user=(("k", "1"), ("j", "2"), ("k", "3")), content_type="text/plain; charset=utf-8",
                         response_topic="reply/here", correlation_data=b"\x00\x01corr", payload_format=1,
                         message_expiry=120)) for qos in (0, 1, 2)])),
        Scenario("puback-no-subscribers",
                 "the publisher's acknowledgement says whether anybody subscribes (reason 16)", (
                     Connect("p", "a"), Publish("p", "{p}/nobody", text("alone"), qos=1), Settle(),
                     Connect("s", "c"), Subscribe("s", "{p}/t"), Publish("p", "{p}/t", text("heard"), qos=1)),
                 judge_acks=True),
    ]


def _size_cases() -> list[Scenario]:
    cases = []
    for size in LARGE_SIZES:
        label = {0: "0B", 1024: "1KiB", 256 * 1024 + 1: "256KiB-plus-1", 1024 * 1024: "1MiB"}[size]
        cases.append(Scenario(
            f"payload-{label}", f"payload of {sized(size).describe()} at QoS 0, 1, 2 from a to c (and b)", (
                Connect("s_c", "c"), Subscribe("s_c", "{p}/t", qos=2),
                Connect("s_b", "b"), Subscribe("s_b", "{p}/t", qos=2),
                Connect("p", "a"), *[Publish("p", "{p}/t", sized(size), qos=qos) for qos in (0, 1, 2)]),
            settle_timeout=5.0 if size > 64 * 1024 else 3.0))
    return cases


def huge_case() -> Scenario:
    return Scenario("payload-16MiB", "payload of 16 MiB at QoS 1 from a to c", (
        Connect("s_c", "c"), Subscribe("s_c", "{p}/t", qos=1),
        Connect("p", "a"), Publish("p", "{p}/t", sized(HUGE_SIZE), qos=1)),
        settle_timeout=15.0, ack_timeout=60.0)


def _long_cases() -> list[Scenario]:
    cases = [Scenario("long-topic", "topics of 1,000 and 60,000 bytes under a short filter, a to c", (
        Connect("s", "c"), Subscribe("s", "{p}/#"), Connect("p", "a"),
        Publish("p", long_level("long-topic", 1000), text("t1000"), qos=1),
        Publish("p", long_level("long-topic", 60000), text("t60000"), qos=1)))]
    for total in (900, 1000, 60000):
        name = f"long-filter-{total}"
        cases.append(Scenario(name, f"an exact filter of {total:,} bytes on c, the publisher on a", (
            Connect("s", "c"), Subscribe("s", long_level(name, total)), Connect("p", "a"),
            Publish("p", long_level(name, total), text(f"f{total}"), qos=1))))
    return cases


def default_cases() -> list[Scenario]:
    """Every case of the default run, in the order of the matrix."""
    return [*_retained_cases(), *_shared_cases(), *_will_cases(), *_session_cases(), *_roaming_cases(),
            *_option_cases(),
            *_size_cases(), huge_case(), *_long_cases()]


CASES = {scenario.name: scenario for scenario in default_cases()}
