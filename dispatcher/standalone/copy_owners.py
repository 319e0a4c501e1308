"""Standalone mode's rule for the worker's reasons on the manager
(``workers/worker_events.py``): a worker's copy stands for a manager job when it is a copy
this dispatcher made (its origin label and manager-UID annotation) of that very job (the
UID it carries), and that job is placed on the worker (its placement annotation)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dispatcher.standalone import mirror
from dispatcher.workers.worker_events import JobRef
from trainjob import constants as c
from trainjob import managed_by


class StandaloneCopies:
    def __init__(self, origin: str, trainjob: Callable[[str, str], dict | None]):
        self._origin = origin
        self._trainjob = trainjob  # the manager's TrainJob cache, by namespace and name

    def owner(self, worker: str, copy: dict[str, Any]) -> JobRef | None:
        if not mirror.is_ours(copy, self._origin):
            return None
        meta = copy["metadata"]
        manager = self._trainjob(meta.get("namespace") or "", meta.get("name") or "")
        if not managed_by.dispatched(manager) or not mirror.mirrors(copy, manager) or \
                _placement(manager) != worker:
            return None
        return JobRef(manager["metadata"]["namespace"], manager["metadata"]["name"],
                      manager["metadata"]["uid"])

    def placed(self, job: JobRef, worker: str) -> bool:
        manager = self._trainjob(job.namespace, job.name)
        return manager is not None and manager["metadata"].get("uid") == job.uid and \
            _placement(manager) == worker


def _placement(manager: dict) -> str | None:
    return (manager["metadata"].get("annotations") or {}).get(c.PLACEMENT_ANNOTATION)
