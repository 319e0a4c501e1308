"""Objects upstream Trainer refuses, one case for each way its admission refuses: the
TrainJob webhook (the runtime it names, initializers, runtime patches, each ML policy's and
the Volcano plug-in's rules: an empty queue, a PriorityClass that does not exist), the
runtime webhooks (a step's replicas and container) and the CEL rules of its CRDs (its own,
and two of JobSet's in the runtime template). The table shows, for each, the fields and
reasons both sides name.

Each comment names the field and reason upstream gives; the cases of ``cases.project_cases``
marked "refused by both" cover the rest (reserved torch/MPI/XGBoost variables, managedBy, a
patch manager that is not a domain-prefixed path, a patch of an unknown job, torchtune on
two nodes, an envInjection target the runtime lacks, a runtime step without its container,
two ML policies, a missing ClusterTrainingRuntime).
"""

from __future__ import annotations

import copy

from clusters import upstream_trainer
from clusters.conformance.objects import Case, job, runtime, torch_runtime, trainjob
from trainjob import constants as c

TUNE = ["tune", "run"]
LLAMA_1B = "torchtune/llama3_2/llama3_2_1B.yaml"
QWEN = "torchtune/qwen2_5/qwen2_5_1.5B.yaml"
VOLCANO_QUEUE = "scheduling.volcano.sh/queue-name"
# Upstream's webhook means to refuse these too, but checks the runtime with the patches
# already merged in, where the container exists (docs/conformance.md lists the same).
PATCH_OF_UNKNOWN_CONTAINER = ("a runtime patch naming a container the runtime's job lacks is "
                              "refused at admission; upstream merges it in as a new "
                              "container without an image and builds a JobSet of it")


def _case(name: str, runtimes: list[dict], trainer: dict | None = None,
          runtime_name: str = "cf-torch", kind: str = c.CLUSTERTRAININGRUNTIME_KIND,
          intended: str = "", **spec) -> Case:
    return Case(name, "refused", trainjob(name, runtime_name, trainer, kind=kind, **spec),
                runtimes, intended=intended)


def _patch(pod_spec: dict, job_name: str = "node") -> list[dict]:
    return [{"manager": "example.com/one", "trainingRuntimeSpec": {"template": {"spec": {
        "replicatedJobs": [{"name": job_name, "template": {"spec": {"template": {
            "spec": pod_spec}}}}]}}}}]


def _renamed(document: dict, name: str) -> dict:
    renamed = copy.deepcopy(document)
    renamed["metadata"]["name"] = name
    return renamed


def _initializer_runtime(name: str, step: str, container: str, mounted: bool) -> dict:
    """A torch runtime with an unlabelled ``step`` job (upstream finds initializer jobs by
    name) whose one container is ``container``, mounting the initializer volume or not."""
    mounts = {"volumeMounts": [{"name": "initializer", "mountPath": "/workspace"}]} \
        if mounted else {}
    return runtime(name, {"numNodes": 1, "torch": {}},
                   [job(step, container=container, **mounts), job("node", c.ROLE_TRAINER)])


