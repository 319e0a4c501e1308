"""The dispatcher's reconciler for one manager TrainJob.

Level-triggered: every call reads the manager object and the remote copy from caches and
moves one step towards the desired state. The order of writes makes it crash-safe:

1. placement: the chosen worker and our finalizer go onto the manager object in one
   request, guarded by its resourceVersion (a second dispatcher or a stale cache loses
   with 409 instead of placing twice);
2. the remote copy is created (POST; 409 means it exists: adopted when it carries our
   origin and the manager's UID);
3. remote status changes are copied onto the manager (the whole ``.status``, PUT with the
   resourceVersion; on 409 re-read and retry, never overwrite blindly);
4. teardown (deletion, suspension, finish) deletes the remote first and releases the
   finalizer/placement after it is gone.
"""

from __future__ import annotations

import calendar
import copy
import logging
import re
import threading
import time
from dataclasses import dataclass
from decimal import Decimal
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dispatcher import mirror
from dispatcher.config import DispatcherConfig
from dispatcher.metrics import DispatcherMetrics
from dispatcher.placement import POLICIES, Candidate, describe_reasons, place_trainjob
from dispatcher.registry import WorkerCluster, WorkerRegistry
from trainjob import constants as c
from trainjob import logs
from trainjob.api import TrainingRuntime, TrainJob
from trainjob.events import NORMAL, WARNING, EventRecorder
from trainjob.informer import Informer
from trainjob.kubeclient import error_message, namespace_terminating
from trainjob.runtime import build_runtime_info
from trainjob.runtime.podsets import format_quantity
from trainjob.service import Requeue

log = logging.getLogger(__name__)

FIELD_MANAGER = "trainjob-dispatcher"

