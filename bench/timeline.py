"""When each TrainJob was seen, per cluster, from a watch the benchmark keeps open: the
start and end points of every per-job figure (ms precision, one clock)."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from controller_kit.kubeclient import api_client
from trainjob import constants as c

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
        # When a condition was first seen with a given reason: a status written again with
        # another reason (a repeated sync step) is told apart from the first.
        self.reason_seen: dict[tuple[str, str, str, str], float] = {}
        # Workloads: when a worker was first nominated (status.nominatedClusterNames).
        self.nominated: dict[Key, float] = {}
        self.relists = 0
        self._changed = changed
        self._stop = threading.Event()
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
        self.api.close()

    # --- the watch ---------------------------------------------------------------------

    def _list_fn(self) -> Callable:
        """The list call of what is watched (it watches with ``watch=True``)."""
        return functools.partial(client.CustomObjectsApi(self.api).list_cluster_custom_object,
                                 *self.resource)

    def _list(self) -> dict:
        """Every object watched, as one list (a dict)."""
        return orjson.loads(self._list_fn()(_preload_content=False).data)

    def _stream(self, resource_version: str, **kwargs) -> Iterator[dict]:
        """The watch's events from ``resource_version``, objects as dicts: decoded once,
        with nothing built from them (the benchmark shares the machine it measures)."""
        response = self._list_fn()(watch=True, resource_version=resource_version,
                                   _preload_content=False, **kwargs)
        try:
            for line in iter_resp_lines(response):
                if line:
                    yield orjson.loads(line)
        finally:
            response.release_conn()

    def _run(self) -> None:
        resource_version = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    listed = self._list()
                    now = time.time()
                    # Objects first seen in a (re)list get the list time: only after a
                    # watch expired, and counted as relists in the results.
                    for item in listed.get("items", []):
                        self._record("ADDED", item, now)
                    resource_version = listed["metadata"]["resourceVersion"]
                    self._ready.set()
                for event in self._stream(
                        resource_version, allow_watch_bookmarks=True, timeout_seconds=120,
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
                self.reason_seen.setdefault(
                    (*key, condition.get("type", ""), condition.get("reason", "")), now)
            if status.get("nominatedClusterNames"):
                self.nominated.setdefault(key, now)
            self._changed.notify_all()

    def forget(self, namespace: str) -> None:
        """Drop what was seen in ``namespace`` (it was deleted; its names may come back)."""
        with self._changed:
            for table in (self.added, self.deleted, self.condition_seen, self.reason_seen,
                          self.nominated):
                for key in [k for k in table if k[0] == namespace]:
                    del table[key]


class PodTimeline(TrainJobTimeline):
    """Watches the pods of TrainJobs (JobSet pods) on one worker and records, per
    (namespace, TrainJob), when every one of its ``pods_per_job`` pods had been seen
    running: each pod counts from the first event that shows it Running or ended (a pod
    of kwok's ends seconds after it starts, so the last of a job's pods may start after
    the first ended)."""

    def __init__(self, cluster: str, kubeconfig, changed: threading.Condition,
                 pods_per_job: int):
        super().__init__(cluster, kubeconfig, changed, ("", "v1", "pods"),
                         key_of=lambda pod: (pod["metadata"].get("labels") or {}).get(
                             c.JOBSET_NAME_LABEL))
        self.pods_per_job = pods_per_job
        self.pods_run: dict[Key, set[str]] = {}
        self.all_running: dict[Key, float] = {}

    def _list_fn(self) -> Callable:
        return functools.partial(client.CoreV1Api(self.api).list_pod_for_all_namespaces,
                                 label_selector=c.JOBSET_NAME_LABEL)

    def _record(self, kind: str, obj: dict, now: float) -> None:
        job = self.key_of(obj)
        if job is None or kind == "DELETED":
            return
        if (obj.get("status") or {}).get("phase") not in ("Running", "Succeeded", "Failed"):
            return
        key = (obj["metadata"]["namespace"], job)
        with self._changed:
            pods = self.pods_run.setdefault(key, set())
            pods.add(obj["metadata"]["name"])
            if len(pods) >= self.pods_per_job and key not in self.all_running:
                self.all_running[key] = now
                self._changed.notify_all()

    def forget(self, namespace: str) -> None:
        with self._changed:
            for table in (self.pods_run, self.all_running):
                for key in [k for k in table if k[0] == namespace]:
                    del table[key]


class Timelines:
    """One timeline per cluster, sharing one condition so a wait can span them all."""

    def __init__(self, kubeconfigs: dict[str, object], *, workloads: bool = False,
                 pods_per_job: int | None = None):
        self.changed = threading.Condition()
        self.clusters = {name: TrainJobTimeline(name, path, self.changed)
                         for name, path in kubeconfigs.items()}
        # The manager's Kueue Workloads, by their TrainJob: when Kueue reserved quota.
        self.workloads = TrainJobTimeline(
            "manager", kubeconfigs["manager"], self.changed, WORKLOAD_RESOURCE,
            workload_job) if workloads else None
        # With ``pods_per_job`` (training operators run the copies): each worker's pods.
        self.pods = {name: PodTimeline(name, path, self.changed, pods_per_job)
                     for name, path in kubeconfigs.items()
                     if name != "manager"} if pods_per_job else {}

    def _all(self) -> list[TrainJobTimeline]:
        return [*self.clusters.values(), *([self.workloads] if self.workloads else []),
                *self.pods.values()]

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

    def running(self, key: Key) -> float | None:
        """When every pod of ``key`` had been seen running on one worker (the earliest
        worker, if several ran a copy); None if not (yet), or pods are not watched."""
        seen = [timeline.all_running[key] for timeline in self.pods.values()
                if key in timeline.all_running]
        return min(seen) if seen else None

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
