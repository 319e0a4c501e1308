"""The benchmark's step breakdown: the difference of two readings of the dispatcher's step
histograms, as a real /metrics page gives them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from bench import steps
from trainjob import step_timing


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
