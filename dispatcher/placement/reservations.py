"""The room jobs hold on the workers: the one writer of capacity reservations
(``WorkerCapacity.reserve``/``release``) and Kueue quota holds (``WorkerQuota.hold``/
``release``), for standalone and Kueue mode alike. The ``Placer`` owns the one instance
and reserves through it when it places; Kueue mode's nominator holds and releases through
``Placer.reservations``.

A reservation keeps a placed job's footprint counted on its worker until its pods show up
(``WorkerCapacity`` then counts the pods instead); a quota hold counts a nominated job
against the worker's ClusterQueue until the worker's Kueue reserves that quota itself.
Both live in memory and are re-made from API objects: standalone from the footprint
recorded on each copy (``Placer.follow_copy``), Kueue mode from each Workload's
nomination or admission, on every reconcile of it.

A placement chooses and reserves as one step: it holds the ledger of each worker whose room
its choice reads (``deciding``), and only those, from before it reads their room until its
reservation is counted. Two placements that read a common worker take turns there, so each
sees the other's reservation (a burst does not pile onto one worker); placements that read
no worker in common never wait on each other. The ledgers are taken in the order of the
workers' names, so two placements never hold one each while waiting for the other's. The
informer handlers take none of them (``WorkerCapacity`` keeps its index under a lock of its
own), and neither do releases, nor the reservations re-made from a copy's footprint or a
Workload's nomination (``restore``, ``hold``): a release only frees room, and a re-made
reservation counts what a placement counted already.

Remembered in memory only (``_holders``): for Kueue mode, which worker and job each
Workload's room is held for, and with what need. It lets a Workload that is gone (no
longer readable) release its room, and skips re-holding what is held already. A restart
loses it; reconciling each Workload rebuilds it from the Workload's nomination or
admission.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from decimal import Decimal

from dispatcher.placement.need import Need
from dispatcher.workers.cluster import WorkerCluster
from dispatcher.workers.registry import WorkerRegistry

JobKey = tuple[str, str]


@dataclass(frozen=True)
class Holding:
    """Where a Workload's job holds room, and as what. ``admitted`` None: as placed by a
    nomination just written (the next ``hold`` makes it the Workload's whole need)."""

    worker: str
    job: JobKey
    admitted: bool | None = None
    need: Need | None = None


class Reservations:
    """Every write of a job's room on a worker goes through here. ``WorkerCapacity`` and
    ``WorkerQuota`` are thread-safe each; choosing and reserving as one step holds the
    ledgers of the workers the choice reads (``deciding``)."""

    def __init__(self, registry: WorkerRegistry):
        self.registry = registry
        # One lock per worker name (a worker registered again keeps its ledger's lock),
        # made when first asked for.
        self._ledgers: dict[str, threading.Lock] = {}
        self._ledgers_lock = threading.Lock()
        # Kueue mode: Workload key -> where its job's room is held (see the module's
        # docstring). Per-key calls come from one reconcile at a time (the work queue's
        # rule); the dict's own operations are atomic.
        self._holders: dict[JobKey, Holding] = {}

    # --- both modes -----------------------------------------------------------------------

    @contextmanager
    def deciding(self, worker_names: Iterable[str]) -> Iterator[None]:
        """Hold the ledgers of ``worker_names`` (the workers whose room a placement reads)
        while a job is chosen and reserved, in name order (see the module's docstring)."""
        names = sorted(set(worker_names))
        with self._ledgers_lock:
            locks = [self._ledgers.setdefault(name, threading.Lock()) for name in names]
        with ExitStack() as held:
            for lock in locks:
                held.enter_context(lock)
            yield

    def reserve(self, worker: WorkerCluster, job: JobKey, need: Need,
                plan: dict | None = None) -> None:
        """A job was just placed on ``worker``: count its need there (``plan``: on which
        Nodes its pods were packed), and against its Kueue queue's quota when it has one
        (Kueue mode, nominated and not reserved by the worker's Kueue yet)."""
        worker.capacity.reserve(job, need.requests, need.pods, plan,
                                (need.node_selector, need.tolerations))
        if need.queue is not None and worker.quota is not None:
            worker.quota.hold(job, need.queue, need.requests, need.pods)

    def restore(self, worker: WorkerCluster, job: JobKey, requests: dict[str, Decimal],
                pods: int) -> None:
        """Re-make a reservation from the footprint recorded on the job's copy (after a
        restart; a plan made since is kept)."""
        worker.capacity.reserve(job, requests, pods)

    def release(self, worker: WorkerCluster | None, job: JobKey) -> bool:
        """The job no longer needs room on ``worker``; True when a reservation or quota
        hold went."""
        if worker is None:
            return False
        held_quota = worker.quota.release(job) if worker.quota is not None else False
        return worker.capacity.release(job) or held_quota

    # --- Kueue mode: room held for a Workload's job -------------------------------------

    def placed(self, holder: JobKey, worker_name: str, job: JobKey) -> None:
        """``holder`` (a Workload) was nominated to the worker its job was just placed on
        (``reserve`` counted it): remember where, so it is released with the Workload."""
        self._holders[holder] = Holding(worker_name, job)

    def hold(self, holder: JobKey, worker_name: str, job: JobKey, need: Need,
             admitted: bool) -> bool:
        """Keep ``holder``'s job counted on ``worker_name``: its capacity until its pods
        account for it and, nominated and not ``admitted``, its queue's quota (once
        admitted, the worker's Kueue counts that itself). Room held on another worker
        goes; True when some did (room freed for waiting jobs)."""
        wanted = Holding(worker_name, job, admitted, need)
        held = self._holders.get(holder)
        worker = self.registry.get(worker_name)
        if held == wanted and worker is not None and worker.capacity.reserved(job):
            return False  # held as it is already
        released = False
        if held is not None and held.worker != worker_name:
            released = self.release_holder(holder)
        if worker is None:
            return released
        worker.capacity.reserve(job, need.requests, need.pods)
        if worker.quota is not None:
            if admitted or need.queue is None:
                worker.quota.release(job)
            else:
                worker.quota.hold(job, need.queue, need.requests, need.pods)
        self._holders[holder] = wanted
        return released

    def release_holder(self, holder: JobKey) -> bool:
        """``holder``'s job no longer needs room anywhere; True when some went."""
        held = self._holders.pop(holder, None)
        return held is not None and self.release(self.registry.get(held.worker), held.job)
