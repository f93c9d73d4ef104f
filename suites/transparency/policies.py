"""The policy cases of the transparency suite (issue 38): topic lines on a bridge chain and on the federation.

Theory of operation: a site's topic lines mean the same on a Mosquitto bridge and on a wrapper (the
federation plays the bridge's remote side: docs/topic-policies.md), so each case runs on a bridge chain
given the same lines and on a federation given them, and the federation's recording must equal the bridge
chain's: the bridge chain is the reference here, not one broker (one broker has no policy). The chain is
a and c each bridged to b (`setups.PolicyBridges`): b, without lines of its own, is the remote broker of
both bridges, so its namespace is the federation's, as b's wrapper (without lines) sees it.

Every case runs on one started pair of setups, each on its own topic prefix (`{p}`), so the lines of all the
cases are given to a and c at once, each rewritten under its case's prefix (`case_lines`): a line with
prefixes gets `{p}/` put before both, one without gets it before its pattern. Lines of different cases then
never match each other's topics, and each keeps what it says; a case without lines for a site gives it
`# both 2` under its prefix, which is what no lines mean.

Probes (the runner's way of knowing a subscription is reached) are published from a site only where the
lines let one through, on the local topic there that becomes the probe topic at the subscriber
(`probe_topics`); a site that cannot reach a subscription is not asked to.

Where the bridge chain delivers a publication more than once (overlapping lines: one subscription, so one
copy, per line; a shared group: served by each member broker), the case says why (`bridge_duplicates`) and
its recording is compared with each duplicate left out (compare.without_duplicates): what one broker does,
and what a policy promises (overlapping lines deliver once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from federation.daemon.topic_policy import (
    EMPTY,
    EVERYTHING,
    EXPORTS,
    IMPORTS,
    Crossing,
    TopicPolicy,
    intersect,
    parse_line,
    remap,
)
from federation.protocol.topic_filter import matches
from suites.transparency.scenario import (
    Action,
    Connect,
    Kill,
    Payload,
    Publish,
    Scenario,
    Settle,
    Subscribe,
    Will,
)

POLICY_SITES = ("a", "c")
"""the sites with topic lines of their own (b is the bridge chain's hub: the federation's namespace)"""
NO_LINES = ("# both 2",)
"""what a site's lines are in a case that gives it none: everything, both ways, under the case's prefix (a
site with lines for some case lets nothing else through, so each case gets this where it has no lines)"""
SITE_A_TELEMETRY = ('sensors/# out 1 "" site-a/', "cmd/# in 1")
"""the issue's example: telemetry up under a site prefix, commands down"""


def text(value: str) -> Payload:
    return Payload(text=value)


def rewrite(line: str, prefix: str) -> str:
    """One line under a case's prefix (module docstring): `sensors/# out 1 "" site-a/` becomes
    `sensors/# out 1 tp/case/ tp/case/site-a/`, `cmd/# in 1` becomes `tp/case/cmd/# in 1`."""
    parsed = parse_line(line)
    if parsed.remaps:
        return (f"{parsed.pattern if parsed.pattern is not None else EMPTY} {parsed.direction} {parsed.qos} "
                f"{prefix}/{parsed.local_prefix or ''} {prefix}/{parsed.remote_prefix or ''}")
    return f"{prefix}/{parsed.pattern} {parsed.direction} {parsed.qos}"


def case_lines(scenarios: Iterable[Scenario], prefix_of: Callable[[Scenario], str]) -> dict[str, list[str]]:
    """The lines of every case by site, each under its case's prefix (`prefix_of(scenario)`: runner.prefix_of),
    in case order."""
    found: dict[str, list[str]] = {site: [] for site in POLICY_SITES}
    for scenario in scenarios:
        prefix = prefix_of(scenario)
        for site in POLICY_SITES:
            found[site] += [rewrite(line, prefix) for line in scenario.topics.get(site) or NO_LINES]
    return found