CONDITION_PLACED = "Placed"
REASON_NO_WORKER = "NoWorkerFits"
REASON_REMOTE_DELETED = "RemoteDeleted"
CONDITION_WORKER_REACHABLE = "WorkerReachable"
REASON_WORKER_UNREACHABLE = "WorkerUnreachable"
REASON_WORKER_LOST = "WorkerLost"
# A worker's answers to a create that mean "not this spec, not here": bad request,
# forbidden (an admission webhook's default denial, or RBAC), invalid.
REFUSALS = (400, 403, 422)


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
        if raw is None:
            for per_job in (self.eligible_since, self.excluded, self.remote_changed_at,
                            self.last_sync_lag):
                per_job.pop(key, None)
            return  # remote copies of deleted jobs are the garbage collector's business
        spec = raw.get("spec") or {}
        if spec.get("managedBy") != c.MANAGED_BY_MULTIKUEUE:
            return  # never ours: not written, annotated or finalized
        meta = raw["metadata"]
        placed = (meta.get("annotations") or {}).get(c.PLACEMENT_ANNOTATION)
        logs.bind(cluster=placed)
        worker = self.registry.get(placed) if placed else None
        if meta.get("deletionTimestamp"):
            self._teardown(raw, worker, release_placement=False)
            return
        if spec.get("suspend"):
            if placed:
                self._teardown(raw, worker, release_placement=True)
            return
        if not placed:
            if not mirror.finished(raw):
                self._place(raw)
            return
        if worker is None:
            if not mirror.finished(raw):
                self._move_away(raw, placed, f"worker {placed} was removed from the registry")
            return
        if not worker.active:
            self._worker_unreachable(raw, worker)
            return
        self._sync(raw, worker)

    # --- a worker that stopped answering ----------------------------------------------

    def _worker_unreachable(self, raw: dict, worker: WorkerCluster) -> None:
        """Keep the last status and say so; after the worker-lost timeout, place the job
        again elsewhere. A copy left on the lost worker is removed by the garbage
        collector once it answers again (if it was only partitioned, that copy may have
        kept running until then)."""
        if mirror.finished(raw):
            return
        lost_for = time.time() - worker.since
        timeout = self.config.worker_lost_timeout_seconds
        if lost_for >= timeout:
            worker.capacity.release((raw["metadata"]["namespace"], raw["metadata"]["name"]))
            self._move_away(raw, worker.name, f"worker {worker.name} unreachable for "
                            f"{lost_for:.0f}s (worker-lost timeout {timeout:.0f}s)")
            return
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(worker.since))
        message = f"worker {worker.name} unreachable since {since}: {worker.message}"
        current = next((x for x in (raw.get("status") or {}).get("conditions") or []
                        if x.get("type") == CONDITION_WORKER_REACHABLE), None)
        if current is None or current.get("status") != "False":
            conditions = [x for x in (raw.get("status") or {}).get("conditions") or []
                          if x.get("type") != CONDITION_WORKER_REACHABLE]
            conditions.append({"type": CONDITION_WORKER_REACHABLE, "status": "False",
                               "reason": REASON_WORKER_UNREACHABLE, "message": message,
                               "lastTransitionTime": since})
            self._write_status(raw, {**(raw.get("status") or {}), "conditions": conditions})
            self.recorder.event(raw, WARNING, REASON_WORKER_UNREACHABLE, message)
        raise Requeue(timeout - lost_for, "waiting for the worker-lost timeout")

    def _move_away(self, raw: dict, worker_name: str, why: str) -> None:
        self._replace(raw, REASON_WORKER_LOST, why)

    def _replace(self, raw: dict, reason: str, why: str) -> None:
        """Forget the placement so the job is placed again (on any eligible worker). The
        status the old copy reported goes too: it described a run that is over, and the
        new copy's status replaces it as soon as there is one."""
        message = f"{why}; placing the job again"
        log.warning("TrainJob %s/%s: %s", raw["metadata"]["namespace"],
                    raw["metadata"]["name"], message)
        self._write_status(raw, {"conditions": [{
            "type": CONDITION_PLACED, "status": "False", "reason": reason,
            "message": message, "lastTransitionTime": _now()}]})
        self.recorder.event(raw, WARNING, reason, message)
        key = (raw["metadata"]["namespace"], raw["metadata"]["name"])
        self._clear_placement(self.trainjobs.get(*key) or raw)

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
        meta = manager["metadata"]
        key = (meta["namespace"], meta["name"])
        body = mirror.build_remote(manager, self.config.origin,
                                   {k: format_quantity(v) for k, v in need.requests.items()},
                                   need.pods)
        remote_api = client.CustomObjectsApi(worker.api)
        try:
            created = remote_api.create_namespaced_custom_object(
                c.TRAINER_GROUP, c.TRAINER_VERSION, meta["namespace"], c.TRAINJOBS, body,
                field_manager=FIELD_MANAGER)
            worker.cache(c.TRAINJOBS).observe(created)
            self.metrics.worker_writes.labels(cluster=worker.name, kind="create").inc()
        except ApiException as err:
            if namespace_terminating(err):
                # Not a verdict on the spec: the namespace is going away there. Placement
                # sees that in the worker's namespace cache next round.
                raise Requeue(1.0, f"namespace {meta['namespace']} is being deleted on "
                                   f"{worker.name}") from None
            if err.status in REFUSALS:
                # The worker will not take this spec (its admission webhook or schema):
                # retrying the same spec there cannot help. Say why and place elsewhere.
                why = f"refused the copy: {error_message(err)}"
                self._exclude(manager, worker, meta.get("generation"), why, "RemoteRejected")
                return
            if err.status != 409:
                raise
            existing = remote_api.get_namespaced_custom_object(
                c.TRAINER_GROUP, c.TRAINER_VERSION, meta["namespace"], c.TRAINJOBS, meta["name"])
            if not mirror.is_ours(existing, self.config.origin):
                # Someone else's object: never touched; this job goes elsewhere.
                self._exclude(manager, worker, None,
                              f"TrainJob {key[0]}/{key[1]} exists there without our origin "
                              "label", "NameTaken")
                return
            if not mirror.mirrors(existing, manager):
                # A copy of an earlier same-named job: ours to remove; recreate next round.
                self._delete_remote(worker, existing)
                raise Requeue(0.2, "stale remote copy of an earlier job being deleted")
            worker.cache(c.TRAINJOBS).observe(existing)  # adopted
        started = self.eligible_since.pop(key, None)
        if started is not None:
            self.metrics.dispatch_latency.observe(time.monotonic() - started)

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

    def _delete_remote(self, worker: WorkerCluster, remote: dict) -> None:
        meta = remote["metadata"]
        try:
            client.CustomObjectsApi(worker.api).delete_namespaced_custom_object(
                c.TRAINER_GROUP, c.TRAINER_VERSION, meta["namespace"], c.TRAINJOBS,
                meta["name"], propagation_policy="Background",
                # Only this very object: a same-named one created meanwhile is not touched.
                body=client.V1DeleteOptions(preconditions=client.V1Preconditions(
                    uid=meta["uid"])))
            self.metrics.worker_writes.labels(cluster=worker.name, kind="delete").inc()
        except ApiException as err:
            if err.status not in (404, 409):
                raise

    # --- steady state -----------------------------------------------------------------

    def _sync(self, manager: dict, worker: WorkerCluster) -> None:
        meta = manager["metadata"]
        key = (meta["namespace"], meta["name"])
        remote = worker.cache(c.TRAINJOBS).get(*key)
        if remote is not None and not mirror.mirrors(remote, manager):
            self._delete_remote(worker, remote)
            remote = None
            raise Requeue(0.2, "stale remote copy of an earlier job being deleted")
        if remote is None:
            if mirror.finished(manager):
                worker.capacity.release(key)
                if c.DISPATCH_FINALIZER in (meta.get("finalizers") or []):
                    self._remove_finalizer(manager)
                return
            if (manager.get("status") or {}).get("conditions") and not _only_ours(manager):
                # It had reported status, so it existed: someone deleted it while running.
                worker.capacity.release(key)
                self._replace(manager, REASON_REMOTE_DELETED,
                              f"the copy on {worker.name} was deleted by someone else")
                return
            job = TrainJob.model_validate(manager)
            problem, need = self._eligibility(job, worker)
            if need is None:
                raise Requeue(1.0, f"cannot create the remote copy on {worker.name}: {problem}")
            self._create_remote(manager, worker, need)
            return
        if mirror.finished(remote):
            worker.capacity.release(key)
        remote_status = remote.get("status") or {}
        manager_status = manager.get("status") or {}
        # The worker answers (we are here): a WorkerReachable=False of ours goes at once,
        # even when the copy has no status yet to replace it with.
        unreachable_shown = any(x.get("type") == CONDITION_WORKER_REACHABLE
                                for x in manager_status.get("conditions") or [])
        if remote_status != manager_status and (remote_status or unreachable_shown):
            self._write_status(manager, remote_status, remote=remote)
            return
        # Already the same (e.g. written before a restart): nothing waits to be mirrored.
        self.remote_changed_at.pop(key, None)
        if mirror.finished(remote) and mirror.finished(manager):
            retention = self.config.retention_seconds
            finished_at = _finished_at(remote)
            wait = retention - (time.time() - finished_at) if finished_at else 0
            if wait > 0:
                raise Requeue(wait, "keeping the finished remote for the retention period")
            self._delete_remote(worker, remote)

    def _write_status(self, manager: dict, status: dict, remote: dict | None = None) -> None:
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
                if remote is not None and changed_at is not None:
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

    # --- teardown ---------------------------------------------------------------------

    def _teardown(self, manager: dict, worker: WorkerCluster | None,
                  release_placement: bool) -> None:
        meta = manager["metadata"]
        key = (meta["namespace"], meta["name"])
        if worker is not None:
            if not worker.active:
                lost_for = time.time() - worker.since
                if lost_for < self.config.worker_lost_timeout_seconds:
                    raise Requeue(min(5.0, self.config.worker_lost_timeout_seconds - lost_for),
                                  f"worker {worker.name} unreachable; remote not deleted yet")
                # Past the worker-lost timeout: let go; the garbage collector removes the
                # copy when the worker returns.
            else:
                remote = worker.cache(c.TRAINJOBS).get(*key)
                if remote is not None and mirror.is_ours(remote, self.config.origin):
                    self._delete_remote(worker, remote)
                    return  # the remote's DELETED event brings us back here
            worker.capacity.release(key)
        if release_placement:
            self._clear_placement(manager)
        elif c.DISPATCH_FINALIZER in (meta.get("finalizers") or []):
            self._remove_finalizer(manager)

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


def _only_ours(manager: dict) -> bool:
    """The manager status holds only the dispatcher's own conditions."""
    conditions = (manager.get("status") or {}).get("conditions") or []
    return all(x.get("type") in (CONDITION_PLACED, CONDITION_WORKER_REACHABLE)
               for x in conditions)


def _finished_at(remote: dict) -> float | None:
    for condition in (remote.get("status") or {}).get("conditions") or []:
        if condition.get("type") in (c.CONDITION_COMPLETE, c.CONDITION_FAILED) and \
                condition.get("status") == "True" and condition.get("lastTransitionTime"):
            try:
                return calendar.timegm(time.strptime(condition["lastTransitionTime"],
                                                     "%Y-%m-%dT%H:%M:%SZ"))
            except ValueError:
                return None
    return None


def _shape(message: str) -> str:
    """A pending message with its amounts blanked out."""
    return re.sub(r"\d+(\.\d+)?[A-Za-z]*", "#", message)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

