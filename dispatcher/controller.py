"""Wiring of the dispatcher: manager and worker informers feed one work queue of manager
TrainJob keys; workers run the reconciler.

What wakes a job up:
* its manager object changed;
* its remote copy changed (status to sync, or it disappeared);
* capacity or eligibility changed on some worker (Nodes, namespaces, runtimes, a pod gone,
  finished or bound, a remote copy finished or gone, a worker coming back): every job
  still waiting for placement is looked at again;
* room that changes with time, where no event says so: the pods of a job placed a while
  ago stop counting as in flight (capacity's ``ARRIVAL_WINDOW_SECONDS``), looked for every
  ``WAITING_RECHECK_SECONDS``.

What runs, and in which order, is registered with a ``controller_kit.manager.Manager``
(``_register``), which starts it, reports readiness, runs leader election and stops it.
"""

from __future__ import annotations

import datetime
import functools
import logging
import socket
import uuid
from collections.abc import Callable

from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller_kit.events import EventRecorder
from controller_kit.informer import Informer
from controller_kit.manager import (
    FailureEvents,
    Lease,
    Manager,
    Runnable,
    cache,
    reconcile_workers,
    scheduler,
)
from controller_kit.workqueue import WorkQueue
from dispatcher.coalesce import ROOM_WINDOW_SECONDS, Coalesced
from dispatcher.config import DispatcherConfig
from dispatcher.kueue.copy_owners import KueueCopies
from dispatcher.kueue.nominator import WorkloadNominator
from dispatcher.metrics import DISPATCH_CONTROLLER, NOMINATION_CONTROLLER, DispatcherMetrics
from dispatcher.placement.placer import Placer
from dispatcher.placement.priority import PriorityClasses
from dispatcher.remote_view.server import start_remote_view
from dispatcher.room.worker_quota import CLUSTERQUEUES, LOCALQUEUES
from dispatcher.standalone import garbage_collection
from dispatcher.standalone.beside_kueue import KueueOnManager
from dispatcher.standalone.copy_owners import StandaloneCopies
from dispatcher.standalone.job_timing import JobTimings
from dispatcher.standalone.reconciler import DispatchReconciler
from dispatcher.standalone.waiting_order import PlacementOrder
from dispatcher.workers.cluster import RELISTED, WorkerCluster
from dispatcher.workers.registry import WorkerRegistry
from dispatcher.workers.warning_events import EVENTS
from dispatcher.workers.worker_event_mirror import WorkerEventMirror
from trainjob import constants as c
from trainjob import managed_by, required_apis

log = logging.getLogger(__name__)

# What the manager must serve: a missing CRD is named at start, with how to install it.
MANAGER_APIS = [required_apis.TRAINJOBS, required_apis.MULTIKUEUECLUSTERS,
                required_apis.MULTIKUEUECONFIGS]
# How often the workers' capacity is asked whether pods stopped counting as in flight.
WAITING_RECHECK_SECONDS = 10.0
_CAPACITY_RESOURCES = ("nodes", "namespaces", c.TRAININGRUNTIMES, c.CLUSTERTRAININGRUNTIMES,
                       CLUSTERQUEUES, LOCALQUEUES)  # the last two: kueue mode's quota


def _frees_room(kind: str, old: dict | None, new: dict | None) -> bool:
    """A pod event after which a job waiting on a worker may fit there: the pod is gone, or
    it has just finished (a finished pod holds no resources), or it has just been bound (a
    job may wait for the pods of jobs placed before it to bind: capacity's
    ``_order_problem``)."""
    if kind == "DELETED":
        return True
    old_phase, new_phase = (((pod or {}).get("status") or {}).get("phase") for pod in (old, new))
    if new_phase in ("Succeeded", "Failed") and old_phase not in ("Succeeded", "Failed"):
        return True
    return bool(((new or {}).get("spec") or {}).get("nodeName")) and not (
        (old or {}).get("spec") or {}).get("nodeName")


def worker_registry(registry: WorkerRegistry) -> Runnable:
    """The registry as a runnable. Its threads (the manager's caches of registrations,
    the probes' timer, every worker's caches) are asked again each time they are looked
    at: workers come and go, and one removed leaves the list before its threads are
    stopped, so that is no death."""
    return Runnable("worker registry", start=registry.start, stop=registry.stop,
                    threads=registry.threads)


