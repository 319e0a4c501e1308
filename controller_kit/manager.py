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
* **A runnable that dies ends the process.** A runnable names the threads that do its
  work (``threads``); the manager watches those of every runnable that has started and is
  not being stopped, and its own leader elector's. One that ends while the process runs,
  raising or returning, is the runnable's death: ``ready()`` names it from then on
  (``<name> ended: thread <thread> raised <why>`` or ``... returned``), it is logged with
  its traceback, a Warning Event (``RunnableFailed``) goes on the process's own object
  (its Pod, from the downward API's ``POD_NAME``, ``POD_NAMESPACE`` and ``POD_UID``; none
  without them), and ``stop_requested`` is set as for a lost lease: everything stops in
  order and the process exits non-zero, so its supervisor starts it again whole rather
  than leaving it ready and doing nothing. Only the first death is said (the Event is one
  per process: the death ends it). A runnable without ``threads`` is done when its
  ``start`` returns (a one-shot such as the first pass); one whose threads may finish
  their work and end declares ``may_finish``: its threads' returning is not a death,
  their raising still is.
* **A failure streak is said once** (``FailureEvents``): every failed reconcile is
  logged and counted, and a Warning Event is recorded on the object at the first failure of
  a streak only, so retries with backoff do not flood its Events.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable
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
# The reason of the Warning Event a runnable's death leaves on the process's object.
RUNNABLE_FAILED = "RunnableFailed"
# How often the manager looks whether the threads of its runnables still run.
WATCH_SECONDS = 0.5
# How long a stop after a death waits for its Event to be written (the process ends next).
EVENT_FLUSH_SECONDS = 5.0


def _nothing(*_: Any) -> None:
    return None


@dataclass(frozen=True)
class Runnable:
    """One thing a controller runs. ``start(seconds_left)`` starts it (it may block, at
    most ``seconds_left``, the time left of the manager's start); ``stop()`` stops it.
    ``synced``: the manager waits until it says yes before starting the next runnable, and
    ``ready()`` reports it until then; ``required``: not syncing within the start's timeout
    fails the start (else the wait ends there and readiness leaves it out). ``threads``:
    the threads doing its work once started (asked again each time they are looked at: the
    set may change); one ending before ``stop()`` is the runnable's death, unless it
    returned and ``may_finish`` says its work may end (see the module's docstring)."""

    name: str
    start: Callable[[float], Any] = _nothing
    stop: Callable[[], Any] = _nothing
    synced: Callable[[], bool] | None = None
    required: bool = True
    threads: Callable[[], Iterable[threading.Thread | None]] | None = None
    may_finish: bool = False


def cache(name: str, informer: Any, required: bool = True) -> Runnable:
    """An informer as a runnable: started, waited for until its first list is in (a
    ``controller_kit.informer.Informer``, or anything with its start/stop/synced)."""
    return Runnable(name, start=lambda _: informer.start(), stop=informer.stop,
                    synced=informer.synced.is_set, required=required,
                    threads=lambda: [getattr(informer, "thread", None)])


def scheduler_thread(background: Any) -> threading.Thread | None:
    """The loop thread of an APScheduler ``BackgroundScheduler`` once started (None
    before, and after ``shutdown``): APScheduler 3.x keeps it in ``_thread`` and offers
    no public accessor."""
    return getattr(background, "_thread", None)


def scheduler(name: str, background: Any) -> Runnable:
    """An APScheduler ``BackgroundScheduler`` as a runnable whose loop thread the manager
    watches: a loop that ended would leave its interval jobs never run again, the process
    ready."""
    return Runnable(name, start=lambda _: background.start(),
                    stop=lambda: background.shutdown(wait=False),
                    threads=lambda: [scheduler_thread(background)])


def own_pod() -> dict | None:
    """The process's own Pod as an Event's object, from the downward API's ``POD_NAME``,
    ``POD_NAMESPACE`` and ``POD_UID`` (the manifests set them); None outside a Pod."""
    name, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    if not name or not namespace:
        return None
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "uid": os.environ.get("POD_UID") or None}}


