"""The worker's reasons on the manager, done: each worker's Warning Events
(``warning_events.py``) attributed to the manager TrainJob that runs there and counted
(``worker_events.py``) by the informers' threads, and written as manager Events by one
thread of its own, so that neither a reconcile nor placement ever waits on them (nor
Kueue-mode nominations). The same in both modes: only ``CopyOwners`` differs.

Only the leader writes. Every replica counts what its caches deliver, so the one that
takes over knows what was seen; the first time it writes about a job it reads that job's
Warning Events on the manager once, and raises the ones already there (written before a
restart, or by the replica that led before) rather than writing them again.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller_kit import events, writes
from controller_kit.informer import DELETED
from controller_kit.kubeclient import describe_error
from dispatcher.metrics import DispatcherMetrics
from dispatcher.workers import worker_events
from dispatcher.workers.cluster import WorkerCluster
from dispatcher.workers.registry import WorkerRegistry
from dispatcher.workers.worker_events import Aggregation, CopyOwners, Existing, JobRef, Write
from trainjob import constants as c

log = logging.getLogger(__name__)

COMPONENT = "trainjob-dispatcher"  # as the dispatcher's other Events say
# The writer looks for work at least this often (closing idle namespaces' caches, pruning).
SWEEP_SECONDS = 5.0
# After a failed write, before the next try.
RETRY_SECONDS = 1.0


class WorkerEventMirror:
    """Copies the workers' Warning Events about the jobs running there onto the manager
    jobs, which ``owners`` names."""

    def __init__(self, manager: client.ApiClient, registry: WorkerRegistry,
                 owners: CopyOwners, metrics: DispatcherMetrics,
                 may_write: Callable[[], bool], instance: str = ""):
        self._manager = manager
        self._registry = registry
        self._owners = owners
        self._metrics = metrics
        self._may_write = may_write
        self._instance = instance or COMPONENT
        self.aggregation = Aggregation()
        self._existing: dict[str, Existing] = {}  # job UID -> its Events on the manager
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- informer threads ------------------------------------------------------------

    def on_event(self, worker_name: str, kind: str, old: dict | None,
                 new: dict | None) -> None:
        """A worker's Warning Event changed: count it for its job, if it has one here."""
        event = new or old
        if not event:
            return
        if kind == DELETED:
            self.aggregation.forget(worker_name, event)
            return
        worker = self._registry.get(worker_name)
        if worker is None or worker.warnings is None:
            return
        job = worker_events.attribute(
            event, worker_name, functools.partial(self._copy, worker),
            functools.partial(self._pod_job, worker), self._owners)
        if job is not None and self.aggregation.observe(worker_name, job, event):
            self._wake.set()

    @staticmethod
    def _copy(worker: WorkerCluster, namespace: str, name: str) -> dict | None:
        copies = worker.informers.get(c.TRAINJOBS)
        found = copies.get(namespace, name) if copies is not None else None
        return found or worker.warnings.deleted_copy(namespace, name)

    @staticmethod
    def _pod_job(worker: WorkerCluster, namespace: str, name: str) -> str | None:
        pods = worker.informers.get("pods")
        pod = pods.get(namespace, name) if pods is not None else None
        if pod is None:
            return None
        return (pod["metadata"].get("labels") or {}).get(c.JOBSET_NAME_LABEL) or ""

    # --- the writer --------------------------------------------------------------------

    def start(self) -> WorkerEventMirror:
        self._thread = threading.Thread(target=self._run, name="worker-events", daemon=True)
        self._thread.start()
        return self

    @property
    def thread(self) -> threading.Thread | None:
        """The writer's thread, once started (its process's manager watches it)."""
        return self._thread

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(SWEEP_SECONDS)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._pass()
            except Exception:  # the mirror must outlive any one bad pass
                log.exception("mirroring worker Events failed; trying again")
                self._stop.wait(RETRY_SECONDS)
                self._wake.set()

    def _pass(self) -> None:
        for worker in self._registry.snapshot(draining=True):
            if worker.warnings is not None:
                worker.warnings.sweep()
        shown = self.aggregation.prune(self._owners.placed)
        self._existing = {uid: found for uid, found in self._existing.items() if uid in shown}
        if not self._may_write():
            # A standby counts and waits; what it learnt of the manager may be stale when
            # it leads.
            self._existing.clear()
            return
        failed = False
        for key in self.aggregation.due():
            if self._stop.is_set():
                return
            try:
                self._write(key)
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as err:
                log.debug("worker Event for %s/%s not written yet: %s", key[0].namespace,
                          key[0].name, describe_error(err))
                self.aggregation.retry(key)
                failed = True
        if failed:
            self._stop.wait(RETRY_SECONDS)
        if failed or self.aggregation.pending():
            self._wake.set()

    def _write(self, key) -> None:
        job = self.aggregation.unwritten(key)
        existing = None
        if job is not None:
            existing = self._existing.get(job.uid)
            if existing is None:
                existing = self._existing[job.uid] = self._read_existing(job)
        write = self.aggregation.plan(key, existing)
        if write is None:
            return
        try:
            if write.name is None:
                made = writes.create(self._manager, "", "v1", write.job.namespace, "events",
                                     self._body(write))
                name = made["metadata"]["name"]
            else:
                writes.merge_patch(self._manager, "", "v1", write.job.namespace, "events",
                                   write.name, events.recount(write.count, write.last))
                name = write.name
        except ApiException as err:
            if err.status == 404 and write.name is not None:
                self.aggregation.lost(write)  # expired: made again, whole, next pass
                self._wake.set()
                return
            if err.status in (400, 403, 404, 422):  # refused, or its namespace is gone
                self.aggregation.drop(write)
                self._count(write, "dropped")
                log.warning("worker Event for %s/%s not written: %s", write.job.namespace,
                            write.job.name, describe_error(err))
                return
            raise
        self.aggregation.done(write, name)
        self._count(write, "limited" if write.limited else "mirrored")

    def _count(self, write: Write, outcome: str) -> None:
        if write.new > 0:
            self._metrics.worker_events.labels(cluster=write.key[1], outcome=outcome).inc(
                write.new)

    def _read_existing(self, job: JobRef) -> Existing:
        """The Warning Events this dispatcher wrote on the job: (reason, message) -> the
        one with the highest count."""
        found: Existing = {}
        answer = writes.request_json(
            self._manager, "GET", writes.object_path("", "v1", job.namespace, "events"), None,
            query=[("fieldSelector", f"involvedObject.uid={job.uid},type=Warning")])
        for event in answer.get("items") or []:
            if (event.get("source") or {}).get("component") != COMPONENT:
                continue
            key = (event.get("reason") or "", event.get("message") or "")
            count = int(event.get("count") or 1)
            if key not in found or found[key][1] < count:
                found[key] = (event["metadata"]["name"], count)
        return found

    def _body(self, write: Write) -> dict:
        job = write.job
        return events.event_body(
            {"apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND, "name": job.name,
             "namespace": job.namespace, "uid": job.uid},
            events.WARNING, write.reason, write.message, COMPONENT, self._instance,
            first=write.first, last=write.last, count=write.count)
