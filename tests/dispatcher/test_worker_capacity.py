"""Each worker's room as data: the ``dispatcher_worker_capacity`` gauges, the dashboard's
``/api/state`` and ``python -m dispatcher status --dispatcher-url`` say the same amounts,
and those are what the test put on the worker: a Node with a known allocatable, a Pod
with known requests, and a job placed there whose pods are not bound yet (reserved)."""

from __future__ import annotations

import json
import subprocess
import sys

from clusters import fixtures, worker_stack
from clusters.testing import eventually
from trainjob import constants as c

from dispatch_helpers import RUNTIME, TRAINER, create, wait_placed

STATES = ("allocatable", "used", "reserved", "free")


def _held_trainjob(name: str, resource: str, amount: str) -> dict:
    """A TrainJob whose trainer pod asks for ``amount`` of ``resource`` and is held by a
    scheduling gate: placed, its pod made but never bound, so its room stays reserved."""
    asked = {"cpu": "100m", resource: amount}
    return {"apiVersion": c.TRAINER_API_VERSION, "kind": "TrainJob", "metadata": {"name": name},
            "spec": {"runtimeRef": {"name": RUNTIME}, "managedBy": c.MANAGED_BY_MULTIKUEUE,
                     "trainer": {"numNodes": 1, "resourcesPerNode": {
                         "requests": asked, "limits": {resource: amount}}},
                     "podSpecOverrides": [{"targetJobs": [{"name": c.NODE}],
                                           "schedulingGates": [{"name": "example.com/held"}]}]}}


def _status(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dispatcher", "status", "--kubeconfig",
                           str(env.manager.kubeconfig), *args],
                          capture_output=True, text=True, timeout=60)


def test_gauges_dashboard_and_status_show_the_room_the_test_made(dispatch_env, namespace):
    env = dispatch_env
    worker = env.multicluster["worker-1"]
    resource = f"example.com/{namespace}"
    node = f"room-{namespace}"
    fixtures.add_node(worker.api, node, {"cpu": "8", "memory": "16Gi", "pods": "110",
                                         resource: "10"})
    try:
        # A Pod bound to the Node, asking for 3.
        worker.core.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "user", "annotations": {
                # kwok runs it until deleted.
                worker_stack.OUTCOME_ANNOTATION: worker_stack.OUTCOME_NEVER}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "main", "resources": {
                         "requests": {resource: "3"}, "limits": {resource: "3"}}}]}})
        # A job placed there whose pod asking for 4 is never bound: reserved.
        create(env.manager, namespace, _held_trainjob("held", resource, "4"))
        assert wait_placed(env, namespace, "held")[0] == "worker-1"
        expected = {"allocatable": 10, "used": 3, "reserved": 4, "free": 3}

        def gauges() -> dict[str, float]:
            return {state: env.dispatcher.metric("dispatcher_worker_capacity",
                                                 cluster="worker-1", resource=resource,
                                                 state=state) for state in STATES}
        eventually(gauges, lambda seen: seen == expected, timeout=30,
                   expected=f"dispatcher_worker_capacity of worker-1 {resource}: {expected}")

        # The dashboard draws the same row (the gauges and it read one computation).
        def dashboard_row() -> dict:
            state = json.loads(env.dispatcher.get("/api/state")[1])
            cluster = next(x for x in state["clusters"] if x["name"] == "worker-1")
            return next((row for row in cluster["capacity"] if row["resource"] == resource), {})
        row = dashboard_row()
        assert {state: float(row[state]) for state in STATES} == expected == gauges(), row
        # worker-2 has no Node reporting the resource: no series, no row.
        assert env.dispatcher.metric("dispatcher_worker_capacity", cluster="worker-2",
                                     resource=resource) == 0

        url = f"http://127.0.0.1:{env.dispatcher.metrics_port}"
        shown = _status(env, "--dispatcher-url", url, "-o", "json")
        assert shown.returncode == 0, shown.stderr
        workers = json.loads(shown.stdout)["workers"]
        assert workers["available"], workers
        rows = [r for r in workers["capacity"] if (r["worker"], r["resource"]) ==
                ("worker-1", resource)]
        assert [{state: float(r[state]) for state in STATES} for r in rows] == [expected]
        table = _status(env, "--dispatcher-url", url).stdout
        assert any(line.split() == ["worker-1", resource, "10", "3", "4", "3"]
                   for line in table.splitlines()), table

        # Without a dispatcher to ask, the rest is shown and the room is said unavailable.
        unreachable = _status(env, "--dispatcher-url", "http://127.0.0.1:9")
        assert unreachable.returncode == 0, unreachable.stderr
        assert "worker capacity unavailable: cannot reach http://127.0.0.1:9/api/state" \
            in unreachable.stdout, unreachable.stdout
        assert "CLUSTER" in unreachable.stdout and "worker-1" in unreachable.stdout
    finally:
        env.manager.custom.delete_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS,
                                                           "held")
        worker.core.delete_node(node)
