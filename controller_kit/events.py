"""Kubernetes Events about our objects, written off the reconcile path.

Events are for people (``kubectl describe``); a reconcile must not wait on them. They go
through a bounded queue to one writer thread, which retries a failed write a few times.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller_kit import writes
from controller_kit.api_time import format_time

log = logging.getLogger(__name__)

NORMAL, WARNING = "Normal", "Warning"
MESSAGE_LIMIT = 1024  # what the apiserver keeps of a core/v1 Event's message


def involved(obj: dict[str, Any]) -> dict[str, Any]:
    """The ``involvedObject`` reference to ``obj`` (a dict with apiVersion, kind, metadata)."""
    meta = obj.get("metadata") or {}
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
            "name": meta.get("name"), "namespace": meta.get("namespace"),
            "uid": meta.get("uid")}


def event_body(about: dict[str, Any], type_: str, reason: str, message: str,
               component: str, instance: str = "", *, first: str | None = None,
               last: str | None = None, count: int = 1) -> dict[str, Any]:
    """A core/v1 Event about the object ``about`` refers to (``involved``), said ``count``
    times from ``first`` to ``last`` (now when not given), by ``component``: named after
    the object (the apiserver adds a suffix), in its namespace, its message cut to what
    the apiserver keeps. ``kubectl describe`` reads the source and the counted timestamps;
    the reporting fields are what events.k8s.io readers show."""
    now = "" if first and last else format_time()
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{about.get('name') or 'object'}.",
                     "namespace": about.get("namespace") or "default"},
        "involvedObject": dict(about),
        "type": type_, "reason": reason, "message": message[:MESSAGE_LIMIT],
        "source": {"component": component},
        "reportingComponent": component, "reportingInstance": instance or component,
        "firstTimestamp": first or now, "lastTimestamp": last or now, "count": count,
    }


def recount(count: int, last: str) -> dict[str, Any]:
    """The merge patch that raises an Event written by ``event_body`` to ``count``
    occurrences, the last at ``last``: Kubernetes' aggregation of a repeated Event."""
    return {"count": count, "lastTimestamp": last}


class EventRecorder:
    def __init__(self, api: client.ApiClient, component: str, instance: str = "",
                 max_queued: int = 10_000):
        self._api = api
        self._component = component
        self._instance = instance or component
        self._queue: queue.Queue = queue.Queue(maxsize=max_queued)
        self._thread = threading.Thread(target=self._run, name=f"events-{component}",
                                        daemon=True)
        self._thread.start()
        self.written = 0

    def event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Queue an Event about ``obj`` (a dict with apiVersion, kind, metadata)."""
        meta = obj.get("metadata") or {}
        body = event_body(involved(obj), type_, reason, message, self._component,
                          self._instance)
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            log.warning("event queue full; dropped %s %s for %s/%s", type_, reason,
                        meta.get("namespace"), meta.get("name"))

    def queued(self) -> int:
        """Events waiting to be written (approximately: the writer takes them meanwhile)."""
        return self._queue.qsize()

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every queued Event was written (or given up on)."""
        done = threading.Event()
        self._queue.put(done)
        done.wait(timeout)

    def _run(self) -> None:
        while True:
            body = self._queue.get()
            if isinstance(body, threading.Event):
                body.set()
                continue
            for attempt in range(3):
                try:
                    writes.create(self._api, "", "v1", body["metadata"]["namespace"],
                                  "events", body)
                    self.written += 1
                    break
                except ApiException as err:
                    if err.status in (403, 404, 422):  # namespace gone, not allowed, invalid
                        break
                    threading.Event().wait(0.2 * (attempt + 1))
                except Exception:  # noqa: BLE001 - events are best effort
                    threading.Event().wait(0.2 * (attempt + 1))
