"""Kueue mode: the cluster selector of the job a Workload was made for.

Users write ``trainjob-dispatcher.io/cluster-selector`` on their job (a TrainJob, batch Job
or JobSet), not on the Workload Kueue makes for it: it is read on the Workload's
controlling owner. TrainJobs come from the dispatcher's TrainJob cache; batch Jobs and
JobSets, which the dispatcher does not watch, are read with a GET, kept ``TTL_SECONDS``
(a Workload waiting for room is decided again at every change of room: a burst of those
costs one GET per job, and a changed selector is seen within that time). Another kind
has no selector this dispatcher reads: all its workers are candidates.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from cachetools import TTLCache
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dispatcher.placement.cluster_selector import selector_of
from trainjob import constants as c

log = logging.getLogger(__name__)

TTL_SECONDS = 10.0
# (apiVersion group, kind) -> how to GET one: (group, version) of a custom resource and
# its plural; None for a batch Job (the typed client).
_READ = {("batch", "Job"): None,
         (c.JOBSET_GROUP, "JobSet"): (c.JOBSET_GROUP, c.JOBSET_VERSION, c.JOBSETS)}


class JobSelectors:
    """The cluster selector written on each Workload's job; thread-safe."""

    def __init__(self, manager: client.ApiClient,
                 trainjob: Callable[[str, str], dict | None]):
        self.api = manager
        self.trainjob = trainjob  # (namespace, name) -> the cached TrainJob
        self._read: TTLCache = TTLCache(maxsize=8192, ttl=TTL_SECONDS)
        self._lock = threading.Lock()

    def of(self, workload: dict) -> str | None:
        """The selector on the Workload's job, None when it has none (or the job is gone);
        an error reading a batch Job or JobSet is raised (the reconcile is retried)."""
        meta = workload["metadata"]
        owner = next((ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")),
                     None)
        if owner is None:
            return None
        namespace = meta.get("namespace") or ""
        group = (owner.get("apiVersion") or "").rpartition("/")[0]
        kind, name = owner.get("kind"), owner.get("name") or ""
        if (group, kind) == (c.TRAINER_GROUP, "TrainJob"):
            job = self.trainjob(namespace, name)
            return selector_of(((job or {}).get("metadata") or {}).get("annotations"))
        if (group, kind) not in _READ:
            return None
        key = (group, kind, namespace, name, owner.get("uid"))
        with self._lock:
            if key in self._read:
                return self._read[key]
        selector = selector_of(self._annotations(group, kind, namespace, name))
        with self._lock:
            self._read[key] = selector
        return selector

    def _annotations(self, group: str, kind: str, namespace: str, name: str) -> dict | None:
        try:
            if _READ[(group, kind)] is None:
                job = client.BatchV1Api(self.api).read_namespaced_job(name, namespace)
                return job.metadata.annotations
            group_version_plural = _READ[(group, kind)]
            obj = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
                *group_version_plural[:2], namespace, group_version_plural[2], name)
            return (obj.get("metadata") or {}).get("annotations")
        except ApiException as err:
            if err.status == 404:
                return None  # gone: its Workload goes too
            raise
