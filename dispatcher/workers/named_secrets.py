"""The Secrets MultiKueueClusters name, and no other: one small cache per named Secret.

The namespace is often shared: ``kueue-system`` (the program's default, and where kueue
mode reads them) holds Kueue's webhook certificates and other controllers' credentials.
Caching the whole namespace would need ``list``/``watch`` on every Secret there, so each
Secret is watched by name instead (``fieldSelector=metadata.name=<name>``), which RBAC can
limit with ``resourceNames``.

Why a watch per name and not a GET per name with a periodic resync: a watch picks up a
rotated kubeconfig as soon as it is written (a resync only at its next tick), costs nothing
while the Secret does not change (a resync re-reads every Secret every period), and the
informer already survives disconnects, expired history and a Secret that does not exist
yet (an empty list, then an ADDED event when it is created). One watch connection per
registered worker is the price; registrations are few.

A cache starts when a registration first names its Secret and stops when no registration
names it any more (``retain``), so a Secret is read only while some MultiKueueCluster in
use points at it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable

from kubernetes import client

from controller_kit.informer import Informer

log = logging.getLogger(__name__)


class NamedSecrets:
    """Caches of single Secrets in one namespace, started and stopped by name."""

    def __init__(self, api: client.ApiClient, namespace: str,
                 on_change: Callable[[], None]):
        self.namespace = namespace
        self._core = client.CoreV1Api(api)
        self._on_change = on_change
        self._lock = threading.Lock()
        self._caches: dict[str, Informer] = {}

    def watch(self, name: str) -> Informer:
        """The cache of Secret ``name``, started on first use."""
        with self._lock:
            cache = self._caches.get(name)
            if cache is None:
                cache = Informer(f"secret {self.namespace}/{name}", functools.partial(
                    self._core.list_namespaced_secret, self.namespace,
                    field_selector=f"metadata.name={name}"))
                cache.add_handler(lambda *_: self._on_change())
                # Also once listed: "not read yet" becomes "found" or "not found".
                cache.add_synced_handler(self._on_change)
                self._caches[name] = cache
                cache.start()
                log.debug("watching Secret %s/%s", self.namespace, name)
            return cache

    def state(self, name: str) -> tuple[dict | None, str | None]:
        """(the Secret, None), (None, None) when it does not exist, or (None, why it is
        not known yet: not read yet, or the last error reading it)."""
        cache = self.watch(name)
        if not cache.synced.is_set():
            return None, (f"Secret {self.namespace}/{name} cannot be read: {cache.last_error}"
                          if cache.last_error else
                          f"Secret {self.namespace}/{name} not read yet")
        return cache.get(self.namespace, name), None

    def pending(self, name: str) -> bool:
        """Secret ``name``'s first list has not answered yet (nor failed): nothing is known
        about it, for a moment."""
        cache = self.watch(name)
        return not cache.synced.is_set() and not cache.last_error

    def wait_synced(self, timeout: float) -> list[str]:
        """Wait (up to ``timeout`` in all) for every started cache's first list; the names
        still unread."""
        deadline = time.monotonic() + timeout
        with self._lock:
            caches = dict(self._caches)
        return [name for name, cache in caches.items()
                if not cache.wait_synced(max(deadline - time.monotonic(), 0))]

    def retain(self, names: set[str]) -> None:
        """Stop the caches of Secrets no registration names any more."""
        with self._lock:
            gone = [self._caches.pop(name) for name in set(self._caches) - names]
        for cache in gone:
            log.debug("no longer watching %s", cache.name)
            # Not waited for: this may run on that cache's own thread (its event started
            # the re-derivation), or while its thread waits for the registry's lock.
            cache.stop(timeout=0)

    def threads(self) -> list[threading.Thread | None]:
        """The caches' threads; one leaves this list before it is stopped (``retain``)."""
        with self._lock:
            return [cache.thread for cache in self._caches.values()]

    def names(self) -> set[str]:
        with self._lock:
            return set(self._caches)

    def stop(self) -> None:
        self.retain(set())
