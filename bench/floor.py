"""The floor under a dispatch (``bench.scale``): the writes the dispatcher makes for each
job, made at the same rate on the same clusters by a plain client that places nothing and
caches nothing. What the dispatcher's latency has above the floor's is the dispatcher's
own: its watch, its queue, its placement and its caches.

Per job the scale suite's dispatcher writes (``dispatcher/standalone/reconciler.py``,
``remote_copies.py``; the copies get no status there, so no status write follows):

1. the placement PATCH on the manager TrainJob: the worker's annotation and the
   finalizer, guarded by the resourceVersion;
2. the ``Placed`` Event on the manager, queued to a writer thread of its own;
3. the copy's create on the worker;

and once the job is deleted (as the suite's reaper does, once its copy is seen):

4. the copy's delete on the worker (with its uid as precondition);
5. the finalizer's removal from the manager TrainJob (a PATCH).

The floor makes the same five, with the dispatcher's client settings (the
``controller_kit.kubeclient`` clients with the dispatcher's default rate limits and
timeout, one client per cluster shared by its threads, kept-alive ``lean_http``
connections per thread, the Event through ``controller_kit.events``), on as many threads
as the dispatcher has concurrent reconciles. Its jobs arrive through the same load
generator, as TrainJobs not managed by MultiKueue (which the dispatcher leaves alone),
and each create's answer goes straight to the floor's queue: no watch, no cache, the
worker taken in turn (no placement). Once its copy is made, each job is deleted by threads
of their own, as the reaper's are not the dispatcher's. Its copies carry an origin label of
their own, so the dispatcher neither caches nor collects them. The latency is the same as
the dispatcher's: the benchmark's watches, the manager's ``ADDED`` to the worker's
``ADDED``.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from bench.footprint import CpuAccount
from bench.load import ACCESS_REVIEW, ACCESS_REVIEWS, LoadRunner, trainjob
from bench.stats import summary_ms
from bench.timeline import Key, Timelines
from controller_kit import writes
from controller_kit.events import NORMAL, EventRecorder
from controller_kit.kubeclient import api_client
from dispatcher.cli import build_parser as dispatcher_parser
from dispatcher.config import ClientLimits, ManagerClientLimits
from dispatcher.standalone import mirror
from trainjob import constants as c

log = logging.getLogger(__name__)

# The origin label of the floor's copies: not the dispatcher's, so it leaves them alone.
FLOOR_ORIGIN = "bench-floor"
USER_AGENT = "bench-floor"
# What a copy's footprint annotation records (the load's job: 3 pods of 100m cpu).
FOOTPRINT = ({"cpu": "100m"}, 3)
RETRIES = 5
RETRIED = (429, 500, 503, 504)
ERRORS_KEPT = 5
# Threads making the user's deletes, as many as the suite's reaper has: not the floor's own,
# as the reaper's deletes are not the dispatcher's.
USER_THREADS = 4


def reconcile_threads(dispatcher_args: tuple[str, ...]) -> int:
    """The dispatcher's concurrent reconciles (``--workers``) with ``dispatcher_args``."""
    known, _ = dispatcher_parser().parse_known_args(["run", *dispatcher_args])
    return known.workers


def _retrying(call: Callable[[], dict]) -> dict:
    """``call()``, again after an overload answer, as the dispatcher's requeue would."""
    for attempt in range(RETRIES):
        try:
            return call()
        except ApiException as err:
            if err.status not in RETRIED or attempt == RETRIES - 1:
                raise
            time.sleep(0.1 * (attempt + 1))  # a backoff, as the requeue's
    raise AssertionError("unreachable")


