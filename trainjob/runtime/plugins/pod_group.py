"""What gang-scheduling PodGroups share, whichever scheduler reads them: the TrainJob's pods
as one group of ``minMember`` pods needing ``minResources`` (Σ declared per-pod requests x
count, written as upstream writes them), named like the TrainJob, and a mark on every pod
template."""

from __future__ import annotations

from typing import Any

from trainjob.api import TrainJob
from trainjob.runtime.podsets import RuntimeInfo, RuntimePolicy, group_resources


class PodGroupPolicy:
    """A scheduler's gang policy: it takes part when the runtime sets
    ``podGroupPolicy.<name>``; ``settings`` are what it sets there."""

    name = ""

    def enabled(self, policy: RuntimePolicy) -> bool:
        return policy.pod_group_source == self.name

    def settings(self, info: RuntimeInfo) -> dict[str, Any]:
        return (info.policy.pod_group_policy or {}).get(self.name) or {}


def mark_pods(info: RuntimeInfo, key: str, value: str, where: str) -> None:
    """Set ``key: value`` in the ``where`` ("labels" or "annotations") of every pod template."""
    for pod_set in info.pod_sets:
        metadata = pod_set.job_spec.setdefault("template", {}).setdefault("metadata", {})
        metadata[where] = {**(metadata.get(where) or {}), key: value}


def group_spec(info: RuntimeInfo) -> dict[str, Any]:
    return {"minMember": info.totals.pods, "minResources": group_resources(info.pod_sets)}


def metadata(job: TrainJob) -> dict[str, Any]:
    return {"name": job.metadata.name, "namespace": job.metadata.namespace}
