"""The TrainJob reconciler: read the world from caches, compute the desired JobSet and
status, apply only the difference. Level-triggered and idempotent: any number of calls
with the same world writes at most once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from controller_kit.events import NORMAL, WARNING, EventRecorder
from controller_kit.kubeclient import apply_custom_object, namespace_terminating, refusal_summary
from training_operator import child_objects, deadline, jobset_builder, runtime_snapshot
from training_operator import status as status_mod
from training_operator.metrics import OperatorMetrics
from trainjob import constants as c
from trainjob import runtime_ref
from trainjob.api import TrainingRuntime, TrainJob
from trainjob.runtime import build_runtime_info
from trainjob.runtime.extension_points import Plugin

log = logging.getLogger(__name__)

FIELD_MANAGER = "training-operator"


class Cache(Protocol):
    def get(self, namespace: str, name: str) -> dict | None: ...

    def observe(self, obj: dict) -> None: ...


@dataclass
class Caches:
    trainjobs: Cache
    jobsets: Cache
    runtimes: Cache
    cluster_runtimes: Cache

    def runtime(self, kind: str, namespace: str, name: str) -> dict | None:
        """A cached runtime (``runtime_ref.RuntimeGetter``)."""
        if kind == c.TRAININGRUNTIME_KIND:
            return self.runtimes.get(namespace, name)
        return self.cluster_runtimes.get("", name)


class TrainJobReconciler:
    def __init__(self, api: client.ApiClient, caches: Caches, recorder: EventRecorder,
                 metrics: OperatorMetrics,
                 requeue_after: Callable[[str, str, float], None] = lambda *_: None,
                 plugins: list[Plugin] | None = None):
        self.api = api
        # None: the registered plug-ins; the operator adds optional ones (trainer status).
        self.plugins = plugins
        # Nothing in the world changes when a deadline passes: the job is looked at again then.
        self.requeue_after = requeue_after
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.caches = caches
        self.recorder = recorder
        self.metrics = metrics

    def reconcile(self, namespace: str, name: str) -> None:
        """Bring TrainJob ``namespace/name`` and its JobSet to the desired state."""
        raw = self.caches.trainjobs.get(namespace, name)
        if raw is None:
            return  # deleted: the garbage collector removes the JobSet it owned
        try:
            job = TrainJob.model_validate(raw)
        except ValidationError as err:
            log.warning("TrainJob %s/%s: unreadable (%s); skipped", namespace, name, err)
            return
        if not job.managed_by_operator:
            return  # someone else's job: no JobSet, no status, no finalizer, no Event
        if job.metadata.deletion_timestamp or job.finished:
            return
        jobset = self.caches.jobsets.get(namespace, name)
        left = deadline.seconds_left(job, raw)
        if left is not None and left <= 0:
            self._exceed_deadline(job, raw, jobset)
            return
        if left is not None:
            self.requeue_after(namespace, name, left)
        if jobset is not None and not self._owned(jobset, job):
            self._write_status(job, raw, jobset=None, created=status_mod.Transition(
                status_mod.CONDITION_CREATED, "False", status_mod.REASON_BUILD_FAILED,
                f"JobSet {namespace}/{name} exists and is not controlled by this TrainJob"))
            return
        if jobset is not None and self._running(job, jobset):
            # The pods run from the JobSet's current spec; nothing about it may change.
            self._write_status(job, raw, jobset, self._created(job))
            return
        try:
            runtime = self._runtime(job)
        except runtime_snapshot.SnapshotError as err:
            self._write_status(job, raw, jobset, status_mod.Transition(
                status_mod.CONDITION_CREATED, "False", status_mod.REASON_BUILD_FAILED, str(err)))
            return
        except ApiException as err:
            if namespace_terminating(err):
                return  # the TrainJob goes with its namespace; nothing to build
            raise
        if runtime is None:
            ref = job.spec.runtime_ref
            where = f" in namespace {namespace}" if ref.kind == c.TRAININGRUNTIME_KIND else ""
            self._write_status(job, raw, jobset, status_mod.Transition(
                status_mod.CONDITION_CREATED, "False", status_mod.REASON_RUNTIME_NOT_FOUND,
                f"{ref.kind} {ref.name} not found{where} (or not a Trainer runtime); the job "
                "starts when it exists"))
            return
        try:
            info = build_runtime_info(job, runtime, self.plugins)
            desired = jobset_builder.build_jobset(job, info)
        except Exception as err:  # noqa: BLE001 - a bad runtime must not stop the operator
            self._write_status(job, raw, jobset, status_mod.Transition(
                status_mod.CONDITION_CREATED, "False", status_mod.REASON_BUILD_FAILED,
                f"cannot build the JobSet from {job.spec.runtime_ref.kind} "
                f"{job.spec.runtime_ref.name}: {err}"))
            return
        if jobset is None:
            try:
                self._apply_objects(job, info.objects)
                jobset = self._apply(desired)
            except ApiException as err:
                if namespace_terminating(err):
                    return  # the TrainJob goes with its namespace; nothing to build
                raise
            self.metrics.jobsets_created.inc()
        else:
            jobset = self._update_jobset(job, raw, jobset, desired, info.objects)
        # Level-based: whenever our JobSet exists, Created is True (also after a crash
        # between creating the JobSet and writing the status).
        self._write_status(job, raw, jobset, self._created(job))

    # --- pieces ---------------------------------------------------------------------

    @staticmethod
    def _created(job: TrainJob) -> status_mod.Transition:
        return status_mod.Transition(
            status_mod.CONDITION_CREATED, "True", status_mod.REASON_JOBSET_CREATED,
            f"JobSet {job.metadata.namespace}/{job.metadata.name} created")

    @staticmethod
    def _running(job: TrainJob, jobset: dict) -> bool:
        """Neither the job nor its JobSet suspended: the JobSet's spec stays as it is."""
        return not job.spec.suspend and not (jobset.get("spec") or {}).get("suspend")

    @staticmethod
    def _owned(jobset: dict, job: TrainJob) -> bool:
        return any(ref.get("controller") and ref.get("uid") == job.metadata.uid
                   for ref in jobset.get("metadata", {}).get("ownerReferences") or [])

    def _runtime(self, job: TrainJob) -> TrainingRuntime | None:
        """The job's snapshot of its runtime; at the first build, the runtime from the cache,
        snapshotted."""
        raw = runtime_snapshot.read(self.core, job)
        if raw is None:
            try:
                _, raw = runtime_ref.find(job.spec.runtime_ref, job.metadata.namespace or "",
                                          self.caches.runtime)
            except runtime_ref.UnsupportedRuntimeRef:
                return None
            if raw is None:
                return None
            raw = runtime_snapshot.create(self.core, job, raw,
                                          jobset_builder.owner_reference(job))
        return TrainingRuntime.model_validate(raw)

    def _apply(self, desired: dict[str, Any]) -> dict[str, Any]:
        applied = apply_custom_object(self.api, c.JOBSET_GROUP, c.JOBSET_VERSION, c.JOBSETS,
                                      desired, FIELD_MANAGER)
        self.caches.jobsets.observe(applied)
        return applied

    def _update_jobset(self, job: TrainJob, raw: dict, jobset: dict, desired: dict,
                       objects: list) -> dict:
        current_hash = (jobset["metadata"].get("annotations") or {}).get(
            jobset_builder.SPEC_HASH_ANNOTATION)
        wanted_hash = desired["metadata"]["annotations"][jobset_builder.SPEC_HASH_ANNOTATION]
        if current_hash == wanted_hash and bool(jobset["spec"].get("suspend")) == job.spec.suspend:
            return jobset  # a resync: nothing changed
        self._apply_objects(job, objects)
        try:
            return self._apply(desired)
        except ApiException as err:
            if err.status not in (400, 403, 422):
                raise
            # JobSet's own webhook lets a suspended JobSet change only its pods' labels,
            # annotations, nodeSelector, tolerations and scheduling gates. Anything else
            # (an image, a command) cannot reach it: say so on the TrainJob, keep the JobSet.
            self.recorder.event(raw, WARNING, "JobSetUpdateRefused",
                                f"JobSet {job.metadata.namespace}/{job.metadata.name} refused "
                                f"the change: {refusal_summary(err)}")
            return jobset

    def _apply_objects(self, job: TrainJob, objects: list) -> None:
        """The plug-ins' objects beside the JobSet, owned by the job."""
        owner = jobset_builder.owner_reference(job)
        for obj in objects:
            child_objects.write(self.api, obj, owner, FIELD_MANAGER)

    def _exceed_deadline(self, job: TrainJob, raw: dict, jobset: dict | None) -> None:
        """Past ``activeDeadlineSeconds``: the JobSet (and so every pod) goes, and the job
        fails with reason DeadlineExceeded, as upstream does."""
        if jobset is not None and self._owned(jobset, job):
            try:
                self.custom.delete_namespaced_custom_object(
                    c.JOBSET_GROUP, c.JOBSET_VERSION, job.metadata.namespace, c.JOBSETS,
                    job.metadata.name, propagation_policy="Foreground")
            except ApiException as err:
                if err.status != 404:
                    raise
        self._write_status(job, raw, None, status_mod.Transition(
            c.CONDITION_FAILED, "True", deadline.REASON_DEADLINE_EXCEEDED,
            deadline.MESSAGE_DEADLINE_EXCEEDED))

    def _write_status(self, job: TrainJob, raw: dict, jobset: dict | None,
                      created: status_mod.Transition | None) -> None:
        desired, transitions = status_mod.desired_status(job, jobset, created)
        if status_mod.same_status(raw.get("status") or {}, desired):
            return
        try:
            written = self.custom.patch_namespaced_custom_object_status(
                c.TRAINER_GROUP, c.TRAINER_VERSION, job.metadata.namespace, c.TRAINJOBS,
                job.metadata.name, {"status": desired}, field_manager=FIELD_MANAGER,
                _content_type="application/merge-patch+json",
            )
        except ApiException as err:
            if err.status == 404:
                return  # deleted meanwhile: nothing to report on
            raise
        self.caches.trainjobs.observe(written)
        self.metrics.status_writes.inc()
        for transition in transitions:
            self._event_for(raw, transition)

    def _event_for(self, raw: dict, t: status_mod.Transition) -> None:
        warning = (t.type == c.CONDITION_FAILED or (
            t.type == status_mod.CONDITION_CREATED and t.status == "False"))
        reason = {
            (c.CONDITION_SUSPENDED, "True"): "Suspended",
            (c.CONDITION_SUSPENDED, "False"): "Resumed",
            (c.CONDITION_COMPLETE, "True"): "Completed",
            (c.CONDITION_FAILED, "True"): "Failed",
        }.get((t.type, t.status), t.reason)
        self.recorder.event(raw, WARNING if warning else NORMAL, reason, t.message)