def _source(policy: TopicPolicy, target: str, outward: bool) -> str | None:
    """A topic that `policy` turns into `target`: exported to it (`outward`: a local topic), or imported as it
    (a federation topic); None when no line does."""
    if policy.everything:
        return target
    for line in policy.lines:
        if line.direction not in (EXPORTS if outward else IMPORTS):
            continue
        if outward and matches(line.remote_topic, target):
            candidate = remap(target, line.remote_prefix, line.local_prefix)
            crossing = policy.export(candidate)
        elif not outward and matches(line.local_topic, target):
            candidate = remap(target, line.local_prefix, line.remote_prefix)
            crossing = policy.import_(candidate)
        else:
            continue
        if isinstance(crossing, Crossing) and crossing.topic == target:
            return candidate
    return None


def probe_topics(policies: Mapping[str, TopicPolicy], brokers: Mapping[str, str], sites: Sequence[str],
                 receiver_site: str, topic_filter: str) -> dict[str, str]:
    """Where to publish a probe at each site so that it arrives at a subscriber of `topic_filter` at
    `receiver_site` (`brokers`: site -> its broker): the filter's probe topic, or one inside the part of it an
    `in`/`both` line of the receiver imports (a subscriber of `#` behind `site-a/# in` is reached on
    `site-a/tp-probe`); sites of the receiver's broker publish the first; sites the lines keep away are left
    out."""
    inner = topic_filter.split("/", 2)[2] if topic_filter.startswith("$share/") else topic_filter
    receiver = policies.get(receiver_site, EVERYTHING)
    candidates = [probe_topic(inner)]
    for line in receiver.lines:
        common = intersect(inner, line.local_topic) if line.direction in IMPORTS else None
        if common is not None and probe_topic(common) not in candidates:
            candidates.append(probe_topic(common))
    found: dict[str, str] = {}
    for site in sites:
        if brokers[site] == brokers[receiver_site]:
            found[site] = candidates[0]
            continue
        for candidate in candidates:
            federation_topic = _source(receiver, candidate, outward=False)
            local = None if federation_topic is None else \
                _source(policies.get(site, EVERYTHING), federation_topic, outward=True)
            if local is not None:
                found[site] = local
                break
    return found


def probe_topic(topic_filter: str) -> str:
    """A topic that `topic_filter` matches: its wildcards become a `tp-probe` level (as runner.probe_topic)."""
    return "/".join("tp-probe" if level in ("+", "#") else level for level in topic_filter.split("/"))


# ------------------------------------------------------------------ the cases


def _subscribers(*wanted: tuple[str, str, str]) -> list[Action]:
    """(client, site, filter) each connected and subscribed at QoS 2."""
    actions: list[Action] = []
    for client, site, topic_filter in wanted:
        actions += [Connect(client, site), Subscribe(client, topic_filter, qos=2)]
    return actions


