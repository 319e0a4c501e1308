"""Running a controller process: signals, the metrics and health listeners, the reconcile
workers (and whether they still take work: liveness), and an orderly stop. Shared by the
dispatcher and the operator commands; what the controller runs, and in which order, is its
``manager.Manager``'s."""

from __future__ import annotations

import datetime
import errno
import faulthandler
import logging
import sys
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kubernetes.client import ApiClient
from prometheus_client import CollectorRegistry

from controller_kit import controller_metrics as results
from controller_kit import logs
from controller_kit.controller_metrics import ReconcileMetrics
from controller_kit.gc_pauses import SWEEP_SECONDS, GcPauses
from controller_kit.kubeclient import ClusterUnusable
from controller_kit.listeners import LIMITS, Listeners
from controller_kit.metrics_auth import EndpointMetrics, MetricsAuthorizer, review_client
from controller_kit.observability import Check, ObservabilityServer, Route, address
from controller_kit.serving_certificate import ServingCertificate
from controller_kit.stop_signals import StopSignals
from controller_kit.workqueue import ShutDown, WorkQueue

if TYPE_CHECKING:
    from controller_kit.manager import Manager

log = logging.getLogger(__name__)


class Requeue(Exception):
    """Not an error: look at this key again after ``delay`` seconds."""

    def __init__(self, delay: float, why: str):
        super().__init__(why)
        self.delay = delay


class WorkerHeartbeat:
    """When the reconcile workers of one queue last took a key. Stalled: keys wait in the
    queue and none has been taken since they were first seen waiting. A busy loop takes
    keys (however long the line), an idle one has none waiting: neither is stalled."""

    def __init__(self, queue: WorkQueue, name: str, workers: int,
                 clock: Callable[[], float] = time.monotonic):
        self.queue, self.name, self._clock = queue, name, clock
        self._running = workers
        self._lock = threading.Lock()
        self.last_taken = clock()
        # When the check first saw keys waiting since the last take. Keys leave the queue
        # only when a worker takes them, so keys still waiting at a later check with no take
        # in between are the same keys: they have waited at least that long.
        self._waiting_since: float | None = None

    def took(self) -> None:
        self.last_taken = self._clock()

    def stalled(self) -> tuple[float, int]:
        """(seconds no worker has taken a key while keys waited, how many wait now)."""
        waiting = len(self.queue)
        now = self._clock()
        with self._lock:
            if waiting == 0:
                self._waiting_since = None
                return 0.0, 0
            if self._waiting_since is None or self._waiting_since < self.last_taken:
                self._waiting_since = now
            return now - max(self._waiting_since, self.last_taken), waiting

    def worker_stopped(self) -> bool:
        """One worker ended with the queue (not from a failure); True for the last."""
        with self._lock:
            self._running -= 1
            return self._running <= 0


# The process's reconcile workers (one process runs one controller: they are all its own),
# while they run; /healthz asks them (``liveness``).
_heartbeats: set[WorkerHeartbeat] = set()
_heartbeats_lock = threading.Lock()


def liveness(stall_timeout: float) -> Check:
    """The /healthz check: fails once any queue of the process's reconcile workers has had
    keys waiting for more than ``stall_timeout`` seconds with no worker taking one (0:
    never fails). A stuck loop is for the kubelet to restart; a slow one is not stuck."""
    def check() -> tuple[bool, str]:
        if stall_timeout <= 0:
            return True, "ok"
        with _heartbeats_lock:
            beats = sorted(_heartbeats, key=lambda beat: beat.name)
        for beat in beats:
            seconds, waiting = beat.stalled()
            if seconds > stall_timeout:
                return False, (f"reconcile workers of {beat.name} stuck: {waiting} keys "
                               f"queued and none taken for {seconds:.0f} s (more than "
                               f"--liveness-stall-timeout {stall_timeout:g} s)")
        return True, "ok"
    return check


# How long a stop may take before the stacks of every thread are written to stderr.
STOP_REPORT_SECONDS = 20.0


