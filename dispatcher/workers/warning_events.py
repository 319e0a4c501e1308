"""A worker's Warning Events, watched only where copies of the manager's jobs are: one cache per
namespace that holds a copy, opened with the first copy and closed a while after
the last one goes (``WarningEvents``). What the mirror does with them is
``worker_events.py``. The copies are the dispatcher's own in standalone mode (its
manager-UID annotation) and Kueue's in Kueue mode (the Workload Kueue names on them): the
worker's cache of copies lists only those with the mode's origin label.

Per namespace, not cluster-wide, although both worker identities may list and watch
Events everywhere (manifests/worker-access, manifests/worker-reader): a namespace's Events
are only of use while a copy is there, and one watch per such namespace costs the worker
far less than every Event of the cluster would. Only Warnings are listed (a field
selector, ``type=Warning``): a busy namespace's Normal Events (Scheduled, Pulled, Created,
Started per pod) are most of them.

Kept a while after its last copy goes (``LINGER_SECONDS``): a finished job's copy is
deleted as soon as its status reached the manager, and the Events that told why it failed
(BackoffLimitExceeded, the operator's Failed) may arrive after that. Closed at once when
the namespace is being deleted: no copy will come back to it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time

from kubernetes import client

from controller_kit.informer import DELETED, Informer
from dispatcher.workers import projections
from trainjob import constants as c

log = logging.getLogger(__name__)

# The resource name the worker's Warning Events are handed on under (``WorkerEvent``).
EVENTS = "events"
# How long a namespace's Events stay watched, and a deleted copy remembered, after the last
# copy there is gone.
LINGER_SECONDS = 120.0
# A namespace whose Events may not be listed (RBAC not updated) is asked again this often.
_BACKOFF_MAX = 60.0


def followed(meta: dict) -> bool:
    """Whether a worker copy's namespace has its Events watched: one of the dispatcher's
    copies, or of Kueue's."""
    marks = {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}
    return bool(marks.get(c.MANAGER_UID_ANNOTATION) or
                marks.get(c.KUEUE_PREBUILT_WORKLOAD_LABEL))


class WarningEvents:
    """The Warning Events of one worker's namespaces that hold the dispatcher's copies,
    each change handed to ``on_event(worker, EVENTS, kind, old, new)``."""

    def __init__(self, worker: str, core: client.CoreV1Api, on_event,
                 linger: float = LINGER_SECONDS, clock=time.monotonic):
        self.worker = worker
        self._core = core
        self._on_event = on_event
        self._linger = linger
        self._clock = clock
        self._lock = threading.Lock()
        self._informers: dict[str, Informer] = {}
        self._copies: dict[str, set[str]] = {}  # namespace -> names of copies there
        self._empty_since: dict[str, float] = {}  # namespace -> when its last copy went
        self._gone: dict[tuple[str, str], tuple[dict, float]] = {}  # copy, when deleted
        self._terminating: set[str] = set()  # namespaces being deleted: not watched again
        self._stopped = False

    # --- informer handlers (quick: no request is made here) ------------------------

    def follow_copy(self, kind: str, old: dict | None, new: dict | None) -> None:
        """The worker's TrainJob cache changed: watch the namespaces of the copies."""
        obj = new or old or {}
        meta = obj.get("metadata") or {}
        # The cache lists by the origin label only; a copy that can stand for a manager
        # job also carries the dispatcher's manager-UID annotation (standalone) or the
        # Workload Kueue names (Kueue mode). The mirror checks which job again.
        if not followed(meta):
            return
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        with self._lock:
            names = self._copies.setdefault(namespace, set())
            if kind == DELETED:
                names.discard(name)
                self._gone[(namespace, name)] = (obj, self._clock())
                if not names:
                    self._empty_since[namespace] = self._clock()
                return
            names.add(name)
            self._gone.pop((namespace, name), None)
            self._empty_since.pop(namespace, None)
            if namespace in self._informers or namespace in self._terminating \
                    or self._stopped:
                return
            informer = Informer(
                f"{self.worker}/events/{namespace}",
                functools.partial(self._core.list_namespaced_event, namespace,
                                  field_selector="type=Warning"),
                transform=projections.event, backoff_max=_BACKOFF_MAX)
            informer.add_handler(functools.partial(self._on_event, self.worker, EVENTS))
            self._informers[namespace] = informer
        informer.start()

    def follow_namespace(self, kind: str, old: dict | None, new: dict | None) -> None:
        """The worker's Namespace cache changed: a namespace going away is not watched."""
        obj = new or old or {}
        meta = obj.get("metadata") or {}
        name = meta.get("name") or ""
        with self._lock:
            if kind != DELETED and meta.get("deletionTimestamp"):
                self._terminating.add(name)
            else:
                self._terminating.discard(name)  # gone, or (made again) in use
        if kind == DELETED or meta.get("deletionTimestamp"):
            self._close(name)

    # --- what the mirror asks -----------------------------------------------------------

    def deleted_copy(self, namespace: str, name: str) -> dict | None:
        """A copy of the dispatcher's deleted less than ``linger`` ago (its last state)."""
        with self._lock:
            found = self._gone.get((namespace, name))
        if found is None or self._clock() - found[1] > self._linger:
            return None
        return found[0]

    def namespaces(self) -> list[str]:
        with self._lock:
            return sorted(self._informers)

    def sweep(self) -> None:
        """Close the caches of namespaces without copies for ``linger``; forget copies
        deleted longer ago than that."""
        now = self._clock()
        with self._lock:
            idle = [ns for ns, since in self._empty_since.items()
                    if now - since > self._linger]
            for key in [key for key, (_, at) in self._gone.items() if now - at > self._linger]:
                del self._gone[key]
        for namespace in idle:
            self._close(namespace)

    def _close(self, namespace: str) -> None:
        with self._lock:
            informer = self._informers.pop(namespace, None)
            self._empty_since.pop(namespace, None)
            if not self._copies.get(namespace):
                self._copies.pop(namespace, None)
        if informer is not None:
            # Not joined: this may run on another cache's thread, which must not wait.
            informer.stop(timeout=0)
            log.debug("worker %s: Warning Events of namespace %s no longer watched",
                      self.worker, namespace)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            informers, self._informers = list(self._informers.values()), {}
        for informer in informers:
            informer.stop(timeout=1)
