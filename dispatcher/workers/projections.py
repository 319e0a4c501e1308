"""What the dispatcher keeps of a worker's Nodes and Pods: the fields placement reads, cut
from each object as it arrives (``Informer``'s ``transform``).

A large worker has tens of thousands of Pods. Kept whole, a Pod costs about 12 KB of
memory (its volumes, status, conditions...); placement reads its Node, its requests, its
phase and the labels that name its job, a tenth of that. Nodes keep their allocatable, the
labels and taints a job's rules match, and whether they are Ready and schedulable.
Warning Events keep what their mirror onto the manager reads (``event``).

Anything that reads these caches reads only the fields kept here: adding a reader of
another field means keeping that field too.
"""

from __future__ import annotations

from typing import Any

from dispatcher.room.capacity import BATCH_JOB_NAME_LABEL
from trainjob import constants as c

# The labels that name the job a Pod belongs to (``capacity._pod_use``).
POD_LABELS = (c.JOBSET_NAME_LABEL, BATCH_JOB_NAME_LABEL)
_CONTAINER_FIELDS = ("resources", "restartPolicy")


def _metadata(meta: dict[str, Any], labels: tuple[str, ...] | None) -> dict[str, Any]:
    """Name, namespace, resourceVersion and the ``labels`` asked for (None: all)."""
    kept = {key: meta[key] for key in ("name", "namespace", "resourceVersion") if key in meta}
    found = meta.get("labels") or {}
    kept["labels"] = dict(found) if labels is None else {
        key: found[key] for key in labels if key in found}
    return kept


def _containers(containers: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [{key: container[key] for key in _CONTAINER_FIELDS if key in container}
            for container in containers or []]


def pod(obj: dict[str, Any]) -> dict[str, Any]:
    """A Pod as placement reads it: where it is bound, what it requests (containers, init
    containers and their restart policy, overhead), its phase and its job's labels."""
    spec = obj.get("spec") or {}
    kept: dict[str, Any] = {"containers": _containers(spec.get("containers")),
                            "initContainers": _containers(spec.get("initContainers"))}
    for key in ("nodeName", "overhead"):
        if spec.get(key):
            kept[key] = spec[key]
    phase = (obj.get("status") or {}).get("phase")
    return {"metadata": _metadata(obj.get("metadata") or {}, POD_LABELS), "spec": kept,
            "status": {"phase": phase} if phase else {}}


def node(obj: dict[str, Any]) -> dict[str, Any]:
    """A Node as placement reads it: its labels and taints (a job's nodeSelector and
    tolerations), whether it is cordoned, its allocatable and its Ready condition."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ready = [{"type": "Ready", "status": cond.get("status")}
             for cond in status.get("conditions") or [] if cond.get("type") == "Ready"]
    kept_spec = {key: spec[key] for key in ("taints", "unschedulable") if spec.get(key)}
    return {"metadata": _metadata(obj.get("metadata") or {}, None), "spec": kept_spec,
            "status": {"allocatable": dict(status.get("allocatable") or {}),
                       "conditions": ready}}


# What the worker-event mirror reads of a Warning Event (``standalone/worker_events.py``):
# what it is about, why, how often and when. An Event's source, related object and
# managedFields are most of its size.
_EVENT_FIELDS = ("reason", "message", "count", "firstTimestamp", "lastTimestamp", "eventTime",
                 "type")


def event(obj: dict[str, Any]) -> dict[str, Any]:
    """A Warning Event as its mirror onto the manager reads it."""
    meta = obj.get("metadata") or {}
    involved = obj.get("involvedObject") or {}
    kept = {key: obj[key] for key in _EVENT_FIELDS if obj.get(key) is not None}
    kept["metadata"] = {key: meta[key] for key in (
        "name", "namespace", "resourceVersion", "creationTimestamp") if key in meta}
    kept["involvedObject"] = {key: involved[key] for key in (
        "kind", "name", "namespace", "uid") if key in involved}
    series = obj.get("series") or {}
    if series:
        kept["series"] = {key: series[key] for key in ("count", "lastObservedTime")
                          if key in series}
    return kept
