"""Wiring of the operator: informers feed a work queue, workers run the reconciler.

Watched: TrainJobs (the subject), JobSets (status comes from them), TrainingRuntimes and
ClusterTrainingRuntimes (a job waiting for a missing runtime starts when it appears).

With leader election (``LeaseSettings``), several replicas keep warm caches and serve the
admission webhook (which only reads those caches), but only the Lease holder reconciles.
So a rolling update never leaves TrainJob writes without a webhook to answer them, and
never has two reconcilers writing one JobSet.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from kubernetes import client

from controller_kit.events import EventRecorder
from controller_kit.informer import Informer
from controller_kit.kubeclient import RateLimitedApiClient, describe_error
from controller_kit.leader import LeaderElector, stop_writing
from controller_kit.service import start_workers
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


@dataclass(frozen=True)
class LeaseSettings:
    """Leader election: the Lease ``namespace/name`` and client-go's three durations."""

    namespace: str
    name: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


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
                 lease: LeaseSettings | None = None,
                 stop_requested: threading.Event | None = None):
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
        self._workers = workers
        self._threads: list[threading.Thread] = []
        # None: no webhook in this process; False until it listens (not ready before: the
        # Service would send admission reviews to a Pod that refuses them).
        self.webhook_serving: bool | None = None
        self.lost_leadership = threading.Event()
        self.stop_requested = stop_requested
        self._stopping = False
        self.elector = None
        if lease is not None:
            identity = f"{instance or socket.gethostname()}-{uuid.uuid4().hex[:8]}"
            self.elector = LeaderElector(
                api, lease.namespace, lease.name, identity,
                lease_duration=lease.lease_duration, renew_deadline=lease.renew_deadline,
                retry_period=lease.retry_period, on_started_leading=self._started_leading,
                on_stopped_leading=self._stopped_leading,
                metric=self.metrics.controllers.leader(lease.name))
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
        if self.elector is not None:
            self.elector.start()
        else:
            self._started_leading()
        return self

    # --- leadership -------------------------------------------------------------------

    def _started_leading(self) -> None:
        """Only the leader reconciles; it starts from warm caches. (The queue kept every
        key the informers added meanwhile; all jobs are added again all the same, as a
        resync.)"""
        if self.elector is not None:
            log.info("leading: reconciling")
        self._threads = start_workers(self.queue, self.reconciler.reconcile, self._workers,
                                      "reconcile", self._on_error,
                                      self.metrics.reconcile_duration.observe,
                                      self.metrics.controllers.reconciles(CONTROLLER))
        for job in self.trainjobs.list():
            self._on_trainjob("SYNC", None, job)

    def _stopped_leading(self) -> None:
        stop_writing(self._stopping, self.lost_leadership, [self.queue], self.stop_requested)

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
        """Ready once the caches are synced and the webhook (if any) listens, as leader or
        as a standby: a standby's webhook answers as well as the leader's."""
        missing = [i.name for i in self.informers if not i.synced.is_set()]
        if missing:
            return False, f"caches not synced: {', '.join(missing)}"
        if self.webhook_serving is False:
            return False, "webhook not serving yet"
        if self.elector is None:
            return True, "ok"
        return True, "leader" if self.elector.is_leader else (
            f"standby (leader: {self.elector.leader or 'none yet'})")

    def stop(self) -> None:
        self._stopping = True
        self.queue.shutdown()
        for thread in self._threads:
            thread.join(5)  # finish in-flight writes before the Lease is given up
        if self.elector is not None:
            self.elector.stop(release=not self.lost_leadership.is_set())
        for informer in self.informers:
            informer.stop()

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
