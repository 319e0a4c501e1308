"""The capacity metrics (``dispatcher_worker_capacity``): computed at scrape time from the
same totals the dashboard draws, one series set per registered worker, cheap with many
Nodes (pure: no API server)."""

from __future__ import annotations

import time
from decimal import Decimal as D

from dispatcher.dashboard import cluster_view
from dispatcher.metrics import DispatcherMetrics
from dispatcher.room.capacity import CAPACITY_STATES, capacity_by_resource
from dispatcher.workers.cluster import WorkerCluster
from trainjob.constants import JOBSET_NAME_LABEL

GPU = "nvidia.com/gpu"


def _worker(name: str, nodes: int, *, cpu: str = "8", gpu: str | None = None) -> WorkerCluster:
    worker = WorkerCluster(name=name, order=0, fingerprint=name)
    for index in range(nodes):
        allocatable = {"cpu": cpu, "memory": "32Gi", "pods": "110"}
        if gpu is not None:
            allocatable[GPU] = gpu
        worker.capacity.on_node("ADDED", None, {
            "metadata": {"name": f"{name}-{index}"},
            "status": {"allocatable": allocatable,
                       "conditions": [{"type": "Ready", "status": "True"}]}})
    return worker


def _pod(name: str, node: str, cpu: str, gpu: str | None = None, job: str | None = None) -> dict:
    requests = {"cpu": cpu, **({GPU: gpu} if gpu else {})}
    return {"metadata": {"namespace": "team-a", "name": name,
                         "labels": {JOBSET_NAME_LABEL: job} if job else {}},
            "spec": {"nodeName": node,
                     "containers": [{"name": "c", "resources": {"requests": requests,
                                                                "limits": requests}}]},
            "status": {"phase": "Running"}}


def _series(metrics: DispatcherMetrics, name: str) -> dict[tuple, float]:
    return {tuple(sorted(sample.labels.items())): sample.value
            for family in metrics.registry.collect() if family.name == name
            for sample in family.samples}


def test_capacity_series_are_the_dashboards_amounts_and_leave_with_the_worker():
    worker = _worker("worker-1", 2, gpu="4")
    worker.capacity.on_pod("ADDED", None, _pod("p", "worker-1-0", "3", gpu="1"))
    worker.capacity.reserve(("team-a", "waiting"), {"cpu": D(2), GPU: D(2)}, pods=1)
    workers = [worker]
    metrics = DispatcherMetrics()
    metrics.count_capacity(lambda: list(workers))

    series = _series(metrics, "dispatcher_worker_capacity")
    def value(resource: str, state: str) -> float:
        return series[(("cluster", "worker-1"), ("resource", resource), ("state", state))]

    assert [value(GPU, state) for state in CAPACITY_STATES] == [8, 1, 2, 5]
    assert [value("cpu", state) for state in CAPACITY_STATES] == [16, 3, 2, 11]
    assert value("memory", "allocatable") == 64 * 2**30
    # The dashboard's row of each resource says the same amounts.
    for row in cluster_view(worker, 0)["capacity"]:
        for state in CAPACITY_STATES:
            assert D(value(row["resource"], state)) == \
                capacity_by_resource(worker.capacity.totals())[row["resource"]][state]
    assert {labels[1][1] for labels in series} == {"cpu", "memory", "pods", GPU}

    workers.clear()
    assert _series(metrics, "dispatcher_worker_capacity") == {}


def test_a_scrape_of_a_thousand_nodes_is_cheap():
    worker = _worker("big", 1000, cpu="64", gpu="8")
    for index in range(0, 1000, 2):
        worker.capacity.on_pod("ADDED", None, _pod(f"p{index}", f"big-{index}", "1", "1",
                                                   job=f"job-{index % 50}"))
    for job in range(50):
        worker.capacity.reserve(("team-a", f"job-{job}"), {"cpu": D(20), GPU: D(20)}, pods=20)
    metrics = DispatcherMetrics()
    metrics.count_capacity(lambda: [worker])
    scrapes = 20
    # After a change each time (a pod bound): the totals are computed afresh. A scrape's
    # cost is this thread's own CPU time: on a loaded machine wall time is mostly waiting
    # for a core.
    started = time.thread_time()
    for index in range(scrapes):
        worker.capacity.on_pod("ADDED", None, _pod(f"new-{index}", "big-1", "1"))
        series = _series(metrics, "dispatcher_worker_capacity")
    changed = (time.thread_time() - started) / scrapes
    # Nothing changed since the last scrape: the totals are reused.
    started = time.thread_time()
    for _ in range(scrapes):
        series = _series(metrics, "dispatcher_worker_capacity")
    unchanged = (time.thread_time() - started) / scrapes
    assert series[(("cluster", "big"), ("resource", GPU), ("state", "allocatable"))] == 8000
    assert series[(("cluster", "big"), ("resource", GPU), ("state", "used"))] == 500
    assert series[(("cluster", "big"), ("resource", "cpu"), ("state", "used"))] == 500 + scrapes
    print(f"one scrape of 1,000 Nodes: {changed * 1000:.2f} ms of CPU after a change, "
          f"{unchanged * 1000:.2f} ms without")
    assert changed < 0.1, f"a scrape of 1,000 Nodes took {changed * 1000:.1f} ms of CPU"
