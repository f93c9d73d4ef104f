"""Replay federation event logs: convergence per disruption, delivery, latency, control overhead, plots.

    federation-analyze --events 'RUN/*.jsonl' [--timeline SCENARIO.yaml] --out DIR
    spark-submit --master URL "$(federation-analyze --job-path)" --events 'hdfs:///runs/7/*.jsonl' --out DIR

`federation-analyze` is this module's `main` (also `python -m federation.spark`,
and `python spark/convergence.py` in a checkout); `--job-path` prints this
file, which spark-submit runs as a script.

Theory of operation
-------------------
1. Read the JSON-lines logs (schema versions 1 and 2) once, with explicit
   schemas, into a columnar copy that every later step reads; count
   corrupt lines and other schema versions (federation/spark/reader.py).
2. Estimate clock offsets from the hello exchange samples in the events and
   move every event to one reference clock where the offset is significant
   (federation/spark/clocks.py).
3. Build the ground truth (federation/spark/timeline.py): the scenario file if given,
   else the simulator's records, else what the nodes detected; group its
   disruptions into phases with their connected components.
4. Replay the view events on the driver (federation/spark/replay.py): convergence per
   phase and per component, subscription intervals, mesh sizes, core changes.
5. In Spark (federation/spark/analysis.py): expected deliveries, deliveries, losses,
   duplicates, latency percentiles, control overhead, mesh links used.
6. Write report.json, CSV tables, PNG plots and report.html (federation/spark/output.py,
   federation/spark/plots.py).

Exit codes: 0 report written; 2 bad arguments or unusable input (the
message says why); 1 an unexpected failure (traceback).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file (spark-submit): import the tree this file belongs to, not its folder
    _HERE = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from federation.cli_version import add_version_option  # noqa: E402
from federation.spark import DATA_TYPES, inputs  # noqa: E402
from federation.spark import clocks as clock_estimation  # noqa: E402
from federation.spark import timeline as timelines  # noqa: E402
from federation.spark.replay import Replay  # noqa: E402

DEFAULT_SETTLE = 5.0
PROG = "federation-analyze"


class _JobPath(argparse.Action):
    """`--job-path`: print the file spark-submit should run (this one) and exit, as `--version` does."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(Path(__file__).resolve())
        parser.exit()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Measure convergence, delivery and control overhead from federation event logs "
                    "(docs/spark.md). In a checkout also `python spark/convergence.py`.")
    add_version_option(parser, PROG)
    parser.add_argument("--job-path", action=_JobPath,
                        help="print the path of the job file for spark-submit "
                             "(`spark-submit --master URL \"$(federation-analyze --job-path)\" --events ...`) and exit")
    parser.add_argument("--events", action="append", required=True, metavar="PATTERN",
                        help="event log files: a glob (quote it), a directory of *.jsonl, or a URL Spark reads; "
                             "repeat for several")
    parser.add_argument("--timeline", metavar="SCENARIO.yaml",
                        help="the scenario file the run executed: its disruptions are the ground truth")
    parser.add_argument("--timeline-start", type=float, metavar="T",
                        help="event time of the scenario's t=0 (default: the first node_started)")
    parser.add_argument("--out", required=True, metavar="DIR", help="report directory (created)")
    parser.add_argument("--settle", type=float, metavar="SECONDS",
                        help=f"settle bound of the expected-delivery rule (default: the scenario's with "
                             f"--timeline, else {DEFAULT_SETTLE:g})")
    parser.add_argument("--phase-gap", type=float, metavar="SECONDS",
                        help="disruptions this close to a phase's first one join it (default 0; "
                             f"{timelines.HARNESS_PHASE_GAP:g} for the netns/lxd harness's records, "
                             f"{timelines.DETECTED_PHASE_GAP:g} when detected from node events)")
    parser.add_argument("--clock-correction", choices=clock_estimation.MODES, default="auto",
                        help="auto: correct offsets larger than their error bound (default); always; never")
    parser.add_argument("--clock-reference", metavar="HOST:PORT", help="node whose clock is the reference")
    parser.add_argument("--bucket", type=float, default=10.0, metavar="SECONDS",
                        help="time bucket of the overhead series (default 10, the default stats_interval)")
    parser.add_argument("--master", help="Spark master when not under spark-submit (default local[2])")
    parser.add_argument("--partitions", type=int, metavar="N",
                        help="spark.sql.shuffle.partitions (default: 2 per 256 MB of local input, 2 to 64)")
    parser.add_argument("--driver-memory", default="3g", help="driver memory for a local run (default 3g)")
    parser.add_argument("--scratch", metavar="DIR",
                        help="where the parsed events are stored while the job runs (removed at its end; default: "
                             "a temporary directory on a local master, Spark's cache otherwise); on a cluster, "
                             "a directory every executor reaches, e.g. hdfs:///tmp/federation-analyze")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    args = parser.parse_args(argv)
    for name in ("settle", "phase_gap", "bucket"):
        value = getattr(args, name)
        if value is not None and (value < 0 or (name == "bucket" and value == 0)):
            parser.error(f"--{name.replace('_', '-')} must be {'positive' if name == 'bucket' else '>= 0'}, "
                         f"got {value}")
    return args


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    """Run the job; `spark` is an existing session (tests share one), else one is built."""
    args = parse_args(argv)
    command = f"{PROG} " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    from federation.spark.reader import InputError, is_local, resolve  # imports pyspark

    try:
        files = resolve(args.events)
        # Compressed generations decompressed, unreadable files refused, before anything is counted.
        scratch = args.scratch.removeprefix("file:") if args.scratch is not None and is_local(args.scratch) else None
        prepared = inputs.prepare(files, is_local, scratch)
    except (InputError, inputs.UnreadableInput) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        partitions = args.partitions or shuffle_partitions(prepared.paths)
        if spark is None:
            from federation.spark.session import build_session
            spark = build_session(args.master, partitions, args.driver_memory)
        spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
        started = time.perf_counter()
        try:
            report, extras = analyse(spark, prepared, args)
        except (InputError, timelines.TimelineError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    finally:
        prepared.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figures = [] if args.no_plots else draw(out, report, extras)
    wall = time.perf_counter() - started
    report["job"].update({"command": command, "wall_seconds": round(wall, 3),
                          "events_per_second": round(report["input"]["lines"] / wall, 1) if wall > 0 else None,
                          "master": spark.sparkContext.master})
    from federation.spark import output

    report["tables"] = output.write_tables(out, report, extras)
    output.write_json(out / "report.json", report)
    output.write_html(out / "report.html", report, figures)
    print_summary(report, out)
    return 0


def shuffle_partitions(files: list[str]) -> int:
    """Few partitions for small logs (each costs a task per stage), more for big ones."""
    size = sum(os.path.getsize(f) for f in files if os.path.isfile(f))
    return max(2, min(64, 2 * math.ceil(size / 256e6)))


class Steps:
    """Wall seconds per step of the job (reported as job.steps: where the time goes)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def done(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self._last, 3)
        self._last = now


def analyse(spark: Any, prepared: inputs.Prepared,
            args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    from federation.spark.reader import read_events

    steps = Steps()
    log = read_events(spark, prepared.paths, args.scratch)
    log.summary.files = prepared.given  # the files as given, not the decompressed copies read
    try:
        return _analyse(spark, log, steps, args)
    finally:
        log.close()


def _analyse(spark: Any, log: Any, steps: Steps, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    from federation.spark import analysis

    summary = log.summary
    steps.done("read")
    warnings = summary.warnings()
    for note in warnings:
        print(f"warning: {note}", file=sys.stderr)
    # Clocks.
    try:
        estimate = clock_estimation.estimate(analysis.clock_samples(log.details), summary.nodes, args.clock_correction,
                                             args.clock_reference)
    except ValueError as error:
        raise timelines.TimelineError(str(error)) from None
    details = analysis.corrected(log.details, estimate.correction())
    bulk = analysis.corrected(log.bulk, estimate.correction())
    steps.done("clocks")
    # Ground truth.
    control = analysis.control_rows(details)
    names = analysis.node_names(control)
    settle = args.settle if args.settle is not None else DEFAULT_SETTLE
    if args.timeline:
        starts = [row.t for row in control if row.type == "node_started"]
        start = args.timeline_start if args.timeline_start is not None else (min(starts) if starts else None)
        if start is None:
            raise timelines.TimelineError("--timeline: no node_started event to anchor the scenario's t=0; "
                                          "give --timeline-start")
        timeline = timelines.from_scenario(args.timeline, names, start)
        if args.settle is not None:
            timeline.settle = args.settle
    else:
        timeline = (timelines.from_sim_events(analysis.sim_records(control), settle)
                    or timelines.from_harness_events(analysis.harness_records(control), names, settle)
                    or timelines.inferred(analysis.detected_rows(control), settle))
    settle = timeline.settle
    gap = args.phase_gap if args.phase_gap is not None else timeline.phase_gap
    last = summary.last if summary.last is not None else 0.0
    correction = estimate.correction()
    last += max([0.0] + [-offset for offset in correction.values()])
    phases = timeline.phases(gap, end=last)
    steps.done("timeline")
    # Convergence and the other sequential measures, on the driver.
    result = Replay(phases, timeline.names).run(analysis.view_rows(details))
    if result.unknown_nodes:
        warnings.append(f"events from nodes the timeline does not name (ignored for convergence): "
                        f"{', '.join(result.unknown_nodes[:10])}")
    steps.done("replay")
    # Deliveries, overhead, mesh links: in Spark.
    delivery = analysis.deliveries(spark, bulk, phases, timeline.names, result.subscriptions, settle)
    steps.done("deliveries")
    traffic = analysis.overhead(details, args.bucket)
    steps.done("overhead")
    edges = analysis.mesh_edges(bulk, phases)
    steps.done("mesh_edges")
    labels = {p.index: p.label for p in phases}
    address_name = {address: name for name, address in timeline.names.items()}

    convergence = []
    for item in result.phases:
        phase = item.phase
        convergence.append({
            "phase": phase.label, "at": phase.at, "seconds": item.seconds, "settled_at": item.settled_at,
            "end": phase.end, "loss_active": phase.loss_active,
            "disruptions": [{"kind": d.kind, "label": d.label, "at": d.at} for d in phase.disruptions],
            "components": [{"nodes": list(c.names), "settled_at": c.settled_at,
                            "seconds": None if c.settled_at is None else c.settled_at - phase.at,
                            "problem": c.problem} for c in item.components],
        })
    by_phase = [{"phase": labels.get(key, "before the first phase") if key is not None else "unknown publication",
                 **row} for key, row in delivery["per_phase"].items()]
    meshes_final: dict[str, int] = {}
    for _, filter_, size in result.mesh_sizes:
        meshes_final[filter_] = size
    report: dict[str, Any] = {
        "job": {"version": 1, "events": args.events, "timeline": timeline.source, "t0": timeline.origin,
                "settle": settle,
                "phase_gap": gap, "bucket_seconds": args.bucket, "steps": steps.seconds},
        "input": summary.as_dict(),
        "convergence": convergence,
        "publications": delivery["totals"],
        "publications_by_phase": by_phase,
        "publications_dropped": summary.by_type.get("publication_dropped", 0),
        "duplicates_dropped": summary.per_publication.get("duplicate_dropped", 0),
        "lost_examples": delivery["lost_examples"],
        "control": {**traffic["control"],
                    "by_type": {k: v for k, v in traffic["by_type"].items() if k not in DATA_TYPES}},
        "data": {field: sum(traffic["by_type"].get(kind, {}).get(field, 0) for kind in DATA_TYPES)
                 for field in ("packets", "bytes")},
        "cores": {"management_changes": sum(1 for c in result.core_changes if c["kind"] == "management"),
                  "topic_changes": sum(1 for c in result.core_changes if c["kind"] == "topic")},
        "mesh_sizes_final": dict(sorted(meshes_final.items())),
        "clocks": {
            "mode": estimate.mode, "reference": estimate.reference, "pairs": estimate.pairs,
            "applied": sum(1 for o in estimate.offsets.values() if o.applied), "max_error": estimate.max_error(),
            "nodes": {address_name.get(node, node): {"address": node, "offset": o.offset, "error": o.error,
                                                     "hops": o.hops, "applied": o.applied}
                      for node, o in sorted(estimate.offsets.items())},
        },
        "warnings": warnings,
    }
    extras = {"series": result.series, "cdf": delivery["cdf"], "overhead_series": traffic["series"],
              "core_changes": result.core_changes, "mesh_sizes": result.mesh_sizes, "edges": edges,
              "phases": result.phases, "timeline": timeline, "span": (summary.first or 0.0, last)}
    return report, extras


def draw(out: Path, report: dict[str, Any], extras: dict[str, Any]) -> list[str]:
    from federation.spark import plots

    # Pictures show time from the run's t=0 (unix times of real runs are unreadable on an axis).
    origin = extras["timeline"].origin
    span = (extras["span"][0] - origin, extras["span"][1] - origin)
    phases = [{"index": item.phase.index, "label": item.phase.label, "at": item.phase.at - origin,
               "end": item.phase.end - origin, "seconds": item.seconds, "snapshot": item.snapshot,
               "settled_at": None if item.settled_at is None else item.settled_at - origin}
              for item in extras["phases"]]
    series = [(point[0] - origin, *point[1:]) for point in extras["series"]]
    overhead_series = [{**row, "t": row["t"] - origin} for row in extras["overhead_series"]]
    core_changes = [{**change, "t": change["t"] - origin} for change in extras["core_changes"]]
    mesh_sizes = [(t - origin, filter_, size) for t, filter_, size in extras["mesh_sizes"]]
    plots.convergence(out / "convergence.png", phases, series, span)
    plots.overlay(out / "overlay.png", phases, extras["timeline"].names, extras["timeline"].links, extras["edges"])
    plots.latency_cdf(out / "latency_cdf.png", extras["cdf"], report["publications"]["latency"])
    plots.overhead(out / "overhead.png", overhead_series, phases, span)
    plots.cores_meshes(out / "cores_meshes.png", core_changes, mesh_sizes, phases, span)
    return ["convergence.png", "overlay.png", "latency_cdf.png", "overhead.png", "cores_meshes.png"]


def print_summary(report: dict[str, Any], out: Path) -> None:
    pubs = report["publications"]
    latency = pubs["latency"]

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}s"

    print(f"events: {report['input']['valid']} valid of {report['input']['lines']} lines "
          f"({report['input']['corrupt']} corrupt); disruptions from {report['job']['timeline']}")
    print(f"publications: sent {pubs['sent']}, expected {pubs['expected_deliveries']}, delivered {pubs['delivered']}, "
          f"lost {pubs['lost']}, duplicates {pubs['duplicates']}, unexpected {pubs['unexpected']}, "
          f"outside bound {pubs['delivered_outside_bound']}")
    print(f"latency: p50 {seconds(latency['p50'])}, p90 {seconds(latency['p90'])}, p99 {seconds(latency['p99'])}, "
          f"max {seconds(latency['max'])}")
    for phase in report["convergence"]:
        verdict = "not converged" if phase["seconds"] is None else f"converged in {phase['seconds']:.3f}s"
        print(f"convergence: {phase['phase']} (at {phase['at'] - report['job']['t0']:.3f}s): {verdict}")
    print(f"report: {out / 'report.html'} ({report['job']['wall_seconds']:.1f}s, "
          f"{report['job']['events_per_second']:.0f} events/s)")


if __name__ == "__main__":
    sys.exit(main())
