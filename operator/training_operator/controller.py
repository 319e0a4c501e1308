"""Wiring of the operator: informers feed a work queue, workers run the reconciler.

Watched: TrainJobs (the subject), JobSets (status comes from them), TrainingRuntimes and
ClusterTrainingRuntimes (a job waiting for a missing runtime starts when it appears).

With leader election (a ``Lease``), several replicas keep warm caches and serve the
admission webhook (which only reads those caches), but only the Lease holder reconciles.
So a rolling update never leaves TrainJob writes without a webhook to answer them, and
never has two reconcilers writing one JobSet. Starting, readiness, leadership and stopping
are the ``controller_kit.manager.Manager``'s: this module says what it runs.
"""

from __future__ import annotations

import functools
import logging
import socket
import uuid

from kubernetes import client

from controller_kit.events import EventRecorder
from controller_kit.informer import Informer
from controller_kit.kubeclient import RateLimitedApiClient
from controller_kit.manager import (
    FailureEvents,
    Lease,
    Manager,
    Runnable,
    cache,
    reconcile_workers,
)
from controller_kit.workqueue import WorkQueue
from training_operator.metrics import CONTROLLER, OperatorMetrics
from training_operator.reconciler import Caches, TrainJobReconciler
from training_operator.webhook import CacheLookups
from trainjob import constants as c
from trainjob import required_apis, runtime_ref
from trainjob.managed_by import managed_by, operator_manages
from trainjob.runtime.extension_points import Plugin
from trainjob.runtime.plugins import registered

log = logging.getLogger(__name__)

LEASE_PREFIX = "training-operator"


def lease_name(namespace: str | None) -> str:
    """The Lease the operators reconciling ``namespace`` (all when None) elect a leader on."""
    return f"{LEASE_PREFIX}-{namespace}" if namespace else LEASE_PREFIX


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
                 extra_plugins: list[Plugin] | None = None,
                 lease: Lease | None = None):
        self.api = api
        self.namespace = namespace
        self.metrics = metrics or OperatorMetrics()
        if isinstance(api, RateLimitedApiClient) and api.observer is None:
            api.observer = self.metrics.controllers.observe_request  # rest_client_*
        self.queue = WorkQueue(metrics=self.metrics.controllers.queue(CONTROLLER))
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
        # None: no webhook in this process; False until it listens (not ready before: the
        # Service would send admission reviews to a Pod that refuses them).
        self.webhook_serving: bool | None = None
        self.trainjobs.add_handler(self._on_trainjob)
        self.jobsets.add_handler(self._on_jobset)
        self.runtimes.add_handler(self._on_runtime)
        self.cluster_runtimes.add_handler(self._on_runtime)
        # What runs, in order: a missing CRD is named with how to install it (not left to a
        # cache that never syncs), the caches, and, on the leader only, the workers.
        self.lifecycle = Manager(
            "operator", api=api, lease=lease,
            identity=f"{instance or socket.gethostname()}-{uuid.uuid4().hex[:8]}",
            leader_metric=self.metrics.controllers.leader(lease.name) if lease else None,
            recorder=self.recorder)
        self.lifecycle.add(Runnable("the worker's APIs", start=lambda _: required_apis.require(
            api, "worker", [required_apis.TRAINJOBS, required_apis.TRAININGRUNTIMES,
                            required_apis.CLUSTERTRAININGRUNTIMES, required_apis.JOBSETS])))
        for informer in self.informers:
            self.lifecycle.add(cache(f"{informer.name} cache", informer))
        self.lifecycle.add_check(lambda: "webhook not serving yet"
                                 if self.webhook_serving is False else None)
        self.lifecycle.add(reconcile_workers(
            "reconcile", self.queue, self.reconciler.reconcile, workers,
            FailureEvents(c.TRAINJOB_KIND, "reconcile", "ReconcileError", self.trainjobs.get,
                          self.recorder, self.metrics.reconcile_errors.inc),
            self.metrics.reconcile_duration.observe,
            self.metrics.controllers.reconciles(CONTROLLER)), leader_only=True)
        # All jobs are added again when a term begins, as a resync (the queue kept every
        # key the informers added meanwhile).
        self.lifecycle.add(Runnable("resync", start=lambda _: self._resync()), leader_only=True)

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

    def _resync(self) -> None:
        for job in self.trainjobs.list():
            self._on_trainjob("SYNC", None, job)

    def lookups(self) -> CacheLookups:
        """What the webhook reads: the operator's caches (no API call per review)."""
        return CacheLookups(self.api, self.namespace, self.jobsets, self.reconciler.caches)

    def observe_trainer_status(self, code: int) -> None:
        self.metrics.trainer_status_requests.labels(code=str(code)).inc()

    def observe_review(self, seconds: float, allowed: bool, reason: str) -> None:
        self.metrics.webhook_duration.observe(seconds)
        if not allowed:
            self.metrics.webhook_rejections.labels(reason=reason or "unknown").inc()
