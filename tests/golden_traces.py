"""Golden traces: the simulator's event trace and report for every shipped scenario and a set of
random-fault seeds, recorded once and compared on every test run.

Theory of operation: the simulator is deterministic (one seeded generator, virtual time), so a change
that only moves code (a refactor) must leave every trace byte-identical. The manifest keeps, per case,
the trace's SHA-256 and line count, a hash per chunk of `CHUNK` lines (so a failure names the first
chunk that differs), the count of each event type (so it also says which kinds of events moved) and
the whole report without its wall-clock time. A change that alters behaviour on purpose records the
traces again and says so in its commit:

    python tests/golden_traces.py --record          # rewrite tests/golden/traces.json
    python tests/golden_traces.py --trace lossy /tmp/lossy.jsonl   # one case's full trace, to diff by hand
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from federation.scenario.loader import load_scenario  # noqa: E402
from federation.sim.random_faults import random_scenario  # noqa: E402
from federation.sim.runner import Simulation  # noqa: E402

MANIFEST = Path(__file__).resolve().parent / "golden" / "traces.json"
SCENARIOS = ROOT / "configs" / "topologies"
RANDOM_SEEDS = range(20)
SCENARIO_SEED = 1
CHUNK = 500


def case_names() -> list[str]:
    return [f"scenario:{path.stem}" for path in sorted(SCENARIOS.glob("*.yaml"))] + \
        [f"random:{seed}" for seed in RANDOM_SEEDS]


def run_case(name: str, events_path: str) -> dict[str, Any]:
    kind, _, which = name.partition(":")
    if kind == "scenario":
        scenario = load_scenario(str(SCENARIOS / f"{which}.yaml"))
        seed = SCENARIO_SEED
    else:
        seed = int(which)
        scenario = random_scenario(seed)
    report = Simulation(scenario, seed=seed, events_path=events_path).run()
    report.pop("wall_seconds", None)
    return report


def fingerprint(name: str) -> dict[str, Any]:
    """Run one case and describe its trace and report."""
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as trace:
        report = run_case(name, trace.name)
        lines = Path(trace.name).read_bytes().splitlines(keepends=True)
    by_type: Counter[str] = Counter(json.loads(line)["type"] for line in lines)
    chunks = [hashlib.sha256(b"".join(lines[start:start + CHUNK])).hexdigest()[:16]
              for start in range(0, len(lines), CHUNK)]
    return {
        "events": len(lines),
        "sha256": hashlib.sha256(b"".join(lines)).hexdigest(),
        "chunks": chunks,
        "by_type": dict(sorted(by_type.items())),
        "report": report,
    }


def differences(name: str, expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """What differs between a recorded fingerprint and a new one, in words a person can act on."""
    if expected == actual:
        return []
    found = [f"{name}: the trace differs from the golden one (record again only if the change is meant: "
             f"python tests/golden_traces.py --record)"]
    if expected["events"] != actual["events"]:
        found.append(f"  events: {expected['events']} recorded, {actual['events']} now")
    for index, (old, new) in enumerate(zip(expected["chunks"], actual["chunks"], strict=False)):
        if old != new:
            found.append(f"  first difference within lines {index * CHUNK + 1}-{(index + 1) * CHUNK}: "
                         f"python tests/golden_traces.py --trace {name} FILE, then diff against the old commit's")
            break
    kinds = sorted(set(expected["by_type"]) | set(actual["by_type"]))
    moved = [f"{kind} {expected['by_type'].get(kind, 0)} -> {actual['by_type'].get(kind, 0)}" for kind in kinds
             if expected["by_type"].get(kind, 0) != actual["by_type"].get(kind, 0)]
    if moved:
        found.append("  event counts: " + ", ".join(moved))
    if expected["report"] != actual["report"]:
        keys = sorted(key for key in set(expected["report"]) | set(actual["report"])
                      if expected["report"].get(key) != actual["report"].get(key))
        found.append(f"  report fields that differ: {', '.join(keys)}")
    return found


def load_manifest() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(MANIFEST.read_text(encoding="utf-8"))
    return data


def record() -> None:
    manifest = {name: fingerprint(name) for name in case_names()}
    MANIFEST.parent.mkdir(parents=True, exist_ok=True)
    MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"recorded {len(manifest)} cases in {MANIFEST.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Record or inspect the simulator's golden traces.")
    parser.add_argument("--record", action="store_true", help="run every case and rewrite the manifest")
    parser.add_argument("--trace", nargs=2, metavar=("CASE", "FILE"), help="write one case's full trace to FILE")
    args = parser.parse_args(argv)
    if args.record:
        record()
    elif args.trace:
        name, path = args.trace
        run_case(name, path)
        print(f"{name}: {path}")
    else:
        parser.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
