"""Resolving a TrainJob against its runtime into RuntimeInfo.

Order of the steps, each a function over RuntimeInfo:
  1. PodSets from the runtime template's replicated jobs (role from the ancestor-step
     label, else from the job name);
  2. the trainer count (``trainer.numNodes``, else ``mlPolicy.numNodes``, else 1);
  3. the TrainJob's trainer and initializer settings;
  4. the plug-ins that take part (``extension_points``): ML policy, then pod-group policy,
     each in registration order;
  5. labels and annotations (runtime's, then the runtime patches', then the TrainJob's);
  6. podSpecOverrides, so what a queueing system injects is what the pods get;
  7. every job's count written as parallelism and completions, then the plug-ins' extra
     objects, built from the final pods.
Before step 1, ``spec.runtimePatches`` are merged into the runtime template in list order
(``runtime_patches``), as upstream Trainer does.
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from typing import Any

from trainjob import constants as c
from trainjob.api import ContainerOverride, Initializer, TrainingRuntime, TrainJob
from trainjob.runtime.extension_points import Plugin, Problems

# Importing the package registers the built-in plug-ins.
from trainjob.runtime.plugins import registered
from trainjob.runtime.pod_template import apply_node_settings, merge_by_name, merge_env
from trainjob.runtime.podsets import PodSet, RuntimeInfo, RuntimePolicy
from trainjob.runtime.runtime_patches import patched_metadata, patched_template_spec

_ROLE_BY_NAME = {
    c.NODE: c.ROLE_TRAINER,
    c.LAUNCHER: c.ROLE_LAUNCHER,
    c.DATASET_INITIALIZER: c.ROLE_DATASET_INITIALIZER,
    c.MODEL_INITIALIZER: c.ROLE_MODEL_INITIALIZER,
}


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
                       plugins: list[Plugin] | None = None) -> RuntimeInfo:
    """RuntimeInfo for ``job`` on ``runtime``: PodSets with counts, settings and policies,
    and the objects the plug-ins build beside the JobSet."""
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
        runtime_jobs=copy.deepcopy(patched.get("replicatedJobs") or []),
    )
    for pod_set in info.by_role(c.ROLE_TRAINER):
        pod_set.set_count(trainer_count(job, runtime))
    apply_trainer(info, job)
    apply_initializers(info, job)
    active = enabled_plugins(info, plugins)
    for plugin in active:
        _call(plugin, "enforce_ml_policy", info, job)
    for plugin in active:
        _call(plugin, "enforce_pod_group_policy", info, job)
    template_meta = runtime.spec.template.metadata
    info.labels = {**patched_metadata("labels", template_meta.labels, job), **job.spec.labels}
    info.annotations = {**patched_metadata("annotations", template_meta.annotations, job),
                        **job.spec.annotations}
    apply_pod_spec_overrides(info, job)
    sync_counts(info)
    info.objects = [obj for plugin in active for obj in _call(plugin, "build", info, job) or []]
    return info


def enabled_plugins(info: RuntimeInfo, plugins: list[Plugin] | None = None) -> list[Plugin]:
    """The registered plug-ins (or ``plugins``) that take part for ``info``'s policy."""
    return [p for p in (plugins if plugins is not None else registered())
            if p.enabled(info.policy)]


def _call(plugin: Plugin, extension_point: str, *args: Any) -> Any:
    method = getattr(plugin, extension_point, None)
    return method(*args) if method is not None else None


def sync_counts(info: RuntimeInfo) -> None:
    """Every replicated job states its pod count as ``parallelism`` and ``completions``,
    as upstream writes them, so the JobSet says how many pods each Job runs."""
    for pod_set in info.pod_sets:
        pods = pod_set.parallelism
        pod_set.job_spec["parallelism"] = pods
        pod_set.job_spec["completions"] = pods


def validate_policies(info: RuntimeInfo, job: TrainJob,
                      plugins: list[Plugin] | None = None) -> Problems:
    """(field path, reason) for what the plug-ins taking part refuse in ``job``."""
    problems: Problems = []
    for plugin in enabled_plugins(info, plugins):
        problems += _call(plugin, "validate", info, job) or []
    return problems


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
        if override.volume_mounts:
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
