"""When each TrainJob was seen, per cluster, from a watch the benchmark keeps open: the
start and end points of every per-job figure (ms precision, one clock)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from trainjob import constants as c
from trainjob.kubeclient import api_client

log = logging.getLogger(__name__)

Key = tuple[str, str]
TRAINJOB_RESOURCE = (c.TRAINER_GROUP, c.TRAINER_VERSION, c.TRAINJOBS)
WORKLOAD_RESOURCE = (c.KUEUE_GROUP, c.KUEUE_VERSION, "workloads")


def workload_job(workload: dict) -> str | None:
    """The TrainJob a Kueue Workload was made for (its owner), if any."""
    return next((ref["name"] for ref in workload["metadata"].get("ownerReferences") or []
                 if ref.get("kind") == c.TRAINJOB_KIND), None)


class TrainJobTimeline:
    """Watches every TrainJob of one cluster from a thread and records, per (namespace,
    name), when it was first seen (ADDED) and when each condition type first appeared."""

    def __init__(self, cluster: str, kubeconfig, changed: threading.Condition,
                 resource: tuple[str, str, str] = TRAINJOB_RESOURCE,
                 key_of: Callable[[dict], str | None] | None = None):
        self.cluster = cluster
        self.resource = resource
        # The name an object is recorded under: its own, or (Workloads) its TrainJob's.
        self.key_of = key_of or (lambda obj: obj["metadata"]["name"])
        self.api = api_client(kubeconfig)
        self.added: dict[Key, float] = {}
        self.deleted: dict[Key, list[float]] = {}  # every deletion seen, in order
        self.condition_seen: dict[tuple[str, str, str], float] = {}
        # Workloads: when a worker was first nominated (status.nominatedClusterNames).
        self.nominated: dict[Key, float] = {}
        self.relists = 0
        self._changed = changed
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"timeline-{cluster}")

    def start(self) -> TrainJobTimeline:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError(f"cluster {self.cluster}: the TrainJob watch did not start "
                               "within 30s")
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        self.api.close()

    # --- the watch ---------------------------------------------------------------------

    def _run(self) -> None:
        custom = client.CustomObjectsApi(self.api)
        resource_version = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    listed = custom.list_cluster_custom_object(*self.resource)
                    now = time.time()
                    # Objects first seen in a (re)list get the list time: only after a
                    # watch expired, and counted as relists in the results.
                    for item in listed.get("items", []):
                        self._record("ADDED", item, now)
                    resource_version = listed["metadata"]["resourceVersion"]
                    self._ready.set()
                self._watch = watch.Watch()
                for event in self._watch.stream(
                        custom.list_cluster_custom_object, *self.resource,
                        resource_version=resource_version,
                        allow_watch_bookmarks=True, timeout_seconds=120,
                        # A read timeout longer than the server-side one: a quiet cluster
                        # must not drop the watch (events would arrive late, after it).
                        _request_timeout=(10, 180)):
                    now = time.time()
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        if obj.get("code") == 410:
                            resource_version = None
                            self.relists += 1
                            break
                        raise RuntimeError(f"watch error: {obj}")
                    resource_version = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self._record(event["type"], obj, now)
                    if self._stop.is_set():
                        return
            except ApiException as err:
                if err.status == 410:
                    resource_version = None
                    self.relists += 1
                    continue
                if self._stop.is_set():
                    return
                log.warning("cluster %s: %s watch failed (%s); restarting", self.cluster,
                            self.resource[2], err.reason)
                self._stop.wait(0.5)
            except Exception as err:  # noqa: BLE001 - a dropped watch is restarted
                if self._stop.is_set():
                    return
                log.warning("cluster %s: %s watch failed (%s); restarting", self.cluster,
                            self.resource[2], err)
                self._stop.wait(0.5)

    def _record(self, kind: str, obj: dict, now: float) -> None:
        name = self.key_of(obj)
        if name is None:
            return
        key = (obj["metadata"]["namespace"], name)
        with self._changed:
            if kind == "DELETED":
                self.deleted.setdefault(key, []).append(now)
                self._changed.notify_all()
                return
            self.added.setdefault(key, now)
            status = obj.get("status") or {}
            for condition in status.get("conditions") or []:
                self.condition_seen.setdefault((*key, condition.get("type", "")), now)
            if status.get("nominatedClusterNames"):
                self.nominated.setdefault(key, now)
            self._changed.notify_all()

    def forget(self, namespace: str) -> None:
        """Drop what was seen in ``namespace`` (it was deleted; its names may come back)."""
        with self._changed:
            for key in [k for k in self.added if k[0] == namespace]:
                del self.added[key]
            for key in [k for k in self.deleted if k[0] == namespace]:
                del self.deleted[key]
            for key in [k for k in self.condition_seen if k[0] == namespace]:
                del self.condition_seen[key]
            for key in [k for k in self.nominated if k[0] == namespace]:
                del self.nominated[key]


class Timelines:
    """One timeline per cluster, sharing one condition so a wait can span them all."""

    def __init__(self, kubeconfigs: dict[str, object], *, workloads: bool = False):
        self.changed = threading.Condition()
        self.clusters = {name: TrainJobTimeline(name, path, self.changed)
                         for name, path in kubeconfigs.items()}
        # The manager's Kueue Workloads, by their TrainJob: when Kueue reserved quota.
        self.workloads = TrainJobTimeline(
            "manager", kubeconfigs["manager"], self.changed, WORKLOAD_RESOURCE,
            workload_job) if workloads else None

    def _all(self) -> list[TrainJobTimeline]:
        return [*self.clusters.values(), *([self.workloads] if self.workloads else [])]

    def start(self) -> Timelines:
        for timeline in self._all():
            timeline.start()
        return self

    def stop(self) -> None:
        for timeline in self._all():
            timeline.stop()

    @property
    def manager(self) -> TrainJobTimeline:
        return self.clusters["manager"]

    def remote(self, key: Key) -> tuple[str, float] | None:
        """(worker, first seen) of the earliest remote copy of ``key``, if any worker has
        one (a dispatcher that races workers makes several)."""
        seen = [(timeline.added[key], name) for name, timeline in self.clusters.items()
                if name != "manager" and key in timeline.added]
        return (min(seen)[1], min(seen)[0]) if seen else None

    def wait(self, missing, timeout: float) -> set:
        """Block until ``missing()`` is empty or ``timeout``; returns what is still missing."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                left = missing()
                remaining = deadline - time.monotonic()
                if not left or remaining <= 0:
                    return left
                self.changed.wait(min(remaining, 1.0))

    def wait_remotes(self, keys: set[Key], timeout: float) -> set[Key]:
        return self.wait(lambda: {k for k in keys if self.remote(k) is None}, timeout)

    def forget(self, namespace: str) -> None:
        for timeline in self._all():
            timeline.forget(namespace)
