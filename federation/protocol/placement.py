"""Where a topic core goes when it is not elected: rendezvous hashing and broker capability.

Theory of operation
-------------------
With interest-based election the first subscriber of a filter becomes its
core, and with many filters the brokers with the lowest ids end up holding
most cores. Rendezvous (highest-random-weight) hashing places the core of
filter F on the live member M with the highest `weight(F, M)`. Every node
computes the same weights (SHA-256, never Python's salted `hash()`), so all
agree on the winner once their tables agree, without messages; cores spread
evenly; and when a member joins or leaves, only the filters whose winner it
is (or becomes) move, about 1/N of them.

The weight of a member is taken from its address (`host:port`), not its
virtual id: an id can change after a collision, the address is the node.

Capability (seed 001, MQTT-ST) ranks brokers for the root of a fully
replicated tree: C = a·L + b·M with L the CPU speed in MHz summed over the
logical processors and M the memory in MiB, as read from /proc/cpuinfo and
/proc/meminfo at start-up. The parsing is pure here; reading the files is
the daemon's job (`federation.daemon.config`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from functools import lru_cache

from federation.protocol.types import Address, BrokerId

WEIGHT_BYTES = 8
"""the weight is the first 8 bytes of the SHA-256 digest, big-endian (an unsigned 64-bit integer)"""


@lru_cache(maxsize=65536)
def rendezvous_weight(filter_: str, address: Address) -> int:
    """weight(F, M) = SHA-256(UTF-8(F) + 0x00 + UTF-8("host:port")), first 8 bytes, big-endian."""
    digest = hashlib.sha256(filter_.encode("utf-8") + b"\x00" + f"{address.host}:{address.port}".encode())
    return int.from_bytes(digest.digest()[:WEIGHT_BYTES], "big")


def rendezvous_key(filter_: str, broker_id: BrokerId) -> tuple[int, BrokerId]:
    """Sort key: the lowest key wins (the highest weight; equal weights: the lowest BrokerId)."""
    return (-rendezvous_weight(filter_, broker_id.address), broker_id)


def rendezvous_winner(filter_: str, members: Iterable[BrokerId]) -> BrokerId | None:
    """The member with the highest weight for `filter_` (None when there are no members)."""
    best: BrokerId | None = None
    best_key: tuple[int, BrokerId] | None = None
    for member in members:
        key = rendezvous_key(filter_, member)
        if best_key is None or key < best_key:
            best, best_key = member, key
    return best


def cpu_mhz(cpuinfo: str) -> float:
    """The sum of the `cpu MHz` lines of /proc/cpuinfo (0 when the kernel gives none, e.g. on some ARM)."""
    total = 0.0
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip().lower() == "cpu mhz":
            try:
                total += float(value.strip())
            except ValueError:
                continue
    return total


def memory_mib(meminfo: str) -> float:
    """`MemTotal` of /proc/meminfo in MiB (0 when absent)."""
    for line in meminfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "MemTotal":
            parts = value.split()
            if parts and parts[0].isdigit():
                return int(parts[0]) / 1024  # the kernel writes kB (KiB)
    return 0.0


def capability(cpuinfo: str, meminfo: str, cpu_weight: float, memory_weight: float) -> int:
    """C = a·L + b·M (L: MHz over all logical processors, M: MiB), rounded to a whole number."""
    return max(0, round(cpu_weight * cpu_mhz(cpuinfo) + memory_weight * memory_mib(meminfo)))
