"""The metrics every controller process exposes under the names controller-runtime and
client-go give them, so dashboards and alerts written for Go controllers work unchanged:
work queues (``workqueue_*``), reconciles (``controller_runtime_*``), API requests
(``rest_client_*``) and leader election (``leader_election_master_status``).

Each process keeps them on one registry (``process_registry``) that also carries the
Python process, platform and garbage-collector collectors. The registry is the process's,
not prometheus_client's global one, so several controllers can run in one test process.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

# Upstream's buckets, so histograms aggregate with those of Go controllers.
# client-go work queues: prometheus.ExponentialBuckets(10e-9, 10, 12).
WORKQUEUE_BUCKETS = (1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1.0, 10.0, 100.0, 1000.0)
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45,
                     0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0,
                     4.5, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 60)
REST_CLIENT_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)

# controller_runtime_reconcile_total's results.
SUCCESS, ERROR, REQUEUE, REQUEUE_AFTER = "success", "error", "requeue", "requeue_after"
RESULTS = (SUCCESS, ERROR, REQUEUE, REQUEUE_AFTER)
# client-go's code label for a request that got no HTTP answer.
NO_ANSWER = "<error>"


def children(metric):
    """``metric.labels`` remembered per label values: the lookup checks and converts every
    value under a lock, and the hot paths (each API request, each reconcile step) ask for
    the same few children again and again. Label sets here are few and bounded."""
    return functools.lru_cache(maxsize=None)(metric.labels)


def process_registry() -> CollectorRegistry:
    """A registry for one process's metrics, already holding ``process_*`` (CPU, memory,
    open files), ``python_info`` and ``python_gc_*``."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


@dataclass(frozen=True)
class ApiRequest:
    """One request a Kubernetes API client made, as its observer sees it."""

    verb: str  # the HTTP method: GET (watches too), POST, PUT, PATCH, DELETE
    host: str  # the apiserver's host:port
    status: int | None  # the HTTP status; None when no answer came back
    seconds: float  # from sending the request to the response's headers
    waited: float | None = None  # time spent in the client's rate limiter; None without one


class ControllerMetrics:
    """The controller-runtime and client-go metric families on ``registry``. ``queue``,
    ``reconciles`` and ``leader`` hand out the instruments of one queue, controller or
    Lease; ``observe_request`` is an API client's request observer."""

    def __init__(self, registry: CollectorRegistry):
        queue_labels = ["name", "controller"]
        self._depth = Gauge("workqueue_depth", "Current depth of workqueue by workqueue and "
                            "priority", queue_labels + ["priority"], registry=registry)
        self._adds = Counter("workqueue_adds_total", "Total number of adds handled by "
                             "workqueue", queue_labels, registry=registry)
        self._queue_duration = Histogram(
            "workqueue_queue_duration_seconds", "How long in seconds an item stays in "
            "workqueue before being requested", queue_labels, registry=registry,
            buckets=WORKQUEUE_BUCKETS)
        self._work_duration = Histogram(
            "workqueue_work_duration_seconds", "How long in seconds processing an item from "
            "workqueue takes.", queue_labels, registry=registry, buckets=WORKQUEUE_BUCKETS)
        self._unfinished = Gauge(
            "workqueue_unfinished_work_seconds", "How many seconds of work has been done that "
            "is in progress and hasn't been observed by work_duration. Large values indicate "
            "stuck threads.", queue_labels, registry=registry)
        self._longest = Gauge(
            "workqueue_longest_running_processor_seconds", "How many seconds has the longest "
            "running processor for workqueue been running.", queue_labels, registry=registry)
        self._retries = Counter(
            "workqueue_retries_total", "Total number of items added to the workqueue with a "
            "delay (rate-limited requeues and requeues after a time)", queue_labels,
            registry=registry)

        self._reconciles = Counter(
            "controller_runtime_reconcile_total", "Total number of reconciliations per "
            "controller", ["controller", "result"], registry=registry)
        self._reconcile_errors = Counter(
            "controller_runtime_reconcile_errors_total", "Total number of reconciliation "
            "errors per controller", ["controller"], registry=registry)
        self._reconcile_time = Histogram(
            "controller_runtime_reconcile_time_seconds", "Length of time per reconciliation "
            "per controller", ["controller"], registry=registry, buckets=RECONCILE_BUCKETS)
        self._active_workers = Gauge(
            "controller_runtime_active_workers", "Number of currently used workers per "
            "controller", ["controller"], registry=registry)
        self._max_concurrent = Gauge(
            "controller_runtime_max_concurrent_reconciles", "Maximum number of concurrent "
            "reconciles per controller", ["controller"], registry=registry)

        self._requests = Counter(
            "rest_client_requests_total", "Number of HTTP requests, partitioned by status "
            "code, method, and host.", ["code", "method", "host"], registry=registry)
        self._request_duration = Histogram(
            "rest_client_request_duration_seconds", "Request latency in seconds. Broken down "
            "by verb and host.", ["verb", "host"], registry=registry,
            buckets=REST_CLIENT_BUCKETS)
        self._rate_limiter_duration = Histogram(
            "rest_client_rate_limiter_duration_seconds", "Client side rate limiter latency in "
            "seconds. Broken down by verb, and host.", ["verb", "host"], registry=registry,
            buckets=REST_CLIENT_BUCKETS)
        self._request_child = children(self._requests)
        self._duration_child = children(self._request_duration)
        self._limiter_child = children(self._rate_limiter_duration)

        self._leader = Gauge(
            "leader_election_master_status", "Gauge of if the reporting system is master of "
            "the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string "
            "used to identify the lease. Please make sure to group by name.", ["name"],
            registry=registry)

    def queue(self, name: str) -> QueueMetrics:
        """The instruments of the work queue ``name`` (also its ``controller`` label, as
        controller-runtime names a controller's queue after it)."""
        return QueueMetrics(
            depth=self._depth.labels(name, name, ""), adds=self._adds.labels(name, name),
            queue_duration=self._queue_duration.labels(name, name),
            work_duration=self._work_duration.labels(name, name),
            unfinished=self._unfinished.labels(name, name),
            longest=self._longest.labels(name, name), retries=self._retries.labels(name, name))

    def reconciles(self, controller: str) -> ReconcileMetrics:
        """The instruments of the controller ``controller``; its series exist (at 0) from
        here on, as controller-runtime's do once a controller starts."""
        return ReconcileMetrics(
            {result: self._reconciles.labels(controller, result) for result in RESULTS},
            self._reconcile_errors.labels(controller), self._reconcile_time.labels(controller),
            self._active_workers.labels(controller), self._max_concurrent.labels(controller))

    def leader(self, lease: str) -> LeaderMetric:
        """The leadership gauge of the Lease named ``lease``, at 0 until a term begins."""
        return LeaderMetric(self._leader.labels(lease))

    def observe_request(self, request: ApiRequest) -> None:
        """Count one API request: a request observer for ``controller_kit.kubeclient``."""
        code = NO_ANSWER if request.status is None else str(request.status)
        self._request_child(code, request.verb, request.host).inc()
        self._duration_child(request.verb, request.host).observe(request.seconds)
        if request.waited is not None:
            self._limiter_child(request.verb, request.host).observe(request.waited)


