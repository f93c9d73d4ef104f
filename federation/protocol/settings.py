"""Every protocol setting, with its default and unit, in one validated object.

The daemon's YAML file, the scenario files' `settings:` block and the
simulator all build this object through `Settings.from_mapping`, so one place
names a bad field and says how to fix it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from federation.protocol.modes import MODE_SETTINGS, RuleSetting, parse_mode_setting

LOOPBACK_DATAGRAM = 65507
"""bytes: `max_datagram` chosen when a node and all its neighbours are on loopback (the largest IPv4 UDP
payload; loopback's MTU is 64 KiB, so nothing is fragmented)"""
NETWORK_DATAGRAM = 1400
"""bytes: `max_datagram` chosen otherwise (crosses a 1500-byte Ethernet path, with room for a tunnel's
headers, without IP fragmentation)"""


REMOVED = {
    "retransmit_limit": "QoS 1/2 copies are now sent again for as long as their next hop is up, and routed "
                        "elsewhere when it goes down; nothing acknowledged is given up (docs/protocol.md rule 7a)",
}
"""settings that existed once, and why they went: a file that still sets one gets that reason"""


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
    """seconds between periodic digests (`dd`) and refreshes of `ca`, `tc` and `ts` (repair only)"""
    expire_intervals: int = 3
    """announcements not refreshed for this many announce intervals are dropped"""
    min_announce_gap: float = 0.02
    """seconds: triggered announcements of one origin are at least this far apart"""
    spf_delay: float = 0.01
    """seconds from a federation-table change to the route computation (changes in between share it)"""
    spf_hold: float = 0.05
    """seconds: route computations are at least this far apart (as OSPF's SPF hold time)"""
    flood_delay: float = 0.005
    """seconds a received record waits before it is forwarded, so records arriving together leave as one bundle"""

    # Topic meshes.
    redundancy: int = 2
    """parents per mesh member toward the topic core (neighbours on shortest paths)"""
    data_parents: int = 1
    """of a member's parents, how many carry publications (the first that are up, lowest ids first); the others
    are standby, kept with `ts` and promoted at once when a data parent goes down. 1: publications cross a tree;
    `redundancy` or more: every mesh link, a copy from each parent"""
    publication_hold: float = 2.0
    """seconds a QoS 0 publication waits for a topic core (or a route) before it is dropped; QoS 1/2 ones wait
    until they can go on (`reliable_hold`)"""
    retained_tree_wait: float = 0.5
    """seconds a node that makes the retained publications' tree (at its first retained publication) holds its
    retained publications, so that every node of the component hears of the tree and joins it first"""
    max_held_publications: int = 1000
    """publications held for want of a core or a route; beyond it the oldest QoS 0 one is dropped, else the
    oldest QoS 1/2 one held for a neighbour (left unacknowledged: its sender still has it); a node's own
    QoS 1/2 publications are not dropped (its embedder's spool bounds them, and `reliable_hold`)"""
    reliable_hold: float = 3600.0
    """seconds a QoS 1/2 publication waits for a core or a route at most; then it is dropped (`no_core`,
    reported): a filter whose core stays gone that long has lost its subscribers"""
    receiver_hold: float = 3600.0
    """seconds a QoS 1/2 publication stays in its origin's custody for a broker that subscribed to its filter and
    does not have it (cut off by a partition, its wrapper down: docs/protocol.md rule 7f) at most; then it is given up
    for that broker (drop `receiver_hold_expired`, reported)"""
    max_awaiting: int = 100000
    """own QoS 1/2 publications kept for brokers that do not have them yet, at most; beyond it the oldest is given
    up for them (drop `receiver_hold_full`, reported)"""
    max_awaiting_bytes: int = 67108864
    """bytes of payload of those publications at most, with the same rule as `max_awaiting`"""
    repair_window: int = 64
    """repair copies (rule 7f) on their way to one broker at once"""
    max_held_bytes: int = 67108864
    """bytes of payload held at most, with the same rule as `max_held_publications`"""
    max_hops: int = 64
    """a topic message is dropped after this many hops (a guard; meshes are loop-free by dedup)"""
    aggregate_fanout: int = 32
    """a level of the local subscriptions' filters with more distinct values than this is federated as `+`
    (`dev/+/cmd` for ten thousand `dev/<id>/cmd`: one mesh instead of thousands; publications to devices with no
    subscriber here then reach this broker's wrapper too, which injects only what a local subscription matches);
    0: filters federated one by one (a filter another local one covers is never federated on its own)"""
    aggregate_delay: float = 0.02
    """seconds: a change of the federated filters after a quiet spell this long reaches the mesh at once, the
    changes within it when it ends (a burst of subscriptions is judged whole: its first filters are not claimed,
    then withdrawn when the fan-out passes); 0: every change at once"""
    aggregate_linger: float = 10.0
    """seconds at most a federated filter the aggregation replaced stays, while the meshes replacing it are
    joined (it leaves as soon as they are)"""

    # Reliable forwarding of QoS 1 and 2 publications (federation.protocol.reliable).
    retransmit_timeout: float = 0.2
    """seconds before a QoS 1/2 `tm` not acknowledged (`ta`) by the next hop is sent again (at least 2 x its RTT)"""
    retransmit_timeout_max: float = 3.2
    """seconds: the retransmission timeout doubles after every try (plus up to 25% jitter), up to this"""
    max_unacked: int = 4096
    """QoS 1/2 `tm` copies awaiting an acknowledgement, all neighbours together: from 7/8 of it new copies from
    neighbours are refused (left unacknowledged); beyond it the oldest replayed copy (rule 7a) is forgotten"""
    max_unacked_bytes: int = 268435456
    """bytes of payload of those copies: from 7/8 of it new copies from neighbours are refused too (a safety net:
    the origins' backpressure windows, in copies and in bytes, bound what reaches a hop long before)"""
    max_recent_bytes: int = 16777216
    """bytes of payload of the recent QoS 1/2 publications kept for new mesh neighbours (rule 7a, "Mesh changes",
    with `max_unacked` of them at most): beyond it the oldest are forgotten early (large publications)"""

    # Order of publications at the receiver (federation.protocol.ordering, docs/protocol.md rule 7d).
    reorder_timeout: float = 10.0
    """seconds a QoS 1/2 stream waits for an earlier publication without moving before that one is skipped (long
    enough for a reroute: the neighbour-down time, routes, a few retransmissions; a backlog that keeps coming is
    waited for, and a gap whose origin is out of reach up to `receiver_hold`)"""
    reorder_start: float = 1.0
    """seconds a receiver waits, when a stream first reaches it with a publication that has a predecessor, for
    the earlier ones in flight (none come if it joined after them); 0: start at the first one at once"""
    reorder_max: int = 10000
    """QoS 1/2 publications waiting for an earlier one, all streams together; beyond it the oldest gap is skipped"""
    reorder_max_stream: int = 10000
    """QoS 1/2 publications waiting for an earlier one in one stream; beyond it that stream's gap is skipped (as many
    as in all: after a 30 s partition at 100/s an origin's 3,000 held publications may wait for a relay's few)"""
    reorder_max_bytes: int = 67108864
    """bytes of payload waiting for earlier publications, all streams together; beyond it the oldest gap is skipped"""
    max_streams: int = 16384
    """streams (origin, filter) whose order a receiver remembers; beyond it the least recently used idle ones are
    forgotten (a stream forgotten starts again at the next publication it brings)"""

    # Caches and limits.
    duplicate_cache_size: int = 65536
    """publication ids a node remembers for duplicate suppression, at most (the last half always)"""
    max_datagram: int = 0
    """bytes: largest UDP datagram sent (batched, fragmented to fit); 0: 65507 if all neighbours are on loopback,
    else 1400"""
    max_packet: int = 16842752
    """bytes: largest protocol packet, reassembled included (`oversized` above): a publication with its topic
    (16 MiB + 64 KiB)"""
    max_publication_bytes: int = 16777216
    """bytes: largest publication payload federated (16 MiB); a larger one is refused (logged, counted), never
    truncated. Set the broker's `message_size_limit` to the same value (docs/install.md)"""
    bulk_threshold: int = 65536
    """bytes: a packet above it crosses each hop as a bulk transfer (window, selective acknowledgement,
    retransmission of lost fragments: docs/protocol.md "Bulk transfers"); smaller ones as plain fragments"""
    transfer_memory: int = 67108864
    """bytes held at most by bulk transfers being received, all senders together, each sender an even share
    while several want room (and by bulk transfers queued to send)"""
    transfer_timeout: float = 30.0
    """seconds without an acknowledgement (sender) or a new fragment (receiver) before a bulk transfer is
    given up"""
    reassembly_timeout: float = 5.0
    """seconds a fragmented packet waits for its missing fragments before it is dropped"""
    reassembly_memory: int = 8388608
    """bytes of memory partly received fragmented packets hold at most, all senders together, bookkeeping
    included (the oldest of the sender holding the most evicted)"""
    max_neighbours: int = 64
    """neighbours (configured plus those that said hello first)"""
    max_nodes: int = 10000
    """entries in the federation table"""
    max_topics: int = 10000
    """federated filters known at once"""

    # Federation modes (docs/modes.md); the same on every node, except `owned` and `capability*`.
    replication: RuleSetting = "interest"
    """`interest` (to subscribers only), `full` (every broker, one tree: MQTT-ST) or {filter: full, ...}"""
    replication_root: str = "lowest_id"
    """root (core) of a replicated filter: `lowest_id`, or `capability` (highest C = a·L + b·M, ties by lowest id)"""
    core_placement: RuleSetting = "election"
    """`election` (lowest-id subscriber), `hash` (rendezvous over live members) or {filter: hash, ...}"""
    owned: tuple[str, ...] = ()
    """topic subtrees this node owns, e.g. ["kitchen/#"]: it is the core of every filter inside them"""
    capability: int = 0
    """this node's capability for `replication_root: capability`; 0: the daemon measures it at start-up"""
    capability_cpu_weight: float = 1.0
    """a in C = a·L + b·M: weight per MHz of CPU (summed over logical processors)"""
    capability_memory_weight: float = 1.0
    """b in C = a·L + b·M: weight per MiB of memory"""

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
            if key in REMOVED:
                raise SettingsError(f"{where}: the setting {key!r} was removed: {REMOVED[key]}; delete it")
            if key not in known:
                raise SettingsError(
                    f"{where}: unknown setting {key!r}; known settings are: {', '.join(sorted(known))}"
                )
        converted: dict[str, Any] = {}
        for key, value in values.items():
            if key in MODE_SETTINGS:
                try:
                    converted[key] = parse_mode_setting(key, value, f"{where}.{key}")
                except ValueError as error:
                    raise SettingsError(str(error)) from None
                continue
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
            "redundancy", "data_parents", "max_hops", "duplicate_cache_size", "max_neighbours", "max_nodes",
            "max_topics", "stats_interval", "max_held_publications", "retransmit_timeout", "retransmit_timeout_max",
            "max_unacked", "max_unacked_bytes", "max_recent_bytes", "max_held_bytes", "reliable_hold",
            "reorder_timeout", "reorder_max", "reorder_max_stream",
            "reorder_max_bytes", "max_streams", "transfer_timeout", "receiver_hold", "max_awaiting",
            "max_awaiting_bytes", "repair_window",
        ]
        for name in positive:
            if getattr(self, name) <= 0:
                raise SettingsError(f"{where}.{name}: must be greater than 0, got {getattr(self, name)!r}")
        for name in ("min_announce_gap", "publication_hold", "retained_tree_wait", "spf_delay", "spf_hold",
                     "flood_delay", "reorder_start", "aggregate_fanout", "aggregate_linger",
                     "aggregate_delay"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{where}.{name}: must not be negative, got {getattr(self, name)!r}")
        for name in ("capability", "capability_cpu_weight", "capability_memory_weight"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{where}.{name}: must not be negative, got {getattr(self, name)!r}")
        if self.retransmit_timeout_max < self.retransmit_timeout:
            raise SettingsError(f"{where}.retransmit_timeout_max: must be at least retransmit_timeout "
                                f"({self.retransmit_timeout}), got {self.retransmit_timeout_max!r}")
        if not 0 < self.rtt_smoothing <= 1:
            raise SettingsError(f"{where}.rtt_smoothing: must be in (0, 1], got {self.rtt_smoothing!r}")
        if self.max_datagram != 0 and not 512 <= self.max_datagram <= LOOPBACK_DATAGRAM:
            raise SettingsError(f"{where}.max_datagram: must be 512 to {LOOPBACK_DATAGRAM} bytes, or 0 to let the "
                                f"wrapper choose, got {self.max_datagram!r}")
        if self.max_packet < self.max_datagram:
            raise SettingsError(f"{where}.max_packet: must be at least max_datagram ({self.max_datagram})")
        if self.max_publication_bytes <= 0 or self.max_packet < self.max_publication_bytes + 1024:
            raise SettingsError(f"{where}.max_publication_bytes: must be positive and at least 1024 bytes below "
                                f"max_packet ({self.max_packet}), got {self.max_publication_bytes!r}; raise max_packet "
                                f"with it (the default leaves 64 KiB for topic and properties)")
        if self.reassembly_timeout <= 0:
            raise SettingsError(f"{where}.reassembly_timeout: must be greater than 0, got {self.reassembly_timeout!r}")
        fragmented = min(self.max_packet, self.bulk_threshold) if self.bulk_threshold else self.max_packet
        if self.reassembly_memory < 2 * fragmented:
            raise SettingsError(f"{where}.reassembly_memory: must hold two fragmented packets of min(max_packet, "
                                f"bulk_threshold) (at least {2 * fragmented}), got {self.reassembly_memory!r}")
        if self.bulk_threshold < 0:
            raise SettingsError(f"{where}.bulk_threshold: must not be negative (0: no bulk transfers), got "
                                f"{self.bulk_threshold!r}")
        if self.bulk_threshold and self.transfer_memory < self.max_packet + 65536:
            raise SettingsError(f"{where}.transfer_memory: must hold one packet of max_packet and 64 KiB more "
                                f"(at least {self.max_packet + 65536}), got {self.transfer_memory!r}")

    def with_datagram_for(self, hosts: Iterable[str]) -> Settings:
        """These settings with `max_datagram` 0 (choose) made a size for a node whose own and neighbours'
        addresses are `hosts`: loopback only, nothing leaves the host and the whole 64 KiB fit one datagram
        (runs of publications then travel in a few large datagrams instead of many small ones); any other
        address, one datagram must cross an Ethernet path whole."""
        if self.max_datagram:
            return self
        size = LOOPBACK_DATAGRAM if all(_is_loopback(host) for host in hosts) else NETWORK_DATAGRAM
        return dataclasses.replace(self, max_datagram=min(size, self.max_packet))

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
                    docs[statement.target.id] = " ".join(str(following.value.value).split())
        return [(f.name, f.default, docs.get(f.name, "")) for f in fields(cls)]


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: resolved by the daemon before this, so not a loopback address we know of
        return False