class Floor:
    """The dispatcher's writes for each job handed to ``submit``, on ``threads`` threads
    (first come, first served, as the dispatcher's work queue)."""

    def __init__(self, kubeconfigs: dict[str, Path], workers: list[str], threads: int):
        manager = ManagerClientLimits()
        limits = ClientLimits()
        self.manager = api_client(kubeconfigs["manager"], qps=manager.qps, burst=manager.burst,
                                  user_agent=USER_AGENT)
        self.workers = {w: api_client(kubeconfigs[w], qps=limits.qps, burst=limits.burst,
                                      request_timeout=limits.timeout_seconds,
                                      user_agent=USER_AGENT) for w in workers}
        self.order = itertools.cycle(workers)
        self.recorder = EventRecorder(self.manager, USER_AGENT)
        self.threads = threads
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="floor")
        self.users = ThreadPoolExecutor(USER_THREADS, thread_name_prefix="floor-user")
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.outstanding = 0  # dispatches and teardowns submitted and not ended
        self.steps: dict[Key, dict[str, float]] = {}
        self.torn_down = 0
        self.errors: list[str] = []
        self.failed = 0

    def warm(self) -> None:
        """Every thread's connection to every cluster open (an access review each, which
        the apiserver stores nowhere), as the dispatcher's are when jobs come."""
        everyone = threading.Barrier(self.threads)

        def warm_one() -> None:
            everyone.wait(timeout=60)  # one task per thread: each waits for the others
            for api in (self.manager, *self.workers.values()):
                writes.request_json(api, "POST", ACCESS_REVIEWS, ACCESS_REVIEW)

        for future in [self.pool.submit(warm_one) for _ in range(self.threads)]:
            future.result()

    def submit(self, created: dict) -> None:
        """A job the user just created (the create's answer): dispatch it."""
        self._submit(self._dispatch, created, time.perf_counter())

    def _submit(self, step: Callable, *args, pool: ThreadPoolExecutor | None = None) -> None:
        with self.lock:
            self.outstanding += 1
        (pool or self.pool).submit(self._guarded, step, *args)

    def _guarded(self, step: Callable, *args) -> None:
        try:
            step(*args)
        except Exception as err:  # noqa: BLE001 - counted and reported; the rest go on
            with self.lock:
                self.failed += 1
                if len(self.errors) < ERRORS_KEPT:
                    self.errors.append(f"{step.__name__}: {type(err).__name__}: {err}"[:300])
        finally:
            with self.lock:
                self.outstanding -= 1
                if not self.outstanding:
                    self.idle.notify_all()

    def drain(self, timeout: float) -> int:
        """Wait until every dispatch and teardown handed over has ended (or ``timeout``);
        how many had not."""
        with self.lock:
            self.idle.wait_for(lambda: not self.outstanding, timeout)
            return self.outstanding

    def _dispatch(self, created: dict, queued: float) -> None:
        """Writes 1-3: the placement PATCH, the Event, the copy's create."""
        started = time.perf_counter()
        meta = created["metadata"]
        key = (meta["namespace"], meta["name"])
        with self.lock:
            worker = next(self.order)
        patch = {"metadata": {
            "resourceVersion": meta["resourceVersion"],
            "annotations": {c.PLACEMENT_ANNOTATION: worker},
            "finalizers": sorted(set(meta.get("finalizers") or []) | {c.DISPATCH_FINALIZER}),
        }}
        written = _retrying(lambda: writes.merge_patch(
            self.manager, c.TRAINER_GROUP, c.TRAINER_VERSION, meta["namespace"], c.TRAINJOBS,
            meta["name"], patch, field_manager=c.DISPATCHER_FIELD_MANAGER))
        patched = time.perf_counter()
        self.recorder.event(written, NORMAL, c.REASON_PLACED,
                            f"placed on worker cluster {worker}")
        body = mirror.build_remote(written, FLOOR_ORIGIN, *FOOTPRINT)
        copy = _retrying(lambda: writes.create(
            self.workers[worker], c.TRAINER_GROUP, c.TRAINER_VERSION, meta["namespace"],
            c.TRAINJOBS, body, field_manager=c.DISPATCHER_FIELD_MANAGER))
        done = time.perf_counter()
        with self.lock:
            self.steps[key] = {"queue": started - queued, "patch": patched - started,
                               "create": done - patched}
        self._submit(self._user_deletes, written, worker, copy, pool=self.users)

    def _user_deletes(self, manager: dict, worker: str, copy: dict) -> None:
        """The user's delete (the suite's reaper deletes the dispatcher's jobs so, once
        their copy is seen); then the dispatcher's part of the teardown."""
        meta = manager["metadata"]
        path = writes.object_path(c.TRAINER_GROUP, c.TRAINER_VERSION, meta["namespace"],
                                  c.TRAINJOBS, meta["name"])
        deleted = _retrying(lambda: writes.request_json(
            self.manager, "DELETE", path, {"propagationPolicy": "Background"}))
        self._submit(self._teardown, deleted, worker, copy)

    def _teardown(self, deleted: dict, worker: str, copy: dict) -> None:
        """Writes 4-5: the copy's delete, the finalizer's removal."""
        copy_meta = copy["metadata"]
        try:
            _retrying(lambda: writes.request_json(
                self.workers[worker], "DELETE", writes.object_path(
                    c.TRAINER_GROUP, c.TRAINER_VERSION, copy_meta["namespace"], c.TRAINJOBS,
                    copy_meta["name"]),
                {"propagationPolicy": "Background",
                 "preconditions": {"uid": copy_meta["uid"]}}))
        except ApiException as err:
            if err.status not in (404, 409):
                raise
        self._unfinalize(deleted)
        with self.lock:
            self.torn_down += 1

    def _unfinalize(self, manager: dict) -> None:
        """The dispatcher's finalizer off ``manager`` (guarded by its resourceVersion; read
        again after a conflict)."""
        meta = manager["metadata"]
        for _ in range(RETRIES):
            finalizers = [f for f in meta.get("finalizers") or [] if f != c.DISPATCH_FINALIZER]
            if finalizers == (meta.get("finalizers") or []):
                return
            try:
                _retrying(lambda: writes.merge_patch(
                    self.manager, c.TRAINER_GROUP, c.TRAINER_VERSION, meta["namespace"],
                    c.TRAINJOBS, meta["name"],
                    {"metadata": {"resourceVersion": meta["resourceVersion"],
                                  "finalizers": finalizers}},
                    field_manager=c.DISPATCHER_FIELD_MANAGER))
                return
            except ApiException as err:
                if err.status == 404:
                    return
                if err.status != 409:
                    raise
            meta = writes.request_json(self.manager, "GET", writes.object_path(
                c.TRAINER_GROUP, c.TRAINER_VERSION, meta["namespace"], c.TRAINJOBS,
                meta["name"]), None)["metadata"]

    def sweep(self, namespace: str) -> int:
        """The finalizer off every TrainJob of ``namespace`` left holding it (a write that
        failed): the dispatcher leaves jobs not managed by MultiKueue alone, so nothing
        else would lift it and the namespace could not go. How many there were."""
        listed = writes.request_json(self.manager, "GET", writes.object_path(
            c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS), None)
        left = [item for item in listed.get("items") or []
                if c.DISPATCH_FINALIZER in (item["metadata"].get("finalizers") or [])]
        for item in left:
            self._unfinalize(item)
        return len(left)

    def close(self) -> None:
        self.users.shutdown(wait=True)
        self.pool.shutdown(wait=True)
        self.recorder.flush(timeout=30)
        for api in (self.manager, *self.workers.values()):
            api.close()


