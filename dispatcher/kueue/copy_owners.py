"""Kueue mode's rule for the worker's reasons on the manager (``workers/worker_events.py``):
the copies are Kueue MultiKueue's, made on a worker with Kueue's own identity and read
here with the dispatcher's reader identity, and which manager job a copy stands for is
told by Kueue's own marks, never by its name alone.

Kueue names the copy's Workload on the copy (``kueue.x-k8s.io/prebuilt-workload-name``)
and gives the worker's Workload the manager Workload's name. That manager Workload says
which job it was made for (its controller owner reference, by UID: an earlier job of the
same name had another) and where it runs: ``status.clusterName`` once a worker's Kueue
admitted it, before that the one worker this dispatcher nominated
(``status.nominatedClusterNames``; every worker for a Workload that cannot be sized, where
only the admitting worker starts the job's Pods). So a copy left on a worker the job no
longer runs on (evicted, nominated elsewhere) is not taken for the job's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cachetools import LRUCache

from controller_kit.informer import Informer
from dispatcher.kueue import workloads as wl
from dispatcher.workers.worker_events import JobRef
from trainjob import constants as c
from trainjob import managed_by

Getter = Callable[[str, str], dict | None]
# A worker's Warning Events may be delivered before the manager's Workloads have first been
# listed (the caches start together): their handler waits this long for that list rather
# than take a job for no job. It runs on the thread of one namespace's Events cache, which
# nothing else waits for.
SYNC_WAIT_SECONDS = 30.0
# Jobs whose Workload is remembered (to tell whether a job still runs on a worker); one
# forgotten only makes its groups of manager Events forgotten sooner.
_REMEMBERED = 65536


def workload_name(copy: dict[str, Any]) -> str | None:
    """The Workload Kueue names on its copy (an annotation in Kueue v0.19, a label before)."""
    meta = copy.get("metadata") or {}
    return (meta.get("annotations") or {}).get(c.KUEUE_PREBUILT_WORKLOAD_LABEL) or \
        (meta.get("labels") or {}).get(c.KUEUE_PREBUILT_WORKLOAD_LABEL) or None


def runs_on(workload: dict[str, Any], worker: str) -> bool:
    """Whether the Workload runs on ``worker``: assigned there, or, not assigned yet,
    nominated there."""
    assigned = wl.cluster_name(workload)
    if assigned:
        return assigned == worker
    return worker in wl.nominated(workload)


def _owner_uid(workload: dict[str, Any]) -> str | None:
    owner = next((ref for ref in workload["metadata"].get("ownerReferences") or []
                  if ref.get("controller")), None)
    return (owner or {}).get("uid")


class KueueCopies:
    def __init__(self, origin: str, trainjob: Getter, workloads: Callable[[], Informer]):
        self._origin = origin
        self._trainjob = trainjob  # the manager's TrainJob cache
        self._workloads_cache = workloads  # the manager's Workload cache (made after this)
        self._lock = threading.Lock()
        self._workloads: LRUCache = LRUCache(maxsize=_REMEMBERED)  # job UID -> Workload

    def owner(self, worker: str, copy: dict[str, Any]) -> JobRef | None:
        meta = copy["metadata"]
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        workload_of_copy = workload_name(copy)
        if (meta.get("labels") or {}).get(c.MULTIKUEUE_ORIGIN_LABEL) != self._origin or \
                not workload_of_copy:
            return None
        manager = self._trainjob(namespace, name)
        self._workloads_cache().wait_synced(SYNC_WAIT_SECONDS)
        workload = self._workload(namespace, workload_of_copy)
        if not managed_by.dispatched(manager) or workload is None:
            return None
        uid = manager["metadata"].get("uid")
        if not uid or _owner_uid(workload) != uid or not runs_on(workload, worker):
            return None
        with self._lock:
            self._workloads[uid] = workload_of_copy
        return JobRef(namespace, name, uid)

    def placed(self, job: JobRef, worker: str) -> bool:
        with self._lock:
            workload_of_job = self._workloads.get(job.uid)
        manager = self._trainjob(job.namespace, job.name)
        workload = self._workload(job.namespace, workload_of_job) if workload_of_job else None
        if manager is None or manager["metadata"].get("uid") != job.uid or \
                workload is None or _owner_uid(workload) != job.uid:
            with self._lock:  # the job or its Workload is gone
                self._workloads.pop(job.uid, None)
            return False
        return runs_on(workload, worker)

    def _workload(self, namespace: str, name: str) -> dict | None:
        return self._workloads_cache().get(namespace, name)