def trainjob_webhook_cases() -> list[Case]:
    torch = torch_runtime()
    llama = upstream_trainer.runtime(LLAMA_1B)
    return [
        # spec.runtimeRef Invalid: the namespaced runtime does not exist.
        _case("cf-bad-missing-ns-runtime", [], {}, "cf-no-such", c.TRAININGRUNTIME_KIND),
        # (no field): upstream has no runtime of that kind.
        _case("cf-bad-runtime-kind", [], {}, "cf-torch", "OtherRuntime"),
        # spec.runtimeRef Invalid: a dataset to fetch, no dataset-initializer job.
        _case("cf-bad-dataset-no-job", [torch], {},
              initializer={"dataset": {"storageUri": "hf://example/data"}}),
        # spec.runtimeRef Invalid: the dataset-initializer job lacks its container.
        _case("cf-bad-dataset-no-container", [_initializer_runtime(
            "cf-dataset-no-container", c.DATASET_INITIALIZER, "main", True)], {},
            "cf-dataset-no-container",
            initializer={"dataset": {"storageUri": "hf://example/data"}}),
        # spec.runtimeRef Invalid: the model-initializer container lacks the volume.
        _case("cf-bad-model-no-mount", [_initializer_runtime(
            "cf-model-no-mount", c.MODEL_INITIALIZER, c.MODEL_INITIALIZER, False)], {},
            "cf-model-no-mount", initializer={"model": {"storageUri": "hf://example/model"}}),
        # spec.runtimePatches Invalid: patches of containers the runtime's job lacks (meant
        # to; see PATCH_OF_UNKNOWN_CONTAINER), and of the env of the node container (set
        # through spec.trainer).
        _case("cf-bad-patch-container", [torch], {}, intended=PATCH_OF_UNKNOWN_CONTAINER,
              runtimePatches=_patch({"containers": [{"name": "absent"}]})),
        _case("cf-bad-patch-init-container", [torch], {}, intended=PATCH_OF_UNKNOWN_CONTAINER,
              runtimePatches=_patch({"initContainers": [{"name": "absent"}]})),
        _case("cf-bad-patch-node-env", [torch], {}, runtimePatches=_patch(
            {"containers": [{"name": c.NODE, "env": [{"name": "A", "value": "b"}]}]})),
        # spec.runtimeRef.name Invalid: torchtune on a runtime named after no model.
        _case("cf-bad-torchtune-model", [torch], {"command": TUNE}),
        # spec.runtimeRef.name Invalid: QLoRA on the Qwen model.
        _case("cf-bad-torchtune-qlora-qwen", [upstream_trainer.runtime(QWEN)],
              {"command": TUNE, "args": ["model.quantize_base=True"]},
              "torchtune-qwen2.5-1.5b"),
        # spec.trainer.numProcPerNode and resourcesPerNode Invalid: QLoRA on several devices
        # of a Llama 3.2 model.
        _case("cf-bad-torchtune-qlora-devices", [llama],
              {"command": TUNE, "numProcPerNode": 2, "args": ["model.quantize_base=True"]},
              "torchtune-llama3.2-1b"),
        # spec.trainer.numNodes Invalid: LoRA on two nodes (of the one model that may use
        # two).
        _case("cf-bad-torchtune-lora-nodes", [_renamed(llama, "torchtune-llama3.3-70b")],
              {"command": TUNE, "numNodes": 2, "args": ["model.lora_attn_modules=[q_proj]"]},
              "torchtune-llama3.3-70b"),
        # spec.trainer.args[1] Invalid: a setting the runtime owns.
        _case("cf-bad-torchtune-args", [llama],
              {"command": TUNE, "args": ["epochs=1", "output_dir=/tmp/out"]},
              "torchtune-llama3.2-1b"),
        # spec.trainer.numNodes Invalid: two nodes on an MPI runtime that runs the launcher
        # as a node but has no launcher job.
        _case("cf-bad-mpi-no-launcher", [runtime(
            "cf-mpi-no-launcher", {"numNodes": 1, "mpi": {"runLauncherAsNode": True}},
            [job("node", c.ROLE_TRAINER)])], {"numNodes": 2}, "cf-mpi-no-launcher"),
        # spec.annotations[scheduling.volcano.sh/queue-name] Invalid: an empty queue.
        _case("cf-bad-volcano-queue", [_volcano_runtime()], {}, "cf-volcano-empty-queue"),
        # spec.templateSpec.priorityClassName Invalid: a Volcano runtime's pod template names
        # a PriorityClass that does not exist.
        _case("cf-bad-volcano-priority", [_volcano_priority_runtime()], {},
              "cf-volcano-no-priority"),
    ]


