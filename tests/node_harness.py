"""A minimal in-memory network for unit tests of the node (aioquic-style helpers).

Fixed one-way latency, no loss unless a link is cut; time jumps to the next
timer or datagram. The full simulator (federation.sim) is what scenario tests use.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable

from federation.protocol.node import Node
from federation.protocol.settings import Settings
from federation.protocol.types import Address, Injection, PublicationId


def address(index: int) -> Address:
    return Address(f"10.0.0.{index}", 10500)


class Harness:
    def __init__(self, links: Iterable[tuple[int, int]], vids: dict[int, int] | None = None,
                 settings: Settings | None = None, latency: float = 0.001, seed: int = 1) -> None:
        self.links = {tuple(sorted(link)) for link in links}
        self.indexes = sorted({i for link in self.links for i in link})
        self.settings = settings if settings is not None else Settings()
        self.latency = latency
        self.vids = vids if vids is not None else {i: i for i in self.indexes}
        self.now = 0.0
        self.seed = seed
        self.cut: set[tuple[int, int]] = set()
        self.queue: list[tuple[float, int, bytes, Address, int]] = []
        self.counter = 0
        self.nodes: dict[int, Node] = {}
        self.delivered: list[tuple[int, Injection]] = []
        self.injections_done = True
        """report QoS 1/2 injections done at once (False: a test reports them itself)"""
        self.released: list[tuple[int, PublicationId]] = []
        """(node, publication): custody released at the origin"""
        self.events: list[dict[str, object]] = []
        self.packets = 0
        self.epochs: dict[int, int] = {}
        for index in self.indexes:
            self.start(index)

    def neighbours(self, index: int) -> list[Address]:
        return [address(b if a == index else a) for a, b in sorted(self.links) if index in (a, b)]

    def start(self, index: int) -> Node:
        self.epochs[index] = self.epochs.get(index, 0) + 1
        node = Node(address(index), self.neighbours(index), self.epochs[index],
                    random.Random(f"{self.seed}:{index}:{self.epochs[index]}"), self.settings, vid=self.vids.get(index))
        self.nodes[index] = node
        node.start(self.now)
        self.flush(index)
        return node

    def kill(self, index: int) -> None:
        del self.nodes[index]

    def flush(self, index: int) -> None:
        node = self.nodes.get(index)
        if node is None:
            return
        injections = node.injections_to_make()  # the broker has them at once (QoS 1/2: reported done)
        self.delivered.extend((index, injection) for injection in injections)
        if self.injections_done:
            for injection in injections:
                if injection.qos:
                    node.injection_done(injection.publication, self.now)
        self.released.extend((index, publication) for publication in node.custody_released())
        for data, target in node.packets_to_send():
            target_index = int(target.host.rsplit(".", 1)[1])
            if (index, target_index) in self.cut or self.lose(data, node.address, target_index):
                continue
            self.counter += 1
            heapq.heappush(self.queue, (self.now + self.latency, self.counter, data, node.address, target_index))
        self.events.extend(e.to_json_dict() for e in node.events_emitted())

    def lose(self, data: bytes, source: Address, target: int) -> bool:
        """Whether the network loses this datagram (none here; a test's harness may lose some)."""
        return False

    def run(self, until: float) -> None:
        while True:
            next_timer, timer_index = self._next_timer()
            next_packet = self.queue[0][0] if self.queue else float("inf")
            when = min(next_timer, next_packet)
            if when > until:
                self.now = until
                return
            self.now = max(self.now, when)
            if next_packet <= next_timer:
                _, _, data, source, target = heapq.heappop(self.queue)
                node = self.nodes.get(target)
                if node is not None:
                    self.packets += 1
                    node.receive_packet(data, source, self.now)
                    self.flush(target)
            else:
                self.nodes[timer_index].handle_timer(self.now)
                self.flush(timer_index)

    def _next_timer(self) -> tuple[float, int]:
        timers = [(t, i) for i, n in self.nodes.items() if (t := n.get_timer()) is not None]
        return min(timers) if timers else (float("inf"), -1)

    def do(self, index: int, action: str, *args: object) -> object:
        result = getattr(self.nodes[index], action)(*args, self.now)
        self.flush(index)
        return result

    def cut_link(self, a: int, b: int, oneway: bool = False) -> None:
        self.cut.add((a, b))
        if not oneway:
            self.cut.add((b, a))

    def heal(self, a: int, b: int) -> None:
        self.cut.discard((a, b))
        self.cut.discard((b, a))


def converged_line(count: int, qos: int) -> Harness:
    """Nodes 1..count in a line, subscribers at `qos` on node 2 (f/a) and the last (f/#), converged: a probe
    from node 1 arrived; what it left behind (deliveries, events, releases) is cleared."""
    harness = Harness([(i, i + 1) for i in range(1, count)])
    harness.do(2, "local_subscribe", "mid", "f/a", qos)
    harness.do(count, "local_subscribe", "end", "f/#", qos)
    harness.run(10.0)
    harness.do(1, "local_publish", "f/probe", b"probe", qos, False, None)
    harness.run(11.0)
    assert any(injection.topic == "f/probe" for _, injection in harness.delivered), "the line did not converge"
    harness.delivered.clear()
    harness.events.clear()
    harness.released.clear()
    return harness
