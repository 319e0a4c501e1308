"""The training operator against a real kube-apiserver: ownership, the JobSet it builds,
suspend/resume, status mirrored from the JobSet, and the Events it records.

These tests play the JobSet controller: they write the JobSet's status through its status
subresource and watch what the operator does with it. So that the worker's real JobSet
controller does not overwrite what they write, their runtime's JobSet names another
controller in ``spec.managedBy`` (``worker_stack.JOBSET_MANAGED_BY_TEST``): JobSet's own
delegation, the one MultiKueue uses, which makes the JobSet controller skip those JobSets.
JobSet's webhooks still validate every write. ``test_pods_on_kwok.py`` runs the real
controller end to end. Waits use ``eventually``; "nothing happens" is an observation window
in which every read is checked.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from kubernetes.utils.quantity import parse_quantity

from clusters import worker_stack
from clusters.testing import eventually, holds_for
from trainjob.api import TrainingRuntime, TrainJob
from trainjob.runtime import build_runtime_info, totals

TRAINER = ("trainer.kubeflow.org", "v1alpha1")
TRAINJOBS = "trainjobs"
CLUSTER_RUNTIMES = "clustertrainingruntimes"
JOBSET = ("jobset.x-k8s.io", "v1alpha2")
JOBSETS = "jobsets"
MERGE_PATCH = "application/merge-patch+json"
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
MULTIKUEUE = "kueue.x-k8s.io/multikueue"
TRAINING_OPERATOR = "kubeflow.org/training-operator"
UPSTREAM_OPERATOR = "trainer.kubeflow.org/trainjob-controller"
FIELD_MANAGER = "training-operator"
TOTAL_PODS = "trainer.kubeflow.org/total-pods"
TOTAL_REQUESTS = "trainer.kubeflow.org/total-requests"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

# What each runtime job's one container requests (the trainer's come from the TrainJob).
DATASET_INIT_REQUESTS = {"cpu": "250m", "memory": "1Gi"}
MODEL_INIT_REQUESTS = {"cpu": "1", "memory": "2Gi"}


# --- objects ---------------------------------------------------------------------------------


def runtime_body(name: str) -> dict:
    """A torch ClusterTrainingRuntime with both initializers and a ``node`` trainer job."""
    def job(job_name: str, role: str, container: dict) -> dict:
        return {
            "name": job_name,
            "template": {
                "metadata": {"labels": {ANCESTOR: role}},
                "spec": {"template": {"spec": {"restartPolicy": "Never",
                                               "containers": [container]}}},
            },
        }

    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name},
        "spec": {
            "mlPolicy": {"torch": {"numProcPerNode": "auto"}},
            "template": {
                "metadata": {
                    "labels": {"team": "from-runtime", "runtime-only": "kept"},
                    "annotations": {"owner": "from-runtime", "runtime-note": "kept"},
                },
                "spec": {"managedBy": worker_stack.JOBSET_MANAGED_BY_TEST, "replicatedJobs": [
                    job("dataset-initializer", "dataset-initializer", {
                        "name": "dataset-initializer", "image": "ghcr.io/example/dataset-init:1",
                        "resources": {"requests": DATASET_INIT_REQUESTS}}),
                    job("model-initializer", "model-initializer", {
                        "name": "model-initializer", "image": "ghcr.io/example/model-init:1",
                        "resources": {"requests": MODEL_INIT_REQUESTS}}),
                    job("node", "trainer", {
                        "name": "node", "image": "ghcr.io/example/runtime-default:1",
                        "command": ["python", "default.py"]}),
                ]},
            },
        },
    }


def trainjob_body(name: str, runtime: str, **spec: Any) -> dict:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": runtime}, **spec},
    }


@pytest.fixture
def worker1(multicluster):
    return multicluster["worker-1"]


@pytest.fixture
def runtime(worker1, namespace) -> str:
    """A ClusterTrainingRuntime of this test's own (cluster-scoped, so named after the
    test's namespace), deleted afterwards."""
    name = f"torch-{namespace}"
    worker1.custom.create_cluster_custom_object(*TRAINER, CLUSTER_RUNTIMES, runtime_body(name))
    yield name
    try:
        worker1.custom.delete_cluster_custom_object(*TRAINER, CLUSTER_RUNTIMES, name)
    except ApiException as err:
        if err.status != 404:
            raise


# --- API helpers -----------------------------------------------------------------------------


def create_trainjob(cluster, namespace: str, body: dict) -> dict:
    return cluster.custom.create_namespaced_custom_object(*TRAINER, namespace, TRAINJOBS, body)


def get_trainjob(cluster, namespace: str, name: str) -> dict:
    return cluster.custom.get_namespaced_custom_object(*TRAINER, namespace, TRAINJOBS, name)


def patch_trainjob(cluster, namespace: str, name: str, patch: dict) -> dict:
    return cluster.custom.patch_namespaced_custom_object(
        *TRAINER, namespace, TRAINJOBS, name, patch, _content_type=MERGE_PATCH)


