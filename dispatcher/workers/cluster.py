"""One worker cluster as the dispatcher sees it (``WorkerCluster``): how to reach it, its
caches and room, and its state as its MultiKueueCluster's ``Active`` condition reports it
(the reasons are listed here)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kubernetes import client

from controller_kit.informer import Informer
from dispatcher.room.capacity import WorkerCapacity
from dispatcher.room.worker_quota import WorkerQuota
from dispatcher.workers.sent_deletes import SentDeletes
from dispatcher.workers.warning_events import WarningEvents

log = logging.getLogger(__name__)

ACTIVE = "Active"
REASON_ACTIVE = "Active"
REASON_CONNECTION_FAILED = "ClientConnectionFailed"
REASON_DUPLICATE = "DuplicateRegistration"
REASON_UNSUPPORTED_SOURCE = "UnsupportedClusterSource"
# The worker's Secret is being read for the first time: no verdict to publish yet (its first
# list, a moment away, re-derives the worker).
REASON_PENDING = "KubeconfigPending"

# (worker name, resource, event kind, old object, new object): a worker's cache changed.
WorkerEvent = Callable[[str, str, str, dict | None, dict | None], None]
# The event kind (no objects) of a cache that has just listed again, after a lost watch or
# its first time: what was decided against it while it listed may be decided again.
RELISTED = "RELISTED"
# The caches a worker's room is counted from.
ROOM_CACHES = ("nodes", "pods")


@dataclass
class WorkerCluster:
    """One worker as the dispatcher sees it."""

    name: str
    order: int
    fingerprint: str
    api: client.ApiClient | None = None
    informers: dict[str, Informer] = field(default_factory=dict)
    capacity: WorkerCapacity = field(default_factory=WorkerCapacity)
    # Kueue mode: the worker Kueue's queues and quota (None in standalone mode).
    quota: WorkerQuota | None = None
    # Its Warning Events where it holds copies, for the manager's jobs (None: not mirrored).
    warnings: WarningEvents | None = None
    active: bool = False
    reason: str = REASON_CONNECTION_FAILED
    message: str = "not probed yet"
    since: float = field(default_factory=time.time)  # wall clock of the last state change
    verdicts: int = 0  # probes that have given their verdict on it
    from_object: bool = True  # a MultiKueueCluster (not the static list) describes it
    # When its MultiKueueCluster was created ("" for the static list): the oldest of two
    # registrations of one cluster is the one used.
    created: str = ""
    identity: str = ""  # the cluster's kube-system namespace UID, once its caches know it
    draining: bool = False  # left the registry; kept only to remove the copies placed there
    sent_deletes: SentDeletes = field(default_factory=SentDeletes)
    # Seconds from connecting to the first complete list of every one of its caches (None
    # until then): what a start or a failover waits for before placing there.
    cache_sync_seconds: float | None = None

    @property
    def precedence(self) -> tuple[str, int, str]:
        return (self.created or "~", self.order, self.name)

    @property
    def connected(self) -> bool:
        return self.api is not None

    def cache(self, resource: str) -> Informer:
        return self.informers[resource]

    def room_unknown(self) -> str | None:
        """Why the worker's room cannot be trusted now (a watch of its Nodes or Pods was
        lost and they are being listed again), or None."""
        listing = [resource for resource in ROOM_CACHES
                   if resource in self.informers and not self.informers[resource].current.is_set()]
        if not listing:
            return None
        return (f"its {' and '.join(listing)} are being listed again after a lost watch: "
                "its room is not known until then")

    def set_state(self, active: bool, reason: str, message: str) -> bool:
        """Record the worker's state; True when that changed what its condition says."""
        if (self.active, self.reason) == (active, reason) and (active or self.message == message):
            return False
        if self.active != active:
            self.since = time.time()
            log.log(logging.INFO if active else logging.WARNING,
                    "worker %s is %s: %s (%s)", self.name, "active" if active else "inactive",
                    reason, message)
        self.active, self.reason, self.message = active, reason, message
        return True

    def threads(self) -> list[threading.Thread | None]:
        """The threads reading the worker: its caches', its Kueue queues' (Kueue mode,
        started by a probe once its Kueue answers) and its Warning Events' (see
        ``WarningEvents.threads``)."""
        # tuple(): a probe may add the Kueue caches meanwhile (copied in one step).
        informers = tuple(self.informers.values()) + (
            tuple(self.quota.informers.values()) if self.quota is not None else ())
        found = [informer.thread for informer in informers]
        if self.warnings is not None:
            found += self.warnings.threads()
        return found

    def stop(self) -> None:
        for informer in self.informers.values():
            informer.stop(timeout=1)
        if self.quota is not None:
            self.quota.stop()
        if self.warnings is not None:
            self.warnings.stop()
        if self.api is not None:
            self.api.close()
