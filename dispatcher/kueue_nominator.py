"""Kueue mode: this dispatcher as Kueue MultiKueue's external dispatcher.

Kueue (with ``multiKueue.dispatcherName`` set to this dispatcher's name) reserves quota for
a job on the manager and then waits for ``.status.nominatedClusterNames`` on the job's
Workload; it creates the remote copy only on the nominated workers and does the copying,
status sync and garbage collection itself. This module chooses that worker, with the same
placement and capacity code as standalone mode (``Placer``): the job's needs come from the
Workload's podSets, each worker's room from its Nodes and Pods and, where its Kueue's API
is served, from the quota of the ClusterQueue its LocalQueue of the Workload's
``spec.queueName`` points at (``worker_quota``, ``kueue_quota``).

Level-triggered, all state in API objects:

* the nomination is written to the Workload's status (a merge patch guarded by the
  resourceVersion), and when it was written is read back from the Workload's managed
  fields (this dispatcher's field manager), so a restart keeps counting;
* a worker that did not admit within ``admission_timeout_seconds`` is recorded in the
  Workload's ``trainjob-dispatcher.io/tried-clusters`` annotation and the next one is
  nominated; when every worker has been tried, the list starts over;
* the capacity a nominated or admitted job holds on its worker is reserved again from the
  Workload on every reconcile, and released once it finishes, is evicted or goes.
* a Workload that allows partial admission (a podSet's ``minCount``) is sized by its
  ``count`` first: the worker that runs it whole wins; only when none has room for that
  is it sized by ``minCount`` (Kueue admits it with fewer pods rather than let it wait).
  Its worker holds the whole size either way, so other jobs are not packed into room its
  Kueue may still give it;
* a Workload that cannot be sized (``kueue_workloads.podset_need`` says why) is
  nominated to every worker, as Kueue's all-at-once dispatcher would, so it never waits
  for a nomination that cannot come; why is said in an ``Unsizable`` Event and in the
  Workload's ``trainjob-dispatcher.io/Sized=False`` condition, written with the
  nomination. It has no admission timeout (there is no next worker to try).

Kueue clears ``nominatedClusterNames`` when a worker admits. It can clear a value another
field manager wrote only with merge patches (its ``WorkloadRequestUseMergePatch`` feature
gate) or through its MutatingAdmissionPolicy (Kubernetes 1.36+); see the README.
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

from dispatcher import kueue_workloads as wl
from dispatcher.config import DispatcherConfig
from dispatcher.kueue_presence import RECHECK_SECONDS
from dispatcher.metrics import DispatcherMetrics
from dispatcher.placement import message_shape
from dispatcher.placer import Need, Placer
from dispatcher.registry import WorkerRegistry
from trainjob import constants as c
from trainjob.conditions import format_time, upsert
from trainjob.events import NORMAL, WARNING, EventRecorder
from trainjob.informer import Informer
from trainjob.service import Requeue
from trainjob.workqueue import WorkQueue

log = logging.getLogger(__name__)

WORKLOADS = "workloads"
ADMISSIONCHECKS = "admissionchecks"
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
FIELD_MANAGER = "trainjob-dispatcher"
WORKLOAD_API_VERSION = f"{c.KUEUE_GROUP}/{c.KUEUE_VERSION}"

Key = tuple[str, str]


class WorkloadNominator:
    def __init__(self, manager: client.ApiClient, registry: WorkerRegistry, placer: Placer,
                 config: DispatcherConfig, recorder: EventRecorder,
                 metrics: DispatcherMetrics, idle: Callable[[], tuple[bool, str]]):
        self.custom = client.CustomObjectsApi(manager)
        # (True, why) while Kueue does not wait for this dispatcher: nothing is nominated.
        self.idle = idle
        self.registry = registry
        self.placer = placer
        self.config = config
        self.recorder = recorder
        self.metrics = metrics
        self.queue = WorkQueue()
        list_of = functools.partial(self.custom.list_cluster_custom_object, c.KUEUE_GROUP,
                                    c.KUEUE_VERSION)
        # Our own managed-fields entry says when we nominated (the rest is left out).
        self.workloads = Informer("manager/workloads", functools.partial(list_of, WORKLOADS),
                                  keep_field_managers=(FIELD_MANAGER,))
        self.checks = Informer("manager/admissionchecks",
                               functools.partial(list_of, ADMISSIONCHECKS))
        self.workloads.add_handler(self._on_workload)
        self.checks.add_handler(lambda *_: self.requeue_waiting())
        # Where each Workload's job holds capacity now: key -> (worker, reservation key),
        # and what was last held (worker, admitted, need), so an unchanged hold is skipped.
        self._held: dict[Key, tuple[str, Key]] = {}
        self._holding: dict[Key, tuple[str, bool, Need]] = {}
        # Needs by (uid, generation): a Workload's podSets are read again on each of the
        # many status writes Kueue makes while it waits; only a new spec changes them.
        self._needs: LRUCache = LRUCache(maxsize=8192)
        self._needs_lock = threading.Lock()  # reconcile threads share it; LRUCache is not safe
        # The last "nothing fits" message per Workload (amounts blanked): one Event per
        # change of reason, not per change of a number.
        self._pending_shape: dict[Key, str] = {}

    # --- wiring -------------------------------------------------------------------------

    def start(self, timeout: float) -> None:
        for informer in (self.workloads, self.checks):
            informer.start()
        for informer in (self.workloads, self.checks):
            if not informer.wait_synced(timeout):
                raise TimeoutError(f"{informer.name} cache not synced")

    def stop(self) -> None:
        self.queue.shutdown()
        for informer in (self.workloads, self.checks):
            informer.stop(timeout=1)

    def _on_workload(self, kind: str, old: dict | None, new: dict | None) -> None:
        obj = new or old
        self.queue.add((obj["metadata"]["namespace"], obj["metadata"]["name"]))

    def requeue_waiting(self) -> None:
        """Look again at every Workload that waits for a nomination (room may have
        appeared). Nominated ones are not: they wait for their worker's Kueue (their own
        changes and the admission timeout bring them back), and this runs on every change
        of room on any worker."""
        checks = self.multikueue_checks()
        for obj in self.workloads.list():
            waiting = wl.waiting(obj, checks)
            # Nominated to every worker because it could not be sized: the set of workers
            # may have changed.
            if waiting is not None and (not waiting.nominated or wl.sized_condition(obj)):
                self.queue.add((obj["metadata"]["namespace"], obj["metadata"]["name"]))

    def multikueue_checks(self) -> set[str]:
        return {obj["metadata"]["name"] for obj in self.checks.list()
                if (obj.get("spec") or {}).get("controllerName") == MULTIKUEUE_CONTROLLER}

    # --- reconcile ----------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        idle, why = self.idle()
        if idle:
            # Kueue nominates (or does not run) now; look again once it may have changed.
            raise Requeue(RECHECK_SECONDS, f"idle: {why}")
        obj = self.workloads.get(namespace, name)
        if obj is None or wl.finished(obj) or obj["metadata"].get("deletionTimestamp"):
            self._release(key)
            self._pending_shape.pop(key, None)
            return
        need = self._need(obj)
        if admitted_on := wl.cluster_name(obj):
            if not isinstance(need, str):
                # Until its pods account for it; its quota is the worker Kueue's to count.
                self._hold(key, obj, admitted_on, need, admitted=True)
            return
        waiting = wl.waiting(obj, self.multikueue_checks())
        if waiting is None:
            self._release(key)  # evicted, or its quota reservation went
            return
        if isinstance(need, str):
            self._nominate_every_worker(key, obj, waiting, need)
            return
        tried = wl.tried(obj)
        if waiting.nominated:
            since = wl.nominated_at(obj, FIELD_MANAGER)
            if since is None:
                return  # nominated by someone else: theirs to follow up
            waited = time.time() - since
            timeout = self.config.admission_timeout_seconds
            if waited < timeout:
                self._hold(key, obj, waiting.nominated[0], need)
                raise Requeue(timeout - waited, "waiting for the nominated worker to admit")
            tried += [n for n in waiting.nominated if n not in tried]
            self._release(key)
            message = (f"worker {', '.join(waiting.nominated)} did not admit the Workload "
                       f"within {timeout:.0f}s; nominating the next")
            self.recorder.event(self._event_target(obj), WARNING, "NominationTimedOut", message)
            self.metrics.nomination_timeouts.inc()
            log.info("Workload %s/%s: %s", namespace, name, message)
            obj = self._set_tried(obj, tried)
        self._nominate(key, obj, need, tried)

    def _nominate(self, key: Key, obj: dict, need: Need, tried: list[str]) -> None:
        timeout = self.config.admission_timeout_seconds
        skip = {n: f"nominated before and did not admit within {timeout:.0f}s" for n in tried}
        decision = self.placer.place_need(wl.job_key(obj), need, skip)
        least = None
        if isinstance(decision, str) and wl.partially_admissible(obj):
            # No room for all its pods: the least Kueue's partial admission runs.
            least = self._need(obj, at_min_count=True)
            if isinstance(least, str):
                least = None
            else:
                partial = self.placer.place_need(wl.job_key(obj), least, skip)
                if isinstance(partial, str):
                    decision = (f"{decision}; nor with partial admission ({least.pods} of its "
                                f"{need.pods} pods): {partial}")
                    least = None
                else:
                    decision = partial
        if isinstance(decision, str):
            registered = {w.name for w in self.registry.snapshot()}
            if tried and registered and registered <= set(tried):
                # Every worker had its turn: start over (capacity may have changed).
                self._set_tried(obj, [])
                raise Requeue(0.1, "every worker tried; starting over")
            self._say_pending(obj, key, "NoWorkerFits", decision)
            return
        worker, _ = decision
        meta = obj["metadata"]
        try:
            written = self.custom.patch_namespaced_custom_object_status(
                c.KUEUE_GROUP, c.KUEUE_VERSION, meta["namespace"], WORKLOADS, meta["name"],
                {"metadata": {"resourceVersion": meta["resourceVersion"]},
                 "status": {"nominatedClusterNames": [worker.name]}},
                field_manager=FIELD_MANAGER, _content_type="application/merge-patch+json")
        except BaseException as err:
            self.placer.release(worker, wl.job_key(obj))  # not nominated after all
            if isinstance(err, ApiException) and err.status == 409:
                # Kueue wrote the Workload meanwhile: decide again on its new state.
                raise Requeue(0.05, "the Workload changed meanwhile") from None
            raise
        self.workloads.observe(written)
        self._held[key] = (worker.name, wl.job_key(obj))
        self._pending_shape.pop(key, None)
        self.metrics.nominations.labels(cluster=worker.name).inc()
        message = f"nominated worker cluster {worker.name}"
        if least is not None:
            message += (f" (room for {least.pods} of its {need.pods} pods only: the podSets' "
                        "minCount, as Kueue's partial admission allows)")
        log.info("Workload %s/%s: %s", *key, message)
        self.recorder.event(self._event_target(obj), NORMAL, "Nominated", message)
        raise Requeue(timeout, "waiting for the nominated worker to admit")

    def _nominate_every_worker(self, key: Key, obj: dict, waiting: wl.Waiting,
                               why: str) -> None:
        """A Workload that cannot be sized: every worker nominated (as Kueue's all-at-once
        dispatcher would; the first whose Kueue admits it runs it), with why in an Event and
        in its ``SIZED_CONDITION``, both in one status write."""
        if waiting.nominated and wl.nominated_at(obj, FIELD_MANAGER) is None:
            return  # nominated by someone else: theirs to follow up
        workers = [worker.name for worker in self.registry.snapshot()]
        if not workers:
            self._say_pending(obj, key, wl.UNSIZABLE_REASON,
                              f"cannot size the Workload: {why}; no worker cluster is "
                              "registered to nominate")
            return
        names, left_out = workers[:wl.MAX_NOMINATED], workers[wl.MAX_NOMINATED:]
        message = (f"cannot size the Workload, so no worker is chosen by room: {why}; "
                   f"nominated every worker cluster ({', '.join(names)}), as Kueue's "
                   "all-at-once dispatcher would: the first whose Kueue admits it runs it")
        if left_out:
            message += (f" (Kueue takes at most {wl.MAX_NOMINATED} names: "
                        f"{', '.join(left_out)} left out)")
        said = wl.sized_condition(obj) or {}
        if sorted(waiting.nominated) == sorted(names) and said.get("message") == message:
            return  # done already (before a restart, too)
        meta = obj["metadata"]
        condition = {"type": wl.SIZED_CONDITION, "status": "False",
                     "reason": wl.UNSIZABLE_REASON, "message": message,
                     "lastTransitionTime": format_time(),
                     "observedGeneration": meta.get("generation") or 0}
        conditions = upsert(list((obj.get("status") or {}).get("conditions") or []), condition)
        try:
            # Conditions are a list: a merge patch replaces it whole, so the resourceVersion
            # guards Kueue's own conditions against a write made meanwhile.
            written = self.custom.patch_namespaced_custom_object_status(
                c.KUEUE_GROUP, c.KUEUE_VERSION, meta["namespace"], WORKLOADS, meta["name"],
                {"metadata": {"resourceVersion": meta["resourceVersion"]},
                 "status": {"nominatedClusterNames": names, "conditions": conditions}},
                field_manager=FIELD_MANAGER, _content_type="application/merge-patch+json")
        except ApiException as err:
            if err.status == 409:
                raise Requeue(0.05, "the Workload changed meanwhile") from None
            raise
        self.workloads.observe(written)
        self._release(key)
        self._pending_shape.pop(key, None)
        for name in names:
            if name not in waiting.nominated:
                self.metrics.nominations.labels(cluster=name).inc()
        log.info("Workload %s/%s: %s", *key, message)
        self.recorder.event(self._event_target(obj), WARNING, wl.UNSIZABLE_REASON, message)

    def _need(self, obj: dict, at_min_count: bool = False) -> Need | str:
        meta = obj["metadata"]
        cache_key = (meta.get("uid"), meta.get("generation"), at_min_count)
        if not all(cache_key[:2]):
            return wl.podset_need(obj, at_min_count)
        with self._needs_lock:
            need = self._needs.get(cache_key)
        if need is None:
            need = wl.podset_need(obj, at_min_count)
            with self._needs_lock:
                self._needs[cache_key] = need
        return need

    # --- capacity held by a Workload's job ----------------------------------------------

    def _hold(self, key: Key, obj: dict, worker_name: str, need: Need,
              admitted: bool = False) -> None:
        held = self._held.get(key)
        worker = self.registry.get(worker_name)
        if (held is not None and worker is not None and worker.capacity.reserved(held[1])
                and self._holding.get(key) == (worker_name, admitted, need)):
            return  # held as it is already
        if held is not None and held[0] != worker_name:
            self._release(key)
        if worker is None:
            return
        job = wl.job_key(obj)
        worker.capacity.reserve(job, need.requests, need.pods)
        if worker.quota is not None:
            # Nominated, not admitted: the worker's ClusterQueue does not count it yet, so
            # this dispatcher does. Admitted: its reservation there counts it.
            if admitted or need.queue is None:
                worker.quota.release(job)
            else:
                worker.quota.hold(job, need.queue, need.requests, need.pods)
        self._held[key] = (worker_name, job)
        self._holding[key] = (worker_name, admitted, need)

    def _release(self, key: Key) -> None:
        self._holding.pop(key, None)
        held = self._held.pop(key, None)
        if held is not None and self.placer.release(self.registry.get(held[0]), held[1]):
            self.requeue_waiting()

    # --- writes -------------------------------------------------------------------------

    def _set_tried(self, obj: dict, tried: list[str]) -> dict:
        meta = obj["metadata"]
        written = self.custom.patch_namespaced_custom_object(
            c.KUEUE_GROUP, c.KUEUE_VERSION, meta["namespace"], WORKLOADS, meta["name"],
            {"metadata": {"resourceVersion": meta["resourceVersion"], "annotations": {
                wl.TRIED_ANNOTATION: ",".join(tried) or None}}},
            field_manager=FIELD_MANAGER, _content_type="application/merge-patch+json")
        self.workloads.observe(written)
        return written

    def _say_pending(self, obj: dict, key: Key, reason: str, message: str) -> None:
        shape = f"{reason}: {message_shape(message)}"
        if self._pending_shape.get(key) == shape:
            return
        self._pending_shape[key] = shape
        log.info("Workload %s/%s waits: %s", *key, message)
        self.recorder.event(self._event_target(obj), WARNING, reason, message)

    @staticmethod
    def _event_target(obj: dict) -> dict:
        # Informer lists carry no apiVersion/kind per item; an Event needs both.
        return {"apiVersion": WORKLOAD_API_VERSION, "kind": "Workload", **obj}
