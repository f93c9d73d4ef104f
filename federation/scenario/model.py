"""The backend-neutral scenario: what a test does, not how a backend does it.

The loader (`federation.scenario.loader`) builds these from YAML and checks
them; the simulator and the real-process backends execute them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from federation.protocol.settings import Settings


@dataclass(frozen=True)
class NodeSpec:
    name: str
    vid: int | None = None
    """virtual id; None lets the node draw one from the seeded RNG"""
    settings: dict[str, Any] = field(default_factory=dict)
    """per-node overrides merged over the scenario's settings"""


@dataclass(frozen=True)
class Subscribe:
    at: float
    node: str
    client: str
    filter: str
    qos: int = 0


@dataclass(frozen=True)
class Unsubscribe:
    at: float
    node: str
    client: str
    filter: str


@dataclass(frozen=True)
class Disconnect:
    at: float
    node: str
    client: str


@dataclass(frozen=True)
class Publish:
    at: float
    node: str
    topic: str
    count: int = 1
    interval: float = 0.0
    qos: int = 0
    retain: bool = False
    payload_size: int = 0
    """extra payload bytes beyond the id and send time the backend puts in every payload"""


@dataclass(frozen=True)
class Cut:
    at: float
    a: str
    b: str
    oneway: bool = False
    """True: only packets from a to b are dropped"""


@dataclass(frozen=True)
class Heal:
    at: float
    a: str
    b: str


@dataclass(frozen=True)
class Kill:
    at: float
    node: str


@dataclass(frozen=True)
class Restart:
    at: float
    node: str
    broker: bool = False
    """real backends: restart the broker too (the simulator models the wrapper only)"""


@dataclass(frozen=True)
class Loss:
    at: float
    percent: float
    link: tuple[str, str] | None = None
    """None: every link"""


ScenarioEvent = Subscribe | Unsubscribe | Disconnect | Publish | Cut | Heal | Kill | Restart | Loss

DISRUPTIONS = (Cut, Heal, Kill, Restart, Loss)
"""Event kinds after which the report measures convergence again."""


@dataclass(frozen=True)
class LinkDefaults:
    """Simulator link model; real backends ignore what they cannot emulate."""

    latency: float = 0.001
    """seconds, one way"""
    jitter: float = 0.0
    """seconds, uniform extra delay per packet (reorders packets when > 0)"""
    loss: float = 0.0
    """percent of packets dropped"""
    duplicate: float = 0.0
    """percent of packets delivered twice"""


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str
    """file the scenario came from (for messages)"""
    nodes: tuple[NodeSpec, ...]
    links: tuple[tuple[str, str], ...]
    settings: Settings
    duration: float
    events: tuple[ScenarioEvent, ...]
    """sorted by time; ties keep file order"""
    link_model: LinkDefaults = LinkDefaults()
    settle: float = 5.0
    """seconds: the convergence bound used by the `expected` delivery rule"""

    def node_names(self) -> list[str]:
        return [node.name for node in self.nodes]

    def neighbours_of(self, name: str) -> list[str]:
        result = [b for a, b in self.links if a == name] + [a for a, b in self.links if b == name]
        return sorted(set(result))

    def settings_for(self, name: str) -> Settings:
        spec = next(node for node in self.nodes if node.name == name)
        if not spec.settings:
            return self.settings
        merged = {f: getattr(self.settings, f) for f in self.settings.__dataclass_fields__}
        merged.update(spec.settings)
        return Settings.from_mapping(merged, where=f"{self.source}: nodes.{name}.settings")
