"""Kueue mode: this dispatcher as Kueue MultiKueue's external dispatcher.

Kueue (with ``multiKueue.dispatcherName`` set to this dispatcher's name) reserves quota for
a job on the manager and then waits for ``.status.nominatedClusterNames`` on the job's
Workload; it creates the remote copy only on the nominated workers and does the copying,
status sync and garbage collection itself. This module chooses that worker, with the same
placement and capacity code as standalone mode (``Placer``): the job's needs come from the
Workload's podSets, each worker's room from its Nodes and Pods and, where its Kueue's API
is served, from the quota of the ClusterQueue its LocalQueue of the Workload's
``spec.queueName`` points at (``room/worker_quota.py``, ``room/kueue_quota.py``).

The rules are a decision table (``kueue/decisions.py``: the Workload, its sizes, the workers
and the time in, one action out); this module performs the actions (API writes, requeues,
Events, metrics) and holds the job's room through the Placer's ``reservations``, as
standalone mode's reconciler performs ``standalone/decisions.py``. What the rules rely on
lives in API objects, so a restart resumes:

* the nomination is written to the Workload's status (a merge patch guarded by the
  resourceVersion), and when it was written is read back from the Workload's managed
  fields (this dispatcher's field manager), so a restart keeps counting;
* a worker that did not admit within ``admission_timeout_seconds`` is recorded in the
  Workload's ``trainjob-dispatcher.io/tried-clusters`` annotation and the next one is
  nominated; when every worker has been tried, the list starts over;
* the capacity a nominated or admitted job holds on its worker is held again from the
  Workload on every reconcile, and released once it finishes, is evicted or goes.
* a Workload that allows partial admission (a podSet's ``minCount``) is sized by its
  ``count`` first: the worker that runs it whole wins; only when none has room for that
  is it sized by ``minCount`` (Kueue admits it with fewer pods rather than let it wait).
  Its worker holds the whole size either way, so other jobs are not packed into room its
  Kueue may still give it;
* a Workload that cannot be sized (``workloads.podset_need`` says why) is
  nominated to every worker, as Kueue's all-at-once dispatcher would, so it never waits
  for a nomination that cannot come; why is said in an ``Unsizable`` Event and in the
  Workload's ``trainjob-dispatcher.io/Sized=False`` condition, written with the
  nomination. It has no admission timeout (there is no next worker to try).

Kept in memory besides (a restart loses it and changes no decision): each Workload's
sizes, cached by its uid and generation; the last "waits" reason said for it (so an Event
is emitted per change of reason, not per round: a restart says it once more); and where
its job's room is held (``reservations``; rebuilt as each Workload is reconciled).

Kueue clears ``nominatedClusterNames`` when a worker admits. It can clear a value another
field manager wrote only with merge patches (its ``WorkloadRequestUseMergePatch`` feature
gate) or through its MutatingAdmissionPolicy (Kubernetes 1.36+); see docs/kueue-mode.md.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable

from cachetools import LRUCache
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller_kit.events import NORMAL, WARNING, EventRecorder
from controller_kit.informer import Informer
from controller_kit.service import Requeue
from controller_kit.workqueue import WorkQueue
from dispatcher.coalesce import ROOM_WINDOW_SECONDS, Coalesced
from dispatcher.config import KUEUE_RECHECK_SECONDS, DispatcherConfig
from dispatcher.kueue import decisions as kd
from dispatcher.kueue import workloads as wl
from dispatcher.kueue.job_selectors import JobSelectors
from dispatcher.metrics import DispatcherMetrics
from dispatcher.placement.cluster_selector import Unplaceable
from dispatcher.placement.need import Need
from dispatcher.placement.placer import Placer
from dispatcher.workers.registry import WorkerRegistry
from trainjob import constants as c
from trainjob.conditions import upsert

log = logging.getLogger(__name__)

WORKLOADS = "workloads"
ADMISSIONCHECKS = "admissionchecks"
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
WORKLOAD_API_VERSION = f"{c.KUEUE_GROUP}/{c.KUEUE_VERSION}"
# A write that lost to one of Kueue's (409): decide again on the Workload's new state.
CONFLICT_RETRY = 0.05

Key = tuple[str, str]


class WorkloadNominator:
    """Performs ``kueue.decisions`` for each manager Workload (see the module docstring for
    what it keeps in memory)."""

    def __init__(self, manager: client.ApiClient, registry: WorkerRegistry, placer: Placer,
                 config: DispatcherConfig, recorder: EventRecorder,
                 metrics: DispatcherMetrics, idle: Callable[[], tuple[bool, str]],
                 trainjob: Callable[[str, str], dict | None] = lambda _ns, _name: None):
        self.custom = client.CustomObjectsApi(manager)
        # The cluster selector on each Workload's job (``trainjob``: the TrainJob cache).
        self.selectors = JobSelectors(manager, trainjob)
        # (True, why) while Kueue does not wait for this dispatcher: nothing is nominated.
        self.idle = idle
        self.registry = registry
        self.placer = placer
        self.reservations = placer.reservations
        self.config = config
        self.settings = kd.Settings(admission_timeout=config.admission_timeout_seconds,
                                    field_manager=c.DISPATCHER_FIELD_MANAGER)
        self.recorder = recorder
        self.metrics = metrics
        self.queue = WorkQueue()
        list_of = functools.partial(self.custom.list_cluster_custom_object, c.KUEUE_GROUP,
                                    c.KUEUE_VERSION)
        # Our own managed-fields entry says when we nominated (the rest is left out).
        self.workloads = Informer("manager/workloads", functools.partial(list_of, WORKLOADS),
                                  keep_field_managers=(c.DISPATCHER_FIELD_MANAGER,))
        self.checks = Informer("manager/admissionchecks",
                               functools.partial(list_of, ADMISSIONCHECKS))
        self.workloads.add_handler(self._on_workload)
        # Every change of room (a worker's, a reservation released or held) asks for it;
        # a burst of them scans the Workloads once.
        self.requeue_waiting = Coalesced(self._requeue_waiting, ROOM_WINDOW_SECONDS)
        self.checks.add_handler(lambda *_: self.requeue_waiting())
        # A cache: sizes by (uid, generation, at minCount). A Workload's podSets are read
        # again on each of the many status writes Kueue makes while it waits; only a new
        # spec changes them.
        self._sizes: LRUCache = LRUCache(maxsize=8192)
        self._sizes_lock = threading.Lock()  # reconcile threads share it; LRUCache is not safe
        # A memo: the shape of the last "waits" message said per Workload (amounts
        # blanked), so an Event goes out per change of reason, not per change of a number.
        self._said: dict[Key, str] = {}

    # --- wiring -------------------------------------------------------------------------

    def start(self, timeout: float) -> None:
        for informer in (self.workloads, self.checks):
            informer.start()
        for informer in (self.workloads, self.checks):
            if not informer.wait_synced(timeout):
                raise TimeoutError(f"{informer.name} cache not synced")

    def threads(self) -> list[threading.Thread | None]:
        """The threads of its caches (its process's manager watches them)."""
        return [self.workloads.thread, self.checks.thread]

    def stop(self) -> None:
        self.queue.shutdown()
        for informer in (self.workloads, self.checks):
            informer.stop(timeout=1)

    def _on_workload(self, kind: str, old: dict | None, new: dict | None) -> None:
        obj = new or old
        if old is None and new is not None and not wl.past_nomination(new) and \
                not wl.nominated(new):
            # A Workload seen for the first time, no worker for it yet: its pod shapes are
            # scored on each worker while Kueue reserves its quota and it waits for its
            # turn, as standalone mode does for a TrainJob seen.
            self.placer.warm_need_ahead(wl.job_key(new),
                                        functools.partial(self._warming_inputs, new))
        self.queue.add((obj["metadata"]["namespace"], obj["metadata"]["name"]))

    def _warming_inputs(self, obj: dict) -> tuple[Need | str | None, str | None]:
        """(its size, its job's cluster selector), on the placer's warming thread: read
        there, not on the cache's, and kept (``_size``, ``selectors``) for its decision.
        Nothing while Kueue does not wait for this dispatcher."""
        if self.idle()[0]:
            return None, None
        return self._size(obj, False), self.selectors.of(obj)

    def _requeue_waiting(self) -> None:
        """Look again at every Workload a change of room may move
        (``decisions.needs_another_look``): once per burst of changes of room on any
        worker (``requeue_waiting``)."""
        checks = self.multikueue_checks()
        for obj in self.workloads.list():
            if kd.needs_another_look(obj, checks):
                self.queue.add((obj["metadata"]["namespace"], obj["metadata"]["name"]))

    def multikueue_checks(self) -> set[str]:
        return {obj["metadata"]["name"] for obj in self.checks.list()
                if (obj.get("spec") or {}).get("controllerName") == MULTIKUEUE_CONTROLLER}

    # --- reconcile ----------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        idle, why = self.idle()
        obj = None if idle else self.workloads.get(namespace, name)
        action = kd.decide(
            obj, sized=kd.sizes(obj, self._size) if obj is not None else None,
            checks=self.multikueue_checks(),
            workers=tuple(worker.name for worker in self.registry.snapshot()),
            now=time.time(), settings=self.settings, idle=why if idle else None,
            said=self._said.get(key))
        self._perform(key, obj, action)

    def _perform(self, key: Key, obj: dict | None, action: kd.Action) -> None:
        log.debug("Workload %s/%s: %s", *key, action.name)
        if action.release:
            self._release(key)
        match action:
            case kd.Idle(why=why):
                # Kueue nominates (or does not run) now; look again once it may have changed.
                raise Requeue(KUEUE_RECHECK_SECONDS, f"idle: {why}")
            case kd.Forget():
                self._release(key)
                self._said.pop(key, None)
            case kd.Release():
                return  # the release above is all of it
            case kd.Ignore():
                return
            case kd.Hold(worker=worker, need=need, admitted=admitted, wait=wait):
                if self.reservations.hold(key, worker, wl.job_key(obj), need, admitted):
                    self.requeue_waiting()
                if wait is not None:
                    raise Requeue(wait, "waiting for the nominated worker to admit")
            case kd.Choose():
                self._choose(key, obj, action)
            case kd.Nominate():
                self._nominate(key, obj, action)
            case kd.StartOver(retry=retry):
                self._set_tried(obj, [])
                raise Requeue(retry, "every worker tried; starting over")
            case kd.SayPending(reason=reason, message=message, shape=shape):
                self._said[key] = shape
                log.info("Workload %s/%s waits: %s", *key, message)
                self.recorder.event(self._event_target(obj), WARNING, reason, message)
            case kd.NominateEveryWorker():
                self._nominate_every_worker(key, obj, action)
            case _:
                raise TypeError(f"no way to perform {action!r}")

    def _choose(self, key: Key, obj: dict, choose: kd.Choose) -> None:
        """Release and record the workers that timed out, ask the Placer (which reserves
        the room of the worker it picks), then perform what its answers call for."""
        if choose.timed_out is not None:
            self._release(key)
            self.recorder.event(self._event_target(obj), WARNING, "NominationTimedOut",
                                choose.timed_out)
            self.metrics.nomination_timeouts.inc()
            log.info("Workload %s/%s: %s", *key, choose.timed_out)
            obj = self._set_tried(obj, list(choose.tried))
        job = wl.job_key(obj)
        selector = self.selectors.of(obj)
        whole = self._place(job, choose.need, choose.skip, selector)
        partial = None
        if isinstance(whole, str) and choose.least is not None \
                and not isinstance(whole, Unplaceable):
            # No room for all its pods: the least Kueue's partial admission runs.
            partial = self._place(job, choose.least, choose.skip, selector)
        self._perform(key, obj, kd.nominate(choose, whole, partial, settings=self.settings,
                                            said=self._said.get(key)))

    def _place(self, job: Key, need: Need, skip: dict[str, str],
               selector: str | None) -> kd.Placed:
        placed = self.placer.place_need(job, need, skip, selector)
        return placed if isinstance(placed, str) else kd.Fits(placed[0].name)

    def _size(self, obj: dict, at_min_count: bool) -> Need | str:
        meta = obj["metadata"]
        cache_key = (meta.get("uid"), meta.get("generation"), at_min_count)
        if not all(cache_key[:2]):
            return wl.podset_need(obj, at_min_count)
        with self._sizes_lock:
            need = self._sizes.get(cache_key)
        if need is None:
            need = wl.podset_need(obj, at_min_count)
            with self._sizes_lock:
                self._sizes[cache_key] = need
        return need

    def _release(self, key: Key) -> None:
        if self.reservations.release_holder(key):
            self.requeue_waiting()  # room freed for the Workloads that wait

    # --- writes -------------------------------------------------------------------------

    def _nominate(self, key: Key, obj: dict, nomination: kd.Nominate) -> None:
        meta = obj["metadata"]
        job = wl.job_key(obj)
        try:
            written = self.custom.patch_namespaced_custom_object_status(
                c.KUEUE_GROUP, c.KUEUE_VERSION, meta["namespace"], WORKLOADS, meta["name"],
                {"metadata": {"resourceVersion": meta["resourceVersion"]},
                 "status": {"nominatedClusterNames": [nomination.worker]}},
                field_manager=c.DISPATCHER_FIELD_MANAGER,
                _content_type="application/merge-patch+json")
        except BaseException as err:
            # Not nominated after all: the room the Placer reserved goes.
            self.placer.release(self.registry.get(nomination.worker), job)
            if isinstance(err, ApiException) and err.status == 409:
                raise Requeue(CONFLICT_RETRY, "the Workload changed meanwhile") from None
            raise
        self.workloads.observe(written)
        self.reservations.placed(key, nomination.worker, job)
        self._said.pop(key, None)
        self.metrics.nominations.labels(cluster=nomination.worker).inc()
        log.info("Workload %s/%s: %s", *key, nomination.message)
        self.recorder.event(self._event_target(obj), NORMAL, "Nominated", nomination.message)
        raise Requeue(nomination.wait, "waiting for the nominated worker to admit")

    def _nominate_every_worker(self, key: Key, obj: dict,
                               nomination: kd.NominateEveryWorker) -> None:
        """The nomination and the ``SIZED_CONDITION`` in one status write, with why in an
        Event."""
        meta = obj["metadata"]
        conditions = upsert(list((obj.get("status") or {}).get("conditions") or []),
                            nomination.condition)
        try:
            # Conditions are a list: a merge patch replaces it whole, so the resourceVersion
            # guards Kueue's own conditions against a write made meanwhile.
            written = self.custom.patch_namespaced_custom_object_status(
                c.KUEUE_GROUP, c.KUEUE_VERSION, meta["namespace"], WORKLOADS, meta["name"],
                {"metadata": {"resourceVersion": meta["resourceVersion"]},
                 "status": {"nominatedClusterNames": list(nomination.names),
                            "conditions": conditions}},
                field_manager=c.DISPATCHER_FIELD_MANAGER,
                _content_type="application/merge-patch+json")
        except ApiException as err:
            if err.status == 409:
                raise Requeue(CONFLICT_RETRY, "the Workload changed meanwhile") from None
            raise
        self.workloads.observe(written)
        self._release(key)
        self._said.pop(key, None)
        for name in nomination.added:
            self.metrics.nominations.labels(cluster=name).inc()
        log.info("Workload %s/%s: %s", *key, nomination.message)
        self.recorder.event(self._event_target(obj), WARNING, wl.UNSIZABLE_REASON,
                            nomination.message)

    def _set_tried(self, obj: dict, tried: list[str]) -> dict:
        meta = obj["metadata"]
        written = self.custom.patch_namespaced_custom_object(
            c.KUEUE_GROUP, c.KUEUE_VERSION, meta["namespace"], WORKLOADS, meta["name"],
            {"metadata": {"resourceVersion": meta["resourceVersion"], "annotations": {
                wl.TRIED_ANNOTATION: ",".join(tried) or None}}},
            field_manager=c.DISPATCHER_FIELD_MANAGER,
            _content_type="application/merge-patch+json")
        self.workloads.observe(written)
        return written

    @staticmethod
    def _event_target(obj: dict) -> dict:
        # Informer lists carry no apiVersion/kind per item; an Event needs both.
        return {"apiVersion": WORKLOAD_API_VERSION, "kind": "Workload", **obj}