def start_workers(queue: WorkQueue, reconcile: Callable[..., None], count: int, name: str,
                  on_error: Callable[[Hashable, Exception, bool, float], None],
                  observe: Callable[[float], None] | None = None,
                  metrics: ReconcileMetrics | None = None) -> list[threading.Thread]:
    """``count`` threads taking keys from ``queue`` and calling ``reconcile(*key)``. A
    failure is retried with per-key backoff, never dropped; ``on_error(key, err, first,
    delay)`` is told (``first`` once per streak of failures). Each reconcile's duration goes
    to ``observe``, and its result and duration to ``metrics``. Each key taken is a
    heartbeat for the process's liveness until the queue shuts down."""
    if metrics is not None:
        metrics.max_concurrent.set(count)
    heartbeat = WorkerHeartbeat(queue, name, count)
    with _heartbeats_lock:
        _heartbeats.add(heartbeat)

    def work() -> None:
        while True:
            try:
                key = queue.get()
            except ShutDown:
                if heartbeat.worker_stopped():
                    with _heartbeats_lock:
                        _heartbeats.discard(heartbeat)
                return
            heartbeat.took()
            if metrics is not None:
                metrics.active.inc()
            started = time.perf_counter()
            result = results.SUCCESS
            namespace, name = key if isinstance(key, tuple) and len(key) == 2 else ("", key)
            try:
                with logs.context(namespace=namespace, name=name):
                    try:
                        reconcile(*key)
                        queue.forget(key)
                    except Requeue as again:
                        result = results.REQUEUE_AFTER if again.delay > 0 else results.REQUEUE
                        queue.add_after(key, again.delay)
                    except Exception as err:  # noqa: BLE001 - must not kill a worker
                        result = results.ERROR
                        first = queue.failures(key) == 0
                        on_error(key, err, first, queue.add_rate_limited(key))
            finally:
                elapsed = time.perf_counter() - started
                if observe is not None:
                    observe(elapsed)
                if metrics is not None:
                    metrics.finished(result, elapsed)
                    metrics.active.dec()
                queue.done(key)

    threads = [threading.Thread(target=work, name=f"{name}-{i}", daemon=True)
               for i in range(count)]
    for thread in threads:
        thread.start()
    return threads


class ListenError(OSError):
    """A server could not listen; the message names the address and the flag to change."""

    def __init__(self, what: str, host: str, port: int, flag: str, err: OSError):
        reason = err.strerror or str(err)
        hint = (f"another process listens there; choose another port with {flag}"
                if err.errno == errno.EADDRINUSE else f"check {flag}")
        super().__init__(err.errno, f"cannot listen on {address(host, port)} for {what}: "
                                    f"{reason} ({hint})")


@dataclass(frozen=True)
class RoutesListener:
    """A listener of their own for a process's extra routes (what they are, for messages;
    where; the flag that sets the port)."""

    what: str
    host: str
    port: int
    flag: str


def _listen(what: str, host: str, port: int, flag: str, **server) -> ObservabilityServer:
    try:
        return ObservabilityServer(port, host=host, **server).start()
    except OSError as err:
        raise ListenError(what, host, port, flag, err) from err


