"""Jobs from the manager through the real worker stack: the dispatcher places them, the
operator builds JobSets, the upstream JobSet controller, job controller and scheduler make and
bind pods to kwok Nodes, kwok runs them, and the manager shows the outcome. The test writes
no status of any JobSet, Job, Pod or Node.

Each test here selects Nodes of its own with a ``test-pool`` label, so the shared base Nodes
of ``dispatch_env`` do not count for its jobs.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from clusters import fixtures, worker_stack
from clusters.testing import eventually
from trainjob import constants as c

from dispatch_helpers import condition, create, get, wait_pending, wait_placed

GPU = "nvidia.com/gpu"


def _trainer_only_runtime(name: str, namespace: str, pod_annotations: dict[str, str]) -> dict:
    """A namespaced runtime with just the trainer job, each pod 1 cpu unless the TrainJob
    says otherwise; ``pod_annotations`` tell kwok how long the pods run."""
    return {
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAININGRUNTIME_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"mlPolicy": {"numNodes": 1},
                 "template": {"spec": {"replicatedJobs": [{
                     "name": c.NODE, "template": {
                         "metadata": {"labels": {c.ANCESTOR_LABEL: c.ROLE_TRAINER}},
                         "spec": {"backoffLimit": 0, "template": {
                             "metadata": {"annotations": pod_annotations},
                             "spec": {"restartPolicy": "Never", "containers": [{
                                 "name": c.NODE, "image": "pytorch/pytorch:2.5.0",
                                 "resources": {"requests": {"cpu": "1",
                                                            "memory": "1Gi"}}}]}}}}}]}}},
    }


def _job(name: str, runtime: str, pool: str, *, num_nodes: int, cpu: str, gpus: int = 0) -> dict:
    resources: dict = {"requests": {"cpu": cpu, "memory": "1Gi"}}
    override: dict = {"targetJobs": [{"name": c.NODE}], "nodeSelector": {"test-pool": pool}}
    if gpus:
        # Extended resources need limits equal to requests.
        resources["requests"][GPU] = str(gpus)
        resources["limits"] = {GPU: str(gpus)}
        override["tolerations"] = [{"key": "gpu", "operator": "Equal", "value": "true",
                                    "effect": "NoSchedule"}]
    return {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
            "metadata": {"name": name},
            "spec": {"managedBy": c.MANAGED_BY_MULTIKUEUE,
                     "runtimeRef": {"name": runtime, "kind": c.TRAININGRUNTIME_KIND},
                     "trainer": {"numNodes": num_nodes, "resourcesPerNode": resources},
                     "podSpecOverrides": [override]}}


@pytest.fixture
def pool(dispatch_env, namespace):
    """Adds kwok Nodes labelled ``test-pool=<namespace>``, each once the scheduler has it;
    removes them afterwards."""
    added: list[tuple[object, str]] = []

    def add(worker: str, name: str, resources: dict[str, str], taints: list[dict] | None = None):
        api = dispatch_env.multicluster[worker].api
        node = f"{namespace}-{name}"
        fixtures.add_node(api, node, {"memory": "64Gi", **resources},
                          labels={"test-pool": namespace}, taints=taints)
        added.append((api, node))
        fixtures.wait_scheduler_sees(api, namespace, node)
        return node

    yield add
    for api, node in added:
        fixtures.remove_node(api, node)


def _install_runtime(env, namespace: str, name: str, pod_annotations: dict[str, str]) -> None:
    for worker in env.multicluster.workers:
        fixtures.install_runtime(worker.api,
                                 _trainer_only_runtime(name, namespace, pod_annotations))


def _pods(worker, namespace: str, name: str) -> list[client.V1Pod]:
    return worker.core.list_namespaced_pod(
        namespace, label_selector=f"{c.JOBSET_NAME_LABEL}={name}").items


def _unschedulable(env, namespace: str) -> list[str]:
    """Pods the scheduler could not place, from its FailedScheduling Events (they outlive
    the pods, so a pod that was Pending for a moment is still counted)."""
    found = []
    for worker in env.multicluster.workers:
        for event in worker.core.list_namespaced_event(
                namespace, field_selector="reason=FailedScheduling").items:
            if not event.involved_object.name.startswith(fixtures.PROBE_PREFIX):
                found.append(f"{worker.name}: {event.involved_object.name}: {event.message}")
    return found


def test_a_job_from_the_manager_runs_on_kwok_nodes_to_complete(dispatch_env, namespace, pool):
    env = dispatch_env
    nodes = {w: pool(w, w, {"cpu": "4"}) for w in ("worker-1", "worker-2")}
    _install_runtime(env, namespace, "quick", {worker_stack.RUN_FOR_ANNOTATION: "5s"})
    create(env.manager, namespace, _job("real", "quick", namespace, num_nodes=2, cpu="1"))
    worker_name, _ = wait_placed(env, namespace, "real")
    worker = env.multicluster[worker_name]
    # Both pods bound to that worker's Node by its scheduler (they, the copy and its JobSet
    # go once the manager has the final status).
    pods = eventually(lambda: _pods(worker, namespace, "real"),
                      lambda pods: len(pods) == 2 and all(p.spec.node_name for p in pods),
                      expected=f"two pods of real bound on {worker_name}", timeout=60)
    assert {p.spec.node_name for p in pods} == {nodes[worker_name]}

    done = eventually(lambda: get(env.manager, namespace, "real"),
                      lambda obj: (condition(obj, "Complete") or {}).get("status") == "True",
                      expected="the manager TrainJob Complete after its pods ran on kwok",
                      timeout=90)
    assert condition(done, "Complete")["reason"] == "AllJobsCompleted"
    assert done["status"]["jobsStatus"] == [
        {"name": c.NODE, "ready": 0, "succeeded": 1, "failed": 0, "active": 0,
         "suspended": 0}]
    assert _unschedulable(env, namespace) == []


def test_a_burst_that_fits_in_aggregate_leaves_no_pod_unschedulable(dispatch_env, namespace,
                                                                    pool):
    """Fragmented Nodes, a tainted GPU Node, jobs of three shapes: every job fits somewhere,
    but not everywhere, and not all at once. The dispatcher must only place a job where the
    scheduler can bind all its pods; the rest wait on the manager until room frees up."""
    env = dispatch_env
    pool("worker-1", "a", {"cpu": "4"})
    pool("worker-1", "b", {"cpu": "4"})
    pool("worker-2", "c", {"cpu": "6"})
    pool("worker-2", "gpu", {"cpu": "8", GPU: "4"},
         taints=[{"key": "gpu", "value": "true", "effect": "NoSchedule"}])
    _install_runtime(env, namespace, "burst", {worker_stack.RUN_FOR_ANNOTATION: "4s"})
    jobs = {}
    for i in range(3):
        jobs[f"gpu-{i}"] = _job(f"gpu-{i}", "burst", namespace, num_nodes=1, cpu="2", gpus=2)
        jobs[f"wide-{i}"] = _job(f"wide-{i}", "burst", namespace, num_nodes=2, cpu="3")
        jobs[f"small-{i}"] = _job(f"small-{i}", "burst", namespace, num_nodes=1, cpu="1")
    for body in jobs.values():
        create(env.manager, namespace, body)

    def outcome():
        states = {}
        for name in jobs:
            obj = get(env.manager, namespace, name)
            states[name] = next((t for t in ("Complete", "Failed")
                                 if (condition(obj, t) or {}).get("status") == "True"), None)
        return states

    final = eventually(outcome, lambda states: all(states.values()),
                       expected="every job of the burst Complete or Failed", timeout=180)
    assert set(final.values()) == {"Complete"}, final
    assert _unschedulable(env, namespace) == []
    # GPU jobs could only run on worker-2's GPU Node.
    for name in jobs:
        if name.startswith("gpu-"):
            placed = get(env.manager, namespace, name)["metadata"]["annotations"]
            assert placed[c.PLACEMENT_ANNOTATION] == "worker-2", (name, placed)


def test_pods_that_never_bind_stop_holding_up_other_jobs(dispatch_env, namespace, pool):
    """A wide job (3 + 3 cpu) and a small one placed on worker-1 whose pods carry a
    scheduling gate nothing lifts: made, never bound. A second small job that their pods
    could strand in some order waits for them, and goes once they no longer count as in
    flight (30 s after their placement), beside the room they still hold, and runs."""
    env = dispatch_env
    worker = env.multicluster["worker-1"]
    pool("worker-1", "a", {"cpu": "4"})
    pool("worker-1", "b", {"cpu": "4"})
    _install_runtime(env, namespace, "gated", {worker_stack.RUN_FOR_ANNOTATION: "2s"})
    for name, num_nodes, cpu in (("wide", 2, "3"), ("small-0", 1, "1")):
        body = _job(name, "gated", namespace, num_nodes=num_nodes, cpu=cpu)
        body["spec"]["podSpecOverrides"][0]["schedulingGates"] = [{"name": "example.com/held"}]
        create(env.manager, namespace, body)
        assert wait_placed(env, namespace, name)[0] == "worker-1"

    create(env.manager, namespace, _job("small-1", "gated", namespace, num_nodes=1, cpu="1"))
    wait_pending(env, namespace, "small-1",
                 "worker-1: pods of jobs placed here moments ago are not bound yet")
    assert wait_placed(env, namespace, "small-1", timeout=90)[0] == "worker-1"
    gated = _pods(worker, namespace, "wide") + _pods(worker, namespace, "small-0")
    assert len(gated) == 3 and not any(p.spec.node_name for p in gated), (
        "the held jobs' pods were bound after all: the wait did not end by the window",
        [(p.metadata.name, p.spec.node_name) for p in gated])
    eventually(lambda: condition(get(env.manager, namespace, "small-1"), "Complete") or {},
               lambda done: done.get("status") == "True",
               expected="small-1 Complete on worker-1", timeout=60)
    assert _unschedulable(env, namespace) == []


def test_a_node_removed_under_running_jobs_shows_on_the_manager(dispatch_env, namespace, pool):
    """The pods of a deleted Node are failed and removed by the pod garbage collector; the
    Job (no retries in this runtime) fails, so does the JobSet, and the manager shows the job
    Failed with the JobSet's reason, as if it had run there."""
    env = dispatch_env
    node = pool("worker-1", "only", {"cpu": "4"})
    _install_runtime(env, namespace, "forever",
                     {worker_stack.OUTCOME_ANNOTATION: worker_stack.OUTCOME_NEVER})
    create(env.manager, namespace, _job("stranded", "forever", namespace, num_nodes=2, cpu="1"))
    worker_name, _ = wait_placed(env, namespace, "stranded")
    assert worker_name == "worker-1"
    worker = env.multicluster[worker_name]
    eventually(lambda: get(env.manager, namespace, "stranded"),
               lambda obj: [j.get("ready") for j in (obj.get("status") or {}).get("jobsStatus")
                            or []] == [1],
               expected="the manager showing the trainer job ready while its pods run",
               timeout=60)
    assert {p.spec.node_name for p in _pods(worker, namespace, "stranded")} == {node}

    fixtures.remove_node(worker.api, node)
    # The pod garbage collector waits 40 s before it removes the pods of a missing Node.
    stranded = eventually(
        lambda: get(env.manager, namespace, "stranded"),
        lambda obj: (condition(obj, "Failed") or {}).get("status") == "True",
        expected="the manager TrainJob Failed after its Node was removed", timeout=150)
    # The JobSet controller's reason and message for a failed Job, as the worker had them
    # (the copy and its JobSet are removed once the manager has the final status).
    failed = condition(stranded, "Failed")
    assert (failed["reason"], failed["message"]) == (
        "FailedJobs", "jobset failed due to one or more job failures "
                      "(first failed job: stranded-node-0)"), failed
    assert condition(stranded, "Complete") is None
    assert all(p.spec.node_name != node for p in _pods(worker, namespace, "stranded"))


def test_a_job_no_node_admits_waits_with_the_rule_named(dispatch_env, namespace, pool):
    """Room in cpu is not the only reason: the pending message names the nodeSelector and
    the taint that keep every Node out."""
    env = dispatch_env
    pool("worker-2", "tainted", {"cpu": "8"},
         taints=[{"key": "reserved", "value": "ops", "effect": "NoSchedule"}])
    _install_runtime(env, namespace, "idle", {})
    create(env.manager, namespace, _job("unplaceable", "idle", namespace, num_nodes=1, cpu="1"))
    wait_pending(env, namespace, "unplaceable",
                 f"without label test-pool={namespace} (nodeSelector)",
                 "with taint reserved=ops:NoSchedule (not tolerated)")