def get_jobset(cluster, namespace: str, name: str) -> dict | None:
    try:
        return cluster.custom.get_namespaced_custom_object(*JOBSET, namespace, JOBSETS, name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def patch_jobset_status(cluster, namespace: str, name: str, status: dict) -> dict:
    """Play the JobSet controller: merge-patch the JobSet's status subresource."""
    return cluster.custom.patch_namespaced_custom_object_status(
        *JOBSET, namespace, JOBSETS, name, {"status": status}, _content_type=MERGE_PATCH)


def jobset_condition(type_: str, reason: str, message: str) -> dict:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": type_, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": now}


def replicated_job(jobset: dict, name: str) -> dict:
    jobs = {j["name"]: j for j in jobset["spec"]["replicatedJobs"]}
    assert name in jobs, f"expected replicated job {name!r} in the JobSet, saw {sorted(jobs)}"
    return jobs[name]


def pod_spec(jobset: dict, job_name: str) -> dict:
    return replicated_job(jobset, job_name)["template"]["spec"]["template"]["spec"]


def container(jobset: dict, job_name: str, container_name: str | None = None) -> dict:
    containers = {c["name"]: c for c in pod_spec(jobset, job_name)["containers"]}
    name = container_name or job_name
    assert name in containers, (
        f"expected container {name!r} in replicated job {job_name!r}, saw {sorted(containers)}")
    return containers[name]


def env_of(container_: dict) -> dict[str, dict]:
    return {var["name"]: var for var in container_.get("env") or []}


def node_image(jobset: dict | None) -> str | None:
    return container(jobset, "node")["image"] if jobset else None


def events_about(cluster, namespace: str, name: str) -> list[tuple[str, str, str]]:
    """(reason, type, message) of the Events whose involvedObject is TrainJob ``name``."""
    listed = cluster.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}")
    return sorted((e.reason, e.type, e.message) for e in listed.items
                  if e.involved_object.kind == "TrainJob")


def without_managed_fields(obj: dict | None) -> dict | None:
    """``obj`` as a failure message should show it (managedFields are pages of noise)."""
    if obj is None:
        return None
    return {**obj, "metadata": {k: v for k, v in obj["metadata"].items()
                                if k != "managedFields"}}


def wait_jobset(cluster, namespace: str, name: str,
                check: Callable[[dict], bool] = lambda js: True, *, expected: str) -> dict:
    return eventually(lambda: without_managed_fields(get_jobset(cluster, namespace, name)),
                      lambda js: js is not None and check(js), expected=expected)


def wait_equal(observe: Callable[[], Any], want: Any, *, expected: str) -> Any:
    """Wait until ``observe()`` returns ``want``; the failure shows both."""
    return eventually(observe, lambda seen: seen == want, expected=f"{expected}: {want!r}")


def running_view(cluster, namespace: str, name: str) -> dict | None:
    """What the suspend/resume test watches on a JobSet."""
    jobset = get_jobset(cluster, namespace, name)
    if jobset is None:
        return None
    return {"suspend": jobset["spec"].get("suspend"), "image": node_image(jobset),
            "nodeSelector": pod_spec(jobset, "node").get("nodeSelector"),
            "resourceVersion": jobset["metadata"]["resourceVersion"]}


def conditions_of(cluster, namespace: str, name: str) -> dict[str, tuple]:
    """{type: (status, reason, message)} of TrainJob ``name``."""
    job = get_trainjob(cluster, namespace, name)
    return {x.get("type"): (x.get("status"), x.get("reason"), x.get("message"))
            for x in (job.get("status") or {}).get("conditions") or []}


def wait_reconciled(cluster, namespace: str, name: str) -> tuple[dict, dict]:
    """Wait until TrainJob ``name`` has its JobSet and the condition Created=True."""
    jobset = wait_jobset(cluster, namespace, name,
                         expected=f"JobSet {namespace}/{name} created by the operator")
    wait_equal(lambda: conditions_of(cluster, namespace, name).get("Created", (None,))[0],
               "True", expected=f"TrainJob {name} condition Created status")
    return get_trainjob(cluster, namespace, name), jobset


def sync_through_witness(cluster, namespace: str, witness: str, marker: int) -> None:
    """A positive signal that the operator has caught up: give the (running) witness job's
    JobSet a new active count and wait until the witness's jobsStatus shows it. The JobSet
    informer is one watch stream, so every JobSet change written before this one has
    reached the operator too."""
    patch_jobset_status(cluster, namespace, witness, {"replicatedJobsStatus": [
        {"name": "node", "ready": 0, "succeeded": 0, "failed": 0, "active": marker,
         "suspended": 0}]})
    wait_equal(lambda: [(j.get("name"), j.get("active"))
                        for j in jobs_status(get_trainjob(cluster, namespace, witness))],
               [("node", marker)], expected=f"witness TrainJob {witness} jobsStatus (name, active)")


def jobs_status(obj: dict | None) -> list[dict]:
    return sorted(((obj or {}).get("status") or {}).get("jobsStatus") or [],
                  key=lambda j: j.get("name", ""))


