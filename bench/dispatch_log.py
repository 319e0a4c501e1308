"""Where the slowest dispatches' time went, from the dispatcher's log.

The dispatcher logs one line per copy it creates (or adopts), with the reconcile's queue
wait and the wall time of each step (``placed on worker-2, copy created (queued 0.21 ms;
decide 0.05, place 0.41, patch 4.12, create 5.03 ms)``). Joined with the benchmark's own
latency of the same job (manager ADDED -> copy ADDED, seen by the benchmark's watches),
that splits a slow dispatch into the time inside the dispatcher (queue wait, its own
steps), its two writes (PATCH, create: mostly the apiservers answering) and the rest: the
watch events reaching the dispatcher and the benchmark.
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

from bench.timeline import Key

# The text format's line: the message, then the fields of the job it is about.
_LINE = re.compile(
    r"TrainJob (?P<namespace>[^/\s]+)/(?P<name>\S+) placed on \S+, copy (?:created|adopted) "
    r"\((?:queued (?P<queued>[\d.]+) ms; )?(?P<steps>[^)]*) ms\)")
_STEP = re.compile(r"(\w+) ([\d.]+)")
QUEUE = "queue"
# The rest of the latency: the watch events reaching the dispatcher and the benchmark.
# Negative when the benchmark saw the copy before the dispatcher had read the create's
# answer (the create step ends there): the parts overlap, they do not partition.
OUTSIDE = "outside"
WRITES = ("patch", "create")
# The line gives each step's CPU time after its wall time (``...; cpu decide 0.04, place
# 0.38 ms``): read as ``place_cpu`` and so on.
CPU_PART = " ms; cpu "
CPU_SUFFIX = "_cpu"


def read(log_file: Path, namespace: str) -> dict[Key, dict[str, float]]:
    """Per job of ``namespace``: seconds of queue wait and of each step of the reconcile
    that created (or adopted) its copy, and each step's CPU seconds as ``<step>_cpu`` (the
    last such line wins)."""
    found: dict[Key, dict[str, float]] = {}
    with open(log_file, errors="replace") as lines:
        for line in lines:
            if "placed on" not in line:
                continue
            match = _LINE.search(line)
            if match is None or match["namespace"] != namespace:
                continue
            found[(namespace, match["name"])] = parse_steps(match["queued"], match["steps"])
    return found


def parse_steps(queued: str | None, text: str) -> dict[str, float]:
    """Seconds of queue wait (``queued``, in ms, or None) and of each step of ``text``
    (``step_timing.so_far``'s wall steps, then ``; cpu`` and the same steps' CPU time,
    read as ``<step>_cpu``)."""
    wall, _, cpu = text.partition(CPU_PART)
    steps = {step: float(ms) / 1000 for step, ms in _STEP.findall(wall)}
    steps.update({step + CPU_SUFFIX: float(ms) / 1000 for step, ms in _STEP.findall(cpu)})
    if queued is not None:
        steps = {QUEUE: float(queued) / 1000, **steps}
    return steps


def slowest(latencies: dict[Key, float], steps: dict[Key, dict[str, float]],
            share: float = 0.01) -> dict | None:
    """The slowest ``share`` of the jobs whose steps are known (at least one): their mean
    latency and its split, in ms, into each logged step and the rest (``OUTSIDE``, which
    may be negative); and as shares of that latency: the queue wait inside the dispatcher,
    its own steps, its two writes (the apiservers answering them, mostly) and the rest.
    None without a job whose steps are known."""
    known = [(latency, {step: value for step, value in steps[key].items()
                        if not step.endswith(CPU_SUFFIX)})
             for key, latency in latencies.items() if key in steps]
    if not known:
        return None
    known.sort(key=lambda item: item[0], reverse=True)
    tail = known[:max(1, math.ceil(len(known) * share))]
    names = list(dict.fromkeys(step for _, logged in tail for step in logged))
    mean = {step: statistics.fmean(logged.get(step, 0.0) for _, logged in tail)
            for step in names}
    latency = statistics.fmean(latency for latency, _ in tail)
    mean[OUTSIDE] = latency - sum(mean.values())
    parts = {"queue": mean.get(QUEUE, 0.0),
             "dispatcher steps": sum(v for step, v in mean.items()
                                     if step not in (QUEUE, OUTSIDE, *WRITES)),
             "writes": sum(mean.get(step, 0.0) for step in WRITES),
             "the rest": mean[OUTSIDE]}
    return {
        "jobs": len(tail), "of": len(known),
        "latency_ms": round(latency * 1000, 1),
        "mean_ms": {step: round(v * 1000, 2) for step, v in mean.items()},
        "shares": {part: round(v / latency, 3) if latency else None
                   for part, v in parts.items()},
    }
