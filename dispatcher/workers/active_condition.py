"""The ``Active`` condition on each worker's MultiKueueCluster: the one writer of it.

Only the leader writes, and only while Kueue does not run on the manager (its MultiKueue
controller writes these conditions then). A worker that is draining, comes from the
static list, or whose Secret is still being read for the first time has no condition of
ours written.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kubernetes import client

from dispatcher.workers.cluster import ACTIVE, REASON_PENDING, WorkerCluster
from trainjob import constants as c
from trainjob.conditions import format_time
from trainjob.informer import Informer
from trainjob.kubeclient import describe_error

log = logging.getLogger(__name__)


class ActiveConditions:
    def __init__(self, manager: client.ApiClient, clusters: Informer,
                 may_write: Callable[[], bool], publish_conditions: Callable[[], bool],
                 current: Callable[[WorkerCluster], bool]):
        self.manager = manager
        self.clusters = clusters  # the MultiKueueCluster cache
        # Only the leader writes conditions; a standby keeps the same picture silently.
        self.may_write = may_write
        # False while Kueue's MultiKueue controller owns the MultiKueueCluster conditions.
        self.publish_conditions = publish_conditions
        self.current = current  # whether a worker object is the registry's one for its name
        self._left_conditions = False
        # Condition writes one at a time, each by the worker object current at that moment:
        # two syncs can run back to back (a Secret's first list ends during one), and the
        # older one's write must not land after the newer one's.
        self._lock = threading.Lock()

    def publish(self, worker: WorkerCluster) -> None:
        """Write the Active condition on the worker's MultiKueueCluster when it changed."""
        with self._lock:
            if self.current(worker):  # else a newer one speaks for it
                self._write(worker)

    def _write(self, worker: WorkerCluster) -> None:
        if worker.reason == REASON_PENDING:
            return  # no verdict yet: a transient "not read" would flap the condition
        if not worker.from_object or worker.draining or not self.may_write():
            return  # a draining worker is no registration of ours to report on
        if not self.publish_conditions():
            if not self._left_conditions:
                self._left_conditions = True
                log.info("Kueue runs on the manager: its MultiKueue controller writes the "
                         "MultiKueueCluster Active conditions; this dispatcher writes none")
            return
        self._left_conditions = False
        obj = self.clusters.get("", worker.name)
        if obj is None:
            return
        status = "True" if worker.active else "False"
        conditions = [dict(x) for x in (obj.get("status") or {}).get("conditions") or []]
        current = next((x for x in conditions if x.get("type") == ACTIVE), None)
        if current and (current.get("status"), current.get("reason"), current.get("message")) == (
                status, worker.reason, worker.message):
            return
        stamp = format_time(worker.since)
        conditions = [x for x in conditions if x.get("type") != ACTIVE] + [{
            "type": ACTIVE, "status": status, "reason": worker.reason,
            "message": worker.message,
            "lastTransitionTime": stamp if current is None or current.get("status") != status
            else current.get("lastTransitionTime", stamp),
        }]
        try:
            written = client.CustomObjectsApi(self.manager).patch_cluster_custom_object_status(
                c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECLUSTERS, worker.name,
                {"status": {"conditions": conditions}}, field_manager=c.DISPATCHER_FIELD_MANAGER,
                _content_type="application/merge-patch+json")
            self.clusters.observe(written)
        except Exception as err:  # noqa: BLE001 - reported again on the next change/probe
            log.warning("MultiKueueCluster %s: cannot write Active condition: %s",
                        worker.name, describe_error(err))
