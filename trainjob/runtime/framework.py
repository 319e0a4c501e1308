"""Resolving a TrainJob against its runtime into RuntimeInfo.

Order of the steps, each a function over RuntimeInfo:
  1. PodSets from the runtime template's replicated jobs (role from the ancestor-step
     label, else from the job name);
  2. the trainer count (``trainer.numNodes``, else ``mlPolicy.numNodes``, else 1);
  3. the TrainJob's trainer and initializer settings;
  4. the policy plug-ins (torch, mpi, ...), in registration order, each only when enabled;
  5. labels and annotations (runtime's, then the runtime patches', then the TrainJob's);
  6. podSpecOverrides last, so what a queueing system injects is what the pods get.
Before step 1, ``spec.runtimePatches`` are merged into the runtime template in list order
(``runtime_patches``), as upstream Trainer does.
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from typing import Any, Protocol

from trainjob import constants as c
from trainjob.api import ContainerOverride, Initializer, TrainingRuntime, TrainJob
from trainjob.runtime.podsets import PodSet, RuntimeInfo, RuntimePolicy
from trainjob.runtime.runtime_patches import patched_metadata, patched_template_spec

_ROLE_BY_NAME = {
    c.NODE: c.ROLE_TRAINER,
    c.LAUNCHER: c.ROLE_LAUNCHER,
    c.DATASET_INITIALIZER: c.ROLE_DATASET_INITIALIZER,
    c.MODEL_INITIALIZER: c.ROLE_MODEL_INITIALIZER,
}


class PolicyPlugin(Protocol):
    """A framework's contribution. Register with ``trainjob.runtime.plugins.register``."""

    name: str

    def enabled(self, policy: RuntimePolicy) -> bool:
        """Whether this plug-in applies to a runtime with ``policy``."""

    def apply(self, info: RuntimeInfo, job: TrainJob) -> None:
        """Mutate ``info`` for ``job`` (env, ports, extra jobs, extra objects, counts)."""

    def validate(self, info: RuntimeInfo, job: TrainJob) -> list[tuple[str, str]]:
        """(field path, reason) for each thing this framework refuses in ``job``."""


def role_of(replicated_job: dict[str, Any], labelled: Collection[str] = ()) -> str:
    """The job's ancestor step: its label, else its name's usual role, unless another job of
    the template carries that role by label (``labelled``). Upstream reads the label only;
    the name is the seed runtimes' convention and must not make a DeepSpeed/MLX ``node``
    job (sshd; the labelled launcher is the trainer) a second trainer."""
    label = _ancestor_label(replicated_job)
    if label:
        return label
    by_name = _ROLE_BY_NAME.get(replicated_job.get("name", ""), "")
    return "" if by_name in labelled else by_name


def _ancestor_label(replicated_job: dict[str, Any]) -> str:
    template = replicated_job.get("template")
    metadata = template.get("metadata") if isinstance(template, dict) else None
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    role = labels.get(c.ANCESTOR_LABEL) if isinstance(labels, dict) else None
    return role if isinstance(role, str) else ""


def pod_sets_from_template(runtime: TrainingRuntime) -> list[PodSet]:
    """One PodSet per replicated job. The template is schemaless in the CRD, so its shape
    is checked here: a malformed runtime fails with a message, not a crash."""
    jobs = copy.deepcopy(runtime.spec.template.spec.get("replicatedJobs") or [])
    if not isinstance(jobs, list):
        raise ValueError("spec.template.spec.replicatedJobs must be a list")
    for i, job in enumerate(jobs):
        if not isinstance(job, dict) or not isinstance(job.get("name"), str):
            raise ValueError(f"spec.template.spec.replicatedJobs[{i}] needs a name")
        template = job.get("template", {})
        if not isinstance(template, dict) or not isinstance(template.get("spec", {}), dict):
            raise ValueError(f"spec.template.spec.replicatedJobs[{i}].template must be an "
                             "object with a Job spec")
    labelled = {_ancestor_label(job) for job in jobs} - {""}
    return [PodSet(role=role_of(job, labelled), job=job) for job in jobs]


def trainer_count(job: TrainJob, runtime: TrainingRuntime) -> int:
    if job.spec.trainer is not None and job.spec.trainer.num_nodes:
        return job.spec.trainer.num_nodes
    ml_policy = runtime.spec.ml_policy
    if ml_policy is not None and ml_policy.num_nodes:
        return ml_policy.num_nodes
    return 1


def build_runtime_info(job: TrainJob, runtime: TrainingRuntime,
                       plugins: list[PolicyPlugin] | None = None) -> RuntimeInfo:
    """RuntimeInfo for ``job`` on ``runtime``: PodSets with counts, settings and policies."""
    from trainjob.runtime.plugins import registered

    # Runtime patches first: every later step sees the template as the managers patched it.
    patched = patched_template_spec(runtime.spec.template.spec, job)
    runtime = runtime.model_copy(update={"spec": runtime.spec.model_copy(update={
        "template": runtime.spec.template.model_copy(update={"spec": patched})})})
    template_spec = {k: copy.deepcopy(v) for k, v in patched.items() if k != "replicatedJobs"}
    info = RuntimeInfo(
        policy=RuntimePolicy(
            # A copy: plug-ins may read it freely without touching the cached runtime.
            ml_policy=(runtime.spec.ml_policy.model_copy(deep=True)
                       if runtime.spec.ml_policy else RuntimePolicy().ml_policy),
            pod_group_policy=runtime.spec.pod_group_policy,
        ),
        pod_sets=pod_sets_from_template(runtime),
        jobset_spec=template_spec,
    )
    for pod_set in info.by_role(c.ROLE_TRAINER):
        pod_set.set_count(trainer_count(job, runtime))
    apply_trainer(info, job)
    apply_initializers(info, job)
    for plugin in plugins if plugins is not None else registered():
        if plugin.enabled(info.policy):
            plugin.apply(info, job)
    template_meta = runtime.spec.template.metadata
    info.labels = {**patched_metadata("labels", template_meta.labels, job), **job.spec.labels}
    info.annotations = {**patched_metadata("annotations", template_meta.annotations, job),
                        **job.spec.annotations}
    apply_pod_spec_overrides(info, job)
    return info


