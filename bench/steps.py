"""Where the dispatcher's time goes in a scenario, step by step: the difference of its
``dispatcher_reconcile_step_seconds`` histograms (read from its /metrics) before and after.
Means are exact (sum over count); a p99 is the upper bound of the bucket it falls in."""

from __future__ import annotations

import math
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

METRIC = "dispatcher_reconcile_step_seconds"
# Each garbage collection's pause, by generation: kept under the action GC, steps gen0-2.
GC_METRIC = "python_gc_duration_seconds"
GC = "GC"
# The order a dispatch and a status copy go through.
STEP_ORDER = ("queue", "decide", "place", "patch", "create", "write", "rest")

Snapshot = dict[tuple[str, str, str], dict]


def snapshot(process) -> Snapshot:
    """Per (action, step, clock): count, sum and cumulative bucket counts; the garbage
    collector's pauses as (GC, gen<generation>, wall)."""
    _, text = process.get("/metrics")
    found: Snapshot = defaultdict(lambda: {"count": 0.0, "sum": 0.0, "buckets": {}})
    for family in text_string_to_metric_families(text):
        if family.name not in (METRIC, GC_METRIC):
            continue
        for sample in family.samples:
            labels = dict(sample.labels)
            key = ((labels.pop("action"), labels.pop("step"), labels.pop("clock"))
                   if family.name == METRIC else (GC, f"gen{labels['generation']}", "wall"))
            if sample.name.endswith("_count"):
                found[key]["count"] = sample.value
            elif sample.name.endswith("_sum"):
                found[key]["sum"] = sample.value
            elif sample.name.endswith("_bucket"):
                found[key]["buckets"][float(labels["le"])] = sample.value
    return dict(found)


RELISTS_METRIC = "dispatcher_cache_relists"


def relists(process) -> dict[tuple[str, str], float]:
    """The dispatcher's lists of each cache after its first, by (cluster, resource)."""
    _, text = process.get("/metrics")
    return {(sample.labels["cluster"], sample.labels["resource"]): sample.value
            for family in text_string_to_metric_families(text)
            if family.name == RELISTS_METRIC
            for sample in family.samples if sample.name.endswith("_total")}


def _p99_bound(before: dict, after: dict, count: float) -> float:
    rank = math.ceil(0.99 * count)
    for bound in sorted(after["buckets"]):
        if after["buckets"][bound] - before["buckets"].get(bound, 0.0) >= rank:
            return bound
    return math.inf


def breakdown(before: Snapshot, after: Snapshot, action: str) -> dict:
    """{step: {count, wall_mean_ms, cpu_mean_ms, wall_p99_ms_at_most}} for ``action``
    between the two snapshots (steps in the order a job goes through them)."""
    empty = {"count": 0.0, "sum": 0.0, "buckets": {}}
    steps = {}
    for step in sorted({s for a, s, _ in after if a == action},
                       key=lambda s: (STEP_ORDER.index(s) if s in STEP_ORDER
                                      else len(STEP_ORDER), s)):
        figures = {}
        for clock in ("wall", "cpu"):
            now = after.get((action, step, clock))
            if now is None:
                continue
            then = before.get((action, step, clock), empty)
            count = now["count"] - then["count"]
            if count <= 0:
                continue
            figures["count"] = int(count)
            figures[f"{clock}_mean_ms"] = round((now["sum"] - then["sum"]) / count * 1000, 3)
            if clock == "wall":
                figures["wall_sum_ms"] = round((now["sum"] - then["sum"]) * 1000, 3)
                bound = _p99_bound(then, now, count)
                figures["wall_p99_ms_at_most"] = None if math.isinf(bound) else bound * 1000
        if figures:
            steps[step] = figures
    return steps
