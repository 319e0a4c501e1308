"""Where a framework's processes find each other, shared by the ML policies: the first
trainer pod's DNS name, the port its coordinator listens on (upstream's 29500 for every
framework), and each pod's rank from its Job completion index."""

from __future__ import annotations

from typing import Any

from trainjob import constants as c
from trainjob.api import TrainJob
from trainjob.runtime.extension_points import FORBIDDEN, Problems
from trainjob.runtime.pod_template import merge_by_name
from trainjob.runtime.podsets import PodSet, RuntimeInfo, RuntimePolicy

PORT = 29500
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
RANK_FROM_INDEX = {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}


def subdomain(info: RuntimeInfo, job: TrainJob) -> str:
    """The JobSet's pod subdomain: ``network.subdomain`` of the template, else its name."""
    network = info.jobset_spec.get("network") or {}
    return network.get("subdomain") or job.metadata.name


def pod_hostname(info: RuntimeInfo, job: TrainJob, job_name: str, pod_index: int = 0) -> str:
    """DNS name of pod ``pod_index`` of the first Job of replicated job ``job_name``."""
    return f"{job.metadata.name}-{job_name}-0-{pod_index}.{subdomain(info, job)}"


def trainer_pod_sets(info: RuntimeInfo) -> list[PodSet]:
    """The trainer step's jobs that have a ``node`` container (where training runs)."""
    return [p for p in info.by_role(c.ROLE_TRAINER) if p.container(c.NODE) is not None]


def ensure_port(container: dict[str, Any]) -> None:
    ports = container.setdefault("ports", [])
    if not any(p.get("containerPort") == PORT for p in ports):
        ports.append({"containerPort": PORT})


def runtime_env_names(info: RuntimeInfo, job_name: str, container: str) -> set[str]:
    """The variables the runtime itself gives ``container`` of replicated job ``job_name``."""
    for job in info.runtime_jobs:
        if job.get("name") != job_name:
            continue
        spec = (((job.get("template") or {}).get("spec") or {}).get("template") or {})
        for entry in (spec.get("spec") or {}).get("containers") or []:
            if entry.get("name") == container:
                return {var.get("name") for var in entry.get("env") or []}
    return set()


def set_env_before_trainer_env(info: RuntimeInfo, job: TrainJob, pod_set: PodSet,
                               variables: list[dict[str, Any]]) -> None:
    """Set a policy's ``variables`` on the ``node`` container in the order upstream's JAX
    plug-in leaves them: its JobSet builder lays the TrainJob's env over the policy's, so a
    variable of the TrainJob's wins and those the runtime lacks come after the policy's.
    (Upstream's XGBoost keeps the TrainJob's first, as ``merge_env`` after it does.)"""
    container = pod_set.container(c.NODE)
    env = container.setdefault("env", [])
    given = job.spec.trainer.env if job.spec.trainer is not None else []
    own = runtime_env_names(info, pod_set.name, c.NODE)
    added = {var.get("name") for var in given} - own
    env[:] = [var for var in env if var.get("name") not in added]
    merge_by_name(env, variables)
    merge_by_name(env, given)


class TrainerEnvPolicy:
    """An ML policy that sets environment variables on the trainer: it takes part when the
    runtime sets ``mlPolicy.<name>``, and refuses its ``reserved_env`` in ``trainer.env``."""

    name = ""
    reserved_env: tuple[str, ...] = ()

    def enabled(self, policy: RuntimePolicy) -> bool:
        return policy.framework == self.name

    def validate(self, info: RuntimeInfo, job: TrainJob) -> Problems:
        # Upstream's rule (XGBoost): each reserved variable is Forbidden, at its entry.
        env = job.spec.trainer.env if job.spec.trainer is not None else []
        return [(f"spec.trainer.env[{i}]",
                 f"{var.get('name')} is reserved: the {self.name} policy sets it "
                 f"({', '.join(self.reserved_env)})", FORBIDDEN)
                for i, var in enumerate(env) if var.get("name") in self.reserved_env]
