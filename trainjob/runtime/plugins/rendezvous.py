"""Where a framework's processes find each other, shared by the ML policies: the first
trainer pod's DNS name, the port its coordinator listens on (upstream's 29500 for every
framework), and each pod's rank from its Job completion index."""

from __future__ import annotations

from typing import Any

from trainjob import constants as c
from trainjob.api import TrainJob
from trainjob.runtime.extension_points import FORBIDDEN, Problems
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


class TrainerEnvPolicy:
    """An ML policy that sets environment variables on the trainer: it takes part when the
    runtime sets ``mlPolicy.<name>``, and refuses its variables in ``trainer.env``."""

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
