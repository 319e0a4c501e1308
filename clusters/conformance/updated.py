"""Cases that create a TrainJob and then change it: upstream's update rules, each with the
field and reason upstream gives (in the comment), compared by meaning like the creates.

* runtimePatches may change only when the job is suspended before or after the update
  (upstream's TrainJob webhook), and then only while the JobSet has no active replicated
  job;
* the fields upstream's CRD keeps as they were (``self == oldSelf``): managedBy, runtimeRef,
  initializer, activeDeadlineSeconds, trainer, and inside a runtime patch the pod fields
  other than scheduling constraints (serviceAccountName, volumes, containers, ...);
* in a runtime's JobSet template, the fields JobSet keeps as they were: failurePolicy,
  network, successPolicy, startupPolicy, volumeClaimPolicies and each replicated job's
  dependsOn (other fields of a runtime may change).
"""

from __future__ import annotations

from clusters.conformance.objects import (
    UPDATE_WHEN_ACTIVE,
    UPDATE_WHEN_SUSPENDED,
    Case,
    job,
    runtime,
    torch_runtime,
    trainjob,
)
from trainjob import constants as c

QUEUE = "example.com/queue"
# The run's node has pool "a"; no node has pool "nowhere", so such pods stay pending and
# their Job active.
RUNS, PENDS = "a", "nowhere"

OVERRIDES_PRUNED = ("podSpecOverrides is the v2.0 API the project keeps, changed only while "
                    "suspended; upstream v2.3's CRD prunes the field, so it admits any change "
                    "of it")


def _patch(pool: str, **pod_spec) -> list[dict]:
    """One queue's runtime patch of the node job: a nodeSelector and ``pod_spec``."""
    return [{"manager": QUEUE, "trainingRuntimeSpec": {"template": {"spec": {
        "replicatedJobs": [{"name": c.NODE, "template": {"spec": {"template": {"spec": {
            "nodeSelector": {"pool": pool}, **pod_spec}}}}}]}}}}]


def _case(name: str, update: dict, runtimes: list[dict] | None = None,
          runtime_name: str = "cf-torch", trainer: dict | None = None, intended: str = "",
          when: str = "", **spec) -> Case:
    return Case(name, "update", trainjob(name, runtime_name,
                                         {"numNodes": 1} if trainer is None else trainer,
                                         **spec),
                [torch_runtime()] if runtimes is None else runtimes,
                update={"spec": update}, update_when=when, intended=intended)


def _dataset_runtime() -> dict:
    """A torch runtime with a dataset-initializer job (labelled as that step, as upstream's
    runtimes label it) that mounts the initializer volume."""
    mounts = [{"name": "initializer", "mountPath": "/workspace"}]
    return runtime("cf-upd-dataset", {"numNodes": 1, "torch": {}},
                   [job(c.DATASET_INITIALIZER, c.ROLE_DATASET_INITIALIZER,
                        container=c.DATASET_INITIALIZER, volumeMounts=mounts),
                    job(c.NODE, c.ROLE_TRAINER)])


