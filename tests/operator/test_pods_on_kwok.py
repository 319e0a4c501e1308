"""A TrainJob on one worker through the real stack, with nothing written by the test but the
objects a user creates: the operator builds the JobSet, the upstream JobSet controller makes
the Jobs, the job controller the Pods, kube-scheduler binds them to kwok Nodes, kwok runs
them to their end, and the TrainJob reports it."""

from __future__ import annotations

import pytest
from kubernetes import client

from clusters import fixtures, worker_stack
from clusters.testing import eventually
from trainjob import constants as c

WORKER = "worker-1"
TRAINER = (c.TRAINER_GROUP, c.TRAINER_VERSION)


@pytest.fixture
def worker_node(multicluster, namespace):
    """A kwok Node of this test's own, Ready before the test starts."""
    worker = multicluster[WORKER]
    name = f"{namespace}-node"
    fixtures.add_node(worker.api, name, {"cpu": "8", "memory": "32Gi"},
                      labels={"test-pool": namespace})
    yield name
    fixtures.remove_node(worker.api, name)


def _condition(obj: dict, type_: str) -> dict | None:
    return next((x for x in (obj.get("status") or {}).get("conditions") or []
                 if x.get("type") == type_), None)


def _submit(worker, namespace: str, name: str, runtime_annotations: dict | None = None) -> None:
    runtime = fixtures.torch_runtime(f"{name}-runtime", num_nodes=2, cpu="1", memory="1Gi",
                                     namespace=namespace, pod_annotations=runtime_annotations)
    # Only this test's Node: the pods must land where the test can see them.
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        job["template"]["spec"]["template"]["spec"]["nodeSelector"] = {"test-pool": namespace}
        # A failed pod fails its Job at once (the default retries back off for minutes).
        job["template"]["spec"]["backoffLimit"] = 0
    fixtures.install_runtime(worker.api, runtime)
    worker.custom.create_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, {
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": f"{name}-runtime", "kind": c.TRAININGRUNTIME_KIND}},
    })


def _trainjob(worker, namespace: str, name: str) -> dict:
    return worker.custom.get_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, name)


def _pods(worker, namespace: str, name: str) -> list[client.V1Pod]:
    return worker.core.list_namespaced_pod(
        namespace, label_selector=f"{c.JOBSET_NAME_LABEL}={name}").items


def test_trainjob_runs_on_kwok_nodes_to_complete(multicluster, namespace, run_operator,
                                                 worker_node):
    worker = multicluster[WORKER]
    run_operator(worker, "--namespace", namespace)
    _submit(worker, namespace, "mnist")

    done = eventually(lambda: _trainjob(worker, namespace, "mnist"),
                      lambda job: (_condition(job, c.CONDITION_COMPLETE) or {}).get("status")
                      == "True",
                      expected="TrainJob mnist Complete once its pods succeeded", timeout=90)
    assert _condition(done, c.CONDITION_COMPLETE)["reason"] == "AllJobsCompleted"
    by_name = {j["name"]: j for j in done["status"]["jobsStatus"]}
    assert set(by_name) == {c.DATASET_INITIALIZER, c.MODEL_INITIALIZER, c.NODE}
    assert all(j["succeeded"] == 1 and j["failed"] == 0 for j in by_name.values()), by_name

    # Everything under it was real: two trainer pods and one per initializer, each bound
    # to the test's kwok Node by the scheduler and ended by kwok.
    pods = _pods(worker, namespace, "mnist")
    assert len(pods) == 4, [p.metadata.name for p in pods]
    assert {p.spec.node_name for p in pods} == {worker_node}
    assert {p.status.phase for p in pods} == {"Succeeded"}
    jobs = client.BatchV1Api(worker.api).list_namespaced_job(
        namespace, label_selector=f"{c.JOBSET_NAME_LABEL}=mnist").items
    assert sorted((j.metadata.name, j.status.succeeded) for j in jobs) == [
        ("mnist-dataset-initializer-0", 1), ("mnist-model-initializer-0", 1),
        ("mnist-node-0", 2)]


def test_a_failing_pod_fails_the_trainjob_with_the_jobsets_reason(
        multicluster, namespace, run_operator, worker_node):
    worker = multicluster[WORKER]
    run_operator(worker, "--namespace", namespace)
    _submit(worker, namespace, "crash",
            {worker_stack.OUTCOME_ANNOTATION: worker_stack.OUTCOME_FAIL,
             worker_stack.RUN_FOR_ANNOTATION: "1s"})

    failed = eventually(lambda: _trainjob(worker, namespace, "crash"),
                        lambda job: (_condition(job, c.CONDITION_FAILED) or {}).get("status")
                        == "True",
                        expected="TrainJob crash Failed once a pod failed", timeout=90)
    jobset = worker.custom.get_namespaced_custom_object(
        c.JOBSET_GROUP, c.JOBSET_VERSION, namespace, c.JOBSETS, "crash")
    jobset_failed = _condition(jobset, c.JOBSET_FAILED)
    assert _condition(failed, c.CONDITION_FAILED)["reason"] == jobset_failed["reason"]
    assert any(p.status.phase == "Failed" and p.spec.node_name == worker_node
               for p in _pods(worker, namespace, "crash"))
