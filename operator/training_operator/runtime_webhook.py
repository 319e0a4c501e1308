"""Admission rules for TrainingRuntimes and ClusterTrainingRuntimes, as upstream Trainer has
them: each replicated job labelled as a step of the TrainJob (trainer, dataset-initializer,
model-initializer) runs one replica, and holds the container that step's settings go to
(``node``, ``dataset-initializer``, ``model-initializer``). A TrainingRuntime is checked when
it is created; a ClusterTrainingRuntime also when it changes (upstream's choice). A runtime
labelled ``trainer.kubeflow.org/webhook-validation: disabled`` is not sent here (the webhook
configuration's objectSelector)."""

from __future__ import annotations

from typing import Any

from trainjob import constants as c

# The container each labelled step must have.
STEP_CONTAINERS = {
    c.ROLE_TRAINER: c.NODE,
    c.ROLE_DATASET_INITIALIZER: c.DATASET_INITIALIZER,
    c.ROLE_MODEL_INITIALIZER: c.MODEL_INITIALIZER,
}
KINDS = (c.TRAININGRUNTIME_KIND, c.CLUSTERTRAININGRUNTIME_KIND)


def checked(kind: str, operation: str) -> bool:
    """Whether a ``kind`` runtime is checked on ``operation``."""
    return operation == "CREATE" or kind == c.CLUSTERTRAININGRUNTIME_KIND


def problems(runtime: dict) -> list[tuple[str, str]]:
    """(field path, reason) for each labelled step that breaks the rules."""
    spec = runtime.get("spec") if isinstance(runtime.get("spec"), dict) else {}
    template = spec.get("template") if isinstance(spec.get("template"), dict) else {}
    jobset = template.get("spec") if isinstance(template.get("spec"), dict) else {}
    jobs = jobset.get("replicatedJobs")
    found = []
    for i, job in enumerate(jobs if isinstance(jobs, list) else []):
        step = _step(job)
        if step not in STEP_CONTAINERS:
            continue
        path = f"spec.template.spec.replicatedJobs[{i}]"
        replicas = job.get("replicas", 1)
        if replicas != 1:
            found.append((f"{path}.replicas", f"{replicas!r}: a {step} step runs exactly 1 "
                                              "replica"))
        wanted = STEP_CONTAINERS[step]
        if wanted not in _container_names(job):
            found.append((f"{path}.template.spec.template.spec.containers",
                          f"a {step} step needs a container named {wanted}, which the "
                          f"TrainJob's {step} settings go to"))
    return found


def _step(job: Any) -> str:
    labels = _dig(job, "template", "metadata", "labels")
    step = labels.get(c.ANCESTOR_LABEL) if isinstance(labels, dict) else None
    return step if isinstance(step, str) else ""


def _container_names(job: Any) -> set[str]:
    containers = _dig(job, "template", "spec", "template", "spec", "containers")
    return {x.get("name") for x in containers if isinstance(x, dict)} \
        if isinstance(containers, list) else set()


def _dig(obj: Any, *keys: str) -> Any:
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj
