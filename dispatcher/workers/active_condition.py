"""The ``Active`` condition on each worker's MultiKueueCluster: the one writer of it.

Only the leader writes, and only while Kueue does not run on the manager (its MultiKueue
controller writes these conditions then). A worker that is draining, comes from the
static list, or whose Secret is still being read for the first time has no condition of
ours written.

While Kueue writes the condition it speaks for Kueue's connection, made with Kueue's own
Secret; the dispatcher reads the worker with a Secret of its own (kueue mode), so a worker
Kueue reports Active may still be unusable to the dispatcher. That is told as a Warning
Event on the MultiKueueCluster, once per reason, instead of a condition.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kubernetes import client

from controller_kit.api_time import format_time
from controller_kit.events import EventRecorder
from controller_kit.informer import Informer
from controller_kit.kubeclient import describe_error
from dispatcher.workers.cluster import ACTIVE, REASON_PENDING, WorkerCluster
from trainjob import constants as c

log = logging.getLogger(__name__)


class ActiveConditions:
    def __init__(self, manager: client.ApiClient, clusters: Informer,
                 may_write: Callable[[], bool], publish_conditions: Callable[[], bool],
                 current: Callable[[WorkerCluster], bool],
                 recorder: EventRecorder | None = None):
        self.manager = manager
        self.recorder = recorder
        self.clusters = clusters  # the MultiKueueCluster cache
        # Only the leader writes conditions; a standby keeps the same picture silently.
        self.may_write = may_write
        # False while Kueue's MultiKueue controller owns the MultiKueueCluster conditions.
        self.publish_conditions = publish_conditions
        self.current = current  # whether a worker object is the registry's one for its name
        self._left_conditions = False
        # While Kueue owns the conditions: the reason last told per unusable worker.
        self._told: dict[str, str] = {}
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
            self._tell(worker)
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

    def _tell(self, worker: WorkerCluster) -> None:
        """A Warning Event on the worker's MultiKueueCluster when this dispatcher cannot use
        it (its own Secret missing, unreadable or refused, the worker unreachable with
        it), once per reason: Kueue's condition there is about Kueue's connection."""
        if worker.active:
            self._told.pop(worker.name, None)
            return
        if worker.connected and not worker.verdicts:
            return  # connected, its first probe still out: no verdict to tell
        obj = self.clusters.get("", worker.name)
        if self.recorder is None or obj is None or self._told.get(worker.name) == worker.reason:
            return
        self._told[worker.name] = worker.reason
        self.recorder.event(obj, "Warning", worker.reason,
                            f"this dispatcher cannot use worker {worker.name} (Kueue's Active "
                            f"condition is about Kueue's own connection): {worker.message}")
