"""The dispatcher's read-only web page, served on the metrics port: worker clusters with
their state and capacity, multicluster TrainJobs with their state, worker, conditions and
mirrored status. Everything comes from the dispatcher's caches (informers, registry,
capacity), so a page open in many browsers costs the API servers nothing.

Routes: ``/`` (the page; ``dashboard_page/`` holds its HTML, CSS and JS, nothing loaded
from elsewhere) and ``/api/state`` (the JSON the page polls). A job's row, opened, shows
its life on its worker: ``/api/job?namespace=&name=`` (its Pods and Events) and
``/api/job/log?namespace=&name=&pod=&container=&tailLines=`` (the end of a Pod's log),
read from the worker with the remote view's code (``remote_view.job_life``) only when
asked, one job at a time and bounded there."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controller_kit.api_time import format_time
from controller_kit.observability import Response, Route
from dispatcher.job_state import job_summary, workloads_by_job
from dispatcher.placement.waiting_line import Waiting
from dispatcher.remote_view import items
from dispatcher.remote_view.copies import Keeping
from dispatcher.remote_view.job_life import DEFAULT_TAIL_LINES, MAX_TAIL_LINES, JobLife, LifeProblem
from dispatcher.remote_view.logs import BadLogOption, log_options
from dispatcher.room.capacity import capacity_by_resource
from dispatcher.workers.cluster import WorkerCluster
from trainjob import constants as c
from trainjob import managed_by
from trainjob.runtime.podsets import format_quantity

if TYPE_CHECKING:
    from dispatcher.controller import DispatcherController

PAGE_DIR = Path(__file__).with_name("dashboard_page")
# path -> (file in PAGE_DIR, content type)
PAGE_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}
STATE_PATH = "/api/state"
JOB_PATH = "/api/job"
LOG_PATH = "/api/job/log"
JOB_PARAMETERS = ("namespace", "name")
LOG_PARAMETERS = (*JOB_PARAMETERS, "pod", "container", "tailLines")
# A namespace is a DNS label; a TrainJob's and a Pod's name a DNS subdomain.
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")

# Amounts of these are bytes: shown in binary units, as kubectl users read them.
_BYTE_RESOURCES = ("memory", "ephemeral-storage")
_BINARY_UNITS = (("Ti", 2 ** 40), ("Gi", 2 ** 30), ("Mi", 2 ** 20), ("Ki", 2 ** 10))

SyncLag = Callable[[str, str], tuple[float | None, float | None]]


def display_amount(resource: str, amount: Decimal) -> str:
    """An amount for people: bytes in Ki/Mi/Gi/Ti, anything else as a plain decimal."""
    if resource in _BYTE_RESOURCES or resource.startswith("hugepages-"):
        for unit, size in _BINARY_UNITS:
            if abs(amount) >= size:
                return f"{_plain(amount / size, places=1)}{unit}"
    return _plain(amount)


def _plain(amount: Decimal, places: int = 3) -> str:
    rounded = round(amount, places)
    text = f"{rounded:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def capacity_view(by_resource: dict[str, dict[str, Decimal]]) -> list[dict[str, Any]]:
    """Per resource of a ``WorkerCapacity.by_resource()`` (what the capacity metrics say
    too): exact amounts, display strings and the share taken by pods and reservations."""
    rows = []
    for resource, amounts in by_resource.items():
        allocatable = amounts["allocatable"]
        taken = amounts["used"] + amounts["reserved"]
        rows.append({
            "resource": resource,
            **{state: format_quantity(amount) for state, amount in amounts.items()},
            "display": {state: display_amount(resource, amount)
                        for state, amount in amounts.items()},
            "takenFraction": float(min(taken / allocatable, Decimal(1))) if allocatable else 0.0,
        })
    return rows


def cluster_view(worker: WorkerCluster, jobs_placed: int) -> dict[str, Any]:
    """One worker cluster: connection state (the Active condition) and capacity."""
    totals = worker.capacity.totals()
    return {
        "name": worker.name,
        "active": worker.active,
        "reason": worker.reason,
        "message": worker.message,
        "since": format_time(worker.since),
        "source": "MultiKueueCluster" if worker.from_object else "configuration file",
        "nodes": totals["nodes"],
        "usableNodes": totals["usableNodes"],
        "reservations": totals["reservations"],
        "jobs": jobs_placed,
        "capacity": capacity_view(capacity_by_resource(totals)),
        # Kueue mode: the worker Kueue's quota, which nominations must also fit.
        "quota": worker.quota.summary() if worker.quota is not None else None,
    }


def job_view(job: dict, sync_lag: SyncLag | None = None,
             workload: dict | None = None) -> dict[str, Any]:
    """One multicluster TrainJob: the status command's summary (same state derivation),
    split into state and reason, plus conditions, creation time and sync lag."""
    view = job_summary(job, workload)
    state, _, reason = view["state"].partition(" (")
    meta, status = job["metadata"], job.get("status") or {}
    conditions = [{key: item.get(key, "") for key in
                   ("type", "status", "reason", "message", "lastTransitionTime")}
                  for item in status.get("conditions") or []]
    last, waiting = sync_lag(meta["namespace"], meta["name"]) if sync_lag else (None, None)
    view.update({
        "state": state,
        "reason": reason.rstrip(")"),
        "message": _explanation(state, conditions),
        "conditions": conditions,
        "created": meta.get("creationTimestamp", ""),
        "suspended": bool((job.get("spec") or {}).get("suspend")),
        "syncLagSeconds": last,
        "syncWaitingSeconds": waiting,
    })
    return view


def _explanation(state: str, conditions: list[dict[str, str]]) -> str:
    """The condition message that says why a job is in its state, if one does."""
    wanted = {"Pending": (c.CONDITION_PLACED, "False"),
              c.CONDITION_FAILED: (c.CONDITION_FAILED, "True"),
              c.REASON_WORKER_UNREACHABLE: (c.CONDITION_WORKER_REACHABLE, "False")}.get(state)
    if wanted is None:
        return ""
    return next((x["message"] for x in conditions
                 if (x["type"], x["status"]) == wanted), "")


def waiting_view(line: Iterable[Waiting]) -> list[dict[str, Any]]:
    """The jobs waiting for room in the order they get it (standalone mode): position from
    1, priority and the PriorityClass it comes from, the workers each could use."""
    return [{"position": w.position, "namespace": w.key[0], "name": w.key[1],
             "priority": w.priority, "priorityClass": w.priority_class,
             "candidates": list(w.candidates)} for w in line]


def build_state(trainjobs: Iterable[dict], workers: Iterable[WorkerCluster],
                ready: tuple[bool, str], origin: str,
                sync_lag: SyncLag | None = None,
                workloads: list[dict] | None = None,
                waiting: Iterable[Waiting] = ()) -> dict[str, Any]:
    """The whole picture the page shows, from cached objects only (``workloads``: Kueue's,
    in kueue mode; ``waiting``: standalone mode's waiting line)."""
    by_job = workloads_by_job(workloads or [])
    line = waiting_view(waiting)
    in_line = {(w["namespace"], w["name"]): w for w in line}
    jobs = sorted((job_view(job, sync_lag, by_job.get((job["metadata"].get("namespace", ""),
                                                       job["metadata"]["name"])))
                   for job in trainjobs
                   if managed_by.dispatched(job)),
                  key=lambda j: (j["namespace"], j["name"]))
    for job in jobs:
        place = in_line.get((job["namespace"], job["name"]))
        job["waitingPosition"] = place["position"] if place else None
        job["priority"] = place["priority"] if place else None
    placed: dict[str, int] = {}
    states: dict[str, int] = {}
    for job in jobs:
        if job["worker"]:
            placed[job["worker"]] = placed.get(job["worker"], 0) + 1
        states[job["state"]] = states.get(job["state"], 0) + 1
    return {
        "generatedAt": format_time(),
        "origin": origin,
        "ready": ready[0],
        "role": ready[1],
        "clusters": [cluster_view(worker, placed.get(worker.name, 0)) for worker in workers],
        "trainJobs": jobs,
        "counts": dict(sorted(states.items())),
        "waitingLine": line,
    }


class BadParameter(ValueError):
    """A query parameter a route cannot take; the message names it and says why."""


def _parameters(path: str, query: dict[str, list[str]], accepted: tuple[str, ...],
                required: tuple[str, ...]) -> dict[str, str]:
    for name, values in query.items():
        if name not in accepted:
            raise BadParameter(f"{name}: not a parameter of {path} (parameters: "
                               f"{', '.join(accepted)})")
        if len(values) > 1:
            raise BadParameter(f"{name}: given {len(values)} times; give it once")
    found = {name: values[0] for name, values in query.items()}
    for name in required:
        if not found.get(name):
            raise BadParameter(f"{name}: required (parameters: {', '.join(accepted)})")
    for name, pattern, what in (("namespace", _LABEL, "a DNS label"),
                                ("name", _SUBDOMAIN, "a DNS subdomain"),
                                ("pod", _SUBDOMAIN, "a DNS subdomain")):
        if name in found and not pattern.match(found[name]):
            raise BadParameter(f"{name}={found[name][:300]!r}: not a valid name ({what}: "
                               "lower-case letters, digits and '-')")
    return found


def _log_parameters(found: dict[str, str]) -> tuple[str | None, int]:
    """The container and the number of lines a log request asks for, checked as the
    remote view checks its log options, the lines capped."""
    given = {name: [found[name]] for name in ("container", "tailLines") if name in found}
    try:
        options = log_options(given)
    except BadLogOption as err:
        raise BadParameter(str(err)) from None
    tail = options.get("tailLines", DEFAULT_TAIL_LINES)
    if not 1 <= tail <= MAX_TAIL_LINES:
        raise BadParameter(f"tailLines={tail}: must be from 1 to {MAX_TAIL_LINES}")
    return options.get("container"), tail


def _json(code: int, body: dict) -> Response:
    return code, "application/json", json.dumps(body).encode()


def _refusal(code: int, message: str, name: str = "", kind: str = "") -> Response:
    """A metav1 Status, as the remote view refuses: the object, the reason and why."""
    return _json(code, items.status(code, message, name=name, kind=kind))


def job_routes(trainjob: Callable[[str, str], dict | None], life: JobLife) -> dict[str, Route]:
    """``/api/job`` and ``/api/job/log``: a multicluster TrainJob's Pods and Events on its
    worker, and the end of one of its Pods' log, read when asked (``life``)."""
    def multicluster(found: dict[str, str]) -> Response | None:
        namespace, name = found["namespace"], found["name"]
        job = trainjob(namespace, name)
        if job is None:
            return _refusal(404, f"TrainJob {namespace}/{name}: not found on the manager",
                            name, "TrainJob")
        if not managed_by.dispatched(job):
            return _refusal(404, f"TrainJob {namespace}/{name}: not a multicluster TrainJob "
                                 f"(spec.managedBy is "
                                 f"{(job.get('spec') or {}).get('managedBy') or 'unset'}): "
                                 "it has no copy on a worker", name, "TrainJob")
        return None

    def answer(path: str, query: dict[str, list[str]], parse, read) -> Response:
        """Parameters parsed (400 naming the bad one), the job checked, then ``read``."""
        try:
            found, options = parse(query)
        except BadParameter as err:
            return _refusal(400, f"{path}: {err}")
        refused = multicluster(found)
        if refused is not None:
            return refused
        try:
            return _json(200, read(found, options))
        except LifeProblem as problem:
            return _refusal(problem.code, str(problem), problem.name, problem.kind)

    def job(query: dict[str, list[str]]) -> Response:
        return answer(JOB_PATH, query, lambda q: (
            _parameters(JOB_PATH, q, JOB_PARAMETERS, JOB_PARAMETERS), None),
            lambda found, _: life.job(found["namespace"], found["name"]))

    def log(query: dict[str, list[str]]) -> Response:
        def parse(q: dict[str, list[str]]):
            found = _parameters(LOG_PATH, q, LOG_PARAMETERS, (*JOB_PARAMETERS, "pod"))
            return found, _log_parameters(found)

        return answer(LOG_PATH, query, parse, lambda found, options: life.log(
            found["namespace"], found["name"], found["pod"], *options))

    return {JOB_PATH: job, LOG_PATH: log}


def routes(controller: DispatcherController) -> dict[str, Route]:
    """The page and its JSON, for the metrics server of ``controller``'s process."""
    def state(_query: dict[str, list[str]]) -> Response:
        nominator = controller.nominator
        body = build_state(controller.trainjobs.list(), controller.registry.snapshot(),
                           controller.ready(), controller.config.origin, controller.sync_lag,
                           nominator.workloads.list() if nominator else None,
                           controller.order.order() if not nominator else ())
        return 200, "application/json", json.dumps(body).encode()

    table: dict[str, Route] = {STATE_PATH: state}
    # The workers as the remote view finds copies on them: draining ones too, as their
    # jobs still run there.
    table.update(job_routes(controller.trainjobs.get, JobLife(
        controller.trainjobs.get, controller.trainjobs.list,
        lambda: controller.registry.snapshot(draining=True),
        keeping=Keeping.of(controller.config))))
    for path, (name, content_type) in PAGE_FILES.items():
        # Read once at start: a missing file is a broken installation, said right away.
        try:
            body = (PAGE_DIR / name).read_bytes()
        except OSError as err:
            raise RuntimeError(f"dashboard page file {PAGE_DIR / name}: {err.strerror}") from err
        table[path] = lambda _query, body=body, content_type=content_type: (
            200, content_type, body)
    return table
