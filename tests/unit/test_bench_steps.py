"""The benchmark's step breakdown: the difference of two readings of the dispatcher's step
histograms, as a real /metrics page gives them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from bench import report, steps
from controller_kit import step_timing
from controller_kit.gc_pauses import PAUSE_BUCKETS


class _Page:
    """Serves a registry's exposition text the way ServiceProcess.get does."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    def get(self, path: str) -> tuple[int, str]:
        assert path == "/metrics"
        return 200, generate_latest(self.registry).decode()


def test_the_breakdown_counts_only_what_happened_between_the_readings():
    registry = CollectorRegistry()
    histogram = step_timing.histogram(registry, steps.METRIC, "test")
    page = _Page(registry)
    histogram("Place", "patch", "wall").observe(2.0)  # before
    before = steps.snapshot(page)
    for seconds in [0.003] * 99 + [0.2]:
        histogram("Place", "patch", "wall").observe(seconds)
        histogram("Place", "patch", "cpu").observe(0.0005)
    histogram("Place", "queue", "wall").observe(0.001)
    histogram("CopyStatus", "write", "wall").observe(0.01)
    result = steps.breakdown(before, steps.snapshot(page), "Place")
    assert list(result) == ["queue", "patch"], "steps in the order a job takes them"
    patch = result["patch"]
    assert patch["count"] == 100
    assert patch["wall_mean_ms"] == round((99 * 0.003 + 0.2) / 100 * 1000, 3)
    assert patch["cpu_mean_ms"] == 0.5
    assert patch["wall_p99_ms_at_most"] == 5.0, "99 of 100 samples are within the 5 ms bucket"


def test_garbage_collections_between_the_readings_are_counted_by_generation():
    registry = CollectorRegistry()
    page = _Page(registry)
    # As a controller process exposes it (controller_kit.gc_pauses).
    pauses = Histogram(steps.GC_METRIC, "pauses", ["generation"], registry=registry,
                       buckets=PAUSE_BUCKETS)
    pauses.labels("0").observe(0.001)  # before
    before = steps.snapshot(page)
    for seconds in (0.002, 0.004):
        pauses.labels("0").observe(seconds)
    pauses.labels("2").observe(0.2)
    result = steps.breakdown(before, steps.snapshot(page), steps.GC)
    assert result["gen0"]["count"] == 2 and result["gen0"]["wall_mean_ms"] == 3.0, result
    assert result["gen2"]["count"] == 1 and result["gen2"]["wall_p99_ms_at_most"] == 250.0
    assert "gen1" not in result, "a generation without collections meanwhile is left out"
    assert list(result) == ["gen0", "gen2"], "generations in order"
    pauses.labels("1").observe(3.0)  # past the last bucket
    result = steps.breakdown(before, steps.snapshot(page), steps.GC)
    assert "gen1 1 / 3000.0 ms (> 2500)" in report._gc_rows(result)[0]
    row = report._gc_rows(result)[0]
    assert "gen0 2 / 6.0 ms (<= 5.0)" in row and "gen2 1 / 200.0 ms (<= 250.0)" in row, row
