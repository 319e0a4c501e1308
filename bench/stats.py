"""Percentiles of a sample, in milliseconds, the way every figure of the report is given."""

from __future__ import annotations

import math


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an already sorted, non-empty list."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def summary_ms(seconds: list[float]) -> dict:
    """count, p50/p90/p99/max and mean of ``seconds``, in ms (None when empty)."""
    values = sorted(seconds)
    if not values:
        return {"count": 0, "p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None,
                "mean_ms": None}
    return {
        "count": len(values),
        "p50_ms": round(percentile(values, 50) * 1000, 1),
        "p90_ms": round(percentile(values, 90) * 1000, 1),
        "p99_ms": round(percentile(values, 99) * 1000, 1),
        "max_ms": round(values[-1] * 1000, 1),
        "mean_ms": round(sum(values) / len(values) * 1000, 1),
    }
