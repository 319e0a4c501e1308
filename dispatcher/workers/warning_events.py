"""A worker's Warning Events, read only where copies of the manager's jobs are
(``WarningEvents``). What the mirror does with them is ``worker_events.py``. The copies are
the dispatcher's own in standalone mode (its manager-UID annotation) and Kueue's in Kueue
mode (the Workload Kueue names on them): the worker's cache of copies lists only those with
the mode's origin label.

Per namespace, not cluster-wide, although both worker identities may list and watch
Events everywhere (manifests/worker-access, manifests/worker-reader): a namespace's Events
are only of use while a copy is there. Only Warnings are read (a field selector,
``type=Warning``): a busy namespace's Normal Events (Scheduled, Pulled, Created, Started
per pod) are most of them.

Read on a client of their own, with its own rate limit (``worker_event_qps``): the reads
of a busy worker's Events never take the requests the worker's caches and the copies'
status need. And bounded: at most ``max_watches`` namespaces are watched (a thread and a
connection each). A namespace with copies beyond that, and one whose last copy went, is
listed instead (a paged LIST, ``type=Warning``) every ``list_period`` seconds by one
thread: its Events come later, none is lost (a list hands on what changed since the one
before; the mirror counts a repeat once). When a watched namespace loses its last copy,
its watch stops at once and the longest-waiting namespace over the limit takes its place.

Listed a while after its last copy goes (``LINGER_SECONDS``): a finished job's copy is
deleted as soon as its status reached the manager, and the Events that told why it failed
(BackoffLimitExceeded, the operator's Failed) may arrive after that. Dropped at once when
the namespace is being deleted: no copy will come back to it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time

import orjson
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller_kit.informer import ADDED, DELETED, MODIFIED, Informer
from controller_kit.kubeclient import describe_error
from dispatcher.workers import projections
from trainjob import constants as c

log = logging.getLogger(__name__)

# The resource name the worker's Warning Events are handed on under (``WorkerEvent``).
EVENTS = "events"
# How long a namespace's Events stay read, and a deleted copy remembered, after the last
# copy there is gone.
LINGER_SECONDS = 120.0
# Namespaces watched per worker; beyond them, listed every LIST_SECONDS (the config's
# worker_event_watches and worker_event_list_seconds).
MAX_WATCHES = 20
LIST_SECONDS = 30.0
# A watched namespace whose Events may not be listed (RBAC not updated) is asked again
# this often.
_BACKOFF_MAX = 60.0
_PAGE = 500


def followed(meta: dict) -> bool:
    """Whether a worker copy's namespace has its Events read: one of the dispatcher's
    copies, or of Kueue's."""
    marks = {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}
    return bool(marks.get(c.MANAGER_UID_ANNOTATION) or
                marks.get(c.KUEUE_PREBUILT_WORKLOAD_LABEL))


