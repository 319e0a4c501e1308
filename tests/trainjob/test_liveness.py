"""Liveness of a controller process, in one process: real work queues and reconcile
workers (controller_kit.service.start_workers) behind a real probe listener. /healthz fails once
keys wait and no worker has taken one for longer than the bound, and answers 200 again
once they are taken; an idle loop and a busy one that keeps taking keys stay live. (The
dispatcher stuck on a frozen apiserver: tests/dispatcher/test_listeners.py.)"""

from __future__ import annotations

import threading
import time

import pytest

from clusters.testing import eventually, holds_for, plain_get
from controller_kit.observability import ObservabilityServer
from controller_kit.service import liveness, start_workers
from controller_kit.workqueue import WorkQueue

BOUND = 1.0  # seconds, --liveness-stall-timeout


@pytest.fixture
def probes():
    """A probe listener whose /healthz asks ``liveness(BOUND)``; the queues a test makes
    are shut down at its end, which takes their workers out of the liveness check."""
    queues: list[WorkQueue] = []
    server = ObservabilityServer(0, None, lambda: (True, "ok"), live=liveness(BOUND)).start()
    server.queues = queues
    yield server
    server.stop()
    for queue in queues:
        queue.shutdown()


def workers(probes, name: str, reconcile, count: int) -> WorkQueue:
    queue = WorkQueue()
    probes.queues.append(queue)
    start_workers(queue, reconcile, count, name, on_error=lambda *_: None)
    return queue


def healthz(probes) -> tuple[int, str]:
    return plain_get(probes.port, "/healthz")


def test_an_idle_loop_is_live(probes):
    workers(probes, "idle", lambda *key: None, 2)
    holds_for(lambda: healthz(probes), lambda answer: answer == (200, "ok"),
              seconds=3 * BOUND, expected="an idle loop to stay live")


def test_keys_no_worker_takes_fail_liveness_until_they_are_taken(probes):
    release = threading.Event()
    queue = workers(probes, "stuck", lambda *key: release.wait(60), 2)
    try:
        for i in range(5):  # two held by the blocked workers, three waiting
            queue.add(("ns", f"job-{i}"))
        _, detail = eventually(lambda: healthz(probes), lambda answer: answer[0] == 500,
                                  expected="/healthz 500 while the workers are stuck",
                                  timeout=10 * BOUND)
        assert "reconcile workers of stuck stuck: 3 keys queued and none taken for" in detail
        assert "--liveness-stall-timeout 1 s" in detail
    finally:
        release.set()
    eventually(lambda: healthz(probes), lambda answer: answer == (200, "ok"),
               expected="/healthz 200 once the keys are taken", timeout=10 * BOUND)


def test_a_busy_loop_that_keeps_taking_keys_is_live(probes):
    # 300 keys of 0.2 s each on 2 workers: keys wait for 30 s, far past the bound, while a
    # worker takes one every 0.1 s.
    queue = workers(probes, "busy", lambda *key: time.sleep(0.2), 2)
    for i in range(300):
        queue.add(("ns", f"job-{i}"))
    holds_for(lambda: healthz(probes), lambda answer: answer == (200, "ok"),
              seconds=3 * BOUND, expected="a busy loop with keys waiting to stay live")
    assert len(queue) > 0, "keys waited throughout the window, three times the bound"


def test_a_stopped_queue_leaves_the_check(probes):
    release = threading.Event()
    queue = workers(probes, "stopping", lambda *key: release.wait(60), 1)
    queue.add(("ns", "held"))
    queue.add(("ns", "waiting"))
    eventually(lambda: healthz(probes)[0], lambda code: code == 500,
               expected="/healthz 500 while stuck", timeout=10 * BOUND)
    queue.shutdown()  # a standby that lost its Lease: its workers end with the queue
    release.set()
    eventually(lambda: healthz(probes), lambda answer: answer == (200, "ok"),
               expected="/healthz 200 once the stopped queue's workers have ended",
               timeout=10 * BOUND)