def _volcano_runtime() -> dict:
    document = runtime("cf-volcano-empty-queue", {"numNodes": 1, "torch": {}},
                       [job("node", c.ROLE_TRAINER)], podGroupPolicy={"volcano": {}})
    document["spec"]["template"]["metadata"] = {"annotations": {VOLCANO_QUEUE: ""}}
    return document


def _volcano_priority_runtime() -> dict:
    node = job("node", c.ROLE_TRAINER)
    node["template"]["spec"]["template"]["spec"]["priorityClassName"] = "cf-no-such-priority"
    return runtime("cf-volcano-no-priority", {"numNodes": 1, "torch": {}}, [node],
                   podGroupPolicy={"volcano": {}})


def runtime_webhook_cases() -> list[Case]:
    replicas = job("node", c.ROLE_TRAINER)
    replicas["replicas"] = 2
    return [
        # spec.template.spec.replicatedJobs[0].replicas Invalid: a step runs one replica.
        Case("cf-bad-runtime-replicas", "refused", None, [runtime(
            "cf-bad-replicas", {"numNodes": 1, "torch": {}}, [replicas])]),
        # spec.template.spec.replicatedJobs[1].template.spec.template.spec.containers
        # Invalid, for a namespaced TrainingRuntime.
        Case("cf-bad-ns-runtime-step", "refused", None, [runtime(
            "cf-bad-ns-step", {"numNodes": 1, "torch": {}},
            [job("sidecar"), job("node", c.ROLE_TRAINER, container="main")],
            kind=c.TRAININGRUNTIME_KIND)]),
    ]


def crd_rule_cases() -> list[Case]:
    torch = torch_runtime()
    return [
        # The TrainJob's name is not a DNS-1035 label (a rule on the whole object).
        _case("1-cf-bad-name", [torch], {}),
        # spec.initializer.dataset.storageUri Invalid: not scheme://...
        _case("cf-bad-storage-uri", [torch], {},
              initializer={"dataset": {"storageUri": "no-scheme"}}),
        # ...envInjection.targets[0].containerNames Invalid: the node container always
        # gets the torch environment.
        Case("cf-bad-injection-node", "refused", None, [runtime(
            "cf-bad-injection-node", {"numNodes": 1, "torch": {"envInjection": {"targets": [
                {"jobName": "node", "containerNames": [c.NODE]}]}}},
            [job("node", c.ROLE_TRAINER)])]),
        # spec.template.spec Invalid: JobSet's rule that InOrder startup and dependsOn
        # exclude each other.
        Case("cf-bad-runtime-in-order-depends", "refused", None, [_in_order_depends()]),
        # spec.template.spec.volumeClaimPolicies[0] Invalid: JobSet's rule that a claim
        # template sets no namespace (claims go to the JobSet's).
        Case("cf-bad-runtime-claim-namespace", "refused", None, [_claim_namespace()]),
    ]


def _in_order_depends() -> dict:
    node = job("node", c.ROLE_TRAINER)
    node["dependsOn"] = [{"name": "prepare", "status": "Complete"}]
    document = runtime("cf-bad-in-order-depends", {"numNodes": 1, "torch": {}},
                       [job("prepare"), node])
    document["spec"]["template"]["spec"]["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    return document


def _claim_namespace() -> dict:
    # A namespaced TrainingRuntime: its CRD carries the rules too.
    document = runtime("cf-bad-claim-namespace", {"numNodes": 1, "torch": {}},
                       [job("node", c.ROLE_TRAINER)], kind=c.TRAININGRUNTIME_KIND)
    document["spec"]["template"]["spec"]["volumeClaimPolicies"] = [{
        "templates": [{"metadata": {"name": "data", "namespace": "other"},
                       "spec": {"accessModes": ["ReadWriteOnce"],
                                "resources": {"requests": {"storage": "1Gi"}}}}],
        "retentionPolicy": {"whenDeleted": "Delete"}}]
    return document


def refused_cases() -> list[Case]:
    return trainjob_webhook_cases() + runtime_webhook_cases() + crd_rule_cases()