class WarningEvents:
    """The Warning Events of one worker's namespaces that hold the dispatcher's copies,
    each change handed to ``on_event(worker, EVENTS, kind, old, new)``. ``api`` is its
    own client (closed by ``stop``)."""

    def __init__(self, worker: str, api: client.ApiClient, on_event, *,
                 max_watches: int = MAX_WATCHES, list_period: float = LIST_SECONDS,
                 linger: float = LINGER_SECONDS, clock=time.monotonic):
        self.worker = worker
        self._api = api
        self._core = client.CoreV1Api(api)
        self._on_event = on_event
        self._max_watches = max_watches
        self._list_period = list_period
        self._linger = linger
        self._clock = clock
        self._lock = threading.Lock()
        self._informers: dict[str, Informer] = {}  # watched namespaces
        # listed namespaces -> their Warning Events as last listed (None: not listed yet)
        self._listed: dict[str, dict[str, dict] | None] = {}
        self._due: dict[str, float] = {}  # listed namespace -> when it is listed next
        self._copies: dict[str, set[str]] = {}  # namespace -> names of copies there
        self._empty_since: dict[str, float] = {}  # namespace -> when its last copy went
        # Namespaces with copies that wait for a watch (over the limit), oldest first.
        self._waiting: dict[str, None] = {}
        self._gone: dict[tuple[str, str], tuple[dict, float]] = {}  # copy, when deleted
        # Namespaces being deleted, or deleted (their copies' deletions may come later):
        # not read again. -> since when; a deleted one is forgotten after ``linger``.
        self._terminating: dict[str, float] = {}
        self._told_limit = False
        self._stopped = False
        self._wake = threading.Event()
        self._lister: threading.Thread | None = None

    # --- informer handlers (quick: no request is made here) ------------------------

    def follow_copy(self, kind: str, old: dict | None, new: dict | None) -> None:
        """The worker's TrainJob cache changed: read the namespaces of the copies."""
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
                if names or namespace in self._empty_since:
                    return
                self._empty_since[namespace] = self._clock()
            else:
                names.add(name)
                self._gone.pop((namespace, name), None)
                if namespace not in self._empty_since and (
                        namespace in self._informers or namespace in self._waiting
                        or namespace in self._terminating or self._stopped):
                    return  # read as it should be already (most changes: a copy's status)
                self._empty_since.pop(namespace, None)
            changes = self._arrange()
        self._apply(*changes)

    def follow_namespace(self, kind: str, old: dict | None, new: dict | None) -> None:
        """The worker's Namespace cache changed: a namespace going away is not read."""
        obj = new or old or {}
        meta = obj.get("metadata") or {}
        name = meta.get("name") or ""
        going = kind == DELETED or bool(meta.get("deletionTimestamp"))
        with self._lock:
            if not going:
                # Made again and in use: read again if copies came before this news did.
                if self._terminating.pop(name, None) is None or not self._copies.get(name):
                    return
            elif name in self._terminating and kind != DELETED:
                return
            else:
                self._terminating[name] = self._clock()
                self._empty_since.pop(name, None)
            if not self._copies.get(name):
                self._copies.pop(name, None)
            changes = self._arrange()
        self._apply(*changes)

    # --- what the mirror and the metrics ask -----------------------------------------

    def deleted_copy(self, namespace: str, name: str) -> dict | None:
        """A copy of the dispatcher's deleted less than ``linger`` ago (its last state)."""
        with self._lock:
            found = self._gone.get((namespace, name))
        if found is None or self._clock() - found[1] > self._linger:
            return None
        return found[0]

    def counts(self) -> tuple[int, int, int]:
        """(namespaces watched, listed, over the limit: with copies but listed)."""
        with self._lock:
            return len(self._informers), len(self._listed), len(self._waiting)

    def sweep(self) -> None:
        """Stop reading namespaces without copies for ``linger``; forget copies deleted
        longer ago than that."""
        now = self._clock()
        with self._lock:
            idle = [ns for ns, since in self._empty_since.items() if now - since > self._linger]
            for namespace in idle:
                del self._empty_since[namespace]
                if not self._copies.get(namespace):
                    self._copies.pop(namespace, None)
            for key in [key for key, (_, at) in self._gone.items() if now - at > self._linger]:
                del self._gone[key]
            for namespace in [ns for ns, at in self._terminating.items()
                              if now - at > self._linger and not self._copies.get(ns)]:
                del self._terminating[namespace]
            changes = self._arrange() if idle else ([], [], False)
        self._apply(*changes)

    def threads(self) -> list[threading.Thread | None]:
        """The watches' threads and the lister's. A namespace's watch leaves this list
        before it is stopped (``_arrange``, under the lock); the lister ends only once
        ``stop`` was called."""
        with self._lock:
            return [informer.thread for informer in self._informers.values()] + [
                self._lister]

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            informers, self._informers = list(self._informers.values()), {}
            self._listed.clear()
            self._due.clear()
        self._wake.set()
        for informer in informers:
            informer.stop(timeout=1)
        if self._lister is not None:
            self._lister.join(1)
        self._api.close()

    # --- which namespace is read how (under the lock) ----------------------------------

    def _arrange(self) -> tuple[list[Informer], list[Informer], bool]:
        """Bring the reads in line with the copies: (informers to start, informers to stop,
        whether the lister has new work). Watched namespaces keep their watch while they
        have copies; a free watch goes to the namespace with copies that waited longest."""
        if self._stopped:
            return [], [], False
        # In the order their first copies came: the longest waiting is watched first.
        live = {ns: None for ns, names in self._copies.items()
                if names and ns not in self._terminating}
        lingering = [ns for ns in self._empty_since if ns not in self._terminating]
        stop = [self._informers.pop(ns) for ns in list(self._informers) if ns not in live]
        for namespace in live:
            if namespace not in self._informers:
                self._waiting.setdefault(namespace, None)
        for namespace in list(self._waiting):
            if namespace not in live:
                del self._waiting[namespace]
        start = []
        while self._waiting and len(self._informers) < self._max_watches:
            namespace = next(iter(self._waiting))
            del self._waiting[namespace]
            informer = Informer(
                f"{self.worker}/events/{namespace}",
                functools.partial(self._core.list_namespaced_event, namespace,
                                  field_selector="type=Warning"),
                transform=projections.event, backoff_max=_BACKOFF_MAX)
            informer.add_handler(functools.partial(self._on_event, self.worker, EVENTS))
            self._informers[namespace] = informer
            start.append(informer)
        listed = {**self._waiting, **dict.fromkeys(lingering)}
        new = [ns for ns in listed if ns not in self._listed]
        for namespace in new:
            self._listed[namespace] = None
            self._due[namespace] = 0.0  # at once: nothing of it was read since its watch
        for namespace in [ns for ns in self._listed if ns not in listed]:
            del self._listed[namespace]
            del self._due[namespace]
        over = [ns for ns in new if ns in self._waiting]
        if over:
            self._tell_limit(over)
        return start, stop, bool(new)

    def _tell_limit(self, over: list[str]) -> None:
        level = logging.INFO if self._told_limit else logging.WARNING
        self._told_limit = True
        log.log(level, "worker %s: %d namespaces with copies have their Warning Events "
                "watched, the most allowed (worker_event_watches): those of %s are listed "
                "every %.0fs instead until a watch is free", self.worker, len(self._informers),
                ", ".join(over), self._list_period)

    def _apply(self, start: list[Informer], stop: list[Informer], listed: bool) -> None:
        for informer in stop:
            # Not joined: this may run on another cache's thread, which must not wait.
            informer.stop(timeout=0)
            log.debug("%s: no longer watched", informer.name)
        for informer in start:
            informer.start()
        if listed:
            with self._lock:
                if self._lister is None and not self._stopped:
                    self._lister = threading.Thread(
                        target=self._list_loop, name=f"worker-events-list-{self.worker}",
                        daemon=True)
                    self._lister.start()
            self._wake.set()

    # --- the lister ------------------------------------------------------------------

    def _list_loop(self) -> None:
        while True:
            with self._lock:
                if self._stopped:
                    return
                now = self._clock()
                due = [ns for ns, at in self._due.items() if at <= now]
                later = min((at for at in self._due.values() if at > now), default=None)
            for namespace in due:
                self._list(namespace)
            if due:
                continue  # time went by: look again at what is due
            self._wake.wait(None if later is None else max(0.05, later - self._clock()))
            self._wake.clear()

    def _list(self, namespace: str) -> None:
        """List ``namespace``'s Warning Events (paged) and hand on what changed since its
        last list."""
        found: dict[str, dict] = {}
        token = None
        try:
            while True:
                response = self._core.list_namespaced_event(
                    namespace, field_selector="type=Warning", limit=_PAGE,
                    _continue=token, _preload_content=False)
                body = orjson.loads(response.data)
                for item in body.get("items") or []:
                    kept = projections.event(item)
                    found[kept["metadata"].get("name") or ""] = kept
                token = (body.get("metadata") or {}).get("continue")
                if not token:
                    break
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as err:
            log.info("worker %s: Warning Events of namespace %s not listed (again in %.0fs):"
                     " %s", self.worker, namespace, self._list_period, describe_error(err))
            found = None
        changes: list[tuple[str, dict | None, dict | None]] = []
        with self._lock:
            if namespace not in self._listed:
                return  # watched now, or no longer read: its watch lists it
            self._due[namespace] = self._clock() + self._list_period
            if found is None:
                return
            before = self._listed[namespace] or {}
            self._listed[namespace] = found
        for name, event in found.items():
            old = before.get(name)
            if old is None:
                changes.append((ADDED, None, event))
            elif old["metadata"].get("resourceVersion") != \
                    event["metadata"].get("resourceVersion"):
                changes.append((MODIFIED, old, event))
        changes.extend((DELETED, old, None) for name, old in before.items()
                       if name not in found)
        for kind, old, new in changes:
            try:
                self._on_event(self.worker, EVENTS, kind, old, new)
            except Exception:  # one bad Event must not stop the others' reading
                log.exception("worker %s: handling a listed Warning Event failed",
                              self.worker)
