"""The torch policy: torchrun's environment and rendezvous port on every trainer pod.

torchrun reads its options from ``PET_*`` environment variables (``PET_NNODES`` is
``--nnodes`` and so on), so the trainer's command can stay a plain ``torchrun train.py``.
On the ``node`` container of every PodSet whose role is ``trainer``:

* ``PET_NNODES``: that PodSet's pod count;
* ``PET_NPROC_PER_NODE``: the TrainJob's ``trainer.numProcPerNode``, else the runtime's
  ``mlPolicy.torch.numProcPerNode`` (seed runtimes), else ``auto``. As upstream Trainer
  derives it, ``auto`` on a node without GPUs becomes the node's CPU count (the ``node``
  container's cpu request, else its limit, rounded up, at least 1);
* ``PET_NODE_RANK``: the pod's Job completion index (a downward-API fieldRef);
* ``PET_MASTER_ADDR``: the JobSet hostname of the first node pod,
  ``<trainjob>-<job>-0-0.<subdomain>`` (the JobSet is named like the TrainJob and its
  subdomain defaults to its name);
* ``PET_MASTER_PORT`` and the container port 29500, upstream's rendezvous port.

The user may not set those five variables on the trainer: ``validate`` refuses them, since
the policy would overwrite them (``trainer.env``) or be overwritten by them (podSpecOverrides
are applied after the policies). Other ``PET_*`` names are the user's.
"""

from __future__ import annotations

from typing import Any

from trainjob import constants as c
from trainjob.api import TrainJob
from trainjob.runtime.extension_points import Problems
from trainjob.runtime.node_resources import cpus_per_node, gpus_per_node, whole_number
from trainjob.runtime.plugin_registry import register
from trainjob.runtime.plugins import rendezvous, torchtune
from trainjob.runtime.pod_template import merge_env
from trainjob.runtime.podsets import RuntimeInfo, RuntimePolicy

MASTER_PORT = rendezvous.PORT
RESERVED_NAMES = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                  "PET_MASTER_PORT")
COMPLETION_INDEX_FIELD = rendezvous.COMPLETION_INDEX_FIELD
# numProcPerNode words torchrun understands (the runtime CRD allows the same set).
PROC_WORDS = ("auto", "cpu", "gpu")
pod_hostname = rendezvous.pod_hostname
_trainer_pod_sets = rendezvous.trainer_pod_sets
_ensure_port = rendezvous.ensure_port


def node_resources(info: RuntimeInfo, job: TrainJob, container: dict[str, Any]) -> dict:
    """A node's resources as upstream reads them: the TrainJob's resourcesPerNode when it has
    one, else the trainer container's."""
    trainer = job.spec.trainer
    if trainer is not None and trainer.resources_per_node is not None:
        return trainer.resources_per_node.dump()
    return container.get("resources") or {}


def num_proc_per_node(info: RuntimeInfo, job: TrainJob, container: dict[str, Any]) -> str:
    """``trainer.numProcPerNode``, else the runtime's (seed runtimes), else ``auto``; ``auto``
    on a node without GPUs becomes its CPU count, as upstream derives it."""
    trainer = job.spec.trainer
    value: int | str = "auto"
    torch = info.policy.ml_policy.torch
    if trainer is not None and trainer.num_proc_per_node is not None:
        value = trainer.num_proc_per_node
    elif torch is not None and torch.num_proc_per_node is not None:
        value = torch.num_proc_per_node
    if value != "auto":
        return str(value)
    resources = node_resources(info, job, container)
    if gpus_per_node(resources) > 0:
        return "auto"
    return str(max(1, cpus_per_node(resources)))


def _runtime_command(info: RuntimeInfo, job_name: str) -> list[str]:
    for job in info.runtime_jobs:
        if job.get("name") == job_name:
            spec = ((job.get("template") or {}).get("spec") or {}).get("template") or {}
            for container in (spec.get("spec") or {}).get("containers") or []:
                if container.get("name") == c.NODE:
                    return list(container.get("command") or [])
    return []


