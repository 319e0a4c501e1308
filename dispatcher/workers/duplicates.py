"""One cluster, one registration: which worker names reach the same cluster, and the
refusal of every registration of a cluster but the oldest.

A worker has one identity: the UID of its ``kube-system`` namespace, which names the
apiserver's storage whatever URL or credentials reach it. Two registrations of one cluster
(say, a second Secret made from the same kubeconfig) would each treat the other's copies as
strays; only the oldest registration is used, the others are reported ``Active=False``
with reason ``DuplicateRegistration`` naming it, and a Warning Event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from controller_kit.events import EventRecorder
from dispatcher.workers.cluster import REASON_DUPLICATE, WorkerCluster

log = logging.getLogger(__name__)

# Created by every apiserver at start and never deleted: its UID identifies the cluster.
IDENTITY_NAMESPACE = "kube-system"


class Duplicates:
    """The identities of the workers, and the refusal of duplicate registrations. The
    caller holds the registry's lock."""

    def __init__(self, recorder: EventRecorder | None, may_write: Callable[[], bool],
                 registration_object: Callable[[str], dict | None]):
        self.recorder = recorder
        self.may_write = may_write
        self.registration_object = registration_object  # worker name -> its MultiKueueCluster
        # Last known identity per worker name, kept across reconnects: the garbage
        # collector asks whether two names are one cluster even while one is down.
        self.identities: dict[str, str] = {}

    def same_cluster(self, first: str, second: str) -> bool:
        """Whether two worker names reach one cluster (as far as is known)."""
        identity = self.identities.get(first)
        return first == second or (bool(identity) and identity == self.identities.get(second))

    def sort_out(self, worker: WorkerCluster, workers: Iterable[WorkerCluster]
                 ) -> tuple[list[WorkerCluster], WorkerCluster | None]:
        """``worker`` answers: learn its identity and refuse the younger registrations of
        its cluster that are still active. (the workers refused now, the older
        registration ``worker`` itself duplicates or None)."""
        workers = list(workers)
        self._identify(worker)
        refused = []
        # This worker may have been the older registration of a cluster another name
        # already uses: that one stops now, not at its next probe.
        for other in _same_cluster_as(worker, workers):
            oldest = _duplicate_of(other, workers)
            if other is not worker and other.active and oldest is not None:
                self.refuse(other, oldest)
                refused.append(other)
        return refused, _duplicate_of(worker, workers)

    def _identify(self, worker: WorkerCluster) -> None:
        namespace = worker.cache("namespaces").get("", IDENTITY_NAMESPACE)
        worker.identity = ((namespace or {}).get("metadata") or {}).get("uid") or (
            worker.api.configuration.host)  # an apiserver without kube-system: its URL
        self.identities[worker.name] = worker.identity

    def refuse(self, worker: WorkerCluster, older: WorkerCluster) -> bool:
        """Report ``worker`` as a second registration of ``older``'s cluster; True when
        that changed its state."""
        message = (f"the same cluster as worker {older.name} ({IDENTITY_NAMESPACE} namespace "
                   f"UID {worker.identity}): only {older.name} is used; delete one of the two "
                   "registrations")
        first = worker.reason != REASON_DUPLICATE
        changed = worker.set_state(False, REASON_DUPLICATE, message)
        if first:
            log.warning("worker %s is refused: %s", worker.name, message)
            if self.recorder is not None and worker.from_object and self.may_write():
                obj = self.registration_object(worker.name)
                if obj is not None:
                    self.recorder.event(obj, "Warning", REASON_DUPLICATE, message)
        return changed


def _same_cluster_as(worker: WorkerCluster, workers: list[WorkerCluster]) -> list[WorkerCluster]:
    """The registered (not draining) workers that share ``worker``'s identity."""
    if not worker.identity:
        return []
    return [w for w in workers if w.identity == worker.identity and not w.draining]


def _duplicate_of(worker: WorkerCluster, workers: list[WorkerCluster]) -> WorkerCluster | None:
    """The oldest other registration of ``worker``'s cluster, when it is older."""
    oldest = min(_same_cluster_as(worker, workers), key=lambda w: w.precedence, default=worker)
    return None if oldest is worker or worker.draining else oldest
