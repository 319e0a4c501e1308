"""The dispatcher's reconciler for one manager TrainJob: it performs what
``decisions.decide`` chose.

Level-triggered: every call reads the manager object and the remote copy from caches and
moves one step towards the desired state. The order of writes makes it crash-safe:

1. placement: the chosen worker and our finalizer go onto the manager object in one
   request, guarded by its resourceVersion (a second dispatcher or a stale cache loses
   with 409 instead of placing twice);
2. the remote copy is created (POST; 409 means it exists: adopted when it is our copy of
   this very manager object);
3. remote status changes are copied onto the manager (the whole ``.status``, PUT with the
   resourceVersion; on 409 re-read and retry, never overwrite blindly);
4. teardown (deletion, suspension, finish) deletes the remote first and releases the
   finalizer/placement after it is gone.
"""

from __future__ import annotations

import copy
import logging
import re
import threading
import time
from dataclasses import dataclass
from decimal import Decimal
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dispatcher import decisions, remote
from dispatcher.config import DispatcherConfig
from dispatcher.metrics import DispatcherMetrics
from dispatcher.placement import POLICIES, Candidate, describe_reasons, place_trainjob
from dispatcher.registry import WorkerCluster, WorkerRegistry
from trainjob import constants as c
from trainjob import logs
from trainjob.api import TrainingRuntime, TrainJob
from trainjob.events import NORMAL, WARNING, EventRecorder
from trainjob.informer import Informer
from trainjob.runtime import build_runtime_info
from trainjob.runtime.podsets import format_quantity
from trainjob.service import Requeue

log = logging.getLogger(__name__)

FIELD_MANAGER = remote.FIELD_MANAGER

CONDITION_PLACED = decisions.CONDITION_PLACED
CONDITION_WORKER_REACHABLE = decisions.CONDITION_WORKER_REACHABLE
REASON_NO_WORKER = decisions.REASON_NO_WORKER
REASON_WORKER_UNREACHABLE = decisions.REASON_WORKER_UNREACHABLE


@dataclass
class Need:
    requests: dict[str, Decimal]
    pods: int
    node_selector: dict[str, str] | None
    tolerations: list[dict] | None


