"""Where a manager TrainJob's copy is: its worker and the copy, read from the caches the
dispatcher keeps anyway (the manager's TrainJobs, each worker's copies), so finding it
costs no request. A job is placed where its ``trainjob-dispatcher.io/cluster`` annotation
says (standalone mode); a job Kueue copied (Kueue mode) has no such annotation, and its
copy is looked for in every worker's cache of copies."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dispatcher.workers.cluster import WorkerCluster
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
                 workers: Callable[[], list[WorkerCluster]]):
        self._trainjob = trainjob
        self._trainjobs = trainjobs
        self._workers = workers

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
            raise CopyProblem(404, f"TrainJob {namespace}/{name}: placed on {worker_name}, "
                                   "which holds no copy of it (being made, or removed)")
        return Copy(namespace, name, worker)

    def jobs(self, namespace: str) -> list[str]:
        """The names of ``namespace``'s manager TrainJobs, sorted."""
        return sorted(job["metadata"]["name"] for job in self._trainjobs()
                      if job["metadata"].get("namespace") == namespace)
