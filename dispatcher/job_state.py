"""The state of a multicluster TrainJob as a person wants to see it, derived from the
manager object alone: shared by the status command, the dashboard and the metrics."""

from __future__ import annotations

import time
from typing import Any

from controller_kit.api_time import parse_time
from trainjob import constants as c
from trainjob.conditions import find


def age(timestamp: str | None) -> str:
    """How long ago, as kubectl shows it (3d, 5h, 12m, 40s); "-" when unknown."""
    created = parse_time(timestamp)
    if created is None:
        return "-"
    seconds = int(time.time() - created)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def condition(obj: dict, type_: str) -> dict:
    return find(obj, type_) or {}


def job_state(job: dict) -> str:
    """The state a person wants to see: finished, pending (with reason), or the newest
    condition that is true."""
    for wanted in c.FINISHED_CONDITIONS:
        if condition(job, wanted).get("status") == "True":
            return wanted
    if (job.get("spec") or {}).get("suspend"):
        return "Suspended"
    placed = condition(job, c.CONDITION_PLACED)
    if placed.get("status") == "False":
        return f"Pending ({placed.get('reason')})"
    reachable = condition(job, c.CONDITION_WORKER_REACHABLE)
    if reachable.get("status") == "False":
        # WorkerUnreachable, or WorkerRemoved: its worker left the registry and is drained
        return reachable.get("reason") or c.REASON_WORKER_UNREACHABLE
    jobs = (job.get("status") or {}).get("jobsStatus") or []
    if any(j.get("active") for j in jobs):
        return "Running"
    annotations = job["metadata"].get("annotations") or {}
    if not annotations.get(c.PLACEMENT_ANNOTATION):
        return "Waiting"
    # Only a status from the copy proves it exists (e.g. while a worker's webhook refuses
    # or times out every create, the job is placed but has no copy).
    from_worker = [x for x in (job.get("status") or {}).get("conditions") or []
                   if x.get("type") not in (c.CONDITION_PLACED, c.CONDITION_WORKER_REACHABLE)]
    return "Dispatched" if from_worker else "Placed (no copy reported yet)"


def kueue_job_state(job: dict, workload: dict) -> tuple[str, str]:
    """(state, worker) of a TrainJob Kueue's MultiKueue dispatches, from its Workload:
    the worker Kueue assigned, or the workers nominated for it (kueue mode's choice)."""
    status = workload.get("status") or {}
    worker = status.get("clusterName") or ""
    for wanted in c.FINISHED_CONDITIONS:
        if condition(job, wanted).get("status") == "True":
            return wanted, worker
    if worker:
        jobs = (job.get("status") or {}).get("jobsStatus") or []
        return ("Running" if any(j.get("active") for j in jobs) else "Admitted (Kueue)"), worker
    if nominated := status.get("nominatedClusterNames"):
        return "Nominated (Kueue)", ",".join(nominated)
    if condition(workload, "QuotaReserved").get("status") == "True":
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
            "age": age(meta.get("creationTimestamp"))}