def _creating(namespace: str, body: dict, floor: Floor):
    """The user's create (the load generator's call), its answer handed to the floor."""
    def call(custom: client.CustomObjectsApi) -> object:
        created = writes.create(custom.api_client, c.TRAINER_GROUP, c.TRAINER_VERSION,
                                namespace, c.TRAINJOBS, body)
        floor.submit(created)
        return created
    return call


def _steps_ms(steps: list[dict[str, float]], name: str) -> dict:
    return summary_ms([s[name] for s in steps if name in s])


def measure(kubeconfigs: dict[str, Path], timelines: Timelines, runner: LoadRunner,
            workers: list[str], rate: float, seconds: float, threads: int, namespace: str,
            process_groups: dict[str, list[int]] | None = None,
            wait: Callable[[int], float] = lambda count: 120 + count / 5) -> dict:
    """Jobs arriving at ``rate`` per second for ``seconds`` into ``namespace`` (which
    must exist on the manager and the workers), each dispatched by the floor: latency
    percentiles (manager ``ADDED`` to copy ``ADDED``), each write's time, the CPU each
    group of ``process_groups`` spent."""
    count = max(1, int(rate * seconds))
    names = [f"floor-{i:05d}" for i in range(count)]
    keys = [(namespace, name) for name in names]
    floor = Floor(kubeconfigs, workers, threads)
    swept = unfinished = 0
    try:
        floor.warm()
        runner.warm([kubeconfigs["manager"]])
        calls = [(kubeconfigs["manager"],
                  _creating(namespace, trainjob(name, multikueue=False), floor))
                 for name in names]
        with CpuAccount(process_groups or {}) as cpu:
            run = runner.run(calls, rate=rate)
            missing = timelines.wait_remotes(set(keys), wait(count))
        # Every dispatch handed over, then every teardown after it, before the sweep.
        unfinished = floor.drain(wait(count))
        swept = floor.sweep(namespace)
    finally:
        floor.close()
    samples = []
    for key in keys:
        start, remote = timelines.manager.added.get(key), timelines.remote(key)
        if start is not None and remote is not None:
            samples.append(max(0.0, remote[1] - start))
    span = max(run.starts) - run.first_start
    steps = list(floor.steps.values())
    figures = {"rate": rate, "seconds": seconds, "jobs": count, "threads": threads,
               "achieved_arrival_rate": round((count - 1) / span, 1) if span else None,
               "dispatched": len(samples), "missing": len(missing),
               "latency": summary_ms(samples),
               "latency_samples_ms": [round(x * 1000, 1) for x in samples],
               "writes": {"queue": _steps_ms(steps, "queue"),
                          "patch": _steps_ms(steps, "patch"),
                          "create": _steps_ms(steps, "create")},
               "torn_down": floor.torn_down, "failed": floor.failed,
               "unfinished": unfinished,
               "errors": floor.errors, "events_written": floor.recorder.written,
               "finalizers_swept": swept, "cpu": cpu.figures()}
    log.info("floor %g jobs/s: p50 %s ms, p99 %s ms (%d of %d dispatched, %d failed)", rate,
             figures["latency"]["p50_ms"], figures["latency"]["p99_ms"], len(samples),
             count, floor.failed)
    return figures
