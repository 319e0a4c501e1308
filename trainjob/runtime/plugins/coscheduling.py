"""``podGroupPolicy.coscheduling``: a PodGroup of the scheduler-plugins coscheduling plugin
(``scheduling.x-k8s.io/v1alpha1``), and every pod labelled ``scheduling.x-k8s.io/pod-group:
<trainjob>`` so the scheduler places the job's pods all at once or not at all. The worker
needs the PodGroup CRD; without it the PodGroup cannot be written and the job does not
start, as upstream."""

from __future__ import annotations

from trainjob.api import TrainJob
from trainjob.runtime.extension_points import ExtraObject
from trainjob.runtime.plugin_registry import register
from trainjob.runtime.plugins import pod_group
from trainjob.runtime.podsets import RuntimeInfo

API_VERSION = "scheduling.x-k8s.io/v1alpha1"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
DEFAULT_TIMEOUT_SECONDS = 60


class CoschedulingPlugin(pod_group.PodGroupPolicy):
    name = "coscheduling"

    def enforce_pod_group_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        pod_group.mark_pods(info, POD_GROUP_LABEL, job.metadata.name, "labels")

    def build(self, info: RuntimeInfo, job: TrainJob) -> list[ExtraObject]:
        timeout = self.settings(info).get("scheduleTimeoutSeconds") or DEFAULT_TIMEOUT_SECONDS
        return [ExtraObject({
            "apiVersion": API_VERSION, "kind": "PodGroup", "metadata": pod_group.metadata(job),
            "spec": {**pod_group.group_spec(info), "scheduleTimeoutSeconds": timeout},
        }, "podgroups")]


register(CoschedulingPlugin())
