"""What the remote view serves, built from a worker's objects: a ``TrainJobPod`` per Pod
of a job's copy, a ``TrainJobEvent`` per Event about the copy or its children, lists of
them, the Table kubectl prints, and the ``Status`` of a refusal. Pure."""

from __future__ import annotations

from collections.abc import Iterable

from dispatcher.remote_view import GROUP, GROUP_VERSION, TRAINJOB_LABEL, WORKER_LABEL
from trainjob import constants as c

TABLE_ACCEPT = "as=table"
# Kinds of the objects whose Events are a job's: the copy, its JobSet, Jobs and Pods
# (the JobSet, Jobs and Pods are named after the job).
EVENT_KINDS = {c.TRAINJOB_KIND, c.JOBSET_KIND, "Job", "Pod"}
REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
           405: "MethodNotAllowed", 406: "NotAcceptable", 429: "TooManyRequests",
           500: "InternalError", 502: "BadGateway", 503: "ServiceUnavailable",
           504: "Timeout"}


def labels(trainjob: str, worker: str) -> dict[str, str]:
    return {TRAINJOB_LABEL: trainjob, WORKER_LABEL: worker}


def _last_termination(statuses: list[dict]) -> dict | None:
    """The latest termination among the containers: the current state when a container
    has ended, else the last state of one that restarted."""
    found = []
    for status in statuses:
        for where in ("state", "lastState"):
            terminated = (status.get(where) or {}).get("terminated")
            if terminated:
                found.append({"container": status.get("name"),
                              "reason": terminated.get("reason") or "",
                              "exitCode": terminated.get("exitCode"),
                              "finishedAt": terminated.get("finishedAt")})
                break
    if not found:
        return None
    return max(found, key=lambda t: t.get("finishedAt") or "")


def pod_item(pod: dict, trainjob: str, worker: str) -> dict:
    """A worker Pod of ``trainjob``'s copy as a TrainJobPod."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    statuses = (status.get("initContainerStatuses") or []) + (
        status.get("containerStatuses") or [])
    containers = status.get("containerStatuses") or []
    ready = sum(1 for s in containers if s.get("ready"))
    return {
        "apiVersion": GROUP_VERSION, "kind": "TrainJobPod",
        "metadata": {"name": meta["name"], "namespace": meta.get("namespace"),
                     "creationTimestamp": meta.get("creationTimestamp"),
                     "labels": labels(trainjob, worker)},
        "status": {
            "trainJob": trainjob, "worker": worker, "node": spec.get("nodeName") or "",
            "phase": status.get("phase") or "Unknown",
            "ready": f"{ready}/{len(spec.get('containers') or containers)}",
            "restarts": sum(int(s.get("restartCount") or 0) for s in statuses),
            "lastTermination": _last_termination(statuses),
            "startTime": status.get("startTime"),
            "containers": [s.get("name") for s in containers] or
                          [x.get("name") for x in spec.get("containers") or []],
        },
    }


def belongs_to(event: dict, trainjob: str) -> bool:
    """Whether a worker Event is about ``trainjob``'s copy or one of its children."""
    involved = event.get("involvedObject") or {}
    name = involved.get("name") or ""
    return involved.get("kind") in EVENT_KINDS and (
        name == trainjob or name.startswith(f"{trainjob}-"))


def event_item(event: dict, trainjob: str, worker: str) -> dict:
    """A worker Event about ``trainjob``'s copy or its children as a TrainJobEvent."""
    meta, involved = event["metadata"], event.get("involvedObject") or {}
    last = (event.get("lastTimestamp") or event.get("eventTime")
            or meta.get("creationTimestamp"))
    return {
        "apiVersion": GROUP_VERSION, "kind": "TrainJobEvent",
        "metadata": {"name": meta["name"], "namespace": meta.get("namespace"),
                     "creationTimestamp": meta.get("creationTimestamp"),
                     "labels": labels(trainjob, worker)},
        "trainJob": trainjob, "worker": worker,
        "type": event.get("type") or "", "reason": event.get("reason") or "",
        "object": f"{involved.get('kind', '')}/{involved.get('name', '')}",
        "message": event.get("message") or "",
        "count": event.get("count") or 1,
        "firstTimestamp": event.get("firstTimestamp") or last, "lastTimestamp": last,
    }


def list_of(kind: str, items: list[dict]) -> dict:
    return {"apiVersion": GROUP_VERSION, "kind": f"{kind}List", "metadata": {},
            "items": items}


_COLUMNS = {
    "TrainJobPod": [("Name", "string", "The Pod's name on its worker"),
                    ("TrainJob", "string", "The TrainJob whose copy it belongs to"),
                    ("Worker", "string", "The worker cluster it runs on"),
                    ("Node", "string", "The worker Node it is bound to"),
                    ("Ready", "string", "Ready containers of all"),
                    ("Status", "string", "The Pod's phase"),
                    ("Restarts", "integer", "Container restarts"),
                    ("Last Termination", "string", "The last container end: reason (exit code)"),
                    ("Started", "string", "When the Pod started (startTime)")],
    "TrainJobEvent": [("Last Seen", "string", "lastTimestamp"),
                      ("Type", "string", "Normal or Warning"),
                      ("Reason", "string", "The Event's reason"),
                      ("Object", "string", "The worker object it is about"),
                      ("Worker", "string", "The worker cluster it was read from"),
                      ("Message", "string", "The Event's message")],
}


def _cells(item: dict) -> list:
    if item["kind"] == "TrainJobPod":
        status = item["status"]
        last = status.get("lastTermination")
        ended = f"{last['reason'] or 'Terminated'} ({last['exitCode']})" if last else "<none>"
        return [item["metadata"]["name"], status["trainJob"], status["worker"],
                status["node"] or "<none>", status["ready"], status["phase"],
                status["restarts"], ended, status.get("startTime") or "<none>"]
    return [item.get("lastTimestamp") or "", item["type"], item["reason"], item["object"],
            item["worker"], item["message"]]


def table(kind: str, items: Iterable[dict]) -> dict:
    """The meta.k8s.io/v1 Table kubectl asks for (``Accept: ...;as=Table``)."""
    return {
        "apiVersion": "meta.k8s.io/v1", "kind": "Table", "metadata": {},
        "columnDefinitions": [{"name": name, "type": type_, "format": "", "description": text,
                               "priority": 0} for name, type_, text in _COLUMNS[kind]],
        "rows": [{"cells": _cells(item), "object": {
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": item["metadata"]}} for item in items],
    }


def wants_table(accept: str | None) -> bool:
    """Whether an Accept header asks for a meta.k8s.io Table first (kubectl get does)."""
    first = (accept or "").split(",")[0].replace(" ", "").lower()
    return TABLE_ACCEPT in first.split(";") and "g=meta.k8s.io" in first


def status(code: int, message: str, *, name: str = "", kind: str = "",
           reason: str | None = None) -> dict:
    """A metav1 Status for a refusal: the object (``kind``/``name``), the reason, why."""
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason or REASONS.get(code, ""), "code": code}
    if name or kind:
        body["details"] = {"name": name, "group": GROUP, "kind": kind}
    return body
