"""``podGroupPolicy.volcano``: a Volcano PodGroup (``scheduling.volcano.sh/v1beta1``) and every
pod annotated ``scheduling.k8s.io/group-name: <trainjob>``. The job's annotation
``scheduling.volcano.sh/queue-name`` picks the queue, a pod template's priorityClassName the
group's priority, and the policy's networkTopology goes to the group as it is. The worker
needs Volcano's PodGroup CRD, as upstream."""

from __future__ import annotations

from trainjob.api import TrainJob
from trainjob.runtime.extension_points import ExtraObject, Problems
from trainjob.runtime.plugin_registry import register
from trainjob.runtime.plugins import pod_group
from trainjob.runtime.podsets import RuntimeInfo

API_VERSION = "scheduling.volcano.sh/v1beta1"
GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"


class VolcanoPlugin(pod_group.PodGroupPolicy):
    name = "volcano"

    def enforce_pod_group_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        pod_group.mark_pods(info, GROUP_NAME_ANNOTATION, job.metadata.name, "annotations")

    def build(self, info: RuntimeInfo, job: TrainJob) -> list[ExtraObject]:
        spec = pod_group.group_spec(info)
        if QUEUE_ANNOTATION in info.annotations:
            spec["queue"] = info.annotations[QUEUE_ANNOTATION]
        for pod_set in info.pod_sets:  # the last job that names one, as upstream
            if pod_set.pod_spec.get("priorityClassName"):
                spec["priorityClassName"] = pod_set.pod_spec["priorityClassName"]
        topology = self.settings(info).get("networkTopology")
        if topology:
            spec["networkTopology"] = topology
        return [ExtraObject({"apiVersion": API_VERSION, "kind": "PodGroup",
                             "metadata": pod_group.metadata(job), "spec": spec}, "podgroups")]

    def validate(self, info: RuntimeInfo, job: TrainJob) -> Problems:
        if info.annotations.get(QUEUE_ANNOTATION, None) == "":
            return [(f"spec.annotations[{QUEUE_ANNOTATION}]", "a Volcano queue name must not "
                                                               "be empty")]
        return []


register(VolcanoPlugin())
