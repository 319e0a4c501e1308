"""The garbage-collection sweep: remote copies that no manager job accounts for.

A copy on a worker is garbage when it carries our origin label and its manager object is
gone, is being deleted, is a different object now (another UID), or is placed on another
worker (the copy a lost worker kept). Objects without our origin label are never looked
at: the worker's TrainJob cache only holds ours, and each candidate is checked again.
The sweep reads caches only (the worker caches were listed page by page), so it costs
one DELETE per copy removed and nothing else.
"""

from __future__ import annotations

import logging

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dispatcher import mirror
from dispatcher.metrics import DispatcherMetrics
from dispatcher.registry import WorkerRegistry
from trainjob import constants as c
from trainjob import logs
from trainjob.informer import Informer

log = logging.getLogger(__name__)


def garbage_reason(remote: dict, manager: dict | None, worker: str, origin: str) -> str | None:
    """Why ``remote`` on ``worker`` should go, or None when it is still wanted."""
    if not mirror.is_ours(remote, origin):
        return None
    if manager is None:
        return "its manager TrainJob is gone"
    if manager["metadata"].get("deletionTimestamp"):
        return "its manager TrainJob is being deleted"
    if not mirror.mirrors(remote, manager):
        return "it copies an earlier manager TrainJob of the same name"
    placed = (manager["metadata"].get("annotations") or {}).get(c.PLACEMENT_ANNOTATION)
    if placed != worker:
        return f"its manager TrainJob is placed on {placed or 'no worker'}"
    return None


def sweep(registry: WorkerRegistry, manager_trainjobs: Informer, origin: str,
          metrics: DispatcherMetrics) -> int:
    """One pass over every connected worker; returns how many copies were deleted."""
    removed = 0
    for worker in registry.snapshot():
        if not worker.active:
            continue
        remote_api = client.CustomObjectsApi(worker.api)
        for remote in worker.cache(c.TRAINJOBS).list():
            meta = remote["metadata"]
            manager = manager_trainjobs.get(meta["namespace"], meta["name"])
            reason = garbage_reason(remote, manager, worker.name, origin)
            if reason is None:
                continue
            with logs.context(namespace=meta["namespace"], name=meta["name"],
                              cluster=worker.name):
                removed += _collect(remote_api, remote, worker.name, reason, metrics)
    log.info("garbage collection: %d remote copies removed", removed)
    return removed


def _collect(remote_api: client.CustomObjectsApi, remote: dict, worker: str, reason: str,
             metrics: DispatcherMetrics) -> int:
    """Delete one stale copy (only the very object seen: uid precondition); 1 if deleted."""
    meta = remote["metadata"]
    try:
        remote_api.delete_namespaced_custom_object(
            c.TRAINER_GROUP, c.TRAINER_VERSION, meta["namespace"], c.TRAINJOBS,
            meta["name"], propagation_policy="Background",
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=meta["uid"])))
    except ApiException as err:
        if err.status not in (404, 409):  # else already gone, or replaced meanwhile
            log.warning("garbage collection on %s: cannot delete %s/%s: %s",
                        worker, meta["namespace"], meta["name"], err)
        return 0
    metrics.gc_deletions.labels(cluster=worker).inc()
    log.info("garbage collection on %s: deleted TrainJob %s/%s (%s)", worker,
             meta["namespace"], meta["name"], reason)
    return 1
