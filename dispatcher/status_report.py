"""``python -m dispatcher status``: clusters and multicluster TrainJobs as the manager's
objects describe them, like ``kubectl get``. Reads the API directly, so it works whether
or not a dispatcher is running."""

from __future__ import annotations

import datetime
import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from trainjob import constants as c


def _age(timestamp: str | None) -> str:
    if not timestamp:
        return "-"
    created = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc)
    seconds = int((datetime.datetime.now(datetime.timezone.utc) - created).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _condition(obj: dict, type_: str) -> dict:
    return next((x for x in (obj.get("status") or {}).get("conditions") or []
                 if x.get("type") == type_), {})


def job_state(job: dict) -> str:
    """The state a person wants to see: finished, pending (with reason), or the newest
    condition that is true."""
    for wanted in (c.CONDITION_COMPLETE, c.CONDITION_FAILED):
        if _condition(job, wanted).get("status") == "True":
            return wanted
    if (job.get("spec") or {}).get("suspend"):
        return "Suspended"
    placed = _condition(job, "Placed")
    if placed.get("status") == "False":
        return f"Pending ({placed.get('reason')})"
    reachable = _condition(job, "WorkerReachable")
    if reachable.get("status") == "False":
        # WorkerUnreachable, or WorkerRemoved: its worker left the registry and is drained
        return reachable.get("reason") or "WorkerUnreachable"
    jobs = (job.get("status") or {}).get("jobsStatus") or []
    if any(j.get("active") for j in jobs):
        return "Running"
    annotations = job["metadata"].get("annotations") or {}
    if not annotations.get(c.PLACEMENT_ANNOTATION):
        return "Waiting"
    # Only a status from the copy proves it exists (e.g. while a worker's webhook refuses
    # or times out every create, the job is placed but has no copy).
    from_worker = [x for x in (job.get("status") or {}).get("conditions") or []
                   if x.get("type") not in ("Placed", "WorkerReachable")]
    return "Dispatched" if from_worker else "Placed (no copy reported yet)"


def kueue_job_state(job: dict, workload: dict) -> tuple[str, str]:
    """(state, worker) of a TrainJob Kueue's MultiKueue dispatches, from its Workload:
    the worker Kueue assigned, or the workers nominated for it (kueue mode's choice)."""
    status = workload.get("status") or {}
    worker = status.get("clusterName") or ""
    for wanted in (c.CONDITION_COMPLETE, c.CONDITION_FAILED):
        if _condition(job, wanted).get("status") == "True":
            return wanted, worker
    if worker:
        jobs = (job.get("status") or {}).get("jobsStatus") or []
        return ("Running" if any(j.get("active") for j in jobs) else "Admitted (Kueue)"), worker
    if nominated := status.get("nominatedClusterNames"):
        return "Nominated (Kueue)", ",".join(nominated)
    if _condition(workload, "QuotaReserved").get("status") == "True":
        return "QuotaReserved (Kueue)", ""
    return "Queued (Kueue)", ""


def workloads_by_job(workloads: list[dict]) -> dict[tuple[str, str], dict]:
    """Kueue's Workloads by the TrainJob that owns each."""
    return {(w["metadata"].get("namespace", ""), ref["name"]): w for w in workloads
            for ref in w["metadata"].get("ownerReferences") or []
            if ref.get("kind") == c.TRAINJOB_KIND and ref.get("controller")}


def job_summary(job: dict, workload: dict | None = None) -> dict[str, Any]:
    """One multicluster TrainJob as the status command and the dashboard show it;
    ``workload``: Kueue's, when Kueue dispatches it."""
    meta = job["metadata"]
    if workload is not None:
        state, worker = kueue_job_state(job, workload)
    else:
        state = job_state(job)
        worker = (meta.get("annotations") or {}).get(c.PLACEMENT_ANNOTATION, "")
    return {"namespace": meta["namespace"], "name": meta["name"],
            "state": state, "worker": worker,
            "jobsStatus": (job.get("status") or {}).get("jobsStatus") or [],
            "age": _age(meta.get("creationTimestamp"))}


def collect(api: client.ApiClient) -> dict[str, Any]:
    custom = client.CustomObjectsApi(api)
    clusters = []
    for obj in custom.list_cluster_custom_object(c.KUEUE_GROUP, c.KUEUE_VERSION,
                                                 c.MULTIKUEUECLUSTERS)["items"]:
        active = _condition(obj, "Active")
        clusters.append({"name": obj["metadata"]["name"],
                         "active": active.get("status", "Unknown"),
                         "reason": active.get("reason", ""),
                         "message": active.get("message", ""),
                         "age": _age(obj["metadata"].get("creationTimestamp"))})
    try:
        workloads = workloads_by_job(custom.list_cluster_custom_object(
            c.KUEUE_GROUP, c.KUEUE_VERSION, "workloads")["items"])
    except ApiException as err:
        if err.status != 404:
            raise
        workloads = {}  # no Kueue on this manager
    jobs = [job_summary(obj, workloads.get((obj["metadata"]["namespace"],
                                            obj["metadata"]["name"])))
            for obj in custom.list_cluster_custom_object(
                c.TRAINER_GROUP, c.TRAINER_VERSION, c.TRAINJOBS)["items"]
            if (obj.get("spec") or {}).get("managedBy") == c.MANAGED_BY_MULTIKUEUE]
    return {"clusters": clusters, "trainJobs": jobs}


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in rows)


def render(report: dict[str, Any], output: str) -> str:
    if output == "json":
        return json.dumps(report, indent=2)
    clusters = [("CLUSTER", "ACTIVE", "REASON", "AGE")] + [
        (x["name"], x["active"], x["reason"], x["age"]) for x in report["clusters"]]
    jobs = [("NAMESPACE", "TRAINJOB", "WORKER", "STATE", "ACTIVE/SUCCEEDED", "AGE")] + [
        (x["namespace"], x["name"], x["worker"] or "-", x["state"],
         f"{sum(j.get('active', 0) for j in x['jobsStatus'])}/"
         f"{sum(j.get('succeeded', 0) for j in x['jobsStatus'])}", x["age"])
        for x in sorted(report["trainJobs"], key=lambda j: (j["namespace"], j["name"]))]
    parts = [_table(clusters) if report["clusters"] else "no MultiKueueCluster",
             _table(jobs) if report["trainJobs"] else "no multicluster TrainJob"]
    return "\n\n".join(parts)
