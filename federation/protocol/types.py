"""Small value types shared by the protocol engine, the simulator and the daemon."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Address(NamedTuple):
    """A wrapper's UDP endpoint. Sorting is by host string, then port."""

    host: str
    port: int

    def __str__(self) -> str:
        # An IPv6 host in brackets, so the text parses back (`parse`) and reads as the usual notation.
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str, default_port: int) -> Address:
        """Parse ``host``, ``host:port`` or ``[v6]:port``; raises ValueError with the reason."""
        text = text.strip()
        if not text:
            raise ValueError("empty address")
        if text.startswith("["):
            host, _, rest = text[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
        elif text.count(":") == 1:
            host, port_text = text.split(":")
        else:
            host, port_text = text, ""
        port = default_port
        if port_text:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise ValueError(f"bad port {port_text!r} in {text!r}: expected 1-65535")
            port = int(port_text)
        return cls(host, port)


class BrokerId(NamedTuple):
    """(virtual id, address): the lowest BrokerId wins every election."""

    vid: int
    address: Address

    def __str__(self) -> str:
        return f"{self.vid}@{self.address}"


PublicationId = tuple[Address, int, int]
"""(origin address, origin boot epoch, per-epoch sequence number)."""


@dataclass(slots=True, unsafe_hash=True)  # one per delivered publication: not frozen (see wire.Sender)
class Injection:
    """A remote publication the daemon must publish into the local broker, once, in the order given.

    For QoS 1/2 the embedder reports it done (`Node.injection_done`) once the broker has it: the node
    acknowledges its copy only then (custody). To keep order and duplicates across its own restart, the
    embedder journals (`publication`, `filter`): `publication` is the position (its epoch and seq) of the
    stream (origin, `filter`) it was released from (`Node.restore` takes both back)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict[str, Any] | None
    publication: PublicationId
    filter: str | None = None
    """the federated filter whose stream released it (None where a caller built one without)"""
    unmatched_hops: int | None = None
    """set when it came on a filter the local broker federates and matched no local subscription the node knew
    (`Node.hold_unmatched`): its hop count here. The embedder holds it until it has read its broker's subscriptions
    up to a point after it arrived, then asks `Node.settle_unmatched` whether to inject it"""


@dataclass(slots=True)
class InjectionRun:
    """QoS 0 publications of one stream (origin, epoch, filter) for the local broker, in order: what an
    `Injection` each, neither retained nor with properties, would say, in lists. The node makes one for a `tb`
    it takes whole (federation.protocol.publications); `Node.injections_to_make` hands them out as their
    `Injection`s, `Node.injections_and_runs_to_make` as they are (the daemon writes a run's PUBLISH packets
    without an object per publication)."""

    topics: list[str]
    payloads: list[bytes]
    origin: Address
    epoch: int
    seqs: list[int]
    filter: str

    def injections(self) -> list[Injection]:
        origin, epoch, filter_ = self.origin, self.epoch, self.filter
        return [Injection(topic, payload, 0, False, None, (origin, epoch, seq), filter_)
                for seq, topic, payload in zip(self.seqs, self.topics, self.payloads, strict=True)]

    def __len__(self) -> int:
        return len(self.seqs)


def only_runs(injections: list[Injection | InjectionRun]) -> list[InjectionRun]:
    """`injections` if every one is an `InjectionRun`, else an empty list."""
    if all(type(item) is InjectionRun for item in injections):
        return injections  # type: ignore[return-value]  # checked: all are runs
    return []


def expand_runs(injections: list[Injection | InjectionRun]) -> list[Injection]:
    """`injections` with each `InjectionRun` as its `Injection`s, in order."""
    if not any(type(item) is InjectionRun for item in injections):
        return injections  # type: ignore[return-value]  # checked: none is a run
    expanded: list[Injection] = []
    for item in injections:
        if type(item) is InjectionRun:
            expanded += item.injections()
        else:
            expanded.append(item)  # type: ignore[arg-type]  # not a run
    return expanded


@dataclass(slots=True)
class Event:
    """One structured trace record; `to_json_dict` gives the documented line format.

    Not frozen: a frozen dataclass sets every field through `object.__setattr__`, and a wrapper makes three
    events per forwarded publication. Nothing mutates an event after it is made."""

    time: float
    node: str
    type: str
    fields: dict[str, Any] = field(default_factory=dict)

    def to_json_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {"v": EVENT_SCHEMA_VERSION, "t": round(self.time, 6), "node": self.node,
                                  "type": self.type}
        record.update(self.fields)
        return record


EVENT_SCHEMA_VERSION = 2
"""2: the per-publication events are one per run of publications (docs/events.md, "Version 1")"""