def update_cases() -> list[Case]:
    return [
        # spec.runtimePatches Forbidden: changed while running, suspended neither before
        # nor after.
        _case("cf-upd-patch-running", {"runtimePatches": _patch(RUNS, tolerations=[
            {"key": "a", "operator": "Exists"}])}, runtimePatches=_patch(RUNS)),
        # Admitted: changed while suspended (the JobSet, suspended too, takes the patch).
        _case("cf-upd-patch-suspended", {"runtimePatches": _patch(RUNS, tolerations=[
            {"key": "a", "operator": "Exists"}])}, runtimePatches=_patch(PENDS),
            suspend=True),
        # Admitted: changed and resumed in one request (suspended before; the JobSet exists
        # and has no active job), as Kueue admits a job.
        _case("cf-upd-patch-resume", {"suspend": False, "runtimePatches": _patch(RUNS)},
              runtimePatches=_patch(PENDS), suspend=True, when=UPDATE_WHEN_SUSPENDED),
        # spec.runtimePatches Forbidden: changed and suspended in one request while the
        # JobSet's node job is still active (its pod cannot be placed).
        _case("cf-upd-patch-suspend-active", {"suspend": True, "runtimePatches": _patch(RUNS)},
              runtimePatches=_patch(PENDS), when=UPDATE_WHEN_ACTIVE),
        # ...serviceAccountName Invalid: a patch's pod fields other than scheduling
        # constraints stay as created, even while suspended.
        _case("cf-upd-patch-account", {"runtimePatches": _patch(
            RUNS, serviceAccountName="other")}, runtimePatches=_patch(
            RUNS, serviceAccountName="default"), suspend=True),
        # spec.managedBy Invalid.
        _case("cf-upd-managed-by", {"managedBy": "kueue.x-k8s.io/multikueue"},
              managedBy="trainer.kubeflow.org/trainjob-controller"),
        # spec.runtimeRef Invalid.
        _case("cf-upd-runtime-ref", {"runtimeRef": {"name": "cf-torch-gpu"}}),
        # spec.activeDeadlineSeconds Invalid.
        _case("cf-upd-deadline", {"activeDeadlineSeconds": 900}, activeDeadlineSeconds=600),
        # spec.initializer Invalid (suspended: the dataset is never fetched on kwok).
        _case("cf-upd-initializer", {"initializer": {"dataset": {
            "storageUri": "hf://example/other"}}}, [_dataset_runtime()], "cf-upd-dataset",
            initializer={"dataset": {"storageUri": "hf://example/data"}}, suspend=True),
        # spec.trainer Invalid, suspended or not.
        _case("cf-upd-trainer", {"trainer": {"image": "node:v2"}}, suspend=True),
        # Upstream admits any change of the pruned field; the project refuses it while the
        # job runs (spec.podSpecOverrides Forbidden).
        _case("cf-upd-overrides-running", {"podSpecOverrides": [
            {"targetJobs": [{"name": c.NODE}], "nodeSelector": {"pool": PENDS}}]},
            podSpecOverrides=[{"targetJobs": [{"name": c.NODE}],
                               "nodeSelector": {"pool": RUNS}}],
            intended=OVERRIDES_PRUNED),
    ]


def _staged_runtime(name: str, kind: str) -> dict:
    """A runtime whose JobSet template sets every field JobSet keeps as created: the node
    job waits for the dataset initializer to complete."""
    staged = runtime(name, {"numNodes": 1, "torch": {}}, [
        job(c.DATASET_INITIALIZER, c.ROLE_DATASET_INITIALIZER, container=c.DATASET_INITIALIZER),
        {**job(c.NODE, c.ROLE_TRAINER),
         "dependsOn": [{"name": c.DATASET_INITIALIZER, "status": "Complete"}]}], kind=kind)
    staged["spec"]["template"]["spec"].update({
        "failurePolicy": {"maxRestarts": 1}, "network": {"publishNotReadyAddresses": True},
        "successPolicy": {"operator": "All"}})
    return staged


def _runtime_case(name: str, template_spec: dict,
                  kind: str = c.CLUSTERTRAININGRUNTIME_KIND, **spec) -> Case:
    """A runtime-only case: ``_staged_runtime`` created, then merge-patched with
    ``template_spec`` under spec.template.spec (and ``spec`` under spec)."""
    patch = {"spec": {**spec, **({"template": {"spec": template_spec}} if template_spec
                                  else {})}}
    return Case(name, "update", None, [_staged_runtime(name, kind)], update=patch)


def runtime_update_cases() -> list[Case]:
    staged = _staged_runtime("", c.CLUSTERTRAININGRUNTIME_KIND)["spec"]["template"]["spec"]
    waits_ready = [dict(j) for j in staged["replicatedJobs"]]
    waits_ready[1] = {**waits_ready[1], "dependsOn": [{"name": c.DATASET_INITIALIZER,
                                                       "status": "Ready"}]}
    return [
        # spec.template.spec.failurePolicy Invalid ("Value is immutable").
        _runtime_case("cf-upd-rt-failure", {"failurePolicy": {"maxRestarts": 3}}),
        # spec.template.spec.network Invalid, on a namespaced runtime too.
        _runtime_case("cf-upd-rt-network", {"network": {"enableDNSHostnames": False}},
                      kind=c.TRAININGRUNTIME_KIND),
        # spec.template.spec.successPolicy Invalid.
        _runtime_case("cf-upd-rt-success", {"successPolicy": {"operator": "Any"}}),
        # spec.template.spec.replicatedJobs[1].dependsOn Invalid.
        _runtime_case("cf-upd-rt-depends-on", {"replicatedJobs": waits_ready}),
        # Admitted: the node count and the ML policy may change.
        _runtime_case("cf-upd-rt-nodes", {}, mlPolicy={"numNodes": 2}),
    ]

