"""Standalone mode's reconciler for one manager TrainJob: it performs what
``decisions.decide`` chose (placing through the Placer, copies through ``remote_copies``,
status through ``status_sync``).

Level-triggered: every call reads the manager object and the remote copy from caches and
moves one step towards the desired state. The order of writes makes it crash-safe:

1. placement: the chosen worker and our finalizer go onto the manager object in one
   request, guarded by its resourceVersion (a second dispatcher or a stale cache loses
   with 409 instead of placing twice);
2. the remote copy is created (POST; 409 means it exists: adopted when it is our copy of
   this very manager object);
3. remote status changes are copied onto the manager (``status_sync``: the whole
   ``.status``, PUT with the resourceVersion; on 409 re-read and retry, never overwrite
   blindly);
4. teardown (deletion, suspension, finish) deletes the remote first and releases the
   finalizer/placement after it is gone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller_kit import logs, step_timing, writes
from controller_kit.api_time import format_time
from controller_kit.events import NORMAL, WARNING, EventRecorder
from controller_kit.informer import Informer
from controller_kit.service import Requeue
from dispatcher.config import DispatcherConfig
from dispatcher.metrics import DispatcherMetrics
from dispatcher.placement.chooser import message_shape
from dispatcher.placement.need import Need
from dispatcher.placement.placer import Placer
from dispatcher.standalone import decisions, remote_copies
from dispatcher.standalone.beside_kueue import KueueOnManager
from dispatcher.standalone.job_timing import JobTimings
from dispatcher.standalone.status_sync import StatusSync
from dispatcher.standalone.waiting_order import PlacementOrder
from dispatcher.workers.cluster import WorkerCluster
from dispatcher.workers.registry import WorkerRegistry
from trainjob import conditions
from trainjob import constants as c
from trainjob.runtime.podsets import format_quantity

log = logging.getLogger(__name__)

# Actions whose writes the caches hold at once (``observe``): the job's next step can be
# decided right after them. (A delete is done when the watch says so: not followed up.)
_FOLLOWED_UP = (decisions.Place, decisions.CreateRemote, decisions.CopyStatus,
                decisions.RemoveFinalizer, decisions.Unplace, decisions.Replace,
                decisions.MarkRemoved, decisions.Exclude)
# Decisions after which nothing happens until something changes.
_AT_REST = (decisions.InSync, decisions.Ignore, decisions.Forget, decisions.LeaveToKueue)

CONDITION_PLACED = decisions.CONDITION_PLACED
CONDITION_WORKER_REACHABLE = decisions.CONDITION_WORKER_REACHABLE
REASON_NO_WORKER = decisions.REASON_NO_WORKER
REASON_WORKER_UNREACHABLE = decisions.REASON_WORKER_UNREACHABLE


class DispatchReconciler:
    def __init__(self, manager: client.ApiClient, trainjobs: Informer,
                 registry: WorkerRegistry, placer: Placer, timings: JobTimings,
                 config: DispatcherConfig, recorder: EventRecorder, metrics: DispatcherMetrics,
                 kueue: KueueOnManager | None = None,
                 queued_for: Callable[[], float | None] = lambda: None,
                 order: PlacementOrder | None = None):
        self.api = manager
        self.custom = client.CustomObjectsApi(manager)
        # How long the key being reconciled waited in the work queue (this thread's).
        self._queued_for = queued_for
        self.kueue = kueue
        # Jobs already told (in an Event) that they are left to Kueue: key -> UID.
        self._left_to_kueue: dict[tuple[str, str], str] = {}
        self.trainjobs = trainjobs
        self.registry = registry
        self.placer = placer
        self.timings = timings
        self.config = config
        self.recorder = recorder
        self.metrics = metrics
        self.status = StatusSync(self.custom, trainjobs, metrics, timings)
        # Jobs whose last placement found no room (or a selector no worker matches): the
        # ones a change of room may move, in the order they get it (priority, then age).
        # Kept by the reconciles themselves, so a freed Node looks at these few again, not
        # at every job the manager holds.
        self.order = order or PlacementOrder(placer, registry)
        self.settings = decisions.Settings(origin=config.origin,
                                           worker_lost_timeout=config.worker_lost_timeout_seconds,
                                           retention=config.retention_seconds,
                                           failed_retention=config.failed_retention_seconds)

    # --- entry point ----------------------------------------------------------------

    def reconcile(self, namespace: str, name: str) -> None:
        steps = step_timing.start(self.metrics.reconcile_steps, self._queued_for())
        performed = "Undecided"
        try:
            key = (namespace, name)
            raw, worker, action = self._decide(key)
            logs.bind(cluster=decisions.placement(raw) if raw is not None else None)
            if action.release:
                self.placer.release(worker, key)
            steps.lap("decide")
            if not isinstance(action, decisions.Place):
                self.order.left(key)
            performed = action.name
            log.debug("TrainJob %s/%s: %s", namespace, name, action.name)
            self._perform(action, key, raw, worker)
            if isinstance(action, _FOLLOWED_UP):
                self._follow_up(key, action)
        finally:
            steps.finish(performed)

    def waiting_for_room(self) -> list[tuple[str, str]]:
        """The jobs a change of room may place (their last placement found none), first
        in line first."""
        return self.order.line.keys()

    def _follow_up(self, key: tuple[str, str], done: decisions.Action) -> None:
        """After a write: decide again on the caches, which hold what was written, and
        come back at once unless the job is at rest. The watch's echo of this process's
        own write is not a reason to reconcile (the controller skips it), so this is what
        takes a job on to its next step (a finished copy's retention, a job placed again)."""
        _, _, after = self._decide(key)
        # The same step again means no progress (a job that stays pending): the events
        # that can change that (room freed, a worker back) bring it back, not a loop.
        if not isinstance(after, _AT_REST) and type(after) is not type(done):
            raise Requeue(0, f"next step: {after.name}")

    def _decide(self, key: tuple[str, str]) -> tuple[dict | None, WorkerCluster | None,
                                                     decisions.Action]:
        """The job, its worker and the next step, from the caches."""
        raw = self.trainjobs.get(*key)
        placed = decisions.placement(raw) if raw is not None else None
        worker = self.registry.get(placed) if placed else None
        kueue_claim = self.kueue.claim(raw) if raw is not None and self.kueue else None
        return raw, worker, decisions.decide(raw, self._worker_state(placed, worker, key),
                                             time.time(), self.settings, kueue_claim)

    def _worker_state(self, placed: str | None, worker: WorkerCluster | None,
                      key: tuple[str, str]) -> decisions.WorkerState | None:
        if not placed:
            return None
        if worker is None:
            return decisions.WorkerState(placed, known=False, active=False)
        return decisions.WorkerState(
            placed, draining=worker.draining, active=worker.active,
            inactive_since=worker.since, message=worker.message,
            remote=worker.cache(c.TRAINJOBS).get(*key) if worker.active else None)

    def _perform(self, action: decisions.Action, key: tuple[str, str], raw: dict | None,
                 worker: WorkerCluster | None) -> None:
        match action:
            case decisions.Forget():
                self.placer.forget(key)
                self.timings.forget(key)
                self._left_to_kueue.pop(key, None)
            case decisions.Ignore():
                return
            case decisions.LeaveToKueue(why=why):
                uid = raw["metadata"].get("uid", "")
                if self._left_to_kueue.get(key) != uid:
                    self._left_to_kueue[key] = uid
                    message = f"left to Kueue, which runs on this manager: {why}"
                    log.info("TrainJob %s/%s %s", *key, message)
                    self.recorder.event(raw, NORMAL, "LeftToKueue", message)
            case decisions.InSync():
                self.timings.in_sync(key)
            case decisions.Place():
                self._place(raw)
            case decisions.CreateRemote():
                problem, need = self.placer.need_on(raw, worker)
                if need is None:
                    raise Requeue(1.0, f"cannot create the remote copy on {worker.name}: "
                                       f"{problem}")
                self._create_remote(raw, worker, need)
            case decisions.DeleteRemote(remote=remote_copy, why=why, retry=retry):
                log.info("TrainJob %s/%s: deleting its copy on %s (%s)", *key, worker.name,
                         why)
                self._copies(worker).delete(remote_copy)
                if retry is not None:
                    raise Requeue(retry, why)
            case decisions.CopyStatus(status=status):
                seen = self.status.copy_back(raw, status)
                step_timing.lap("write")
                if seen is not None:
                    # Where this change's time went, from the worker's watch event to the
                    # manager's answer: a slow one is explained from the log alone (the
                    # benchmark joins it with its own clocks for the slowest changes).
                    log.info("TrainJob %s/%s status copied from %s (seen at %.6f; %s)", *key,
                             worker.name, seen, step_timing.so_far())
            case decisions.RemoveFinalizer():
                self._remove_finalizer(raw)
            case decisions.Unplace():
                self._clear_placement(raw)
            case decisions.Replace(reason=reason, message=message):
                self._replace(raw, reason, message)
            case decisions.MarkUnreachable(message=message, since=since, wait=wait):
                self.status.set_condition(raw, {
                    "type": CONDITION_WORKER_REACHABLE, "status": "False",
                    "reason": REASON_WORKER_UNREACHABLE, "message": message,
                    "lastTransitionTime": format_time(since)})
                self.recorder.event(raw, WARNING, REASON_WORKER_UNREACHABLE, message)
                raise Requeue(wait, "waiting for the worker-lost timeout")
            case decisions.MarkRemoved(message=message):
                log.warning("TrainJob %s/%s: %s", *key, message)
                self.status.set_condition(raw, {
                    "type": CONDITION_WORKER_REACHABLE, "status": "False",
                    "reason": decisions.REASON_WORKER_REMOVED, "message": message,
                    "lastTransitionTime": format_time()})
                self.recorder.event(raw, WARNING, decisions.REASON_WORKER_REMOVED, message)
            case decisions.Exclude(reason=reason, why=why):
                self._exclude(raw, worker, None, why, reason)
            case decisions.Wait(seconds=seconds, why=why):
                raise Requeue(seconds, why)
            case _:
                raise TypeError(f"no way to perform {action!r}")

    @staticmethod
    def _key(raw: dict) -> tuple[str, str]:
        return raw["metadata"]["namespace"], raw["metadata"]["name"]

    def _replace(self, raw: dict, reason: str, why: str) -> None:
        """Forget the placement so the job is placed again (on any eligible worker). The
        status the old copy reported goes too: it described a run that is over, and the
        new copy's status replaces it as soon as there is one."""
        message = f"{why}; placing the job again"
        log.warning("TrainJob %s/%s: %s", *self._key(raw), message)
        self.status.write(raw, {"conditions": [{
            "type": CONDITION_PLACED, "status": "False", "reason": reason,
            "message": message, "lastTransitionTime": format_time()}]})
        self.recorder.event(raw, WARNING, reason, message)
        self._clear_placement(self.trainjobs.get(*self._key(raw)) or raw)

    # --- placement --------------------------------------------------------------------

    def _place(self, raw: dict) -> None:
        meta = raw["metadata"]
        key = (meta["namespace"], meta["name"])
        self.timings.eligible(key)
        # While jobs wait, the workers whose room one ahead of this job could use are not
        # this job's to take (``placement.waiting_line``).
        turn = self.order.turn(raw)
        decision = self.placer.place(raw, turn.skip, turn.content) if turn else \
            self.placer.place(raw)
        step_timing.lap("place")
        if isinstance(decision, str):
            settled = self.order.waits(raw, turn)
            step_timing.lap("line")
            self._pending(raw, decision)
            if not settled:
                raise Requeue(0, "a job that held it back in the waiting line has left it")
            return
        self.order.left(key)
        worker, need = decision
        patch = {"metadata": {
            "resourceVersion": meta["resourceVersion"],
            "annotations": {c.PLACEMENT_ANNOTATION: worker.name},
            "finalizers": sorted(set(meta.get("finalizers") or []) | {c.DISPATCH_FINALIZER}),
        }}
        try:
            written = writes.merge_patch(
                self.api, c.TRAINER_GROUP, c.TRAINER_VERSION,
                meta["namespace"], c.TRAINJOBS, meta["name"], patch,
                field_manager=c.DISPATCHER_FIELD_MANAGER)
        except BaseException:
            self.placer.release(worker, key)  # not placed after all (e.g. 409: changed meanwhile)
            raise
        self.trainjobs.observe(written)
        step_timing.lap("patch")
        logs.bind(cluster=worker.name)
        self.metrics.manager_writes.labels(kind="placement").inc()
        self.recorder.event(raw, NORMAL, c.REASON_PLACED, f"placed on worker cluster {worker.name}")
        self._create_remote(written, worker, need)

    def _pending(self, raw: dict, message: str) -> None:
        # No room (NoWorkerFits), or a cluster selector that matches no worker or does not
        # parse (``cluster_selector.Unplaceable`` carries its own reason).
        reason = getattr(message, "reason", REASON_NO_WORKER)
        current = conditions.find(raw, CONDITION_PLACED)
        # Free amounts move with every pod and placement elsewhere; rewriting each pending
        # job (and emitting an Event) for a changed number would be a write storm. Only a
        # changed reason is written; the numbers shown are those of the last such change.
        if current and current.get("status") == "False" and current.get("reason") == reason \
                and message_shape(current.get("message", "")) == message_shape(message):
            return
        message = str(message)
        self.status.set_condition(raw, {"type": CONDITION_PLACED, "status": "False",
                                        "reason": reason, "message": message,
                                        "lastTransitionTime": format_time()})
        self.recorder.event(raw, WARNING, reason, message)
        log.info("TrainJob %s/%s pending: %s", *self._key(raw), message)

    # --- the remote copy --------------------------------------------------------------

    def _create_remote(self, manager: dict, worker: WorkerCluster, need: Need) -> None:
        key = self._key(manager)
        outcome = self._copies(worker).create(
            manager, {k: format_quantity(v) for k, v in need.requests.items()}, need.pods)
        step_timing.lap("create")
        match outcome:
            case remote_copies.Created(copy=created, adopted=adopted):
                worker.cache(c.TRAINJOBS).observe(created)
                # Where this dispatch's time went, so that a slow one can be explained
                # from the log alone (the benchmark reads it for its slowest dispatches).
                log.info("TrainJob %s/%s placed on %s, copy %s (%s)", *key, worker.name,
                         "adopted" if adopted else "created", step_timing.so_far())
            case remote_copies.NamespaceGoing():
                # Placement sees that in the worker's namespace cache next round.
                # Debug: this comes back every second until the namespace is gone there.
                log.debug("TrainJob %s/%s placed on %s; no copy yet: its namespace is being "
                          "deleted there", *key, worker.name)
                raise Requeue(1.0, f"namespace {key[0]} is being deleted on {worker.name}")
            case remote_copies.Refused(message=message):
                # Retrying the same spec there cannot help: place elsewhere, until the
                # spec changes (a new generation).
                self._exclude(manager, worker, manager["metadata"].get("generation"),
                              f"refused the copy: {message}", "RemoteRejected")
                return
            case remote_copies.NameTaken():
                self._exclude(manager, worker, None,
                              f"TrainJob {key[0]}/{key[1]} exists there and is not a copy "
                              "made by this dispatcher", decisions.REASON_NAME_TAKEN)
                return
            case remote_copies.Stale():
                log.debug("TrainJob %s/%s placed on %s; no copy yet: a copy of an earlier "
                          "job of that name is being deleted there", *key, worker.name)
                raise Requeue(decisions.STALE_COPY_RETRY,
                              "stale remote copy of an earlier job being deleted")
        self.timings.dispatched(key)

    def _copies(self, worker: WorkerCluster) -> remote_copies.RemoteCopies:
        return remote_copies.RemoteCopies(worker.api, worker.name, self.config.origin,
                                          self.metrics, worker.sent_deletes)

    def _exclude(self, manager: dict, worker: WorkerCluster, generation: int | None,
                 why: str, reason: str) -> None:
        """Take ``worker`` out of this job's candidates (``generation`` None: for good) and
        undo the placement, so the next round places it elsewhere or says why it waits."""
        key = self._key(manager)
        self.placer.exclude(key, worker, generation, why)
        self.recorder.event(manager, WARNING, reason,
                            f"worker {worker.name}: {why}; placing elsewhere")
        log.warning("TrainJob %s/%s: worker %s %s", *key, worker.name, why)
        self._clear_placement(manager)
        # Placing it again is the next step, now with one candidate fewer: no event brings
        # it back (the cleared placement's echo is this process's own write).
        raise Requeue(0, f"worker {worker.name} {why}; placing elsewhere")

    # --- writes to the manager object ----------------------------------------------

    def _clear_placement(self, manager: dict) -> None:
        meta = manager["metadata"]
        finalizers = [f for f in meta.get("finalizers") or [] if f != c.DISPATCH_FINALIZER]
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"],
                              "annotations": {c.PLACEMENT_ANNOTATION: None},
                              "finalizers": finalizers}}
        self._patch_manager(manager, patch, "unplace")

    def _remove_finalizer(self, manager: dict) -> None:
        meta = manager["metadata"]
        finalizers = [f for f in meta.get("finalizers") or [] if f != c.DISPATCH_FINALIZER]
        self._patch_manager(manager, {"metadata": {"resourceVersion": meta["resourceVersion"],
                                                   "finalizers": finalizers}}, "finalizer")

    def _patch_manager(self, manager: dict, patch: dict, kind: str) -> None:
        meta = manager["metadata"]
        try:
            written = writes.merge_patch(
                self.api, c.TRAINER_GROUP, c.TRAINER_VERSION,
                meta["namespace"], c.TRAINJOBS, meta["name"], patch,
                field_manager=c.DISPATCHER_FIELD_MANAGER)
        except ApiException as err:
            if err.status == 404:
                return
            raise
        self.trainjobs.observe(written)
        self.metrics.manager_writes.labels(kind=kind).inc()

