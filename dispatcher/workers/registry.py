"""The worker registry: which worker clusters exist, how to reach them, and whether they
answer. The one object the rest of the dispatcher asks about workers (``snapshot``,
``get``, ``same_cluster``); its parts, each in a module of its own:

* ``registrations``: which workers the MultiKueueClusters, the MultiKueueConfig and the
  static list describe, each kubeconfig read from its Secret (``named_secrets``) or file
  and vetted (``kubeconfig_policy``);
* ``connection``: a worker's client and caches;
* ``probing``: whether each worker answers;
* ``duplicates``: one cluster, one registration;
* ``draining``: a worker that leaves while jobs are placed on it;
* ``active_condition``: its state written as its MultiKueueCluster's ``Active``
  condition.

The registry is level-triggered: any change to those objects or Secrets re-derives the
whole set (``sync``), and a worker whose kubeconfig did not change keeps its connection
and caches.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable

from kubernetes import client

from controller_kit.events import EventRecorder
from dispatcher.config import DispatcherConfig
from dispatcher.room.capacity import WorkerCapacity
from dispatcher.workers import draining
from dispatcher.workers.active_condition import ActiveConditions
from dispatcher.workers.cluster import (
    REASON_ACTIVE,
    REASON_CONNECTION_FAILED,
    REASON_PENDING,
    WorkerCluster,
    WorkerEvent,
)
from dispatcher.workers.connection import Observer, connect
from dispatcher.workers.duplicates import Duplicates
from dispatcher.workers.kubeconfig_policy import check_kubeconfig
from dispatcher.workers.probing import Prober
from dispatcher.workers.registrations import Registration, Registrations

log = logging.getLogger(__name__)


class WorkerRegistry:
    def __init__(self, manager: client.ApiClient, config: DispatcherConfig,
                 on_worker_event: WorkerEvent, on_state_change: Callable[[WorkerCluster], None],
                 probe_interval: float = 2.0, probe_timeout: float = 2.0,
                 may_write: Callable[[], bool] = lambda: True,
                 observer: Observer | None = None,
                 in_use: Callable[[], set[str]] = set,
                 recorder: EventRecorder | None = None,
                 publish_conditions: Callable[[], bool] = lambda: True):
        self.config = config
        self.on_worker_event = on_worker_event
        self.on_state_change = on_state_change
        self.observer = observer  # cluster name -> request observer for its client
        # Names of workers that manager jobs are placed on (and may have copies on).
        self.in_use = in_use
        self.workers: dict[str, WorkerCluster] = {}
        self._lock = threading.RLock()
        self._verdict = threading.Condition()
        self.registrations = Registrations(manager, config, self.sync, recorder, may_write)
        self.duplicates = Duplicates(recorder, may_write, self.registrations.cluster)
        self.conditions = ActiveConditions(
            manager, self.registrations.clusters, may_write, publish_conditions,
            current=lambda worker: self.workers.get(worker.name) is worker, recorder=recorder)
        self.prober = Prober(probe_interval, probe_timeout, self.probe_all, self._probed)
        self._started = False

    # --- lifecycle ------------------------------------------------------------------

    def start(self, sync_timeout: float = 60) -> WorkerRegistry:
        deadline = time.monotonic() + sync_timeout
        self.registrations.start(sync_timeout)
        # A first derivation starts the caches of the Secrets it names; the second, once
        # they are read, connects the workers (none is reported "not read yet" at start).
        with self._lock:
            self.registrations.desired(report=False)
        unread = self.registrations.secrets.wait_synced(max(deadline - time.monotonic(), 0))
        if unread:
            log.warning("Secrets not read at start (their workers wait for them): %s",
                        ", ".join(sorted(unread)))
        self._started = True
        self.sync()
        self.prober.start()
        self.probe_all()
        return self

    def threads(self) -> list[threading.Thread | None]:
        """The threads the registry runs, for the process's manager to watch: the manager's
        MultiKueueCluster, MultiKueueConfig and Secret caches, the probes' timer, and each
        worker's (``WorkerCluster.threads``), draining ones included. A worker dropped or
        replaced leaves ``workers`` under the lock, and is stopped under it too: its
        threads are out of this list before they end."""
        found = self.registrations.threads() + [self.prober.thread]
        with self._lock:
            for worker in self.workers.values():
                found += worker.threads()
        return found

    def stop(self) -> None:
        self.prober.stop()
        self.registrations.stop()
        with self._lock:
            for worker in self.workers.values():
                worker.stop()
            self.workers.clear()

    # --- what the rest of the dispatcher asks ------------------------------------------

    def snapshot(self, draining: bool = False) -> list[WorkerCluster]:
        """The registered workers in configuration order (with ``draining``, also those
        kept only to remove copies)."""
        with self._lock:
            return sorted((w for w in self.workers.values() if draining or not w.draining),
                          key=lambda w: w.order)

    def get(self, name: str) -> WorkerCluster | None:
        """A registered or draining worker."""
        with self._lock:
            return self.workers.get(name)

    def labels(self, name: str) -> dict[str, str]:
        """The labels of the worker's MultiKueueCluster, as cached now (a job's cluster
        selector matches them); none for a worker of the static list."""
        worker = self.get(name)
        if worker is not None and not worker.from_object:
            return {}
        obj = self.registrations.cluster(name)
        return dict(((obj or {}).get("metadata") or {}).get("labels") or {})

    def same_cluster(self, first: str, second: str) -> bool:
        """Whether two worker names reach one cluster (as far as is known)."""
        with self._lock:
            return self.duplicates.same_cluster(first, second)

    # --- deriving the set of workers ---------------------------------------------------

    def sync(self) -> None:
        """Re-derive the workers from the manager's objects; connect, reconnect, drain,
        drop."""
        if not self._started:
            return
        changed: list[WorkerCluster] = []
        in_use = self.in_use()
        with self._lock:
            desired = self.registrations.desired()
            wanted = {registration.name for registration in desired}
            left = draining.drain_or_drop(self.workers, wanted, in_use)
            for name in draining.to_reach_again(self.workers, wanted, in_use):
                obj = self.registrations.cluster(name)
                if obj is not None:
                    desired.append(self.registrations.of(obj, len(desired)))
            for registration in desired:
                worker = self._refresh(registration, draining=registration.name not in wanted)
                if worker is not None:
                    changed.append(worker)
            self.registrations.retain()
        for worker in left:
            self.on_state_change(worker)
        for worker in changed:
            self.conditions.publish(worker)
            if worker.connected:
                self.prober.probe_now(worker)

    def _refresh(self, registration: Registration, draining: bool) -> WorkerCluster | None:
        """Bring one worker in line with its registration; the worker when it is new or
        reconnected (None when nothing changed)."""
        name = registration.name
        text = registration.kubeconfig
        fingerprint = hashlib.sha256(
            (text or registration.reason + registration.message).encode()).hexdigest()
        current = self.workers.get(name)
        if current is not None and current.fingerprint == fingerprint:
            current.order, current.created = registration.order, registration.created
            if current.draining and not draining:
                log.info("worker %s is registered again: no longer draining", name)
            current.draining = draining
            return None
        if current is not None:
            log.info("worker %s: kubeconfig changed; reconnecting", name)
            current.stop()
        worker = WorkerCluster(name=name, order=registration.order, fingerprint=fingerprint,
                               from_object=registration.from_object,
                               created=registration.created, draining=draining,
                               capacity=WorkerCapacity(name, self.config.node_scoring))
        self.workers[name] = worker
        reason, message = registration.reason, registration.message
        if text is not None:
            verdict = check_kubeconfig(text)
            if verdict.ok:
                connect(worker, verdict.config, self.config, self.observer,
                        self.on_worker_event)
            else:
                reason, message = verdict.reason, verdict.message
        if not worker.connected:
            worker.set_state(False, reason, message)
            if reason != REASON_PENDING:
                log.warning("worker %s cannot be used: %s: %s", name, reason, message)
        return worker

    def release_drained(self) -> None:
        """Drop the draining workers that are done (``draining.drop_drained``)."""
        with self._lock:
            # Which workers jobs are placed on is a walk over every manager job: asked
            # only while some worker drains (this runs at every probe round).
            if any(worker.draining for worker in self.workers.values()):
                draining.drop_drained(self.workers, self.in_use())

    # --- probing and reporting ------------------------------------------------------

    def probe_all(self) -> None:
        self.release_drained()
        for worker in self.snapshot(draining=True):
            self.prober.probe_unless_probing(worker)

    def probe_and_wait(self, timeout: float) -> None:
        """Probe every connected worker and wait, up to ``timeout``, until each has given
        a verdict from after this call (a worker that does not answer holds up nothing
        for longer)."""
        workers = [worker for worker in self.snapshot() if worker.connected]
        before = {worker.name: worker.verdicts for worker in workers}
        self.probe_all()
        with self._verdict:
            self._verdict.wait_for(
                lambda: all(w.verdicts > before[w.name] for w in workers), timeout)

    def _probed(self, worker: WorkerCluster, ok: bool, message: str) -> None:
        """A probe's verdict: the worker's new state, unless it is a second registration
        of a cluster another name already reaches."""
        try:
            self._judge(worker, ok, message)
        finally:
            with self._verdict:
                worker.verdicts += 1
                self._verdict.notify_all()

    def _judge(self, worker: WorkerCluster, ok: bool, message: str) -> None:
        with self._lock:
            if self.workers.get(worker.name) is not worker:
                return  # replaced or removed meanwhile
            changed, older = [], None
            if ok:
                changed, older = self.duplicates.sort_out(worker, self.workers.values())
            if ok and older is not None:
                if self.duplicates.refuse(worker, older):
                    changed.append(worker)
            elif worker.set_state(ok, REASON_ACTIVE if ok else REASON_CONNECTION_FAILED,
                                  message):
                changed.append(worker)
        for each in changed:
            self.conditions.publish(each)
            self.on_state_change(each)

    def publish_all(self) -> None:
        """Write every worker's Active condition that differs, and the Events about
        registration problems (a new leader's first act)."""
        self.sync()
        for worker in self.snapshot():
            self.conditions.publish(worker)
