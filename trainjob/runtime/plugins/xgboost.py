"""The xgboost policy: XGBoost's collective (Rabit) finds its tracker and its rank in the
environment, set on the trainer's ``node`` container as upstream does: ``DMLC_TRACKER_URI``
(the first node pod), ``DMLC_TRACKER_PORT`` (29500), ``DMLC_TASK_ID`` (the completion index)
and ``DMLC_NUM_WORKER`` (nodes x workers per node: a node's GPUs, else 1)."""

from __future__ import annotations

from trainjob import constants as c
from trainjob.api import TrainJob
from trainjob.runtime.node_resources import gpus_per_node
from trainjob.runtime.plugin_registry import register
from trainjob.runtime.plugins import rendezvous
from trainjob.runtime.pod_template import merge_env
from trainjob.runtime.podsets import RuntimeInfo

RESERVED_ENV = ("DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID", "DMLC_NUM_WORKER")


class XGBoostPlugin(rendezvous.TrainerEnvPolicy):
    name = "xgboost"
    reserved_env = RESERVED_ENV

    def enforce_ml_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        trainer = job.spec.trainer
        if trainer is None:
            return  # upstream sets the environment only for a job that has trainer settings
        for pod_set in rendezvous.trainer_pod_sets(info)[:1]:
            container = pod_set.container(c.NODE)
            resources = (trainer.resources_per_node.dump() if trainer.resources_per_node
                         else container.get("resources") or {})
            workers = pod_set.count * max(1, gpus_per_node(resources))
            merge_env(container, [
                {"name": "DMLC_TRACKER_URI",
                 "value": rendezvous.pod_hostname(info, job, pod_set.name)},
                {"name": "DMLC_TRACKER_PORT", "value": str(rendezvous.PORT)},
                {"name": "DMLC_TASK_ID", "valueFrom": rendezvous.RANK_FROM_INDEX},
                {"name": "DMLC_NUM_WORKER", "value": str(workers)},
            ])
            rendezvous.ensure_port(container)


register(XGBoostPlugin())
