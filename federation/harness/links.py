"""The state of every link under the scenario's cut, heal and loss events, as the simulator defines it.

Theory of operation: the simulator's network (`federation.sim.network`) has,
per direction of every link, a cut flag and an optional loss override over a
network-wide loss value. Real backends must give the same events the same
meaning, so this module keeps exactly that state and answers the two
questions a real run needs: which links are up for the ground truth (both
directions uncut; loss does not cut), and which packet filters each node
needs for the traffic *arriving* from each neighbour
(`Platform.set_inbound`). A change reports the nodes whose filters changed,
so a backend only rewrites those.

Semantics (docs/scenarios.md, docs/simulator.md "Faults"): `cut a b` drops
both directions, `oneway` only a -> b; `heal` restores both; `loss` on one
link sets both directions' override; `loss` on all links sets the
network-wide value and clears every override.
"""

from __future__ import annotations

from collections.abc import Iterable

from federation.harness.platform import InboundFilter


class LinkState:
    def __init__(self, links: Iterable[tuple[str, str]], loss: float = 0.0) -> None:
        self.links = [(min(a, b), max(a, b)) for a, b in links]
        self.neighbours: dict[str, set[str]] = {}
        for a, b in self.links:
            self.neighbours.setdefault(a, set()).add(b)
            self.neighbours.setdefault(b, set()).add(a)
        self.cut_directions: set[tuple[str, str]] = set()
        """(source, target) pairs whose packets are dropped"""
        self.loss = loss
        """network-wide loss percent (the scenario's link_model.loss at the start)"""
        self.overrides: dict[tuple[str, str], float] = {}
        """(source, target) -> loss percent overriding the network-wide value"""

    def _check(self, a: str, b: str) -> None:
        if b not in self.neighbours.get(a, set()):
            raise ValueError(f"{a} and {b} are not neighbours")

    def cut(self, a: str, b: str, oneway: bool = False) -> set[str]:
        """Drop a -> b (and b -> a unless oneway); the nodes whose inbound filters changed."""
        self._check(a, b)
        self.cut_directions.add((a, b))
        if oneway:
            return {b}
        self.cut_directions.add((b, a))
        return {a, b}

    def heal(self, a: str, b: str) -> set[str]:
        self._check(a, b)
        self.cut_directions.discard((a, b))
        self.cut_directions.discard((b, a))
        return {a, b}

    def set_loss(self, percent: float, link: tuple[str, str] | None = None) -> set[str]:
        if not 0 <= percent <= 100:
            raise ValueError(f"loss must be a percentage in [0, 100], got {percent!r}")
        if link is None:
            self.loss = percent
            self.overrides.clear()
            return set(self.neighbours)
        a, b = link
        self._check(a, b)
        self.overrides[(a, b)] = percent
        self.overrides[(b, a)] = percent
        return {a, b}

    def loss_of(self, source: str, target: str) -> float:
        return self.overrides.get((source, target), self.loss)

    def loss_active(self) -> bool:
        return self.loss > 0 or any(percent > 0 for percent in self.overrides.values())

    def up_links(self) -> list[tuple[str, str]]:
        """Links with both directions uncut (what the ground truth connects), sorted."""
        return sorted((a, b) for a, b in self.links
                      if (a, b) not in self.cut_directions and (b, a) not in self.cut_directions)

    def inbound(self, target: str) -> dict[str, InboundFilter]:
        """Filters for packets arriving at `target`, by neighbour; only neighbours with something to do."""
        filters = {}
        for source in sorted(self.neighbours.get(target, ())):
            chosen = InboundFilter((source, target) in self.cut_directions, self.loss_of(source, target))
            if chosen.active:
                filters[source] = chosen
        return filters
