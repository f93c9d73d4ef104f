"""`python -m suites.bench.bookkeeping`: CPU per publication of a wrapper's QoS 1/2 records on disk.

Theory of operation: besides the node's custody (measured by `hotpath`), a
QoS 1/2 publication costs the sending wrapper its spool entry (written
before the broker's PUBACK, forgotten when custody ends: federation.daemon.spool)
and the receiving wrapper its injection journal entry (started before the
PUBLISH is written, finished at the broker's PUBACK:
federation.daemon.injections). This command times both as the runtime
drives them, on real files in a temporary directory: a read pass of
`--pass-size` publications added to the spool in one call and released in
one call (as one acknowledgement releases them), and a window of
`--window` injections (Mosquitto's Receive Maximum, 20 by default) started
in one call and finished in one. Each figure is the median over the passes
of process CPU time per publication, in microseconds, compaction included
when it falls in a pass.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from federation.daemon.injections import InjectionJournal
from federation.daemon.record_log import RecordLog
from federation.daemon.spool import Spool, SpooledPublication
from federation.protocol.types import Address, Injection

ORIGIN = Address("10.0.0.9", 10500)
TOPIC = "bench/bookkeeping"


def spool_us(directory: Path, passes: int, pass_size: int, payload: bytes) -> float:
    """Median µs of CPU per publication to spool a pass and release it."""
    spool = Spool(RecordLog(directory / "spool.log"))
    seq, per_publication = 0, []
    for index in range(passes):
        start = time.process_time()
        spool.add([SpooledPublication(7, seq + offset, TOPIC, payload, 1, False, None, 1000.0 + index,
                                      offset % 65535 + 1) for offset in range(pass_size)])
        spool.release([(7, seq + offset) for offset in range(pass_size)])
        per_publication.append((time.process_time() - start) / pass_size)
        seq += pass_size
    spool.log.close()
    return statistics.median(per_publication) * 1e6


def journal_us(directory: Path, passes: int, window: int, payload: bytes) -> float:
    """Median µs of CPU per injection to start a window of them and finish it."""
    journal = InjectionJournal(RecordLog(directory / "injections.log"), 65536)
    seq, mid, per_injection = 0, 0, []
    for _ in range(passes):
        start = time.process_time()
        started = []
        for offset in range(window):
            mid = mid % 65535 + 1
            started.append((mid, Injection(TOPIC, payload, 1, False, None, (ORIGIN, 7, seq + offset), "bench/#")))
        journal.started(started)
        journal.finished([each for each, _ in started])
        per_injection.append((time.process_time() - start) / window)
        seq += window
    journal.close()
    return statistics.median(per_injection) * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suites.bench.bookkeeping",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--passes", type=int, default=2000, help="passes timed (default 2000)")
    parser.add_argument("--pass-size", type=int, default=256,
                        help="publications a sending wrapper reads in one pass (default 256)")
    parser.add_argument("--window", type=int, default=20, help="injections per round trip (default 20)")
    parser.add_argument("--size", type=int, default=64, help="payload bytes (default 64)")
    args = parser.parse_args(argv)
    payload = b"x" * args.size
    with tempfile.TemporaryDirectory(prefix="bookkeeping-") as directory:
        spooled = spool_us(Path(directory), args.passes, args.pass_size, payload)
        journaled = journal_us(Path(directory), args.passes, args.window, payload)
    print(f"spool add + release: {spooled:.2f} µs per publication (passes of {args.pass_size}); "
          f"journal started + finished: {journaled:.2f} µs per injection (windows of {args.window}); "
          f"{args.size} B, median of {args.passes} passes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
