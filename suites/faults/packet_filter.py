"""Cutting traffic between loopback addresses with nftables, in a table of the run's own.

Theory of operation: every node of a local federation owns a loopback address
(127.0.x.y), and its wrapper sends its UDP from that address, port 10500, to
its neighbours' addresses; in the bridge chain every broker takes its bridge
on a port of its own (`setups.BRIDGE_PORT`). So a rule on `lo`'s input hook
that matches source and destination address (and protocol and port) cuts
exactly one link and nothing else: status queries, clients and other
engineers' federations on other addresses are untouched.

A `PacketFilter` owns one table, `inet mqf_faults_<pid>_<n>`, made on the
first `block` and deleted by `close` (also from `atexit`, so an exception or
a normal exit never leaves it behind; after a SIGKILL,
`python -m suites.faults cleanup` deletes the tables of processes
that no longer exist). Each `block` installs one named set of rules and
returns a key; `unblock(key)` removes those rules again. The whole rule set is
rewritten on every change (one `nft -f` transaction: delete the table's chain
contents, add every current rule), so what is installed is always exactly
`self.rules`.

Two actions: `drop` (packets vanish: a partition, TCP retransmits until it
heals) and `reset` (TCP only: the connection is refused with a reset at once
and every reconnection attempt too, as if the process behind the port had
died).
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import re
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from federation.harness.processes import find_tool

TABLE_PREFIX = "mqf_faults_"
_TABLE_NAME = re.compile(rf"^{TABLE_PREFIX}(\d+)_\d+$")
_tables = itertools.count(1)


class FilterError(Exception):
    """nft is missing, refused a rule, or the process may not change the firewall (needs root)."""


@dataclass(frozen=True)
class Cut:
    """Traffic from any of `sources` to any of `destinations` (addresses), one protocol and port."""

    sources: tuple[str, ...]
    """empty: any source"""
    destinations: tuple[str, ...]
    protocol: str
    """"udp" or "tcp\""""
    port: int
    """the destination port; with `both_ways`, the reverse direction matches it as the source port"""
    action: str = "drop"
    """"drop", or "reset" (TCP only)"""
    both_ways: bool = True

    def __post_init__(self) -> None:
        if self.protocol not in ("udp", "tcp"):
            raise ValueError(f"protocol {self.protocol!r}: udp or tcp")
        if self.action not in ("drop", "reset") or (self.action == "reset" and self.protocol != "tcp"):
            raise ValueError(f"action {self.action!r}: drop, or reset for tcp")
        if not self.destinations:
            raise ValueError("a cut needs at least one destination address")

    def rules(self) -> list[str]:
        """The nft rules of this cut (input hook on lo)."""
        # The reset a rule sends back is a packet on lo too: the other direction's rule must let it pass.
        verdict = "tcp flags & rst != rst reject with tcp reset" if self.action == "reset" else "drop"
        forward = (f'iifname "lo" {_match("saddr", self.sources)}ip daddr {_address_set(self.destinations)} '
                   f"{self.protocol} dport {self.port} {verdict}")
        if not self.both_ways:
            return [forward]
        backward = (f'iifname "lo" ip saddr {_address_set(self.destinations)} {_match("daddr", self.sources)}'
                    f"{self.protocol} sport {self.port} {verdict}")
        return [forward, backward]


def _address_set(addresses: Sequence[str]) -> str:
    return addresses[0] if len(addresses) == 1 else "{ " + ", ".join(sorted(addresses)) + " }"


def _match(field: str, addresses: Sequence[str]) -> str:
    """`ip saddr X ` (with its trailing space), or nothing for any address."""
    return f"ip {field} {_address_set(addresses)} " if addresses else ""


def render_table(table: str, rules: Iterable[str]) -> str:
    """The nft script that (re)defines the table with exactly these rules."""
    body = "\n".join(f"    {rule}" for rule in rules)
    return (f"table inet {table} {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n"
            f"{body}\n  }}\n}}\n")


class PacketFilter:
    """The run's own nftables table; see the module docstring."""

    def __init__(self) -> None:
        self.table = f"{TABLE_PREFIX}{os.getpid()}_{next(_tables)}"
        self.cuts: dict[int, Cut] = {}
        self._keys = itertools.count(1)
        self._made = False
        atexit.register(self.close)

    @property
    def rules(self) -> list[str]:
        return [rule for key in sorted(self.cuts) for rule in self.cuts[key].rules()]

    def block(self, cut: Cut) -> int:
        """Install a cut; the key to `unblock` it."""
        key = next(self._keys)
        self.cuts[key] = cut
        try:
            self._install()
        except BaseException:
            del self.cuts[key]
            raise
        return key

    def unblock(self, key: int) -> None:
        """Remove one cut (nothing if it is not installed)."""
        if self.cuts.pop(key, None) is not None:
            self._install()

    def close(self) -> None:
        """Delete the table. Idempotent; never raises."""
        self.cuts.clear()
        if self._made:
            delete_table(self.table)
            self._made = False

    def _install(self) -> None:
        script = render_table(self.table, self.rules)
        if self._made:
            script = f"flush chain inet {self.table} input\n" + script
        _nft(script)
        self._made = True


def _nft(script: str) -> None:
    nft = find_tool("nft")
    if nft is None:
        raise FilterError("the nft command is missing: apt-get install -y nftables")
    result = subprocess.run([nft, "-f", "-"], input=script, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise FilterError(f"nft refused the rules ({result.stderr.strip()}); partitions need root and "
                          f"nftables:\n{script}")


def delete_table(table: str) -> None:
    nft = find_tool("nft")
    if nft is not None:
        subprocess.run([nft, "delete", "table", "inet", table], capture_output=True, check=False)


def leftover_tables() -> list[str]:
    """Our tables whose process no longer runs (a run killed with SIGKILL)."""
    nft = find_tool("nft")
    if nft is None:
        return []
    result = subprocess.run([nft, "-j", "list", "tables", "inet"], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return []
    found = []
    for entry in json.loads(result.stdout or "{}").get("nftables", []):
        name = entry.get("table", {}).get("name", "")
        match = _TABLE_NAME.match(name)
        if match and not os.path.exists(f"/proc/{match.group(1)}"):
            found.append(name)
    return sorted(found)
