"""The dispatcher's Prometheus metrics: its own, and the controller-runtime ones
(``controller_kit.controller_metrics``), on the one registry the process serves."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from controller_kit import step_timing
from controller_kit.controller_metrics import (
    ApiRequest,
    ControllerMetrics,
    children,
    process_registry,
)
from dispatcher.job_state import job_state
from dispatcher.room.capacity import WorkerCapacity
from trainjob import constants as c
from trainjob import managed_by

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# A Pod change is counted in microseconds unless a placement holds its worker's room; 5 ms
# is a bucket's edge, so the share within it is exact.
_APPLY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                  0.25, 1)

# Controller names (the ``controller`` and work queue ``name`` labels): standalone mode
# reconciles manager TrainJobs, Kueue mode nominates workers for Workloads.
DISPATCH_CONTROLLER = "trainjob-dispatcher"
NOMINATION_CONTROLLER = "workload-nominator"


class DispatcherMetrics:
    def __init__(self) -> None:
        self.registry = process_registry()
        self.controllers = ControllerMetrics(self.registry)
        self.dispatch_latency = Histogram(
            "dispatcher_dispatch_latency_seconds",
            "From a manager TrainJob becoming eligible to its remote copy existing",
            registry=self.registry, buckets=_LATENCY_BUCKETS)
        self.sync_lag = Histogram(
            "dispatcher_status_sync_lag_seconds",
            "From a remote status change being observed to the manager status written",
            registry=self.registry, buckets=_LATENCY_BUCKETS)
        self.manager_writes = Counter(
            "dispatcher_manager_writes_total", "Writes to manager TrainJobs", ["kind"],
            registry=self.registry)
        self.worker_writes = Counter(
            "dispatcher_worker_writes_total", "Writes to remote TrainJobs",
            ["cluster", "kind"], registry=self.registry)
        self.reconcile_errors = Counter(
            "dispatcher_reconcile_errors_total", "Reconciles that failed and were retried",
            registry=self.registry)
        self.cluster_active = Gauge(
            "dispatcher_cluster_active", "1 when the worker cluster answers", ["cluster"],
            registry=self.registry)
        self.gc_deletions = Counter(
            "dispatcher_gc_deletions_total", "Remote copies removed by garbage collection",
            ["cluster"], registry=self.registry)
        self.nominations = Counter(
            "dispatcher_nominations_total", "Kueue mode: workers nominated for Workloads",
            ["cluster"], registry=self.registry)
        self.nomination_timeouts = Counter(
            "dispatcher_nomination_timeouts_total",
            "Kueue mode: nominated workers that did not admit within the admission timeout",
            registry=self.registry)
        self.reconcile_steps = step_timing.histogram(
            self.registry, "dispatcher_reconcile_step_seconds",
            "Time of each step of a reconcile, by the action it performed (Place, "
            "CopyStatus, ...): queue wait, decide, place, patch, create, write; wall time "
            "and the reconciling thread's CPU time")
        self.api_requests = Counter(
            "dispatcher_api_requests_total", "API requests by cluster, verb and HTTP code",
            ["cluster", "verb", "code"], registry=self.registry)
        self.worker_events = Counter(
            "dispatcher_worker_events_total",
            "Occurrences of workers' Warning Events about the jobs running there, by what "
            "became of them "
            "on the manager: mirrored (counted in a manager Event of their own), limited "
            "(over a job's limit of new Events a minute: counted in its WorkerEventsLimited "
            "Event), dropped (the manager refused the Event)", ["cluster", "outcome"],
            registry=self.registry)
        self.capacity_event_apply = Histogram(
            "dispatcher_capacity_event_apply_seconds",
            "From a worker's Pod event reaching the capacity handler to its change counted "
            "in the room placement reads (it waits while a placement holds that worker's "
            "room); changes only, every worker", registry=self.registry,
            buckets=_APPLY_BUCKETS)
        self.capacity_event_handler = Histogram(
            "dispatcher_capacity_event_handler_seconds",
            "A worker's Pod event in the capacity handler, for the events that change "
            "the room: what the informer's thread waits (it never waits for a placement)",
            registry=self.registry, buckets=_APPLY_BUCKETS)
        WorkerCapacity.pod_event_applied = self.capacity_event_apply.observe
        WorkerCapacity.pod_event_handled = self.capacity_event_handler.observe

    def observer(self, cluster: str):
        """A request observer for one cluster's client: dispatcher_api_requests_total by
        cluster, and the rest_client_* metrics by apiserver address."""
        counter, controllers = children(self.api_requests), self.controllers

        def observe(request: ApiRequest) -> None:
            code = "error" if request.status is None else str(request.status)
            counter(cluster, request.verb, code).inc()
            controllers.observe_request(request)

        return observe

    def count_events(self, queued) -> None:
        """Publish, at scrape time, how many Events wait to be written (``queued()``): a
        burst leaves a backlog that drains after the jobs are placed."""
        Gauge("dispatcher_events_queued", "Kubernetes Events waiting to be written",
              registry=self.registry).set_function(queued)

    def count_jobs(self, jobs) -> None:
        """Publish, at scrape time, manager TrainJobs by state and cluster, computed from
        ``jobs()`` (the dispatcher's cache)."""
        self.registry.register(_JobsCollector(jobs))

    def count_capacity(self, workers) -> None:
        """Publish, at scrape time, each worker's room by resource (and in Kueue mode its
        ClusterQueues' quota left), computed from ``workers()`` (the registry's workers and
        their caches): a worker that leaves takes its series with it."""
        self.registry.register(_CapacityCollector(workers))

    def count_relists(self, informers) -> None:
        """Publish, at scrape time, how often each cache listed again after a lost watch
        or an expired history, from ``informers()``: (cluster, resource, informer) each.
        Until such a list ends, that cache's changes wait: a lag's tail may be one."""
        self.registry.register(_RelistCollector(informers))


class _RelistCollector:
    def __init__(self, informers):
        self._informers = informers

    def collect(self):
        family = CounterMetricFamily(
            "dispatcher_cache_relists", "Lists of a cache after its first: a lost watch or "
            "an expired watch history", labels=["cluster", "resource"])
        for cluster, resource, informer in self._informers():
            # ``relists`` counts the first list too.
            family.add_metric([cluster, resource], max(0, informer.relists - 1))
        yield family


class _JobsCollector:
    def __init__(self, jobs):
        self._jobs = jobs

    def collect(self):
        family = GaugeMetricFamily("dispatcher_jobs", "Manager TrainJobs by state and cluster",
                                   labels=["state", "cluster"])
        counts: dict[tuple[str, str], int] = {}
        for job in self._jobs():
            if not managed_by.dispatched(job):
                continue
            state = job_state(job).split(" ")[0]
            cluster = (job["metadata"].get("annotations") or {}).get(c.PLACEMENT_ANNOTATION, "")
            counts[(state, cluster)] = counts.get((state, cluster), 0) + 1
        for (state, cluster), count in sorted(counts.items()):
            family.add_metric([state, cluster], count)
        yield family


class _CapacityCollector:
    """``dispatcher_worker_capacity`` from the same totals the dashboard draws
    (``WorkerCapacity.by_resource``), ``dispatcher_worker_quota_free`` from the same rows
    (``WorkerQuota.by_cluster_queue``): one walk over each worker's Nodes per scrape."""

    def __init__(self, workers):
        self._workers = workers

    def collect(self):
        capacity = GaugeMetricFamily(
            "dispatcher_worker_capacity",
            "Worker room by resource the Nodes report: allocatable (usable Nodes), used "
            "(bound pods), reserved (placed jobs whose pods are not bound yet), free; cores "
            "for cpu, bytes for memory, devices for extended resources",
            labels=["cluster", "resource", "state"])
        quota = GaugeMetricFamily(
            "dispatcher_worker_quota_free",
            "Kueue mode: quota left in each worker ClusterQueue by flavor and resource, less "
            "nominations not reserved there yet (absent where the quota sets no limit)",
            labels=["cluster", "cluster_queue", "flavor", "resource"])
        synced = GaugeMetricFamily(
            "dispatcher_worker_cache_sync_seconds",
            "Seconds from connecting to a worker to the first complete list of every cache "
            "of it (Nodes, Pods, TrainJobs, runtimes, namespaces)", labels=["cluster"])
        cached = GaugeMetricFamily(
            "dispatcher_worker_cached_objects",
            "Objects of each resource cached for a worker", labels=["cluster", "resource"])
        event_namespaces = GaugeMetricFamily(
            "dispatcher_worker_event_namespaces",
            "Worker namespaces whose Warning Events are read for the mirror, by how: watch "
            "(at most worker_event_watches), list (every worker_event_list_seconds: over "
            "that limit, or the last copy went lately)", labels=["cluster", "read"])
        over_limit = GaugeMetricFamily(
            "dispatcher_worker_event_namespaces_over_limit",
            "Worker namespaces with copies whose Warning Events are listed, not watched: "
            "more namespaces hold copies than worker_event_watches", labels=["cluster"])
        for worker in self._workers():
            if worker.warnings is not None:
                watched, listed, over = worker.warnings.counts()
                event_namespaces.add_metric([worker.name, "watch"], watched)
                event_namespaces.add_metric([worker.name, "list"], listed)
                over_limit.add_metric([worker.name], over)
            if worker.cache_sync_seconds is not None:
                synced.add_metric([worker.name], worker.cache_sync_seconds)
            for resource, informer in worker.informers.items():
                cached.add_metric([worker.name, resource], len(informer))
            for resource, amounts in worker.capacity.by_resource().items():
                for state, amount in amounts.items():
                    capacity.add_metric([worker.name, resource, state], float(amount))
            queues = worker.quota.by_cluster_queue() if worker.quota is not None else {}
            for cluster_queue, rows in ({} if isinstance(queues, str) else queues).items():
                for row in rows:
                    if row.free is not None:
                        quota.add_metric([worker.name, cluster_queue, row.flavor,
                                          row.resource], float(row.free))
        yield capacity
        yield quota
        yield synced
        yield cached
        yield event_namespaces
        yield over_limit
