"""The floor of the scale suite (``bench.floor``) on the session's clusters: a few jobs at a
low rate, each given the dispatcher's writes by the plain client and torn down again, and
the figures the suite prints beside the dispatcher's."""

from __future__ import annotations

from kubernetes import client

from bench import floor
from bench.load import LoadRunner
from bench.timeline import Timelines
from clusters import fixtures
from controller_kit import writes
from trainjob import constants as c

NAMESPACE = "bench-floor-smoke"
RATE, SECONDS, THREADS = 5, 1.0, 2


def _trainjobs(api: client.ApiClient) -> list[dict]:
    return writes.request_json(api, "GET", writes.object_path(
        c.TRAINER_GROUP, c.TRAINER_VERSION, NAMESPACE, c.TRAINJOBS), None)["items"]


def test_the_floor_makes_the_dispatchers_writes_and_times_them(multicluster):
    names = ["manager", *(w.name for w in multicluster.workers)]
    workers = names[1:]
    for name in names:
        fixtures.ensure_namespace(multicluster[name].api, NAMESPACE)
    timelines = Timelines({name: multicluster[name].kubeconfig for name in names}).start()
    runner = LoadRunner(2)
    try:
        figures = floor.measure({name: multicluster[name].kubeconfig for name in names},
                                timelines, runner, workers, RATE, SECONDS, THREADS, NAMESPACE,
                                wait=lambda count: 60)
    finally:
        runner.close()
        timelines.stop()
        for name in names:
            client.CoreV1Api(multicluster[name].api).delete_namespace(NAMESPACE)
    jobs = RATE * int(SECONDS)
    assert (figures["jobs"], figures["dispatched"], figures["missing"]) == (jobs, jobs, 0), \
        figures
    assert (figures["failed"], figures["unfinished"], figures["torn_down"]) == (0, 0, jobs), \
        figures["errors"]
    assert figures["finalizers_swept"] == 0, figures
    latency = figures["latency"]
    assert 0 <= latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"], latency
    for step in ("queue", "patch", "create"):
        timed = figures["writes"][step]
        assert timed["count"] == jobs and timed["p50_ms"] <= timed["p99_ms"], (step, timed)
    # The Placed Event of each job, naming the worker taken in turn (no placement).
    assert figures["events_written"] == jobs, figures
    events = writes.request_json(multicluster.manager.api, "GET", writes.object_path(
        "", "v1", NAMESPACE, "events"), None)["items"]
    placed = [e for e in events if e["reason"] == c.REASON_PLACED
              and e["source"].get("component") == floor.USER_AGENT]
    assert len(placed) == jobs, [(e["reason"], e["message"]) for e in events]
    assert {e["message"] for e in placed} == {f"placed on worker cluster {w}"
                                              for w in workers}, placed
    # Torn down as the dispatcher tears a deleted job down: the copy deleted, then the
    # finalizer lifted, so neither object is left.
    assert _trainjobs(multicluster.manager.api) == [], "manager TrainJobs left"
    for worker in workers:
        assert _trainjobs(multicluster[worker].api) == [], f"copies left on {worker}"
    assert floor.reconcile_threads(("--workers", "3")) == 3
    assert floor.reconcile_threads(()) == 8
