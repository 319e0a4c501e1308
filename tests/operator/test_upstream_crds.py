"""The operator on a worker that serves upstream Kubeflow Trainer's CRDs (read from the
Trainer module) instead of the project's: upstream's own runtime, a TrainJob as a Trainer
user writes it (managedBy left out, so upstream's CRD fills in its default), run through
the real JobSet controller, scheduler and kwok to Complete."""

from __future__ import annotations

import pytest

from clusters import fixtures, upstream_trainer
from clusters.testing import eventually
from trainjob import constants as c

TRAINER = (c.TRAINER_GROUP, c.TRAINER_VERSION)
JOBSET = (c.JOBSET_GROUP, c.JOBSET_VERSION)


@pytest.fixture
def worker_node(upstream_crds_worker, namespace):
    name = f"{namespace}-node"
    fixtures.add_node(upstream_crds_worker.api, name, {"cpu": "8", "memory": "32Gi"})
    yield name
    fixtures.remove_node(upstream_crds_worker.api, name)


def _condition(obj: dict, type_: str) -> dict | None:
    return next((x for x in (obj.get("status") or {}).get("conditions") or []
                 if x.get("type") == type_), None)


def _env(container: dict) -> dict[str, str | None]:
    return {var["name"]: var.get("value") for var in container.get("env") or []}


def test_upstream_torch_runtime_and_defaulted_managed_by_run_to_complete(
        upstream_crds_worker, namespace, run_operator, worker_node):
    worker = upstream_crds_worker
    # Upstream's shipped torch runtime, spec unchanged; namespaced and renamed so that it
    # is this test's own.
    runtime = upstream_trainer.runtime("torch_distributed.yaml")
    runtime = {**runtime, "kind": c.TRAININGRUNTIME_KIND,
               "metadata": {"name": "torch-distributed", "namespace": namespace}}
    worker.custom.create_namespaced_custom_object(*TRAINER, namespace, c.TRAININGRUNTIMES,
                                                  runtime)
    created = worker.custom.create_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, {
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
        "metadata": {"name": "mnist"},
        "spec": {"runtimeRef": {"name": "torch-distributed", "kind": c.TRAININGRUNTIME_KIND},
                 "trainer": {"numNodes": 2, "command": ["torchrun", "train.py"]}},
    })
    assert created["spec"].get("managedBy") == c.MANAGED_BY_TRAINER_CONTROLLER, (
        f"expected upstream's CRD to default spec.managedBy to "
        f"{c.MANAGED_BY_TRAINER_CONTROLLER}, saw {created['spec'].get('managedBy')!r}")
    run_operator(worker, "--namespace", namespace)

    done = eventually(
        lambda: worker.custom.get_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS,
                                                           "mnist"),
        lambda job: (_condition(job, c.CONDITION_COMPLETE) or {}).get("status") == "True",
        expected="TrainJob mnist Complete (status written through upstream's schema)",
        timeout=90)
    assert [(j["name"], j["succeeded"]) for j in done["status"]["jobsStatus"]] == [("node", 1)]

    jobset = worker.custom.get_namespaced_custom_object(*JOBSET, namespace, c.JOBSETS, "mnist")
    assert [o["uid"] for o in jobset["metadata"]["ownerReferences"]] == \
        [created["metadata"]["uid"]]
    (node,) = jobset["spec"]["replicatedJobs"]
    assert node["template"]["spec"]["parallelism"] == 2
    (container,) = node["template"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["torchrun", "train.py"]
    assert _env(container)["PET_NNODES"] == "2"
