"""Status copied back: the manager TrainJob's whole ``.status`` replaced by its copy's,
whenever ``decisions`` says they differ (``CopyStatus``). The dispatcher's own conditions
(``Placed``, ``WorkerReachable``) are written the same way, over the rest of the status.

Every write is a PUT of the status subresource with the object's resourceVersion: a
conflict is re-read and tried again, never overwritten blindly; an object replaced
meanwhile (another UID) is left to its own reconcile.
"""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller_kit import writes
from controller_kit.informer import Informer
from controller_kit.service import Requeue
from dispatcher.metrics import DispatcherMetrics
from dispatcher.standalone.job_timing import JobTimings
from trainjob import conditions
from trainjob import constants as c

# Conflicting writes tried before the job is requeued.
ATTEMPTS = 5


class StatusSync:
    """The status writes to manager TrainJobs."""

    def __init__(self, custom: client.CustomObjectsApi, trainjobs: Informer,
                 metrics: DispatcherMetrics, timings: JobTimings):
        self.custom = custom
        self.trainjobs = trainjobs
        self.metrics = metrics
        self.timings = timings

    def copy_back(self, manager: dict, status: dict) -> float | None:
        """Replace the manager's status with its copy's ``status``; the wall-clock time
        the change was seen on the worker (None: not seen by this process)."""
        return self.write(manager, status, mirrored=True)

    def set_condition(self, manager: dict, condition: dict) -> None:
        """Write ``condition`` over the one of its type, keeping the rest of the status."""
        status = manager.get("status") or {}
        self.write(manager, {**status, "conditions": conditions.upsert(
            conditions.conditions(manager), condition)})

    def write(self, manager: dict, status: dict, mirrored: bool = False) -> float | None:
        """Replace the manager's whole status; on a conflict re-read and try again. With
        ``mirrored``: the wall-clock time the copied change was seen (``JobTimings``)."""
        meta = manager["metadata"]
        body = manager
        for _ in range(ATTEMPTS):
            # A shallow copy: only the status is replaced, and the cached object stays
            # as the server sent it.
            body = {**body, "status": status}
            try:
                written = writes.replace_status(
                    self.custom.api_client, c.TRAINER_GROUP, c.TRAINER_VERSION,
                    meta["namespace"], c.TRAINJOBS, body,
                    field_manager=c.DISPATCHER_FIELD_MANAGER)
                self.trainjobs.observe(written)
                self.metrics.manager_writes.labels(kind="status").inc()
                return self.timings.mirrored((meta["namespace"], meta["name"])) \
                    if mirrored else None
            except ApiException as err:
                if err.status != 409:
                    raise
                body = self.custom.get_namespaced_custom_object(
                    c.TRAINER_GROUP, c.TRAINER_VERSION, meta["namespace"], c.TRAINJOBS,
                    meta["name"])
                if body["metadata"].get("uid") != meta.get("uid"):
                    return None  # a different object now: its own reconcile handles it
        raise Requeue(0.5, "status write kept conflicting")
