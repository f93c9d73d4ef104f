"""`python -m suites.bench.record_flood`: how many fake broker records per second a node takes.

Theory of operation: a key holder can send a wrapper valid-looking `fd`
records for brokers that do not exist. Once the federation table holds
`max_nodes` records, each new one evicts the record received longest ago.
This measures the protocol node alone (no sockets, no envelope): three
nodes in a line B - A - C converge in memory, then B's address sends A
fake records, each for a new broker, until A's table is full; then the next
`--records` are timed in process CPU time (as the other benchmarks:
`time.process_time`, so other processes inflate it less) and the rate is
printed, with the table's size and the work its evictions counted. What A
forwards to C is drained and counted, not delivered.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence

from federation.protocol import wire
from federation.protocol.node import Node
from federation.protocol.settings import Settings
from federation.protocol.types import Address, BrokerId

A = Address("10.0.0.1", 10500)
B = Address("10.0.0.2", 10500)
C = Address("10.0.0.3", 10500)


def fake_record(index: int) -> wire.LinkStateRecord:
    origin = Address(f"10.{1 + index // 65536}.{index // 256 % 256}.{index % 256}", 10500)
    return wire.LinkStateRecord(BrokerId(100 + index, origin), 1, 1, 0, 0, ())


class Line:
    """B - A - C, converged by exchanging their datagrams in memory."""

    def __init__(self, settings: Settings) -> None:
        self.now = 0.0
        self.nodes = {A: Node(A, [B, C], 1, random.Random(1), settings, vid=1),
                      B: Node(B, [A], 1, random.Random(2), settings, vid=2),
                      C: Node(C, [A], 1, random.Random(3), settings, vid=3)}
        for node in self.nodes.values():
            node.start(self.now)
        while self.now < 5.0:
            self.now += 0.05
            for node in self.nodes.values():
                node.handle_timer(self.now)
            self.exchange()
        if len(self.nodes[A].routes.members) != 3:
            raise RuntimeError("the three in-memory nodes did not converge; the benchmark cannot run")
        self.sender = wire.Sender(self.nodes[B].broker_id, self.nodes[B].epoch)
        self.forwarded = 0

    def exchange(self) -> None:
        for _ in range(20):
            moved = False
            for address, node in self.nodes.items():
                for data, to in node.packets_to_send():
                    moved = True
                    self.nodes[to].receive_packet(data, address, self.now)
                node.events_emitted()
            if not moved:
                return

    def flood(self, first: int, count: int, rate: float) -> None:
        """`count` fake records from B's address, `rate` a second of virtual time; A's output drained."""
        node = self.nodes[A]
        for index in range(first, first + count):
            self.now += 1 / rate
            node.receive_packet(wire.encode(wire.FEDERATE, self.sender, wire.Federate(fake_record(index))), B,
                                  self.now)
            if index % 64 == 0:
                node.handle_timer(self.now)
                self.forwarded += len(node.packets_to_send())
                node.events_emitted()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suites.bench.record_flood",
                                     description="Fake broker records per second a node takes with a full table.")
    parser.add_argument("--max-nodes", type=int, default=Settings().max_nodes, help="table capacity (default: "
                        "the setting's default)")
    parser.add_argument("--records", type=int, default=3000, help="records timed once the table is full")
    parser.add_argument("--rate", type=float, default=3000.0, help="records per second of virtual time")
    args = parser.parse_args(argv)
    line = Line(Settings(max_nodes=args.max_nodes))
    node = line.nodes[A]
    started = time.process_time()
    line.flood(0, args.max_nodes, args.rate)
    filling = time.process_time() - started
    full = len(node.table.lsdb.records)
    steps = getattr(node.table.lsdb, "eviction_steps", None)
    started = time.process_time()
    line.flood(args.max_nodes, args.records, args.rate)
    spent = time.process_time() - started
    print(f"filling {args.max_nodes} records: {filling:.2f} s CPU ({args.max_nodes / filling:,.0f} records/s)")
    print(f"table full ({full} records, capacity {args.max_nodes}): {args.records} more records in {spent:.2f} s "
          f"CPU: {args.records / spent:,.0f} records/s, {spent / args.records * 1e6:,.0f} µs per record")
    if steps is not None:
        print(f"eviction work: {(node.table.lsdb.eviction_steps - steps) / args.records:.2f} heap entries per record")
    print(f"table after: {len(node.table.lsdb.records)} records, refused {node.table.lsdb.refused}; "
          f"datagrams forwarded to C: {line.forwarded}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