# --- 1. ownership ----------------------------------------------------------------------------


def test_multikueue_trainjob_is_never_touched_while_its_siblings_are_reconciled(
        worker1, namespace, runtime, run_operator):
    run_operator(worker1)
    # The multikueue job goes first: by the time its siblings are reconciled, the operator
    # has had every chance to act on it.
    remote = create_trainjob(worker1, namespace, trainjob_body(
        "remote", runtime, managedBy=MULTIKUEUE, trainer={"numNodes": 2}))
    remote_rv = remote["metadata"]["resourceVersion"]
    siblings = {
        "unset": trainjob_body("unset", runtime, trainer={"numNodes": 2}),
        "empty": trainjob_body("empty", runtime, managedBy="", trainer={"numNodes": 2}),
        "explicit": trainjob_body("explicit", runtime, managedBy=TRAINING_OPERATOR,
                                  trainer={"numNodes": 2}),
        # Upstream Trainer's value (its CRD's default), as on every object exported from it.
        "upstream": trainjob_body("upstream", runtime, managedBy=UPSTREAM_OPERATOR,
                                  trainer={"numNodes": 2}),
    }
    for body in siblings.values():
        create_trainjob(worker1, namespace, body)
    for name in siblings:
        job, jobset = wait_reconciled(worker1, namespace, name)
        owners = jobset["metadata"].get("ownerReferences") or []
        assert [o.get("uid") for o in owners] == [job["metadata"]["uid"]], (
            f"expected JobSet {name} owned by TrainJob {name}, saw owners {owners}")

    # Touching the runtime makes the operator look at every job that references it again.
    worker1.custom.patch_cluster_custom_object(
        *TRAINER, CLUSTER_RUNTIMES, runtime,
        {"metadata": {"annotations": {"touched": "by-test"}}}, _content_type=MERGE_PATCH)

    def observe() -> dict:
        job = get_trainjob(worker1, namespace, "remote")
        meta = job["metadata"]
        events = worker1.core.list_namespaced_event(namespace).items
        return {
            "jobset": get_jobset(worker1, namespace, "remote") is not None,
            "status": job.get("status"),
            "finalizers": meta.get("finalizers"),
            "resourceVersion": meta["resourceVersion"],
            "managers": sorted({(f.get("manager"), f.get("subresource", ""))
                                for f in meta.get("managedFields") or []}),
            "events": [(e.reason, e.message) for e in events
                       if e.involved_object.name == "remote"
                       or e.involved_object.uid == meta["uid"]],
        }

    def untouched(seen: dict) -> bool:
        return (not seen["jobset"] and not seen["status"] and not seen["finalizers"]
                and seen["resourceVersion"] == remote_rv
                and all(m != FIELD_MANAGER and sub != "status" for m, sub in seen["managers"])
                and seen["events"] == [])

    observations = holds_for(
        observe, untouched, seconds=5,
        expected=(f"multikueue TrainJob 'remote' untouched: no JobSet, no status, no finalizers, "
                  f"resourceVersion {remote_rv}, no managedFields of {FIELD_MANAGER!r} or on "
                  f"status, no Events"))
    assert observations >= 5, f"expected at least 5 observations in 5s, made {observations}"


# --- 2. JobSet content -----------------------------------------------------------------------


