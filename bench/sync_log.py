"""Where the slowest status changes' time went, from the dispatcher's log.

The dispatcher logs one line per status change it copies back to the manager, with the
wall-clock time its watch of the worker delivered the change, the reconcile's queue wait
and the wall time of each step (``status copied from worker-1 (seen at 1764377400.123456;
queued 0.21 ms; decide 0.05, write 4.12 ms; cpu ...)``). Joined with the benchmark's own
times of the same change (its status write on the worker, sent; the manager object showing
it, from its watch), a change's lag splits into:

* ``to dispatcher``: the write on the worker's apiserver, its watch event, and the
  dispatcher's watch thread reading it (GIL waits, a garbage collection, a relist of that
  cache all land here);
* ``queue``: the key waiting for a reconcile worker;
* the reconcile's own steps (``decide``, ``write``: the manager's PUT answered);
* ``to benchmark``: the manager's watch event reaching the benchmark (the rest; negative
  when the benchmark saw the new status before the dispatcher had read the PUT's answer:
  the parts overlap there, they do not partition).

Both processes read the same wall clock, on one machine.
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

from bench.dispatch_log import CPU_SUFFIX, QUEUE, parse_steps
from bench.timeline import Key

_LINE = re.compile(
    r"TrainJob (?P<namespace>[^/\s]+)/(?P<name>\S+) status copied from \S+ "
    r"\(seen at (?P<seen>[\d.]+); (?:queued (?P<queued>[\d.]+) ms; )?(?P<steps>[^)]*) ms\)")
TO_DISPATCHER = "to dispatcher"
TO_BENCHMARK = "to benchmark"

# One logged copy: when the dispatcher saw the change, and its reconcile's steps.
Logged = tuple[float, dict[str, float]]


def read(log_file: Path, namespaces: set[str]) -> dict[Key, list[Logged]]:
    """Per job of ``namespaces``: each status copy logged, in the log's order."""
    found: dict[Key, list[Logged]] = {}
    with open(log_file, errors="replace") as lines:
        for line in lines:
            if "status copied from" not in line:
                continue
            match = _LINE.search(line)
            if match is None or match["namespace"] not in namespaces:
                continue
            found.setdefault((match["namespace"], match["name"]), []).append(
                (float(match["seen"]), parse_steps(match["queued"], match["steps"])))
    return found


def segments(written: float, shown: float, logged: list[Logged]) -> dict[str, float] | None:
    """The split of one change's lag (the benchmark wrote it at ``written``, saw it on the
    manager at ``shown``) by the first copy logged after ``written``; None when none was."""
    after = [entry for entry in logged if entry[0] >= written]
    if not after:
        return None
    seen, steps = after[0]
    parts = {TO_DISPATCHER: seen - written}
    parts.update({step: value for step, value in steps.items()
                  if not step.endswith(CPU_SUFFIX)})
    parts[TO_BENCHMARK] = (shown - written) - sum(parts.values())
    return parts


def slowest(changes: list[tuple[float, dict[str, float]]], share: float = 0.01) -> dict | None:
    """The slowest ``share`` of ``changes`` (lag, its segments): their mean lag and each
    segment's mean, in ms, and the segment that took most of it. None without changes."""
    if not changes:
        return None
    ranked = sorted(changes, key=lambda change: change[0], reverse=True)
    tail = ranked[:max(1, math.ceil(len(ranked) * share))]
    names = list(dict.fromkeys(name for _, parts in tail for name in parts))
    mean = {name: statistics.fmean(parts.get(name, 0.0) for _, parts in tail)
            for name in names}
    everyone = {name: statistics.median(parts.get(name, 0.0) for _, parts in ranked)
                for name in names}
    return {
        "changes": len(tail), "of": len(ranked),
        "lag_ms": round(statistics.fmean(lag for lag, _ in tail) * 1000, 1),
        "mean_ms": {name: round(value * 1000, 2) for name, value in mean.items()},
        "median_of_all_ms": {name: round(value * 1000, 2) for name, value in everyone.items()},
        "largest": max(mean, key=mean.get),
        "queue_ms": round(mean.get(QUEUE, 0.0) * 1000, 2),
    }