def interval(background: BackgroundScheduler, name: str, job: Callable[[], object],
             seconds: float, says: str = "") -> Runnable:
    """``job`` every ``seconds`` on ``background``, while this runnable runs. A run that
    raises is logged by APScheduler (``Job "<name> (trigger: ...)" raised an exception``,
    with the traceback, at ERROR) and the job runs again at its next time: the job is
    named so that the line says which one."""
    def start(_: float) -> None:
        if says:
            log.info(says)
        background.add_job(job, "interval", seconds=seconds, id=name, name=name,
                           max_instances=1, coalesce=True, replace_existing=True)

    def stop() -> None:
        try:
            background.remove_job(name)
        except JobLookupError:
            pass
    return Runnable(name, start=start, stop=stop)


class DispatcherController:
    def __init__(self, manager: client.ApiClient, config: DispatcherConfig,
                 workers: int = 8, metrics: DispatcherMetrics | None = None,
                 instance: str = ""):
        self.manager = manager
        self.config = config
        self.metrics = metrics or DispatcherMetrics()
        self.queue = WorkQueue()
        self._requeue_standalone = Coalesced(self._requeue_waiting, ROOM_WINDOW_SECONDS)
        custom = client.CustomObjectsApi(manager)
        self.trainjobs = Informer("manager/trainjobs", functools.partial(
            custom.list_cluster_custom_object, c.TRAINER_GROUP, c.TRAINER_VERSION, c.TRAINJOBS))
        self.trainjobs.add_handler(self._on_manager_trainjob)
        self.metrics.count_jobs(self.trainjobs.list)
        self.recorder = EventRecorder(manager, "trainjob-dispatcher", instance)
        self.metrics.count_events(self.recorder.queued)
        self.kueue = KueueOnManager(manager, config.kueue_namespace)
        self.registry = WorkerRegistry(manager, config, self._on_worker_event,
                                       self._on_worker_state, may_write=lambda: self.leading,
                                       observer=self.metrics.observer,
                                       in_use=self._workers_in_use, recorder=self.recorder,
                                       publish_conditions=lambda: not self.kueue.installed())
        self.metrics.count_capacity(self.registry.snapshot)
        self.metrics.count_relists(self._caches)
        # Jobs' cluster selectors match MultiKueueCluster labels: a change of them may let
        # a waiting job go (placed jobs never move for it).
        self.registry.registrations.clusters.add_handler(self._on_multikueuecluster)
        self.placer = Placer(self.registry, config.placement_policy)
        self.timings = JobTimings(self.metrics)
        # Standalone mode orders waiting jobs by the manager's PriorityClasses (Kueue mode
        # leaves order to Kueue). A class created or deleted may reorder the line.
        self.priority_classes = Informer("manager/priorityclasses", client.SchedulingV1Api(
            manager).list_priority_class) if config.mode != "kueue" else None
        if self.priority_classes is not None:
            self.priority_classes.add_handler(lambda *_: self._requeue_pending())
        self.order = PlacementOrder(self.placer, self.registry,
                                    PriorityClasses(self.priority_classes), self._requeue_keys)
        self.reconciler = DispatchReconciler(manager, self.trainjobs, self.registry,
                                             self.placer, self.timings, config, self.recorder,
                                             self.metrics, self.kueue,
                                             queued_for=self.queue.waited, order=self.order)
        # The workers' Warning Events about the jobs running there, shown on the manager's
        # jobs: the dispatcher's copies, or Kueue's (Kueue mode: known by their Workload).
        owners = KueueCopies(config.origin, self.trainjobs.get,
                             lambda: self.nominator.workloads) \
            if config.mode == "kueue" else StandaloneCopies(config.origin, self.trainjobs.get)
        self.worker_events = WorkerEventMirror(
            manager, self.registry, owners, self.metrics,
            may_write=lambda: self.leading, instance=instance) \
            if config.mirror_worker_events else None
        # Kueue mode: Workloads are reconciled instead of TrainJobs (Kueue mirrors them).
        self.nominator = WorkloadNominator(manager, self.registry, self.placer, config,
                                           self.recorder, self.metrics, self.kueue_mode_idle,
                                           trainjob=self.trainjobs.get) \
            if config.mode == "kueue" else None
        # Only the queue whose workers run reports (Kueue mode never works self.queue off).
        if self.nominator is None:
            self.queue.instrument(self.metrics.controllers.queue(DISPATCH_CONTROLLER))
        else:
            self.nominator.queue.instrument(
                self.metrics.controllers.queue(NOMINATION_CONTROLLER))
        # Interval jobs only: UTC spares tzlocal guessing (and warning about) the zone.
        self._scheduler = BackgroundScheduler(daemon=True, timezone=datetime.UTC)
        self.remote_view = None  # dispatcher/remote_view, started with the caches
        lease = Lease(config.namespace, f"trainjob-dispatcher-{config.origin}",
                      config.lease_duration_seconds, config.renew_deadline_seconds,
                      config.retry_period_seconds) if config.leader_elect else None
        self.lifecycle = Manager(
            "dispatcher", api=manager, lease=lease,
            identity=f"{instance or socket.gethostname()}-{uuid.uuid4().hex[:8]}",
            leader_metric=self.metrics.controllers.leader(lease.name) if lease else None,
            recorder=self.recorder)
        self._register(workers)
        # With --remote-api-port, a replica is ready once its remote view can serve: the
        # APIService's Service sends the aggregator to ready replicas only.
        self.lifecycle.add_check(self._remote_view_ready)

    # --- event routing --------------------------------------------------------------

    @staticmethod
    def _ours(obj: dict | None) -> bool:
        return managed_by.dispatched(obj)

    @staticmethod
    def _echo(old: dict | None, new: dict | None) -> bool:
        """The watch delivering a version this process wrote and already put in the cache
        (``Informer.observe``): the reconcile that wrote it acted on it, or was requeued,
        so the event brings nothing new. Skipping it saves a reconcile per write."""
        return old is not None and new is not None and \
            old["metadata"].get("resourceVersion") == new["metadata"].get("resourceVersion")

    def _on_manager_trainjob(self, kind: str, old: dict | None, new: dict | None) -> None:
        obj = new or old
        if self._ours(obj) and not self._echo(old, new):
            if old is None and new is not None and self.config.mode != "kueue" and not (
                    new["metadata"].get("annotations") or {}).get(c.PLACEMENT_ANNOTATION):
                # A job not placed yet: its shapes are scored while it waits for its turn.
                self.placer.warm_ahead(new)
            self.queue.add((obj["metadata"]["namespace"], obj["metadata"]["name"]))

    def _on_worker_event(self, worker_name: str, resource: str, kind: str,
                         old: dict | None, new: dict | None) -> None:
        if resource == EVENTS:
            if self.worker_events is not None:
                self.worker_events.on_event(worker_name, kind, old, new)
            return
        if resource == c.TRAINJOBS:
            if self._echo(old, new):
                return
            obj = new or old
            key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            if new is not None and (old or {}).get("status") != new.get("status"):
                self.timings.remote_changed(key)
            released = self.placer.follow_copy(worker_name, key, kind, new)
            self.queue.add(key)
            if released:
                self._requeue_pending()
        elif resource in _CAPACITY_RESOURCES or kind == RELISTED or (
                resource == "pods" and _frees_room(kind, old, new)):
            self._requeue_pending()

    def _on_multikueuecluster(self, kind: str, old: dict | None, new: dict | None) -> None:
        labels = [((obj or {}).get("metadata") or {}).get("labels") or {} for obj in (old, new)]
        if kind != "DELETED" and labels[0] != labels[1]:
            self._requeue_pending()

    def sync_lag(self, namespace: str, name: str) -> tuple[float | None, float | None]:
        """For the dashboard: see ``JobTimings.sync_lag``."""
        return self.timings.sync_lag(namespace, name)

    def _caches(self) -> list[tuple[str, str, Informer]]:
        """Every cache this process keeps: (cluster, resource, informer)."""
        return [("manager", c.TRAINJOBS, self.trainjobs)] + [
            (worker.name, resource, informer) for worker in self.registry.snapshot()
            for resource, informer in worker.informers.items()]

    def _workers_in_use(self) -> set[str]:
        """Workers that jobs are placed on and may still have copies on: our finalizer
        stays on a job until its copy is gone."""
        return {(job["metadata"].get("annotations") or {}).get(c.PLACEMENT_ANNOTATION)
                for job in self.trainjobs.list()
                if self._ours(job) and c.DISPATCH_FINALIZER in (
                    job["metadata"].get("finalizers") or [])} - {None, ""}

    def _on_worker_state(self, worker: WorkerCluster) -> None:
        self.metrics.cluster_active.labels(cluster=worker.name).set(1 if worker.active else 0)
        for job in self.trainjobs.list():
            if self._ours(job) and (job["metadata"].get("annotations") or {}).get(
                    c.PLACEMENT_ANNOTATION) == worker.name:
                self.queue.add((job["metadata"]["namespace"], job["metadata"]["name"]))
        self._requeue_pending()

    def _requeue_pending(self) -> None:
        """Room may have changed: look again at what waits for it (each mode coalesces
        its own bursts of these)."""
        if self.nominator is not None:
            self.nominator.requeue_waiting()
        else:
            self._requeue_standalone()

    def _recheck_waiting(self) -> None:
        # Every worker is asked (not only up to the first yes): each asking starts its
        # next window.
        passed = [worker.capacity.window_passed() for worker in self.registry.snapshot()]
        if any(passed):
            self._requeue_pending()

    def _requeue_waiting(self) -> None:
        # First in line first: the queue hands keys out in the order they came.
        self._requeue_keys(self.reconciler.waiting_for_room())

    def _requeue_keys(self, keys) -> None:
        for key in keys:
            self.queue.add(key)

    # --- what runs -------------------------------------------------------------------

    def _register(self, workers: int) -> None:
        """What the dispatcher runs, in order: every replica's caches and servers, then,
        while it leads, the workers and what only the leader writes."""
        add = self.lifecycle.add
        # What the manager must serve: a missing CRD is named with how to install it.
        add(Runnable("the manager's APIs", start=lambda _: required_apis.require(
            self.manager, "manager", MANAGER_APIS)))
        # The jobs first: the registry keeps a worker that left it while jobs are placed
        # there (to drain it), so it needs to know where jobs are placed.
        add(cache("manager TrainJob cache", self.trainjobs))
        add(worker_registry(self.registry))
        # Every replica serves the remote view: reads need no leadership.
        add(Runnable("remote view", start=lambda _: self._start_remote_view(),
                     stop=self._stop_remote_view,
                     threads=lambda: [getattr(self.remote_view, "thread", None)]))
        if self.nominator is not None:
            add(Runnable("Workload caches", start=self.nominator.start,
                         stop=self.nominator.stop, threads=self.nominator.threads))
        if self.priority_classes is not None:
            add(Runnable("PriorityClass cache", start=lambda _: self.priority_classes.start(),
                         stop=self.priority_classes.stop,
                         threads=lambda: [self.priority_classes.thread]))
        if self.worker_events is not None:
            add(Runnable("worker Events mirror", start=lambda _: self.worker_events.start(),
                         stop=self.worker_events.stop,
                         threads=lambda: [self.worker_events.thread]))
        # Jobs' pod shapes scored as they are seen, on a thread started when there is some
        # to do and ending when there is none: its ending is no death, its raising is.
        add(Runnable("placer warming ahead", threads=self.placer.threads, may_finish=True))
        # Placement decisions need the workers' caches, so the first decisions are not made
        # against empty pictures: each connected worker's caches synced or failed. A worker
        # that does not answer must not hold up dispatching to the rest (not required).
        # (The PriorityClasses too: the first waiting jobs take their places by them.)
        add(Runnable("worker caches", synced=self._worker_caches_answered, required=False))
        # And a verdict on each from then on: a job decided while a worker's first probe
        # is out would not see that worker (the best fit may be it).
        add(Runnable("worker probes", start=lambda _: self.registry.probe_and_wait(
            self.registry.prober.timeout + 1.0)))
        add(scheduler("scheduler", self._scheduler))
        # Only the leader writes: it starts here, from warm caches.
        add(self._interval("waiting recheck", self._recheck_waiting, WAITING_RECHECK_SECONDS,
                           says="leading: dispatching"), leader_only=True)
        if self.nominator is not None:
            # Kueue mode: Kueue copies, syncs and collects garbage; only nominations here.
            add(reconcile_workers(
                "nominate", self.nominator.queue, self.nominator.reconcile, workers,
                FailureEvents("Workload", "nominate", "NominationError",
                              self._workload_target, self.recorder,
                              self.metrics.reconcile_errors.inc),
                metrics=self.metrics.controllers.reconciles(NOMINATION_CONTROLLER)),
                leader_only=True)
            add(Runnable("first nominations", start=lambda _: self._first_nominations()),
                leader_only=True)
            return
        # The line first, before any reconcile can place a job: see ``restore``.
        add(Runnable("waiting line", start=lambda _: self._restore_line()), leader_only=True)
        add(reconcile_workers(
            "dispatch", self.queue, self.reconciler.reconcile, workers,
            FailureEvents(c.TRAINJOB_KIND, "dispatch", "DispatchError", self.trainjobs.get,
                          self.recorder, self.metrics.reconcile_errors.inc),
            metrics=self.metrics.controllers.reconciles(DISPATCH_CONTROLLER)),
            leader_only=True)
        if self.config.gc_interval_seconds > 0:
            add(self._interval("garbage collection", self.collect_garbage,
                               self.config.gc_interval_seconds), leader_only=True)
        add(Runnable("first pass", start=lambda _: self._first_pass()), leader_only=True)

    def _interval(self, name: str, job, seconds: float, says: str = "") -> Runnable:
        return interval(self._scheduler, name, job, seconds, says)

    def _start_remote_view(self) -> None:
        self.remote_view = start_remote_view(self.manager, self.config, self.trainjobs,
                                             self.registry)

    def _remote_view_ready(self) -> str | None:
        if self.config.remote_api_port is None:
            return None
        return self.remote_view.problem() if self.remote_view is not None else (
            "the remote view is not started yet")

    def _stop_remote_view(self) -> None:
        if self.remote_view is not None:
            self.remote_view.stop()

    def _worker_caches_answered(self) -> bool:
        informers = [informer for worker in self.registry.snapshot()
                     for informer in worker.informers.values()] + (
            [self.priority_classes] if self.priority_classes is not None else [])
        return all(i.synced.is_set() or i.last_error for i in informers)

    def _workload_target(self, namespace: str, name: str) -> dict | None:
        obj = self.nominator.workloads.get(namespace, name)
        return WorkloadNominator._event_target(obj) if obj is not None else None

    def _first_nominations(self) -> None:
        for obj in self.nominator.workloads.list():
            self.nominator.queue.add((obj["metadata"]["namespace"], obj["metadata"]["name"]))
        # What a standby saw of the workers is told now (an Event for one unusable).
        self.registry.publish_all()

    def _restore_line(self) -> None:
        restored = self.order.restore([job for job in self.trainjobs.list() if self._ours(job)])
        if restored:
            log.info("%d waiting jobs back in line, highest priority first", restored)

    def _first_pass(self) -> None:
        self.registry.publish_all()
        self._requeue_keys(self.reconciler.waiting_for_room())
        for job in self.trainjobs.list():
            if self._ours(job):
                self._on_manager_trainjob("SYNC", None, job)

    # --- running --------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        return self.lifecycle.leading

    def ready(self) -> tuple[bool, str]:
        """Ready once the caches are synced (and the remote view can serve, when on), as
        leader or as a warm standby. Kueue mode waiting for Kueue is nothing to fix in this
        process: said after the role (``; idle: <why>``), never a failure, so the replica
        keeps serving what it serves (the remote view among them)."""
        ok, text = self.lifecycle.ready()
        if ok and self.nominator is not None:
            idle, why = self.kueue_mode_idle()
            if idle:
                text = f"{text}; idle: {why}"
        return ok, text

    def kueue_mode_idle(self) -> tuple[bool, str]:
        """Kueue mode waits for Kueue: (True, why) when Kueue does not run on the manager
        or is configured with another dispatcher, so no Workload will wait for this one."""
        if not self.kueue.installed():
            return True, ("Kueue does not run on this manager (the kueue.x-k8s.io/v1beta2 "
                          "Workload API is not served)")
        config = self.kueue.cached_configuration()
        if config.dispatcher_name != self.config.dispatcher_name:
            return True, (f"Kueue's multiKueue.dispatcherName is {config.dispatcher_name} "
                          f"({config.source}), not {self.config.dispatcher_name}: Kueue "
                          "nominates workers itself")
        return False, f"Kueue's external dispatcher {self.config.dispatcher_name}"

    def collect_garbage(self) -> int:
        """One garbage-collection sweep over every connected worker."""
        return garbage_collection.sweep(self.registry, self.trainjobs, self.config.origin,
                                        self.metrics, self._read_trainjob)

    def _read_trainjob(self, namespace: str, name: str) -> dict | None:
        """A manager TrainJob as the API server has it now; None when it is not found."""
        try:
            return client.CustomObjectsApi(self.manager).get_namespaced_custom_object(
                c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS, name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
