"""The controller-runtime metrics every process exposes, on its one registry: reconcile
results and workers (through the shared reconcile workers), API requests that got no answer,
and both processes' registries side by side in one Python process."""

import threading

from kubernetes import client
from prometheus_client import generate_latest

from clusters.controlplane import free_port
from clusters.testing import eventually
from controller_kit.controller_metrics import ControllerMetrics, process_registry
from controller_kit.kubeclient import api_client
from controller_kit.service import Requeue, start_workers
from controller_kit.workqueue import WorkQueue
from dispatcher.metrics import DispatcherMetrics
from training_operator.metrics import OperatorMetrics


def test_each_process_registry_has_the_process_and_python_collectors_and_no_clash():
    registries = [DispatcherMetrics().registry, DispatcherMetrics().registry,
                  OperatorMetrics().registry]
    for registry in registries:
        text = generate_latest(registry).decode()
        for family in ("process_cpu_seconds_total", "process_resident_memory_bytes",
                       "python_info{", "python_gc_collections_total{"):
            assert family in text, f"{family} missing"


def test_reconciles_are_counted_by_result_with_workers_in_use():
    registry = process_registry()
    metrics = ControllerMetrics(registry).reconciles("jobs")
    queue = WorkQueue(base_delay=0.01)
    seen: set[str] = set()
    inside, release = threading.Event(), threading.Event()

    def reconcile(key: str) -> None:
        if key == "blocks":
            inside.set()
            release.wait(5)
            return
        first = key not in seen
        seen.add(key)
        if key == "fails once" and first:
            raise RuntimeError("boom")
        if key == "waits":
            raise Requeue(60, "look again in a minute")
        if key == "again" and first:
            raise Requeue(0, "look again at once")

    def sample(name: str, **labels) -> float:
        return registry.get_sample_value(name, {"controller": "jobs", **labels})

    threads = start_workers(queue, reconcile, 3, "test",
                            on_error=lambda *_: None, metrics=metrics)
    try:
        assert sample("controller_runtime_max_concurrent_reconciles") == 3
        queue.add(("blocks",))
        assert inside.wait(5)
        assert sample("controller_runtime_active_workers") == 1
        release.set()
        for key in ("fails once", "waits", "again"):
            queue.add((key,))
        # blocks, fails once then succeeds, waits, asks again at once then succeeds.
        done = {"success": 3, "error": 1, "requeue_after": 1, "requeue": 1}
        eventually(lambda: ({result: sample("controller_runtime_reconcile_total", result=result)
                             for result in done},
                            sample("controller_runtime_active_workers")),
                   lambda seen: all(seen[0][r] >= n for r, n in done.items()) and not seen[1],
                   expected=f"reconciles counted {done} and no worker active", timeout=5,
                   interval=0.02)
        assert {result: sample("controller_runtime_reconcile_total", result=result)
                for result in done} == done
        assert sample("controller_runtime_reconcile_errors_total") == 1
        assert sample("controller_runtime_reconcile_time_seconds_count") == 6
        assert sample("controller_runtime_active_workers") == 0
    finally:
        queue.shutdown()
        for thread in threads:
            thread.join(5)


def test_a_request_without_an_answer_is_counted_with_code_error():
    """client-go's ``<error>`` code: here the apiserver's port has nobody listening."""
    registry = process_registry()
    metrics = ControllerMetrics(registry)
    port = free_port()
    host = f"127.0.0.1:{port}"
    api = api_client({
        "apiVersion": "v1", "kind": "Config", "current-context": "gone",
        "clusters": [{"name": "gone", "cluster": {"server": f"http://{host}"}}],
        "users": [{"name": "nobody", "user": {}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "nobody"}}]},
        qps=100, burst=10, observer=metrics.observe_request, request_timeout=2)
    try:
        client.CoreV1Api(api).list_namespace()
    except Exception:  # noqa: BLE001 - the refusal is the point
        pass
    labels = {"verb": "GET", "host": host}
    assert registry.get_sample_value("rest_client_requests_total",
                                     {"code": "<error>", "method": "GET", "host": host}) == 1
    assert registry.get_sample_value("rest_client_request_duration_seconds_count", labels) == 1
    assert registry.get_sample_value("rest_client_rate_limiter_duration_seconds_count",
                                     labels) == 1


def test_the_leader_gauge_shows_a_standby_as_0():
    registry = process_registry()
    leader = ControllerMetrics(registry).leader("my-lease")

    def sample():
        return registry.get_sample_value("leader_election_master_status", {"name": "my-lease"})

    assert sample() == 0
    leader.leading(True)
    assert sample() == 1
    leader.leading(False)
    assert sample() == 0
