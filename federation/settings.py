"""Every protocol setting, with its default and unit, in one validated object.

The daemon's YAML file, the scenario files' `settings:` block and the
simulator all build this object through `Settings.from_mapping`, so one place
names a bad field and says how to fix it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


class SettingsError(ValueError):
    """A setting is unknown or out of range; the message names the field and the fix."""


@dataclass(frozen=True)
class Settings:
    # Neighbour liveness.
    hello_interval: float = 1.0
    """seconds between hello (`hl`) packets to each neighbour"""
    dead_intervals: int = 3
    """a neighbour is down after this many hello intervals without a hello back"""

    # Overlay (link-state announcements).
    announce_interval: float = 5.0
    """seconds between periodic refreshes of `fd`, `ca`, `tc` and `ts` (repair only)"""
    expire_intervals: int = 3
    """announcements not refreshed for this many announce intervals are dropped"""
    min_announce_gap: float = 0.02
    """seconds: triggered announcements of one origin are at least this far apart"""

    # Topic meshes.
    redundancy: int = 2
    """parents per mesh member toward the topic core (neighbours on shortest paths)"""
    publication_hold: float = 2.0
    """seconds a publication waits for a topic core being elected before it is dropped"""
    max_held_publications: int = 1000
    """publications held while cores are elected; the oldest is dropped beyond this"""
    max_hops: int = 64
    """a topic message is dropped after this many hops (a guard; meshes are loop-free by dedup)"""

    # Caches and limits.
    duplicate_cache_size: int = 65536
    """remembered publication ids per node (LRU) for duplicate suppression"""
    max_datagram: int = 1400
    """bytes: bundles of control records are split to stay under this size"""
    max_packet: int = 65507
    """bytes: a received datagram above this size is dropped (`oversized`)"""
    max_neighbours: int = 64
    """neighbours (configured plus those that said hello first)"""
    max_nodes: int = 10000
    """entries in the federation table"""
    max_topics: int = 10000
    """federated filters known at once"""

    # Observability.
    stats_interval: float = 10.0
    """seconds between `counters` events (packets and bytes by type)"""
    rtt_smoothing: float = 0.125
    """weight of a new RTT sample in the smoothed RTT (as TCP's alpha)"""

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None, where: str = "settings") -> Settings:
        """Build from a YAML-like mapping; unknown keys and bad values raise SettingsError."""
        values = dict(values or {})
        known = {f.name: f for f in fields(cls)}
        for key in values:
            if key not in known:
                raise SettingsError(
                    f"{where}: unknown setting {key!r}; known settings are: {', '.join(sorted(known))}"
                )
        converted: dict[str, Any] = {}
        for key, value in values.items():
            default = known[key].default
            if isinstance(default, bool) or not isinstance(value, (int, float)) or isinstance(value, bool):
                raise SettingsError(f"{where}.{key}: expected a number, got {value!r}")
            if isinstance(default, int) and not isinstance(default, bool):
                if isinstance(value, float) and not value.is_integer():
                    raise SettingsError(f"{where}.{key}: expected a whole number, got {value!r}")
                value = int(value)
            else:
                value = float(value)
            converted[key] = value
        settings = dataclasses.replace(cls(), **converted)
        settings.validate(where)
        return settings

    def validate(self, where: str = "settings") -> None:
        positive = [
            "hello_interval", "announce_interval", "dead_intervals", "expire_intervals",
            "redundancy", "max_hops", "duplicate_cache_size", "max_neighbours", "max_nodes",
            "max_topics", "stats_interval", "max_held_publications",
        ]
        for name in positive:
            if getattr(self, name) <= 0:
                raise SettingsError(f"{where}.{name}: must be greater than 0, got {getattr(self, name)!r}")
        for name in ("min_announce_gap", "publication_hold"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{where}.{name}: must not be negative, got {getattr(self, name)!r}")
        if not 0 < self.rtt_smoothing <= 1:
            raise SettingsError(f"{where}.rtt_smoothing: must be in (0, 1], got {self.rtt_smoothing!r}")
        if self.max_datagram < 512:
            raise SettingsError(f"{where}.max_datagram: must be at least 512 bytes, got {self.max_datagram!r}")
        if self.max_packet < self.max_datagram:
            raise SettingsError(f"{where}.max_packet: must be at least max_datagram ({self.max_datagram})")

    @property
    def neighbour_dead_after(self) -> float:
        return self.hello_interval * self.dead_intervals

    @property
    def announcement_lifetime(self) -> float:
        return self.announce_interval * self.expire_intervals

    @classmethod
    def documentation(cls) -> list[tuple[str, Any, str]]:
        """(name, default, description) for every setting, read from the docstrings above."""
        import ast
        import inspect

        source = inspect.getsource(cls)
        tree = ast.parse(source)
        docs: dict[str, str] = {}
        body = tree.body[0].body  # type: ignore[attr-defined]
        for index, statement in enumerate(body):
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                following = body[index + 1] if index + 1 < len(body) else None
                if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
                    docs[statement.target.id] = str(following.value.value)
        return [(f.name, f.default, docs.get(f.name, "")) for f in fields(cls)]