class _Listener:
    """One of the process's listeners as a runnable of its manager: it listens when the
    manager starts it, and the manager watches its serving thread."""

    def __init__(self, what: str, host: str, port: int, flag: str, paths: str = "",
                 **server):
        self.what, self.paths = what, paths  # paths: said with its address once it listens
        self.server: ObservabilityServer | None = None
        self._where = (host, port, flag)
        self._settings = server

    def runnable(self):
        from controller_kit.manager import Runnable  # the manager imports this module

        return Runnable(f"{self.what} listener", start=self._start, stop=self._stop,
                        threads=lambda: [self.server.thread] if self.server else [])

    def _start(self, _seconds_left: float) -> None:
        self.server = _listen(self.what, *self._where, **self._settings)
        if self.paths:
            log.info("%s on %s%s", self.what, self.server.url, self.paths)

    def _stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def _observability(manager: Manager, registry: CollectorRegistry, listeners: Listeners,
                   api: ApiClient | None, routes: dict[str, Route] | None,
                   routes_listener: RoutesListener | None) -> list[_Listener]:
    """The metrics listener (first), the probes' own and the routes' own when they have
    them; not listening yet (each one's start does)."""
    live = liveness(listeners.liveness_stall_timeout_seconds)
    shared = routes if routes_listener is None else None
    if listeners.metrics_secure and shared:
        raise ValueError("routes: the dashboard is never served on the authenticated metrics "
                         "listener; give it a listener of its own")
    planned: list[_Listener] = []
    if listeners.metrics_secure:
        if api is None:
            raise ValueError("secure metrics need the API client whose apiserver "
                             "authenticates their callers")
        certificate = ServingCertificate(
            listeners.metrics_cert_dir,
            validity=datetime.timedelta(seconds=listeners.metrics_cert_validity_seconds))
        certificate.context()  # a missing or broken pair fails here, not per scrape
        counted = EndpointMetrics(registry)
        # Anyone who reaches the port may send tokens: they are checked through a client
        # of their own, with a budget of its own, so that a flood of them never takes
        # the controller's requests' place (nor its client's rate limit).
        authorizer = MetricsAuthorizer(review_client(api, listeners.metrics_auth_qps),
                                       metrics=counted)
        planned.append(_Listener(
            "secure metrics", listeners.metrics_host, listeners.metrics_port,
            "--metrics-port", registry=registry, ready=None, tls=certificate.context,
            authorize=authorizer.decide, limits=LIMITS,
            on_drop=lambda reason: counted.connections_dropped.labels(reason).inc()))
        log.info("metrics served over HTTPS with %s; every request is authenticated "
                 "(TokenReview) and authorized (SubjectAccessReview), at most %g new "
                 "tokens a second", certificate.describe(), listeners.metrics_auth_qps)
    else:
        what = "metrics" if listeners.probes_apart else "metrics and health"
        planned.append(_Listener(what + (" and the dashboard" if shared else ""),
                                 listeners.metrics_host, listeners.metrics_port,
                                 "--metrics-port", registry=registry,
                                 ready=None if listeners.probes_apart else manager.ready,
                                 live=live, routes=shared))
    if listeners.probes_apart:
        assert listeners.health_probe_host is not None
        assert listeners.health_probe_port is not None
        planned.append(_Listener("health probes", listeners.health_probe_host,
                                 listeners.health_probe_port, "--health-probe-port",
                                 "/healthz and /readyz", registry=None, ready=manager.ready,
                                 live=live))
    if routes and routes_listener is not None:
        listener = routes_listener
        planned.append(_Listener(listener.what, listener.host, listener.port, listener.flag,
                                 "/", registry=None, ready=None, routes=routes))
    return planned


def serve(name: str, manager: Manager, registry: CollectorRegistry,
          listeners: Listeners, api: ApiClient | None = None,
          routes: dict[str, Route] | None = None,
          routes_listener: RoutesListener | None = None,
          gc_sweep_seconds: float = SWEEP_SECONDS) -> int:
    """Serve metrics and health where ``listeners`` say (secure metrics are authenticated
    against ``api``'s apiserver), and ``routes`` (beside plain metrics, or on
    ``routes_listener``): the listeners are the first runnables of ``manager`` (probes
    answer while the caches sync; they stop last), so the manager starts, watches and stops
    them with the rest. Run until SIGINT/SIGTERM or until the manager's ``stop_requested``
    is set otherwise (a lost lease, a runnable that died), then stop everything in reverse
    order; the interpreter's frozen objects are swept every ``gc_sweep_seconds`` (0: never;
    controller_kit/gc_pauses.py). Returns the exit code (1 when the manager says the stop
    was a failure, e.g. lost leadership or a runnable that died)."""
    stop = manager.stop_requested
    with StopSignals(name, stop):
        # Before the caches fill: they are most of what a full collection would walk, again
        # and again (controller_kit/gc_pauses.py).
        collector = GcPauses(registry, gc_sweep_seconds).install()
        try:
            planned = _observability(manager, registry, listeners, api, routes, routes_listener)
            manager.add_first([listener.runnable() for listener in planned])
            manager.start()
            # The caches have synced (reconciles may have begun): freeze what they hold.
            collector.sweep()
            metrics = planned[0].server
            if metrics is not None:  # None: a stop asked for while starting
                log.info("%s running; metrics on %s/metrics%s", name, metrics.url,
                         " (authenticated)" if listeners.metrics_secure else "")
            stop.wait()
        except ListenError as err:
            print(f"error: {err.strerror}", file=sys.stderr)
            return 1
        except (OSError, TimeoutError, ClusterUnusable) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        finally:
            # A stop that hangs says where: every thread's stack on stderr, before the
            # kubelet's default 30 s grace ends in SIGKILL.
            faulthandler.dump_traceback_later(STOP_REPORT_SECONDS)
            try:
                manager.stop()
            finally:
                faulthandler.cancel_dump_traceback_later()
            collector.uninstall()
    if manager.failed():
        log.error("%s stopped after a failure%s", name,
                  f" ({manager.death})" if manager.death else "")
        return 1
    log.info("%s stopped", name)
    return 0
