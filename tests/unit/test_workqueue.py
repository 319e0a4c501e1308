"""Work-queue semantics the controllers rely on."""

import threading
import time

import pytest

from clusters.testing import eventually
from controller_kit.controller_metrics import ControllerMetrics, process_registry
from controller_kit.workqueue import ShutDown, WorkQueue


def test_a_key_added_many_times_is_queued_once():
    queue = WorkQueue()
    for _ in range(5):
        queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    assert queue.get(timeout=1) == "a"
    assert queue.get(timeout=1) == "b"
    with pytest.raises(TimeoutError):
        queue.get(timeout=0.05)


def test_a_key_is_never_processed_twice_at_once():
    queue = WorkQueue()
    queue.add("a")
    key = queue.get(timeout=1)
    queue.add("a")  # changed while a worker holds it
    with pytest.raises(TimeoutError):
        queue.get(timeout=0.05)  # not handed to a second worker
    queue.done(key)
    assert queue.get(timeout=1) == "a"  # processed again afterwards


def test_rate_limited_requeue_backs_off_and_forget_resets():
    queue = WorkQueue(base_delay=0.01, max_delay=0.04)
    delays = [queue.add_rate_limited("a") for _ in range(4)]
    assert delays == [0.01, 0.02, 0.04, 0.04]
    queue.forget("a")
    assert queue.failures("a") == 0
    assert queue.add_rate_limited("a") == 0.01


def test_add_after_delivers_no_earlier_than_asked():
    queue = WorkQueue()
    started = time.monotonic()
    queue.add_after("late", 0.1)
    assert queue.get(timeout=2) == "late"
    assert time.monotonic() - started >= 0.1


def test_shutdown_wakes_waiting_workers():
    queue = WorkQueue()
    outcome = []

    def worker():
        try:
            queue.get()
        except ShutDown:
            outcome.append("stopped")

    thread = threading.Thread(target=worker)
    thread.start()
    queue.shutdown()
    thread.join(2)
    assert outcome == ["stopped"]



# ---------------------------------------------------------------- metrics (client-go's)

QUEUE = {"name": "jobs", "controller": "jobs"}


def instrumented(**kwargs):
    registry = process_registry()
    queue = WorkQueue(metrics=ControllerMetrics(registry).queue("jobs"), **kwargs)
    return queue, lambda name, **labels: registry.get_sample_value(name, {**QUEUE, **labels})


def test_adds_count_keys_that_were_not_waiting_and_depth_follows_them():
    queue, sample = instrumented()
    for key in ("a", "a", "b"):
        queue.add(key)
    assert sample("workqueue_adds_total") == 2  # the second "a" coalesced
    assert sample("workqueue_depth", priority="") == 2
    key = queue.get(timeout=1)
    assert sample("workqueue_depth", priority="") == 1
    assert sample("workqueue_queue_duration_seconds_count") == 1
    queue.add(key)  # changed while processed: added again, waits for done
    assert (sample("workqueue_adds_total"), sample("workqueue_depth", priority="")) == (3, 2)
    queue.done(key)
    assert sample("workqueue_work_duration_seconds_count") == 1
    assert {queue.get(timeout=1), queue.get(timeout=1)} == {"a", "b"}
    assert sample("workqueue_depth", priority="") == 0
    assert sample("workqueue_queue_duration_seconds_count") == 3


def test_delayed_and_rate_limited_adds_are_retries_and_count_as_adds_when_due():
    queue, sample = instrumented(base_delay=0.01)
    queue.add_after("later", 0.05)
    queue.add_rate_limited("failed")
    assert sample("workqueue_retries_total") == 2
    assert sample("workqueue_adds_total") == 0  # not due yet
    assert {queue.get(timeout=2), queue.get(timeout=2)} == {"later", "failed"}
    assert sample("workqueue_adds_total") == 2
    queue.shutdown()
    queue.add_after("after shutdown", 0.05)
    assert sample("workqueue_retries_total") == 2


def test_work_in_progress_is_measured_when_read():
    queue, sample = instrumented()
    queue.add("slow")
    queue.add("slower")
    slower = queue.get(timeout=1)
    # The gauges are computed when read: wait on them, not on a clock of our own.
    eventually(lambda: sample("workqueue_longest_running_processor_seconds"),
               lambda seconds: seconds >= 0.05,
               expected="the first key in progress for 50 ms", timeout=5, interval=0.01)
    slow = queue.get(timeout=1)
    # The longest is the first key's time, the unfinished work both keys' in sum: read in
    # that order, the second exceeds the first by the second key's time.
    eventually(lambda: (sample("workqueue_longest_running_processor_seconds"),
                        sample("workqueue_unfinished_work_seconds")),
               lambda seen: seen[0] >= 0.1 and seen[1] >= seen[0] + 0.05,
               expected="(longest, unfinished): the first key in progress for 100 ms, and "
                        "the second for 50 ms besides it", timeout=5, interval=0.01)
    queue.done(slower)
    queue.done(slow)
    assert sample("workqueue_longest_running_processor_seconds") == 0
    assert sample("workqueue_unfinished_work_seconds") == 0
    assert sample("workqueue_work_duration_seconds_sum") >= 0.15


def test_a_queue_made_elsewhere_counts_its_waiting_keys_once_instrumented():
    registry = process_registry()
    queue = WorkQueue()
    queue.add("before")
    queue.instrument(ControllerMetrics(registry).queue("jobs"))
    queue.add("after")
    key = queue.get(timeout=1)
    queue.add(key)  # being processed: waits for done
    depth = registry.get_sample_value("workqueue_depth", {**QUEUE, "priority": ""})
    assert (registry.get_sample_value("workqueue_adds_total", QUEUE), depth) == (3, 2)
