"""The figures `python -m suites.bench.log_burst` prints, from an event log and a series of smoothed
round trips (the run itself starts a federation: docs/daemon.md, "Learning subscriptions in bulk")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from suites.bench.log_burst import Timeline, filter_of, main, rtt_samples


def test_the_timeline_reads_one_clients_events_and_finds_the_stalls(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    events = [("subscription_added", "log-burst", t) for t in (100.1, 100.2, 100.9, 101.5, 103.0)]
    events += [("subscription_added", "log-burst-other", 100.5), ("subscription_removed", "log-burst", 103.2),
               ("counters", "log-burst", 103.3)]
    log.write_text("".join(json.dumps({"v": 2, "t": t, "node": "n", "type": kind, "client": client}) + "\n"
                           for kind, client, t in events))
    timeline = Timeline.read(log, "log-burst")
    assert timeline.added == [100.1, 100.2, 100.9, 101.5, 103.0] and timeline.removed == [103.2]
    assert timeline.per_second(100.0) == [3, 1, 0, 1]
    assert [(round(at, 1), round(length, 1)) for at, length in timeline.stalls(100.0)] == \
        [(0.2, 0.7), (0.9, 0.6), (1.5, 1.5)]


def test_round_trip_samples_are_recovered_from_the_smoothed_series() -> None:
    weight, smoothed, samples = 0.125, [2.0], [2.0, 50.0, 50.0, 4.0, 300.0]
    for sample in samples[1:]:
        smoothed.append((1 - weight) * smoothed[-1] + weight * sample)
    smoothed.insert(2, smoothed[1])  # polled twice between two hellos: no new sample
    assert rtt_samples(smoothed, weight) == pytest.approx(samples[1:])


def test_filters_and_arguments() -> None:
    assert [filter_of(kind, 7) for kind in ("exact", "wildcard", "churn")] == ["dev/7/cmd", "wdev/7/#", "churn/7/cmd"]
    with pytest.raises(SystemExit) as exit_:
        main(["--nodes", "1"])
    assert exit_.value.code == 2