class QueueMetrics:
    """What one work queue reports, with client-go's meaning: a key counts as added when
    it becomes due and is not already waiting (``added``), leaves the queue when a worker
    takes it (``taken``) and is finished at ``done``. Processing times in progress are
    computed when /metrics is read."""

    def __init__(self, *, depth, adds, queue_duration, work_duration, unfinished, longest,
                 retries):
        self._depth, self._adds, self._retries = depth, adds, retries
        self._queue_duration, self._work_duration = queue_duration, work_duration
        self._lock = threading.Lock()
        self._added_at: dict[Hashable, float] = {}
        self._started_at: dict[Hashable, float] = {}
        unfinished.set_function(self.unfinished_work_seconds)
        longest.set_function(self.longest_running_processor_seconds)

    def added(self, key: Hashable) -> None:
        self._adds.inc()
        self._depth.inc()
        with self._lock:
            self._added_at.setdefault(key, time.monotonic())

    def taken(self, key: Hashable) -> float | None:
        """A worker took ``key``: returns how long it waited in the queue (None: not known)."""
        self._depth.dec()
        now = time.monotonic()
        with self._lock:
            self._started_at[key] = now
            added = self._added_at.pop(key, None)
        if added is None:
            return None
        self._queue_duration.observe(now - added)
        return now - added

    def done(self, key: Hashable) -> None:
        with self._lock:
            started = self._started_at.pop(key, None)
        if started is not None:
            self._work_duration.observe(time.monotonic() - started)

    def retried(self) -> None:
        self._retries.inc()

    def unfinished_work_seconds(self) -> float:
        """Seconds of processing so far of every key still being processed."""
        now = time.monotonic()
        with self._lock:
            return sum(now - started for started in self._started_at.values())

    def longest_running_processor_seconds(self) -> float:
        """Seconds the key processed longest so far has been processed (0 when none is)."""
        now = time.monotonic()
        with self._lock:
            return max((now - started for started in self._started_at.values()), default=0.0)


class ReconcileMetrics:
    """What one controller's reconcile workers report."""

    def __init__(self, total: dict, errors, seconds, active, max_concurrent):
        self._total, self._errors, self._seconds = total, errors, seconds
        self.active, self.max_concurrent = active, max_concurrent

    def finished(self, result: str, seconds: float) -> None:
        """One reconcile ended with ``result`` (one of ``RESULTS``) after ``seconds``."""
        # Its time first: a scrape that sees the reconcile counted sees its time too.
        self._seconds.observe(seconds)
        if result == ERROR:
            self._errors.inc()
        self._total[result].inc()


class LeaderMetric:
    """1 while this process leads on its Lease, else 0."""

    def __init__(self, gauge):
        self._gauge = gauge
        gauge.set(0)

    def leading(self, yes: bool) -> None:
        self._gauge.set(1 if yes else 0)
