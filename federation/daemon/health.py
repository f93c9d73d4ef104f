"""Is the wrapper ready? One judgement, shown by `/readyz`, by `wrapper.py status` and by its exit status.

Theory of operation: a wrapper is useful when publications can cross it,
which needs three things: the broker connection up, the broker's log
reaching the wrapper (without it no local subscription is learned, and
nothing is federated to this broker's clients; the broker logs the
wrapper's own SUBSCRIBE, so a working connection always has a line), and,
when neighbours are configured, at least one of them up (without a
neighbour nothing leaves or arrives). A wrapper configured without
neighbours waits for hellos and is ready on its broker alone.

`readiness` is a pure function of those facts, so the HTTP server (in
its own thread) and the status document (on the loop) give the same
answer with the same reasons; the numbers are read on the loop thread
that owns them (snapshots.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from federation.protocol.types import Address


@dataclass(frozen=True)
class Readiness:
    """Ready, or not with the reasons a person can act on."""

    ready: bool
    reasons: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"ready": self.ready, "reasons": list(self.reasons)}


def readiness(broker: Address, connected: bool, log_flowing: bool, problem: str | None,
              neighbours_configured: int, neighbours_up: int, node_problems: tuple[str, ...] = ()) -> Readiness:
    """The wrapper's readiness from the state of its broker connection and of its neighbours, and what the node
    says it cannot serve (`Node.limits_problem`)."""
    reasons = list(node_problems)
    if not connected:
        reasons.append(f"not connected to broker {broker}" + (f": {problem}" if problem else ""))
    elif not log_flowing:
        reasons.append(f"broker {broker} sends no log lines on $SYS/broker/log/# yet (its mosquitto.conf needs "
                       f"`log_dest topic` and `log_type all`, and its ACL must let the wrapper read them)")
    if neighbours_configured and not neighbours_up:
        reasons.append(f"none of the {neighbours_configured} configured neighbours is up")
    return Readiness(not reasons, tuple(reasons))
