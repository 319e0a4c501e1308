"""List-then-watch cache of one resource, kept as plain dictionaries.

* The initial list is paged; its resourceVersion starts the watch.
* The watch asks for bookmarks and resumes from the last resourceVersion it saw (event or
  bookmark) after any disconnect, with capped exponential backoff.
* 410 Gone (history compacted) triggers a fresh list; the difference between the old cache
  and the new list is delivered as events, so handlers never miss a deletion.
* A watch that fails (the connection drops, the apiserver restarts or answers an error) is
  followed by a fresh list too, not resumed: until that list is complete, ``current`` is
  clear, and an owner that must not act on a picture with a hole in it (placement, by room)
  can tell. A watch the apiserver ends on time is resumed: nothing was missed.
* Each watch asks the apiserver to end it after a random time of at most ``watch_timeout``
  (from half that), shorter than ``silence_timeout``. A watch on a resource nobody
  changes gets no bookmarks, so without that its read would time out: the connection
  would be dropped and the next watch would pay for a new one (TCP and TLS handshakes on
  both ends), and the quiet watches a process opens together at its start would all do so
  together, every ``silence_timeout``. Ended by the server, the watch leaves its
  connection open for the next one (the client's pool keeps it), and the random length
  spreads the watches out. Busy watches are opened again as often, at the cost of one
  request each. (A ``watch_timeout`` not shorter than ``silence_timeout`` leaves quiet
  watches to the read timeout.)
* A watch that stays silent (no event, no bookmark) past ``silence_timeout`` is dropped
  and restarted: a half-open connection cannot freeze the cache.

* With a ``transform``, each object is replaced by what it returns as it arrives (listed or
  watched), before it is cached or handed to a handler: an owner that reads a few fields of
  many objects (a large cluster's Pods) caches only those.

Handlers run on the informer's thread and must be quick (typically: enqueue a key).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from controller_kit.kubeclient import describe_error

log = logging.getLogger(__name__)

Key = tuple[str, str]
Handler = Callable[[str, dict | None, dict | None], None]
Transform = Callable[[dict], dict]
ListFn = Callable[..., Any]

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"

# While a cluster keeps failing, one line says so, then one summary per interval: a retry
# every few seconds would otherwise bury every other line (and other clusters' news).
SUMMARY_INTERVAL = 60.0


def without_managed_fields(obj: dict, keep: tuple[str, ...] = ()) -> dict:
    """The object as controllers read it: ``metadata.managedFields`` (often a third of an
    object's size) left out of the cache, but for the entries of the field managers in
    ``keep`` (an owner that needs to know when it wrote last). Writes built from a cached
    object then carry no managedFields, which the apiserver keeps as they are."""
    meta = obj.get("metadata")
    if meta and "managedFields" in meta:
        kept = [entry for entry in meta["managedFields"] if entry.get("manager") in keep]
        if kept:
            meta["managedFields"] = kept
        else:
            del meta["managedFields"]
    return obj


def object_key(obj: dict) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


class _Gone(Exception):
    """The watch's resourceVersion is too old, or the watch failed: relist."""


class Informer:
    """Cache of one resource. ``list_fn`` is a client list call (e.g. a partial of
    ``CustomObjectsApi.list_cluster_custom_object``) that accepts the usual list/watch
    keyword arguments and ``_preload_content``."""

    def __init__(
        self,
        name: str,
        list_fn: ListFn,
        *,
        page_size: int = 500,
        watch_timeout: int = 75,
        silence_timeout: float = 90.0,
        backoff_initial: float = 0.2,
        backoff_max: float = 10.0,
        keep_field_managers: tuple[str, ...] = (),
        transform: Transform | None = None,
    ):
        self.name = name
        self._keep = keep_field_managers
        self._transform = transform
        self._list_fn = list_fn
        self._page_size = page_size
        if watch_timeout < 1:
            raise ValueError(f"informer {name}: watch_timeout must be at least 1 s, "
                             f"not {watch_timeout}")
        self._watch_timeout = watch_timeout
        self._silence_timeout = silence_timeout
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._store: dict[Key, dict] = {}
        self._lock = threading.RLock()
        self._handlers: list[Handler] = []
        self._synced_handlers: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._retry = threading.Event()
        self._thread: threading.Thread | None = None
        self._response = None
        self.synced = threading.Event()
        # Set by every complete list, cleared when a watch fails or its history is gone:
        # while clear, changes may have been missed, and the next list is under way.
        self.current = threading.Event()
        self._watch_backoff = backoff_initial
        self.resource_version: str | None = None
        self.relists = 0
        # The last list/watch failure, cleared by the next success: lets an owner tell a
        # cluster that stopped answering from one that is merely quiet.
        self.last_error: str | None = None
        self.summary_interval = SUMMARY_INTERVAL
        self._failing_since: float | None = None
        self._failures = 0
        self._summarised_at = 0.0

    # --- reading --------------------------------------------------------------------

    def get(self, namespace: str, name: str) -> dict | None:
        with self._lock:
            return self._store.get((namespace or "", name))

    def list(self) -> list[dict]:
        with self._lock:
            return list(self._store.values())

    def keys(self) -> list[Key]:
        with self._lock:
            return list(self._store)

    def __len__(self) -> int:
        return len(self._store)

    def observe(self, obj: dict) -> None:
        """Put an object this process just wrote into the cache, unless the watch already
        delivered something as new. Without it, a reconcile that runs before the watch
        catches up would act on the old state and write the same change twice."""
        key = object_key(obj)
        obj = self._arrived(obj)
        with self._lock:
            cached = self._store.get(key)
            if cached is None or _newer(obj, cached):
                self._store[key] = obj

    def add_handler(self, handler: Handler) -> None:
        """``handler(event_type, old, new)``; called for every change, including the
        objects of the first list (as ADDED)."""
        self._handlers.append(handler)

    def add_synced_handler(self, handler: Callable[[], None]) -> None:
        """``handler()`` after every complete list, once its events are delivered: an owner
        that reads "not listed yet" differently from "absent" learns when that changed
        (an empty list delivers no event)."""
        self._synced_handlers.append(handler)

    # --- running --------------------------------------------------------------------

    def start(self) -> Informer:
        thread = threading.Thread(target=self._run, name=f"informer-{self.name}",
                                  daemon=True)
        thread.start()
        # Kept once started: a stop from another thread meanwhile joins only a started
        # thread (one not kept yet sees the stop set and ends by itself).
        self._thread = thread
        return self

    @property
    def thread(self) -> threading.Thread | None:
        """The thread that lists and watches, once started (its lifecycle's manager watches
        it)."""
        return self._thread

    def retry_now(self) -> None:
        """Cut a backoff wait short (e.g. the server is known to answer again)."""
        self._retry.set()

    def _backoff(self, delay: float) -> None:
        self._retry.wait(delay * random.uniform(0.8, 1.2))
        self._retry.clear()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._retry.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()  # unblocks a read parked in the socket
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        # A handler may stop its own informer (say, the owner drops the cache it reacted
        # to): the thread then ends after the handler returns.
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self.synced.wait(timeout)

    def _run(self) -> None:
        backoff = self._backoff_initial
        while not self._stop.is_set():
            try:
                self._relist()
                backoff = self._backoff_initial
                self._watch()
            except _Gone:
                self.current.clear()
                log.info("%s: watch history expired or watch lost; relisting", self.name)
                continue
            except Exception as err:  # noqa: BLE001 - keep the cache alive whatever happens
                if self._stop.is_set():
                    break
                self._failed("list", err, backoff)
                self._backoff(backoff)
                backoff = min(backoff * 2, self._backoff_max)

    def _relist(self) -> None:
        items: dict[Key, dict] = {}
        token = None
        while True:
            kwargs: dict[str, Any] = {"limit": self._page_size, "_preload_content": False}
            if token:
                kwargs["_continue"] = token
            response = self._list_fn(**kwargs)
            body = orjson.loads(response.data)
            for item in body.get("items") or []:
                items[object_key(item)] = self._arrived(item)
            meta = body.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                resource_version = meta.get("resourceVersion")
                break
        with self._lock:
            old = self._store
            _keep_newer(old, items, resource_version)
            self._store = items
            self.resource_version = resource_version
            self.relists += 1
        self._answering()
        for key, obj in items.items():
            previous = old.get(key)
            if previous is None:
                self._dispatch(ADDED, None, obj)
            elif previous.get("metadata", {}).get("resourceVersion") != obj.get(
                    "metadata", {}).get("resourceVersion"):
                self._dispatch(MODIFIED, previous, obj)
        for key, obj in old.items():
            if key not in items:
                self._dispatch(DELETED, obj, None)
        self.synced.set()
        self.current.set()
        for handler in self._synced_handlers:
            try:
                handler()
            except Exception:  # one bad handler must not stop the cache
                log.exception("%s: synced handler failed", self.name)

    def _watch(self) -> None:
        """Watch until stopped; returns normally only on stop, raises _Gone for a relist
        (the watch's history is gone, or the watch failed)."""
        while not self._stop.is_set():
            opened = False
            try:
                self._response = self._list_fn(
                    watch=True,
                    resource_version=self.resource_version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=random.randint(max(1, self._watch_timeout // 2),
                                                   self._watch_timeout),
                    _preload_content=False,
                    _request_timeout=(10, self._silence_timeout),
                )
                self._answering()
                opened = True
                for line in iter_resp_lines(self._response):
                    if not line:
                        continue
                    self._handle(orjson.loads(line))
                    self._watch_backoff = self._backoff_initial
            except _Gone:
                raise
            except ApiException as err:
                if err.status == 410:
                    raise _Gone() from err
                self._lost(err)
            except urllib3.exceptions.ReadTimeoutError as err:
                if opened:
                    # Open but silent for the whole read timeout. With a watch timeout
                    # shorter than the read's, the apiserver should have ended it first:
                    # a sign of a half-open connection or a stalled server, worth a line.
                    # Otherwise a resource nobody changes (no bookmarks) looks the same.
                    # Either way it is watched again from where it was (what happened
                    # since is delivered then); a server that stopped answering fails
                    # that new watch.
                    log.log(logging.INFO if self._watch_timeout < self._silence_timeout
                            else logging.DEBUG,
                            "%s: watch quiet for %.0fs; watching again", self.name,
                            self._silence_timeout)
                    continue
                self._lost(err)
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as err:
                self._lost(err)
            finally:
                response, self._response = self._response, None
                if response is not None:
                    response.release_conn()

    def _lost(self, err: Exception) -> None:
        """The watch failed: the cache may have missed changes until a fresh list is
        complete. Wait out the backoff (longer each time the watch fails before it
        delivers anything, so a watch that keeps failing does not relist in a loop), then
        have ``_run`` list again. (Stopping breaks the watch too: then nothing.)"""
        if self._stop.is_set():
            return
        self.current.clear()
        self._pause(err, self._watch_backoff)
        self._watch_backoff = min(self._watch_backoff * 2, self._backoff_max)
        raise _Gone() from err

    def _pause(self, err: Exception, delay: float) -> None:
        if self._stop.is_set():
            return
        self._failed("watch", err, delay)
        self._backoff(delay)

    def _failed(self, what: str, err: Exception, delay: float) -> None:
        """Record a failed list or watch; log it only when the informer starts failing,
        then as a summary once per ``summary_interval`` (every attempt at debug level)."""
        self.last_error = describe_error(err)
        now = time.monotonic()
        self._failures += 1
        if self._failing_since is None:
            self._failing_since = self._summarised_at = now
            log.warning("%s: %s failed (%s); retrying with backoff up to %.0fs, a summary "
                        "every %.0fs until it answers", self.name, what, self.last_error,
                        self._backoff_max, self.summary_interval)
        elif now - self._summarised_at >= self.summary_interval:
            self._summarised_at = now
            log.warning("%s: still failing: %d attempts in %.0fs, the last %s: %s",
                        self.name, self._failures, now - self._failing_since, what,
                        self.last_error)
        else:
            log.debug("%s: %s failed (%s); retrying in %.1fs", self.name, what,
                      self.last_error, delay)

    def _answering(self) -> None:
        """A list or watch went through: clear the failure, saying so once if there was one."""
        self.last_error = None
        if self._failing_since is not None:
            log.info("%s: answering again after %d failed attempts in %.0fs", self.name,
                     self._failures, time.monotonic() - self._failing_since)
        self._failing_since, self._failures = None, 0

    def _handle(self, event: dict) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone()
            raise ApiException(status=obj.get("code", 500), reason=obj.get("message"))
        resource_version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            self.resource_version = resource_version
            return
        key = object_key(obj)
        obj = self._arrived(obj)
        with self._lock:
            previous = self._store.get(key)
            if kind == DELETED:
                self._store.pop(key, None)
            else:
                self._store[key] = obj
            self.resource_version = resource_version
        if kind == DELETED:
            self._dispatch(kind, obj, None)  # the object's last state, as the server sent it
        else:
            self._dispatch(kind, previous, obj)

    def _arrived(self, obj: dict) -> dict:
        """The object as it is cached and handed on."""
        if self._transform is not None:
            return self._transform(obj)
        return without_managed_fields(obj, self._keep)

    def _dispatch(self, kind: str, old: dict | None, new: dict | None) -> None:
        for handler in self._handlers:
            try:
                handler(kind, old, new)
            except Exception:  # one bad handler must not stop the cache
                log.exception("%s: event handler failed", self.name)


def _keep_newer(old: dict[Key, dict], listed: dict[Key, dict],
                listed_version: str | None) -> None:
    """Keep in ``listed`` what ``old`` holds at a later version than the list saw: an
    object this process wrote and put in (``observe``) after the list was served. The list
    replaces the cache whole, and without this a relist finishing just after a write would
    put the object back as it was before it (a placement written, then gone from the cache
    until the watch brings it again). An object missing from the list is kept only when
    newer than the list itself (made after it); otherwise it was deleted."""
    listed_at = _revision(listed_version)
    for key, obj in old.items():
        fresh = listed.get(key)
        if fresh is not None:
            if _newer(obj, fresh):
                listed[key] = obj
        elif listed_at is not None and (_revision(_version_of(obj)) or 0) > listed_at:
            listed[key] = obj


def _newer(a: dict, b: dict) -> bool:
    """Whether ``a`` is a later version than ``b``. resourceVersions are opaque, but the
    apiserver's are etcd revisions; when either is not a number, trust the watch."""
    first, second = _revision(_version_of(a)), _revision(_version_of(b))
    return first is not None and second is not None and first > second


def _version_of(obj: dict) -> str | None:
    return (obj.get("metadata") or {}).get("resourceVersion")


def _revision(version: str | None) -> int | None:
    """A resourceVersion as the etcd revision it is, or None when it is not a number."""
    try:
        return int(version)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
