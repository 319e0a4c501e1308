"""Wiring of the operator: informers feed a work queue, workers run the reconciler.

Watched: TrainJobs (the subject), JobSets (status comes from them), TrainingRuntimes and
ClusterTrainingRuntimes (a job waiting for a missing runtime starts when it appears).
"""

from __future__ import annotations

import functools
import logging
import threading
import time

from kubernetes import client

from training_operator.metrics import OperatorMetrics
from training_operator.reconciler import Caches, TrainJobReconciler
from training_operator.webhook import CacheLookups
from trainjob import constants as c, required_apis, runtime_ref
from trainjob.events import EventRecorder
from trainjob.informer import Informer
from trainjob.kubeclient import describe_error
from trainjob.runtime.extension_points import Plugin
from trainjob.runtime.plugins import registered
from trainjob.managed_by import managed_by, operator_manages
from trainjob.service import start_workers
from trainjob.workqueue import WorkQueue

log = logging.getLogger(__name__)


def _custom_list(api: client.ApiClient, group: str, version: str, plural: str,
                 namespace: str | None):
    custom = client.CustomObjectsApi(api)
    if namespace:
        return functools.partial(custom.list_namespaced_custom_object, group, version,
                                 namespace, plural)
    return functools.partial(custom.list_cluster_custom_object, group, version, plural)


class OperatorController:
    def __init__(self, api: client.ApiClient, namespace: str | None = None, workers: int = 4,
                 metrics: OperatorMetrics | None = None, instance: str = "",
                 extra_plugins: list[Plugin] | None = None):
        self.api = api
        self.namespace = namespace
        self.metrics = metrics or OperatorMetrics()
        self.queue = WorkQueue()
        self.trainjobs = Informer("trainjobs", _custom_list(
            api, c.TRAINER_GROUP, c.TRAINER_VERSION, c.TRAINJOBS, namespace))
        self.jobsets = Informer("jobsets", _custom_list(
            api, c.JOBSET_GROUP, c.JOBSET_VERSION, c.JOBSETS, namespace))
        self.runtimes = Informer("trainingruntimes", _custom_list(
            api, c.TRAINER_GROUP, c.TRAINER_VERSION, c.TRAININGRUNTIMES, namespace))
        self.cluster_runtimes = Informer("clustertrainingruntimes", _custom_list(
            api, c.TRAINER_GROUP, c.TRAINER_VERSION, c.CLUSTERTRAININGRUNTIMES, None))
        self.recorder = EventRecorder(api, "training-operator", instance)
        self.reconciler = TrainJobReconciler(
            api, Caches(self.trainjobs, self.jobsets, self.runtimes, self.cluster_runtimes),
            self.recorder, self.metrics,
            requeue_after=lambda namespace, name, delay: self.queue.add_after(
                (namespace, name), delay),
            plugins=registered() + list(extra_plugins) if extra_plugins else None)
        self._workers = workers
        self._threads: list[threading.Thread] = []
        self.trainjobs.add_handler(self._on_trainjob)
        self.jobsets.add_handler(self._on_jobset)
        self.runtimes.add_handler(self._on_runtime)
        self.cluster_runtimes.add_handler(self._on_runtime)

    @property
    def informers(self) -> list[Informer]:
        return [self.trainjobs, self.jobsets, self.runtimes, self.cluster_runtimes]

    # --- event routing --------------------------------------------------------------

    def _on_trainjob(self, kind: str, old: dict | None, new: dict | None) -> None:
        obj = new or old
        if not operator_manages(managed_by(obj.get("spec"))):
            return  # not ours: not even queued
        meta = obj["metadata"]
        self.queue.add((meta.get("namespace", ""), meta["name"]))

    def _on_jobset(self, kind: str, old: dict | None, new: dict | None) -> None:
        obj = new or old
        for ref in obj["metadata"].get("ownerReferences") or []:
            if ref.get("controller") and ref.get("kind") == c.TRAINJOB_KIND:
                self.queue.add((obj["metadata"].get("namespace", ""), ref["name"]))

    def _on_runtime(self, kind: str, old: dict | None, new: dict | None) -> None:
        changed = runtime_ref.key_of_runtime(new or old)
        for job in self.trainjobs.list():
            try:
                wanted = runtime_ref.runtime_key((job.get("spec") or {}).get("runtimeRef") or {},
                                                 job["metadata"].get("namespace", ""))
            except runtime_ref.UnsupportedRuntimeRef:
                continue
            if wanted == changed:
                self._on_trainjob("MODIFIED", None, job)

    # --- running --------------------------------------------------------------------

    def start(self, sync_timeout: float = 60) -> OperatorController:
        # A missing CRD is named with how to install it, not left to a cache that never syncs.
        required_apis.require(self.api, "worker", [
            required_apis.TRAINJOBS, required_apis.TRAININGRUNTIMES,
            required_apis.CLUSTERTRAININGRUNTIMES, required_apis.JOBSETS])
        for informer in self.informers:
            informer.start()
        deadline = time.monotonic() + sync_timeout
        for informer in self.informers:
            if not informer.wait_synced(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"{informer.name} cache not synced after {sync_timeout}s")
        self._threads = start_workers(self.queue, self.reconciler.reconcile, self._workers,
                                      "reconcile", self._on_error,
                                      self.metrics.reconcile_duration.observe)
        return self

    def lookups(self) -> CacheLookups:
        """What the webhook reads: the operator's caches (no API call per review)."""
        return CacheLookups(self.api, self.namespace, self.jobsets, self.reconciler.caches)

    def observe_trainer_status(self, code: int) -> None:
        self.metrics.trainer_status_requests.labels(code=str(code)).inc()

    def observe_review(self, seconds: float, allowed: bool, reason: str) -> None:
        self.metrics.webhook_duration.observe(seconds)
        if not allowed:
            self.metrics.webhook_rejections.labels(reason=reason or "unknown").inc()

    def ready(self) -> tuple[bool, str]:
        missing = [i.name for i in self.informers if not i.synced.is_set()]
        return (not missing, "ok" if not missing else f"caches not synced: {', '.join(missing)}")

    def stop(self) -> None:
        self.queue.shutdown()
        for informer in self.informers:
            informer.stop()
        for thread in self._threads:
            thread.join(5)

    def _on_error(self, key, err: Exception, first: bool, delay: float) -> None:
        self.metrics.reconcile_errors.inc()
        why = describe_error(err)
        log.warning("TrainJob %s/%s: reconcile failed (%s); retry in %.2fs",
                    key[0], key[1], why, delay)
        job = self.trainjobs.get(*key)
        if first and job is not None:
            # Once per streak of failures: people see it; retries do not spam.
            self.recorder.event(job, "Warning", "ReconcileError",
                                f"reconcile failed, retrying with backoff: {why}")