def validate_policies(info: RuntimeInfo, job: TrainJob,
                      plugins: list[PolicyPlugin] | None = None) -> list[tuple[str, str]]:
    from trainjob.runtime.plugins import registered

    problems: list[tuple[str, str]] = []
    for plugin in plugins if plugins is not None else registered():
        if plugin.enabled(info.policy):
            problems += plugin.validate(info, job)
    return problems


def merge_by_name(target: list[dict[str, Any]], items: list[dict[str, Any]]) -> None:
    """Add ``items`` to ``target``, replacing entries of the same ``name``."""
    for item in items:
        for i, old in enumerate(target):
            if old.get("name") == item.get("name"):
                target[i] = copy.deepcopy(item)
                break
        else:
            target.append(copy.deepcopy(item))


def merge_env(container: dict[str, Any], env: list[dict[str, Any]]) -> None:
    """Set each variable in ``env`` on ``container``, replacing one of the same name."""
    merge_by_name(container.setdefault("env", []), env)


def apply_trainer(info: RuntimeInfo, job: TrainJob) -> None:
    """The TrainJob's trainer settings go to the ``node`` container of the trainer step
    only (upstream's rule): other jobs keep their own command and image."""
    trainer = job.spec.trainer
    if trainer is None:
        return
    for pod_set in info.by_role(c.ROLE_TRAINER):
        container = pod_set.container(c.NODE)
        if container is None:
            continue
        if trainer.image:
            container["image"] = trainer.image
        if trainer.command is not None:
            container["command"] = list(trainer.command)
        if trainer.args is not None:
            container["args"] = list(trainer.args)
        apply_node_settings(pod_set, job)


def apply_node_settings(pod_set: PodSet, job: TrainJob) -> None:
    """``trainer.env`` and ``trainer.resourcesPerNode`` on ``pod_set``'s ``node`` container:
    the trainer step's, and any other job a policy runs training processes in (MPI's node
    job when the launcher runs as a node)."""
    trainer = job.spec.trainer
    container = pod_set.container(c.NODE)
    if trainer is None or container is None:
        return
    merge_env(container, trainer.env)
    if trainer.resources_per_node is not None:
        container["resources"] = merge_resources(container.get("resources") or {},
                                                 trainer.resources_per_node.dump())


def merge_resources(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` laid over ``base`` as upstream merges resourcesPerNode onto the runtime's
    resources: limits and requests per resource name, claims by name."""
    merged = copy.deepcopy(base)
    for key in ("limits", "requests"):
        if override.get(key):
            merged[key] = {**(merged.get(key) or {}), **override[key]}
    if override.get("claims"):
        merge_by_name(merged.setdefault("claims", []), override["claims"])
    return merged


def _apply_initializer(pod_set: PodSet, settings: Initializer) -> None:
    container = pod_set.container(pod_set.name) or (pod_set.containers[0]
                                                     if pod_set.containers else None)
    if container is None:
        return
    if settings.storage_uri:
        merge_env(container, [{"name": "STORAGE_URI", "value": settings.storage_uri}])
    merge_env(container, settings.env)
    if settings.secret_ref is not None:
        env_from = container.setdefault("envFrom", [])
        ref = {"secretRef": {"name": settings.secret_ref.name}}
        if ref not in env_from:
            env_from.append(ref)


def apply_initializers(info: RuntimeInfo, job: TrainJob) -> None:
    initializer = job.spec.initializer
    if initializer is None:
        return
    for role, settings in ((c.ROLE_DATASET_INITIALIZER, initializer.dataset),
                           (c.ROLE_MODEL_INITIALIZER, initializer.model)):
        if settings is not None:
            for pod_set in info.by_role(role):
                _apply_initializer(pod_set, settings)


def _override_containers(containers: list[dict[str, Any]],
                         overrides: list[ContainerOverride] | None) -> None:
    for override in overrides or []:
        container = next((x for x in containers if x.get("name") == override.name), None)
        if container is None:
            continue  # the webhook refuses unknown names at create; never invent a container
        merge_env(container, override.env)
        merge_by_name(container.setdefault("volumeMounts", []), override.volume_mounts)


def apply_pod_spec_overrides(info: RuntimeInfo, job: TrainJob) -> None:
    for override in job.spec.pod_spec_overrides:
        targets = {t.name for t in override.target_jobs}
        for pod_set in info.pod_sets:
            if pod_set.name not in targets:
                continue
            spec = pod_set.pod_spec
            if override.service_account_name is not None:
                spec["serviceAccountName"] = override.service_account_name
            if override.node_selector is not None:
                spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **override.node_selector}
            if override.tolerations is not None:
                spec.setdefault("tolerations", []).extend(copy.deepcopy(override.tolerations))
            if override.volumes is not None:
                merge_by_name(spec.setdefault("volumes", []), override.volumes)
            if override.scheduling_gates is not None:
                merge_by_name(spec.setdefault("schedulingGates", []), override.scheduling_gates)
            _override_containers(pod_set.containers, override.containers)
            _override_containers(pod_set.init_containers, override.init_containers)
