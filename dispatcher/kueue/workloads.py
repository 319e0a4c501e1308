"""Reading Kueue's manager Workloads for the external-dispatcher mode (pure: no API calls).

A Workload waits for this dispatcher when Kueue has reserved quota for it
(``QuotaReserved=True``), its MultiKueue admission check is ``Pending``, and no worker is
assigned (``.status.clusterName``). Kueue creates the remote copy only on the workers named
in ``.status.nominatedClusterNames`` and clears that list once one of them admits.

What a job needs is read from its Workload's podSets only, never from the job itself, so
every kind Kueue makes Workloads for (batch Jobs, JobSets, TrainJobs, ...) is sized alike.
A Workload whose podSets cannot be sized (``podset_need`` says why) is not guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from controller_kit.api_time import parse_time
from dispatcher.placement.need import Need
from dispatcher.room.capacity import PODS, pod_requests

Obj = dict[str, Any]

# On the Workload: the workers nominated so far that did not admit it in time, in order.
TRIED_ANNOTATION = "trainjob-dispatcher.io/tried-clusters"
PENDING = "Pending"
# On a Workload this dispatcher could not size: condition False, with why and what it did.
SIZED_CONDITION = "trainjob-dispatcher.io/Sized"
UNSIZABLE_REASON = "Unsizable"
# Kueue's limit on .status.nominatedClusterNames.
MAX_NOMINATED = 20


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


def nominated(workload: Obj) -> tuple[str, ...]:
    """The workers nominated for the Workload (``.status.nominatedClusterNames``)."""
    return tuple((workload.get("status") or {}).get("nominatedClusterNames") or ())


def past_nomination(workload: Obj) -> bool:
    """Whether no worker will be nominated for the Workload any more: it is being
    deleted, a worker admitted it (``clusterName``), or it finished."""
    return bool(workload["metadata"].get("deletionTimestamp") or cluster_name(workload)
                or finished(workload))


def waiting(workload: Obj, multikueue_checks: set[str]) -> Waiting | None:
    """The Workload's state when it waits for a worker to be nominated, else None."""
    status = workload.get("status") or {}
    if past_nomination(workload):
        return None
    if (_conditions(workload).get("QuotaReserved") or {}).get("status") != "True":
        return None
    if (_conditions(workload).get("Evicted") or {}).get("status") == "True":
        return None
    check = next((x for x in status.get("admissionChecks") or []
                  if x.get("name") in multikueue_checks), None)
    if check is None or check.get("state") != PENDING:
        return None
    return Waiting(check["name"], nominated(workload))


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


def partially_admissible(workload: Obj) -> bool:
    """Whether Kueue may admit the Workload with fewer pods than ``count`` (a podSet with
    ``minCount`` below its ``count``: Kueue's partial admission, e.g. a batch Job's
    ``kueue.x-k8s.io/job-min-parallelism`` annotation)."""
    return any(podset.get("minCount") is not None
               and int(podset["minCount"]) < int(podset.get("count") or 0)
               for podset in (workload.get("spec") or {}).get("podSets") or [])


def podset_need(workload: Obj, at_min_count: bool = False) -> Need | str:
    """What the Workload asks of a worker, from its podSets: Σ count × per-pod requests,
    or with ``at_min_count`` Σ minCount × per-pod requests for the podSets that have one
    (the least Kueue's partial admission runs). A string says why it cannot be sized."""
    podsets = (workload.get("spec") or {}).get("podSets") or []
    if not podsets:
        return "the Workload has no spec.podSets"
    total: dict[str, Decimal] = {}
    pods = 0
    each_pod: list[dict[str, Decimal]] = []
    widest: tuple[int, int, Obj] | None = None
    for index, podset in enumerate(podsets):
        where = f"spec.podSets[{index}] ({podset.get('name', '?')})"
        count = int(podset.get("count") or 0)
        if at_min_count and podset.get("minCount") is not None:
            count = min(count, int(podset["minCount"]))
        spec = ((podset.get("template") or {}).get("spec")) or {}
        unread = _unread_requests(spec)
        if unread:
            return f"{where}: {unread}"
        try:
            per_pod = pod_requests({"spec": spec})
        except ValueError as err:
            # The message is worded for a runtime's replicated job (an empty name here).
            return f"{where}: {str(err).removeprefix('replicatedJobs[] ')}"
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


def _unread_requests(spec: Obj) -> str | None:
    """Why a pod template asks for what this dispatcher does not count, or None."""
    claims = [claim.get("name", "?") for claim in spec.get("resourceClaims") or []]
    if claims:
        # Devices through Dynamic Resource Allocation (Kueue counts them only with its DRA
        # integration): what a claim asks for is in objects this dispatcher does not read.
        return (f"template.spec.resourceClaims ({', '.join(claims)}) asks for devices through "
                "Dynamic Resource Allocation, which this dispatcher does not count")
    pod_level = spec.get("resources") or {}
    if pod_level.get("requests") or pod_level.get("limits"):
        # Kubernetes 1.34 (PodLevelResources) and Kueue count these; the Node room this
        # dispatcher reads counts container requests only: a size from the containers
        # alone would be too small, and no size is better than a wrong one.
        named = sorted({*(pod_level.get("requests") or {}), *(pod_level.get("limits") or {})})
        return (f"template.spec.resources ({', '.join(named)}) sets pod-level resources, "
                "which this dispatcher does not read (it counts container requests only)")
    return None


def sized_condition(workload: Obj) -> Obj | None:
    """This dispatcher's ``SIZED_CONDITION`` on the Workload, if any."""
    return next((x for x in (workload.get("status") or {}).get("conditions") or []
                 if x.get("type") == SIZED_CONDITION), None)
