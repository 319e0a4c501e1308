"""Figures whose spread is known: a step repeated, each time after the machine settled.

A latency tail on a two-core machine shared with four apiservers is decided by what else
runs meanwhile: the Event backlog a burst leaves, an apiserver's garbage collection or
etcd compaction. So before each repeat the benchmark waits until the dispatcher has no
Event left to write and the machine's CPU is quiet. A step's percentiles are taken over
the samples of all its repeats together (at 50 jobs/s, three repeats of 10 s make the
p99 the 15th largest of 1,500, where one repeat's p99 is the 5th largest of 500 and moves
with a handful of slow answers), reported with each repeat's own minimum, median and
maximum.

Once the machine is quiet, ``settle`` also times the host's reference work
(``bench.host_speed``): on a shared host the same work can take three quarters longer for
seconds at a time, and a repeat's figures are read with its host's speed beside them.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable

from bench import host_speed
from bench.footprint import host_cpu_times
from bench.stats import summary_ms

log = logging.getLogger(__name__)

# Busy share of the machine's CPU, over one window, under which it counts as quiet: the
# clusters' own idle work (leases, controllers' resyncs) stays well below it.
QUIET_SHARE = 0.35
QUIET_WINDOW = 1.0
SETTLE_TIMEOUT = 60.0
# Three timings of the reference work (about 80 ms of CPU) before each repeat.
REFERENCE_REPEATS = 3
PERCENTILES = ("p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms")


def busy_share(window: float = QUIET_WINDOW) -> float:
    """The machine's busy CPU share over the next ``window`` seconds."""
    busy0, total0 = host_cpu_times()
    threading.Event().wait(window)  # a measurement window, not a wait for something
    busy1, total1 = host_cpu_times()
    return (busy1 - busy0) / (total1 - total0) if total1 > total0 else 0.0


def settle(dispatcher=None, timeout: float = SETTLE_TIMEOUT) -> dict:
    """Wait until ``dispatcher`` (a ServiceProcess, or None) has no Event queued and the
    machine is quiet; how long that took, whether it happened within ``timeout`` (a
    machine that stays busy is reported, not waited for forever) and the host's speed
    then (``reference_ms``, CPU ms of the reference work)."""
    started = time.monotonic()
    while True:
        queued = dispatcher.metric("dispatcher_events_queued") if dispatcher else 0.0
        busy = busy_share()
        waited = time.monotonic() - started
        settled = queued == 0 and busy < QUIET_SHARE
        if settled or waited >= timeout:
            break
    outcome = {"seconds": round(waited, 1), "settled": settled, "busy_share": round(busy, 3)}
    if not settled:
        log.warning("the machine did not settle within %.0f s (busy %.0f%%, %d Events "
                    "queued); measuring anyway", timeout, busy * 100, queued)
        outcome["events_queued"] = int(queued)
    outcome["reference_ms"] = host_speed.reference_ms(REFERENCE_REPEATS)
    return outcome


def host_speeds(runs: list[dict]) -> list[float]:
    """The reference work's CPU ms before each repeat that recorded it (``settle``)."""
    return [run["settle"]["reference_ms"] for run in runs
            if (run.get("settle") or {}).get("reference_ms") is not None]


def spread(summaries: list[dict]) -> dict:
    """Per percentile, the minimum, median and maximum over the repeats' summaries
    (``stats.summary_ms`` shapes); a repeat that saw nothing does not count as a zero."""
    usable = [s for s in summaries if s.get("count")]
    out = {}
    for name in PERCENTILES:
        values = [s[name] for s in usable if s.get(name) is not None]
        out[name] = ({"min": min(values), "median": round(statistics.median(values), 1),
                      "max": max(values)} if values else None)
    return out


def run_repeats(run_once: Callable[[int], dict], repeats: int, dispatcher=None,
                settled: bool = True) -> list[dict]:
    """``run_once(index)`` for each repeat, after ``settle`` (unless not ``settled``);
    each run's figures get the settle's outcome as ``settle``."""
    runs = []
    for index in range(repeats):
        outcome = settle(dispatcher) if settled else None
        runs.append({**run_once(index), "settle": outcome})
    return runs


def percentiles(runs: list[dict], samples: str) -> dict:
    """The runs' ``samples`` (seconds) as percentiles over all of them, with (several
    runs) how many runs and each percentile's ``spread`` over the runs."""
    pooled = summary_ms([x for run in runs for x in run[samples]])
    if len(runs) == 1:
        return pooled
    return {**pooled, "repeats": len(runs),
            "spread": spread([summary_ms(run[samples]) for run in runs])}
