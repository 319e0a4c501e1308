"""A TrainJob's status as a function of the TrainJob, its JobSet and what happened.

``desired_status`` is pure: it returns the status the TrainJob should show and the
transitions (for Events). A condition keeps its lastTransitionTime until its status
changes, so recomputing from the same inputs yields the same status and no write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller_kit.api_time import format_time
from trainjob import constants as c
from trainjob.api import TrainJob
from trainjob.conditions import upsert

CONDITION_CREATED = "Created"
REASON_JOBSET_CREATED = "JobSetCreated"
REASON_RUNTIME_NOT_FOUND = "RuntimeNotFound"
REASON_BUILD_FAILED = "JobSetBuildFailed"


def now() -> str:
    return format_time()


@dataclass(frozen=True)
class Transition:
    """A condition that changed: type, new status, reason, message (for an Event)."""

    type: str
    status: str
    reason: str
    message: str


def set_condition(conditions: list[dict[str, Any]], type_: str, status: str, reason: str,
                  message: str, transitions: list[Transition]) -> None:
    """Set a condition in ``conditions`` (the shared upsert rule); record a Transition when
    its status, reason or message changes."""
    existing = next((x for x in conditions if x.get("type") == type_), None)
    if existing is not None and (existing.get("status"), existing.get("reason"),
                                 existing.get("message")) == (status, reason, message):
        return
    conditions[:] = upsert(conditions, {"type": type_, "status": status, "reason": reason,
                                        "message": message, "lastTransitionTime": now()})
    transitions.append(Transition(type_, status, reason, message))


def _jobset_condition(jobset: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for condition in (jobset.get("status") or {}).get("conditions") or []:
        if condition.get("type") == type_ and condition.get("status") == "True":
            return condition
    return None


def jobs_status(jobset: dict[str, Any]) -> list[dict[str, Any]]:
    fields = ("ready", "succeeded", "failed", "active", "suspended")
    return [
        {"name": item.get("name"), **{f: int(item.get(f) or 0) for f in fields}}
        for item in (jobset.get("status") or {}).get("replicatedJobsStatus") or []
    ]


def desired_status(job: TrainJob, jobset: dict[str, Any] | None,
                   created: Transition | None = None) -> tuple[dict[str, Any], list[Transition]]:
    """The status ``job`` should have given its JobSet. ``created`` is the Created
    condition to set this round (JobSet created, runtime missing, build failed)."""
    current = job.status.model_dump(by_alias=True, exclude_none=True)
    conditions = [dict(x) for x in current.get("conditions", [])]
    transitions: list[Transition] = []
    if created is not None:
        set_condition(conditions, created.type, created.status, created.reason,
                      created.message, transitions)
    suspended = next((x for x in conditions if x["type"] == c.CONDITION_SUSPENDED), None)
    if job.spec.suspend:
        set_condition(conditions, c.CONDITION_SUSPENDED, "True", c.REASON_SUSPENDED,
                      "TrainJob is suspended", transitions)
    elif suspended is not None and suspended.get("status") == "True":
        set_condition(conditions, c.CONDITION_SUSPENDED, "False", c.REASON_RESUMED,
                      "TrainJob is resumed", transitions)
    if jobset is not None:
        for source, target in ((c.JOBSET_COMPLETED, c.CONDITION_COMPLETE),
                               (c.JOBSET_FAILED, c.CONDITION_FAILED)):
            found = _jobset_condition(jobset, source)
            if found is not None:
                set_condition(conditions, target, "True", found.get("reason") or source,
                              found.get("message") or f"JobSet {source.lower()}", transitions)
    status: dict[str, Any] = {"conditions": conditions}
    if jobset is not None:
        jobs = jobs_status(jobset)
        # A JobSet that has reported no job yet leaves the field out, as upstream's does
        # (an empty list is omitted there); one that had jobs is cleared.
        if jobs or current.get("jobsStatus"):
            status["jobsStatus"] = jobs
    elif current.get("jobsStatus"):
        status["jobsStatus"] = current["jobsStatus"]
    return status, transitions


def same_status(current: dict[str, Any], desired: dict[str, Any]) -> bool:
    """Equal for our purposes: conditions compared without timestamps' formatting noise."""
    def norm(status: dict[str, Any]) -> tuple:
        conditions = sorted(
            (x.get("type"), x.get("status"), x.get("reason"), x.get("message"))
            for x in status.get("conditions") or []
        )
        jobs = sorted(tuple(sorted(j.items())) for j in status.get("jobsStatus") or [])
        return tuple(conditions), tuple(jobs)
    return norm(current) == norm(desired)