class DispatchReconciler:
    def __init__(self, manager: client.ApiClient, trainjobs: Informer,
                 registry: WorkerRegistry, config: DispatcherConfig,
                 recorder: EventRecorder, metrics: DispatcherMetrics):
        self.custom = client.CustomObjectsApi(manager)
        self.trainjobs = trainjobs
        self.registry = registry
        self.config = config
        self.recorder = recorder
        self.metrics = metrics
        self.policy = POLICIES[config.placement_policy]
        self.settings = decisions.Settings(origin=config.origin,
                                           worker_lost_timeout=config.worker_lost_timeout_seconds,
                                           retention=config.retention_seconds)
        # Workers that are not candidates for a job, and why: a same-named TrainJob without
        # our origin label is there (never touched; for good), or the worker's apiserver
        # refused the copy (until the job's spec changes: generation).
        self.excluded: dict[tuple[str, str], dict[str, tuple[int | None, str]]] = {}
        # When a job first became eligible for dispatch, and when a remote's change was
        # observed: the starts of the dispatch-latency and status-sync-lag histograms.
        self.eligible_since: dict[tuple[str, str], float] = {}
        self.remote_changed_at: dict[tuple[str, str], float] = {}
        self.last_sync_lag: dict[tuple[str, str], float] = {}  # per job, for the dashboard
        self._placement_lock = threading.Lock()

    # --- entry point ----------------------------------------------------------------

    def reconcile(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        raw = self.trainjobs.get(namespace, name)
        placed = decisions.placement(raw) if raw is not None else None
        logs.bind(cluster=placed)
        worker = self.registry.get(placed) if placed else None
        action = decisions.decide(raw, self._worker_state(placed, worker, key), time.time(),
                                  self.settings)
        if action.release and worker is not None:
            worker.capacity.release(key)
        log.debug("TrainJob %s/%s: %s", namespace, name, action.name)
        self._perform(action, key, raw, worker)

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
                for per_job in (self.eligible_since, self.excluded, self.remote_changed_at,
                                self.last_sync_lag):
                    per_job.pop(key, None)
            case decisions.Ignore():
                return
            case decisions.InSync():
                # Nothing waits to be mirrored (e.g. written before a restart).
                self.remote_changed_at.pop(key, None)
            case decisions.Place():
                self._place(raw)
            case decisions.CreateRemote():
                job = TrainJob.model_validate(raw)
                problem, need = self._eligibility(job, worker)
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
                self._write_status(raw, status, mirrored=True)
            case decisions.RemoveFinalizer():
                self._remove_finalizer(raw)
            case decisions.Unplace():
                self._clear_placement(raw)
            case decisions.Replace(reason=reason, message=message):
                self._replace(raw, reason, message)
            case decisions.MarkUnreachable(message=message, since=since, wait=wait):
                self._set_condition(raw, {
                    "type": CONDITION_WORKER_REACHABLE, "status": "False",
                    "reason": REASON_WORKER_UNREACHABLE, "message": message,
                    "lastTransitionTime": decisions.format_time(since)})
                self.recorder.event(raw, WARNING, REASON_WORKER_UNREACHABLE, message)
                raise Requeue(wait, "waiting for the worker-lost timeout")
            case decisions.MarkRemoved(message=message):
                log.warning("TrainJob %s/%s: %s", *key, message)
                self._set_condition(raw, {
                    "type": CONDITION_WORKER_REACHABLE, "status": "False",
                    "reason": decisions.REASON_WORKER_REMOVED, "message": message,
                    "lastTransitionTime": _now()})
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

    def _set_condition(self, raw: dict, condition: dict) -> None:
        """Write ``condition`` over the one of its type, keeping the rest of the status."""
        status = raw.get("status") or {}
        conditions = [x for x in status.get("conditions") or []
                      if x.get("type") != condition["type"]] + [condition]
        self._write_status(raw, {**status, "conditions": conditions})

    def _replace(self, raw: dict, reason: str, why: str) -> None:
        """Forget the placement so the job is placed again (on any eligible worker). The
        status the old copy reported goes too: it described a run that is over, and the
        new copy's status replaces it as soon as there is one."""
        message = f"{why}; placing the job again"
        log.warning("TrainJob %s/%s: %s", *self._key(raw), message)
        self._write_status(raw, {"conditions": [{
            "type": CONDITION_PLACED, "status": "False", "reason": reason,
            "message": message, "lastTransitionTime": _now()}]})
        self.recorder.event(raw, WARNING, reason, message)
        self._clear_placement(self.trainjobs.get(*self._key(raw)) or raw)

    # --- placement --------------------------------------------------------------------

    def _place(self, raw: dict) -> None:
        meta = raw["metadata"]
        key = (meta["namespace"], meta["name"])
        self.eligible_since.setdefault(key, time.monotonic())
        job = TrainJob.model_validate(raw)
        # Decide and reserve under one lock: concurrent placements must each see the
        # reservations of the others, or a burst piles onto the same worker.
        with self._placement_lock:
            decision = self._decide(job)
            if not isinstance(decision, str):
                worker, need = decision
                worker.capacity.reserve(key, need.requests, need.pods)
        if isinstance(decision, str):
            self._pending(raw, decision)  # outside the lock: it writes to the API
            return
        patch = {"metadata": {
            "resourceVersion": meta["resourceVersion"],
            "annotations": {c.PLACEMENT_ANNOTATION: worker.name},
            "finalizers": sorted(set(meta.get("finalizers") or []) | {c.DISPATCH_FINALIZER}),
        }}
        try:
            written = self.custom.patch_namespaced_custom_object(
                c.TRAINER_GROUP, c.TRAINER_VERSION, meta["namespace"], c.TRAINJOBS,
                meta["name"], patch, field_manager=FIELD_MANAGER, _content_type="application/merge-patch+json")
        except BaseException:
            worker.capacity.release(key)  # not placed after all (e.g. 409: changed meanwhile)
            raise
        self.trainjobs.observe(written)
        logs.bind(cluster=worker.name)
        self.metrics.manager_writes.labels(kind="placement").inc()
        self.recorder.event(raw, NORMAL, "Placed", f"placed on worker cluster {worker.name}")
        log.info("TrainJob %s/%s placed on %s", *key, worker.name)
        self._create_remote(written, worker, need)

    def _decide(self, job: TrainJob) -> tuple[WorkerCluster, Need] | str:
        """The worker to place on and the job's needs there, or why nothing fits."""
        candidates, needs = [], {}
        workers = {worker.name: worker for worker in self.registry.snapshot()}
        for worker in workers.values():
            problem, need = self._eligibility(job, worker)
            if need is not None:
                needs[worker.name] = need
            free = worker.capacity.free(need.node_selector, need.tolerations) if need else {}
            candidates.append(Candidate(worker.name, worker.order, free, problem))
        if not candidates:
            return "no worker cluster is registered"
        # Needs can differ per worker (each has its own copy of the runtime); evaluate
        # each candidate against its own.
        fitting: dict[str, Candidate] = {}
        reasons: dict[str, str] = {}
        for candidate in candidates:
            need = needs.get(candidate.name)
            result = place_trainjob(need.requests if need else {}, need.pods if need else 0,
                                    [candidate], self.policy)
            if result.cluster:
                fitting[candidate.name] = candidate
                continue
            reasons.update(result.reasons)
            if need is not None and candidate.problem is None:
                # Say which rule keeps Nodes out, not only what the rest lack.
                rules = workers[candidate.name].capacity.excluded_by_rules(
                    need.node_selector, need.tolerations)
                if rules:
                    reasons[candidate.name] += f" ({rules})"
        if not fitting:
            return describe_reasons(reasons)
        log.debug("TrainJob %s/%s candidates: %s", job.metadata.namespace, job.metadata.name,
                  {cand.name: cand.problem or {k: str(v) for k, v in cand.free.items()}
                   for cand in candidates})
        # Needs differ between workers only when their runtimes differ; rank by the largest.
        chosen = self.policy.choose(_largest(needs[n].requests for n in fitting),
                                    list(fitting.values())) or next(iter(fitting))
        worker = self.registry.get(chosen)
        return (worker, needs[chosen]) if worker is not None else f"{chosen}: just removed"

    def _eligibility(self, job: TrainJob, worker: WorkerCluster) -> tuple[str | None, Need | None]:
        if not worker.active:
            return f"not connected ({worker.reason}: {worker.message})", None
        namespace, name = job.metadata.namespace or "", job.metadata.name
        generation, why = self.excluded.get((namespace, name), {}).get(worker.name, (0, ""))
        if why and generation in (None, job.metadata.generation):
            return why, None
        worker_namespace = worker.cache("namespaces").get("", namespace)
        if worker_namespace is None:
            return f"namespace {namespace} not found", None
        if worker_namespace["metadata"].get("deletionTimestamp"):
            return f"namespace {namespace} is being deleted", None
        ref = job.spec.runtime_ref
        if ref.kind == c.TRAININGRUNTIME_KIND:
            runtime = worker.cache(c.TRAININGRUNTIMES).get(namespace, ref.name)
        else:
            runtime = worker.cache(c.CLUSTERTRAININGRUNTIMES).get("", ref.name)
        if runtime is None:
            return f"{ref.kind} {ref.name} not found", None
        try:
            info = build_runtime_info(job, TrainingRuntime.model_validate(runtime))
        except Exception as err:  # noqa: BLE001 - a broken runtime excludes this worker only
            return f"runtime {ref.name} unusable: {err}", None
        trainers = info.by_role(c.ROLE_TRAINER) or info.pod_sets
        pod_spec = trainers[0].pod_spec if trainers else {}
        totals = info.totals
        return None, Need(totals.requests, totals.pods, pod_spec.get("nodeSelector"),
                          pod_spec.get("tolerations"))

    def _pending(self, raw: dict, message: str) -> None:
        conditions = [x for x in (raw.get("status") or {}).get("conditions") or []
                      if x.get("type") != CONDITION_PLACED]
        current = next((x for x in (raw.get("status") or {}).get("conditions") or []
                        if x.get("type") == CONDITION_PLACED), None)
        # Free amounts move with every pod and placement elsewhere; rewriting each pending
        # job (and emitting an Event) for a changed number would be a write storm. Only a
        # changed reason is written; the numbers shown are those of the last such change.
        if current and current.get("status") == "False" and \
                _shape(current.get("message", "")) == _shape(message):
            return
        conditions.append({"type": CONDITION_PLACED, "status": "False",
                           "reason": REASON_NO_WORKER, "message": message,
                           "lastTransitionTime": _now()})
        status = {**(raw.get("status") or {}), "conditions": conditions}
        self._write_status(raw, status)
        self.recorder.event(raw, WARNING, REASON_NO_WORKER, message)
        log.info("TrainJob %s/%s pending: %s", raw["metadata"]["namespace"],
                 raw["metadata"]["name"], message)

    # --- the remote copy --------------------------------------------------------------

    def _create_remote(self, manager: dict, worker: WorkerCluster, need: Need) -> None:
        key = self._key(manager)
        outcome = self._copies(worker).create(
            manager, {k: format_quantity(v) for k, v in need.requests.items()}, need.pods)
        match outcome:
            case remote.Created(copy=created):
                worker.cache(c.TRAINJOBS).observe(created)
            case remote.NamespaceGoing():
                # Placement sees that in the worker's namespace cache next round.
                raise Requeue(1.0, f"namespace {key[0]} is being deleted on {worker.name}")
            case remote.Refused(message=message):
                # Retrying the same spec there cannot help: place elsewhere, until the
                # spec changes (a new generation).
                self._exclude(manager, worker, manager["metadata"].get("generation"),
                              f"refused the copy: {message}", "RemoteRejected")
                return
            case remote.NameTaken():
                self._exclude(manager, worker, None,
                              f"TrainJob {key[0]}/{key[1]} exists there and is not a copy "
                              "made by this dispatcher", decisions.REASON_NAME_TAKEN)
                return
            case remote.Stale():
                raise Requeue(decisions.STALE_COPY_RETRY,
                              "stale remote copy of an earlier job being deleted")
        started = self.eligible_since.pop(key, None)
        if started is not None:
            self.metrics.dispatch_latency.observe(time.monotonic() - started)

    def _copies(self, worker: WorkerCluster) -> remote.RemoteCopies:
        return remote.RemoteCopies(worker.api, worker.name, self.config.origin, self.metrics)

    def _exclude(self, manager: dict, worker: WorkerCluster, generation: int | None,
                 why: str, reason: str) -> None:
        """Take ``worker`` out of this job's candidates (``generation`` None: for good) and
        undo the placement, so the next round places it elsewhere or says why it waits."""
        meta = manager["metadata"]
        key = (meta["namespace"], meta["name"])
        self.excluded.setdefault(key, {})[worker.name] = (generation, why)
        self.recorder.event(manager, WARNING, reason,
                            f"worker {worker.name}: {why}; placing elsewhere")
        log.warning("TrainJob %s/%s: worker %s %s", *key, worker.name, why)
        worker.capacity.release(key)
        self._clear_placement(manager)

    def _write_status(self, manager: dict, status: dict, mirrored: bool = False) -> None:
        """Replace the manager's whole status; on a conflict re-read and try again."""
        meta = manager["metadata"]
        body = copy.deepcopy(manager)
        for attempt in range(5):
            body["status"] = status
            try:
                written = self.custom.replace_namespaced_custom_object_status(
                    c.TRAINER_GROUP, c.TRAINER_VERSION, meta["namespace"], c.TRAINJOBS,
                    meta["name"], body, field_manager=FIELD_MANAGER)
                self.trainjobs.observe(written)
                self.metrics.manager_writes.labels(kind="status").inc()
                changed_at = self.remote_changed_at.pop((meta["namespace"], meta["name"]), None)
                if mirrored and changed_at is not None:
                    lag = time.monotonic() - changed_at
                    self.metrics.sync_lag.observe(lag)
                    self.last_sync_lag[(meta["namespace"], meta["name"])] = lag
                return
            except ApiException as err:
                if err.status != 409:
                    raise
                body = self.custom.get_namespaced_custom_object(
                    c.TRAINER_GROUP, c.TRAINER_VERSION, meta["namespace"], c.TRAINJOBS,
                    meta["name"])
                if body["metadata"].get("uid") != meta.get("uid"):
                    return  # a different object now: its own reconcile will handle it
        raise Requeue(0.5, "status write kept conflicting")

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
            written = self.custom.patch_namespaced_custom_object(
                c.TRAINER_GROUP, c.TRAINER_VERSION, meta["namespace"], c.TRAINJOBS,
                meta["name"], patch, field_manager=FIELD_MANAGER, _content_type="application/merge-patch+json")
        except ApiException as err:
            if err.status == 404:
                return
            raise
        self.trainjobs.observe(written)
        self.metrics.manager_writes.labels(kind=kind).inc()


def _largest(requests_list) -> dict[str, Decimal]:
    merged: dict[str, Decimal] = {}
    for requests in requests_list:
        for resource, amount in requests.items():
            merged[resource] = max(merged.get(resource, Decimal(0)), amount)
    return merged


def _shape(message: str) -> str:
    """A pending message with its amounts blanked out."""
    return re.sub(r"\d+(\.\d+)?[A-Za-z]*", "#", message)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

