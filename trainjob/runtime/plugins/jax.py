"""The jax policy: ``jax.distributed.initialize()`` reads its process count, this process's
id and the coordinator's address from the environment, set on the trainer's ``node``
container as upstream does: ``JAX_NUM_PROCESSES`` (the node count), ``JAX_PROCESS_ID`` (the
completion index) and ``JAX_COORDINATOR_ADDRESS`` (the first node pod, port 29500)."""

from __future__ import annotations

from trainjob import constants as c
from trainjob.api import TrainJob
from trainjob.runtime.plugins import register, rendezvous
from trainjob.runtime.pod_template import merge_env
from trainjob.runtime.podsets import RuntimeInfo

RESERVED_ENV = ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_COORDINATOR_ADDRESS")


class JAXPlugin(rendezvous.TrainerEnvPolicy):
    name = "jax"
    reserved_env = RESERVED_ENV

    def enforce_ml_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        if job.spec.trainer is None:
            return  # upstream sets the environment only for a job that has trainer settings
        for pod_set in rendezvous.trainer_pod_sets(info)[:1]:
            container = pod_set.container(c.NODE)
            coordinator = rendezvous.pod_hostname(info, job, pod_set.name)
            merge_env(container, [
                {"name": "JAX_NUM_PROCESSES", "value": str(pod_set.count)},
                {"name": "JAX_PROCESS_ID", "valueFrom": rendezvous.RANK_FROM_INDEX},
                {"name": "JAX_COORDINATOR_ADDRESS",
                 "value": f"{coordinator}:{rendezvous.PORT}"},
            ])
            rendezvous.ensure_port(container)


register(JAXPlugin())