def test_jobset_for_100_torch_nodes_and_two_initializers(
        worker1, namespace, runtime, run_operator):
    run_operator(worker1)
    name = "llm"
    trainer = {
        "image": "ghcr.io/example/train:2.1",
        "command": ["torchrun"],
        "args": ["train.py", "--epochs", "3"],
        "env": [{"name": "LEARNING_RATE", "value": "0.0003"}],
        "numNodes": 100,
        "numProcPerNode": 8,
        "resourcesPerNode": {"requests": {"cpu": "4", "memory": "16Gi"},
                             "limits": {"nvidia.com/gpu": 1}},
    }
    overrides = [
        {"targetJobs": [{"name": "node"}],
         "serviceAccountName": "trainer-sa",
         "nodeSelector": {"pool": "gpu"},
         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                          "effect": "NoSchedule"}],
         "schedulingGates": [{"name": "example.com/admission"}],
         "containers": [{"name": "node", "env": [{"name": "NCCL_DEBUG", "value": "INFO"}]}]},
        {"targetJobs": [{"name": "dataset-initializer"}],
         "serviceAccountName": "dataset-sa",
         "containers": [{"name": "dataset-initializer",
                         "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}]}]},
    ]
    created = create_trainjob(worker1, namespace, trainjob_body(
        name, runtime,
        trainer=trainer,
        initializer={"dataset": {"storageUri": "hf://datasets/example/corpus"},
                     "model": {"storageUri": "hf://models/example/base"}},
        labels={"team": "from-trainjob", "trainjob-only": "kept"},
        annotations={"owner": "from-trainjob", "trainjob-note": "kept"},
        podSpecOverrides=overrides,
    ))
    wait_jobset(worker1, namespace, name, expected=f"JobSet {namespace}/{name}")
    jobset = get_jobset(worker1, namespace, name)

    # Identity and ownership.
    assert (jobset["metadata"]["name"], jobset["metadata"]["namespace"]) == (name, namespace)
    owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": name,
             "uid": created["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    owners = jobset["metadata"].get("ownerReferences")
    assert owners == [owner], f"expected ownerReferences [{owner}], saw {owners}"
    managers = {f.get("manager") for f in jobset["metadata"].get("managedFields") or []}
    assert FIELD_MANAGER in managers, (
        f"expected the JobSet applied by field manager {FIELD_MANAGER!r}, saw {managers}")
    suspend = jobset["spec"].get("suspend")
    assert suspend is False, f"expected spec.suspend false for a running job, saw {suspend!r}"

    # Shape: one indexed Job of 100 pods for the trainer, one pod per initializer.
    names = sorted(j["name"] for j in jobset["spec"]["replicatedJobs"])
    assert names == ["dataset-initializer", "model-initializer", "node"], names
    node_job = replicated_job(jobset, "node")
    shape = (node_job.get("replicas"), node_job["template"]["spec"].get("parallelism"),
             node_job["template"]["spec"].get("completions"))
    assert shape == (1, 100, 100), (
        f"expected node replicas/parallelism/completions (1, 100, 100), saw {shape}")
    for job_name in ("dataset-initializer", "model-initializer"):
        assert replicated_job(jobset, job_name).get("replicas", 1) == 1

    # The trainer's settings on the node container.
    node = container(jobset, "node")
    assert node["image"] == trainer["image"], node
    assert node["command"] == trainer["command"], node
    assert node["args"] == trainer["args"], node
    # JobSet's webhook stores every quantity as text, as the Kubernetes API does.
    assert node.get("resources") == json.loads(json.dumps(trainer["resourcesPerNode"]),
                                               parse_int=str), (
        f"expected node resources {trainer['resourcesPerNode']}, saw {node.get('resources')}")
    env = env_of(node)
    assert env.get("LEARNING_RATE") == {"name": "LEARNING_RATE", "value": "0.0003"}, env

    # torchrun's environment and rendezvous port.
    values = {k: v.get("value") for k, v in env.items()}
    expected_torch = {
        "PET_NNODES": "100",
        "PET_NPROC_PER_NODE": "8",
        "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
        "PET_MASTER_PORT": "29500",
    }
    assert {k: values.get(k) for k in expected_torch} == expected_torch, (
        f"expected torch env {expected_torch}, saw {values}")
    rank_path = ((env.get("PET_NODE_RANK") or {}).get("valueFrom") or {}).get(
        "fieldRef", {}).get("fieldPath")
    assert rank_path in (f"metadata.annotations['{COMPLETION_INDEX}']",
                         f"metadata.labels['{COMPLETION_INDEX}']"), (
        f"expected PET_NODE_RANK from the job completion index fieldRef, "
        f"saw {env.get('PET_NODE_RANK')}")
    ports = [p.get("containerPort") for p in node.get("ports") or []]
    assert ports.count(29500) == 1, f"expected container port 29500 once, saw {ports}"

    # Initializers get their storage URIs, and nothing of the trainer's.
    for job_name, uri in (("dataset-initializer", "hf://datasets/example/corpus"),
                          ("model-initializer", "hf://models/example/base")):
        init_env = env_of(container(jobset, job_name))
        assert init_env.get("STORAGE_URI") == {"name": "STORAGE_URI", "value": uri}, (
            f"expected STORAGE_URI={uri} on {job_name}, saw {init_env}")
        assert not any(k.startswith("PET_") or k == "LEARNING_RATE" for k in init_env), (
            f"expected no trainer/torch env on {job_name}, saw {sorted(init_env)}")

    # Labels and annotations: runtime's, then the TrainJob's over them.
    labels = jobset["metadata"].get("labels") or {}
    want_labels = {"team": "from-trainjob", "trainjob-only": "kept", "runtime-only": "kept"}
    assert {k: labels.get(k) for k in want_labels} == want_labels, (
        f"expected JobSet labels to include {want_labels}, saw {labels}")
    annotations = jobset["metadata"].get("annotations") or {}
    want_annotations = {"owner": "from-trainjob", "trainjob-note": "kept",
                        "runtime-note": "kept"}
    assert {k: annotations.get(k) for k in want_annotations} == want_annotations, (
        f"expected JobSet annotations to include {want_annotations}, saw {annotations}")

    # podSpecOverrides land on their target jobs only.
    node_pod = pod_spec(jobset, "node")
    assert node_pod.get("serviceAccountName") == "trainer-sa", node_pod
    assert node_pod.get("nodeSelector") == {"pool": "gpu"}, node_pod
    assert node_pod.get("tolerations") == overrides[0]["tolerations"], node_pod
    assert node_pod.get("schedulingGates") == [{"name": "example.com/admission"}], node_pod
    assert env.get("NCCL_DEBUG") == {"name": "NCCL_DEBUG", "value": "INFO"}, env
    dataset_pod = pod_spec(jobset, "dataset-initializer")
    assert dataset_pod.get("serviceAccountName") == "dataset-sa", dataset_pod
    assert env_of(container(jobset, "dataset-initializer")).get("HF_HUB_OFFLINE") == {
        "name": "HF_HUB_OFFLINE", "value": "1"}
    model_pod = pod_spec(jobset, "model-initializer")
    for job_name, spec in (("dataset-initializer", dataset_pod),
                           ("model-initializer", model_pod)):
        leaked = {k: spec[k] for k in ("nodeSelector", "tolerations", "schedulingGates")
                  if spec.get(k)}
        assert leaked == {}, f"expected the node override to stay off {job_name}, saw {leaked}"
        assert "NCCL_DEBUG" not in env_of(container(jobset, job_name)), job_name
    assert model_pod.get("serviceAccountName") is None, (
        f"expected no serviceAccountName on model-initializer, saw {model_pod}")
    assert "HF_HUB_OFFLINE" not in env, f"dataset override leaked onto node: {sorted(env)}"

    # Totals: computed here from the numbers above, independently of the operator.
    expected_requests = {
        "cpu": 100 * Decimal(4) + parse_quantity(DATASET_INIT_REQUESTS["cpu"])
        + parse_quantity(MODEL_INIT_REQUESTS["cpu"]),                      # 401.25
        "memory": (100 * 16 + 1 + 2) * Decimal(2**30),                     # 1603Gi
        "nvidia.com/gpu": Decimal(100),
    }
    assert annotations.get(TOTAL_PODS) == "102", (
        f"expected {TOTAL_PODS}=102 (100 nodes + 2 initializers), "
        f"saw {annotations.get(TOTAL_PODS)!r}")
    shown = json.loads(annotations.get(TOTAL_REQUESTS, "{}"))
    assert {k: parse_quantity(v) for k, v in shown.items()} == expected_requests, (
        f"expected {TOTAL_REQUESTS} {expected_requests}, saw {shown}")

    # And the shared totals function over the same inputs says the same thing.
    stored_job = TrainJob.model_validate(get_trainjob(worker1, namespace, name))
    stored_runtime = TrainingRuntime.model_validate(worker1.custom.get_cluster_custom_object(
        *TRAINER, CLUSTER_RUNTIMES, runtime))
    computed = totals(build_runtime_info(stored_job, stored_runtime).pod_sets)
    assert computed.pods == 102 and computed.requests == expected_requests, (
        f"expected trainjob.runtime.totals = 102 pods, {expected_requests}; saw {computed}")
    assert (annotations.get(TOTAL_PODS), shown) == (str(computed.pods), computed.as_strings()), (
        f"expected the JobSet annotations to equal trainjob.runtime.totals "
        f"{(computed.pods, computed.as_strings())}, saw {(annotations.get(TOTAL_PODS), shown)}")


# --- 3. suspend and resume -------------------------------------------------------------------


def _node_overrides(pool: str, stage: str | None = None) -> list[dict]:
    """podSpecOverrides of the node job: a nodeSelector and, with ``stage``, an env var."""
    override: dict[str, Any] = {"targetJobs": [{"name": "node"}], "nodeSelector": {"pool": pool}}
    if stage is not None:
        override["containers"] = [{"name": "node", "env": [{"name": "STAGE", "value": stage}]}]
    return [override]


def test_suspend_resume_and_which_spec_changes_reach_the_jobset(
        worker1, namespace, runtime, run_operator):
    run_operator(worker1)
    name = "pausable"
    create_trainjob(worker1, namespace, trainjob_body(
        name, runtime, suspend=True, trainer={"numNodes": 2},
        podSpecOverrides=_node_overrides("a")))
    create_trainjob(worker1, namespace, trainjob_body("witness", runtime,
                                                      trainer={"numNodes": 1}))

    def jobset() -> tuple | None:
        found = get_jobset(worker1, namespace, name)
        if found is None:
            return None
        stage = [e.get("value") for e in container(found, "node").get("env") or []
                 if e["name"] == "STAGE"]
        return (found["spec"].get("suspend"), stage,
                pod_spec(found, "node").get("nodeSelector"))

    def suspended_condition() -> tuple | None:
        return conditions_of(worker1, namespace, name).get("Suspended", (None,))[:2]

    wait_equal(jobset, (True, [], {"pool": "a"}),
               expected="JobSet (suspend, node STAGE env, nodeSelector) of the suspended job")
    wait_equal(suspended_condition, ("True", "Suspended"),
               expected="TrainJob condition Suspended (status, reason)")

    # While suspended, what a suspended JobSet may change (its pods' scheduling: here the
    # nodeSelector a queue injects) reaches the JobSet. A container change is refused by
    # JobSet's own webhook: the operator says so in an Event and keeps the JobSet as it is.
    patch_trainjob(worker1, namespace, name, {"spec": {
        "podSpecOverrides": _node_overrides("b", stage="2")}})
    refused = eventually(
        lambda: [m for r, _, m in events_about(worker1, namespace, name)
                 if r == "JobSetUpdateRefused"],
        lambda messages: messages,
        expected=f"a JobSetUpdateRefused Event about {name} after its container env changed")
    assert "replicatedJobs" in refused[0] and "immutable" in refused[0], refused
    assert jobset() == (True, [], {"pool": "a"})
    patch_trainjob(worker1, namespace, name, {"spec": {
        "podSpecOverrides": _node_overrides("b")}})
    wait_equal(jobset, (True, [], {"pool": "b"}),
               expected="JobSet (suspend, node STAGE env, nodeSelector) after a nodeSelector "
                        "change while suspended")

    # Resume: only the suspend flag flips.
    patch_trainjob(worker1, namespace, name, {"spec": {"suspend": False}})
    wait_equal(jobset, (False, [], {"pool": "b"}),
               expected="JobSet (suspend, node STAGE env, nodeSelector) after resume")
    wait_equal(suspended_condition, ("False", "Resumed"),
               expected="TrainJob condition Suspended (status, reason) after resume")

    # spec.trainer stays as created, as upstream's CRD keeps it, suspended or not.
    with pytest.raises(ApiException) as refused_trainer:
        patch_trainjob(worker1, namespace, name, {"spec": {"trainer": {"numNodes": 3}}})
    assert refused_trainer.value.status == 422 and "spec.trainer" in refused_trainer.value.body \
        and "immutable" in refused_trainer.value.body, refused_trainer.value.body

    # While running, a spec change (the JobSet labels) must not reach the JobSet.
    before_view = running_view(worker1, namespace, name)
    before = get_trainjob(worker1, namespace, name)["metadata"]["generation"]
    changed = patch_trainjob(worker1, namespace, name,
                             {"spec": {"labels": {"example.com/stage": "running"}}})
    assert changed["metadata"]["generation"] > before, (
        f"expected the labels change to bump generation past {before}, "
        f"saw {changed['metadata']['generation']}")
    # Positive signals that the operator has handled events after the change: a witness
    # job's JobSet status, then this job's own JobSet status, are mirrored.
    sync_through_witness(worker1, namespace, "witness", marker=1)
    patch_jobset_status(worker1, namespace, name, {"replicatedJobsStatus": [
        {"name": "node", "ready": 2, "succeeded": 0, "failed": 0, "active": 2, "suspended": 0}]})
    wait_equal(lambda: [(j.get("name"), j.get("active")) for j in
                        jobs_status(get_trainjob(worker1, namespace, name))],
               [("node", 2)], expected=f"TrainJob {name} jobsStatus (name, active)")
    settled = running_view(worker1, namespace, name)
    labels = get_jobset(worker1, namespace, name)["metadata"].get("labels") or {}
    assert settled["suspend"] is False and "example.com/stage" not in labels, (
        f"expected the running JobSet to stay unsuspended without the new label; "
        f"saw {settled}, labels {labels}")
    assert {k: settled[k] for k in ("image", "nodeSelector")} == {
        k: before_view[k] for k in ("image", "nodeSelector")}, (before_view, settled)
    holds_for(
        lambda: running_view(worker1, namespace, name),
        lambda view: view == settled,
        seconds=3,
        expected=f"running JobSet left alone (no write after the labels change): {settled}")

    # Suspend again, with a new nodeSelector: the JobSet follows.
    patch_trainjob(worker1, namespace, name, {"spec": {
        "suspend": True, "podSpecOverrides": _node_overrides("c")}})
    wait_equal(suspended_condition, ("True", "Suspended"),
               expected="TrainJob condition Suspended (status, reason) after suspending again")
    wait_equal(jobset, (True, [], {"pool": "c"}),
               expected="JobSet (suspend, node STAGE env, nodeSelector) re-applied while "
                        "suspended")


# --- 4. status mapping -----------------------------------------------------------------------


def counts(node: tuple[int, int, int, int, int], initializers_succeeded: int) -> list[dict]:
    """replicatedJobsStatus, sorted by name; ``node`` is (ready, succeeded, failed, active,
    suspended)."""
    done = {"ready": 0, "succeeded": initializers_succeeded, "failed": 0, "active": 0,
            "suspended": 0}
    ready, succeeded, failed, active, suspended = node
    return [
        {"name": "dataset-initializer", **done},
        {"name": "model-initializer", **done},
        {"name": "node", "ready": ready, "succeeded": succeeded, "failed": failed,
         "active": active, "suspended": suspended},
    ]


def status_view(cluster, namespace: str, name: str) -> dict:
    """A TrainJob's resourceVersion, its Complete/Failed conditions as (status, reason,
    message), and its jobsStatus."""
    job = get_trainjob(cluster, namespace, name)
    conditions = {x.get("type"): (x.get("status"), x.get("reason"), x.get("message"))
                  for x in (job.get("status") or {}).get("conditions") or []}
    return {"resourceVersion": job["metadata"]["resourceVersion"],
            "Complete": conditions.get("Complete"), "Failed": conditions.get("Failed"),
            "jobsStatus": jobs_status(job)}


def test_jobs_status_follows_the_jobset_until_complete_then_the_job_is_left_alone(
        worker1, namespace, runtime, run_operator):
    run_operator(worker1)
    name = "finisher"
    create_trainjob(worker1, namespace, trainjob_body(name, runtime, trainer={"numNodes": 100}))
    create_trainjob(worker1, namespace, trainjob_body("witness", runtime,
                                                      trainer={"numNodes": 1}))
    wait_reconciled(worker1, namespace, name)
    wait_reconciled(worker1, namespace, "witness")

    def view() -> dict:
        return {k: v for k, v in status_view(worker1, namespace, name).items()
                if k != "resourceVersion"}

    for replicated in (counts((100, 0, 0, 100, 0), 1), counts((97, 0, 3, 97, 0), 1)):
        patch_jobset_status(worker1, namespace, name, {"replicatedJobsStatus": replicated})
        wait_equal(view, {"Complete": None, "Failed": None, "jobsStatus": replicated},
                   expected=f"TrainJob {name} status following the JobSet's replicatedJobsStatus")

    final = counts((0, 100, 3, 0, 0), 1)
    patch_jobset_status(worker1, namespace, name, {
        "conditions": [jobset_condition("Completed", "AllJobsCompleted", "jobset completed")],
        "replicatedJobsStatus": final,
    })
    wait_equal(view, {"Complete": ("True", "AllJobsCompleted", "jobset completed"),
                      "Failed": None, "jobsStatus": final},
               expected=f"TrainJob {name} Complete with the JobSet's reason and message")
    done = status_view(worker1, namespace, name)

    # Terminal: later JobSet changes are not mirrored, and nothing is written.
    patch_jobset_status(worker1, namespace, name, {
        "conditions": [jobset_condition("Completed", "AllJobsCompleted", "jobset completed"),
                       jobset_condition("Failed", "FailedJobs", "late failure")],
        "replicatedJobsStatus": counts((0, 90, 10, 0, 0), 1),
    })
    sync_through_witness(worker1, namespace, "witness", marker=7)
    holds_for(
        lambda: status_view(worker1, namespace, name),
        lambda seen: seen == done,
        seconds=3,
        expected=f"completed TrainJob {name} left alone after a later JobSet status change: {done}")


def test_jobset_failed_makes_the_trainjob_failed_with_its_reason_and_message(
        worker1, namespace, runtime, run_operator):
    run_operator(worker1)
    name = "doomed"
    create_trainjob(worker1, namespace, trainjob_body(name, runtime, trainer={"numNodes": 4}))
    wait_reconciled(worker1, namespace, name)
    message = "jobset failed: job doomed-node-0 reached its backoffLimit"
    replicated = counts((0, 0, 1, 0, 0), 1)
    patch_jobset_status(worker1, namespace, name, {
        "conditions": [jobset_condition("Failed", "FailedJobs", message)],
        "replicatedJobsStatus": replicated,
    })
    wait_equal(lambda: {k: v for k, v in status_view(worker1, namespace, name).items()
                        if k != "resourceVersion"},
               {"Complete": None, "Failed": ("True", "FailedJobs", message),
                "jobsStatus": replicated},
               expected=f"TrainJob {name} Failed with the JobSet's reason and message")


# --- 5. events -------------------------------------------------------------------------------


def test_events_for_created_suspended_resumed_completed_and_failed(
        worker1, namespace, runtime, run_operator):
    run_operator(worker1)
    created = {
        "lifecycle": create_trainjob(worker1, namespace, trainjob_body(
            "lifecycle", runtime, suspend=True, trainer={"numNodes": 2})),
        "broken": create_trainjob(worker1, namespace, trainjob_body(
            "broken", runtime, trainer={"numNodes": 2})),
    }

    def reasons(name: str) -> set[tuple[str, str]]:
        return {(reason, type_) for reason, type_, _ in events_about(worker1, namespace, name)}

    eventually(lambda: reasons("lifecycle"),
               lambda seen: {("JobSetCreated", "Normal"), ("Suspended", "Normal")} <= seen,
               expected="Events JobSetCreated and Suspended (Normal) on TrainJob lifecycle")
    wait_jobset(worker1, namespace, "lifecycle", lambda js: js["spec"].get("suspend") is True,
                expected="JobSet lifecycle suspended")
    patch_trainjob(worker1, namespace, "lifecycle", {"spec": {"suspend": False}})
    eventually(lambda: reasons("lifecycle"), lambda seen: ("Resumed", "Normal") in seen,
               expected="Event Resumed (Normal) on TrainJob lifecycle")
    patch_jobset_status(worker1, namespace, "lifecycle", {"conditions": [
        jobset_condition("Completed", "AllJobsCompleted", "jobset completed")]})
    completed = eventually(
        lambda: events_about(worker1, namespace, "lifecycle"),
        lambda seen: any(r == "Completed" for r, _, _ in seen),
        expected="Event Completed on TrainJob lifecycle")
    assert [(t, m) for r, t, m in completed if r == "Completed"] == [
        ("Normal", "jobset completed")], (
        f"expected one Completed Event, Normal, message 'jobset completed'; saw {completed}")

    wait_jobset(worker1, namespace, "broken", expected="JobSet broken")
    patch_jobset_status(worker1, namespace, "broken", {"conditions": [
        jobset_condition("Failed", "FailedJobs", "node-0 exceeded its backoffLimit")]})
    failed = eventually(
        lambda: events_about(worker1, namespace, "broken"),
        lambda seen: any(r == "Failed" for r, _, _ in seen),
        expected="Event Failed on TrainJob broken")
    assert [(t, m) for r, t, m in failed if r == "Failed"] == [
        ("Warning", "node-0 exceeded its backoffLimit")], (
        f"expected one Failed Event, Warning, with the JobSet's message; saw {failed}")
    assert ("JobSetCreated", "Normal") in {(r, t) for r, t, _ in failed}, (
        f"expected a JobSetCreated Event on TrainJob broken, saw {failed}")

    # Every Event points at the right object (kind, name and uid).
    for name, job in created.items():
        listed = worker1.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}").items
        refs = {(e.involved_object.kind, e.involved_object.name, e.involved_object.uid)
                for e in listed}
        assert refs == {("TrainJob", name, job["metadata"]["uid"])}, (
            f"expected Events only about TrainJob {name} uid {job['metadata']['uid']}, "
            f"saw {refs}")


# --- runtimePatches (upstream v2.3) ----------------------------------------------------------


def test_runtime_patches_are_merged_into_the_jobset_in_list_order(
        worker1, namespace, runtime, run_operator):
    run_operator(worker1)

    def node_patch(manager: str, pod_spec: dict, labels: dict) -> dict:
        return {"manager": manager, "trainingRuntimeSpec": {"template": {
            "metadata": {"labels": labels},
            "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
                "metadata": {"labels": {"patched-by": manager}},
                "spec": pod_spec}}}}]}}}}

    patches = [
        node_patch("example.com/user", {
            "serviceAccountName": "trainer-sa",
            "nodeSelector": {"pool": "user", "zone": "a"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]},
            {"team": "from-user-patch"}),
        node_patch("kueue.x-k8s.io/manager", {
            "nodeSelector": {"pool": "kueue"},
            "schedulingGates": [{"name": "example.com/gate"}]},
            {"queue": "from-kueue-patch"}),
    ]
    create_trainjob(worker1, namespace, trainjob_body("patched", runtime, runtimePatches=patches))
    stored = get_trainjob(worker1, namespace, "patched")
    assert [p["manager"] for p in stored["spec"].get("runtimePatches") or []] == [
        "example.com/user", "kueue.x-k8s.io/manager"], (
        f"expected both runtimePatches stored (not pruned), saw {stored['spec']}")

    _, jobset = wait_reconciled(worker1, namespace, "patched")
    pod = pod_spec(jobset, "node")
    assert pod.get("serviceAccountName") == "trainer-sa", pod
    # Maps merge key by key, the later manager winning on the same key.
    assert pod.get("nodeSelector") == {"pool": "kueue", "zone": "a"}, pod
    assert pod.get("tolerations") == [{"key": "gpu", "operator": "Exists",
                                       "effect": "NoSchedule"}], pod
    assert pod.get("schedulingGates") == [{"name": "example.com/gate"}], pod
    template_labels = replicated_job(jobset, "node")["template"]["spec"]["template"][
        "metadata"]["labels"]
    assert template_labels.get("patched-by") == "kueue.x-k8s.io/manager", template_labels
    labels = jobset["metadata"]["labels"]
    assert (labels.get("team"), labels.get("queue"), labels.get("runtime-only")) == (
        "from-user-patch", "from-kueue-patch", "kept"), labels
    # Jobs the patches do not name are untouched.
    assert "nodeSelector" not in pod_spec(jobset, "dataset-initializer")


# --- activeDeadlineSeconds (upstream v2.3) ---------------------------------------------------


def test_a_job_past_its_active_deadline_fails_and_loses_its_jobset(
        worker1, namespace, runtime, run_operator):
    run_operator(worker1)
    create_trainjob(worker1, namespace, trainjob_body("late", runtime, activeDeadlineSeconds=3))
    assert get_trainjob(worker1, namespace, "late")["spec"].get("activeDeadlineSeconds") == 3, (
        "expected activeDeadlineSeconds stored (not pruned)")
    wait_reconciled(worker1, namespace, "late")

    failed = wait_equal(
        lambda: conditions_of(worker1, namespace, "late").get("Failed"),
        ("True", "DeadlineExceeded", "TrainJob exceeded its active deadline"),
        expected="TrainJob late condition Failed (status, reason, message) after 3 s")
    assert failed
    eventually(lambda: without_managed_fields(get_jobset(worker1, namespace, "late")),
               lambda js: js is None, expected="JobSet late deleted after the deadline")
    # A failed job is finished: its JobSet is not built again.
    holds_for(lambda: get_jobset(worker1, namespace, "late"), lambda js: js is None, seconds=2,
              expected="no JobSet for the failed TrainJob late")
