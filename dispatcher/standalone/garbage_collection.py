"""Standalone mode's garbage-collection sweep: remote copies that no manager job accounts
for (in Kueue mode, Kueue collects its own).

A copy on a worker is garbage when it carries our origin label and its manager object is
gone, is being deleted, is a different object now (another UID), or is placed on another
worker (the copy a lost worker kept). "Another worker" means another cluster: a job placed
under a second name of the same cluster (``workers/duplicates.py``) is not a stray.
Objects without our origin label are never looked at: the worker's TrainJob cache only
holds ours, and each candidate is checked again. The sweep finds candidates in the caches
(the worker caches were listed page by page), and reads each candidate's manager TrainJob
once more from the API server before deleting: the two caches are fed by two watches on
two servers, so the worker's may show a copy just made while the manager's does not show
yet the placement written before it (on a loaded machine, for seconds), and a copy
deleted on the cache's word alone would be a running job's. So a sweep costs one GET and
one DELETE per copy removed, and a GET per copy the manager's cache was behind on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kubernetes.client.exceptions import ApiException

from controller_kit import logs
from controller_kit.informer import Informer
from controller_kit.kubeclient import describe_error
from dispatcher.metrics import DispatcherMetrics
from dispatcher.standalone import mirror
from dispatcher.standalone.remote_copies import RemoteCopies
from dispatcher.workers.registry import WorkerRegistry
from trainjob import constants as c

log = logging.getLogger(__name__)


def garbage_reason(remote: dict, manager: dict | None, worker: str, origin: str,
                   same_cluster: Callable[[str, str], bool] = str.__eq__) -> str | None:
    """Why ``remote`` on ``worker`` should go, or None when it is still wanted.
    ``same_cluster(a, b)`` tells whether two worker names reach one cluster."""
    if not mirror.is_ours(remote, origin):
        return None
    if manager is None:
        return "its manager TrainJob is gone"
    if manager["metadata"].get("deletionTimestamp"):
        return "its manager TrainJob is being deleted"
    if not mirror.mirrors(remote, manager):
        return "it copies an earlier manager TrainJob of the same name"
    placed = (manager["metadata"].get("annotations") or {}).get(c.PLACEMENT_ANNOTATION)
    if not placed or not same_cluster(worker, placed):
        return f"its manager TrainJob is placed on {placed or 'no worker'}"
    return None


def sweep(registry: WorkerRegistry, manager_trainjobs: Informer, origin: str,
          metrics: DispatcherMetrics,
          read_manager: Callable[[str, str], dict | None]) -> int:
    """One pass over every connected worker; returns how many copies were deleted.
    ``read_manager(namespace, name)`` reads a manager TrainJob from the API server (None
    when it is not found): a candidate goes only if that answer still makes it garbage."""
    removed = 0
    for worker in registry.snapshot(draining=True):
        if not worker.active:
            continue
        copies = RemoteCopies(worker.api, worker.name, origin, metrics, worker.sent_deletes)
        for stray in worker.cache(c.TRAINJOBS).list():
            meta = stray["metadata"]
            manager = manager_trainjobs.get(meta["namespace"], meta["name"])
            reason = garbage_reason(stray, manager, worker.name, origin,
                                    registry.same_cluster)
            if reason is None:
                continue
            with logs.context(namespace=meta["namespace"], name=meta["name"],
                              cluster=worker.name):
                try:
                    current = read_manager(meta["namespace"], meta["name"])
                except ApiException as err:
                    log.warning("garbage collection on %s: cannot read the manager's "
                                "TrainJob %s/%s, its copy stays: %s", worker.name,
                                meta["namespace"], meta["name"], describe_error(err))
                    continue
                reason = garbage_reason(stray, current, worker.name, origin,
                                        registry.same_cluster)
                if reason is None:
                    log.debug("garbage collection on %s: %s/%s is wanted (the manager's "
                              "cache was behind)", worker.name, meta["namespace"],
                              meta["name"])
                    continue
                try:
                    deleted = copies.delete(stray)
                except ApiException as err:
                    log.warning("garbage collection on %s: cannot delete %s/%s: %s",
                                worker.name, meta["namespace"], meta["name"],
                                describe_error(err))
                    continue
                if deleted:
                    removed += 1
                    metrics.gc_deletions.labels(cluster=worker.name).inc()
                    log.info("garbage collection on %s: deleted TrainJob %s/%s (%s)",
                             worker.name, meta["namespace"], meta["name"], reason)
    log.info("garbage collection: %d remote copies removed", removed)
    return removed