def policy_cases() -> list[Scenario]:
    """Every policy case, in the order of the matrix."""
    stream: list[Action] = [Publish("p_a", "{p}/sensors/stream", text(f"s{n}"), qos=1) for n in range(1, 11)]
    return [
        Scenario("policy-telemetry-commands",
                 "a: telemetry up under site-a/ at QoS 1 at most, commands down, the rest stays on a", (
                     *_subscribers(("fleet_c", "c", "{p}/site-a/sensors/#"), ("plain_c", "c", "{p}/sensors/#"),
                                   ("all_b", "b", "{p}/#"), ("cmd_a", "a", "{p}/cmd/#"), ("all_a", "a", "{p}/#")),
                     Connect("p_a", "a"), Publish("p_a", "{p}/sensors/t1", text("21.5"), qos=2),
                     Publish("p_a", "{p}/private/x", text("stays home"), qos=1), *stream, Settle(),
                     Connect("p_c", "c"), Publish("p_c", "{p}/cmd/a1", text("open"), qos=1),
                     Publish("p_c", "{p}/other/x", text("not for a"), qos=1), Settle(),
                     Connect("p_b", "b"), Publish("p_b", "{p}/site-a/sensors/echo", text("echo"), qos=1)),
                 topics={"a": SITE_A_TELEMETRY}),
        Scenario("policy-site-prefixes",
                 "a and c each publish under their own prefix and take the other's; a retained value crosses "
                 "mapped", (
                     Connect("p_a", "a"), Publish("p_a", "{p}/status", text("a online"), qos=1, retain=True),
                     Settle(),
                     *_subscribers(("all_a", "a", "{p}/#"), ("all_b", "b", "{p}/#"), ("all_c", "c", "{p}/#")),
                     Publish("p_a", "{p}/temp", text("a 21"), qos=1), Settle(),
                     Connect("p_c", "c"), Publish("p_c", "{p}/temp", text("c 19"), qos=2), Settle(),
                     Connect("late_c", "c"), Subscribe("late_c", "{p}/site-a/status", qos=1)),
                 topics={"a": ('# out 1 "" site-a/', "site-c/# in 1"), "c": ('# out 2 "" site-c/', "site-a/# in 2")}),
        Scenario("policy-private-topics",
                 "only public/ crosses a's edge, both ways; private/ stays home on a", (
                     *_subscribers(("all_a", "a", "{p}/#"), ("all_b", "b", "{p}/#"), ("all_c", "c", "{p}/#")),
                     Connect("p_a", "a"), Publish("p_a", "{p}/private/x", text("a private"), qos=1),
                     Publish("p_a", "{p}/public/x", text("a public"), qos=1), Settle(),
                     Connect("p_c", "c"), Publish("p_c", "{p}/private/y", text("c private"), qos=1),
                     Publish("p_c", "{p}/public/y", text("c public"), qos=1)),
                 topics={"a": ("public/# both 2",)}),
        Scenario("policy-overlapping-lines",
                 "two of a's out lines match s/a/x (QoS 0 and 2): it crosses once, at QoS 2; s/b/x at QoS 0", (
                     *_subscribers(("all_c", "c", "{p}/#")),
                     Connect("p_a", "a"), Publish("p_a", "{p}/s/a/x", text("both lines"), qos=2),
                     Publish("p_a", "{p}/s/b/x", text("one line"), qos=2)),
                 topics={"a": ("s/# out 0", "s/a/# out 2")},
                 bridge_duplicates="the bridge holds one subscription per line on a: s/a/x matches two, so two "
                                   "copies cross (at QoS 0 and 2)"),
        Scenario("policy-will-retained",
                 "a's retained will crosses under site-a/; a later subscriber on c gets it", (
                     Connect("dev", "a", will=Will("{p}/status/dev1", text("offline"), qos=1, retain=True)),
                     Kill("dev"), Settle(),
                     Connect("late_c", "c"), Subscribe("late_c", "{p}/site-a/status/#", qos=1)),
                 topics={"a": ('status/# out 1 "" site-a/',)}),
        Scenario("policy-shared-group",
                 "$share/g on the mapped topic, members on b and c: each of a's jobs once to the group", (
                     Connect("m_b", "b"), Subscribe("m_b", "$share/g/{p}/site-a/jobs/#", qos=1),
                     Connect("m_c", "c"), Subscribe("m_c", "$share/g/{p}/site-a/jobs/#", qos=1),
                     Connect("p_a", "a"),
                     *[Publish("p_a", f"{{p}}/jobs/{n}", text(f"job {n}"), qos=1) for n in range(1, 5)]),
                 groups={"group_g": ("m_b", "m_c")}, topics={"a": ('jobs/# out 1 "" site-a/',)},
                 bridge_duplicates="a shared group on a bridge chain is served by every broker with a member"),
    ]


POLICY_CASES = {scenario.name: scenario for scenario in policy_cases()}
