"""The faults of the suite, the topologies they hit, and what each means on a Mosquitto bridge chain.

Theory of operation: a fault is a kind (`kill_wrapper`, `kill_broker`,
`pause_wrapper`, `partition`; issue 37 added `stop_wrapper`, a clean SIGTERM,
and `disk_full`, the wrapper's state directory filled) aimed at a role
(`publisher`, `middle`, `subscriber`, ...; `middle+bypass` aims at two at
once), held for a number of seconds and then healed (the process started
again, SIGCONT, the rules removed, the space freed). A topology names its nodes and
says which node plays each role and where the partition cuts, so one fault
definition runs on the line and on the ring; a setup (`setups.py`) turns a
fault into actions on its processes.

A bridge chain has no wrappers: the forwarding is done by the brokers
themselves. Its analogue of each fault is the nearest thing that exists
(`BRIDGE_ANALOGUE`): a wrapper killed becomes the bridge connections of that
node reset and refused for the same time (the forwarding element is gone,
the broker and its clients stay); a wrapper stopped becomes the broker that
hosts the bridge stopped (SIGSTOP); broker kills are the same; a partition
drops the bridge's TCP across the same cut. The line is the ring's
reference too: a ring cannot be bridged (bridges loop forever).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

KINDS = ("kill_wrapper", "kill_broker", "pause_wrapper", "partition", "stop_wrapper", "disk_full")
ROLES = ("publisher", "middle", "subscriber", "bypass", "near")
"""the node of the publisher, the node between it and the subscriber's, the subscriber's, (rings only) the node
on the other path, and (the five-ring) the publisher's neighbour on the subscriber's side of it"""
ONE_PROCESS_KINDS = ("kill_broker", "pause_wrapper", "disk_full")
"""kinds aimed at one role only (a `+` of roles is for wrappers killed or stopped together)"""
NEIGHBOUR_DOWN_SECONDS = 3.0
"""the default neighbour-down time (hello_interval 1 s x dead_intervals 3)"""


@dataclass(frozen=True)
class Fault:
    """One fault of the suite: a kind aimed at a role, held `seconds`, then healed."""

    name: str
    kind: str
    role: str | None
    """None for a partition (it cuts between the two sides)"""
    seconds: float
    title: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fault {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        roles = self.roles
        if (self.role is None) != (self.kind == "partition") or not all(role in ROLES for role in roles) \
                or (len(roles) > 1 and self.kind in ONE_PROCESS_KINDS):
            raise ValueError(f"fault {self.name}: role {self.role!r} does not fit kind {self.kind}")
        if self.seconds <= 0:
            raise ValueError(f"fault {self.name}: seconds must be positive")

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles it is aimed at (`middle+bypass`: two at once); none for a partition."""
        return tuple(self.role.split("+")) if self.role else ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(document: dict[str, Any]) -> Fault:
        return Fault(**document)


SUITE: tuple[Fault, ...] = (
    Fault("kill-publisher-wrapper", "kill_wrapper", "publisher", 6.0,
          "kill -9 the publisher-side wrapper, restart after 6 s"),
    Fault("kill-middle-wrapper", "kill_wrapper", "middle", 6.0, "kill -9 the middle wrapper, restart after 6 s"),
    Fault("kill-subscriber-wrapper", "kill_wrapper", "subscriber", 6.0,
          "kill -9 the subscriber-side wrapper, restart after 6 s"),
    Fault("kill-subscriber-broker", "kill_broker", "subscriber", 4.0,
          "kill -9 the subscriber's broker, restart after 4 s"),
    Fault("kill-middle-broker", "kill_broker", "middle", 4.0, "kill -9 the middle broker, restart after 4 s"),
    Fault("pause-middle-wrapper", "pause_wrapper", "middle", 6.0,
          "SIGSTOP the middle wrapper for 6 s (> the 3 s neighbour-down time), then SIGCONT"),
    Fault("partition", "partition", None, 30.0, "partition A side | C side, healed after 30 s"),
)
"""The default suite. Wrapper outages of 6 s outlast the neighbour-down time (3 s) plus the 2 s publication
hold, so every timer that gives up on a neighbour or a core fires during them."""

FAULTS = {fault.name: fault for fault in SUITE}

EXTENDED: tuple[tuple[str, Fault], ...] = (
    ("ring-split", Fault("split-both-sides", "partition", None, 20.0,
                         "partition a+b | c+d with subscribers on b and c, healed after 20 s")),
    ("ring-split", Fault("stop-core", "stop_wrapper", "subscriber", 6.0,
                         "SIGTERM the core's wrapper (c, subscribers on b and c) under load, restart after 6 s")),
    ("ring5", Fault("kill-two-wrappers", "kill_wrapper", "middle+bypass", 6.0,
                    "kill -9 two wrappers at once (c and e of a five-ring: d cut off), restart after 6 s")),
    ("line", Fault("disk-full-publisher", "disk_full", "publisher", 15.0,
                   "the publisher-side wrapper's state directory full for 15 s, then the wrapper restarted")),
    ("line", Fault("disk-full-subscriber", "disk_full", "subscriber", 15.0,
                   "the subscriber-side wrapper's state directory full for 15 s, then the wrapper restarted")),
)
"""The cases issue 37 added, each on its topology: subscribers on both sides of a partition, a core stopped cleanly
under load, two wrappers killed at once, a full disk on each side (the bulk flood is a load, not a fault:
`bulk.py`)."""
EXTENDED_FAULTS = {fault.name: fault for _topology, fault in EXTENDED}
AFTER_HEALING = 5.0
"""seconds after a case's fault heals that its follow-up (`FOLLOW_UPS`) is applied (a full disk's wrapper has found it
has room again by then: it probes every second)"""


