"""Every write standalone mode makes to a worker's TrainJobs: create (or adopt) a copy, and
delete one, only ever when it is ours (``mirror.is_ours``: our origin label and our
manager-UID annotation). The reconciler and the garbage collector both write through
here, so there is one ownership test.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller_kit import writes
from controller_kit.kubeclient import error_message, namespace_terminating
from dispatcher.metrics import DispatcherMetrics
from dispatcher.standalone import mirror
from dispatcher.workers.sent_deletes import SentDeletes
from trainjob import constants as c

# A worker's answers to a create that mean "not this spec, not here": bad request,
# forbidden (an admission webhook's default denial, or RBAC), invalid.
REFUSALS = (400, 403, 422)


@dataclass(frozen=True)
class Created:
    copy: dict
    adopted: bool = False  # it existed already (a create retried after a crash)


@dataclass(frozen=True)
class Stale:
    """Our copy of an earlier manager object of the same name is there (deleted now)."""


@dataclass(frozen=True)
class NameTaken:
    """A same-named TrainJob that is not our copy is there: never touched."""


@dataclass(frozen=True)
class Refused:
    """The worker will not take this spec (its admission webhook or schema)."""

    message: str


@dataclass(frozen=True)
class NamespaceGoing:
    """The namespace is being deleted there: not a verdict on the spec."""


CreateOutcome = Created | Stale | NameTaken | Refused | NamespaceGoing


class RemoteCopies:
    """The copies on one worker."""

    def __init__(self, api: client.ApiClient, worker: str, origin: str,
                 metrics: DispatcherMetrics, sent: SentDeletes):
        self.custom = client.CustomObjectsApi(api)
        self.worker = worker
        self.origin = origin
        self.metrics = metrics
        self.sent = sent  # the worker's: it outlives this object

    def create(self, manager: dict, requests: dict[str, str], pods: int) -> CreateOutcome:
        meta = manager["metadata"]
        body = mirror.build_remote(manager, self.origin, requests, pods)
        try:
            created = writes.create(self.custom.api_client, c.TRAINER_GROUP,
                                    c.TRAINER_VERSION, meta["namespace"], c.TRAINJOBS, body,
                                    field_manager=c.DISPATCHER_FIELD_MANAGER)
            self.metrics.worker_writes.labels(cluster=self.worker, kind="create").inc()
            return Created(created)
        except ApiException as err:
            if namespace_terminating(err):
                return NamespaceGoing()
            if err.status in REFUSALS:
                return Refused(error_message(err))
            if err.status != 409:
                raise
        existing = self.custom.get_namespaced_custom_object(
            c.TRAINER_GROUP, c.TRAINER_VERSION, meta["namespace"], c.TRAINJOBS, meta["name"])
        if not mirror.is_ours(existing, self.origin):
            return NameTaken()
        if not mirror.mirrors(existing, manager):
            self.delete(existing)  # ours to remove; the next round creates the new one
            return Stale()
        return Created(existing, adopted=True)

    def delete(self, remote: dict) -> bool:
        """Delete ``remote`` if it is ours; True when this call deleted it. Only this very
        object (uid precondition): a same-named one created meanwhile is not touched."""
        if not mirror.is_ours(remote, self.origin):
            return False
        meta = remote["metadata"]
        if meta["uid"] in self.sent:
            return False
        try:
            self.custom.delete_namespaced_custom_object(
                c.TRAINER_GROUP, c.TRAINER_VERSION, meta["namespace"], c.TRAINJOBS,
                meta["name"], propagation_policy="Background",
                body=client.V1DeleteOptions(preconditions=client.V1Preconditions(
                    uid=meta["uid"])))
        except ApiException as err:
            if err.status in (404, 409):  # already gone, or replaced meanwhile
                return False
            raise
        self.sent.add(meta["uid"])
        self.metrics.worker_writes.labels(cluster=self.worker, kind="delete").inc()
        return True
