"""What federation.daemon.roaming keeps: its settings, the registry's topics for a client, the pseudo client that
holds an adopted session's filters in the node, and the state of takeovers (this broker the old host) and adoptions
(this broker the new one), with their counts. Plain data: the decisions are `Roaming`'s."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from federation.daemon.client_registry import Record, TakeOver, registry_topic
from federation.daemon.kicker import Outcome
from federation.daemon.state import SHARED_PREFIX
from federation.protocol.topic_filter import matches
from federation.protocol.types import Address, Injection, PublicationId

FENCE_WAIT = 2.0
"""seconds a handover waits, after the kicker read the fence, for the wrapper's connection to read it back"""
FILTERS_DELAY = 0.5
"""seconds a client's filters record waits for more changes before it is published"""
ADOPTION_GRACE = 30.0
"""seconds a client's adopted session holds publications for it at most (the handover, its subscriptions)"""
LATE_WINDOW = 5.0
"""seconds after an adoption ends during which a publication its handover covered, arriving late here (the
handover's record overtook it), is left out when no other local client takes it"""
MAX_HELD = 10_000
"""publications one adopted session holds at most (the oldest go first, counted)"""
ASSIGNED_PREFIX = "auto-"
"""how Mosquitto begins the client ids it assigns (an empty client id, MQTT 5's Assigned Client Identifier): no
record is made for those (mosquitto_pub and its like would leave one per run in every wrapper's store)"""
PSEUDO_PREFIX = "\x00session:"
"""the pseudo client holding an adopted session's filters in the node (U+0000 is in no client id)"""


def address_text(address: Address) -> str:
    """An address as records name it ("host:port")."""
    return str(address)


def filters_topic(client: str) -> str:
    return registry_topic(client) + "/filters"


def adopted_client(client: str) -> str:
    return PSEUDO_PREFIX + client


class Originate(Protocol):
    """Originates a registry record as a retained QoS 1 publication of this wrapper's
    (`LocalPublications.originate_record`)."""

    def __call__(self, topic: str, payload: bytes, now: float, /) -> None: ...


class StartKicker(Protocol):
    """Starts a takeover of `client` on the local broker with `clean` (federation.daemon.kicker); `ready` gets its
    fence when it may be published, `done` its outcome, both on the loop's thread."""

    def __call__(self, client: str, clean: bool, ready: Callable[[str, float], None],
                 done: Callable[[Outcome, float], None], /) -> None: ...


class PublishFence(Protocol):
    """Publishes a takeover's fence on the wrapper's broker connection, behind its injections; returns, per origin,
    the ids of the injections on a topic of `filters` the broker processes before it
    (`Injector.released_matching`), or None when it could not be published (not connected)."""

    def __call__(self, fence: str, filters: Iterable[str], /) -> dict[Address, list[tuple[int, int]]] | None: ...


DROP_REASONS = ("roaming_unreleased", "roaming_handover_full", "roaming_held_full", "roaming_not_resubscribed",
                "roaming_client_gone", "roaming_late_full")
"""what roaming counts as lost (docs/drops.md), exported at 0 from the start (federation.daemon.metrics)"""


class Dropper(Protocol):
    """Counts a drop and emits its event (the node's `drop`: docs/drops.md)."""

    def drop(self, reason: str, /, count: int = 1, *, event: str | None = None, now: float = 0.0,
             **fields: Any) -> None: ...


@dataclass
class Takeover:
    """A takeover under way on this broker: its handover record goes once the kicker is done and the fence was read
    back on the wrapper's connection (or `FENCE_WAIT` after the kicker, without the local clients' cut)."""

    action: TakeOver
    filters: dict[str, int]
    carried: list[Injection] = field(default_factory=list)
    """what an adoption of the same client here still held, never given to the broker (module docstring)"""
    fence: str | None = None
    had: dict[Address, list[tuple[int, int]]] | None = None
    """the injections the session had (at the fence's publication)"""
    own: tuple[int, int] | None = None
    """(epoch, seq) of the last local publication read before the fence came back"""
    outcome: Outcome | None = None
    done_at: float | None = None


@dataclass
class Adopted:
    """A session this broker took from another (module docstring)."""

    client: str
    source: str
    filters: dict[str, int]
    """raw filter -> qos, as the old host recorded them"""
    deadline: float
    held: list[Injection] = field(default_factory=list)
    drained: list[Injection] | None = None
    """the handover's messages, once it came"""
    subscribed: set[str] = field(default_factory=set)
    """filters the client subscribed to again here"""
    dropped: int = 0
    own: list[tuple[PublicationId, Injection, bool]] = field(default_factory=list)
    """this broker's own clients' publications for it before the handover came: (id, to inject, whether the
    client had a subscription here that took it), settled by the handover (`Roaming._settle_own`)"""
    record: Record | None = None
    """the handover, once it came"""
    late: list[Injection] = field(default_factory=list)
    """what a late record brought before the handover came (federation.daemon.roaming_late): given after it"""

    def wants(self, topic: str) -> bool:
        return any(matches(filter_, topic) for filter_ in self.filters if not filter_.startswith(SHARED_PREFIX))

    def resubscribed(self, topic: str) -> bool:
        return any(matches(filter_, topic) for filter_ in self.subscribed)


@dataclass
class RoamingCounts:
    claims: int = 0
    filters_records: int = 0
    takeovers: int = 0
    """client ids this broker had that connected on another broker: taken over here"""
    taken_queued: int = 0
    """queued messages read from this broker's sessions and handed to their new host"""
    adopted: int = 0
    """sessions this broker took from another"""
    delivered: int = 0
    """handed-over messages injected here"""
    duplicates_left_out: int = 0
    """held publications the handover carried too (both brokers had them)"""
    dropped: int = 0
    """publications roaming lost, each counted under its drop reason too (docs/drops.md): held or handed-over
    messages no subscription of their client took within the grace, held beyond `MAX_HELD`, or a late record's
    for a client that had gone on with no takeover of it here"""
    handovers_late: int = 0
    """adoptions whose handover did not come within the grace"""
    fences_late: int = 0
    """handovers made without the local clients' cut: the fence did not come back on the wrapper's connection"""
    shared_copies: int = 0
    """handed-over messages injected here on a topic another local client subscribes to: that client gets a copy of
    each it had already had (the broker cannot give a message to one subscriber alone: docs/transparency.md)"""
    carried: int = 0
    """messages an adopted session held here that went on in this broker's own handover (the client moved on)"""
    late_copies: int = 0
    """publications a handover gave that reached this wrapper after its record, made all the same because another
    local client takes them (the moved client got it twice)"""
    own_given: int = 0
    """this broker's own clients' publications given to an adopted session's client by its wrapper: made before the
    client subscribed here again, after its old broker's fence"""
    takeovers_skipped: int = 0
    """newer claims elsewhere of a client whose last connection here ended with a DISCONNECT and that held no
    filters here: no takeover was needed"""
    late_received: int = 0
    """publications of late records (federation.daemon.roaming_late) not given here before: given, or sent on"""
    unreleased_given: int = 0
    """of those, given again in the handover: the broker's order told which they were (roaming_unreleased.py)"""
    unreleased: int = 0
    """QoS 2 messages a taken-over client had taken (PUBREC) and not been released (PUBREL) when it moved: one
    broker would release them on its return; no other broker can (docs/transparency.md)"""

    def as_dict(self) -> dict[str, int]:
        return {name: int(value) for name, value in vars(self).items()}
