"""The jax policy: ``jax.distributed.initialize()`` reads its process count, this process's
id and the coordinator's address from the environment, set on the trainer's ``node``
container as upstream does: ``JAX_NUM_PROCESSES`` (the node count), ``JAX_PROCESS_ID`` (the
completion index) and ``JAX_COORDINATOR_ADDRESS`` (the first node pod, port 29500).

Upstream's plug-in refuses none of them in ``trainer.env``: the TrainJob's value wins (its
JobSet builder lays the TrainJob's env over the policy's), and so it does here."""

from __future__ import annotations

from trainjob import constants as c
from trainjob.api import TrainJob
from trainjob.runtime.plugin_registry import register
from trainjob.runtime.plugins import rendezvous
from trainjob.runtime.podsets import RuntimeInfo


class JAXPlugin(rendezvous.TrainerEnvPolicy):
    name = "jax"
    reserved_env = ()  # upstream's JAX plug-in validates nothing

    def enforce_ml_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        if job.spec.trainer is None:
            return  # upstream sets the environment only for a job that has trainer settings
        for pod_set in rendezvous.trainer_pod_sets(info)[:1]:
            container = pod_set.container(c.NODE)
            coordinator = rendezvous.pod_hostname(info, job, pod_set.name)
            rendezvous.set_env_before_trainer_env(info, job, pod_set, [
                {"name": "JAX_NUM_PROCESSES", "value": str(pod_set.count)},
                {"name": "JAX_PROCESS_ID", "valueFrom": rendezvous.RANK_FROM_INDEX},
                {"name": "JAX_COORDINATOR_ADDRESS",
                 "value": f"{coordinator}:{rendezvous.PORT}"},
            ])
            rendezvous.ensure_port(container)


register(JAXPlugin())
