"""Work-queue semantics the controllers rely on."""

import threading
import time

import pytest

from trainjob.workqueue import ShutDown, WorkQueue


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

