"""The topic policy applied where publications cross the wrapper's edges, and what it kept out, counted.

Theory of operation: a policy (topic_policy.py) is enforced where a publication enters or leaves the
federation, never inside it, so transit wrappers forward what others exchange whatever their own lines say:

- **out of the broker** (`export`, called by local_publications.py for every publication read from the broker,
  and for the retained messages the broker held): a publication no `out`/`both` line allows is acknowledged to
  the broker and goes no further; the node never sees it, so no datagram carries it. The others go on under
  their federation topic, at the QoS the lines allow at most.
- **into the broker** (`imports`, `import_runs`, called by running.py on what the node hands over): a
  publication no `in`/`both` line allows is not injected; for QoS 1/2 the node hears it done (its custody ends:
  the broker it would have gone to wants none of it) so its sender stops sending it again. The others are
  injected under their local topic, at the QoS the lines allow at most; one capped to QoS 0 from 1 or 2 is done
  at once for the same reason (QoS 0 is never acknowledged by the broker). Few arrive here at all: the node
  asks the federation only for what the lines import (policy_subscriptions.py); retained values reach every
  wrapper by the retained tree (docs/protocol.md rule 10) and are kept out here.

Both count what they kept out by reason (`filtered`, status `daemon.topic_policy`, metric
`mqttfed_topic_policy_filtered_total`). With no lines the policy lets everything through as it is and nothing
here runs (`active`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

from federation.daemon.topic_policy import EVERYTHING, REASONS, Crossing, TopicPolicy
from federation.protocol.types import Injection, InjectionRun, PublicationId


class PolicyEdges:
    """The running policy and what it kept out; `set_policy` on a reload."""

    def __init__(self, policy: TopicPolicy = EVERYTHING) -> None:
        self.policy = policy
        self.active = not policy.everything
        """the policy has lines: publications must be asked about (an attribute: read per publication)"""
        self.filtered: dict[str, Counter[str]] = {direction: Counter() for direction in REASONS}
        """direction ("export", "import") -> reason -> publications kept out"""

    def set_policy(self, policy: TopicPolicy) -> None:
        self.policy = policy
        self.active = not policy.everything

    def export(self, topic: str, qos: int) -> Crossing | None:
        """A local publication: its federation topic and QoS, or None (counted) when it stays here."""
        crossing = self.policy.export(topic)
        if isinstance(crossing, str):
            self.filtered["export"][crossing] += 1
            return None
        return crossing if crossing.qos == qos else Crossing(crossing.topic, min(qos, crossing.qos))

    def imports(self, injections: Sequence[Injection], done: Callable[[PublicationId], None]) -> list[Injection]:
        """The node's injections as the broker gets them: mapped, capped, those kept out left out (counted);
        `done(publication)` for each QoS 1/2 one that will not be acknowledged by the broker (`Node.injection_done`
        with the time bound)."""
        kept: list[Injection] = []
        policy, counts = self.policy, self.filtered["import"]
        for injection in injections:
            crossing = policy.import_(injection.topic)
            if isinstance(crossing, str):
                counts[crossing] += 1
                if injection.qos:
                    done(injection.publication)
                continue
            qos = min(injection.qos, crossing.qos)
            if injection.qos and not qos:
                done(injection.publication)
            if crossing.topic != injection.topic or qos != injection.qos:
                injection = replace(injection, topic=crossing.topic, qos=qos)
            kept.append(injection)
        return kept

    def import_runs(self, runs: Sequence[InjectionRun]) -> list[InjectionRun]:
        """QoS 0 runs (no retained message, no custody) mapped, those kept out left out (counted); runs left
        empty are dropped."""
        kept: list[InjectionRun] = []
        policy, counts = self.policy, self.filtered["import"]
        for run in runs:
            topics: list[str] = []
            payloads: list[bytes] = []
            seqs: list[int] = []
            for topic, payload, seq in zip(run.topics, run.payloads, run.seqs, strict=True):
                crossing = policy.import_(topic)
                if isinstance(crossing, str):
                    counts[crossing] += 1
                    continue
                topics.append(crossing.topic)
                payloads.append(payload)
                seqs.append(seq)
            if seqs:
                kept.append(InjectionRun(topics, payloads, run.origin, run.epoch, seqs, run.filter))
        return kept

    def status(self) -> dict[str, object]:
        """Status `daemon.topic_policy` (its `subscriptions` part is policy_subscriptions.py's)."""
        return {"lines": self.policy.describe(),
                "filtered": {direction: {reason: counts[reason] for reason in REASONS[direction]}
                             for direction, counts in self.filtered.items()}}
