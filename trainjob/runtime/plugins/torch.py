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

from decimal import ROUND_CEILING
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from trainjob import constants as c
from trainjob.api import TrainJob
from trainjob.runtime.framework import merge_env
from trainjob.runtime.plugins import register
from trainjob.runtime.podsets import PodSet, RuntimeInfo, RuntimePolicy

MASTER_PORT = 29500
RESERVED_NAMES = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                  "PET_MASTER_PORT")
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


def num_proc_per_node(info: RuntimeInfo, job: TrainJob, container: dict[str, Any]) -> str:
    trainer = job.spec.trainer
    value: int | str = "auto"
    torch = info.policy.ml_policy.torch
    if trainer is not None and trainer.num_proc_per_node is not None:
        value = trainer.num_proc_per_node
    elif torch is not None and torch.num_proc_per_node is not None:
        value = torch.num_proc_per_node
    if value != "auto":
        return str(value)
    # Upstream reads the TrainJob's resourcesPerNode when it has one, else the runtime's;
    # the container already holds the two merged, which agrees wherever it matters.
    resources = container.get("resources") or {}
    if trainer is not None and trainer.resources_per_node is not None:
        resources = trainer.resources_per_node.dump()
    if gpus_per_node(resources) > 0:
        return "auto"
    return str(max(1, cpus_per_node(resources)))


def gpus_per_node(resources: dict[str, Any]) -> int:
    """GPUs of one node: the first resource whose name contains "gpu", from the requests,
    else from the limits (upstream's reading)."""
    def first_gpu(amounts: dict[str, Any] | None) -> int:
        for name, amount in (amounts or {}).items():
            if "gpu" in name.lower():
                return _whole(amount)
        return 0
    return first_gpu(resources.get("requests")) or first_gpu(resources.get("limits"))


def cpus_per_node(resources: dict[str, Any]) -> int:
    """CPUs of one node, rounded up: the cpu request, else the cpu limit, else 0."""
    request = (resources.get("requests") or {}).get("cpu")
    if request is not None and parse_quantity(request) != 0:
        return _whole(request)
    limit = (resources.get("limits") or {}).get("cpu")
    return _whole(limit) if limit is not None else 0


def _whole(amount: Any) -> int:
    return int(parse_quantity(amount).to_integral_value(rounding=ROUND_CEILING))


def _trainer_pod_sets(info: RuntimeInfo) -> list[PodSet]:
    return [p for p in info.by_role(c.ROLE_TRAINER) if p.container(c.NODE) is not None]


def _ensure_port(container: dict[str, Any]) -> None:
    ports = container.setdefault("ports", [])
    if not any(p.get("containerPort") == MASTER_PORT for p in ports):
        ports.append({"containerPort": MASTER_PORT})


class TorchPlugin:
    name = "torch"

    def enabled(self, policy: RuntimePolicy) -> bool:
        return policy.framework == "torch"

    def apply(self, info: RuntimeInfo, job: TrainJob) -> None:
        pod_sets = _trainer_pod_sets(info)
        if not pod_sets:
            return
        master = pod_hostname(info, job, pod_sets[0].name)
        for pod_set in pod_sets:
            container = pod_set.container(c.NODE)
            merge_env(container, [
                {"name": "PET_NNODES", "value": str(pod_set.count)},
                {"name": "PET_NPROC_PER_NODE",
                 "value": num_proc_per_node(info, job, container)},
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
