"""Standalone mode's waiting line on real clusters: jobs waiting for room get it highest
priority first (the value of the manager's PriorityClass their runtime's pod templates
name), whatever order they came in and were looked at; a lower one still goes where no
higher one could ever fit; the line is in the dashboard's /api/state.

Room is an extended resource of the test's own (``example.com/<namespace>``) on Nodes the
test adds, filled by jobs that hold all of it; a deleted filler frees it. Pods of these
runtimes run until deleted. The PriorityClasses exist on the workers too (their pods name
them; Kubernetes refuses a pod naming a class its cluster lacks), and never preempt: the
dispatcher decides who goes next, and nothing running is displaced."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import fixtures, worker_stack
from clusters.testing import eventually, holds_for
from trainjob import constants as c

from dispatch_helpers import TRAINER, create, get, placement, trainjob, wait_pending, wait_placed

HIGH, LOW = "dispatch-order-high", "dispatch-order-low"
PRIORITIES = {HIGH: 1000, LOW: 10}


@pytest.fixture(scope="module")
def priority_runtimes(dispatch_env):
    """PriorityClasses on every cluster; on each worker a runtime naming each (in every
    replicated job: the job counts at the highest its pods ask) and one naming none."""
    env = dispatch_env
    for cluster in env.multicluster:
        scheduling = client.SchedulingV1Api(cluster.api)
        for name, value in PRIORITIES.items():
            scheduling.create_priority_class({
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": value, "preemptionPolicy": "Never"})
    for worker in env.multicluster.workers:
        for name, priority_class in ((HIGH, HIGH), (LOW, LOW), ("dispatch-order-none", None)):
            fixtures.install_runtime(worker.api, _runtime(name, priority_class))
    yield
    for worker in env.multicluster.workers:
        for name in (HIGH, LOW, "dispatch-order-none"):
            worker.custom.delete_cluster_custom_object(*TRAINER, c.CLUSTERTRAININGRUNTIMES, name)
    for cluster in env.multicluster:
        for name in PRIORITIES:
            try:
                client.SchedulingV1Api(cluster.api).delete_priority_class(name)
            except ApiException as err:
                if err.status != 404:
                    raise


def _runtime(name: str, priority_class: str | None) -> dict:
    runtime = fixtures.torch_runtime(
        name, cpu="100m", memory="128Mi",
        pod_annotations={worker_stack.OUTCOME_ANNOTATION: worker_stack.OUTCOME_NEVER})
    if priority_class:
        for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
            job["template"]["spec"]["template"]["spec"]["priorityClassName"] = priority_class
    return runtime


@pytest.fixture
def room(dispatch_env, namespace):
    """Add Nodes with ``units`` of this test's resource on each worker (``room({"worker-1":
    2})``); they go at the end."""
    env = dispatch_env
    added = []

    def make(units: dict[str, int]) -> str:
        resource = f"example.com/{namespace}"
        for worker, amount in units.items():
            node = f"order-{namespace}"
            fixtures.add_node(env.multicluster[worker].api, node,
                              {"cpu": "8", "memory": "16Gi", "pods": "110",
                               resource: str(amount)})
            added.append((worker, node))
        return resource

    yield make
    for worker, node in added:
        env.multicluster[worker].core.delete_node(node)


def _job(name: str, runtime: str, resource: str, units: int = 1, nodes: int = 1) -> dict:
    return trainjob(name, runtime=runtime, num_nodes=nodes,
                    requests={"cpu": "10m", resource: str(units)})


def _delete(env, namespace: str, name: str) -> None:
    env.manager.custom.delete_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, name)


def _line(env, namespace: str) -> list[tuple[str, int]]:
    """The dispatcher's waiting line for this namespace, from its dashboard's JSON."""
    status, body = env.dispatcher.get("/api/state")
    assert status == 200, f"expected /api/state to answer 200; saw {status}: {body[:200]}"
    return [(entry["name"], entry["priority"]) for entry in json.loads(body)["waitingLine"]
            if entry["namespace"] == namespace]


def _placed(env, namespace: str, names) -> dict[str, str | None]:
    return {name: placement(get(env.manager, namespace, name)) for name in names}


def test_freed_room_goes_to_the_highest_priority_first(dispatch_env, namespace,
                                                       priority_runtimes, room):
    env = dispatch_env
    resource = room({"worker-1": 2, "worker-2": 2})
    # Fillers (no class: priority 0) take all of it, one per worker.
    for name in ("filler-1", "filler-2"):
        create(env.manager, namespace, _job(name, "dispatch-order-none", resource, nodes=2))
    fillers = {name: wait_placed(env, namespace, name)[0] for name in ("filler-1", "filler-2")}
    assert sorted(fillers.values()) == ["worker-1", "worker-2"], fillers

    # Low jobs first, high ones after: arrival order is the opposite of priority.
    for name in ("low-1", "low-2"):
        create(env.manager, namespace, _job(name, LOW, resource))
        wait_pending(env, namespace, name, f"needs 1 {resource}, 0 free")
    for name in ("high-1", "high-2"):
        create(env.manager, namespace, _job(name, HIGH, resource))
        wait_pending(env, namespace, name, f"needs 1 {resource}, 0 free")
    eventually(lambda: _line(env, namespace), lambda line: line == [
        ("high-1", 1000), ("high-2", 1000), ("low-1", 10), ("low-2", 10)],
        expected="the waiting line high-1, high-2 (1000), then low-1, low-2 (10)")

    # Two units free on one worker: both high jobs get them, neither low one does.
    _delete(env, namespace, "filler-1")
    freed = fillers["filler-1"]
    for name in ("high-1", "high-2"):
        assert wait_placed(env, namespace, name)[0] == freed
    holds_for(lambda: _placed(env, namespace, ("low-1", "low-2")),
              lambda seen: seen == {"low-1": None, "low-2": None}, seconds=3,
              expected="both low jobs still waiting")
    assert _line(env, namespace) == [("low-1", 10), ("low-2", 10)]

    # The other worker's room frees: the low jobs, oldest first, take it.
    _delete(env, namespace, "filler-2")
    for name in ("low-1", "low-2"):
        assert wait_placed(env, namespace, name)[0] == fillers["filler-2"]
    eventually(lambda: _line(env, namespace), lambda line: line == [],
               expected="nobody of this test left in the waiting line")


def test_a_lower_job_goes_where_the_waiting_higher_one_can_never_fit(dispatch_env, namespace,
                                                                      priority_runtimes, room):
    env = dispatch_env
    # worker-1's Node has 2 units, worker-2's 4: a pod of 3 can only ever go to worker-2.
    resource = room({"worker-1": 2, "worker-2": 4})
    # Biggest filler first: each fits one worker only, whichever Node the dispatcher's
    # informers have seen first (a worker whose Node it has not seen yet has no room).
    create(env.manager, namespace, _job("filler-2", "dispatch-order-none", resource, nodes=3))
    assert wait_placed(env, namespace, "filler-2")[0] == "worker-2"
    create(env.manager, namespace, _job("filler-1", "dispatch-order-none", resource, nodes=2))
    assert wait_placed(env, namespace, "filler-1")[0] == "worker-1"

    create(env.manager, namespace, _job("big-high", HIGH, resource, units=3))
    wait_pending(env, namespace, "big-high", f"worker-2: needs 3 {resource}, 1 free")
    # The unit left on worker-2 is the high job's to wait for: a low job that fits there
    # now is held back, saying by whom; worker-1 has no room for it yet.
    create(env.manager, namespace, _job("small-low", LOW, resource))
    wait_pending(env, namespace, "small-low", f"worker-1: needs 1 {resource}, 0 free",
                 f"worker-2: held for {namespace}/big-high (priority 1000), ahead in the "
                 "waiting line; this job's priority: 10")
    assert _line(env, namespace) == [("big-high", 1000), ("small-low", 10)]

    # worker-1's room frees: the high job could never use it, so the low one takes it.
    _delete(env, namespace, "filler-1")
    assert wait_placed(env, namespace, "small-low")[0] == "worker-1"
    assert _placed(env, namespace, ["big-high"]) == {"big-high": None}
    assert _line(env, namespace) == [("big-high", 1000)]
