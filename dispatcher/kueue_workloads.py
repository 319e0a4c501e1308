"""Reading Kueue's manager Workloads for the external-dispatcher mode (pure: no API calls).

A Workload waits for this dispatcher when Kueue has reserved quota for it
(``QuotaReserved=True``), its MultiKueue admission check is ``Pending``, and no worker is
assigned (``.status.clusterName``). Kueue creates the remote copy only on the workers named
in ``.status.nominatedClusterNames`` and clears that list once one of them admits.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from dispatcher.capacity import PODS, pod_requests
from dispatcher.placer import Need
from trainjob.conditions import parse_time

Obj = dict[str, Any]

# On the Workload: the workers nominated so far that did not admit it in time, in order.
TRIED_ANNOTATION = "trainjob-dispatcher.io/tried-clusters"
PENDING = "Pending"


@dataclass(frozen=True)
class Waiting:
    """A Workload waiting for a nomination, and what it holds now."""

    check: str  # the MultiKueue admission check's name
    nominated: tuple[str, ...]  # the current nomination (ours or an earlier one)


def _conditions(workload: Obj) -> dict[str, Obj]:
    return {x.get("type"): x for x in (workload.get("status") or {}).get("conditions") or []}


def finished(workload: Obj) -> bool:
    return (_conditions(workload).get("Finished") or {}).get("status") == "True"


def cluster_name(workload: Obj) -> str | None:
    return (workload.get("status") or {}).get("clusterName") or None


def waiting(workload: Obj, multikueue_checks: set[str]) -> Waiting | None:
    """The Workload's state when it waits for a worker to be nominated, else None."""
    status = workload.get("status") or {}
    if workload["metadata"].get("deletionTimestamp") or status.get("clusterName") or \
            finished(workload):
        return None
    if (_conditions(workload).get("QuotaReserved") or {}).get("status") != "True":
        return None
    if (_conditions(workload).get("Evicted") or {}).get("status") == "True":
        return None
    check = next((x for x in status.get("admissionChecks") or []
                  if x.get("name") in multikueue_checks), None)
    if check is None or check.get("state") != PENDING:
        return None
    return Waiting(check["name"], tuple(status.get("nominatedClusterNames") or ()))


def nominated_at(workload: Obj, field_manager: str) -> float | None:
    """When ``field_manager`` last wrote the Workload's status (its nomination), from the
    object's managed fields: the time survives a restart of the dispatcher."""
    times = [parse_time(entry.get("time"))
             for entry in workload["metadata"].get("managedFields") or []
             if entry.get("manager") == field_manager and entry.get("subresource") == "status"]
    times = [t for t in times if t]
    return max(times) if times else None


def tried(workload: Obj) -> list[str]:
    raw = (workload["metadata"].get("annotations") or {}).get(TRIED_ANNOTATION) or ""
    return [name for name in raw.split(",") if name]


def job_key(workload: Obj) -> tuple[str, str]:
    """The key capacity reservations use: the owning job's namespace and name (its JobSet
    and pods carry that name), else the Workload's own."""
    meta = workload["metadata"]
    owner = next((ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")),
                 None)
    return meta.get("namespace") or "", (owner or meta)["name"]


def podset_need(workload: Obj) -> Need | str:
    """What the Workload asks of a worker, from its podSets (Σ count × per-pod requests);
    a string says why it cannot be computed."""
    podsets = (workload.get("spec") or {}).get("podSets") or []
    if not podsets:
        return "the Workload has no spec.podSets"
    total: dict[str, Decimal] = {}
    pods = 0
    each_pod: list[dict[str, Decimal]] = []
    widest: tuple[int, int, Obj] | None = None
    for index, podset in enumerate(podsets):
        count = int(podset.get("count") or 0)
        spec = ((podset.get("template") or {}).get("spec")) or {}
        per_pod = pod_requests({"spec": spec})
        per_pod.pop(PODS, None)
        for resource, amount in per_pod.items():
            total[resource] = total.get(resource, Decimal(0)) + amount * count
        pods += count
        each_pod += [per_pod] * count
        # Nodes are filtered by the podSet with the most pods (the trainer's, in a
        # TrainJob), as placement filters by the trainer's selector and tolerations.
        if widest is None or (count, index) >= widest[:2]:
            widest = (count, index, spec)
    spec = widest[2] if widest else {}
    # The remote Workload keeps the namespace and spec.queueName: the worker's LocalQueue
    # of that name leads to the ClusterQueue whose quota it is admitted against.
    queue_name = (workload.get("spec") or {}).get("queueName")
    queue = (workload["metadata"].get("namespace") or "", queue_name) if queue_name else None
    return Need(total, pods, spec.get("nodeSelector"), spec.get("tolerations"), each_pod,
                queue)
