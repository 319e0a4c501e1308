"""The torch policy: torchrun's environment and rendezvous port on every trainer pod.

torchrun reads its options from ``PET_*`` environment variables (``PET_NNODES`` is
``--nnodes`` and so on), so the trainer's command can stay a plain ``torchrun train.py``.
On the ``node`` container of every PodSet whose role is ``trainer``:

* ``PET_NNODES``: that PodSet's pod count;
* ``PET_NPROC_PER_NODE``: the TrainJob's ``trainer.numProcPerNode``, else the runtime's
  ``mlPolicy.torch.numProcPerNode``, else ``auto`` (torchrun understands auto/cpu/gpu/int);
* ``PET_NODE_RANK``: the pod's Job completion index (a downward-API fieldRef);
* ``PET_MASTER_ADDR``: the JobSet hostname of the first node pod,
  ``<trainjob>-<job>-0-0.<subdomain>`` (the JobSet is named like the TrainJob and its
  subdomain defaults to its name);
* ``PET_MASTER_PORT`` and a container port ``torchrun`` (29400/TCP).

The user may not set ``PET_*`` variables on the trainer: ``validate`` refuses them, since the
policy would overwrite them (``trainer.env``) or be overwritten by them (podSpecOverrides are
applied after the policies).
"""

from __future__ import annotations

from typing import Any

from trainjob import constants as c
from trainjob.api import TrainJob
from trainjob.runtime.framework import merge_by_name, merge_env
from trainjob.runtime.plugins import register
from trainjob.runtime.podsets import PodSet, RuntimeInfo, RuntimePolicy

RESERVED_PREFIX = "PET_"
MASTER_PORT = 29400
PORT_NAME = "torchrun"
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
# numProcPerNode words torchrun understands (the runtime CRD allows the same set).
PROC_WORDS = ("auto", "cpu", "gpu")


def subdomain(info: RuntimeInfo, job: TrainJob) -> str:
    """The JobSet's pod subdomain: ``network.subdomain`` of the template, else its name."""
    network = info.jobset_spec.get("network") or {}
    return network.get("subdomain") or job.metadata.name


def pod_hostname(info: RuntimeInfo, job: TrainJob, job_name: str, pod_index: int = 0) -> str:
    """DNS name of pod ``pod_index`` of the first Job of replicated job ``job_name``."""
    return f"{job.metadata.name}-{job_name}-0-{pod_index}.{subdomain(info, job)}"


def num_proc_per_node(info: RuntimeInfo, job: TrainJob) -> str:
    trainer = job.spec.trainer
    if trainer is not None and trainer.num_proc_per_node is not None:
        return str(trainer.num_proc_per_node)
    torch = info.policy.ml_policy.torch
    if torch is not None and torch.num_proc_per_node is not None:
        return str(torch.num_proc_per_node)
    return "auto"


def _trainer_pod_sets(info: RuntimeInfo) -> list[PodSet]:
    return [p for p in info.by_role(c.ROLE_TRAINER) if p.container(c.NODE) is not None]


def _ensure_port(container: dict[str, Any]) -> None:
    ports = container.setdefault("ports", [])
    taken = any(p.get("containerPort") == MASTER_PORT and p.get("protocol", "TCP") == "TCP"
                and p.get("name") != PORT_NAME for p in ports)
    if not taken:  # never declare 29400/TCP twice under two names
        merge_by_name(ports, [{"name": PORT_NAME, "containerPort": MASTER_PORT,
                               "protocol": "TCP"}])


class TorchPlugin:
    name = "torch"

    def enabled(self, policy: RuntimePolicy) -> bool:
        return policy.framework == "torch"

    def apply(self, info: RuntimeInfo, job: TrainJob) -> None:
        pod_sets = _trainer_pod_sets(info)
        if not pod_sets:
            return
        master = pod_hostname(info, job, pod_sets[0].name)
        nproc = num_proc_per_node(info, job)
        for pod_set in pod_sets:
            container = pod_set.container(c.NODE)
            merge_env(container, [
                {"name": "PET_NNODES", "value": str(pod_set.count)},
                {"name": "PET_NPROC_PER_NODE", "value": nproc},
                {"name": "PET_NODE_RANK",
                 "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}},
                {"name": "PET_MASTER_ADDR", "value": master},
                {"name": "PET_MASTER_PORT", "value": str(MASTER_PORT)},
            ])
            _ensure_port(container)

    def validate(self, info: RuntimeInfo, job: TrainJob) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        trainer = job.spec.trainer
        if trainer is not None:
            for i, var in enumerate(trainer.env):
                problems += _reserved(f"spec.trainer.env[{i}].name", var)
            problems += _check_nproc(trainer.num_proc_per_node)
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


def _reserved(path: str, var: dict[str, Any]) -> list[tuple[str, str]]:
    name = str(var.get("name", ""))
    if name.startswith(RESERVED_PREFIX):
        return [(path, f"{name} is reserved: the torch policy sets it "
                       f"(torchrun's {RESERVED_PREFIX}* environment)")]
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
