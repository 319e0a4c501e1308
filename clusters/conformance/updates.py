"""The update half of a conformance case: a JSON merge patch sent to a TrainJob both sides
admitted (or to the runtime of a runtime-only case), whose admission answer is kept under
``label`` and compared like a create's.

Upstream's update rules need an object that exists (``self == oldSelf`` transition rules, the
runtime-patch rule's "suspended before or after", the JobSet's active replicated jobs), so a
create alone cannot show them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters.conformance.objects import UPDATE_WHEN_ACTIVE, UPDATE_WHEN_SUSPENDED, Case
from clusters.testing import eventually
from trainjob import constants as c

MERGE_PATCH = "application/merge-patch+json"
# Pods the scheduler cannot place keep a Job active; the JobSet controller reports it soon.
ACTIVE_TIMEOUT = 60


def label(case: Case) -> str:
    return f"update {case.name}"


def is_answer(label_: str) -> bool:
    """Whether a snapshot label holds an admission answer (a create's or an update's)."""
    return label_.startswith(("admission", "update "))


def apply_updates(custom: client.CustomObjectsApi, namespace: str, cases: list[Case],
                  admitted: Callable[[Case], bool],
                  refusal: Callable[[ApiException], dict[str, Any]]) -> dict[str, Any]:
    """Send each case's update (to jobs ``admitted`` on this side; a job that was refused
    has nothing to update) and return the answers by label. ``refusal`` reads a refused
    request's answer."""
    answers = {}
    for case in cases:
        if case.update is None:
            continue
        if case.job is None:
            answers[label(case)] = send_runtime(custom, namespace, case.runtimes[0],
                                                case.update, refusal)
            continue
        if not admitted(case):
            continue
        if case.update_when == UPDATE_WHEN_ACTIVE:
            wait_active(custom, namespace, case.name)
        elif case.update_when == UPDATE_WHEN_SUSPENDED:
            wait_suspended(custom, namespace, case.name)
        answers[label(case)] = send(custom, namespace, case.name, case.update, refusal)
    return answers


def send(custom: client.CustomObjectsApi, namespace: str, name: str, patch: dict,
         refusal: Callable[[ApiException], dict[str, Any]]) -> dict[str, Any]:
    return answer(lambda: custom.patch_namespaced_custom_object(
        c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS, name, patch,
        _content_type=MERGE_PATCH), refusal)


def send_runtime(custom: client.CustomObjectsApi, namespace: str, runtime: dict, patch: dict,
                 refusal: Callable[[ApiException], dict[str, Any]]) -> dict[str, Any]:
    name = runtime["metadata"]["name"]
    if runtime["kind"] == c.CLUSTERTRAININGRUNTIME_KIND:
        return answer(lambda: custom.patch_cluster_custom_object(
            c.TRAINER_GROUP, c.TRAINER_VERSION, c.CLUSTERTRAININGRUNTIMES, name, patch,
            _content_type=MERGE_PATCH), refusal)
    return answer(lambda: custom.patch_namespaced_custom_object(
        c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAININGRUNTIMES, name, patch,
        _content_type=MERGE_PATCH), refusal)


def answer(request: Callable[[], Any], refusal: Callable[[ApiException], dict[str, Any]],
           exists_ok: bool = False) -> dict[str, Any]:
    """The admission answer to ``request``: allowed, or the refusal as ``refusal`` reads it
    (``exists_ok``: a create that finds the object there already was allowed before)."""
    try:
        request()
    except ApiException as err:
        if exists_ok and err.status == 409:
            return {"allowed": True}
        if err.status in (400, 403, 422):
            return refusal(err)
        raise
    return {"allowed": True}


def reported_active(trainjob: dict | None) -> list[str]:
    """The replicated jobs the TrainJob's controller reports active in ``status.jobsStatus``
    (copied from the JobSet's status as that controller's cache holds it)."""
    status = (trainjob or {}).get("status") or {}
    return [entry.get("name") for entry in status.get("jobsStatus") or []
            if isinstance(entry, dict) and (entry.get("active") or 0) > 0]


def suspended(trainjob: dict | None) -> bool:
    """Whether the TrainJob's controller has reported it suspended."""
    conditions = ((trainjob or {}).get("status") or {}).get("conditions") or []
    return any(isinstance(x, dict) and x.get("type") == c.CONDITION_SUSPENDED
               and x.get("status") == "True" for x in conditions)


def read_or_none(read, *args) -> dict | None:
    """``read(*args)``, or None when the object does not exist."""
    try:
        return read(*args)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def wait_active(custom: client.CustomObjectsApi, namespace: str, name: str) -> None:
    """Until the TrainJob ``name`` reports an active replicated job. Both webhooks read the
    JobSet from their controller's cache, which can trail the API by a moment; the
    controller's copy of the JobSet's status shows that its cache has seen the job active."""
    eventually(lambda: read_or_none(custom.get_namespaced_custom_object, c.TRAINER_GROUP,
                                    c.TRAINER_VERSION, namespace, c.TRAINJOBS, name),
               lambda trainjob: bool(reported_active(trainjob)), timeout=ACTIVE_TIMEOUT,
               interval=0.5, expected=f"TrainJob {namespace}/{name} with status.jobsStatus "
                                      "reporting an active replicated job")


def wait_suspended(custom: client.CustomObjectsApi, namespace: str, name: str) -> None:
    """Until the TrainJob ``name`` is reported suspended and its JobSet exists."""
    eventually(lambda: (read_or_none(custom.get_namespaced_custom_object, c.TRAINER_GROUP,
                              c.TRAINER_VERSION, namespace, c.TRAINJOBS, name),
                        read_or_none(custom.get_namespaced_custom_object, c.JOBSET_GROUP,
                              c.JOBSET_VERSION, namespace, c.JOBSETS, name)),
               lambda seen: suspended(seen[0]) and seen[1] is not None,
               timeout=ACTIVE_TIMEOUT, interval=0.5,
               expected=f"TrainJob {namespace}/{name} suspended, with its JobSet")
