"""Where one reconcile's time goes, step by step, in wall time and in the CPU time of the
thread that runs it (``time.thread_time``: waiting for the apiserver or for the GIL costs
none). A ``Steps`` is started when a worker takes a key; the reconciler marks the end of
each step (``lap``) and, once it knows what it did, observes the laps under that action's
name (``finish``). Queue wait, the time from the key being added (a watch event reaching
the controller) to a worker taking it, is observed as the step ``queue`` (wall only).

A thread runs one reconcile at a time, so the current ``Steps`` is kept per thread: the
code that performs a step marks it without being handed the timer.
"""

from __future__ import annotations

import threading
import time

from prometheus_client import Histogram

from controller_kit.controller_metrics import children

# From 0.1 ms (a decision from caches) to 2.5 s (an apiserver under a burst).
STEP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                0.25, 0.5, 1.0, 2.5)
WALL, CPU = "wall", "cpu"
QUEUE = "queue"

_current = threading.local()


class Steps:
    def __init__(self, histogram, queued: float | None = None):
        # ``histogram``: the step histogram's ``labels`` (cached children are cheaper).
        self._histogram = histogram
        self._queued = queued
        self._laps: list[tuple[str, float, float]] = []
        self._wall = time.perf_counter()
        self._cpu = time.thread_time()

    def lap(self, step: str) -> None:
        """The step ``step`` ends now (it began where the previous one ended)."""
        wall, cpu = time.perf_counter(), time.thread_time()
        self._laps.append((step, wall - self._wall, cpu - self._cpu))
        self._wall, self._cpu = wall, cpu

    def so_far(self) -> str:
        """The queue wait and the steps lapped so far, in wall ms, then the same steps in
        CPU ms, for a log line: ``queued 0.21 ms; decide 0.05, place 0.41, patch 4.12 ms;
        cpu decide 0.05, place 0.39, patch 0.30 ms``."""
        laps = ", ".join(f"{step} {wall * 1000:.2f}" for step, wall, _ in self._laps)
        cpu = ", ".join(f"{step} {used * 1000:.2f}" for step, _, used in self._laps)
        queued = f"queued {self._queued * 1000:.2f} ms; " if self._queued is not None else ""
        return f"{queued}{laps} ms; cpu {cpu} ms" if laps else f"{queued} ms"

    def finish(self, action: str, last_step: str = "rest") -> None:
        """Observe every lap (and what followed the last one as ``last_step``) under
        ``action``."""
        self.lap(last_step)
        if self._queued is not None:
            self._histogram(action, QUEUE, WALL).observe(self._queued)
        for step, wall, cpu in self._laps:
            self._histogram(action, step, WALL).observe(wall)
            self._histogram(action, step, CPU).observe(cpu)


def start(histogram, queued: float | None) -> Steps:
    """Start timing the reconcile this thread runs now; ``histogram`` is what
    ``histogram()`` returned."""
    _current.steps = Steps(histogram, queued)
    return _current.steps


def lap(step: str) -> None:
    """Mark the end of ``step`` of the reconcile this thread runs (nothing when none is
    timed)."""
    steps = getattr(_current, "steps", None)
    if steps is not None:
        steps.lap(step)


def so_far() -> str:
    """``Steps.so_far`` of the reconcile this thread runs (empty when none is timed)."""
    steps = getattr(_current, "steps", None)
    return steps.so_far() if steps is not None else ""


def histogram(registry, name: str, documentation: str):
    """The step histogram on ``registry``, as the function from (action, step, clock) to
    its child that ``start`` takes."""
    return children(Histogram(name, documentation, ["action", "step", "clock"],
                              registry=registry, buckets=STEP_BUCKETS))