def restart_after(name: str) -> Fault:
    """A clean restart of the wrapper a case's fault hit (SIGTERM, started again 3 s later), as an operator restarts
    a wedged one."""
    return Fault(f"{name}-restart", "stop_wrapper", EXTENDED_FAULTS[name].role, 3.0,
                 "restart that wrapper (SIGTERM, started again after 3 s)")


FOLLOW_UPS = {"disk-full-publisher": restart_after("disk-full-publisher"),
              "disk-full-subscriber": restart_after("disk-full-subscriber")}
"""a second fault of an extended case, `AFTER_HEALING` after the first heals: a wrapper restarted once its disk has
room again must not deliver a QoS 2 publication twice (issue 37 found 506 doubled on the publisher's side; on the
subscriber's side 1-7 were injected again, whose completion the full disk had refused to journal, until the journal
wrote what the disk refused once it had room)."""

BRIDGE_ANALOGUE = {
    "kill_wrapper": "the bridge connections of {node} reset and refused",
    "kill_broker": "kill -9 broker {node}",
    "pause_wrapper": "SIGSTOP broker {node} (it hosts the bridge)",
    "partition": "the bridge's TCP dropped between {sides}",
}


@dataclass(frozen=True)
class Topology:
    """Node names in order, the links, the node of each role, and the two sides of the partition."""

    name: str
    nodes: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
    roles: dict[str, str]
    publisher_side: tuple[str, ...]
    subscriber_side: tuple[str, ...]
    also_subscribing: tuple[str, ...] = ()
    """nodes with a subscriber of their own to every stream, beside the subscriber role's"""
    vids: tuple[tuple[str, int], ...] = ()
    """the wrappers' virtual ids where they are not the default (index + 1): the lowest subscriber is the core"""

    def node(self, role: str) -> str:
        try:
            return self.roles[role]
        except KeyError:
            raise ValueError(f"the {self.name} has no {role} node; its roles are {', '.join(self.roles)}") from None

    def cut_links(self) -> list[tuple[str, str]]:
        """The links the partition cuts (one end on each side)."""
        return [(a, b) for a, b in self.links
                if (a in self.publisher_side and b in self.subscriber_side)
                or (b in self.publisher_side and a in self.subscriber_side)]


LINE = Topology("line", ("a", "b", "c"), (("a", "b"), ("b", "c")),
                {"publisher": "a", "middle": "b", "subscriber": "c"}, ("a", "b"), ("c",))
"""A-B-C: publisher on a, subscriber on c; the partition cuts b-c."""
RING = Topology("ring", ("a", "b", "c", "d"), (("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")),
                {"publisher": "a", "middle": "b", "subscriber": "c", "bypass": "d"}, ("a", "b"), ("c", "d"))
"""A-B-C-D-A: two equal paths between a and c (through b and through d); the partition cuts b-c and d-a."""
RING_SPLIT = Topology("ring-split", RING.nodes, RING.links, dict(RING.roles), ("a", "b"), ("c", "d"), ("b",),
                      (("a", 3), ("b", 2), ("c", 1), ("d", 4)))
"""The ring with subscribers on both sides of its partition: on b (the publisher's side) and on c, the core (the
lowest id), so the publisher's side loses its core at the cut and b claims one of its own (issue 37's case)."""
RING5 = Topology("ring5", ("a", "b", "c", "d", "e"), (("a", "b"), ("b", "c"), ("c", "d"), ("d", "e"), ("e", "a")),
                 {"publisher": "a", "near": "b", "middle": "c", "subscriber": "d", "bypass": "e"}, ("a", "b"),
                 ("d",), ("b",), (("a", 3), ("b", 2), ("c", 4), ("d", 1), ("e", 5)))
"""A-B-C-D-E-A: subscribers on b and d, the core (the lowest id); c and e killed together cut d off from a and b,
whose side claims a core of its own."""
TOPOLOGIES = {topology.name: topology for topology in (LINE, RING, RING_SPLIT, RING5)}


def describe(fault: Fault, topology: Topology, bridge: bool) -> str:
    """What the fault does on this topology, in words (for the bridge chain: its analogue)."""
    if not bridge:
        if fault.kind == "partition":
            return (f"UDP dropped between {'+'.join(topology.publisher_side)} | {'+'.join(topology.subscriber_side)} "
                    f"for {fault.seconds:g} s")
        verb = {"kill_wrapper": "kill -9 wrapper", "kill_broker": "kill -9 broker",
                "pause_wrapper": "SIGSTOP wrapper", "stop_wrapper": "SIGTERM wrapper",
                "disk_full": "fill the state directory of wrapper"}[fault.kind]
        return f"{verb} {'+'.join(topology.node(role) for role in fault.roles)} for {fault.seconds:g} s"
    sides = f"{'+'.join(topology.publisher_side)} | {'+'.join(topology.subscriber_side)}"
    node = topology.node(fault.role) if fault.role is not None else ""
    return BRIDGE_ANALOGUE[fault.kind].format(node=node, sides=sides) + f" for {fault.seconds:g} s"
