"""`python -m suites.bench.envelope`: what the envelope costs per packet, on this machine.

Theory of operation: throughput of a wrapper is bounded by Python work per
packet, so the figure that matters is CPU time per protocol packet (process
CPU time, `time.process_time`, so that other processes competing for the
CPU inflate the figures less than wall-clock time would), for
the sender (wire.encode, then the envelope's batching, framing and MAC or
encryption) and for the receiver (the envelope's checks, replay window and
reassembly, then wire.decode). Each case is timed in a loop, repeated, and
the median is printed, next to the same work without any envelope (`bare`:
what the wrapper did before authentication existed). No sockets: the
numbers are the CPU cost alone, the upper bound a wrapper's loop can reach.
A loaded machine still slows them (caches, frequency); compare modes within
one run, and run it twice.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence

from federation.envelope.config import EnvelopeConfig
from federation.envelope.datagrams import Envelope
from federation.protocol import wire
from federation.protocol.types import Address, BrokerId

SENDER = Address("127.0.0.10", 10500)
RECEIVER = Address("127.0.0.11", 10500)
KEY = bytes(range(32))
MODES = {
    "open": EnvelopeConfig(),
    "mac": EnvelopeConfig(keys=(KEY,)),
    "aead": EnvelopeConfig(keys=(KEY,), encryption="chacha20-poly1305"),
}


def topic_message(payload_size: int, seq: int = 1) -> tuple[str, wire.Sender, wire.Body]:
    body = wire.TopicMessage("bench/#", SENDER, 1, seq, wire.MODE_IN_MESH, 0, "bench/topic", os.urandom(payload_size),
                             0, False, None)
    return wire.TOPIC_MESSAGE, wire.Sender(BrokerId(1, SENDER), 1), body


CASES: dict[str, tuple[Callable[[], tuple[str, wire.Sender, wire.Body]], int]] = {
    # name: (packet factory, packets per flush: how many the node hands over at once)
    "hello, 1 per datagram": (lambda: (wire.HELLO, wire.Sender(BrokerId(1, SENDER), 1), wire.Hello(7, 1.5)), 1),
    "tm 100 B, 1 per datagram": (lambda: topic_message(100), 1),
    "tm 100 B, 10 batched": (lambda: topic_message(100), 10),
    "tm 1 KiB, 1 per datagram": (lambda: topic_message(1024), 1),
    "tm 64 KiB, fragmented": (lambda: topic_message(64 * 1024), 1),
    "tm 256 KiB, fragmented": (lambda: topic_message(256 * 1024), 1),
}


def measure(case: str, mode: str, repeats: int, budget: float) -> tuple[float, float]:
    """Median microseconds per packet: (send side, receive side)."""
    make, batch = CASES[case]
    kind, sender_id, body = make()
    packet_size = len(wire.encode(kind, sender_id, body))
    sends: list[float] = []
    receives: list[float] = []
    epoch = 1
    for _ in range(repeats):
        epoch += 1
        if mode == "bare":
            sender = receiver = None
        else:
            sender, receiver = Envelope(SENDER, epoch, MODES[mode]), Envelope(RECEIVER, 1, MODES[mode])
            sender.set_peer_epoch(RECEIVER, receiver.epoch)  # as the receiver's own datagrams would teach it
        rounds = max(3, int(budget * 4e4 / batch / (1 + packet_size // 1300)))
        datagrams: list[bytes] = []
        started = time.process_time()
        for _ in range(rounds):
            packets = [wire.encode(kind, sender_id, body) for _ in range(batch)]
            if sender is None:
                datagrams += packets
            else:
                for packet in packets:
                    sender.send(packet, RECEIVER)
                datagrams += [data for data, _ in sender.datagrams_to_send()]
        sent = time.process_time() - started
        started = time.process_time()
        decoded = 0
        for data in datagrams:
            inner = [data] if receiver is None else receiver.receive_datagram(data, SENDER, 0.0)
            for packet in inner:
                wire.decode(packet, max_packet=1 << 20)
                decoded += 1
        received = time.process_time() - started
        if decoded != rounds * batch:
            raise RuntimeError(f"{case}/{mode}: decoded {decoded} of {rounds * batch} packets")
        sends.append(sent / decoded * 1e6)
        receives.append(received / decoded * 1e6)
    return statistics.median(sends), statistics.median(receives)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suites.bench.envelope",
                                     description="CPU cost of the datagram envelope per protocol packet.")
    parser.add_argument("--repeats", type=int, default=5, help="runs per case; the median is printed (default 5)")
    parser.add_argument("--budget", type=float, default=0.5, help="rough CPU seconds per run (default 0.5)")
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="only these cases (repeatable)")
    options = parser.parse_args(argv)
    print(f"median of {options.repeats} runs; microseconds of CPU per protocol packet (encode+seal, open+decode)")
    print(f"{'case':28} {'mode':5} {'send':>9} {'receive':>9} {'total':>9} {'packets/s':>10} {'vs bare':>8}")
    for case in options.case or list(CASES):
        bare_total = None
        for mode in ("bare", *MODES):
            send, receive = measure(case, mode, options.repeats, options.budget)
            total = send + receive
            if bare_total is None:
                bare_total = total
            print(f"{case:28} {mode:5} {send:9.1f} {receive:9.1f} {total:9.1f} {1e6 / total:10.0f} "
                  f"{total / bare_total:7.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