# What killed each thread that died raising: ``threading.excepthook`` is told before the
# thread counts as ended, so the manager finds the exception when it sees the thread gone.
_thread_errors: weakref.WeakKeyDictionary[threading.Thread, BaseException] = (
    weakref.WeakKeyDictionary())
_thread_errors_lock = threading.Lock()


def _record_thread_error(args: threading.ExceptHookArgs, chained: Callable[..., Any]) -> None:
    if args.thread is not None and args.exc_value is not None:
        with _thread_errors_lock:
            _thread_errors[args.thread] = args.exc_value
    chained(args)


def _hear_thread_errors() -> None:
    """Put the recording in front of whatever hook is there (idempotent; again if
    something replaced it meanwhile)."""
    with _thread_errors_lock:
        current = threading.excepthook
        if getattr(current, "records_thread_errors", False):
            return

        def hook(args: threading.ExceptHookArgs) -> None:
            _record_thread_error(args, current)
        hook.records_thread_errors = True  # type: ignore[attr-defined]
        threading.excepthook = hook


def _thread_error(thread: threading.Thread) -> BaseException | None:
    with _thread_errors_lock:
        return _thread_errors.get(thread)


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

    return Runnable(f"{name} workers", start=start, stop=stop, threads=lambda: threads)


class Manager:
    """Runs a controller's runnables (see the module's docstring). ``stop_requested`` is
    the process's stop: set by a signal, by a lost lease, by a leader-only runnable that
    failed to start or by a runnable that died. A death's Warning Event goes through
    ``recorder`` onto ``involved`` (default: ``own_pod()``)."""

    def __init__(self, name: str, *, api: client.ApiClient | None = None,
                 lease: Lease | None = None, identity: str = "",
                 leader_metric: LeaderMetric | None = None,
                 stop_requested: threading.Event | None = None,
                 recorder: EventRecorder | None = None, involved: dict | None = None,
                 watch_seconds: float = WATCH_SECONDS):
        self.name = name
        self._recorder = recorder
        self._involved = involved if involved is not None else own_pod()
        self._watch_seconds = watch_seconds
        self._watched: list[Runnable] = []  # started, not being stopped: their threads
        self._watcher: threading.Thread | None = None
        self._quit = threading.Event()  # stop(): the watcher ends
        self._death: str | None = None  # what ready() says once a runnable died
        self._told = False  # the death's Event is queued (stop() waits for it)
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
            elector = self.elector
            self._election = Runnable("leader election", threads=lambda: [elector.thread])

    # --- registering --------------------------------------------------------------------

    def add(self, runnable: Runnable, leader_only: bool = False) -> Runnable:
        """Run ``runnable`` on every replica, or only while this one leads."""
        (self._leader_only if leader_only else self._runnables).append(runnable)
        return runnable

    def add_first(self, runnables: list[Runnable]) -> None:
        """Run ``runnables`` on every replica before everything added so far (the process's
        listeners: probes answer while the caches sync, and stop last)."""
        self._runnables[:0] = runnables

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
        """(ready, one text): a runnable that died, else what is not ready yet, else the
        role."""
        if self._death is not None:
            return False, self._death
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
        """Whether the process stops for a failure: a lost lease, a leader-only runnable
        that could not start, or a runnable that died."""
        return self.lost_leadership.is_set() or self._failed

    @property
    def death(self) -> str | None:
        """Which runnable died and how (None: none did)."""
        return self._death

    # --- running ------------------------------------------------------------------------

    def start(self, sync_timeout: float = 60) -> Manager:
        """Start every replica's runnables in order, then campaign (or start the
        leader-only ones). Raises what a runnable's start raised, or TimeoutError naming a
        required runnable that did not sync; returns early, quietly, when a stop is asked
        for meanwhile. What started is stopped by ``stop()``."""
        deadline = time.monotonic() + sync_timeout
        self._watch()
        for runnable in self._runnables:
            if self.stop_requested.is_set():
                return self
            with self._lock:
                if self._stopping:
                    return self
                self._started.append(runnable)
            runnable.start(max(0.0, deadline - time.monotonic()))
            self._watching(runnable)
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
            # An elector that fails stops campaigning: a standby would wait forever.
            with self._lock:
                if not self._stopping:
                    self._watched.append(self._election)
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
            self._stop_one(self._election)  # no longer watched: its thread ends now
            self.elector.stop(release=not self.lost_leadership.is_set())
        with self._lock:
            started, self._started = self._started, []
        for runnable in reversed(started):
            self._stop_one(runnable)
        self._quit.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(self._watch_seconds + 1.0)
        if self._told and self._recorder is not None:
            self._recorder.flush(EVENT_FLUSH_SECONDS)  # before the process ends

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
                self._watching(runnable)
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

    # --- deaths -------------------------------------------------------------------------

    def _watch(self) -> None:
        """Start looking after the runnables' threads (once)."""
        if self._watcher is not None:
            return
        _hear_thread_errors()
        self._watcher = threading.Thread(target=self._look_after, daemon=True,
                                         name=f"{self.name}-runnables")
        self._watcher.start()

    def _watching(self, runnable: Runnable) -> None:
        if runnable.threads is None:
            return
        with self._lock:
            if runnable in self._started or runnable in self._leading:
                self._watched.append(runnable)

    def _look_after(self) -> None:
        while not self._quit.wait(self._watch_seconds):
            if self.stop_requested.is_set():
                continue  # ending anyway: what ends now is the stop's doing
            with self._lock:
                watched = list(self._watched)
            for runnable in watched:
                ended = self._ended(runnable)
                if ended is not None:
                    self._died(runnable, *ended)
                    return

    def _ended(self, runnable: Runnable
               ) -> tuple[threading.Thread, BaseException | None] | None:
        """A thread of ``runnable`` that ended when it must not have, and what it raised."""
        try:
            gone = [thread for thread in self._threads(runnable) if not thread.is_alive()]
            if not gone:
                return None
            # Asked again: a thread may have handed its work over to another and ended
            # meanwhile (e.g. one that waited for a certificate, then started a server).
            still = self._threads(runnable)
        except Exception:  # a broken question is not a death
            log.exception("%s: cannot tell whether %s runs", self.name, runnable.name)
            return None
        with self._lock:
            if runnable not in self._watched:
                return None  # being stopped meanwhile
        for thread in gone:
            if any(thread is other for other in still):
                error = _thread_error(thread)
                if error is None and runnable.may_finish:
                    continue
                return thread, error
        return None

    @staticmethod
    def _threads(runnable: Runnable) -> list[threading.Thread]:
        # A thread never started is not running yet, not ended.
        return [thread for thread in (runnable.threads() if runnable.threads else ())
                if thread is not None and thread.ident is not None]

    def _died(self, runnable: Runnable, thread: threading.Thread,
              error: BaseException | None) -> None:
        """Say the death (readiness, log, Event) and end the process: its supervisor starts
        it again whole."""
        how = f"raised {describe_error(error)}" if error is not None else (
            "returned while the process runs")
        with self._lock:
            if self._stopping or self._death is not None:
                return
            self._death = f"{runnable.name} ended: thread {thread.name} {how}"
            self._failed = True
        log.error("%s: %s; stopping", self.name, self._death,
                  exc_info=(type(error), error, error.__traceback__) if error else None)
        if self._recorder is not None and self._involved is not None:
            self._recorder.event(self._involved, "Warning", RUNNABLE_FAILED,
                                 f"{self._death}; the process stops to be started again")
            self._told = True
        self.stop_requested.set()

    def _stop_one(self, runnable: Runnable) -> None:
        with self._lock:
            if runnable in self._watched:
                self._watched.remove(runnable)
        try:
            runnable.stop()
        except Exception:  # the rest must still stop
            log.exception("%s: stopping %s failed", self.name, runnable.name)
