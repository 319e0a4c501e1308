"""Reconcile step timing: each step's wall and CPU time under the action performed, and
the queue wait the work queue measured for the key."""

from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry

from controller_kit import step_timing
from controller_kit.controller_metrics import ControllerMetrics
from controller_kit.workqueue import WorkQueue


def _samples(registry: CollectorRegistry, suffix: str) -> dict[tuple, float]:
    return {(s.labels["action"], s.labels["step"], s.labels["clock"]): s.value
            for family in registry.collect() for s in family.samples
            if s.name == "steps_seconds" + suffix}


def test_each_step_is_observed_under_the_action_with_wall_and_cpu_time():
    registry = CollectorRegistry()
    histogram = step_timing.histogram(registry, "steps_seconds", "test")
    steps = step_timing.start(histogram, queued=0.25)
    sum(range(200_000))  # CPU spent in the first step
    step_timing.lap("decide")
    answered = threading.Event()  # a wait on another thread: wall time, (almost) no CPU
    threading.Timer(0.05, answered.set).start()
    assert answered.wait(5)
    step_timing.lap("patch")
    steps.finish("Place")
    counts, sums = _samples(registry, "_count"), _samples(registry, "_sum")
    assert counts == {("Place", step, clock): 1.0
                      for step in ("decide", "patch", "rest") for clock in ("wall", "cpu")
                      } | {("Place", "queue", "wall"): 1.0}, counts
    assert sums[("Place", "queue", "wall")] == 0.25
    assert sums[("Place", "decide", "cpu")] > 0
    assert sums[("Place", "patch", "wall")] >= 0.05
    assert sums[("Place", "patch", "cpu")] < sums[("Place", "patch", "wall")] / 2, (
        "waiting must cost wall time, not CPU", sums)


def test_a_lap_without_a_timed_reconcile_on_this_thread_does_nothing():
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(step_timing.lap("x")))
    thread.start()
    thread.join()
    assert outcome == [None]


def test_the_queue_tells_each_worker_how_long_its_key_waited():
    registry = CollectorRegistry()
    queue = WorkQueue()
    assert queue.waited() is None
    queue.instrument(ControllerMetrics(registry).queue("test"))
    # Read before adding: the wait the queue counts starts inside ``add``, and a busy
    # machine may run other threads between ``add`` returning and the next line.
    before = time.monotonic()
    queue.add("a")
    assert queue.get() == "a"
    waited = queue.waited()
    assert waited is not None and 0 <= waited <= time.monotonic() - before, waited
    seen = []
    thread = threading.Thread(target=lambda: seen.append(queue.waited()))
    thread.start()
    thread.join()
    assert seen == [None], "another thread took no key"


def test_a_reconcile_so_far_reads_as_its_queue_wait_and_steps_in_ms():
    registry = CollectorRegistry()
    histogram = step_timing.histogram(registry, "steps_seconds", "test")
    steps = step_timing.start(histogram, queued=0.00021)
    step_timing.lap("decide")
    step_timing.lap("patch")
    text = step_timing.so_far()
    assert text.startswith("queued 0.21 ms; decide "), text
    assert ", patch " in text and text.endswith(" ms"), text
    # Then the same steps' CPU time.
    assert "; cpu decide " in text, text
    steps.finish("Place")
    # Without a queue wait (a queue without metrics), the steps alone.
    step_timing.start(histogram, queued=None)
    step_timing.lap("decide")
    assert step_timing.so_far().startswith("decide "), step_timing.so_far()


def test_so_far_without_a_timed_reconcile_on_this_thread_is_empty():
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(step_timing.so_far()))
    thread.start()
    thread.join()
    assert outcome == [""]
