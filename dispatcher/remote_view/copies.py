"""Where a manager TrainJob's copy is: its worker and the copy, read from the caches the
dispatcher keeps anyway (the manager's TrainJobs, each worker's copies), so finding it
costs no request. A job is placed where its ``trainjob-dispatcher.io/cluster`` annotation
says (standalone mode); a job Kueue copied (Kueue mode) has no such annotation, and its
copy is looked for in every worker's cache of copies.

A finished job's copy is deleted from its worker after a while (standalone mode: the
dispatcher's ``retention_seconds`` and ``failed_retention_seconds``; Kueue mode: Kueue
deletes it as the job finishes), and with it its Pods, their Events and logs. Asked about
such a job, the answer says so: where it ran, when it finished, how long its copy was kept
and which setting keeps it longer."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from controller_kit.api_time import format_time
from dispatcher.workers.cluster import WorkerCluster
from trainjob import conditions
from trainjob import constants as c


class CopyProblem(Exception):
    """No copy to read: ``code`` 404 (no such job, or not on a worker) or 503 (its worker
    cannot be reached now); the message names the job and says why."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Copy:
    namespace: str
    name: str
    worker: WorkerCluster

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Keeping:
    """How long finished jobs' copies stay on their workers: standalone mode's two
    retentions (a Failed copy: the longer of them), or ``by_kueue`` (Kueue mode)."""

    retention: float = 0.0
    failed_retention: float = 0.0
    by_kueue: bool = False

    @classmethod
    def of(cls, config) -> Keeping:
        """The dispatcher's configuration's."""
        return cls(retention=config.retention_seconds,
                   failed_retention=config.failed_retention_seconds,
                   by_kueue=config.mode == "kueue")

    def kept_for(self, job: dict) -> float:
        if conditions.is_true(job, c.CONDITION_FAILED):
            return max(self.retention, self.failed_retention)
        return self.retention


def _how_it_finished(job: dict) -> str:
    for condition in conditions.conditions(job):
        if condition.get("type") in c.FINISHED_CONDITIONS and condition.get("status") == "True":
            when = condition.get("lastTransitionTime")
            return f"{condition['type']}{f' at {when}' if when else ''}"
    return "finished"


def _seconds(value: float) -> str:
    return f"{value:g}s"


def gone_message(job: dict, worker: str | None, keeping: Keeping,
                 now: float | None = None) -> str:
    """Why a finished job has no copy to read, and how to keep the next one's."""
    meta = job["metadata"]
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    head = f"TrainJob {key}: {_how_it_finished(job)}; "
    after = ("kubectl describe trainjob shows its conditions and the Events the worker "
             "reported about it")
    if keeping.by_kueue:
        return (head + "Kueue's MultiKueue deleted its copy on "
                f"{f'worker {worker}' if worker else 'its worker'}, and with it its Pods, "
                "their Events and logs, as soon as it finished (Kueue keeps no finished "
                f"copy); {after}")
    kept = keeping.kept_for(job)
    flag = "--failed-retention" if conditions.is_true(job, c.CONDITION_FAILED) \
        and keeping.failed_retention > keeping.retention else "--retention"
    finished_at = conditions.finished_time(job)
    now = time.time() if now is None else now
    if finished_at is not None and kept > 0 and now - finished_at < kept:
        when = (f"was deleted before the {_seconds(kept)} the dispatcher keeps it (until "
                f"{format_time(finished_at + kept)}), by someone else or by a dispatcher "
                "that kept it less long")
    elif kept > 0:
        when = f"was deleted {_seconds(kept)} after it finished"
    else:
        when = "was deleted as soon as it finished"
    return (head + f"its copy on worker {worker}, with its Pods, their Events and logs, "
            f"{when} (the dispatcher's {flag}, now {_seconds(kept)}: a longer one keeps a "
            f"finished job's Pods readable longer); {after}")


def _placed_message(job: dict) -> str:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == c.CONDITION_PLACED and condition.get("status") != "True":
            return f" ({condition.get('reason')}: {condition.get('message', '')[:300]})"
    return ""


class CopyLocator:
    """``find(namespace, name)``: the job's copy, or CopyProblem. ``jobs(namespace)``: the
    manager TrainJobs of a namespace that have a copy (their names)."""

    def __init__(self, trainjob: Callable[[str, str], dict | None],
                 trainjobs: Callable[[], list[dict]],
                 workers: Callable[[], list[WorkerCluster]],
                 keeping: Keeping | None = None):
        self._trainjob = trainjob
        self._trainjobs = trainjobs
        self._workers = workers
        self.keeping = keeping or Keeping()

    def _worker_name(self, job: dict) -> str | None:
        meta = job["metadata"]
        placed = (meta.get("annotations") or {}).get(c.PLACEMENT_ANNOTATION)
        if placed:
            return placed
        for worker in self._workers():
            cache = worker.informers.get(c.TRAINJOBS)
            if cache is not None and cache.get(meta["namespace"], meta["name"]) is not None:
                return worker.name
        return None

    def find(self, namespace: str, name: str) -> Copy:
        job = self._trainjob(namespace, name)
        if job is None:
            raise CopyProblem(404, f"TrainJob {namespace}/{name}: not found on the manager")
        worker_name = self._worker_name(job)
        if worker_name is None and conditions.finished(job):
            raise CopyProblem(404, gone_message(job, None, self.keeping))
        if worker_name is None:
            raise CopyProblem(404, f"TrainJob {namespace}/{name}: has no copy on any worker "
                                   f"(not placed){_placed_message(job)}")
        worker = next((w for w in self._workers() if w.name == worker_name), None)
        if worker is None or not worker.connected:
            why = f"{worker.reason}: {worker.message}" if worker else "not registered"
            raise CopyProblem(503, f"TrainJob {namespace}/{name}: its worker {worker_name} "
                                   f"is not connected to the dispatcher now ({why})")
        cache = worker.informers.get(c.TRAINJOBS)
        if cache is not None and cache.synced.is_set() and cache.get(namespace, name) is None:
            if conditions.finished(job):
                raise CopyProblem(404, gone_message(job, worker_name, self.keeping))
            raise CopyProblem(404, f"TrainJob {namespace}/{name}: placed on {worker_name}, "
                                   "which holds no copy of it (being made, or removed)")
        return Copy(namespace, name, worker)

    def jobs(self, namespace: str) -> list[str]:
        """The names of ``namespace``'s manager TrainJobs, sorted."""
        return sorted(job["metadata"]["name"] for job in self._trainjobs()
                      if job["metadata"].get("namespace") == namespace)