class TorchPlugin:
    name = "torch"

    def enabled(self, policy: RuntimePolicy) -> bool:
        return policy.framework == self.name

    def enforce_ml_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        pod_sets = _trainer_pod_sets(info)
        if not pod_sets:
            return
        master = [{"name": "PET_MASTER_ADDR", "value": pod_hostname(info, job, pod_sets[0].name)},
                  {"name": "PET_MASTER_PORT", "value": str(MASTER_PORT)}]
        for pod_set in pod_sets:
            container = pod_set.container(c.NODE)
            procs = num_proc_per_node(info, job, container)
            pet = [
                {"name": "PET_NNODES", "value": str(pod_set.count)},
                {"name": "PET_NPROC_PER_NODE", "value": procs},
                {"name": "PET_NODE_RANK",
                 "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}},
            ]
            merge_env(container, pet)
            if torchtune.applies(job):
                # torchtune's own rendezvous: the endpoint goes on its command line instead.
                container["command"] = torchtune.command(
                    info, job, pod_set.count, int(procs) if procs.isdigit() else None,
                    gpus_per_node(node_resources(info, job, container)),
                    _runtime_command(info, pod_set.name))
            else:
                merge_env(container, master)
            _ensure_port(container)
            self._inject(info, pet + master)

    @staticmethod
    def _inject(info: RuntimeInfo, env: list[dict[str, Any]]) -> None:
        """``torch.envInjection``: the same torchrun environment in the named containers of
        other jobs (sidecars, helpers) too."""
        injection = info.policy.ml_policy.torch.env_injection
        for target in injection.targets if injection is not None else []:
            pod_set = info.pod_set(target.job_name)
            for name in target.container_names:
                container = pod_set.container(name) if pod_set is not None else None
                if container is None:
                    raise ValueError(f"mlPolicy.torch.envInjection: job {target.job_name!r} has "
                                     f"no container {name!r}")
                merge_env(container, env)

    def validate(self, info: RuntimeInfo, job: TrainJob) -> Problems:
        problems: Problems = []
        trainer = job.spec.trainer
        if trainer is not None:
            # Upstream's rule: one refusal of spec.trainer.env naming every reserved variable.
            reserved = sorted({str(v.get("name")) for v in trainer.env} & set(RESERVED_NAMES))
            if reserved:
                problems.append(("spec.trainer.env", f"{', '.join(reserved)}: reserved, the "
                                 f"torch policy sets {', '.join(RESERVED_NAMES)}"))
            problems += _check_nproc(trainer.num_proc_per_node)
            if torchtune.applies(job):
                pod_sets = _trainer_pod_sets(info)
                nodes = max((p.count for p in pod_sets), default=1)
                # As upstream judges the recipe: numProcPerNode as given (None: auto) and the
                # GPUs of a node.
                procs = trainer.num_proc_per_node
                gpus = gpus_per_node(node_resources(info, job, pod_sets[0].container(c.NODE))) \
                    if pod_sets else 0
                problems += torchtune.validate(job, nodes, whole_number(procs), gpus)
        problems += _check_env_injection(info)
        trainer_jobs = {p.name for p in info.by_role(c.ROLE_TRAINER)}
        for i, override in enumerate(job.spec.pod_spec_overrides):
            if not trainer_jobs & {t.name for t in override.target_jobs}:
                continue
            # Only the node container gets the torchrun environment; a sidecar's PET_*
            # variables conflict with nothing.
            for j, container in enumerate(override.containers or []):
                if container.name != c.NODE:
                    continue
                for k, var in enumerate(container.env):
                    problems += _reserved(
                        f"spec.podSpecOverrides[{i}].containers[{j}].env[{k}].name", var)
        return problems



def _check_env_injection(info: RuntimeInfo) -> Problems:
    """Each envInjection target of the runtime names a job and container it has (upstream
    refuses the TrainJob, whose runtime it cannot apply)."""
    injection = info.policy.ml_policy.torch.env_injection
    problems: Problems = []
    for i, target in enumerate(injection.targets if injection is not None else []):
        pod_set = info.pod_set(target.job_name)
        for j, name in enumerate(target.container_names):
            if pod_set is None or pod_set.container(name) is None:
                problems.append(("spec.runtimeRef", f"the runtime's mlPolicy.torch.envInjection."
                                 f"targets[{i}].containerNames[{j}]: container {name!r} of job "
                                 f"{target.job_name!r} not found in its template"))
    return problems


def _reserved(path: str, var: dict[str, Any]) -> list[tuple[str, str]]:
    name = str(var.get("name", ""))
    if name in RESERVED_NAMES:
        return [(path, f"{name} is reserved: the torch policy sets it "
                       f"(torchrun's {', '.join(RESERVED_NAMES)})")]
    return []


def _check_nproc(value: int | str | None) -> list[tuple[str, str]]:
    path = "spec.trainer.numProcPerNode"
    if value is None:
        return []
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        if value not in PROC_WORDS:
            return [(path, f"{value!r} is not understood by torchrun: "
                           "use auto, cpu, gpu or a positive integer")]
        return []
    if int(value) < 1:
        return [(path, "must be a positive integer")]
    return []


register(TorchPlugin())
