"""One controller's lifecycle, as controller-runtime's Manager runs its runnables: a
controller registers what it runs, and the manager starts, reports and stops it all the
same way for every controller of the project.

* **Start, in the order registered.** Every replica's runnables first (the caches, then
  what reads them: servers, background loops); the manager waits for each one with a
  ``synced`` check before starting the next, so nothing reads an empty cache. A required
  one that does not sync within the start's timeout fails the start, naming it; one that
  is not required is waited for at most that long. Then, with a ``Lease``, leader
  election: the leader-only runnables (the reconcile workers among them) start when a term
  begins, from warm caches, and a standby keeps its caches warm meanwhile. Without a Lease
  they start at once.
* **Readiness, one text.** ``ready()`` says the first required runnable that is not
  synced, else the first extra check that says no (``add_check``), else the role:
  ``leader``, ``standby (leader: <identity>)``, or ``ok`` without election.
* **Stop, in reverse.** On a stop (a signal sets ``stop_requested``) the leader-only
  runnables stop first (the workers finish their in-flight writes), then the Lease is given
  up, so a standby takes over without overlapping them, then everything else in reverse
  order. A stop asked for while starting ends the start where it is.
* **A lost lease stops the process.** Another replica may lead once the Lease runs out,
  so the leader-only runnables stop at once, and ``stop_requested`` is set: the process
  ends and its supervisor starts it again as a standby (``failed()`` says so).
* **A failure streak is said once** (``FailureEvents``): every failed reconcile is
  logged and counted, and a Warning Event is recorded on the object at the first failure of
  a streak only, so retries with backoff do not flood its Events.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from controller_kit.controller_metrics import LeaderMetric, ReconcileMetrics
from controller_kit.events import EventRecorder
from controller_kit.kubeclient import describe_error
from controller_kit.leader import LeaderElector
from controller_kit.service import start_workers
from controller_kit.workqueue import WorkQueue

log = logging.getLogger(__name__)

# How long the reconcile workers of one queue get, together, to finish what they are
# writing when they are stopped.
WORKERS_STOP_SECONDS = 5.0
# What a leader logs when its term ends without a stop asked for (the test harness waits
# for it).
LOST_LEADERSHIP = "lost leadership: stopping"


def _nothing(*_: Any) -> None:
    return None


@dataclass(frozen=True)
class Runnable:
    """One thing a controller runs. ``start(seconds_left)`` starts it (it may block, at
    most ``seconds_left``, the time left of the manager's start); ``stop()`` stops it.
    ``synced``: the manager waits until it says yes before starting the next runnable, and
    ``ready()`` reports it until then; ``required``: not syncing within the start's timeout
    fails the start (else the wait ends there and readiness leaves it out)."""

    name: str
    start: Callable[[float], Any] = _nothing
    stop: Callable[[], Any] = _nothing
    synced: Callable[[], bool] | None = None
    required: bool = True


def cache(name: str, informer: Any, required: bool = True) -> Runnable:
    """An informer as a runnable: started, waited for until its first list is in (a
    ``controller_kit.informer.Informer``, or anything with its start/stop/synced)."""
    return Runnable(name, start=lambda _: informer.start(), stop=informer.stop,
                    synced=informer.synced.is_set, required=required)


@dataclass(frozen=True)
class Lease:
    """Leader election: the Lease ``namespace/name`` and client-go's three durations."""

    namespace: str
    name: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class FailureEvents:
    """What a failed reconcile leaves: a count, a log line naming the object, why and when
    it is tried again, and, at the first failure of a streak only, a Warning Event on the
    object (``reason``; ``<verb> failed, retrying with backoff: <why>``)."""

    def __init__(self, kind: str, verb: str, reason: str,
                 find: Callable[[str, str], dict | None], recorder: EventRecorder,
                 count: Callable[[], None] = _nothing):
        self.kind, self.verb, self.reason = kind, verb, reason
        self._find, self._recorder, self._count = find, recorder, count

    def __call__(self, key: Hashable, err: Exception, first: bool, delay: float) -> None:
        self._count()
        why = describe_error(err)
        namespace, name = key if isinstance(key, tuple) and len(key) == 2 else ("", key)
        log.warning("%s %s/%s: %s failed (%s); retry in %.2fs", self.kind, namespace, name,
                    self.verb, why, delay)
        obj = self._find(namespace, name) if first else None
        if obj is not None:
            self._recorder.event(obj, "Warning", self.reason,
                                 f"{self.verb} failed, retrying with backoff: {why}")


def reconcile_workers(name: str, queue: WorkQueue, reconcile: Callable[..., None], count: int,
            on_error: Callable[[Hashable, Exception, bool, float], None],
            observe: Callable[[float], None] | None = None,
            metrics: ReconcileMetrics | None = None) -> Runnable:
    """``count`` reconcile workers taking keys from ``queue`` (``service.start_workers``)
    as a runnable. Stopping shuts the queue and waits, at most ``WORKERS_STOP_SECONDS`` in
    all, for the reconciles in flight: their writes finish before the Lease is given up."""
    threads: list[threading.Thread] = []

    def start(_: float) -> None:
        threads[:] = start_workers(queue, reconcile, count, name, on_error, observe, metrics)

    def stop() -> None:
        queue.shutdown()
        deadline = time.monotonic() + WORKERS_STOP_SECONDS
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    return Runnable(f"{name} workers", start=start, stop=stop)


class Manager:
    """Runs a controller's runnables (see the module's docstring). ``stop_requested`` is
    the process's stop: set by a signal, by a lost lease or by a leader-only runnable that
    failed to start."""

    def __init__(self, name: str, *, api: client.ApiClient | None = None,
                 lease: Lease | None = None, identity: str = "",
                 leader_metric: LeaderMetric | None = None,
                 stop_requested: threading.Event | None = None):
        self.name = name
        self.stop_requested = stop_requested or threading.Event()
        self.lost_leadership = threading.Event()
        self._runnables: list[Runnable] = []
        self._leader_only: list[Runnable] = []
        self._checks: list[Callable[[], str | None]] = []
        self._lock = threading.Lock()  # the started lists, between the elector and stop()
        self._started: list[Runnable] = []
        self._leading: list[Runnable] = []
        self._waited: set[str] = set()  # runnables not required that were waited for
        self._running = False  # every replica's runnables are up
        self._term = False  # leader-only runnables started (a term is on, or no election)
        self._stopping = False
        self._failed = False
        self.elector: LeaderElector | None = None
        if lease is not None:
            if api is None:
                raise ValueError("leader election needs the API client of the Lease")
            self.elector = LeaderElector(
                api, lease.namespace, lease.name, identity,
                lease_duration=lease.lease_duration, renew_deadline=lease.renew_deadline,
                retry_period=lease.retry_period, on_started_leading=self._begin_term,
                on_stopped_leading=self._end_term, metric=leader_metric)

    # --- registering --------------------------------------------------------------------

    def add(self, runnable: Runnable, leader_only: bool = False) -> Runnable:
        """Run ``runnable`` on every replica, or only while this one leads."""
        (self._leader_only if leader_only else self._runnables).append(runnable)
        return runnable

    def add_check(self, check: Callable[[], str | None]) -> None:
        """Readiness beyond the caches: ``check()`` says why the process is not ready
        (None: nothing against it)."""
        self._checks.append(check)

    # --- what it says -------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        """Whether this replica may write now: it leads, or runs without election and has
        started its workers."""
        return self.elector.is_leader if self.elector is not None else self._term

    def ready(self) -> tuple[bool, str]:
        """(ready, one text): what is not ready yet, else the role."""
        for runnable in self._runnables:
            if runnable.synced is not None and runnable.required and not runnable.synced():
                return False, f"{runnable.name} not synced"
        for check in self._checks:
            why = check()
            if why:
                return False, why
        if self.elector is None:
            return True, "ok"
        return True, "leader" if self.elector.is_leader else (
            f"standby (leader: {self.elector.leader or 'none yet'})")

    def failed(self) -> bool:
        """Whether the process stops for a failure: a lost lease, or a leader-only
        runnable that could not start."""
        return self.lost_leadership.is_set() or self._failed

    # --- running ------------------------------------------------------------------------

    def start(self, sync_timeout: float = 60) -> Manager:
        """Start every replica's runnables in order, then campaign (or start the
        leader-only ones). Raises what a runnable's start raised, or TimeoutError naming a
        required runnable that did not sync; returns early, quietly, when a stop is asked
        for meanwhile. What started is stopped by ``stop()``."""
        deadline = time.monotonic() + sync_timeout
        for runnable in self._runnables:
            if self.stop_requested.is_set():
                return self
            with self._lock:
                if self._stopping:
                    return self
                self._started.append(runnable)
            runnable.start(max(0.0, deadline - time.monotonic()))
            if runnable.synced is None:
                continue
            if not self._wait_until(runnable.synced, deadline):
                if self.stop_requested.is_set():
                    return self
                if runnable.required:
                    raise TimeoutError(f"{runnable.name} not synced after {sync_timeout:g}s")
                log.warning("%s: %s not synced after %gs; going on without it", self.name,
                            runnable.name, sync_timeout)
        if self.stop_requested.is_set():
            return self
        self._running = True
        if self.elector is not None:
            self.elector.start()
        else:
            self._begin_term()
        return self

    def stop(self) -> None:
        """Stop everything started, in reverse: the leader-only runnables, then the Lease
        (given up unless it was lost: it may be someone else's by now), then the rest."""
        with self._lock:
            self._stopping = True
        self._stop_term()
        if self.elector is not None:
            self.elector.stop(release=not self.lost_leadership.is_set())
        with self._lock:
            started, self._started = self._started, []
        for runnable in reversed(started):
            self._stop_one(runnable)

    def _wait_until(self, condition: Callable[[], bool], deadline: float) -> bool:
        """Whether ``condition`` came true before ``deadline``; a stop request (a signal
        while starting) ends the wait at once."""
        while not condition():
            if self.stop_requested.is_set() or time.monotonic() >= deadline:
                return False
            self.stop_requested.wait(0.05)
        return True

    # --- leadership ---------------------------------------------------------------------

    def _begin_term(self) -> None:
        """Start the leader-only runnables, in order. Never a second time: a process that
        lost a term stops (its queues are shut)."""
        with self._lock:
            if self._stopping or self.lost_leadership.is_set() or self._term:
                return
            self._term = True
        if self.elector is not None:
            log.info("%s leading: starting %s", self.name,
                     ", ".join(r.name for r in self._leader_only) or "nothing")
        for runnable in self._leader_only:
            with self._lock:
                if self._stopping:
                    return
                self._leading.append(runnable)
            try:
                runnable.start(0.0)
            except Exception:
                # A leader that cannot run its workers must not hold the Lease: stop, so
                # that the process is started again (and a standby may lead meanwhile).
                log.exception("%s: %s failed to start; stopping", self.name, runnable.name)
                self._failed = True
                self._stop_term()
                self.stop_requested.set()
                return

    def _end_term(self) -> None:
        """The term ended. Asked to stop: nothing more here (``stop()`` goes on). Else the
        Lease may be another replica's once it runs out: stop writing now, and end the
        process, which its supervisor starts again as a standby."""
        if self._stopping:
            log.info("leadership given up: stopping as asked")
            return
        log.error(LOST_LEADERSHIP)
        self.lost_leadership.set()
        self._stop_term()
        self.stop_requested.set()

    def _stop_term(self) -> None:
        with self._lock:
            leading, self._leading = self._leading, []
        for runnable in reversed(leading):
            self._stop_one(runnable)

    def _stop_one(self, runnable: Runnable) -> None:
        try:
            runnable.stop()
        except Exception:  # the rest must still stop
            log.exception("%s: stopping %s failed", self.name, runnable.name)
