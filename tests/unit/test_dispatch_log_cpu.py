"""The dispatcher's log line per copy gives each step's CPU time after its wall time; the
benchmark reads both, and keeps CPU out of the split of a slow dispatch's latency."""

from __future__ import annotations

import pytest

from bench import dispatch_log


def test_each_steps_cpu_time_is_read_beside_its_wall_time(tmp_path):
    log_file = tmp_path / "dispatcher.log"
    log_file.write_text(
        "2026-11-27 05:00:00,005 INFO dispatcher.standalone.reconciler: TrainJob ns-d/j1 "
        "placed on worker-1, copy created (queued 1.00 ms; decide 0.05, place 0.41, "
        "create 2.00 ms; cpu decide 0.04, place 0.38, create 0.20 ms) namespace=ns-d "
        "name=j1 cluster=worker-1\n")
    steps = dispatch_log.read(log_file, "ns-d")[("ns-d", "j1")]
    assert steps == pytest.approx({
        "queue": 0.001, "decide": 0.00005, "place": 0.00041, "create": 0.002,
        "decide_cpu": 0.00004, "place_cpu": 0.00038, "create_cpu": 0.0002})
    split = dispatch_log.slowest({("ns-d", "j1"): 0.004}, {("ns-d", "j1"): steps})
    assert not any(step.endswith("_cpu") for step in split["mean_ms"]), split
    assert split["mean_ms"]["outside"] == pytest.approx(4 - 1 - 0.05 - 0.41 - 2.0, abs=0.01)
