"""Neighbours given by name, resolved again while the wrapper runs.

Theory of operation: datagrams come from addresses, so the node knows its neighbours by address, and
config.py resolves the names once when it loads the configuration. A neighbour given by a DNS name may move
(a new VM, a failover address); a name resolved only at start would keep the wrapper sending to the old
address for ever. So every `neighbour_resolve_interval` seconds (60 by default), and on SIGHUP (which loads
the whole configuration again), the names are resolved again, in a worker thread (a resolver can block for
seconds), and the addresses found replace the old ones in the node (`Node.set_configured_neighbours`): the
link to a moved neighbour's old address goes down, the new address gets a hello at once.

A name that does not resolve now keeps the address it had, with a warning: a DNS outage must not cut links
that work. Numeric neighbours are never looked up.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from federation.daemon.config import ConfigError, Resolver, resolve_neighbour
from federation.protocol.types import Address

Names = tuple[tuple[Address, Address], ...]
"""each neighbour as given (its host perhaps a name) with the address it resolved to (`DaemonConfig`)"""


def is_name(host: str) -> bool:
    """A host that must be resolved (not an IPv4 or IPv6 address)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return True
    return False


def has_names(names: Names) -> bool:
    return any(is_name(given.host) for given, _address in names)


def resolve_again(names: Names, family: int, resolver: Resolver) -> tuple[Names, list[str]]:
    """Every name resolved anew: (the pairs with the addresses found now, the problems). A name that does not
    resolve keeps its address; each problem is a line that names it."""
    found: list[tuple[Address, Address]] = []
    problems: list[str] = []
    for given, address in names:
        if is_name(given.host):
            try:
                address = resolve_neighbour(resolver, given, family, "neighbour_resolve_interval")
            except ConfigError as error:
                problems.append(f"{error}; still using {address}")
        found.append((given, address))
    return tuple(found), problems


def addresses(names: Names, announced: Address) -> tuple[Address, ...]:
    """The neighbour addresses of `names`, each once, in order, without this node's own."""
    found: list[Address] = []
    for _given, address in names:
        if address != announced and address not in found:
            found.append(address)
    return tuple(found)


def moved(before: Sequence[tuple[Address, Address]], after: Sequence[tuple[Address, Address]]) -> list[str]:
    """`name:port old -> new` for every name whose address changed, for the log."""
    return [f"{given} {old} -> {new}" for (given, old), (_same, new) in zip(before, after, strict=True) if old != new]
